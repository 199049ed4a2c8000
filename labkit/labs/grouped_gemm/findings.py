"""Lab 04's findings rendered from the records they summarise (``labkit bench grouped_gemm``), for the
docs' generated blocks (``labkit report``) and notebook 04's sentences."""

from __future__ import annotations

#: the one-GPU reference the docs are rendered from
DOCS_REFERENCE = "h200x1/grouped_gemm.json"


def versus_torch_table(reference) -> str:
    """docs block ``grouped-gemm-vs-torch``: labkit's grouped GEMM per experts and skew, its TFLOP/s and
    its time over ``torch._grouped_mm``'s (eager and graph) and over the host-sync loop's (eager)."""
    from labkit.workbench.report import number

    name = DOCS_REFERENCE
    rows = reference.records(name, kind="gemm", impl="labkit")
    out = [
        "| experts | counts | labkit TFLOP/s (eager) | time / torch's, eager | time / torch's, graph "
        "| time / host-sync loop's, eager |",
        "|---|---|---|---|---|---|",
    ]
    for experts, skew in sorted({(r["experts"], r["skew"]) for r in rows}, key=lambda k: (k[0], k[1] != "uniform")):

        def at(method, field, experts=experts, skew=skew):
            return reference.value(name, field, kind="gemm", impl="labkit", experts=experts, skew=skew, method=method)

        out.append(
            f"| {experts} | {skew} | {number(at('eager', 'tflops'))} | {at('eager', 'ratio_vs_torch'):.2f} | "
            f"{at('graph', 'ratio_vs_torch'):.2f} | {at('eager', 'ratio_vs_loop'):.2f} |"
        )
    out.append("")
    out.append(
        f"One H200: `reference/{name}`, kind `gemm`, impl `labkit` (`method` `eager` or `graph`; fields `tflops`, "
        "`ratio_vs_torch`, `ratio_vs_loop`: below 1, labkit is faster). Rendered by `labkit report`."
    )
    return "\n".join(out)


def moe_in_words(records: list[dict]) -> str:
    """The MoE layer's step (kind ``moe_layer``): the device path's graph against the host-sync layer,
    per skew. "" without such records."""
    graph = [
        r for r in records if r.get("kind") == "moe_layer" and r.get("impl") == "device" and r.get("method") == "graph"
    ]
    if not graph:
        return ""
    parts = []
    for r in sorted(graph, key=lambda r: r["skew"]):
        host = next(
            (
                h
                for h in records
                if h.get("kind") == "moe_layer" and h.get("impl") == "host_sync" and h["skew"] == r["skew"]
            ),
            None,
        )
        host_text = f" against {host['ms_fwd_bwd']:.1f} ms" if host else ""
        parts.append(
            f"skew {r['skew']:g}: {r['ms_fwd_bwd']:.1f} ms{host_text} "
            f"(x{r['ratio_vs_host_sync']:.2f} of the host-sync time)"
        )
    return "forward + backward of the MoE layer as one CUDA graph: " + "; ".join(parts) + "."
