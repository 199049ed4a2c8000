"""Lab 04's findings rendered from the records they summarise (``labkit bench grouped_gemm``), for the
docs' generated blocks (``labkit report``) and notebook 04's sentences."""

from __future__ import annotations

import dataclasses

#: the one-GPU references the docs are rendered from, each GPU's rows in turn (a file not recorded
#: is left out; the first must be there)
DOCS_REFERENCES = ("h200x1/grouped_gemm.json", "h100x1/grouped_gemm.json")
DOCS_REFERENCE = DOCS_REFERENCES[0]


def _names(reference) -> list[str]:
    return [DOCS_REFERENCE] + [n for n in DOCS_REFERENCES[1:] if (reference.root / n).is_file()]


def _gpu(name: str) -> str:
    """The GPU a reference folder names: "h200x1/..." -> "H200"."""
    return name.split("/")[0].rsplit("x", 1)[0].upper()


def _sources(names: list[str]) -> str:
    return " and ".join(f"`reference/{n}`" for n in names)


#: the backward table's products and timings, in its column order
_BACKWARD = ("dgrad", "wgrad")
_METHODS = ("eager", "graph")


def _gpu_cases(reference, names: list[str], kind: str):
    """(file, experts, skew) of each file's labkit records of ``kind``, file by file, in table order."""
    for name in names:
        for experts, skew in _cases(reference.records(name, kind=kind, impl="labkit")):
            yield name, experts, skew


def _cases(rows: list[dict]) -> list[tuple]:
    """(experts, skew) of the records, by experts, uniform before skewed: the tables' row order."""
    return sorted({(r["experts"], r["skew"]) for r in rows}, key=lambda k: (k[0], k[1] != "uniform"))


def versus_torch_table(reference) -> str:
    """docs block ``grouped-gemm-vs-torch``: labkit's grouped GEMM per experts and skew, its TFLOP/s and
    its time over ``torch._grouped_mm``'s (eager and graph) and over the host-sync loop's (eager)."""
    from labkit.workbench.report import number

    names = _names(reference)
    out = [
        "| GPU | experts | counts | labkit TFLOP/s (eager) | time / torch's, eager | time / torch's, graph "
        "| time / host-sync loop's, eager |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, experts, skew in _gpu_cases(reference, names, "gemm"):
        case = dict(kind="gemm", impl="labkit", experts=experts, skew=skew)

        def at(method, field, name=name, case=case):
            return reference.value(name, field, method=method, **case)

        out.append(
            f"| {_gpu(name)} | {experts} | {skew} | {number(at('eager', 'tflops'))} | "
            f"{at('eager', 'ratio_vs_torch'):.2f} | {at('graph', 'ratio_vs_torch'):.2f} | "
            f"{at('eager', 'ratio_vs_loop'):.2f} |"
        )
    out.append("")
    out.append(
        f"One GPU each: {_sources(names)}, kind `gemm`, impl `labkit` (`method` `eager` or `graph`; fields "
        "`tflops`, `ratio_vs_torch`, `ratio_vs_loop`: below 1, labkit is faster). Rendered by `labkit report`."
    )
    return "\n".join(out)


def _tile(cfg: dict) -> str:
    return f"{cfg['block_m']}×{cfg['block_n']}×{cfg['block_k']}, {cfg['num_stages']}" + (", TMA" if cfg["tma"] else "")


def _table_pick(record: dict, op: str):
    """The config ``TABLES`` picks for the record's GPU and shape, or None where no table is kept for it."""
    from labkit.kernels import grouped_gemm as gg

    table = gg.TABLES.get((record.get("gpu"), op))
    return None if table is None else table.pick(record["tokens"] // max(record["experts"], 1))


def backward_table(reference) -> str:
    """docs block ``grouped-gemm-backward``: labkit's dgrad and wgrad per experts and skew, time over
    PyTorch's fastest backward of ``torch._grouped_mm`` in the same rounds (eager and graph), with
    labkit's TFLOP/s under graph replay and the configuration each launched with."""
    from labkit.workbench.report import field_of, number

    names = _names(reference)
    out = [
        "| GPU | experts | counts | dgrad / torch's, eager | graph | TFLOP/s | wgrad / torch's, eager | graph "
        "| TFLOP/s | wgrad tile (M×N×K, stages), recorded / the table's pick |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, experts, skew in _gpu_cases(reference, names, "gemm_backward"):
        case = dict(kind="gemm_backward", impl="labkit", experts=experts, skew=skew)
        recs = {(op, m): reference.one(name, op=op, method=m, **case) for op in _BACKWARD for m in _METHODS}
        cells = []
        for op in _BACKWARD:
            cells += [f"{field_of(recs[op, m], 'ratio_vs_torch', name):.2f}" for m in _METHODS]
            cells.append(number(field_of(recs[op, "graph"], "tflops", name)))
        wgrad = recs["wgrad", "graph"]
        pick = _table_pick(wgrad, "wgrad")
        picked = "" if pick is None else _tile(dataclasses.asdict(pick))
        cells.append(_tile(wgrad) + (f" / {picked}" if picked and picked != _tile(wgrad) else ""))
        out.append(f"| {_gpu(name)} | {experts} | {skew} | " + " | ".join(cells) + " |")
    out.append("")
    out.append(
        f"One GPU each: {_sources(names)}, kind `gemm_backward`, impl `labkit`, `op` `dgrad` or `wgrad` "
        "(`method` `eager` or `graph`; `ratio_vs_torch` against the fastest of `torch.autograd.grad` and the op "
        "called directly, below 1 labkit is faster; the tile fields say what the kernel launched with). Where "
        "the last column names a second tile, `labkit.kernels.grouped_gemm.TABLES` picks another tile for that "
        "GPU and shape than the one its file timed: the pick comes from the sweep (`grouped_gemm_tune.json`), "
        "and the file's times are of the first. Rendered by `labkit report`."
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
