"""Rank functions for tests/kernels/comm/test_ranks.py and tests/kernels/comm/test_collectives.py.

They live in a module of their own because every rank imports its function by name: spawned
ranks get the launcher's sys.path, where pytest has put tests/ (as for ``helpers``).
"""

from __future__ import annotations

import os
import threading
import time

import torch
import torch.distributed as dist


def inputs(seed: int, rank: int, n: int) -> torch.Tensor:
    """Rank ``rank``'s input: fresh random numbers, reproducible by the test from the seed."""
    g = torch.Generator().manual_seed(seed + rank)
    return torch.randn(n, generator=g, dtype=torch.float32)


def report(ctx, seed: int, n: int) -> dict:
    """Who this rank is, an all_reduce of its random inputs, and a file passed through scratch."""
    import labkit

    x = inputs(seed, ctx.rank, n).to(ctx.device)
    total = x.clone()
    dist.all_reduce(total)  # sum over ranks
    shared = os.path.join(ctx.scratch_dir, "from_rank0.txt")
    if ctx.rank == 0:
        with open(shared, "w") as f:
            f.write(f"written by pid {os.getpid()}")
    ctx.barrier()  # rank 0 has written the file before anyone reads it
    with open(shared) as f:
        seen = f.read()
    return {
        "rank": ctx.rank,
        "world_size": ctx.world_size,
        "device": str(ctx.device),
        "backend": ctx.backend,
        "dist_rank": dist.get_rank(),
        "dist_world_size": dist.get_world_size(),
        "sum": total.cpu(),
        "seen": seen,
        "scratch_dir": ctx.scratch_dir,
        "pid": os.getpid(),
        "tier": labkit.TIER,
        "env": {
            k: os.environ.get(k) for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "NCCL_NVLS_ENABLE", "LABKIT_RANKS_PROBE")
        },
    }


def raise_on_rank(ctx, bad_rank: int, sleep_s: float) -> int:
    """Rank ``bad_rank`` raises; the others sleep, as if waiting in a collective for it."""
    if ctx.rank == bad_rank:
        raise ValueError(f"planted failure on rank {ctx.rank}")
    time.sleep(sleep_s)
    return ctx.rank


def spin_on_missing_peer(ctx, seconds: float) -> str:
    """Rank 0 returns at once; the others spin on a flag file that rank 0 never writes."""
    if ctx.rank == 0:
        return "rank 0 done"
    flag = os.path.join(ctx.scratch_dir, "rank0_arrived")
    deadline = time.monotonic() + seconds
    while not os.path.exists(flag) and time.monotonic() < deadline:
        time.sleep(0.01)
    return "peer arrived" if os.path.exists(flag) else "gave up"


def link_copy_roundtrip(ctx, n: int, seed: int) -> dict:
    """labkit.labs.collectives.links.link_copy across ranks: read the next rank's buffer, then write this
    rank's input into it; each rank checks what landed against the inputs it can rebuild."""
    from labkit.kernels.comm import symm
    from labkit.labs.collectives import links

    w = ctx.world_size
    mine, nxt = inputs(seed, ctx.rank, n), inputs(seed, (ctx.rank + 1) % w, n)
    buf = symm.empty(n, torch.float32, device=ctx.device, scratch_dir=ctx.scratch_dir)
    buf.tensor.copy_(mine.to(ctx.device))
    if ctx.device.type == "cuda":
        torch.cuda.synchronize(ctx.device)
    ctx.barrier()
    got = links.link_copy(buf.peers[(ctx.rank + 1) % w], torch.zeros(n, device=ctx.device), programs=3)
    read_ok = torch.equal(got.cpu(), nxt)
    ctx.barrier()  # every read done before anyone overwrites a buffer
    links.link_copy(torch.full((n,), float(ctx.rank), device=ctx.device), buf.peers[(ctx.rank + 1) % w], programs=3)
    if ctx.device.type == "cuda":
        torch.cuda.synchronize(ctx.device)
    ctx.barrier()
    # rank r-1 wrote its rank number into this rank's buffer
    write_ok = bool((buf.tensor.cpu() == float((ctx.rank - 1) % w)).all())
    return {"read": read_ok, "write": write_ok}


def start_detached_sleeper(pid_file: str) -> None:
    """For tests/workbench/test_sandbox.py: start a process in a session of its own (as jupyter_client
    starts a kernel), write its pid, then hang."""
    import subprocess
    import sys

    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"], start_new_session=True)
    with open(pid_file, "w") as f:
        f.write(str(p.pid))
    time.sleep(300)


def origin(ctx, name: str) -> dict:
    """For tests/kernels/comm/test_ranks.py: this rank's parent process and the variable ``name`` as it sees it."""
    return {"ppid": os.getppid(), "value": os.environ.get(name)}


def torch_threads(ctx) -> int:
    """For tests/kernels/comm/test_ranks.py: the intra-op threads this rank's torch uses."""
    return torch.get_num_threads()


def cpu_symm_buffer(ctx) -> str:
    """For tests/kernels/comm/test_ranks.py: ask for a CPU symmetric buffer; the error it raises, if any."""
    from labkit.kernels.comm import symm

    try:
        symm.empty(64, torch.float32, device="cpu", scratch_dir=ctx.scratch_dir)
    except ValueError as e:
        return str(e)
    return "no error"


def check_each(ctx, cases, seed: int) -> list[dict]:
    """``experiments.check_algorithms`` for each (n, dtype name) of ``cases`` in this one world:
    a world of interpreted ranks takes longer to start than the checks take."""
    from labkit.labs.collectives import experiments

    return [r for n, dtype in cases for r in experiments.check_algorithms(ctx, n, dtype, seed)]


# --- the reliability review's rows (tests/bad_inputs.py) and their unit tests ------------------


def returns_a_lock(ctx):
    """A return value that cannot be pickled back to the launcher."""
    return threading.Lock()


def sleeps_then_returns(ctx, seconds: float) -> int:
    time.sleep(seconds)
    return ctx.rank


def float64_on_rank_0(ctx):
    """Rank 0 asks symm.empty for float64 (refused there), rank 1 for float32."""
    from labkit.kernels.comm import symm

    dtype = torch.float64 if ctx.rank == 0 else torch.float32
    return symm.empty(256, dtype, device=ctx.device, scratch_dir=ctx.scratch_dir).tensor.numel()


def rank_0_catches_its_error(ctx, n: int = 1024):
    """Rank 0's call fails its local check (an out of another length), it catches the error and
    returns; rank 1 makes the call (reliability 15 a)."""
    from labkit.kernels.comm import collectives as C
    from labkit.kernels.comm import symm

    buf = symm.empty(n, torch.float32, device=ctx.device, scratch_dir=ctx.scratch_dir)
    out = torch.empty(n // 2 if ctx.rank == 0 else n)
    try:
        C.all_reduce(buf, out, algorithm="one_shot")
    except (ValueError, TypeError) as e:
        return f"caught {type(e).__name__}: {e}"
    return "returned"


def last_rank_skips_a_call(ctx, n: int = 1024):
    """Every rank calls all_reduce twice, but the last rank only once (reliability 15 c)."""
    from labkit.kernels.comm import collectives as C
    from labkit.kernels.comm import symm

    buf = symm.empty(n, torch.float32, device=ctx.device, scratch_dir=ctx.scratch_dir)
    C.all_reduce(buf, algorithm="one_shot")
    if ctx.rank != ctx.world_size - 1:
        C.all_reduce(buf, algorithm="one_shot")
    return "done"
