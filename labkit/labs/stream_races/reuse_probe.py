"""The allocator-reuse probe of lab 03: does ``record_stream`` hold a freed block back?

One probe per way of cutting the block (``labkit.kernels.alloc.STYLES``), on one GPU:

    main:  allocate piece ── record_stream(side) ── free piece ── fresh = torch.empty(same size) ── sync
    side:       wait(main) ── busy for sleep_ms ──────────────────────── write into the piece ──

For a view the allocator hears ``record_stream`` and hands ``fresh`` another block; for a raw piece
the call is a silent no-op and ``fresh`` gets the same block, on the host, before the side
stream's write into it has even started on the GPU. The record keeps both pointers and the
times (host marks, and the write placed on the host clock by CUDA events, as ``timeline_trial``
does), so the verdict can be read off the data on any machine.
"""

from __future__ import annotations

import statistics

import torch

from labkit.kernels import alloc
from labkit.labs.stream_races import race

KIND = "reuse_probe"


def probe(style: str, *, numel: int = 1 << 20, sleep_ms: float = 20.0, device=None, trial: int = 0) -> dict:
    """One probe (module docstring) for ``style`` ("raw" or "views"); a flat record."""
    if style not in alloc.STYLES:
        raise ValueError(f"style: {style!r} is not one of {alloc.STYLES}")
    race._check_positive_int("numel", numel)
    if sleep_ms <= 0:
        raise ValueError(f"sleep_ms: the side stream must still be busy at the free, expected > 0, got {sleep_ms}")
    device = race._cuda_device(device)
    with torch.cuda.device(device):
        main, side = torch.cuda.current_stream(), race.side_stream(device)
        race.load_trial_kernels(
            device,
            torch.float32,
            numel,  # no first launch inside the window
            lambda: torch.empty(numel, device=device).fill_(race.SENTINEL),
        )
        ev0, w0, w1 = (torch.cuda.Event(enable_timing=True) for _ in range(3))
        torch.cuda.synchronize()
        t0 = race._host_us()
        ev0.record()  # the GPU is idle: this event's time is (nearly) t0 on the host clock
        bulk = alloc.allocate(style, [(numel,)], torch.float32, device)
        piece = bulk.tensors[0]
        owner_addr = piece.data_ptr()
        side.wait_stream(main)
        with torch.cuda.stream(side):
            race._sleep_ms(sleep_ms, device)
            w0.record()
            piece.fill_(race.SENTINEL)
            w1.record()
        piece.record_stream(side)  # no error either way; heard only for a view
        del piece, bulk
        freed = race._host_us() - t0
        fresh = torch.empty(numel, device=device)  # main stream: no kernel, only the allocator
        fresh_at = race._host_us() - t0
        fresh_addr = fresh.data_ptr()
        torch.cuda.synchronize()
        del fresh
    write_starts, write_ends = ev0.elapsed_time(w0) * 1e3, ev0.elapsed_time(w1) * 1e3
    reused = fresh_addr == owner_addr
    return {
        "kind": KIND,
        "allocator": style,
        "trial": trial,
        "numel": numel,
        "sleep_ms": sleep_ms,
        "record_stream_called": True,
        "owner_addr": owner_addr,
        "fresh_addr": fresh_addr,
        "block_reused": reused,
        "owner_freed_host_us": freed,
        "fresh_allocated_host_us": fresh_at,
        "side_write_starts_gpu_us": write_starts,
        "side_write_ends_gpu_us": write_ends,
        "fresh_before_write_ends": fresh_at < write_ends,
        "skipped": None,
    }


def probe_records(trials: int = 3, numel: int = 1 << 20, sleep_ms: float = 20.0) -> list[dict]:
    """``probe`` for every style, ``trials`` times; without a GPU one record with the ``skipped``
    reason (never a made-up result)."""
    from labkit.workbench import gates

    race._check_positive_int("trials", trials)
    gate = gates.requires(gpus=1, compiled=True)
    if not gate.ok:
        return [{"kind": KIND, "allocator": None, "trial": None, "skipped": gate.reason}]
    return [probe(s, numel=numel, sleep_ms=sleep_ms, trial=t) for s in alloc.STYLES for t in range(trials)]


def verdict(rs: list[dict]) -> str:
    """What the probes of one style show, from their own fields (medians of their times)."""
    if not rs:
        raise ValueError("rs: expected at least one probe record")
    n, reused = len(rs), sum(1 for r in rs if r["block_reused"])
    before = sum(1 for r in rs if r["block_reused"] and r["fresh_before_write_ends"])
    meaning = (
        "record_stream ignored"
        if reused == n
        else "held back for the side stream: record_stream heard"
        if reused == 0
        else "the outcome varied"
    )
    med = lambda key: statistics.median(r[key] for r in rs)  # noqa: E731
    text = (
        f"same block in {reused} of {n} ({meaning}); fresh tensor made at {med('fresh_allocated_host_us'):,.0f} µs "
        f"(host), side write into the old piece {med('side_write_starts_gpu_us'):,.0f}-"
        f"{med('side_write_ends_gpu_us'):,.0f} µs (GPU), medians"
    )
    if reused:
        text += f"; the same block was handed out before that write ended in {before} of {reused}"
    return text


def report(records: list[dict], label: str) -> str:
    """Lines for the notebook: one per style among ``records`` (other kinds ignored), under ``label``."""
    rs = [r for r in records if r.get("kind") == KIND]
    if not rs:
        return f"{label}: no allocator-reuse probe"
    lines = [f"{label}:"] + [f"  skipped: {r['skipped']}" for r in rs if r.get("skipped")]
    for style in alloc.STYLES:
        mine = [r for r in rs if r.get("allocator") == style and not r.get("skipped")]
        if mine:
            lines.append(f"  {style:>5} pieces, side stream busy {mine[0]['sleep_ms']:g} ms: {verdict(mine)}")
    return "\n".join(lines)
