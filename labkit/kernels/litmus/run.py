"""``run_litmus``: one litmus test, many instances, a few launches; outcome counts back.

    res = run_litmus("MP", "acq_rel", "gpu", "cross_cta", instances=100_000)
    res.counts          # {(0, 0): 51234, (0, 1): 12, (1, 1): 48754}  (outcome tuple -> count)
    res.classify().summary()

On the CPU tier (Triton interpreter) only ``plain`` and ``volatile`` run: the interpreter runs
programs one after another, so every outcome is one a sequentially consistent machine makes.
``two_gpus`` there runs on an emulated world of two processes over shared memory (lab 02's
``run_ranks`` and ``symm``): real concurrency, but the *host's* memory model (x86-TSO) applies,
not PTX's, and process start-up skew makes overlap rare.
"""

from __future__ import annotations

import dataclasses
import time

import torch

from labkit.kernels.litmus import kernels, model
from labkit.kernels.litmus.catalogue import LOCATIONS, LitmusTest, get_test
from labkit.kernels.litmus.classify import Classified, classify, histogram
from labkit.workbench import checks, gates, tier
from labkit.workbench.errors import UsageError
from labkit.workbench.gates import HardwareUnavailable
from labkit.workbench.guard import on_device_of

#: registers per instance in the outcome buffer (IRIW has the most: 4)
MAX_REGS = 4
#: what the result says about the memory model of an emulated two-rank run
EMULATED_NOTE = (
    "emulated ranks (CPU processes over shared memory): the host's memory model (x86-TSO) applies, not PTX's"
)


@dataclasses.dataclass(frozen=True)
class Stress:
    """What runs around the test to make weak outcomes likelier (cuda-litmus's knobs, simplified).

    programs:   extra programs that read-modify-write ``lines`` scratch lines while the test runs
    iterations: read-modify-writes per stress program
    lines:      128-byte scratch lines the stress programs share
    delay:      volatile-load round trips between a thread's two accesses (0 compiles away)
    barrier:    programs wait for each other before the test (None: yes on a compiled GPU, no
                under the interpreter, whose programs run one after another and could only time out)
    spin:       most polls of that wait; a program that gives up is counted in ``timeouts``
    """

    programs: int = 0
    iterations: int = 64
    lines: int = 8
    delay: int = 0
    barrier: bool | None = None
    spin: int = 1 << 20

    def check(self) -> None:
        for name in ("programs", "iterations", "lines", "delay", "spin"):
            v = getattr(self, name)
            low = 1 if name in ("lines", "spin") else 0
            if isinstance(v, bool) or not isinstance(v, int) or v < low:
                raise UsageError(f"stress.{name}: expected an int >= {low}, got {v!r}")
        if self.barrier not in (None, True, False):
            raise UsageError(f"stress.barrier: expected None, True or False, got {self.barrier!r}")


@dataclasses.dataclass
class LitmusBuffers:
    """Device memory for runs of up to ``capacity`` instances (reusable across runs)."""

    locations: torch.Tensor  # int32 [capacity * 2 * stride]: every instance's x and y, shuffled
    out: torch.Tensor  # int32 [capacity, MAX_REGS]: registers
    sync: torch.Tensor  # int32 [2]: start barrier (arrived, gave up)
    scratch: torch.Tensor  # int32 [lines * 32 + 1]: stress lines, then the delay word
    capacity: int
    stride: int  # int32 words between consecutive location slots

    @property
    def stress_lines(self) -> int:
        return (self.scratch.numel() - 1) // 32


def max_instances(stride: int) -> int:
    """The most instances one run addresses: the kernel's slot offsets (instance * 2 * stride
    words) and register indices (instance * MAX_REGS) are int32."""
    return (2**31 - 1) // max(2 * stride, MAX_REGS)


def _check_fits(name: str, count: int, stride: int) -> None:
    most = max_instances(stride)
    if count > most:
        raise UsageError(
            f"{name}: {count} is more than one run can address with stride {stride} (the kernel's "
            f"offsets are int32): at most {most}; split the instances over several runs"
        )


def allocate(capacity: int, stride: int = 4, device=None, stress_lines: int = 64, *, _name="capacity") -> LitmusBuffers:
    """Buffers for up to ``capacity`` instances on ``device`` (default: the tier's device).

    capacity: 1 to ``max_instances(stride)`` (the kernel's offsets are int32). Buffers that do not
    fit the device's memory are a UsageError naming capacity and the bytes asked for."""
    _check_count(_name, capacity)
    _check_count("stride", stride)
    _check_count("stress_lines", stress_lines)
    _check_fits(_name, capacity, stride)
    dev = checks.check_device("device", device if device is not None else tier.kernel_device())
    try:
        return LitmusBuffers(
            torch.zeros(capacity * 2 * stride, dtype=torch.int32, device=dev),
            torch.full((capacity, MAX_REGS), kernels.UNWRITTEN, dtype=torch.int32, device=dev),
            torch.zeros(2, dtype=torch.int32, device=dev),
            torch.zeros(stress_lines * 32 + 1, dtype=torch.int32, device=dev),
            capacity,
            stride,
        )
    except (RuntimeError, MemoryError) as e:  # torch.OutOfMemoryError is a RuntimeError
        need = 4 * (capacity * (2 * stride + MAX_REGS) + 2 + stress_lines * 32 + 1)
        raise UsageError(
            f"{_name}: {capacity} instances need {need} bytes of buffers on {dev}, which could not be "
            f"allocated ({str(e).splitlines()[0][:200]}); pass fewer"
        ) from None


@dataclasses.dataclass
class LitmusRun:
    """One run: its parameters, the outcome counts, and what went wrong on the way."""

    test: str
    semantics: str
    scope: str | None
    placement: str
    instances: int
    stress: Stress
    seed: int
    stride: int
    lanes: int
    device: str
    counts: dict[tuple[int, ...], int]  # outcome tuple (test.observed order) -> instances
    unwritten: int  # instances with a register never written (excluded from counts): a bug if > 0
    timeouts: int  # programs whose start-barrier wait ran out (a would-be hang)
    seconds: float  # the launches, until the device finished (after the warm-up launch)
    launches: int = 1  # launches the instances were split into (one resident wave each)
    note: str = ""  # e.g. the emulated world's memory model
    warmup_s: float = 0.0  # the untimed first launch (it compiles or loads the kernel); 0 under the interpreter
    records: torch.Tensor | None = dataclasses.field(default=None, repr=False)  # [instances, observed]

    def classify(self, confidence: float = 0.95) -> Classified:
        return classify(self.test, self.counts, self.semantics, self.scope, self.placement, confidence)


# --- checks -----------------------------------------------------------------------------------


def _check_count(name: str, v, low: int = 1) -> None:
    if isinstance(v, bool) or not isinstance(v, int) or v < low:
        raise UsageError(f"{name}: expected an int >= {low}, got {v!r}")


def needs_ptx(semantics: str) -> bool:
    """True for semantics whose accesses or fences are inline PTX (compiled GPU only)."""
    return semantics in model.SCOPED


def ptx_for(semantics: str, scope: str | None) -> tuple[int, str, str, str]:
    """(SEM, LD_ASM, ST_ASM, FENCE_ASM) for the kernel: the PTX each access and fence becomes."""
    if semantics == "plain":
        return kernels.SEM_PLAIN, "", "", ""
    if semantics == "volatile":
        return kernels.SEM_VOLATILE, "", "", ""
    ld_order, st_order = ("acquire", "release") if semantics == "acq_rel" else ("relaxed", "relaxed")
    ld = (
        f"{{ .reg .pred %lp; setp.ne.b32 %lp, $2, 0; mov.b32 $0, -1; @%lp ld.{ld_order}.{scope}.global.b32 $0, [$1]; }}"
    )
    st = f"{{ .reg .pred %lp; setp.ne.b32 %lp, $2, 0; mov.b32 $0, 0; @%lp st.{st_order}.{scope}.global.b32 [$1], $3; }}"
    fence = ""
    if semantics in ("fence", "fence_sc"):
        kind = "sc" if semantics == "fence_sc" else "acq_rel"
        fence = f"{{ .reg .pred %lp; setp.ne.b32 %lp, $1, 0; mov.b32 $0, 0; @%lp fence.{kind}.{scope}; }}"
    return kernels.SEM_PTX, ld, st, fence


def _check_runnable(semantics: str) -> None:
    if needs_ptx(semantics) and tier.interpreted():
        raise UsageError(
            f"semantics={semantics!r} needs a compiled GPU: its accesses and fences are "
            "inline PTX (ld.acquire/st.release/ld.relaxed/fence.*), which the Triton "
            "interpreter (TRITON_INTERPRET=1) cannot run; here use 'plain' or 'volatile'"
        )


#: access slots per thread in PROGRAM (every test of the catalogue has one or two accesses a thread)
SLOTS = 2


def program_of(test: LitmusTest) -> tuple:
    """The test as the kernel's PROGRAM constexpr, a flat tuple of ints (Triton 3.4-3.6 cannot
    index nested constexpr tuples): per thread, SLOTS accesses of (kind 0 st / 1 ld, loc, value,
    reg), an empty slot (-1, 0, 0, 0). len(PROGRAM) // (4 * SLOTS) is the thread count."""
    regs = test.registers
    flat = []
    for accesses in test.threads:
        if not 1 <= len(accesses) <= SLOTS:
            raise ValueError(f"test {test.name}: a thread has {len(accesses)} accesses; the kernel runs 1 to {SLOTS}")
        for a in accesses:
            flat += [
                0 if a.kind == "st" else 1,
                LOCATIONS.index(a.loc),
                a.value,
                regs.index(a.reg) if a.kind == "ld" else 0,
            ]
        flat += [-1, 0, 0, 0] * (SLOTS - len(accesses))
    return tuple(flat)


def _lanes(lanes, placement) -> int:
    if lanes is None:
        return 32 if (tier.interpreted() or placement == "same_cta") else 128
    if isinstance(lanes, bool) or not isinstance(lanes, int) or lanes < 32 or lanes & (lanes - 1):
        raise UsageError(f"lanes: expected a power of two >= 32 (instances per program), got {lanes!r}")
    return lanes


# --- layout of one run: where locations sit, which program plays what ------------------------


def layout(instances: int, stride: int, seed: int, world: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """(slots [N, 2], homes [N, 2]) as CPU int32 tensors, the same on every rank for a seed:
    where x and y of each instance sit (shuffled slots, ``stride`` words apart) and which rank's
    buffer holds them. Every rank's buffer is as large as one GPU's, so slots never collide."""
    g = torch.Generator().manual_seed(seed)
    perm = torch.randperm(instances * 2, generator=g)
    homes = torch.randint(0, world, (instances, 2), generator=g, dtype=torch.int32)
    return (perm.view(instances, 2) * stride).to(torch.int32), homes


def roles_on(test: LitmusTest, world: int, rank: int) -> int:
    """Thread roles rank ``rank`` plays: thread t runs on rank t % world."""
    return sum(1 for t in range(len(test.threads)) if t % world == rank)


def job_table(
    test: LitmusTest, instances: int, placement: str, lanes: int, seed: int, world: int = 1, rank: int = 0
) -> torch.Tensor:
    """This rank's programs of one launch, shuffled (int32): cross_cta / two_gpus: group *
    threads + role, for its roles only; same_cta: the group (every role in one program)."""
    g = torch.Generator().manual_seed(seed)
    groups = -(-instances // lanes)
    threads = len(test.threads)
    if placement == "same_cta":
        return torch.randperm(groups, generator=g).to(torch.int32)
    jobs = torch.randperm(groups * threads, generator=g)
    return jobs[(jobs % threads) % world == rank].to(torch.int32)


def resident_programs(device: torch.device, num_warps: int) -> int | None:
    """About how many programs of ``num_warps`` warps one GPU runs at once (half the thread and
    block limits allow, since registers may allow fewer); None off a GPU."""
    if device.type != "cuda":
        return None
    props = torch.cuda.get_device_properties(device)
    per_sm = min(32, props.max_threads_per_multi_processor // (32 * num_warps))
    return max(1, props.multi_processor_count * per_sm // 2)


def instances_per_launch(
    test: LitmusTest, placement: str, lanes: int, stress: Stress, programs: int | None, world: int = 1
) -> int | None:
    """Instances one launch may hold so that all its programs run at once (the start barrier
    can only complete then); None: no limit (one launch)."""
    if programs is None:
        return None
    room = programs - stress.programs
    per_group = 1 if placement == "same_cta" else max(roles_on(test, world, r) for r in range(world))
    if room < per_group:
        raise UsageError(
            f"stress.programs: {stress.programs} leaves no room for the test in a launch of "
            f"{programs} programs (programs_per_launch); use fewer stress programs"
        )
    return (room // per_group) * lanes


def chunks(instances: int, per_launch: int | None) -> list[tuple[int, int]]:
    if per_launch is None:
        return [(0, instances)]
    return [(c, min(instances, c + per_launch)) for c in range(0, instances, per_launch)]


def _block(test: LitmusTest, placement: str, lanes: int) -> int:
    if placement != "same_cta":
        return lanes
    roles = 1 << (len(test.threads) - 1).bit_length()  # 2, 3 -> 4, 4
    return lanes * roles


def same_cta_layout_ok(block: int, num_warps: int) -> bool:
    """same_cta puts roles on different warps only when each lane is one thread."""
    return block == 32 * num_warps


def launch(
    test: LitmusTest,
    semantics: str,
    scope,
    placement: str,
    instances: int,
    lanes: int,
    stress: Stress,
    loc_bases,
    slots,
    homes,
    jobs,
    out,
    sync_bases,
    scratch,
    expected: int,
):
    """One launch of ``litmus_kernel`` on the device of ``out``; tables already on it."""
    sem, ld_asm, st_asm, fence_asm = ptx_for(semantics, scope)
    block = _block(test, placement, lanes)
    num_warps = max(1, block // 32)
    assert placement != "same_cta" or same_cta_layout_ok(block, num_warps)
    barrier = stress.barrier if stress.barrier is not None else not tier.interpreted()
    grid = (jobs.numel() + stress.programs,)
    with on_device_of(out=out, slots=slots, jobs=jobs, scratch=scratch):
        kernels.litmus_kernel[grid](
            loc_bases,
            slots,
            homes,
            out,
            jobs,
            sync_bases,
            scratch,
            instances,
            jobs.numel(),
            expected,
            PROGRAM=program_of(test),
            NREG=MAX_REGS,
            SAME_CTA=placement == "same_cta",
            LANES=lanes,
            BLOCK=block,
            SEM=sem,
            LD_ASM=ld_asm,
            ST_ASM=st_asm,
            FENCE_ASM=fence_asm,
            DELAY=stress.delay,
            BARRIER=barrier,
            SPIN=stress.spin,
            STRESS_ITERS=stress.iterations,
            STRESS_LINES=stress.lines,
            num_warps=num_warps,
        )


def records_of(test: LitmusTest, out: torch.Tensor, finals: torch.Tensor) -> torch.Tensor:
    """[N, len(test.observed)]: registers from ``out`` [N, MAX_REGS], locations from ``finals`` [N, 2]."""
    cols = [
        out[:, test.registers.index(o)] if o.startswith("r") else finals[:, LOCATIONS.index(o)] for o in test.observed
    ]
    return torch.stack(cols, dim=1)


def _counts(test: LitmusTest, records: torch.Tensor) -> tuple[dict, int]:
    reg_cols = [i for i, o in enumerate(test.observed) if o.startswith("r")]
    bad = (
        (records[:, reg_cols] == kernels.UNWRITTEN).any(dim=1)
        if reg_cols
        else torch.zeros(records.shape[0], dtype=torch.bool)
    )
    good = records[~bad]
    return (histogram(good) if good.numel() else {}), int(bad.sum())


# --- the API ---------------------------------------------------------------------------------


def _checked(semantics, scope, placement, instances, seed, stress, programs_per_launch, stride, lanes):
    """The checks ``run_litmus`` and ``run_two_gpus`` share, in the order their errors are met;
    returns (stress, lanes) with their defaults filled in (the stride's depends on the caller's buffers)."""
    model.check_variant(semantics, scope, placement)
    _check_count("instances", instances)
    if stride is None or isinstance(stride, int):  # a bad stride is named below
        _check_fits("instances", instances, stride or 4)
    _check_count("seed", seed, low=0)
    if stride is not None:
        _check_count("stride", stride)
    stress = Stress() if stress is None else stress
    if not isinstance(stress, Stress):
        raise UsageError(f"stress: expected a labkit.kernels.litmus.Stress, got {type(stress).__name__}")
    stress.check()
    _check_runnable(semantics)
    if programs_per_launch is not None:
        _check_count("programs_per_launch", programs_per_launch)
    return stress, _lanes(lanes, placement)


def run_litmus(
    test,
    semantics: str = "plain",
    scope: str | None = None,
    placement: str = "cross_cta",
    instances: int = 4096,
    *,
    stress: Stress | None = None,
    device=None,
    seed: int = 0,
    stride: int | None = None,
    lanes: int | None = None,
    buffers: LitmusBuffers | None = None,
    timeout: float = 300.0,
    programs_per_launch: int | None = None,
    keep_records: bool = False,
) -> LitmusRun:
    """Run ``instances`` instances of ``test`` and count their outcomes (one launch per wave of
    resident programs: see ``programs_per_launch``).

    test:       a name of ``catalogue.TESTS`` ("MP", "SB", "LB", "CoRR", "IRIW", "2+2W", "RWC")
    semantics:  see ``model.SEMANTICS``; all but plain/volatile need a compiled GPU
    scope:      "cta", "gpu", "sys" (None for plain and volatile)
    placement:  "same_cta", "cross_cta" or "two_gpus" (lab 02's symmetric memory; 2 GPUs, or an
                emulated world of two processes under the interpreter: see EMULATED_NOTE)
    stress:     ``Stress(...)``; default none
    seed:       draws the location slots and the job order (same seed, same layout)
    stride:     int32 words between location slots (default 4: 16 bytes, as cuda-litmus's
                memStride; with ``buffers``, theirs)
    lanes:      instances per program (default 128 on a GPU, 32 under the interpreter and for same_cta)
    buffers:    ``allocate(...)`` buffers to reuse (one device only), at least ``instances`` large
    timeout:    two_gpus only: seconds for the whole two-rank run
    programs_per_launch: programs (test + stress) per launch; more instances are split over
                several launches, so that every program of a launch is resident and the start
                barrier completes (None: about one wave of the GPU; no limit under the interpreter)
    keep_records: keep the per-instance records ([instances, observed]) in the result
    """
    t = get_test(test)
    if buffers is not None and isinstance(buffers, LitmusBuffers) and stride not in (None, buffers.stride):
        raise UsageError(
            f"stride: {stride} differs from the buffers' stride {buffers.stride}; pass stride=None to use theirs"
        )
    stress, lanes = _checked(semantics, scope, placement, instances, seed, stress, programs_per_launch, stride, lanes)
    stride = stride or (buffers.stride if isinstance(buffers, LitmusBuffers) else 4)
    if placement == "two_gpus":
        if buffers is not None:
            raise UsageError(
                "buffers: placement='two_gpus' needs symmetric memory, which each rank "
                "allocates itself (labkit.kernels.comm.symm); pass buffers=None"
            )
        return _run_two_ranks(
            [t], semantics, scope, instances, stress, seed, stride, lanes, timeout, programs_per_launch, keep_records
        )[0]
    if buffers is None:
        buffers = allocate(instances, stride, device, stress_lines=stress.lines, _name="instances")
    elif not isinstance(buffers, LitmusBuffers):
        raise UsageError(f"buffers: expected LitmusBuffers from allocate(), got {type(buffers).__name__}")
    if instances > buffers.capacity:
        raise UsageError(
            f"instances: {instances} is more than the buffers hold ({buffers.capacity}); "
            f"allocate({instances}, ...) or pass fewer"
        )
    if stress.lines > buffers.stress_lines:
        raise UsageError(
            f"stress.lines: {stress.lines} is more than the buffers' {buffers.stress_lines} "
            "scratch lines; allocate(..., stress_lines=...) more"
        )
    if device is not None and checks.check_device("device", device) != buffers.out.device:
        raise UsageError(f"device: {device!r} but the buffers are on {buffers.out.device}")
    checks.check_kernel_device("buffers", buffers.out)
    dev = buffers.out.device
    slots, homes = (a.to(dev) for a in layout(instances, buffers.stride, seed))
    buffers.locations.zero_()
    buffers.out.fill_(kernels.UNWRITTEN)
    loc_bases = torch.tensor([buffers.locations.data_ptr()], dtype=torch.int64, device=dev)
    sync_bases = torch.tensor([buffers.sync.data_ptr()], dtype=torch.int64, device=dev)
    if programs_per_launch is None:
        programs_per_launch = resident_programs(dev, max(1, _block(t, placement, lanes) // 32))
    timeouts, seconds, warmup_s = 0, 0.0, 0.0
    parts = chunks(instances, instances_per_launch(t, placement, lanes, stress, programs_per_launch))

    def one_launch(i: int, c0: int, c1: int) -> float:
        jobs = job_table(t, c1 - c0, placement, lanes, seed * 1_000_003 + i).to(dev)
        buffers.sync.zero_()
        start = time.perf_counter()
        launch(
            t,
            semantics,
            scope,
            placement,
            c1 - c0,
            lanes,
            stress,
            loc_bases,
            slots[c0:c1],
            homes[c0:c1],
            jobs,
            buffers.out[c0:c1],
            sync_bases,
            buffers.scratch,
            jobs.numel() + stress.programs,
        )
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        return time.perf_counter() - start

    if not tier.interpreted():
        # A kernel's first launch compiles it (or loads it from Triton's cache): seconds, against
        # 0.1-0.5 s for 1e7 instances. Run the first chunk once untimed, then start again clean,
        # so that ``seconds`` is the launches alone (the interpreter compiles nothing).
        warmup_s = one_launch(0, *parts[0])
        buffers.locations.zero_()
        buffers.out.fill_(kernels.UNWRITTEN)
    for i, (c0, c1) in enumerate(parts):
        seconds += one_launch(i, c0, c1)
        timeouts += int(buffers.sync[1])
    finals = buffers.locations[slots.long()]
    records = records_of(t, buffers.out[:instances], finals).cpu()
    counts, unwritten = _counts(t, records)
    return LitmusRun(
        t.name,
        semantics,
        scope,
        placement,
        instances,
        stress,
        seed,
        buffers.stride,
        lanes,
        str(dev),
        counts,
        unwritten,
        timeouts,
        seconds,
        launches=len(parts),
        records=records if keep_records else None,
        warmup_s=warmup_s,
    )


# --- two GPUs (or two emulated ranks) --------------------------------------------------------


def run_two_gpus(
    tests,
    semantics: str = "plain",
    scope: str | None = None,
    instances: int = 4096,
    *,
    stress: Stress | None = None,
    seed: int = 0,
    stride: int | None = None,
    lanes: int | None = None,
    timeout: float = 300.0,
    programs_per_launch: int | None = None,
    keep_records: bool = False,
) -> list[LitmusRun]:
    """``run_litmus(test, semantics, scope, "two_gpus", instances, ...)`` for each of ``tests``,
    in one start of the two ranks: starting them (two processes, CUDA, symmetric memory) costs
    seconds, about as much as a run of 1e5 instances, so a sweep of several tests pays it once.

    tests:   names of ``catalogue.TESTS``, run in this order, each with its own locations and
             barrier and the same ``seed``; the other arguments as for ``run_litmus``
    timeout: seconds for the whole two-rank run (all the tests)
    Returns one ``LitmusRun`` per test, in order; each is what ``run_litmus`` returns for it.
    """
    if isinstance(tests, str) or not isinstance(tests, (list, tuple)) or not tests:
        raise UsageError(f"tests: expected a non-empty list of test names, got {tests!r}")
    ts = [get_test(t) for t in tests]
    stress, lanes = _checked(semantics, scope, "two_gpus", instances, seed, stress, programs_per_launch, stride, lanes)
    return _run_two_ranks(
        ts, semantics, scope, instances, stress, seed, stride or 4, lanes, timeout, programs_per_launch, keep_records
    )


def _run_two_ranks(
    ts, semantics, scope, instances, stress, seed, stride, lanes, timeout, programs_per_launch, keep_records
) -> list[LitmusRun]:
    from labkit.kernels.comm.ranks import run_ranks

    emulated = tier.interpreted()
    if not emulated:
        gate = gates.requires(gpus=2, peer_access=True, compiled=True)
        if not gate.ok:
            raise HardwareUnavailable(f"placement='two_gpus': {gate.reason}")
    specs = [
        {
            "test": t.name,
            "semantics": semantics,
            "scope": scope,
            "instances": instances,
            "stress": dataclasses.asdict(stress),
            "seed": seed,
            "stride": stride,
            "lanes": lanes,
            "programs_per_launch": programs_per_launch,
        }
        for t in ts
    ]
    res = run_ranks(rank_litmus_many, 2, specs, timeout=timeout)
    per_rank = res.unwrap()
    return [
        _merge_ranks(
            t,
            [per_rank[0][i], per_rank[1][i]],
            semantics,
            scope,
            instances,
            stress,
            seed,
            stride,
            lanes,
            emulated,
            keep_records,
        )
        for i, t in enumerate(ts)
    ]


def _merge_ranks(t, parts, semantics, scope, instances, stress, seed, stride, lanes, emulated, keep_records):
    """One test's run from both ranks' shares: each register from the rank of the thread that read
    it, each location's final value from the rank whose memory holds it."""
    out = torch.full((instances, MAX_REGS), kernels.UNWRITTEN, dtype=torch.int32)
    for reg_index, reg in enumerate(t.registers):
        out[:, reg_index] = parts[t.owner(reg) % 2]["out"][:, reg_index]
    finals = torch.where(parts[0]["homes"] == 0, parts[0]["finals"], parts[1]["finals"])
    records = records_of(t, out, finals)
    counts, unwritten = _counts(t, records)
    return LitmusRun(
        t.name,
        semantics,
        scope,
        "two_gpus",
        instances,
        stress,
        seed,
        stride,
        lanes,
        parts[0]["device"] + " + " + parts[1]["device"],
        counts,
        unwritten,
        parts[0]["timeouts"],
        max(p["seconds"] for p in parts),
        launches=parts[0]["launches"],
        note=EMULATED_NOTE if emulated else "",
        records=records if keep_records else None,
        warmup_s=max(p["warmup_s"] for p in parts),
    )


def rank_litmus_many(ctx, specs: list) -> list:
    """One rank's share of several two_gpus runs, one after another (called by run_ranks)."""
    return [rank_litmus(ctx, spec) for spec in specs]


def rank_litmus(ctx, spec: dict) -> dict:
    """One rank's share of a two_gpus run (called by run_ranks): allocate the locations and the
    barrier in symmetric memory, play this rank's thread roles, return registers and finals."""
    from labkit.kernels.comm import symm

    t = get_test(spec["test"])
    stress = Stress(**spec["stress"])
    n, stride, lanes = spec["instances"], spec["stride"], spec["lanes"]
    dev = ctx.device
    # symm buffers are float32 or bf16: an int32 view of a float32 buffer has the same bytes
    locs = symm.empty(n * 2 * stride, torch.float32, device=dev, max_blocks=1, scratch_dir=ctx.scratch_dir)
    sync = symm.empty(2, torch.float32, device=dev, max_blocks=1, scratch_dir=ctx.scratch_dir)
    slots, homes = layout(n, stride, spec["seed"], world=2)
    out = torch.full((n, MAX_REGS), kernels.UNWRITTEN, dtype=torch.int32, device=dev)
    scratch = torch.zeros(stress.lines * 32 + 1, dtype=torch.int32, device=dev)
    slots_d, homes_d = slots.to(dev), homes.to(dev)
    programs = spec["programs_per_launch"] or resident_programs(dev, max(1, lanes // 32))
    sync_mine = sync.tensor.view(torch.int32)  # rank 0's is the barrier; each rank zeroes its own
    parts = chunks(n, instances_per_launch(t, "two_gpus", lanes, stress, programs, 2))
    mine = locs.tensor.view(torch.int32)

    def one_launch(i: int, c0: int, c1: int) -> tuple[float, int]:
        seed = spec["seed"] * 1_000_003 + i
        jobs = job_table(t, c1 - c0, "two_gpus", lanes, seed, 2, ctx.rank).to(dev)
        everyone = sum(job_table(t, c1 - c0, "two_gpus", lanes, seed, 2, r).numel() for r in range(2))
        sync_mine.zero_()
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        ctx.barrier()  # the barrier counter and (first time) both ranks' locations are zero
        start = time.perf_counter()
        launch(
            t,
            spec["semantics"],
            spec["scope"],
            "two_gpus",
            c1 - c0,
            lanes,
            stress,
            locs.data_ptrs,
            slots_d[c0:c1],
            homes_d[c0:c1],
            jobs,
            out[c0:c1],
            sync.data_ptrs[:1],
            scratch,
            everyone + 2 * stress.programs,
        )
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        took = time.perf_counter() - start
        ctx.barrier()  # both ranks are done before rank 0's counter is read or reset
        gave_up = int(sync.peers[0].view(torch.int32)[1])
        ctx.barrier()
        return took, gave_up

    timeouts, seconds, warmup_s = 0, 0.0, 0.0
    if not tier.interpreted():
        # the first launch compiles or loads the kernel (see run_litmus): once untimed, on both
        # ranks at once (its start barrier spans them), then both start again from zero; the
        # next launch's host barrier orders every rank's zeroing before any kernel reads
        warmup_s = one_launch(0, *parts[0])[0]
        mine.zero_()
        out.fill_(kernels.UNWRITTEN)
    for i, (c0, c1) in enumerate(parts):
        took, gave_up = one_launch(i, c0, c1)
        seconds += took
        timeouts += gave_up
    finals = mine[slots.long().to(dev)].cpu()
    ctx.barrier()  # nobody frees its buffer while the other still reads
    return {
        "out": out.cpu(),
        "finals": finals,
        "homes": homes,
        "timeouts": timeouts,
        "seconds": seconds,
        "device": str(dev),
        "launches": len(parts),
        "warmup_s": warmup_s,
    }
