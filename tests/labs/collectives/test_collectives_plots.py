"""labkit.labs.collectives (lab 02) on the collectives' results: the headline, correctness, broken,
tune and crossover figures and tables drawn from synthetic or recorded sweeps, the explorer panel,
the sm_90 PTX summary (compiled without a GPU) and the eager series. The kernels' own correctness,
hangs and misuse are tests/kernels/comm/test_collectives.py."""

import pytest
from worlds import skip_without_a_world

import labkit  # noqa: F401  (picks the tier first)
from labkit.kernels.comm import collectives as C


def test_gpu_code_uses_the_atomics_the_docs_promise():
    """Compiled for sm_90 in a child with TRITON_INTERPRET=0 (no GPU needed): the correct
    kernels' signals are release/acquire compare-and-swaps at system scope, the 'relaxed'
    variant's are relaxed, and the data moves with 16-byte vector loads."""
    from labkit.workbench import sandbox

    res = sandbox.run_isolated("labkit.labs.collectives.ptx:summarize_all", timeout=300, env={"TRITON_INTERPRET": "0"})
    rows = res.unwrap()
    for r in rows:
        if r["sem"] == 0:
            assert {"atom.global.release.sys.cas.b32", "atom.global.acquire.sys.cas.b32"} <= set(r["atomics"]), r
        else:
            assert r["atomics"] and all(".relaxed.sys." in a for a in r["atomics"]), r
        if r["algorithm"] in ("two_shot_in_place", "two_shot_ce"):  # their pushes over NVLink: 16-byte stores too
            assert r["vector_stores"], r
        if r["algorithm"] in ("one_shot", "two_shot", "two_shot_in_place", "two_shot_ce"):
            # (reduce-scatter and all-gather vectorise when Triton specialises the shard size as
            # divisible by 16 at launch, which this signature-only compile does not model; the
            # tree's loads are all masked)
            assert r["vector_loads"], r


def test_chosen_vs_best_reads_the_in_place_series():
    from labkit.labs.collectives import plots
    from labkit.workbench.plot import format_bytes

    base = {"kind": "sweep", "op": "all_reduce", "world_size": 2}
    big, small = C.CE_FROM_BYTES[2] * 2, 4096
    recs = [
        dict(base, impl="nccl", bytes=big, us=900.0, graph_us=890.0),
        dict(base, impl="labkit_two_shot_ce_in_place", bytes=big, us=750.0, graph_us=740.0),
        dict(base, impl="nccl", bytes=small, us=20.0, graph_us=11.0),
        dict(base, impl="labkit_two_shot_in_place", bytes=small, us=28.0, graph_us=7.0),
    ]
    rows = {r["bytes"]: r for r in plots.chosen_vs_best(recs, 2, in_place=True)}
    assert rows[big]["algorithm"] == "two_shot_ce_in_place" and rows[big]["mine"]["us"] == 750.0
    assert rows[big]["best"]["us"]["impl"] == "nccl" and rows[big]["best"]["graph_us"]["graph_us"] == 890.0
    assert rows[small]["algorithm"] == "two_shot_in_place" and rows[small]["mine"]["graph_us"] == 7.0
    at = format_bytes(big)  # twice the size the copy engines take over from
    assert plots.chosen_vs_best_verdict(recs, 2, in_place=True).endswith(
        f"back to back 1 of 2 sizes (x0.83 at {at}); graph replay 2 of 2 sizes (x0.83 at {at})"
    )


def test_the_explorer_runs_an_in_place_form():
    skip_without_a_world()
    from labkit.labs.collectives import widgets

    text = widgets.collective_report("two_shot_ce_in_place", 300, 2, [], live_world=True)
    assert (
        "two_shot_ce_in_place on 2 ranks, 300 bf16 elements: correct on 2 of 2 ranks, pads back at zero on 2 of 2"
        in text
    ), text


def test_headline_table_takes_labkits_best_against_each_baseline():
    from labkit.labs.collectives import plots

    def rec(impl, op, nbytes, us, bw):
        return {
            "kind": "sweep",
            "impl": impl,
            "op": op,
            "world_size": 2,
            "bytes": nbytes,
            "us": us,
            "graph_us": us / 2,
            "busbw_GBps": bw,
            "graph_busbw_GBps": bw * 2,
        }

    recs = [
        rec("labkit_one_shot", "all_reduce", 4096, 9.0, 1.0),
        rec("labkit_two_shot", "all_reduce", 4096, 12.0, 1.0),
        rec("nccl", "all_reduce", 4096, 20.0, 1.0),
        rec("torch_one_shot", "all_reduce", 4096, 8.0, 1.0),
        rec("labkit_two_shot", "all_reduce", 1 << 28, 800.0, 300.0),
        rec("labkit_two_shot_ce_in_place", "all_reduce", 1 << 28, 700.0, 350.0),
        rec("nccl", "all_reduce", 1 << 28, 900.0, 290.0),
    ]
    text = plots.headline_markdown(recs)
    assert "| all_reduce 4 KiB | 9.0 µs / 4.5 µs | 20.0 µs / 10.0 µs | 8.0 µs / 4.0 µs |" in text
    assert "| all_reduce 256 MiB | 350 GB/s / 700 GB/s | 290 GB/s / 580 GB/s | – / – |" in text
    assert "1 MiB" not in text and "reduce_scatter" not in text  # sizes and ops the sweep lacks
    assert plots.headline_markdown([]) == "(no sweep records)"


# ---- lab 02's figures, on small constructed records: what each one draws


def _axes():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots()
    return plt, fig, ax


def _texts(ax):
    return [t.get_text() for t in ax.texts]


def test_correctness_grid_and_verdicts():
    from labkit.labs.collectives import plots

    def row(w, dtype, op, alg, rank, correct=True):
        return {
            "world_size": w,
            "dtype": dtype,
            "op": op,
            "algorithm": alg,
            "rank": rank,
            "n": 11,
            "correct": correct,
            "pads_zero": True,
        }

    rows = [row(2, "float32", "all_reduce", "one_shot", r) for r in range(2)]
    rows += [row(2, "float32", "reduce_scatter", "direct", r) for r in range(2)]
    rows += [row(2, "float32", "all_gather", alg, r) for alg in ("direct", "naive") for r in range(2)]
    rows += [row(3, "float32", "all_reduce", "one_shot", r, correct=r != 1) for r in range(3)]
    plt, fig, ax = _axes()
    assert plots.plot_correctness(rows, ax) == 5  # W=3 did not run reduce-scatter or all-gather: grey, not cells
    assert _texts(ax) == ["2/2", "2/2", "2/2", "2/2", "2/3", "not run", "not run", "not run"]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["W=2 float32", "W=3 float32"]
    assert [t.get_text() for t in ax.get_xticklabels()] == [
        "one_shot",
        "reduce_scatter",
        "all_gather",
        "all_gather (naive)",
    ]
    plt.close(fig)
    lines = plots.correctness_verdicts(rows)
    assert len(lines) == 2
    assert "all 4 op x algorithm x dtype checks correct on every rank" in lines[0]
    assert "1 of 1 checks FAILED: all_reduce one_shot float32" in lines[1]


def test_broken_grid_counts_wrong_results_and_failed_runs():
    from labkit.labs.collectives import plots

    def rec(variant, alg, wrong, load="late"):
        return {
            "kind": "broken",
            "impl": f"labkit_{alg}",
            "variant": variant,
            "load": load,
            "world_size": 2,
            "bytes": 1 << 14,
            "ranks_x_trials": 12,
            "wrong_results": wrong,
            "outcome": f"{wrong} wrong of 12" if wrong is not None else "rank 0: timeout after 60 s",
        }

    recs = [
        rec("correct", "one_shot", 0),
        rec("no_end_barrier", "one_shot", 5),
        rec("no_end_barrier", "two_shot", None),
        rec("correct", "one_shot", 0, load="gemm"),
        {"kind": "sweep", "impl": "nccl"},
    ]
    plt, fig, ax = _axes()
    assert plots.plot_broken(recs, ax, "live") == 4
    assert _texts(ax) == ["0/12", "not run", "5/12", "rank 0: timeout af", "0/12", "not run"]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["correct, late", "no_end_barrier, late", "correct, gemm"]
    assert "W=2 16 KiB" in ax.get_title()
    plt.close(fig)
    assert plots.broken_verdict(recs) == (
        "correct wrong in 0 of 12 (late), 0 of 12 (gemm); "
        "no_end_barrier wrong in 5 of 12 (late), 1 of 2 runs did not finish"
    )
    assert plots.broken_verdict([]) == "no broken-variant runs"


def _sweep(world=2):
    base = {"kind": "sweep", "op": "all_reduce", "world_size": world}
    out = []
    for b, one, nccl in (
        (4096, (20.0, 7.0), (15.0, 9.0)),
        (1 << 20, (30.0, 10.0), (40.0, 20.0)),
        (1 << 28, (800.0, 790.0), (900.0, 880.0)),
    ):
        out += [
            dict(base, impl="labkit_one_shot", bytes=b, us=one[0], graph_us=one[1], busbw_GBps=b / one[0] / 1e3),
            dict(base, impl="nccl", bytes=b, us=nccl[0], graph_us=nccl[1], busbw_GBps=b / nccl[0] / 1e3),
        ]
    return out


def test_chosen_vs_best_plot_draws_both_timings_and_the_line_at_one():
    from labkit.labs.collectives import plots

    plt, fig, ax = _axes()
    assert plots.plot_chosen_vs_best(_sweep(), ax, "t", 2) == 3
    lines = {ln.get_label(): ln for ln in ax.get_lines()}
    assert set(lines) == {"back to back", "CUDA-graph replay", "as fast as the best other (1.0)"}
    assert list(lines["back to back"].get_ydata()) == pytest.approx([20 / 15, 30 / 40, 800 / 900])
    assert list(lines["CUDA-graph replay"].get_ydata()) == pytest.approx([7 / 9, 10 / 20, 790 / 880])
    assert ax.get_xscale() == "log"
    assert _texts(ax) == ["one_shot"]  # the chosen algorithm, written where it changes
    plt.close(fig)
    assert plots.chosen_vs_best_verdict(_sweep(), 2) == (
        "W=2, out of place: chosen as fast as the best other at back to back 2 of 3 sizes (x0.89 at 256 MiB); "
        "graph replay 3 of 3 sizes (x0.90 at 256 MiB)"
    )


def test_tune_grid_has_a_cell_per_op_and_size_with_its_launch():
    from labkit.labs.collectives import plots

    def row(impl, op, w, b, us, default_us=None):
        return {
            "impl": impl,
            "op": op,
            "world_size": w,
            "bytes": b,
            "default_us": default_us,
            "best": {"vectors": 2, "num_warps": 16, "programs": 132, "us": us, "busbw_GBps": b / us / 1e3},
        }

    rows = [
        row("labkit_one_shot", "all_reduce", 2, 1 << 20, 10.0, 11.0),
        row("labkit_one_shot", "all_reduce", 2, 1 << 28, 800.0),
        row("labkit", "reduce_scatter", 4, 1 << 20, 9.0),
    ]
    plt, fig, ax = _axes()
    assert plots.plot_tune(rows, ax, "RECORDED x") == 3
    texts = [t for t in _texts(ax) if t]
    assert texts[0] == "2x16x132\n10.0 µs\ndefault x1.10" and texts[1] == "2x16x132\n800.0 µs"
    assert [t.get_text() for t in ax.get_yticklabels()] == ["W=2 one_shot", "W=4 reduce_scatter"]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["1 MiB", "256 MiB"]
    plt.close(fig)


def _links():
    def rec(impl, direction, b, gbps, correct=True):
        return {
            "kind": "link",
            "impl": impl,
            "direction": direction,
            "world_size": 2,
            "bytes": b,
            "GBps": gbps,
            "us": b / gbps / 1e3,
            "correct": correct,
            "vectors": 4,
            "num_warps": 16,
            "programs": 132,
        }

    return [
        rec("sm_read", "both", 1 << 28, 330.0),
        rec("sm_write", "both", 1 << 28, 360.0),
        rec("memcpy_write", "both", 1 << 28, 380.0),
        rec("memcpy_write", "both", 1 << 28, 999.0, correct=False),
        rec("memcpy_write", "one", 1 << 28, 395.0),
        rec("memcpy_write", "both", 1 << 26, 500.0),
    ]


def test_link_ceiling_is_the_best_push_or_copy_at_the_largest_size_both_directions_busy():
    from labkit.labs.collectives import plots

    c = plots.link_ceiling(_links(), "reference h200x2")
    # not the wrong copy (999), not one direction (395), not a smaller size (500), not loads
    assert (c["GBps"], c["mode"], c["direction"], c["bytes"]) == (380.0, "memcpy_write", "both", 1 << 28)
    assert c["label"] == (
        "link ceiling, measured: 380 GB/s (memcpy_write, 256 MiB, both directions busy), reference h200x2"
    )
    assert plots.link_ceiling([], "x") is None and plots.link_ceiling(None, "x") is None


def test_busbw_and_links_plots_draw_the_ceiling_or_say_there_is_none():
    from labkit.labs.collectives import plots

    ceiling = plots.link_ceiling(_links(), "reference m")
    plt, fig, ax = _axes()
    plots.plot_busbw(_sweep(), ax, "t", ceiling=ceiling)
    drawn = [ln for ln in ax.get_lines() if ln.get_label() == ceiling["label"]]
    assert len(drawn) == 1 and list(drawn[0].get_ydata()) == [380.0, 380.0]
    assert len(ax.get_lines()) == 3  # labkit_one_shot, nccl, the ceiling
    plt.close(fig)
    plt, fig, ax = _axes()
    plots.plot_busbw(_sweep(), ax, "t", ceiling=None, no_ceiling="no link measurement for m: no ceiling drawn")
    assert len(ax.get_lines()) == 2 and _texts(ax) == ["no link measurement for m: no ceiling drawn"]
    plt.close(fig)
    plt, fig, ax = _axes()
    plots.plot_links(_links(), ax, "t", _sweep(), ceiling=ceiling)
    assert len(ax.patches) == 8  # 4 modes x 2 directions (a mode not measured one way: a zero bar)
    assert ceiling["label"] in [ln.get_label() for ln in ax.get_lines()]
    plt.close(fig)


def test_tuned_crossover_draws_one_and_two_shot_per_world_size():
    from labkit.labs.collectives import plots

    def row(impl, w, b, us):
        return {
            "impl": impl,
            "op": "all_reduce",
            "world_size": w,
            "bytes": b,
            "best": {"vectors": 1, "num_warps": 16, "programs": 132, "us": us, "busbw_GBps": 1.0},
        }

    rows = [
        row("labkit_one_shot", 2, 1 << 16, 7.0),
        row("labkit_two_shot", 2, 1 << 16, 10.0),
        row("labkit_one_shot", 2, 1 << 20, 10.0),
        row("labkit_two_shot", 2, 1 << 20, 13.0),
        row("labkit_one_shot", 4, 1 << 16, 9.0),
        row("labkit_two_shot", 4, 1 << 16, 14.0),
        row("labkit_one_shot", 4, 1 << 20, 19.0),
        row("labkit_two_shot", 4, 1 << 20, 18.0),
        {
            "impl": "labkit",
            "op": "all_gather",
            "world_size": 4,
            "bytes": 1 << 16,
            "best": {"vectors": 1, "num_warps": 4, "programs": 1, "us": 1.0, "busbw_GBps": 1.0},
        },
    ]
    plt, fig, ax = _axes()
    assert plots.plot_tuned_crossover(rows, ax, "RECORDED m") == {2: None, 4: 1 << 16}
    labels = [ln.get_label() for ln in ax.get_lines()]
    assert labels == [
        "one_shot, W=2",
        "two_shot, W=2",
        "one_shot, W=4",
        "two_shot, W=4",
        "W=4: two-shot faster above 64 KiB",
    ]
    assert list(ax.get_lines()[3].get_ydata()) == [14.0, 18.0]
    plt.close(fig)


def test_ptx_lines_name_the_atomics_and_vector_widths():
    from labkit.labs.collectives import plots

    def row(alg, sem, atomics, loads, stores=False, world=2):
        return {
            "algorithm": alg,
            "world": world,
            "sem": sem,
            "atomics": atomics,
            "vector_loads": loads,
            "vector_stores": stores,
        }

    ok = ["atom.global.acquire.sys.cas.b32", "atom.global.release.sys.cas.b32"]
    rows = [
        row("one_shot", 0, ok, True),
        row("one_shot", 1, ["atom.global.relaxed.sys.cas.b32"], True),
        row("tree", 0, ok, False, world=8),
        row("tree", 1, ["atom.global.relaxed.sys.cas.b32"], False, world=8),
    ]
    lines = plots.ptx_lines(rows)
    assert lines[0] == "atomics, correct kernels: " + ", ".join(ok)
    assert lines[1] == "atomics, 'relaxed' variant: atom.global.relaxed.sys.cas.b32"
    assert lines[2].strip() == "one_shot: correct release/acquire, relaxed variant relaxed; 16-byte vector loads (W=2)"
    assert (
        lines[3].strip()
        == "tree: correct release/acquire, relaxed variant relaxed; 16-byte vector accesses: none (W=8)"
    )


def test_ptx_summary_of_some_kernels_only_and_a_bad_name_refused():
    from labkit.labs.collectives import ptx

    with pytest.raises(ValueError, match="algorithms: 'bogus' is not one of"):
        ptx.summarize_all(algorithms=["bogus"])


def _eager(world=2):
    """Eager-series records as ``eager_bench.eager_series`` writes them: torch's two ops, labkit's three
    paths in place and out of place, at 4 KiB and 1 MiB."""
    base = {
        "kind": "eager",
        "op": "all_reduce",
        "world_size": world,
        "dtype": "bfloat16",
        "correct": True,
        "busbw_GBps": None,
    }
    out = []
    for b, torch_us in ((4096, (9.0, 8.0)), (1 << 20, (16.0, 12.0))):
        out += [
            dict(
                base,
                impl="torch_one_shot",
                path="torch_eager",
                in_place=False,
                bytes=b,
                us=torch_us[0],
                us_p25=torch_us[0] - 0.5,
                us_p75=torch_us[0] + 0.5,
            ),
            dict(
                base,
                impl="torch_two_shot",
                path="torch_eager",
                in_place=True,
                bytes=b,
                us=torch_us[1],
                us_p25=torch_us[1] - 0.5,
                us_p75=torch_us[1] + 0.5,
            ),
        ]
        for path, us in (("eager_uncached", 40.0), ("plan_cached", 11.0), ("plan", 9.0)):
            for in_place in (False, True):
                out.append(
                    dict(
                        base,
                        impl="labkit_all_reduce",
                        path=path,
                        in_place=in_place,
                        bytes=b,
                        us=us + in_place,
                        us_p25=us - 1,
                        us_p75=us + 2,
                        ratio_to_torch_best=(us + in_place) / min(torch_us),
                    )
                )
    return out


def test_eager_plot_draws_every_path_beside_torch_and_no_target():
    from labkit.labs.collectives import plots

    for in_place in (False, True):
        plt, fig, ax = _axes()
        assert plots.plot_eager(_eager() + _sweep(), ax, "t", in_place=in_place) == 5
        labels = [t.get_text() for t in ax.get_legend().get_texts()]
        assert not any("target" in lb for lb in labels) and "target" not in ax.get_title()
        # what is drawn: the five series (errorbars), the small messages shaded and labelled so
        assert len(ax.containers) == 5 and not [ln for ln in ax.get_lines() if not ln.get_label().startswith("_")]
        assert "small messages" in labels
        assert "small messages shaded (4 KiB..1 MiB)" in ax.get_title()
        assert [lb for lb in labels if lb.startswith("labkit")] == [
            "labkit, no plan (every call checks, chooses, Triton launch)",
            "labkit all_reduce(...), its cached plan",
            "labkit plan() (held by the caller)",
        ]
        assert ("in place" if in_place else "out of place") in ax.get_title()
        plt.close(fig)


def test_old_sweep_files_still_plot_and_say_they_lack_the_eager_series():
    """A reference file recorded before the eager series (reference/h200x2/collectives.json without
    its eager and host-cost records, or the minimal fields of one): every sweep plot as before, and
    the eager plot says what is missing.
    The new records (kinds "eager", "host_cost", "gather_order", "ce_profile") leave the sweep's plots,
    tables and crossover alone."""
    from labkit.labs.collectives import eager_bench, plots, sweep_bench, sweep_plots
    from labkit.workbench import results

    plt, fig, ax = _axes()
    assert plots.plot_eager(_sweep(), ax, "old") == 0
    assert "no eager-series records here" in _texts(ax)[0]
    plt.close(fig)
    refs = results.load_references("collectives")
    old = (
        [r for r in refs["h200x2"].records if r.get("kind") not in ("eager", "host_cost", "gather_order", "ce_profile")]
        if "h200x2" in refs
        else _sweep()
    )
    host = [
        {
            "kind": "host_cost",
            "impl": "labkit_all_reduce",
            "op": "all_reduce",
            "world_size": 2,
            "bytes": 4096,
            "us": 3.0,
            "path": "plan()",
            "stage": "plan launch",
        }
    ]
    orders = [
        {
            "kind": "gather_order",
            "impl": "labkit",
            "op": "all_gather",
            "order": o,
            "world_size": 2,
            "bytes": 1 << 21,
            "shard_bytes": 1 << 20,
            "dtype": "bfloat16",
            "us": 9.0,
            "us_p25": 8.9,
            "us_p75": 9.2,
            "busbw_GBps": 116.5,
            "correct": True,
            "ratio_to_rotated": 1.0,
            "ratio_p25": 1.0,
            "ratio_p75": 1.0,
        }
        for o in ("rotated", "naive")
    ]
    profile = [
        {
            "kind": "ce_profile",
            "impl": "labkit_two_shot_ce_in_place",
            "op": "all_reduce",
            "world_size": 2,
            "bytes": 1 << 28,
            "dtype": "bfloat16",
            "us": 370.0,
            "busbw_GBps": None,
            "correct": True,
            "rank": 0,
            "index": 0,
            "activity": "memcpy",
            "activity_kind": "Memcpy DtoD",
            "name": "Memcpy DtoD",
            "start_us": 0.0,
        }
    ]
    new = old + _eager() + host + orders + profile
    assert plots.headline_markdown(new) == plots.headline_markdown(old)
    assert plots.chosen_vs_best(new, 2) == plots.chosen_vs_best(old, 2)
    assert sweep_bench.crossover_bytes(new, 2) == sweep_bench.crossover_bytes(old, 2)
    assert sweep_plots._series(new, "all_reduce", "us") == sweep_plots._series(old, "all_reduce", "us")
    for recs in (old, new):
        plt, fig, ax = _axes()
        plots.plot_latency(recs, ax, "t")
        assert len(ax.get_lines()) == len(sweep_plots._series(old, "all_reduce", "us"))
        plt.close(fig)
    assert eager_bench.eager_verdicts(old) == []
    plt, fig, ax = _axes()
    assert plots.plot_eager(old, ax, "old") == 0
    plt.close(fig)
    assert eager_bench.eager_verdicts(new)[1] == (
        "W=2, plan_cached, out of place: x0.92..x1.38 of torch's best eager op (paired medians) at 4 KiB..1 MiB; "
        "faster than torch's best at 1 of 2 sizes"
    )


def test_the_recorded_eager_series_has_a_verdict_per_path_and_form():
    """reference/h200x2/collectives.json holds the eager series: one verdict per path x form, each
    with a ratio range over the 4 KiB..1 MiB sizes, and the eager plot draws it."""
    from labkit.labs.collectives import eager_bench, plots
    from labkit.workbench import results

    refs = results.load_references("collectives")
    if "h200x2" not in refs or not any(r.get("kind") == "eager" for r in refs["h200x2"].records):
        pytest.skip("reference/h200x2/collectives.json has no eager series")
    verdicts = eager_bench.eager_verdicts(refs["h200x2"].records)
    assert len(verdicts) == 2 * len(eager_bench.EAGER_PATHS)
    assert all(
        v.startswith("W=2, ") and "of torch's best eager op" in v and "faster than torch's best at" in v
        for v in verdicts
    )
    plt, fig, ax = _axes()
    assert plots.plot_eager(refs["h200x2"].records, ax, "h200x2") > 0
    plt.close(fig)
