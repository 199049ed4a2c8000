"""The collectives' choices: which algorithm ``auto`` runs and how a kernel is launched, from the
chooser tables (``tables``) of the buffer's GPU and world size, and every launch a call makes,
as ``plan.KernelLaunch`` / ``plan.CopySteps`` steps.

* ``LaunchConfig``, ``default_config``: the launch (vectors, warps, programs) where the caller
  names none: the table's entry for the kernel and size, else the rule (``rule_config``);
* ``choose``, ``choose_in_place``, ``auto_choice``, ``auto_algorithm``: ``algorithm="auto"``;
* ``choose_all_reduce``: an all-reduce's algorithm, launch and steps for a checked buffer;
  ``shard_steps``: a reduce-scatter's or all-gather's; ``two_shot_ce_steps``: the in-place
  two-shot whose first shot the copy engines do (``into`` aims its stores elsewhere).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from labkit.kernels.comm import flag_in_data, one_shot, plan, tables, tree, two_shot
from labkit.kernels.comm.checks import (
    ALGORITHMS,
    IN_PLACE_ALGORITHMS,
    INBOX_ALGORITHMS,
    BarrierSemantics,
    barrier_semantics,
)
from labkit.kernels.comm.signals import barrier_kernel
from labkit.kernels.comm.symm import WORKSPACE_UNIT, SymmBuffer
from labkit.kernels.comm.tables import DEFAULT_CROSSOVER_ABOVE_2, TUNED_BYTES, ChooserTable
from labkit.workbench import tier
from labkit.workbench.errors import UsageError


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
    * ``vectors`` and ``num_warps``: ``launch_for``: the entry for ``kernel`` and the nearest
      searched size (``tuned_size``) in the launches of the device's table (``tables.table_for``
      of its GPU and the world size) where it has one; else the rule (``rule_config``): 16 warps,
      ``vectors`` 1 below ``LARGE_BYTES``, where messages have few steps to spread over the
      programs; above, 8 / W (at least 1): each thread keeps about 8 independent 16-byte loads in
      flight however many peers a step reads (a one-shot or reduce-scatter step loads from W
      buffers), enough to cover an NVLink round trip, few enough not to run out of registers. The
      H200 tables' entries are at 4 ranks mostly, up to 16 MiB: fewer warps with wider vectors
      (measured there: up to 20% less time than the rule's launch).
    """
    if device.type != "cuda":
        return DEFAULT_CONFIG
    index = device.index if device.index is not None else torch.cuda.current_device()
    return _gpu_default(kernel, tuned_size(nbytes), world_size, index)


def launch_for(kernel: str | None, nbytes: int, world_size: int, gpu: str) -> tuple[int, int]:
    """(vectors, num_warps) of ``default_config`` for ``kernel`` and ``nbytes`` on ``gpu`` (the
    name it reports): its table's launch for the nearest searched size, else the rule's."""
    tuned = tuned_size(nbytes)
    return tables.table_for(gpu, world_size).launches.get((kernel, tuned), rule_config(tuned, world_size))


@functools.cache
def _gpu_default(kernel: str | None, tuned: int, world_size: int, index: int) -> LaunchConfig:
    """``default_config`` on GPUs, made once per (kernel, searched size, world, device): it runs on
    every call of every collective."""
    vectors, num_warps = launch_for(kernel, tuned, world_size, tables._device_name(index))
    return LaunchConfig(vectors=vectors, num_warps=num_warps, programs=_multiprocessors(index))


def resolve_config(
    config, nbytes: int, world_size: int, device: torch.device, kernel: str | None = None
) -> LaunchConfig:
    """``config``, checked, or ``default_config`` where it is None."""
    if config is None:
        return default_config(nbytes, world_size, device, kernel)
    if not isinstance(config, LaunchConfig):
        raise TypeError(f"config: expected a labkit.kernels.comm.collectives.LaunchConfig, got {type(config).__name__}")
    return config


def program_count(steps: int, buf: SymmBuffer, blocks: int | None, config: LaunchConfig, even: bool = False) -> int:
    """The programs of a launch over ``steps`` program steps: ``blocks`` (checked against the
    buffer's signal pad) or as many as useful up to ``config.programs``; even: the tree's."""
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


def choose(nbytes: int, world_size: int, crossovers: dict | None = None, *, gpu: str | None = None) -> str:
    """The all-reduce algorithm for a message size: one-shot (latency) up to the crossover for
    this world size, two-shot (bandwidth) above it. ``crossovers``: world size -> bytes (default:
    the ``one_shot_up_to`` of ``gpu``'s table, ``tables.this_gpu()`` where None; else 256 KiB)."""
    if crossovers is None:
        limit = tables.table_for(tables.this_gpu() if gpu is None else gpu, world_size).one_shot_up_to
    else:
        limit = crossovers.get(world_size, DEFAULT_CROSSOVER_ABOVE_2)
    return "one_shot" if nbytes <= limit else "two_shot"


def choose_in_place(nbytes: int, world_size: int, has_workspace: bool, *, gpu: str | None = None) -> str:
    """The in-place all-reduce for a message size: ``two_shot_ce`` for large messages when the
    buffer has a workspace and the table of ``gpu`` (``tables.this_gpu()`` where None) and the
    world size has a threshold (``ChooserTable.ce_from``), else two-shot with pushed shards."""
    limit = tables.table_for(tables.this_gpu() if gpu is None else gpu, world_size).ce_from
    return "two_shot_ce" if has_workspace and limit is not None and nbytes >= limit else "two_shot"


def auto_choice(
    nbytes: int,
    world_size: int,
    gpu: str,
    *,
    in_place: bool,
    inbox: bool = False,
    workspace: bool = False,
    launch_given: bool = False,
    variant: str = "correct",
) -> str:
    """``auto_algorithm`` for a message of ``nbytes`` on ``gpu`` (the name it reports), from what
    it needs to know of the buffer: whether it has an inbox, a workspace. No device is touched."""
    table = tables.table_for(gpu, world_size)
    if inbox and not launch_given and variant == "correct":
        limit = table.fid_up_to(in_place)
        if limit is not None and nbytes <= limit:
            return "flag_in_data"
    if in_place:
        return choose_in_place(nbytes, world_size, workspace, gpu=gpu)
    return choose(nbytes, world_size, gpu=gpu)


def auto_algorithm(buf: SymmBuffer, in_place: bool, *, launch_given: bool = False, variant: str = "correct") -> str:
    """What ``algorithm="auto"`` runs on a checked ``buf``: the whole rule, in one place, read
    from the table of the buffer's GPU and world size (``tables.table_for``; ``auto_choice``).

    1. The flag-in-data one-shot (``labkit.kernels.comm.flag_in_data``) when all of these hold:

       * ``buf`` has an inbox (``flag_in_data.attach``). Attaching one checked that it
         fits: the same dtype (bf16 and fp32 alike: the sentinel exists for 2- and 4-byte
         floats) and device, a capacity of at least the buffer's elements, the same world, and
         (made by ``flag_in_data.inbox``) at most one program per SM;
       * the caller fixed no launch (``blocks``, ``config``) and asked for the correct variant:
         flag-in-data's launch is its inbox's, and it has no broken variants;
       * the message is at most the table's ``fid_up_to(in_place)`` bytes: the largest size up
         to which the recorded comparison shows flag-in-data faster than what this rule would run
         otherwise (kind "push", timing "graph", impls ``tables.FID_COMPARED``, field "us"; see
         ``tables.fid_limits_from``). Why a recorded limit: the protocol has no barrier and no
         flag round trip, which wins while latency decides; it stores every element into W - 1
         inboxes and polls each, which loses to two-shot's reduce-scatter traffic once bandwidth
         decides. Where that turns depends on the links, so it is read from the recording, not
         guessed; a table without one (the defaults) never takes flag-in-data by itself
         (``algorithm="flag_in_data"`` still does).

    2. Otherwise, in place: ``choose_in_place`` (two-shot, or ``two_shot_ce`` for large messages
       on a buffer with a workspace); out of place: ``choose`` (one-shot up to the crossover,
       two-shot above)."""
    x = buf.tensor
    return auto_choice(
        x.numel() * x.element_size(),
        buf.world_size,
        tables.gpu_name(x.device),
        in_place=in_place,
        inbox=buf.inbox is not None,
        workspace=buf.workspace is not None,
        launch_given=launch_given,
        variant=variant,
    )


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
    table: ChooserTable | None = None  # the table ``auto`` and the default launch read (``tables.table_for``)


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
    table = tables.table_for(tables.gpu_name(x.device), buf.world_size)
    if algorithm == "flag_in_data":
        return AllReduceChoice(algorithm, None, _flag_in_data(buf, blocks, variant, config), table)
    launch = launch_common(buf, variant, algorithm, config, in_place)
    config, block, constexprs = launch.config, launch.block, launch.constexprs
    dev, OUT = x.device, plan.OUT
    if algorithm == "one_shot":
        p = program_count(triton.cdiv(n, block), buf, blocks, config)
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
        steps = two_shot_ce_steps(buf, n, launch, blocks)
    else:
        half = triton.cdiv(triton.cdiv(n, 2), block) * block
        p = program_count(2 * triton.cdiv(half, block), buf, blocks, config, even=True)
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
    return AllReduceChoice(algorithm, launch, steps, table)


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
    barriers = barrier_semantics(variant, algorithm)
    kernel = "two_shot_in_place" if algorithm == "two_shot" and in_place else algorithm
    config = resolve_config(config, x.numel() * x.element_size(), buf.world_size, x.device, kernel)
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


def two_shot_grid(buf: SymmBuffer, n: int, launch: CommonLaunch, blocks) -> tuple[int, int]:
    """(shard size in BLOCKs, programs) of a two-shot launch over ``n`` elements per rank: W
    shards of whole program steps (the last may be short), one program per step up to the launch's
    programs (or ``blocks``)."""
    shard_blocks = triton.cdiv(triton.cdiv(n, buf.world_size), launch.block)
    return shard_blocks, program_count(shard_blocks, buf, blocks, launch.config)


def two_shot_ce_steps(
    buf: SymmBuffer, n: int, launch: CommonLaunch, blocks, out_ptrs: torch.Tensor | None = None
) -> tuple:
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
    p = program_count(triton.cdiv(shard, launch.block), buf, blocks, launch.config)
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


def shard_steps(
    op: str, kernel, buf: SymmBuffer, shard: int, blocks, variant: str, config, extra: dict | None = None
) -> tuple:
    """Reduce-scatter and all-gather share a launch: ``shard`` elements per rank, start and end
    barriers, the same programs. The message size that picks the default launch (with ``op``, the
    table's kernel name) is W x shard (the reduce-scatter input, the all-gather output).
    ``extra``: more constexprs (the all-gather's naive order)."""
    x = buf.tensor
    barriers = barrier_semantics(variant, "shards")
    config = resolve_config(config, shard * buf.world_size * x.element_size(), buf.world_size, x.device, op)
    block = config.block(x.element_size())
    p = program_count(triton.cdiv(shard, block), buf, blocks, config)
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
