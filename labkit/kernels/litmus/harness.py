"""The pieces one litmus run is made of; ``labkit.kernels.litmus.run`` puts them together
(``run_litmus``, ``run_two_gpus``) and re-exports every public name here.

* ``Stress``: what runs around the test (stress programs, delays, the start barrier);
* ``LitmusBuffers``, ``allocate``, ``max_instances``: device memory for up to N instances (int32
  offsets bound N);
* ``LitmusRun``: one run's parameters, outcome counts and what went wrong (``classify()``);
* the checks of semantics, counts and lanes; ``ptx_for`` (the inline PTX of each access and
  fence) and ``program_of`` (a test as the kernel's PROGRAM constexpr);
* one run's layout: shuffled location slots and their home ranks (``layout``), the shuffled
  programs of a launch (``job_table``), how many instances a launch may hold so that all its
  programs are resident (``instances_per_launch``, ``chunks``);
* ``launch``: one launch of ``kernels.litmus_kernel`` under its tensors' device;
* ``records_of`` and the outcome counts of the records.
"""

from __future__ import annotations

import dataclasses

import torch

from labkit.kernels.litmus import kernels, model
from labkit.kernels.litmus.catalogue import LOCATIONS, LitmusTest
from labkit.kernels.litmus.classify import Classified, classify, histogram
from labkit.workbench import checks, tier
from labkit.workbench.errors import UsageError
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
