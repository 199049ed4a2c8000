"""The collectives' chooser tables: what ``algorithm="auto"`` and the default launch read, typed,
one ``ChooserTable`` per GPU (the name it reports, ``torch.cuda.get_device_name``) and world size.

Every number in ``TABLES`` was read off a recording of ``labkit bench`` on that GPU, by the
function named beside its field (each a pure function of a file's records):

* ``one_shot_up_to``: the all-reduce crossover (reference/<machine>/collectives.json, kind
  "crossover", timing "graph_us": ``crossovers_from``);
* ``fid_out_of_place``, ``fid_in_place``: up to which size ``auto`` takes the flag-in-data
  one-shot on a buffer with an inbox (the same file, kind "push": ``fid_limits_from``);
* ``ce_from``: from which size the in-place ``auto`` hands the first shot to the copy engines
  (the same file, kind "sweep": ``ce_from_bytes_from``);
* ``launches``: the default launches that beat the rule (reference/h200x4/collectives_tune.json,
  kind "tune": ``labkit.labs.collectives.bench.launch_table_from``).

tests/kernels/comm/test_chooser_tables.py holds every table equal to what those functions compute from the
file the table names, and checks that an installed copy of the package, without reference/,
chooses as the checkout does: the package reads no recording when it chooses. A GPU or world size
without a table takes ``defaults`` (nothing recorded: ``DEFAULT_CROSSOVER_BYTES``' reasoning, no
flag-in-data, no copy engines, the rule's launches); ``table_for`` gives either, and
``ChooserTable.describe`` says which (a collective's plan carries it: ``chooser_table``). The
interpreter (the CPU tier, no GPU) chooses with ``INTERPRETER_GPU``'s tables: the recorded
machine its tests and figures stand in for.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field

import torch

from labkit.workbench import tier

#: ``one_shot_up_to`` of a world where one-shot is chosen at every size.
ALWAYS = float("inf")
#: Without a recording: with 2 ranks one-shot and two-shot read the same N bytes per rank and
#: one-shot has one barrier fewer, so one-shot always; with more ranks, one-shot reads (W-1)N
#: against two-shot's 2(W-1)N/W, so two-shot above a size this default guesses (256 KiB) and a
#: recording replaces.
DEFAULT_CROSSOVER_BYTES = {2: ALWAYS}
DEFAULT_CROSSOVER_ABOVE_2 = 256 << 10
#: The message sizes ``labkit bench collectives_tune`` searched (bytes per rank): the sizes of a
#: table's ``launches`` (``chooser.tuned_size`` maps a message to the nearest).
TUNED_BYTES = (64 << 10, 1 << 20, 16 << 20, 256 << 20)
#: A table's launch replaces the rule's only where the search timed it at least this much faster:
#: closer than that is within what one search's timings move between runs.
TABLE_MARGIN = 0.03

#: (in place) -> (flag-in-data's impl, the impl of what ``auto`` runs on a buffer without an
#: inbox): the pair of records of the push comparison (kind "push", timing "graph", field "us";
#: ``labkit.labs.collectives.push_bench``) that ``fid_limits_from`` compares.
FID_COMPARED = {
    False: ("labkit_fid_one_shot", "labkit_all_reduce"),
    True: ("labkit_fid_one_shot_in_place", "labkit_all_reduce_in_place"),
}
#: (the copy engines' impl, the pushed in-place two-shot's): the sweep records (kind "sweep",
#: field "graph_us") that ``ce_from_bytes_from`` compares.
CE_COMPARED = ("labkit_two_shot_ce_in_place", "labkit_two_shot_in_place")


@dataclass(frozen=True, kw_only=True)
class ChooserTable:
    """What the chooser reads for one GPU and world size (see the module docstring for where each
    field comes from). Sizes are bytes per rank."""

    gpu: str  # the name the GPU reports (torch.cuda.get_device_name)
    world_size: int
    source: str | None  # the recording the algorithm fields were read off (None: not recorded)
    one_shot_up_to: float  # out of place, auto runs one-shot up to this size, two-shot above
    fid_out_of_place: int | None = None  # auto takes flag-in-data up to this size (None: never)
    fid_in_place: int | None = None  # the same, in place
    ce_from: int | None = None  # in place on a buffer with a workspace, two_shot_ce from this size
    launch_source: str | None = None  # the launch search ``launches`` was read off
    launches: dict = field(default_factory=dict)  # (kernel, searched size) -> (vectors, num_warps)

    def fid_up_to(self, in_place: bool) -> int | None:
        return self.fid_in_place if in_place else self.fid_out_of_place

    def describe(self) -> str:
        """Which table this is, in one line: its GPU, world size and recordings, or the defaults."""
        sources = [s for s in (self.source, self.launch_source) if s is not None]
        if not sources:
            return f"defaults (no table for {self.gpu} x{self.world_size})"
        return f"{self.gpu} x{self.world_size}: " + ", ".join(dict.fromkeys(sources))


H200 = "NVIDIA H200"
#: the GPU whose tables the interpreter chooses with
INTERPRETER_GPU = H200
_H200_TUNE = "reference/h200x4/collectives_tune.json"  # W=2 on two of its GPUs, W=4 on all

#: (GPU, world size) -> its table.
TABLES: dict[tuple[str, int], ChooserTable] = {
    (H200, 2): ChooserTable(
        gpu=H200,
        world_size=2,
        source="reference/h200x2/collectives.json",
        one_shot_up_to=ALWAYS,
        fid_out_of_place=1 << 20,
        fid_in_place=1 << 20,
        ce_from=128 << 20,
        launch_source=_H200_TUNE,
        launches={
            ("all_gather", 64 << 10): (2, 4),
            ("all_gather", 1 << 20): (4, 4),
            ("two_shot_ce", 64 << 10): (2, 8),
            ("two_shot_in_place", 1 << 20): (2, 4),
        },
    ),
    (H200, 4): ChooserTable(
        gpu=H200,
        world_size=4,
        source="reference/h200x4/collectives.json",
        one_shot_up_to=256 << 10,
        fid_out_of_place=64 << 10,
        fid_in_place=64 << 10,
        ce_from=32 << 20,
        launch_source=_H200_TUNE,
        launches={
            ("all_gather", 64 << 10): (4, 4),
            ("all_gather", 1 << 20): (4, 8),
            ("one_shot", 64 << 10): (2, 16),
            ("one_shot", 1 << 20): (4, 4),
            ("reduce_scatter", 64 << 10): (2, 8),
            ("reduce_scatter", 1 << 20): (2, 8),
            ("reduce_scatter", 16 << 20): (2, 4),
            ("two_shot", 64 << 10): (4, 8),
            ("two_shot", 1 << 20): (4, 4),
            ("two_shot", 16 << 20): (4, 4),
            ("two_shot_ce", 64 << 10): (1, 4),
            ("two_shot_in_place", 64 << 10): (1, 4),
            ("two_shot_in_place", 1 << 20): (2, 4),
            ("two_shot_in_place", 16 << 20): (2, 4),
        },
    ),
}

#: The H200 tables' launches as (kernel, world size, searched size) -> (vectors, num_warps): the
#: shape ``launch_table_from`` reads off the search (what the lab's figures and docs show).
LAUNCH_TABLE = {
    (kernel, w, size): launch
    for (gpu, w), table in TABLES.items()
    if gpu == H200
    for (kernel, size), launch in table.launches.items()
}
#: The H200 tables' ``ce_from`` by world size (what the lab's figures and docs show).
CE_FROM_BYTES = {w: t.ce_from for (gpu, w), t in TABLES.items() if gpu == H200 and t.ce_from is not None}


@functools.cache
def defaults(gpu: str, world_size: int) -> ChooserTable:
    """The table of a GPU and world size that nothing was recorded on."""
    return ChooserTable(
        gpu=gpu,
        world_size=world_size,
        source=None,
        one_shot_up_to=DEFAULT_CROSSOVER_BYTES.get(world_size, DEFAULT_CROSSOVER_ABOVE_2),
    )


def table_for(gpu: str, world_size: int) -> ChooserTable:
    """``TABLES``' table for ``gpu`` (the name it reports) and ``world_size``, else ``defaults``."""
    if not isinstance(gpu, str):
        raise TypeError(f"gpu: expected the name a GPU reports (a str), got {type(gpu).__name__}")
    if not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size: expected a positive int, got {world_size!r}")
    table = TABLES.get((gpu, world_size))
    return table if table is not None else defaults(gpu, world_size)


@functools.cache
def _device_name(index: int) -> str:
    return torch.cuda.get_device_name(index).strip()


def gpu_name(device: torch.device) -> str:
    """The GPU whose tables a buffer on ``device`` chooses with: the name a CUDA device reports,
    ``INTERPRETER_GPU`` for any other device (the interpreter's)."""
    if device.type != "cuda":
        return INTERPRETER_GPU
    return _device_name(device.index if device.index is not None else torch.cuda.current_device())


def this_gpu() -> str:
    """The GPU a choice without a buffer is for: the current CUDA device's, or the interpreter's."""
    if tier.interpreted() or not torch.cuda.is_available():
        return INTERPRETER_GPU
    return _device_name(torch.cuda.current_device())


def measured_crossovers(gpu: str | None = None) -> dict:
    """World size -> bytes up to which one-shot is chosen, from ``gpu``'s recorded tables
    (default: ``this_gpu()``; a GPU without one: {})."""
    gpu = this_gpu() if gpu is None else gpu
    return {w: t.one_shot_up_to for (g, w), t in TABLES.items() if g == gpu and t.source is not None}


def measured_fid_limits(gpu: str | None = None) -> dict:
    """(world size, in place) -> the flag-in-data limits of ``gpu``'s recorded tables (default:
    ``this_gpu()``), the keys without a limit left out."""
    gpu = this_gpu() if gpu is None else gpu
    return {
        (w, in_place): t.fid_up_to(in_place)
        for (g, w), t in TABLES.items()
        if g == gpu
        for in_place in (False, True)
        if t.fid_up_to(in_place) is not None
    }


# --- what the tables are read off (the tests apply these to the recordings) ----------------------


def crossovers_from(records: list[dict]) -> dict:
    """World size -> bytes up to which one-shot is chosen: a file's ``crossover`` records under
    CUDA-graph timing (the kernels' own speed; bytes None: one-shot at every size, ``ALWAYS``)."""
    return {
        r["world_size"]: ALWAYS if r["bytes"] is None else r["bytes"]
        for r in records
        if r.get("kind") == "crossover" and r.get("timing") == "graph_us"
    }


def fid_limits_from(records: list[dict]) -> dict:
    """(world size, in place) -> the largest message size (bytes) up to which the recorded
    flag-in-data one-shot beat what ``auto`` runs without an inbox, at every recorded size from
    the smallest: ``FID_COMPARED``'s two impls, kind "push", timing "graph" (the kernels' own
    time, as the crossover's), field "us" (median of the same interleaved rounds), correct
    records only. The first recorded size at which flag-in-data is not faster ends the run; a
    world size (or in/out of place) whose smallest size it loses, or without both impls, has no
    entry. No size between two recorded ones is guessed: the limit is a recorded size."""
    times: dict = {}
    for r in records:
        if r.get("kind") == "push" and r.get("timing") == "graph" and r.get("correct") and r.get("us"):
            times.setdefault((r["world_size"], r["impl"]), {})[r["bytes"]] = r["us"]
    table = {}
    for w in sorted({w for w, _ in times}):
        for in_place, (fid_impl, other_impl) in FID_COMPARED.items():
            fid, other = times.get((w, fid_impl), {}), times.get((w, other_impl), {})
            limit = None
            for b in sorted(set(fid) & set(other)):
                if not fid[b] < other[b]:
                    break
                limit = b
            if limit is not None:
                table[(w, in_place)] = limit
    return table


def ce_from_bytes_from(records: list[dict]) -> dict:
    """World size -> the size from which the in-place ``auto`` takes ``two_shot_ce``: the geometric
    middle between the largest swept size at which it is slower than the pushed in-place two-shot
    under graph replay (``CE_COMPARED``, kind "sweep", field "graph_us") and the next, from which
    it is faster at every size (the smallest size where it wins everywhere). Small messages lose:
    the barrier kernel and the copy launches cost more than the copy engines save. A world size
    where it never wins for good has no entry."""
    times: dict = {}
    for r in records:
        if r.get("kind") == "sweep" and r.get("impl") in CE_COMPARED and r.get("graph_us"):
            times.setdefault((r["world_size"], r["impl"]), {})[r["bytes"]] = r["graph_us"]
    table = {}
    for w in sorted({w for w, _ in times}):
        ce, pushed = times.get((w, CE_COMPARED[0]), {}), times.get((w, CE_COMPARED[1]), {})
        sizes = sorted(set(ce) & set(pushed))
        wins = [ce[b] < pushed[b] for b in sizes]
        first = next((i for i in range(len(sizes)) if all(wins[i:])), None)
        if first is not None:
            table[w] = math.isqrt(sizes[first - 1] * sizes[first]) if first else sizes[0]
    return table
