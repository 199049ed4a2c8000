"""Lab 02's findings in words, rendered from the records they summarise (a recorded reference file
or this machine's run), so that the notebook's sentences and the data beside them cannot drift.

Each function takes records as ``labkit bench collectives`` (and ``links``, and lab 06's
``broken_barriers``) write them and returns Markdown; none reads a file itself. Ratios are labkit's
time over its peer's (below 1: labkit faster); "the best peer" is the fastest of NCCL and PyTorch's
symmetric-memory ops at that size and timing.
"""

from __future__ import annotations

from labkit.labs.collectives.sweep_plots import chosen_vs_best
from labkit.workbench.plot import format_bytes

#: the sizes where latency decides (the sweep's small messages) and from where bandwidth does
SMALL = (4 << 10, 1 << 20)
LARGE_FROM = 16 << 20
#: a chosen all-reduce this much slower than the best peer is named as trailing
TRAILS_ABOVE = 1.05
#: labkit's out-of-place all-reduce kernels that load their peers' data
PULL_KERNELS = ("labkit_one_shot", "labkit_two_shot", "labkit_tree")


def _sweep(records, w, op="all_reduce"):
    return [
        r
        for r in records
        if r.get("kind", "sweep") == "sweep" and r.get("op") == op and r.get("world_size") == w and r.get("correct")
    ]


def _at(records, impl, nbytes, key):
    return next((r.get(key) for r in records if r["impl"] == impl and r["bytes"] == nbytes and r.get(key)), None)


def _span(values) -> str:
    lo, hi = min(values), max(values)
    return f"x{lo:.2f}" if round(lo, 2) == round(hi, 2) else f"x{lo:.2f}-x{hi:.2f}"


def _ratios(rows, key, lo=0, hi=float("inf")):
    return [
        (r["bytes"], r["mine"][key] / r["best"][key][key], r["algorithm"], r["best"][key]["impl"])
        for r in rows
        if lo <= r["bytes"] <= hi and r["mine"].get(key) and r["best"][key]
    ]


def sweep_in_words(records: list[dict], w: int) -> str:
    """What a recorded all-reduce sweep at ``w`` ranks says: labkit's chosen all-reduce against the
    best peer at small sizes (graph replay and back to back), at large sizes, the bandwidth at the
    largest size, where two-shot overtakes one-shot, and every size where the chosen call trails.
    "" without sweep records for ``w``."""
    from labkit.labs.collectives.sweep_bench import crossover_bytes

    sw = _sweep(records, w)
    if not sw:
        return ""
    lines = []
    checked = [r for r in records if r.get("correct") is not False]  # a wrong result has no speed
    for in_place in (False, True):
        rows = chosen_vs_best(checked, w, in_place)
        where = "in place" if in_place else "out of place"
        small = {key: _ratios(rows, key, *SMALL) for key in ("graph_us", "us")}
        if small["graph_us"]:
            faster = sum(v < 1 for _, v, _, _ in small["graph_us"])
            lines.append(
                f"- **{where}, {format_bytes(SMALL[0])}-{format_bytes(SMALL[1])}:** labkit's chosen all-reduce takes "
                f"{_span([v for _, v, _, _ in small['graph_us']])} of the best peer's time under graph replay "
                f"(faster at {faster} of {len(small['graph_us'])} sizes)"
                + (f", {_span([v for _, v, _, _ in small['us']])} back to back" if small["us"] else "")
                + "."
            )
        large = _ratios(rows, "graph_us", LARGE_FROM)
        if large:
            faster = sum(v <= 1 for _, v, _, _ in large)
            lines.append(
                f"- **{where}, {format_bytes(LARGE_FROM)} and up:** as fast as the best peer or faster at {faster} of "
                f"{len(large)} sizes under graph replay ({_span([v for _, v, _, _ in large])})."
            )
        trails = [(b, v, alg, peer) for b, v, alg, peer in _ratios(rows, "graph_us") if v > TRAILS_ABOVE]
        if trails:
            named = ", ".join(f"{format_bytes(b)} x{v:.2f} ({alg} against {peer})" for b, v, alg, peer in trails)
            lines.append(f"- **{where}, where labkit trails** (graph replay, over x{TRAILS_ABOVE}): {named}.")
        elif rows:
            lines.append(f"- **{where}:** labkit trails the best peer by more than x{TRAILS_ABOVE} at no size.")
    big = max(r["bytes"] for r in sw)
    bw = {impl: _at(sw, impl, big, "graph_busbw_GBps") for impl in {r["impl"] for r in sw}}
    pulls = {i: bw[i] for i in PULL_KERNELS if bw.get(i)}
    if pulls:
        best_pull = max(pulls, key=pulls.get)
        peers = ", ".join(
            f"{name} {bw[impl]:.0f}"
            for impl, name in (
                ("labkit_two_shot_in_place", "labkit two-shot in place"),
                ("labkit_two_shot_ce_in_place", "labkit two_shot_ce in place"),
                ("nccl", "NCCL"),
                ("torch_two_shot", "torch two_shot"),
            )
            if bw.get(impl)
        )
        lines.append(
            f"- **{format_bytes(big)}, busbw under graph replay (GB/s):** labkit's best loading kernel out of place, "
            f"{best_pull.removeprefix('labkit_')}, {pulls[best_pull]:.0f}; {peers}."
        )
    cross = crossover_bytes(records, w, "graph_us")
    lines.append(
        "- **one-shot or two-shot:** "
        + (
            "one-shot is at least as fast at every size."
            if cross is None
            else f"two-shot is faster at every size above {format_bytes(cross)} (graph replay)."
            if cross
            else "two-shot is faster at every size."
        )
    )
    return f"**W={w}**\n\n" + "\n".join(lines)


def pulls_against_links(records: list[dict], link_records: list[dict], w: int) -> str:
    """At the largest size both hold: the link's ceiling for SM loads, SM stores and the copy
    engines (every link busy both ways), beside the busbw of labkit's kernels under graph replay:
    where the pull kernels stop against what the links carry. "" without both."""
    from labkit.labs.collectives.links import best_links

    links = [r for r in best_links(link_records or []) if r["direction"] == "both" and r["world_size"] == w]
    sw = [r for op in ("all_reduce", "reduce_scatter", "all_gather") for r in _sweep(records, w, op)]
    common = sorted({r["bytes"] for r in links} & {r["bytes"] for r in sw})
    if not common:
        return ""
    big = common[-1]
    link_gbps = {r["impl"]: r["GBps"] for r in links if r["bytes"] == big}
    kernels = [
        (f"{impl.removeprefix('labkit_')} ({op.replace('_', '-')})", _at(ops, impl, big, "graph_busbw_GBps"))
        for op in ("all_reduce", "reduce_scatter", "all_gather")
        for ops in [_sweep(records, w, op)]
        for impl in (
            PULL_KERNELS + ("labkit_two_shot_in_place", "labkit_two_shot_ce_in_place")
            if op == "all_reduce"
            else ("labkit",)
        )
    ]
    kernels = [(name, v) for name, v in kernels if v]
    return (
        f"**W={w}, {format_bytes(big)}:** the links carry "
        + ", ".join(f"{mode} {gbps:.0f}" for mode, gbps in sorted(link_gbps.items(), key=lambda kv: kv[1]))
        + " GB/s per GPU with every link busy both ways; labkit's kernels reach (busbw, graph replay) "
        + ", ".join(f"{name} {v:.0f}" for name, v in kernels)
        + " GB/s."
    )


def _shots_in_sequence(records: list[dict], w: int) -> bool | None:
    """From the ``ce_profile`` records of ``two_shot_ce`` at W ranks: did every rank's copies end
    before its reduce kernel started? None without such records."""
    rows = [r for r in records if r.get("kind") == "ce_profile" and r.get("world_size") == w]
    ranks = sorted({r["rank"] for r in rows})
    if not ranks:
        return None
    for rank in ranks:
        mine = [r for r in rows if r["rank"] == rank]
        copies = [r for r in mine if r.get("activity") == "memcpy"]
        kernel = [r for r in mine if r.get("name") == "two_shot_ce_kernel"]
        if not copies or not kernel:
            return None
        if max(c["start_us"] + c["us"] for c in copies) > kernel[0]["start_us"]:
            return False
    return True


def two_shot_ce_bound(records: list[dict], link_records: list[dict], w: int) -> str:
    """Why ``two_shot_ce`` stops below the links' fastest copy: its two shots run one after the
    other (checked on its profile, kind ``ce_profile``), each moving (W-1)/W x N bytes per rank,
    the first by the copy engines, the second by SM stores. At the links' own rates for those two
    (``memcpy_write`` and ``sm_write``, every link busy both ways, the largest size both files
    hold) that allows a busbw of at most 2 / (1/copy + 1/store), whatever the kernel does. The
    bound beside what ``two_shot_ce`` reaches under graph replay. "" without the records or when
    the profile does not show the shots in sequence."""
    from labkit.labs.collectives.links import best_links

    links = [r for r in best_links(link_records or []) if r["direction"] == "both" and r["world_size"] == w]
    ce = {r["bytes"]: r["graph_busbw_GBps"] for r in _sweep(records, w) if r["impl"] == "labkit_two_shot_ce_in_place"}
    common = sorted({r["bytes"] for r in links} & {b for b, v in ce.items() if v})
    if not common or not _shots_in_sequence(records, w):
        return ""
    big = common[-1]
    rate = {r["impl"]: r["GBps"] for r in links if r["bytes"] == big}
    if "memcpy_write" not in rate or "sm_write" not in rate:
        return ""
    bound = 2 / (1 / rate["memcpy_write"] + 1 / rate["sm_write"])
    fastest = max(rate.values())
    return (
        f"**W={w}, {format_bytes(big)}:** `two_shot_ce`'s copies end before its kernel starts on every rank "
        f"(its profile), so its two shots take turns: copy engines at {rate['memcpy_write']:.0f} GB/s, then SM "
        f"stores at {rate['sm_write']:.0f}, which allows at most {bound:.0f} GB/s busbw "
        f"({bound / fastest:.2f}x the fastest copy, {fastest:.0f}). It reaches {ce[big]:.0f} "
        f"({ce[big] / bound:.2f}x that bound); passing the bound needs the two shots to overlap."
    )


def slowed_reader_in_words(barrier_records: list[dict], variant: str = "no_end_barrier", min_delay: int = 1000) -> str:
    """Lab 06's broken barriers: for ``variant`` with a reader slowed inside the kernel by at least
    ``min_delay`` volatile loads, the wrong results per form (algorithm) as "wrong of trials". ""
    without such rows."""
    rows = [
        r
        for r in barrier_records
        if r.get("variant") == variant
        and r.get("delay", 0) >= min_delay
        and r.get("wrong_results") is not None
        and not r.get("skipped")
    ]
    if not rows:
        return ""
    wrong = [r["wrong_results"] for r in rows]
    trials = sorted({r["trials"] for r in rows})
    forms = sorted({r["algorithm"] for r in rows})
    lo, hi = min(wrong), max(wrong)
    count = f"{lo}" if lo == hi else f"{lo}-{hi}"
    return (
        f"{count} wrong of {'/'.join(map(str, trials))} calls in each of the {len(forms)} forms "
        f"({', '.join(forms)}) with the reader slowed by {min_delay:,} or more volatile loads"
    )


def talk_questions(records: list[dict], w: int) -> str:
    """The seed talk's questions about more than two GPUs, answered from one machine's records at
    ``w`` ranks: does the all-gather that reads GPU 0 first on every rank lose to the rotated
    order; from which size does two-shot beat one-shot; how does the double binary tree compare
    with labkit's best all-reduce, and how does its unguarded leaf end. "" without sweep records."""
    from labkit.labs.collectives import gather_order
    from labkit.labs.collectives.sweep_bench import crossover_bytes

    sw = _sweep(records, w)
    if not sw:
        return ""
    lines = []
    naive = sorted(
        (r["shard_bytes"], r)
        for r in gather_order.order_records(records)
        if r.get("order") == "naive" and r.get("world_size") == w and r.get("ratio_to_rotated")
    )
    lines.append(
        "- **The all-gather that reads GPU 0 first on every rank** (its time over the rotated order's, "
        "graph replay, median and quartiles of paired rounds): "
        + (
            ", ".join(
                f"x{r['ratio_to_rotated']:.2f} ({r['ratio_p25']:.2f}-{r['ratio_p75']:.2f}) "
                f"at {format_bytes(b)} per rank"
                for b, r in naive
            )
            if naive
            else "not in these records at this W."
        )
    )
    cross = crossover_bytes(records, w, "graph_us")
    lines.append(
        "- **Where one-shot gives way to two-shot** (graph replay): "
        + (
            "nowhere: one-shot is at least as fast at every size."
            if cross is None
            else f"two-shot is faster at every size above {format_bytes(cross)}."
            if cross
            else "two-shot is faster at every size."
        )
    )
    ratios = []
    for b in sorted({r["bytes"] for r in sw}):
        tree = _at(sw, "labkit_tree", b, "graph_us")
        best = [v for v in (_at(sw, i, b, "graph_us") for i in ("labkit_one_shot", "labkit_two_shot")) if v]
        if tree and best:
            ratios.append(tree / min(best))
    crash = next((r for r in records if r.get("kind") == "crash" and r.get("world_size") == w), None)
    if ratios:
        lines.append(
            f"- **The double binary tree:** {_span(ratios)} of labkit's faster of one-shot and two-shot across "
            f"the sweep's {len(ratios)} sizes (graph replay)"
            + (
                f"; its leaf that reads a child it does not have ended the ranks as {crash['statuses']}."
                if crash and crash.get("statuses")
                else "."
            )
        )
    return f"**W={w}**\n\n" + "\n".join(lines)


def sweep_crossover_rows(records: list[dict]) -> list[dict]:
    """labkit's one-shot and two-shot all-reduce of a sweep, every world size it holds, as rows
    ``plots.plot_tuned_crossover`` draws (its "best" time is the sweep's graph replay): the crossover
    the chooser reads off the recorded sweeps (``collectives.measured_crossovers``)."""
    return [
        {
            "op": "all_reduce",
            "impl": r["impl"],
            "world_size": r["world_size"],
            "bytes": r["bytes"],
            "best": {"us": r["graph_us"]},
        }
        for r in records
        if r.get("kind", "sweep") == "sweep"
        and r.get("op") == "all_reduce"
        and r.get("impl") in ("labkit_one_shot", "labkit_two_shot")
        and r.get("graph_us")
        and r.get("correct")
    ]


#: the 2-GPU reference the docs' large-message table is rendered from (labkit report)
DOCS_REFERENCE = "h200x2/collectives.json"
#: the reference files of the small-message tables (labkit report), one per world size
SMALL_REFERENCES = ("h200x2/collectives.json", "h200x4/collectives.json")
#: the push benchmark's impls, in the docs' column order: labkit's one-shots, the public call,
#: then torch's ops (kind "push", out of place)
PUSH_COLUMNS = (
    ("labkit_fid_one_shot", "flag-in-data"),
    ("labkit_push_one_shot", "push"),
    ("labkit_one_shot", "pull one-shot"),
    ("labkit_all_reduce", "`all_reduce` (auto)"),
    ("torch_one_shot", "torch one-shot"),
    ("torch_two_shot", "torch two-shot"),
)


def _world(reference, name) -> int:
    return reference.records(name, kind="push")[0]["world_size"]


def small_messages_table(reference) -> str:
    """docs block ``collectives.small-messages``: the all-reduce's µs up to 1 MiB under graph replay,
    on 2 and 4 H200s: labkit's one-shots (flag-in-data, push, pull) and the public call beside
    torch's ops, timed in the same rounds (kind ``push``, out of place), with NCCL from the sweep
    (kind ``sweep``, ``graph_us``); the last column is labkit's fastest over torch's fastest."""
    from labkit.workbench.findings import number

    head = ["W", "size"] + [label for _, label in PUSH_COLUMNS] + ["NCCL (sweep)", "labkit's best / torch's best"]
    out = ["| " + " | ".join(head) + " |", "|---" * len(head) + "|"]
    worlds = {}  # each file's world size, read as its rows are (a missing file is named in file order)
    for name in SMALL_REFERENCES:
        push = reference.records(name, kind="push", timing="graph")
        worlds[name] = _world(reference, name)
        for size in sorted({r["bytes"] for r in push if SMALL[0] <= r["bytes"] <= SMALL[1]}):
            us = {
                i: reference.value(name, "us", kind="push", timing="graph", impl=i, bytes=size) for i, _ in PUSH_COLUMNS
            }
            nccl = reference.value(name, "graph_us", kind="sweep", op="all_reduce", impl="nccl", bytes=size)
            mine = min(v for i, v in us.items() if i.startswith("labkit"))
            theirs = min(v for i, v in us.items() if i.startswith("torch"))
            cells = [str(worlds[name]), format_bytes(size), *(number(us[i]) for i, _ in PUSH_COLUMNS)]
            out.append("| " + " | ".join([*cells, number(nccl), f"{mine / theirs:.2f}x"]) + " |")
    out.append("")
    files = " and ".join(f"`reference/{n}`" for n in SMALL_REFERENCES)
    checks = []
    for name in SMALL_REFERENCES:
        for size in (SMALL[0], SMALL[1]):
            ratio = reference.value(
                name, "count_check_ratio", kind="push", timing="graph", impl="labkit_push_one_shot", bytes=size
            )
            checks.append(f"W={worlds[name]} {format_bytes(size)} {ratio:.2f}x")
    out.append(
        f"µs per call, median of CUDA-graph replays, bf16, out of place, H200s: {files}, kind `push` "
        "(`timing` `graph`, field `us`) and, for NCCL, kind `sweep` (`graph_us`). What catching disagreeing "
        "counts costs the push one-shot (its time over the same protocol without count headers, "
        "`count_check_ratio`): " + ", ".join(checks) + ". Rendered by `labkit report`."
    )
    return "\n".join(out)


#: (label, labkit's impl) of the eager table's rows: the public call out of place and in place,
#: then the one-shots (kind "push", timing "eager")
EAGER_ROWS = (
    ("`all_reduce(buf, out)`", "labkit_all_reduce"),
    ("`all_reduce(buf)` in place", "labkit_all_reduce_in_place"),
    ("flag-in-data", "labkit_fid_one_shot"),
    ("push", "labkit_push_one_shot"),
)


def eager_calls_table(reference) -> str:
    """docs block ``collectives.eager-calls``: each call's µs called back to back from Python (kind
    ``push``, ``timing`` "eager") over torch's fastest eager op in the same rounds
    (``ratio_to_torch_best``), at 4 KiB and 1 MiB on 2 and 4 H200s, beside the slowest rank's
    host µs per call at 4 KiB (kind ``host_call``)."""
    from labkit.workbench.findings import number

    sizes = (SMALL[0], SMALL[1])
    worlds = {name: _world(reference, name) for name in SMALL_REFERENCES}
    head = ["call"] + [f"W={worlds[n]}, {format_bytes(b)}" for n in SMALL_REFERENCES for b in sizes]
    out = ["| " + " | ".join(head) + " |", "|---" * len(head) + "|"]
    for label, impl in EAGER_ROWS:
        cells = []
        for name in SMALL_REFERENCES:
            for size in sizes:
                us = reference.value(name, "us", kind="push", timing="eager", impl=impl, bytes=size)
                ratio = reference.value(name, "ratio_to_torch_best", kind="push", timing="eager", impl=impl, bytes=size)
                cells.append(f"{number(us)} ({ratio:.2f}x)")
        out.append(f"| {label} | " + " | ".join(cells) + " |")
    torch_cells = []
    for name in SMALL_REFERENCES:
        for size in sizes:
            best = min(
                reference.value(name, "us", kind="push", timing="eager", impl=i, bytes=size)
                for i in ("torch_one_shot", "torch_two_shot")
            )
            torch_cells.append(number(best))
    out.append("| torch's fastest op | " + " | ".join(torch_cells) + " |")
    out.append("")
    host = []
    for name in SMALL_REFERENCES:
        # the slowest rank's host time per call: back to back, every rank waits for the last
        # one's launch, so it bounds the eager time (rank 0 alone can look faster than torch)
        slowest = {}
        for r in reference.records(name, kind="host_call", bytes=SMALL[0]):
            if r["impl"] not in slowest or r["us"] > slowest[r["impl"]]["us"]:
                slowest[r["impl"]] = r
        mine, theirs = slowest["labkit_all_reduce"], slowest["torch_two_shot"]
        host.append(
            f"W={worlds[name]}: `all_reduce` {number(mine['us'])} (rank {mine['rank']}), flag-in-data "
            f"{number(slowest['labkit_fid']['us'])} (rank {slowest['labkit_fid']['rank']}), torch two-shot "
            f"{number(theirs['us'])} (rank {theirs['rank']}): `all_reduce` {mine['us'] / theirs['us']:.2f}x"
        )
    out.append(
        "µs per call back to back (median; in brackets `ratio_to_torch_best`, the median over rounds of the "
        "call's time over torch's fastest eager op in the same round), "
        "bf16: kind `push`, `timing` `eager`. Host µs per call at 4 KiB on each call's slowest rank (kind "
        "`host_call`, field `us`, the most over ranks): " + "; ".join(host) + ". Rendered by `labkit report`."
    )
    return "\n".join(out)


#: (row label, op, impls of labkit, NCCL's impl or None, torch's impl or None)
LARGE_ROWS = (
    ("all-reduce, out of place", "all_reduce", ("labkit_one_shot",), "nccl", "torch_two_shot"),
    ("all-reduce, in place", "all_reduce", ("labkit_two_shot_ce_in_place", "labkit_two_shot_in_place"), None, None),
    ("reduce-scatter", "reduce_scatter", ("labkit",), "nccl", None),
    ("all-gather", "all_gather", ("labkit",), "nccl", None),
)


def large_messages_table(reference) -> str:
    """docs block ``collectives.large-messages``: bus bandwidth at 256 MiB under graph replay on 2×H200
    (kind ``sweep``, ``graph_busbw_GBps``), and ``all_reduce_into`` (kind ``into``, ``busbw_GBps``)."""
    from labkit.workbench.findings import number

    name, size = DOCS_REFERENCE, 256 << 20

    def busbw(op, impl):
        return number(reference.value(name, "graph_busbw_GBps", kind="sweep", op=op, impl=impl, bytes=size))

    out = ["| 256 MiB, GB/s busbw | labkit | NCCL | torch symm_mem |", "|---|---|---|---|"]
    for label, op, mine, nccl, torch_impl in LARGE_ROWS:
        labkit = ", ".join(f"{busbw(op, i)} (`{i}`)" for i in mine)
        out.append(
            f"| {label} | {labkit} | {busbw(op, nccl) if nccl else '–'} | "
            f"{busbw(op, torch_impl) + f' (`{torch_impl}`)' if torch_impl else '–'} |"
        )
    into = reference.value(name, "busbw_GBps", kind="into", impl="labkit_into", timing="graph", bytes=size)
    out.append(f"| all-reduce into a symmetric `out` | {number(into)} (`labkit_into`) | – | – |")
    out.append("")
    out.append(
        f"Median bus bandwidth of CUDA-graph replays, bf16, 2×H200: `reference/{name}`, kind `sweep`, "
        "field `graph_busbw_GBps`; the last row kind `into`, `timing` `graph`, field `busbw_GBps`. "
        "Rendered by `labkit report`."
    )
    return "\n".join(out)


def headline(reference) -> str:
    """Notebook 02's first screen: the recorded 2×H200 sweep at large sizes, and the bus bandwidth at 256 MiB."""
    lines = sweep_in_words(reference.records("h200x2/collectives.json", kind="sweep"), 2).splitlines()
    keep = [x for x in lines if x.startswith(("- **out of place, 16 MiB", "- **256 MiB, busbw"))]
    if len(keep) != 2:
        raise ValueError(f"collectives headline: expected two lines of sweep_in_words, got {keep}")
    return (
        "labkit's all-reduce against the best of NCCL and `torch.ops.symm_mem` on two ranks:\n\n"
        + "\n".join(keep)
        + "\n\n(`reference/h200x2/collectives.json`, kind `sweep`; rendered by `labkit report`.)"
    )
