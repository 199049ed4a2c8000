"""labkit's collectives over symmetric memory: the public, checked, guarded entry points.

Usage on every rank (inside ``labkit.kernels.comm.ranks.run_ranks`` or torchrun):

    buf = symm.empty(n, torch.bfloat16)       # collective: same n and dtype everywhere
    buf.tensor.copy_(x)                       # this rank's input, written in stream order
    y = collectives.all_reduce(buf)           # y = sum over ranks, on every rank

The input lives in the symmetric buffer (the kernels read peers' buffers directly); outputs are
ordinary local tensors. Accumulation is fp32 whatever the dtype. Every launch runs on the
buffer's device and its current stream.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from labkit.kernels.comm import flag_in_data, inbox_call, one_shot, plan, scatter_gather, tree, two_shot
from labkit.kernels.comm.signals import SEM_ACQ_REL, SEM_GPU_SCOPE, SEM_RELAXED, barrier_kernel
from labkit.kernels.comm.symm import WORKSPACE_UNIT, SymmBuffer, check_buffer
from labkit.kernels.launch_helpers import overlaps
from labkit.workbench import tier
from labkit.workbench.errors import UsageError
from labkit.workbench.guard import on_device_of

ALGORITHMS = ("one_shot", "two_shot", "tree")
#: what ``all_reduce(buf, buf.tensor)`` (in place) can run: two-shot with the reduced shards
#: pushed; "two_shot_ce" also has the copy engines do the first shot (needs ``buf.workspace``)
IN_PLACE_ALGORITHMS = ("two_shot", "two_shot_ce")
#: what a buffer with a flag-in-data inbox (``flag_in_data.attach``) can also run, in
#: place or not: the flag-in-data one-shot (``labkit.kernels.comm.flag_in_data``)
INBOX_ALGORITHMS = ("flag_in_data",)
#: deliberately broken variants, for the lab: (what changes, which algorithms have it)
VARIANTS = {
    "correct": "the kernels as they should be",
    "relaxed": "barrier atomics relaxed instead of release/acquire: time is synchronised, memory is not",
    "no_end_barrier": "no barrier at the end: a fast rank's next input overwrites a buffer a peer still reads",
    "unguarded_leaf": "tree only: a leaf reads its missing child through pointer-table entry -1",
    "gpu_scope": "barrier atomics release/acquire at gpu scope instead of sys: ordering promised within one GPU only",
}
#: the orders in which ``all_gather`` reads the shards (correct either way; they differ in which
#: GPU's links are busy at once)
ALL_GATHER_ORDERS = {
    "rotated": "rank r reads r, r+1, ... (mod W): at every step each GPU is read by one peer (the default)",
    "naive": "every rank reads 0, 1, ...: at step k all ranks read rank k's shard at once",
}
#: Until a crossover is measured for a world size (``labkit bench collectives`` records it in
#: reference/<machine>/collectives.json): with 2 ranks one-shot and two-shot read the same N
#: bytes per rank and one-shot has one barrier fewer, so one-shot always; with more ranks,
#: one-shot reads (W-1)N against two-shot's 2(W-1)N/W, so two-shot above a size this default
#: guesses (256 KiB) and a measurement replaces.
ALWAYS = float("inf")
DEFAULT_CROSSOVER_BYTES = {2: ALWAYS}
DEFAULT_CROSSOVER_ABOVE_2 = 256 << 10


@dataclass(frozen=True, kw_only=True)
class LaunchConfig:
    """How a collective's kernel is launched on GPUs (the interpreter ignores it: there, a step
    costs about a millisecond whatever its size, so it takes 4096-element steps).

    vectors:   16-byte vectors each thread moves per program step. A remote load waits a
               round trip over NVLink (microseconds); more independent loads per thread keep
               more bytes in flight per SM, which is what bandwidth over a long link needs.
    num_warps: warps per program.
    programs:  most programs per launch (also capped by the buffer's signal-pad rows); fewer
               when the message has fewer steps.
    """

    vectors: int = 1
    num_warps: int = 8
    programs: int = 128

    def __post_init__(self):
        for name, allowed in (("vectors", (1, 2, 4, 8)), ("num_warps", (1, 2, 4, 8, 16, 32))):
            if getattr(self, name) not in allowed:
                raise ValueError(f"config.{name}: expected one of {allowed}, got {getattr(self, name)!r}")
        if not isinstance(self.programs, int) or self.programs < 1:
            raise ValueError(f"config.programs: expected a positive int, got {self.programs!r}")

    def block(self, elem_size: int) -> int:
        """Elements per program step."""
        return 4096 if tier.interpreted() else self.vectors * (16 // elem_size) * 32 * self.num_warps


#: Messages from this size on take the bandwidth launch of ``default_config``.
LARGE_BYTES = 4 << 20
#: The launch when nothing is known about the device (the CPU tier, where it is ignored).
DEFAULT_CONFIG = LaunchConfig()
#: The message sizes ``labkit bench collectives_tune`` searched (bytes per rank). A message takes
#: the launch found for the nearest of them on a log scale (``tuned_size``); the boundaries fall
#: at 4x each size, so ``LARGE_BYTES`` is the boundary between 1 MiB and 16 MiB.
TUNED_BYTES = (64 << 10, 1 << 20, 16 << 20, 256 << 20)
#: A table entry replaces the rule's launch only where the search timed it at least this much
#: faster: closer than that is within what one search's timings move between runs.
TABLE_MARGIN = 0.03
#: (kernel, world size, tuned size) -> (vectors, num_warps): where one launch with one program
#: per SM beat ``rule_config``'s by more than ``TABLE_MARGIN`` in the recorded search
#: (reference/h200x4/collectives_tune.json, kind "tune", graph replays; W=2 on two of its GPUs).
#: Kernels: "one_shot", "two_shot" (out of place), "two_shot_in_place", "two_shot_ce",
#: "reduce_scatter", "all_gather"; the search leaves out the tree. ``labkit.labs.collectives.bench.
#: launch_table_from`` reads the table off the file; tests/test_chooser_tables.py holds them equal.
LAUNCH_TABLE = {
    ("all_gather", 2, 64 << 10): (2, 4),
    ("all_gather", 2, 1 << 20): (4, 4),
    ("all_gather", 4, 64 << 10): (4, 4),
    ("all_gather", 4, 1 << 20): (4, 8),
    ("one_shot", 4, 64 << 10): (2, 16),
    ("one_shot", 4, 1 << 20): (4, 4),
    ("reduce_scatter", 4, 64 << 10): (2, 8),
    ("reduce_scatter", 4, 1 << 20): (2, 8),
    ("reduce_scatter", 4, 16 << 20): (2, 4),
    ("two_shot", 4, 64 << 10): (4, 8),
    ("two_shot", 4, 1 << 20): (4, 4),
    ("two_shot", 4, 16 << 20): (4, 4),
    ("two_shot_ce", 2, 64 << 10): (2, 8),
    ("two_shot_ce", 4, 64 << 10): (1, 4),
    ("two_shot_in_place", 2, 1 << 20): (2, 4),
    ("two_shot_in_place", 4, 64 << 10): (1, 4),
    ("two_shot_in_place", 4, 1 << 20): (2, 4),
    ("two_shot_in_place", 4, 16 << 20): (2, 4),
}


@functools.cache
def _multiprocessors(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def tuned_size(nbytes: int) -> int:
    """The searched size (``TUNED_BYTES``) nearest to ``nbytes`` on a log scale: messages below
    the smallest take its row (4 KiB included: below 64 KiB a message is one or two program steps
    whatever the launch)."""
    return next((t for t in TUNED_BYTES[:-1] if nbytes < 4 * t), TUNED_BYTES[-1])


def rule_config(nbytes: int, world_size: int) -> tuple[int, int]:
    """(vectors, num_warps) of the rule ``default_config`` starts from: 16 warps; ``vectors`` 1
    below ``LARGE_BYTES``, above it 8 / W (at least 1)."""
    if nbytes < LARGE_BYTES:
        return 1, 16
    return max(v for v in (1, 2, 4, 8) if v <= max(1, 8 // world_size)), 16


def default_config(nbytes: int, world_size: int, device: torch.device, kernel: str | None = None) -> LaunchConfig:
    """The launch a collective takes when the caller names none. Read off ``labkit bench
    collectives_tune`` (reference/h200x4/collectives_tune.json: every kernel, 2 and 4 ranks,
    64 KiB to 256 MiB, 36 launches each):

    * One program per SM (``programs``): all of them resident at once, so no program ever spins
      in a barrier waiting for a peer's program that has not been scheduled. (Two per SM won a few
      cases by at most 5%; not worth giving up that guarantee.)
    * ``vectors`` and ``num_warps``: ``LAUNCH_TABLE``'s entry for ``kernel``, the world size and
      the nearest searched size (``tuned_size``) where it has one; else the rule
      (``rule_config``): 16 warps, ``vectors`` 1 below ``LARGE_BYTES``, where messages have few
      steps to spread over the programs; above, 8 / W (at least 1): each thread keeps about 8
      independent 16-byte loads in flight however many peers a step reads (a one-shot or
      reduce-scatter step loads from W buffers), enough to cover an NVLink round trip, few enough
      not to run out of registers. The table's entries are at 4 ranks mostly, up to 16 MiB: fewer
      warps with wider vectors (measured there: up to 20% less time than the rule's launch).
    """
    if device.type != "cuda":
        return DEFAULT_CONFIG
    index = device.index if device.index is not None else torch.cuda.current_device()
    return _gpu_default(kernel, tuned_size(nbytes), world_size, index)


@functools.cache
def _gpu_default(kernel: str | None, tuned: int, world_size: int, index: int) -> LaunchConfig:
    """``default_config`` on GPUs, made once per (kernel, searched size, world, device): it runs on
    every call of every collective."""
    vectors, num_warps = LAUNCH_TABLE.get((kernel, world_size, tuned), rule_config(tuned, world_size))
    return LaunchConfig(vectors=vectors, num_warps=num_warps, programs=_multiprocessors(index))


def _config(config, nbytes: int, world_size: int, device: torch.device, kernel: str | None = None) -> LaunchConfig:
    if config is None:
        return default_config(nbytes, world_size, device, kernel)
    if not isinstance(config, LaunchConfig):
        raise TypeError(f"config: expected a labkit.kernels.comm.collectives.LaunchConfig, got {type(config).__name__}")
    return config


def _programs(steps: int, buf: SymmBuffer, blocks: int | None, config: LaunchConfig, even: bool = False) -> int:
    if blocks is not None:
        if not isinstance(blocks, int) or blocks < 1:
            raise ValueError(f"blocks: expected a positive int, got {blocks!r}")
        if blocks > buf.max_blocks:
            raise ValueError(
                f"blocks: {blocks} programs, but the signal pad of this buffer has rows "
                f"for {buf.max_blocks}; allocate with symm.empty(..., max_blocks={blocks})"
            )
        p = blocks
    else:
        cap = 4 if tier.interpreted() else min(buf.max_blocks, config.programs)
        p = max(1, min(cap, steps))
    if even:
        p = max(2, p - p % 2)
        if p > buf.max_blocks:
            raise ValueError(
                f"the tree needs an even number of programs, at least 2; this buffer allows {buf.max_blocks}"
            )
    return p


@dataclass(frozen=True, slots=True)
class BarrierSemantics:
    """What a variant (``VARIANTS``) makes of the kernels' barriers: their constexprs."""

    sem: int  # SEM: the barrier atomics' order and scope (signals.SEM_ACQ_REL, SEM_RELAXED, SEM_GPU_SCOPE)
    end_barrier: bool  # END_BARRIER: the kernels end with a barrier (False: "no_end_barrier")
    guard_leaf: bool  # GUARD_LEAF: the tree waits for a child before reading it (False: "unguarded_leaf")


#: variant -> its ``BarrierSemantics``, made once: looked up when a plan (or a ``barrier``) is made
_BARRIER_SEMANTICS = {
    variant: BarrierSemantics(
        sem={"relaxed": SEM_RELAXED, "gpu_scope": SEM_GPU_SCOPE}.get(variant, SEM_ACQ_REL),
        end_barrier=variant != "no_end_barrier",
        guard_leaf=variant != "unguarded_leaf",
    )
    for variant in VARIANTS
}


def _barrier_semantics(variant: str, algorithm: str) -> BarrierSemantics:
    """The barriers of ``variant``, checked: a variant ``algorithm`` has (errors name the argument)."""
    if variant not in VARIANTS:
        raise UsageError(f"variant: {variant!r} is not one of {list(VARIANTS)}")
    if variant == "unguarded_leaf" and algorithm != "tree":
        raise UsageError("variant 'unguarded_leaf' exists only for algorithm='tree'")
    return _BARRIER_SEMANTICS[variant]


def _is_in_place(out, buf: SymmBuffer) -> bool:
    """``out`` is this rank's symmetric buffer itself (same memory, shape and dtype)."""
    x = buf.tensor
    return (
        isinstance(out, torch.Tensor)
        and out.device == x.device
        and out.dtype == x.dtype
        and tuple(out.shape) == tuple(x.shape)
        and out.is_contiguous()
        and out.data_ptr() == x.data_ptr()
    )


def _out(name: str, out, shape: tuple, like: torch.Tensor, buf: SymmBuffer) -> torch.Tensor | None:
    """The output tensor, checked (None stays None: the launch makes one); it may not share
    memory with any rank's buffer: the kernels read those buffers while they write ``out`` (an
    output inside a peer's buffer, or inside this rank's, would be overwritten by, or overwrite,
    data still being read)."""
    if out is None:
        return None
    if not isinstance(out, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(out).__name__}")
    if out.device != like.device:
        raise ValueError(f"{name}: is on {out.device}; the buffer is on {like.device}")
    if out.dtype != like.dtype:
        raise TypeError(f"{name}: dtype {out.dtype} differs from the buffer's {like.dtype}")
    if tuple(out.shape) != tuple(shape):
        raise ValueError(f"{name}: shape {tuple(out.shape)}, expected {tuple(shape)}")
    if not out.is_contiguous():
        raise ValueError(f"{name}: must be contiguous")
    for r, peer in enumerate(buf.peers):
        if overlaps(out, peer):
            whose = "this rank's" if r == buf.rank else f"rank {r}'s"
            raise ValueError(
                f"{name}: shares memory with {whose} symmetric buffer, which the kernel reads while "
                "it writes out; pass a separate tensor"
                + (" (or, for all_reduce, out=buf.tensor itself: in place)" if r == buf.rank else "")
            )
    return out


@functools.lru_cache(maxsize=8)
def measured_crossovers(reference_dir=None) -> dict:
    """World size -> bytes up to which one-shot is chosen, from the committed reference sweeps
    (their ``crossover`` records, CUDA-graph timing: the kernels' own speed). Read once per
    process and cached: ``choose`` runs on every ``algorithm="auto"`` call, inside the latency
    it would otherwise add to. Callers must not modify the returned dict."""
    from labkit.workbench import results

    table = {}
    for rs in results.load_references("collectives", reference_dir).values():
        for r in rs.select(kind="crossover", timing="graph_us"):
            table[r["world_size"]] = ALWAYS if r["bytes"] is None else r["bytes"]
    return table


@functools.lru_cache(maxsize=1)
def _default_crossovers() -> dict:
    return {**DEFAULT_CROSSOVER_BYTES, **measured_crossovers()}


def choose(nbytes: int, world_size: int, crossovers: dict | None = None) -> str:
    """The all-reduce algorithm for a message size: one-shot (latency) up to the crossover for
    this world size, two-shot (bandwidth) above it. ``crossovers``: world size -> bytes (default:
    measured ones, else ``DEFAULT_CROSSOVER_BYTES``, else 256 KiB)."""
    if crossovers is None:
        crossovers = _default_crossovers()
    limit = crossovers.get(world_size, DEFAULT_CROSSOVER_ABOVE_2)
    return "one_shot" if nbytes <= limit else "two_shot"


#: World size -> message size from which the in-place ``auto`` takes ``two_shot_ce`` (when the
#: buffer has a workspace): the geometric middle between the largest sweep size at which
#: two_shot_ce is slower than the in-place two-shot under graph replay and the next, from which it
#: is faster at every size (reference/h<gpu>x<W>/collectives.json, kind 'sweep', impls
#: 'labkit_two_shot_ce_in_place' and 'labkit_two_shot_in_place', field 'graph_us';
#: tests/test_chooser_tables.py holds each entry against the files). Small messages lose: the
#: barrier kernel and the copy launches cost more than the copy engines save. A world size without
#: a recorded sweep takes two-shot.
CE_FROM_BYTES = {2: 128 << 20, 4: 32 << 20}


def choose_in_place(nbytes: int, world_size: int, has_workspace: bool) -> str:
    """The in-place all-reduce for a message size: ``two_shot_ce`` for large messages when the
    buffer has a workspace and the world size has a measured threshold (``CE_FROM_BYTES``),
    else two-shot with pushed shards."""
    limit = CE_FROM_BYTES.get(world_size)
    return "two_shot_ce" if has_workspace and limit is not None and nbytes >= limit else "two_shot"


#: (in place) -> (flag-in-data's impl, the impl of what ``auto`` runs on a buffer without an
#: inbox): the pair of records of the push comparison (reference/<machine>/collectives.json, kind
#: "push", timing "graph", field "us"; ``labkit.labs.collectives.push_bench``) that
#: ``fid_limits_from`` compares.
FID_COMPARED = {
    False: ("labkit_fid_one_shot", "labkit_all_reduce"),
    True: ("labkit_fid_one_shot_in_place", "labkit_all_reduce_in_place"),
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


@functools.lru_cache(maxsize=8)
def measured_fid_limits(reference_dir=None) -> dict:
    """``fid_limits_from`` over the committed reference files (reference/<machine>/collectives.json),
    the smallest limit where machines of one world size differ (flag-in-data only where every
    recording of that world size shows it faster). Read once per process and cached (``choose``'s
    reasons); callers must not modify the returned dict."""
    from labkit.workbench import results

    table: dict = {}
    for rs in results.load_references("collectives", reference_dir).values():
        for key, limit in fid_limits_from(rs.records).items():
            table[key] = min(limit, table.get(key, limit))
    return table


def auto_algorithm(buf: SymmBuffer, in_place: bool, *, launch_given: bool = False, variant: str = "correct") -> str:
    """What ``algorithm="auto"`` runs on a checked ``buf``: the whole rule, in one place.

    1. The flag-in-data one-shot (``labkit.kernels.comm.flag_in_data``) when all of these hold:

       * ``buf`` has an inbox (``flag_in_data.attach``). Attaching one checked that it
         fits: the same dtype (bf16 and fp32 alike: the sentinel exists for 2- and 4-byte
         floats) and device, a capacity of at least the buffer's elements, the same world, and
         (made by ``flag_in_data.inbox``) at most one program per SM;
       * the caller fixed no launch (``blocks``, ``config``) and asked for the correct variant:
         flag-in-data's launch is its inbox's, and it has no broken variants;
       * the message is at most ``measured_fid_limits()[(W, in_place)]`` bytes: the largest size
         up to which the recorded comparison shows flag-in-data faster than what this rule would
         run otherwise (reference/<machine>/collectives.json, kind "push", timing "graph", impls
         ``FID_COMPARED``, field "us"; see ``fid_limits_from``). Why a measured limit: the
         protocol has no barrier and no flag round trip, which wins while latency decides; it
         stores every element into W - 1 inboxes and polls each, which loses to two-shot's
         reduce-scatter traffic once bandwidth decides. Where that turns depends on the links,
         so it is read from the recording, not guessed; a world size without one never
         takes flag-in-data by itself (``algorithm="flag_in_data"`` still does).

    2. Otherwise, in place: ``choose_in_place`` (two-shot, or ``two_shot_ce`` for large messages
       on a buffer with a workspace); out of place: ``choose`` (one-shot up to the crossover,
       two-shot above)."""
    x = buf.tensor
    nbytes = x.numel() * x.element_size()
    w = buf.world_size
    if buf.inbox is not None and not launch_given and variant == "correct":
        limit = measured_fid_limits().get((w, in_place))
        if limit is not None and nbytes <= limit:
            return "flag_in_data"
    return choose_in_place(nbytes, w, buf.workspace is not None) if in_place else choose(nbytes, w)


def all_reduce(
    buf: SymmBuffer,
    out: torch.Tensor | None = None,
    *,
    algorithm: str = "auto",
    blocks: int | None = None,
    variant: str = "correct",
    config: LaunchConfig | None = None,
) -> torch.Tensor:
    """Sum of ``buf.tensor`` over all ranks, into ``out`` (made if None) on every rank.

    out=buf.tensor computes in place, as ``torch.distributed.all_reduce`` does: two-shot with
    the reduced shards pushed into every buffer (``two_shot_all_reduce_in_place_kernel``), or
    "two_shot_ce", whose first shot the copy engines do (buffers made with ``workspace=True``),
    or "flag_in_data"; one-shot or the tree is refused (they read every buffer to the end). Any
    other ``out`` must not share memory with a symmetric buffer (nor with an inbox).

    algorithm: "one_shot", "two_shot", "tree", "flag_in_data" (buffers given an inbox by ``flag_in_data.attach``:
    ``labkit.kernels.comm.flag_in_data``, no barrier, the data its own flag) or "auto"
    (``auto_algorithm``: the whole rule, with its reasons); blocks: programs to
    launch (default: as many as useful, up to ``config.programs`` and the buffer's signal pad);
    variant: "correct" or a broken one (``VARIANTS``), for the lab; config: ``LaunchConfig``
    (default: ``default_config`` for this size).

    Collective: every rank makes the same call (the same buffer, out in place or not, algorithm,
    blocks, variant and config): program b meets program b of every peer, so the kernels and grids
    must match. Checked when a plan is made, the first time the buffer sees these arguments
    (``plan.agree``: the ranks exchange what they are about to launch, once, over the default
    process group): ranks that differ all raise a UsageError naming the argument and each rank's
    value. Not checked, and still waiting until the world's timeout (``run_ranks``' timeout, the
    process group's under torchrun): a rank that never makes the call, and a rank whose arguments
    are new to the buffer while its peers repeat arguments the buffer already agreed on.

    The checks and choices of a call are made once per buffer and set of arguments and kept on the
    buffer as a plan (``labkit.kernels.comm.plan``; ``all_reduce_plan`` makes one to hold): the same
    ``check_all_reduce`` and ``choose_all_reduce`` as a held plan's, so both run the same algorithm
    and launch. A kept plan holds the algorithm "auto" resolved to when it was made: changing the
    chooser's tables afterwards (``CE_FROM_BYTES``, the crossovers) reaches a buffer's new plans,
    not the ones it keeps (``buf._plans.clear()`` drops those)."""
    key = None
    if type(buf) is SymmBuffer and plan.CACHE_PLANS and (out is None or isinstance(out, torch.Tensor)):
        key = ("all_reduce", plan.out_key(out), algorithm, blocks, variant, config)
        try:
            kept = plan.kept(buf, key)
        except TypeError:  # an unhashable argument: a plan for this call alone, whose checks name it
            key = None
        else:
            if kept is not None:
                return kept._launch(out)
    made = make_all_reduce_plan(buf, out, algorithm, blocks, variant, config, keep=False, fast=key is not None)
    if key is not None:
        plan.keep(buf, key, made)
    return made._launch(out)


@dataclass(frozen=True, slots=True)
class CheckedAllReduce:
    """``all_reduce``'s arguments after ``check_all_reduce``."""

    buf: SymmBuffer  # the symmetric buffer, checked
    out: torch.Tensor | None  # the output: checked, or None (a new tensor per launch), or buf.tensor in place
    in_place: bool  # out is buf.tensor: the sum replaces the input


def check_all_reduce(buf, out, algorithm: str) -> CheckedAllReduce:
    """The argument checks of ``all_reduce``. Errors name the argument."""
    buf = check_buffer("buf", buf)
    x = buf.tensor
    in_place = _is_in_place(out, buf)
    if algorithm == "flag_in_data" and buf.inbox is None:
        raise UsageError(
            "algorithm 'flag_in_data': buf has no flag-in-data inbox; give it one with "
            "flag_in_data.attach(buf) (or attach(buf, box) with a flag_in_data.inbox(...) of at least its size)"
        )
    if in_place:
        if algorithm in ("one_shot", "tree"):
            raise UsageError(
                f"out: is buf.tensor (in place), which algorithm={algorithm!r} cannot do: it reads "
                "every rank's whole buffer until its end barrier, so writing the sum there races with "
                "the peers' reads; use algorithm='two_shot', 'two_shot_ce' or 'auto', or pass "
                "another out"
            )
        if algorithm == "two_shot_ce" and buf.workspace is None:
            raise UsageError(
                "algorithm 'two_shot_ce': buf has no workspace for the copy engines to fill; allocate "
                "it with symm.empty(..., workspace=True)"
            )
    else:
        if algorithm == "two_shot_ce":
            raise UsageError("algorithm 'two_shot_ce' works in place only: pass out=buf.tensor")
        out = _out("out", out, tuple(x.shape), x, buf)
        if out is not None and buf.inbox is not None:  # the peers store into the inboxes during a call
            inbox_call.outside_inboxes("out", out, buf.inbox)
    return CheckedAllReduce(buf, out, in_place)


@dataclass(frozen=True, slots=True)
class CommonLaunch:
    """What every all-reduce launch on a buffer decides alike (``launch_common``)."""

    barriers: BarrierSemantics  # the variant's barriers
    config: LaunchConfig  # the launch configuration (``default_config`` where the caller gave none)
    block: int  # elements per program step (``config.block`` for the buffer's dtype)
    constexprs: dict  # what every kernel takes: WORLD, MAX_BLOCKS, BLOCK, SEM, END_BARRIER and num_warps


@dataclass(frozen=True, slots=True)
class AllReduceChoice:
    """``all_reduce``'s choices for a checked buffer (``choose_all_reduce``)."""

    algorithm: str  # what runs ("auto" resolved)
    launch: (
        CommonLaunch | None
    )  # its barriers, launch configuration, block and constexprs (None: flag_in_data's, fixed by its inbox)
    steps: tuple  # the launches in order: plan.KernelLaunch (grid, arguments, output as OUT), plan.CopySteps


def choose_all_reduce(
    buf: SymmBuffer,
    in_place: bool,
    algorithm: str = "auto",
    blocks: int | None = None,
    variant: str = "correct",
    config: LaunchConfig | None = None,
) -> AllReduceChoice:
    """The choices of ``all_reduce`` for a checked buffer: the algorithm ("auto" resolved), its
    launch configuration and grid, and every kernel argument, the output marked ``plan.OUT``."""
    x = buf.tensor
    n = x.numel()
    if algorithm == "auto":
        algorithm = auto_algorithm(
            buf, in_place, launch_given=blocks is not None or config is not None, variant=variant
        )
    if algorithm not in ALGORITHMS + IN_PLACE_ALGORITHMS + INBOX_ALGORITHMS:
        raise UsageError(
            f"algorithm: {algorithm!r} is not one of {ALGORITHMS + IN_PLACE_ALGORITHMS + INBOX_ALGORITHMS} or 'auto'"
        )
    if algorithm == "flag_in_data":
        return AllReduceChoice(algorithm, None, _flag_in_data(buf, blocks, variant, config))
    launch = launch_common(buf, variant, algorithm, config, in_place)
    config, block, constexprs = launch.config, launch.block, launch.constexprs
    dev, OUT = x.device, plan.OUT
    if algorithm == "one_shot":
        p = _programs(triton.cdiv(n, block), buf, blocks, config)
        steps = (
            plan.KernelLaunch(
                one_shot.one_shot_all_reduce_kernel,
                (p,),
                (buf.data_ptrs, buf.pad_ptrs, OUT, n, buf.rank),
                constexprs,
                dev,
            ),
        )
    elif algorithm == "two_shot":
        shard_blocks, p = two_shot_grid(buf, n, launch, blocks)
        kernel = two_shot.two_shot_all_reduce_in_place_kernel if in_place else two_shot.two_shot_all_reduce_kernel
        steps = (
            plan.KernelLaunch(
                kernel, (p,), (buf.data_ptrs, buf.pad_ptrs, OUT, n, shard_blocks, buf.rank), constexprs, dev
            ),
        )
    elif algorithm == "two_shot_ce":
        steps = _two_shot_ce(buf, n, launch, blocks)
    else:
        half = triton.cdiv(triton.cdiv(n, 2), block) * block
        p = _programs(2 * triton.cdiv(half, block), buf, blocks, config, even=True)
        links = tree.tree_links(buf.rank, buf.world_size)  # the kernel's six link arguments, in order
        steps = (
            plan.KernelLaunch(
                tree.tree_all_reduce_kernel,
                (p,),
                (buf.data_ptrs, buf.pad_ptrs, OUT, n, half, buf.rank, *links),
                dict(constexprs, GUARD_LEAF=launch.barriers.guard_leaf),
                dev,
            ),
        )
    return AllReduceChoice(algorithm, launch, steps)


def _flag_in_data(buf: SymmBuffer, blocks, variant: str, config) -> tuple:
    """The flag-in-data one-shot on ``buf``'s inbox (``labkit.kernels.comm.flag_in_data``): one
    kernel, which reads ``buf.tensor`` (this rank's input, local) and writes the output (which may
    be ``buf.tensor``: in place). Its launch is the inbox's, fixed when it was made (the protocol
    needs every call on an inbox to map elements to programs alike), so ``blocks`` and ``config``
    are refused, as is any variant but "correct" (the protocol has no broken variants here)."""
    if blocks is not None:
        raise UsageError(
            f"blocks: {blocks!r}, but algorithm 'flag_in_data' launches the programs its inbox was made with "
            f"({buf.inbox.programs}); pass blocks=None"
        )
    if config is not None:
        raise UsageError("config: algorithm 'flag_in_data' launches as its inbox was made; pass config=None")
    if variant != "correct":
        raise UsageError(f"variant: {variant!r}: algorithm 'flag_in_data' has only the 'correct' variant")
    box, x = buf.inbox, buf.tensor
    size = x.element_size()
    return (
        plan.KernelLaunch(
            flag_in_data.fid_one_shot_kernel,
            (box.programs,),
            (x, box.buf.data_ptrs, box.buf.pad_ptrs, plan.OUT, x.numel(), box.capacity, buf.rank),
            {
                "WORLD": buf.world_size,
                "MAX_BLOCKS": box.programs,
                "BLOCK": box.block,
                "BITS": tl.int16 if size == 2 else tl.int32,
                "SENTINEL": flag_in_data.SENTINEL_BITS[size],
                "num_warps": box.num_warps,
            },
            x.device,
        ),
    )


def launch_common(
    buf: SymmBuffer, variant: str, algorithm: str, config: LaunchConfig | None, in_place: bool = False
) -> CommonLaunch:
    """What every all-reduce launch on ``buf`` decides alike, from the variant and the launch
    configuration (default: for the buffer's size, the algorithm's kernel and the world size)."""
    x = buf.tensor
    barriers = _barrier_semantics(variant, algorithm)
    kernel = "two_shot_in_place" if algorithm == "two_shot" and in_place else algorithm
    config = _config(config, x.numel() * x.element_size(), buf.world_size, x.device, kernel)
    block = config.block(x.element_size())
    constexprs = {
        "WORLD": buf.world_size,
        "MAX_BLOCKS": buf.max_blocks,
        "BLOCK": block,
        "SEM": barriers.sem,
        "END_BARRIER": barriers.end_barrier,
        "num_warps": config.num_warps,
    }
    return CommonLaunch(barriers, config, block, constexprs)


def make_all_reduce_plan(
    buf,
    out=None,
    algorithm: str = "auto",
    blocks: int | None = None,
    variant: str = "correct",
    config: LaunchConfig | None = None,
    keep: bool = True,
    fast: bool = True,
) -> plan.CollectivePlan:
    """``check_all_reduce`` then ``choose_all_reduce``, as a plan (``all_reduce_plan``).
    keep=False: a plan for the buffer's own cache (holds the buffer weakly, and not ``out``);
    fast=False: a plan launched once, which prepares no compiled-launcher path."""
    checked = check_all_reduce(buf, out, algorithm)
    choice = choose_all_reduce(checked.buf, checked.in_place, algorithm, blocks, variant, config)
    made = plan.CollectivePlan(
        "all_reduce",
        checked.buf,
        choice.steps,
        algorithm=choice.algorithm,
        in_place=checked.in_place,
        out_shape=tuple(checked.buf.tensor.shape),
        out=checked.out if keep else None,
        checked_out=checked.out,
        keep_buffer=keep,
        fast=fast,
    )
    plan.agree(made, {"algorithm": algorithm, "blocks": blocks, "variant": variant, "config": config})
    return made


def two_shot_grid(buf: SymmBuffer, n: int, launch: CommonLaunch, blocks) -> tuple[int, int]:
    """(shard size in BLOCKs, programs) of a two-shot launch over ``n`` elements per rank: W
    shards of whole program steps (the last may be short), one program per step up to the launch's
    programs (or ``blocks``)."""
    shard_blocks = triton.cdiv(triton.cdiv(n, buf.world_size), launch.block)
    return shard_blocks, _programs(shard_blocks, buf, blocks, launch.config)


def _two_shot_ce(buf: SymmBuffer, n: int, launch: CommonLaunch, blocks, out_ptrs: torch.Tensor | None = None) -> tuple:
    """In-place two-shot whose first shot is done by ``cudaMemcpyAsync`` (``Tensor.copy_``
    between this rank's buffer and a peer's workspace: the copy engines, which ``labkit bench
    links`` measured moving more GB/s over NVLink than SM loads or stores). The steps:

    1. a one-program barrier: every peer has finished its previous call, so nobody still reads
       the workspace slot this rank is about to overwrite;
    2. for each peer s: shard s of this rank's input -> slot r of rank s's workspace;
    3. ``two_shot.two_shot_ce_kernel``: reduce shard r from local memory only, push the sum into
       every buffer (``out_ptrs``: into every rank's symmetric output instead, out of place:
       ``labkit.kernels.comm.into``)."""
    ws, r, w = buf.workspace, buf.rank, buf.world_size
    shard = buf.workspace_shard
    flat = buf.tensor.view(-1)
    dev = buf.tensor.device
    barrier = plan.KernelLaunch(
        barrier_kernel,
        (1,),
        (buf.pad_ptrs, r),
        {"WORLD": w, "MAX_BLOCKS": buf.max_blocks, "SEM": launch.barriers.sem},
        dev,
    )
    copies = []
    for k in range(1, w):  # each rank starts at a different peer, as the kernels do
        s = (r + k) % w
        length = max(0, min(shard, n - s * shard))
        if length:
            copies.append((ws.peers[s][r * shard : r * shard + length], flat[s * shard : s * shard + length]))
    p = _programs(triton.cdiv(shard, launch.block), buf, blocks, launch.config)
    reduce = plan.KernelLaunch(
        two_shot.two_shot_ce_kernel,
        (p,),
        (
            buf.data_ptrs,
            buf.pad_ptrs,
            buf.data_ptrs if out_ptrs is None else out_ptrs,
            buf.tensor,
            ws.tensor,
            n,
            shard // WORKSPACE_UNIT,
            r,
        ),
        dict(launch.constexprs, UNIT=WORKSPACE_UNIT),
        dev,
    )
    return barrier, plan.CopySteps(copies), reduce


def _shard_steps(
    op: str, kernel, buf: SymmBuffer, shard: int, blocks, variant: str, config, extra: dict | None = None
) -> tuple:
    """Reduce-scatter and all-gather share a launch: ``shard`` elements per rank, start and end
    barriers, the same programs. The message size that picks the default launch (with ``op``, the
    table's kernel name) is W x shard (the reduce-scatter input, the all-gather output).
    ``extra``: more constexprs (the all-gather's naive order)."""
    x = buf.tensor
    barriers = _barrier_semantics(variant, "shards")
    config = _config(config, shard * buf.world_size * x.element_size(), buf.world_size, x.device, op)
    block = config.block(x.element_size())
    p = _programs(triton.cdiv(shard, block), buf, blocks, config)
    return (
        plan.KernelLaunch(
            kernel,
            (p,),
            (buf.data_ptrs, buf.pad_ptrs, plan.OUT, shard, buf.rank),
            {
                "WORLD": buf.world_size,
                "MAX_BLOCKS": buf.max_blocks,
                "BLOCK": block,
                "SEM": barriers.sem,
                "END_BARRIER": barriers.end_barrier,
                "num_warps": config.num_warps,
                **(extra or {}),
            },
            x.device,
        ),
    )


def reduce_scatter(
    buf: SymmBuffer,
    out: torch.Tensor | None = None,
    *,
    blocks: int | None = None,
    variant: str = "correct",
    config: LaunchConfig | None = None,
) -> torch.Tensor:
    """Rank r gets the sum over ranks of shard r of ``buf.tensor`` (W equal shards of dim 0).
    Checks and choices are kept on the buffer as a plan, as ``all_reduce``'s are; collective, and
    the ranks' agreement checked as for ``all_reduce``."""
    return _shards_call("reduce_scatter", buf, out, blocks, variant, config)


def all_gather(
    buf: SymmBuffer,
    out: torch.Tensor | None = None,
    *,
    blocks: int | None = None,
    variant: str = "correct",
    config: LaunchConfig | None = None,
    order: str = "rotated",
) -> torch.Tensor:
    """Every rank gets all ranks' ``buf.tensor`` concatenated along dim 0.
    order: which shard each rank reads first (``ALL_GATHER_ORDERS``); the same result either way.
    Checks and choices are kept on the buffer as a plan, as ``all_reduce``'s are; collective, and
    the ranks' agreement (order included) checked as for ``all_reduce``."""
    return _shards_call("all_gather", buf, out, blocks, variant, config, order)


def _shards_call(op: str, buf, out, blocks, variant, config, order: str = "rotated") -> torch.Tensor:
    """``op`` through the plan kept on the buffer (or a throw-away plan when plans are off)."""
    key = None
    if type(buf) is SymmBuffer and plan.CACHE_PLANS and (out is None or isinstance(out, torch.Tensor)):
        key = (op, plan.out_key(out), blocks, variant, config, order)
        try:
            kept = plan.kept(buf, key)
        except TypeError:  # an unhashable argument: a plan for this call alone, whose checks name it
            key = None
        else:
            if kept is not None:
                return kept._launch(out)
    made = make_shards_plan(op, buf, out, blocks, variant, config, keep=False, fast=key is not None, order=order)
    if key is not None:
        plan.keep(buf, key, made)
    return made._launch(out)


@dataclass(frozen=True, slots=True)
class CheckedShards:
    """``reduce_scatter``'s or ``all_gather``'s arguments after ``check_shards``."""

    buf: SymmBuffer  # the symmetric buffer, checked
    out: torch.Tensor | None  # the output, checked, or None (a new tensor per launch)
    out_shape: tuple  # the output's shape: one shard (reduce-scatter), or W of them (all-gather)


def check_shards(op: str, buf, out) -> CheckedShards:
    """The argument checks of ``reduce_scatter`` / ``all_gather``. Errors name the argument."""
    buf = check_buffer("buf", buf)
    x = buf.tensor
    w = buf.world_size
    if op == "reduce_scatter":
        if x.shape[0] % w:
            raise ValueError(
                f"buf: dim 0 of shape {tuple(x.shape)} does not split into {w} equal shards "
                f"({x.shape[0]} % {w} = {x.shape[0] % w})"
            )
        shape = (x.shape[0] // w,) + tuple(x.shape[1:])
    else:
        shape = (x.shape[0] * w,) + tuple(x.shape[1:])
    return CheckedShards(buf, _out("out", out, shape, x, buf), shape)


def make_shards_plan(
    op: str,
    buf,
    out=None,
    blocks: int | None = None,
    variant: str = "correct",
    config: LaunchConfig | None = None,
    keep: bool = True,
    fast: bool = True,
    order: str = "rotated",
) -> plan.CollectivePlan:
    """``reduce_scatter``'s or ``all_gather``'s checks and choices, as a plan (``reduce_scatter_plan``,
    ``all_gather_plan``); keep and fast as for ``make_all_reduce_plan``; order: the all-gather's
    (``ALL_GATHER_ORDERS``; the reduce-scatter has only "rotated")."""
    if op not in ("reduce_scatter", "all_gather"):
        raise UsageError(f"op: {op!r} is not 'reduce_scatter' or 'all_gather'")
    if not isinstance(order, str) or order not in ALL_GATHER_ORDERS:
        raise UsageError(f"order: {order!r} is not one of {list(ALL_GATHER_ORDERS)}")
    if op == "reduce_scatter" and order != "rotated":
        raise UsageError(
            f"order: {order!r} exists only for the all-gather; the reduce-scatter reads every peer at once"
        )
    checked = check_shards(op, buf, out)
    buf = checked.buf
    x = buf.tensor
    if op == "reduce_scatter":
        steps = _shard_steps(
            op, scatter_gather.reduce_scatter_kernel, buf, x.numel() // buf.world_size, blocks, variant, config
        )
    else:
        steps = _shard_steps(
            op,
            scatter_gather.all_gather_kernel,
            buf,
            x.numel(),
            blocks,
            variant,
            config,
            {"ROTATE": False} if order == "naive" else None,
        )
    made = plan.CollectivePlan(
        op,
        buf,
        steps,
        algorithm="direct",
        in_place=False,
        out_shape=checked.out_shape,
        out=checked.out if keep else None,
        checked_out=checked.out,
        keep_buffer=keep,
        fast=fast,
    )
    plan.agree(made, {"blocks": blocks, "variant": variant, "config": config, "order": order})
    return made


def all_reduce_plan(
    buf,
    out: torch.Tensor | None = None,
    *,
    algorithm: str = "auto",
    blocks: int | None = None,
    variant: str = "correct",
    config: LaunchConfig | None = None,
) -> plan.CollectivePlan:
    """A plan for ``all_reduce(buf, out, ...)`` (same arguments, same checks, made now);
    ``plan()`` launches it. out=None: each call returns a new tensor; out=buf.tensor: in place.
    Every rank makes the same plan and calls it the same number of times (the barriers pair
    program b of every rank's launch); making it checks the ranks agree, as ``all_reduce`` does
    (collective when the buffer has not seen these arguments). The plan keeps ``buf`` alive."""
    return make_all_reduce_plan(buf, out, algorithm, blocks, variant, config)


def reduce_scatter_plan(
    buf,
    out: torch.Tensor | None = None,
    *,
    blocks: int | None = None,
    variant: str = "correct",
    config: LaunchConfig | None = None,
) -> plan.CollectivePlan:
    """A plan for ``reduce_scatter(buf, out, ...)``; as ``all_reduce_plan``."""
    return make_shards_plan("reduce_scatter", buf, out, blocks, variant, config)


def all_gather_plan(
    buf,
    out: torch.Tensor | None = None,
    *,
    blocks: int | None = None,
    variant: str = "correct",
    config: LaunchConfig | None = None,
    order: str = "rotated",
) -> plan.CollectivePlan:
    """A plan for ``all_gather(buf, out, ...)``; as ``all_reduce_plan``."""
    return make_shards_plan("all_gather", buf, out, blocks, variant, config, order=order)


def barrier(buf: SymmBuffer, blocks: int = 1, variant: str = "correct") -> None:
    """Only the block barrier, ``blocks`` programs: tests check it leaves every pad at zero."""
    buf = check_buffer("buf", buf)
    barriers = _barrier_semantics(variant, "barrier")
    p = _programs(blocks, buf, blocks, DEFAULT_CONFIG)
    with on_device_of(buf=buf.tensor):
        barrier_kernel[(p,)](buf.pad_ptrs, buf.rank, WORLD=buf.world_size, MAX_BLOCKS=buf.max_blocks, SEM=barriers.sem)


def graph_target(collective, *args, **kwargs) -> tuple:
    """What ``Graphed`` captures for ``collective(*args, **kwargs)``: (a callable of no
    arguments, the plan it launches or None). A plan is captured as it is; ``all_reduce``,
    ``reduce_scatter`` and ``all_gather`` become the plan of the same arguments (``all_reduce_plan``
    etc.: the same checks, the same chooser, so the graph runs the algorithm and launch the eager
    call would); any other callable is called with its arguments."""
    if isinstance(collective, plan.CollectivePlan):
        if args or kwargs:
            raise TypeError("Graphed(plan): a plan takes no arguments (they were fixed when it was made)")
        return collective, collective
    makers = {
        all_reduce: make_all_reduce_plan,
        reduce_scatter: functools.partial(make_shards_plan, "reduce_scatter"),
        all_gather: functools.partial(make_shards_plan, "all_gather"),
    }
    if collective in makers:
        made = _plan_from_call(makers[collective], collective, args, kwargs)
        return made, made
    return functools.partial(collective, *args, **kwargs), None


def _plan_from_call(make, collective, args: tuple, kwargs: dict) -> plan.CollectivePlan:
    """``make`` (``make_all_reduce_plan`` or ``make_shards_plan``) with the arguments of a call of
    ``collective``, bound by its own signature (so a wrong argument fails as the call would)."""
    import inspect

    bound = inspect.signature(collective).bind(*args, **kwargs)
    bound.apply_defaults()
    return make(**bound.arguments)


class Graphed:
    """One call of a labkit collective captured in a CUDA graph, replayed on demand.

    A Python-level call pays for the argument checks, the device guard and Triton's launcher
    (tens of µs without a plan, a few with one: ``labkit.labs.collectives.host_cost``); a replay
    pays one graph launch. What is captured is a plan (``graph_target``): ``Graphed(all_reduce,
    buf, out, ...)`` makes the plan of those arguments, the one the eager call would keep on its
    buffer (same algorithm, same launch), and ``Graphed(p)`` captures a plan made by the caller.
    The captured call keeps its buffer, output and pointers: write new inputs into ``buf.tensor``
    and call again. Legal because the kernels leave the signal pads as they found them (zero).

        ar = Graphed(all_reduce, buf, out, algorithm="one_shot")
        buf.tensor.copy_(x); y = ar()

    ``plan``: the plan captured (None for another callable); ``out``: what the captured call returned.
    """

    def __init__(self, collective, *args, **kwargs):
        import torch

        target, self.plan = graph_target(collective, *args, **kwargs)
        self.stream = torch.cuda.Stream()
        self.stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(self.stream):
            target()  # compile, arm the plan's fast launch and warm up, outside the capture
            self.graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self.graph, stream=self.stream):
                self.out = target()
        torch.cuda.current_stream().wait_stream(self.stream)

    def __call__(self):
        self.graph.replay()
        return self.out
