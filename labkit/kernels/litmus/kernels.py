"""One Triton kernel that runs any litmus test of the catalogue, many instances per launch.

The test arrives as data (``PROGRAM``, a flat constexpr tuple: per thread, two access slots of
``(kind, loc, value, reg)``, kind -1 for an empty slot), so the kernel cannot disagree with
``labkit.kernels.litmus.catalogue``. Each
program (CTA) runs 32-lane groups of instances:

* ``cross_cta``: a program plays one thread role for ``LANES`` instances; which role and which
  instances comes from a shuffled job table, so the roles of one instance sit in CTAs far apart
  in launch order (and on two GPUs, a rank only gets the jobs of its roles);
* ``same_cta``: a program plays every role for ``LANES`` instances; lanes ``[t*LANES,
  (t+1)*LANES)`` play thread t. With ``BLOCK == 32 * num_warps`` each lane is one hardware
  thread and each role a different set of warps (Triton's default 1-D layout; a layout with
  several elements per thread would put two roles in one thread: see ``same_cta_layout_ok``).

Every role's code is issued by every program, masked to the lanes that play it: a masked-off
access, fence (predicated inline PTX) or record does nothing. Instance i's locations sit at
shuffled slots of the location buffers (``loc_slots``, ``loc_homes``), ``stride`` words apart,
so one instance's x and y, and neighbouring instances, land on unrelated cache lines.

Accesses by semantics (``SEM``): 0 ``tl.load``/``tl.store`` (plain), 1 volatile loads
(``tl.load(volatile=True)``, PTX ``ld.volatile``) with plain stores, 2 inline PTX given by the
host (``LD_ASM``, ``ST_ASM``: e.g. ``ld.acquire.gpu``, ``st.release.sys``) plus an optional
fence between a thread's two accesses (``FENCE_ASM``: ``fence.acq_rel.gpu``, ``fence.sc.sys``).
``tl.load`` has no memory-order argument, hence the inline PTX; the interpreter cannot run
inline assembly, so semantics 2 needs a compiled GPU (the host refuses it before launching).

Every spin is bounded: the start barrier gives up after ``SPIN`` polls and counts the program
in ``sync[1]``; a hang becomes a number in the result.
"""

import triton
import triton.language as tl

SEM_PLAIN = 0
SEM_VOLATILE = 1
SEM_PTX = 2
#: an int32 the kernels never store: a register slot still holding it was never written
UNWRITTEN = -1
_UNWRITTEN = tl.constexpr(UNWRITTEN)  # the same, as a global a @triton.jit function may read


@triton.jit
def load_op(ptr, mask, SEM: tl.constexpr, LD_ASM: tl.constexpr):
    """One load per lane of ``mask``; UNWRITTEN elsewhere."""
    if SEM == 2:
        # the predicate keeps masked-off lanes from touching memory (inline asm has no mask)
        v = tl.inline_asm_elementwise(LD_ASM, "=r,l,r", [ptr, mask.to(tl.int32)], dtype=tl.int32, is_pure=False, pack=1)
    elif SEM == 1:
        v = tl.load(ptr, mask=mask, other=-1, volatile=True)
    else:
        v = tl.load(ptr, mask=mask, other=-1)
    return v


@triton.jit
def store_op(ptr, value, mask, SEM: tl.constexpr, ST_ASM: tl.constexpr):
    """One store of ``value`` (a tensor) per lane of ``mask``."""
    if SEM == 2:
        tl.inline_asm_elementwise(
            ST_ASM, "=r,l,r,r", [ptr, mask.to(tl.int32), value], dtype=tl.int32, is_pure=False, pack=1
        )
    else:
        tl.store(ptr, value, mask=mask)


@triton.jit
def between(mask, delay_ptr, FENCE_ASM: tl.constexpr, DELAY: tl.constexpr):
    """What sits between a thread's two accesses: a fence (if any) and a delay (if any)."""
    if FENCE_ASM != "":
        tl.inline_asm_elementwise(FENCE_ASM, "=r,r", [mask.to(tl.int32)], dtype=tl.int32, is_pure=False, pack=1)
    if DELAY > 0:  # volatile loads of an unrelated word: kept by the compiler, one round trip each
        for _ in range(DELAY):
            tl.load(delay_ptr, volatile=True)


@triton.jit
def location(loc_bases, loc_slots, loc_homes, inst, active, LOC: tl.constexpr):
    """Pointer to location LOC (0 = x, 1 = y) of each lane's instance, on whichever rank holds it."""
    slot = tl.load(loc_slots + inst * 2 + LOC, mask=active, other=0)
    home = tl.load(loc_homes + inst * 2 + LOC, mask=active, other=0)
    base = tl.load(loc_bases + home).to(tl.pointer_type(tl.int32))
    return base + slot


@triton.jit
def start_barrier(sync_bases, expected, SPIN: tl.constexpr):
    """Wait (at most SPIN polls) until ``expected`` programs, on every rank, have arrived, so the
    roles of an instance run at the same time. A program that gives up is counted in sync[1]."""
    sync = tl.load(sync_bases).to(tl.pointer_type(tl.int32))
    tl.atomic_add(sync, 1, sem="relaxed", scope="sys")
    seen = tl.atomic_add(sync, 0, sem="relaxed", scope="sys")
    polls = 0
    while (seen < expected) & (polls < SPIN):
        seen = tl.atomic_add(sync, 0, sem="relaxed", scope="sys")
        polls += 1
    if seen < expected:
        tl.atomic_add(sync + 1, 1, sem="relaxed", scope="sys")


@triton.jit
def stress_lines(scratch_ptr, pid, ITERS: tl.constexpr, LINES: tl.constexpr, BLOCK: tl.constexpr):
    """Memory stress: read-modify-write 128-byte scratch lines, a different line each iteration."""
    lanes = tl.arange(0, BLOCK) % 32
    for i in range(ITERS):
        line = (pid * 7 + i * 5) % LINES
        p = scratch_ptr + line * 32 + lanes
        tl.store(p, tl.load(p, volatile=True) + 1)


@triton.jit
def run_thread(
    t: tl.constexpr,
    role,
    active,
    inst,
    x,
    y,
    out_ptr,
    delay_ptr,
    PROGRAM: tl.constexpr,
    NREG: tl.constexpr,
    SEM: tl.constexpr,
    LD_ASM: tl.constexpr,
    ST_ASM: tl.constexpr,
    FENCE_ASM: tl.constexpr,
    DELAY: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """Thread t's one or two accesses on the lanes that play it, then its registers recorded
    (after both accesses: a record store between them would be one more access).
    PROGRAM is flat (Triton 3.4-3.6 cannot index a constexpr tuple of tuples): access s of thread
    t is PROGRAM[(t * 2 + s) * 4 + field], fields (kind, loc, value, reg), kind -1 where thread t
    has no access s."""
    mine = active & (role == t)
    first = tl.full([BLOCK], _UNWRITTEN, tl.int32)
    second = tl.full([BLOCK], _UNWRITTEN, tl.int32)
    for s in tl.static_range(2):
        if PROGRAM[(t * 2 + s) * 4] >= 0:
            if s == 1:
                between(mine, delay_ptr, FENCE_ASM, DELAY)
            if PROGRAM[(t * 2 + s) * 4 + 1] == 0:
                ptr = x
            else:
                ptr = y
            if PROGRAM[(t * 2 + s) * 4] == 0:
                store_op(ptr, tl.full([BLOCK], PROGRAM[(t * 2 + s) * 4 + 2], tl.int32), mine, SEM, ST_ASM)
            elif s == 0:
                first = load_op(ptr, mine, SEM, LD_ASM)
            else:
                second = load_op(ptr, mine, SEM, LD_ASM)
    for s in tl.static_range(2):
        if PROGRAM[(t * 2 + s) * 4] == 1:
            if s == 0:
                tl.store(out_ptr + inst * NREG + PROGRAM[(t * 2 + s) * 4 + 3], first, mask=mine)
            else:
                tl.store(out_ptr + inst * NREG + PROGRAM[(t * 2 + s) * 4 + 3], second, mask=mine)


@triton.jit
def litmus_kernel(
    loc_bases,  # int64 [W]: address of each rank's location buffer (W = 1 on one GPU)
    loc_slots,  # int32 [N, 2]: where x and y of instance i sit (int32 words into the buffer)
    loc_homes,  # int32 [N, 2]: which rank's buffer holds them (all 0 on one GPU)
    out_ptr,  # int32 [N, NREG]: the registers of every instance (UNWRITTEN before)
    jobs,  # int32 [test programs]: cross_cta: group * THREADS + role; same_cta: group
    sync_bases,  # int64 [1]: address of the start barrier's int32 pair (arrived, gave up)
    scratch_ptr,  # int32 [LINES * 32 + 1]: the stress lines, then the delay word
    n_instances,  # N
    n_test_programs,  # programs that play test roles; the rest of the grid is stress
    expected,  # programs (on every rank) the start barrier waits for
    PROGRAM: tl.constexpr,  # the test, flat: per thread 2 accesses x (kind 0 st / 1 ld / -1 none, loc, value, reg)
    NREG: tl.constexpr,  # registers per instance (columns of out)
    SAME_CTA: tl.constexpr,  # True: every role in one program, a warp group per role
    LANES: tl.constexpr,  # instances per program (a multiple of 32)
    BLOCK: tl.constexpr,  # lanes per program: LANES, or LANES x roles (padded to a power of 2)
    SEM: tl.constexpr,  # 0 plain, 1 volatile loads, 2 inline PTX
    LD_ASM: tl.constexpr,  # SEM 2: predicated PTX load ($0 value, $1 address, $2 mask)
    ST_ASM: tl.constexpr,  # SEM 2: predicated PTX store ($1 address, $2 mask, $3 value)
    FENCE_ASM: tl.constexpr,  # predicated PTX fence between a thread's accesses, or ""
    DELAY: tl.constexpr,  # volatile-load round trips between a thread's accesses (0: none)
    BARRIER: tl.constexpr,  # wait for every program before the test
    SPIN: tl.constexpr,  # most polls of the start barrier
    STRESS_ITERS: tl.constexpr,  # iterations of each stress program
    STRESS_LINES: tl.constexpr,  # scratch lines the stress programs share
):
    pid = tl.program_id(0)
    if BARRIER:
        start_barrier(sync_bases, expected, SPIN)
    delay_ptr = scratch_ptr + STRESS_LINES * 32
    if pid < n_test_programs:
        job = tl.load(jobs + pid)
        lanes = tl.arange(0, BLOCK)
        if SAME_CTA:
            role = lanes // LANES
            group = job
        else:
            role = tl.zeros([BLOCK], tl.int32) + job % (len(PROGRAM) // 8)
            group = job // (len(PROGRAM) // 8)
        inst = group * LANES + lanes % LANES
        active = (inst < n_instances) & (role < len(PROGRAM) // 8)
        x = location(loc_bases, loc_slots, loc_homes, inst, active, 0)
        y = location(loc_bases, loc_slots, loc_homes, inst, active, 1)
        for t in tl.static_range(len(PROGRAM) // 8):
            run_thread(
                t,
                role,
                active,
                inst,
                x,
                y,
                out_ptr,
                delay_ptr,
                PROGRAM,
                NREG,
                SEM,
                LD_ASM,
                ST_ASM,
                FENCE_ASM,
                DELAY,
                BLOCK,
            )
    elif STRESS_ITERS > 0:
        stress_lines(scratch_ptr, pid, STRESS_ITERS, STRESS_LINES, BLOCK)
