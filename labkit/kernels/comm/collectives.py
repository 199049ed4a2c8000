"""labkit's collectives over symmetric memory: the public, checked, guarded entry points.

Usage on every rank (inside ``labkit.kernels.comm.ranks.run_ranks`` or torchrun):

    buf = symm.empty(n, torch.bfloat16)       # collective: same n and dtype everywhere
    buf.tensor.copy_(x)                       # this rank's input, written in stream order
    y = collectives.all_reduce(buf)           # y = sum over ranks, on every rank

The input lives in the symmetric buffer (the kernels read peers' buffers directly); outputs are
ordinary local tensors. Accumulation is fp32 whatever the dtype. Every launch runs on the
buffer's device and its current stream.

The calls are made of four parts, each a module of its own, whose names this module also
exports: ``checks`` (the arguments a call accepts, errors naming them), ``chooser`` (the
algorithm ``auto`` runs and the launches), ``tables`` (what the chooser reads, typed, by GPU and
world size) and ``plans`` (a call's checks and choices made once and kept on its buffer).
"""

from __future__ import annotations

import functools

import torch

from labkit.kernels.comm import plan
from labkit.kernels.comm.checks import (
    ALGORITHMS,
    ALL_GATHER_ORDERS,
    IN_PLACE_ALGORITHMS,
    INBOX_ALGORITHMS,
    VARIANTS,
    BarrierSemantics,
    CheckedAllReduce,
    CheckedShards,
    barrier_semantics,
    check_all_reduce,
    check_out,
    check_shards,
)
from labkit.kernels.comm.chooser import (
    DEFAULT_CONFIG,
    LARGE_BYTES,
    AllReduceChoice,
    CommonLaunch,
    LaunchConfig,
    auto_algorithm,
    auto_choice,
    choose,
    choose_all_reduce,
    choose_in_place,
    default_config,
    launch_common,
    launch_for,
    program_count,
    resolve_config,
    rule_config,
    tuned_size,
    two_shot_ce_steps,
    two_shot_grid,
)
from labkit.kernels.comm.chooser import (
    _gpu_default as _gpu_default,
)
from labkit.kernels.comm.plans import (
    all_gather_made,
    all_gather_plan,
    all_reduce_plan,
    cached_call,
    make_all_reduce_plan,
    make_shards_plan,
    plan_key,
    reduce_scatter_made,
    reduce_scatter_plan,
)
from labkit.kernels.comm.signals import barrier_kernel
from labkit.kernels.comm.symm import SymmBuffer, check_buffer
from labkit.kernels.comm.tables import (
    ALWAYS,
    CE_FROM_BYTES,
    DEFAULT_CROSSOVER_ABOVE_2,
    DEFAULT_CROSSOVER_BYTES,
    FID_COMPARED,
    LAUNCH_TABLE,
    TABLE_MARGIN,
    TABLES,
    TUNED_BYTES,
    ChooserTable,
    crossovers_from,
    fid_limits_from,
    measured_crossovers,
    measured_fid_limits,
    table_for,
)
from labkit.workbench.guard import on_device_of

# the private names the tests reach these parts by
_barrier_semantics, _out, _config, _two_shot_ce = barrier_semantics, check_out, resolve_config, two_shot_ce_steps

__all__ = [
    "ALGORITHMS",
    "ALL_GATHER_ORDERS",
    "ALWAYS",
    "CE_FROM_BYTES",
    "DEFAULT_CONFIG",
    "DEFAULT_CROSSOVER_ABOVE_2",
    "DEFAULT_CROSSOVER_BYTES",
    "FID_COMPARED",
    "INBOX_ALGORITHMS",
    "IN_PLACE_ALGORITHMS",
    "LARGE_BYTES",
    "LAUNCH_TABLE",
    "TABLES",
    "TABLE_MARGIN",
    "TUNED_BYTES",
    "VARIANTS",
    "AllReduceChoice",
    "BarrierSemantics",
    "CheckedAllReduce",
    "CheckedShards",
    "ChooserTable",
    "CommonLaunch",
    "Graphed",
    "LaunchConfig",
    "all_gather",
    "all_gather_plan",
    "all_reduce",
    "all_reduce_plan",
    "auto_algorithm",
    "auto_choice",
    "barrier",
    "check_all_reduce",
    "check_shards",
    "choose",
    "choose_all_reduce",
    "choose_in_place",
    "crossovers_from",
    "default_config",
    "fid_limits_from",
    "graph_target",
    "launch_common",
    "launch_for",
    "make_all_reduce_plan",
    "make_shards_plan",
    "measured_crossovers",
    "measured_fid_limits",
    "plan_key",
    "reduce_scatter",
    "reduce_scatter_plan",
    "rule_config",
    "table_for",
    "tuned_size",
    "two_shot_grid",
]


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
    value. In the emulated world every eager call whose arguments differ from the rank's last call
    is compared with its peers' call of the same number (``agreement``), so a rank asking new
    arguments while its peers repeat agreed ones fails at once too. Not checked, and waiting until
    the world's timeout (``run_ranks``' timeout, the process group's under torchrun): a rank that
    never makes the call, and, on GPUs, a rank whose arguments are new to the buffer while its
    peers repeat arguments the buffer already agreed on.

    The checks and choices of a call are made once per buffer and set of arguments and kept on the
    buffer as a plan (``labkit.kernels.comm.plan``, under ``plan_key``; ``all_reduce_plan`` makes
    one to hold): the same ``check_all_reduce`` and ``choose_all_reduce`` as a held plan's, so both
    run the same algorithm and launch; ``plan.chooser_table`` names the table they read. A kept plan
    holds the algorithm "auto" resolved to when it was made: changing the chooser's tables
    afterwards (``tables.TABLES``) reaches a buffer's new plans, not the ones it keeps
    (``buf._plans.clear()`` drops those)."""
    return cached_call("all_reduce", buf, out, (algorithm, blocks, variant, config), make_all_reduce_plan)


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
    return cached_call("reduce_scatter", buf, out, (blocks, variant, config, "rotated"), reduce_scatter_made)


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
    return cached_call("all_gather", buf, out, (blocks, variant, config, order), all_gather_made)


def barrier(buf: SymmBuffer, blocks: int = 1, variant: str = "correct") -> None:
    """Only the block barrier, ``blocks`` programs: tests check it leaves every pad at zero."""
    buf = check_buffer("buf", buf)
    barriers = barrier_semantics(variant, "barrier")
    p = program_count(blocks, buf, blocks, DEFAULT_CONFIG)
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
