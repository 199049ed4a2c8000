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
    """docs block ``grouped_gemm.vs-torch``: labkit's grouped GEMM per experts and skew, its TFLOP/s and
    its time over ``torch._grouped_mm``'s (eager and graph) and over the host-sync loop's (eager)."""
    from labkit.workbench.findings import number

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
    loop = ", flat" if cfg.get("flat") else ""
    loop += " warp-specialised" if cfg.get("warp_specialize") else ""
    return (
        f"{cfg['block_m']}×{cfg['block_n']}×{cfg['block_k']}, {cfg['num_stages']}"
        + (", TMA" if cfg["tma"] else "")
        + loop
    )


def _table_pick(record: dict, op: str):
    """The config ``TABLES`` picks for the record's GPU and shape, or None where no table is kept for it."""
    from labkit.kernels import grouped_gemm as gg

    table = gg.TABLES.get((record.get("gpu"), op))
    return None if table is None else table.pick(record["tokens"] // max(record["experts"], 1))


def backward_table(reference) -> str:
    """docs block ``grouped_gemm.backward``: labkit's dgrad and wgrad per experts and skew, time over
    PyTorch's fastest backward of ``torch._grouped_mm`` in the same rounds (eager and graph), with
    labkit's TFLOP/s under graph replay and the configuration each launched with."""
    from labkit.workbench.findings import field_of, number

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


#: the sweep the tile-loop block reads, and the experts it compares the loops at
TUNE_REFERENCE = "h200x1/grouped_gemm_tune.json"
LOOPS_EXPERTS = 8
#: the tile loops the sweep tries, in the block's order: (label, flat, warp_specialize)
_LOOPS = (
    ("a loop per expert", False, False),
    ("one flat loop", True, False),
    ("one flat loop, warp-specialised", True, True),
)


def tile_loops_table(reference) -> str:
    """docs block ``grouped_gemm.tile-loops``: at ``LOOPS_EXPERTS`` experts, the fastest forward
    configuration of each tile loop in the recorded sweep (``TUNE_REFERENCE``), per split, its
    TFLOP/s and its time over the configuration the kernel launched with when swept (``chosen``) in the
    same rounds (paired median, p25-p75)."""
    from labkit.workbench.findings import ReportError, field_of, number

    name = TUNE_REFERENCE
    timed = [
        r
        for r in reference.records(name, kind="tune", op="forward", experts=LOOPS_EXPERTS)
        if r.get("ms") and r.get("correct")
    ]
    out = [
        "| counts | tile loop | its fastest configuration | TFLOP/s "
        "| time / the kernel's choice when swept [p25, p75] |",
        "|---|---|---|---|---|",
    ]
    for skew in sorted({r["skew"] for r in timed}, key=lambda s: s != "uniform"):
        rows = [r for r in timed if r["skew"] == skew]
        if not any(r.get("chosen") for r in rows):
            raise ReportError(f"report: reference/{name}: no timed record of the kernel's choice at {skew} counts")
        for label, flat, ws in _LOOPS:
            family = [r for r in rows if bool(r.get("flat")) == flat and bool(r.get("warp_specialize")) == ws]
            if not family:
                continue
            top = min(family, key=lambda r: r["ms"])
            ratio = field_of(top, "ratio_vs_chosen", name)
            spread = (
                f"[{field_of(top, 'ratio_vs_chosen_p25', name):.2f}, {field_of(top, 'ratio_vs_chosen_p75', name):.2f}]"
            )
            pick = " (the kernel's choice)" if top.get("chosen") else ""
            out.append(
                f"| {skew} | {label} | {top['config']}{pick} | {number(field_of(top, 'tflops', name))} "
                f"| {ratio:.2f} {spread} |"
            )
    beaten = [
        f"{skew} counts"
        for skew in ("uniform", "skewed")
        if any(r["skew"] == skew and not r.get("chosen") and field_of(r, "ratio_vs_chosen", name) < 1 for r in timed)
    ]
    bench = {
        r["skew"]: r
        for r in reference.records(DOCS_REFERENCE, kind="gemm", impl="labkit", method="graph", experts=LOOPS_EXPERTS)
    }
    out.append("")
    out.append(
        (
            "No configuration of the sweep is faster than the kernel's choice in the median"
            if not beaten
            else "Faster than the kernel's choice in the median at " + " and ".join(beaten)
        )
        + ". The sweep times labkit's configurations only; in the bench, whose graph-replay rounds "
        "interleave labkit with `torch._grouped_mm`, labkit ran at "
        + " and ".join(
            f"{number(field_of(bench[k], 'tflops', DOCS_REFERENCE))} TFLOP/s ({k})"
            for k in sorted(bench, key=lambda k: k != "uniform")
        )
        + " under graph replay. Clocks are not recorded, so what makes the difference is not isolated."
    )
    out.append("")
    out.append(
        f"One H200: `reference/{name}`, kind `tune`, op `forward`, {LOOPS_EXPERTS} experts (fields `config`, "
        "`flat`, `warp_specialize`, `tflops`, `ratio_vs_chosen`: each configuration's time over the kernel's choice in "
        "the same interleaved graph-replay rounds, below 1 faster). Rendered by `labkit report`."
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
