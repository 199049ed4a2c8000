"""Run a function on W ranks (processes) with torch.distributed set up, and say what each did.

    def all_sum(ctx, n):              # in a module, not in the notebook: each rank imports it
        x = torch.full((n,), float(ctx.rank + 1), device=ctx.device)
        torch.distributed.all_reduce(x)
        return x.tolist()

    res = run_ranks(all_sum, 2, 4, timeout=60)
    print(res.summary())              # one line per rank: "rank 0 ok (3.2 s)", ...
    res.unwrap()                      # [[3.0, 3.0, 3.0, 3.0], [3.0, ...]], or raises RankFailure

Backend and device: NCCL with ``cuda:<rank>`` on the GPU tier when there is a GPU per rank, else
gloo on the CPU. A rank's status is one of the sandbox's (``ok``, ``exception``,
``illegal_memory_access``, ``cuda_error``, ``signal``, ``exit``, ``timeout``) or ``aborted``:
killed by the launcher because another rank failed first. Without that, the survivors would sit
in their next collective, waiting for the dead peer, until the timeout.

How it works, and why:

* ranks are ``torch.multiprocessing`` *spawn* processes: fresh interpreters, because a fork of a
  process that touched CUDA cannot use CUDA. Each rank imports ``fn`` by name, so ``fn`` must be
  a module-level function (or "module:function"), not a lambda or a function defined in the
  notebook. From a *script*, spawn also re-runs the script's top-level code in every rank: guard
  it with ``if __name__ == "__main__":``. A notebook needs no guard.
* on a machine without a CUDA GPU (the emulated world: gloo ranks on CPU tensors) the ranks are
  *forkserver* processes instead: one server per launching process imports torch and labkit once
  (``_PRELOAD``), and every rank is a fork of it, a fresh process that starts in a fraction of a
  second where a spawned one takes seconds to import torch (``start_fork_server`` starts the
  server ahead of the first world). The server never touches CUDA; the one thread it holds
  besides its own is numpy's OpenBLAS pool, which OpenBLAS stops and restarts around a fork.
  A rank gets the launcher's environment of the moment, as a spawned one does, and the server is
  started again when a variable that torch, Triton or labkit read when imported (``_IMPORT_ENV``)
  changed since it started. What a fork cannot honour is spawned (``_start_method``): an ``env``
  naming more than OMP_NUM_THREADS (it must be set before the rank imports labkit or torch).
* each rank sets its environment before it imports labkit or torch (see ``_BOOTSTRAP``), runs in
  its own session so that the launcher can kill it with everything it started, and exits by
  itself if the launcher dies (a kernel restart).
* each rank leaves its outcome in a pickle file, so a rank that was killed or crashed (no file)
  is told apart from one that returned. Its stdout/stderr go to files as well, kept (tails) in
  the result: a notebook never shows what a child writes to its file descriptors.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import multiprocessing
import multiprocessing.connection
import numbers
import os
import pickle
import shutil
import signal as _signal
import socket
import tempfile
import threading
import time
from collections.abc import Callable

import torch
import torch.distributed as dist
import torch.multiprocessing

import labkit
from labkit.kernels.comm.rank_results import (  # noqa: F401  (re-exported: the public names and the tests' helpers)
    _HANG_HINT,
    _PEER_LOST,
    STATUSES,
    RankFailure,
    RankResult,
    RanksResult,
    _first_failed,
    _load_payload,
    _name_the_first_failure,
    _never_started,
    _peer_lost,
    _rank_result,
    _read_where,
    _result_path,
    _timeout_message,
    _where_path,
    note_call,
)
from labkit.workbench.errors import UsageError
from labkit.workbench.gates import HardwareUnavailable
from labkit.workbench.sandbox import SandboxError, _target

_POLL_S = 0.1  # how often the launcher looks for result files between exits
_TEARDOWN_S = 5.0  # how long a rank that has left its result may take to exit

# The first code a rank runs. Had the spawn target been a function of labkit, spawn would import
# labkit (and torch) to find it, and labkit reads TRITON_INTERPRET and probes CUDA (which fixes
# CUDA_VISIBLE_DEVICES) on import: too early to apply the caller's `env`. So the target is the
# builtin exec of this stub, which sets the session and environment first, then imports labkit.
# A forkserver rank starts from the server's environment: BASE, the launcher's environment of the
# moment, replaces it first (None for a spawned rank, which inherits it).
_BOOTSTRAP = """\
import os
os.setsid()
if BASE is not None:
    os.environ.clear()
    os.environ.update(BASE)
os.environ.update(ENV)
from labkit.kernels.comm.rank_main import rank_main
rank_main(CALL)
"""

#: what the fork server imports before it forks any rank: torch, torch.distributed and labkit
#: (through this module), and the collectives' Triton kernels
_PRELOAD = ("labkit.kernels.comm.ranks", "labkit.kernels.comm.rank_main", "labkit.kernels.comm.collectives")

#: the environment variables that torch, Triton, OpenMP or labkit read when imported, by prefix
#: (TRITON_INTERPRET, CUDA_VISIBLE_DEVICES, ...) and labkit's by name (those its modules read at
#: import; tests/kernels/comm/test_ranks.py finds them): a forked rank has them as the server had them
_IMPORT_ENV = (
    "TRITON_",
    "TORCH",
    "PYTORCH_",
    "CUDA_",
    "NCCL_",
    "NVSHMEM_",
    "GLOO_",
    "OMP_",
    "KMP_",
    "GOMP_",
    "MKL_",
    "OPENBLAS_",
    "LD_",
    "PYTHON",
    "LABKIT_SCALAR_SIGNALS",
    "LABKIT_FAST_LAUNCH",
    "LABKIT_DIRECT_LAUNCH",
    "LABKIT_GRAPH_LAUNCH",
    "LABKIT_PLAN_CACHE",
)

#: the import-time environment of the fork server this process started (None: not started)
_server_env: dict | None = None
#: forkserver worlds of this process now running, and the lock over both
_worlds_running = 0
_server_lock = threading.Lock()


@dataclasses.dataclass
class RankContext:
    """What each rank's function receives as its first argument."""

    rank: int
    world_size: int
    device: torch.device  # cuda:<rank> with nccl, cpu with gloo
    backend: str  # "nccl" or "gloo"
    scratch_dir: str  # shared by all ranks of this run; removed by the launcher afterwards

    def barrier(self) -> None:
        """Wait until every rank gets here (torch.distributed.barrier)."""
        if self.backend == "nccl":  # NCCL runs the barrier on a GPU: name ours, never guess
            dist.barrier(device_ids=[self.device.index])
        else:
            dist.barrier()


def start_fork_server() -> bool:
    """Start the fork server now, where ``run_ranks`` forks its ranks (no CUDA GPU visible), so
    that it imports torch and labkit while the caller goes on: the first world then starts at
    once. Returns True if this process forks its ranks (the server is up or starting), False if
    it spawns them (nothing started). Calling it again does no more."""
    if _start_method("cpu", None) != "forkserver":
        return False
    from multiprocessing import forkserver

    forkserver.ensure_running()  # starts the server process and returns; the server imports in the background
    return True


def run_ranks(
    fn: Callable | str,
    world_size: int,
    *args,
    timeout: float = 120.0,
    backend: str = "auto",
    env: dict | None = None,
    **kwargs,
) -> RanksResult:
    """Call ``fn(ctx, *args, **kwargs)`` on ranks 0..world_size-1; never raises for what they do.

    fn:         a module-level function or "module:function"; args, kwargs and return values
                travel by pickle. ``ctx`` is a :class:`RankContext`.
    world_size: at most ``RANKS_PER_CORE`` (4) ranks per CPU core with gloo, one GPU per rank
                with nccl; a larger world is refused before any process starts.
    timeout:    seconds for the whole run, process start-up included (a torch rank takes a few
                seconds to start; ranks not started by then never are); ranks still running then
                are killed and marked "timeout", each line saying what the rank was doing
                (``RankResult.where``: starting, in init_process_group, in fn, or the collective
                call it was in, ``note_call``).
    backend:    "auto" (nccl on the GPU tier with a GPU per rank, else gloo), "nccl" or "gloo".
    env:        extra environment variables for every rank, set before it imports labkit or
                torch; the rank variables (RANK, MASTER_PORT, ...) and labkit's multicast-off
                variables take precedence. Unless this or the caller's environment sets
                OMP_NUM_THREADS, each rank gets ``rank_threads(world_size)`` (the cores shared out).
    If one rank fails, the others are killed at once and marked "aborted", naming that rank and
    its error (so is a rank whose own error only says its peer is gone: gloo's "Connection closed
    by peer"). A return value that cannot be pickled is reported as such
    (``labkit.workbench.sandbox.ResultNotPicklable``). While it runs in the main thread, SIGTERM
    raises in the launcher, so that the ranks are killed and their folder (``labkit-ranks-*``)
    removed before the process ends as SIGTERM ends it; ranks whose launcher died (SIGKILL)
    remove the folder as they exit.
    """
    _check_arguments(world_size, timeout, env)
    module, qualname = _check_fn(fn)
    world_size = int(world_size)
    backend, device_type = _choose_backend(backend, world_size)
    _check_world_size(world_size, device_type)
    try:
        call_args = pickle.dumps((args, kwargs))
    except (pickle.PicklingError, TypeError, AttributeError) as e:
        raise UsageError(f"the arguments of {module}:{qualname} cannot be pickled: {e}") from None
    world = dict(
        fn_call=(module, qualname, call_args),
        world_size=world_size,
        backend=backend,
        device_type=device_type,
        timeout=timeout,
        env=env,
    )
    with _removing_on_sigterm():
        result, port = _run_world(**world)
        if _port_taken(result, port):
            # the rendezvous port was free when chosen and taken before rank 0 bound it: no rank ran
            # ``fn`` yet (each failed in init_process_group), so the world starts once more on another
            result, _ = _run_world(**world)
    return result


class Terminated(BaseException):
    """SIGTERM reached the launcher while ``run_ranks`` ran (``_removing_on_sigterm``)."""


@contextlib.contextmanager
def _removing_on_sigterm():
    """While ``run_ranks`` runs in the main thread: SIGTERM raises ``Terminated``, so that the
    world's ``finally`` kills the ranks and removes their folder (``labkit-ranks-*``), which the
    default SIGTERM (exit at once) would leave behind; the previous handler is restored after.
    Another thread cannot install a handler: there, the default stays."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def raise_terminated(signum, frame):
        raise Terminated(f"run_ranks: the launcher got {_signal.Signals(signum).name}")

    try:
        previous = _signal.getsignal(_signal.SIGTERM)
        if previous is _signal.SIG_IGN:  # the caller ignores SIGTERM: so does the world
            previous = None
        else:
            _signal.signal(_signal.SIGTERM, raise_terminated)
    except (ValueError, OSError):  # no signals here (an embedded interpreter)
        previous = None
    if previous is None:
        yield
        return
    try:
        yield
    except Terminated:
        # the ranks are gone and their folder removed: now what SIGTERM would have done
        _signal.signal(_signal.SIGTERM, previous)
        os.kill(os.getpid(), _signal.SIGTERM)
        raise
    finally:
        _signal.signal(_signal.SIGTERM, previous)


def _port_taken(result: RanksResult, port: int) -> bool:
    """Whether a world failed because rank 0 could not listen on its rendezvous ``port``."""
    return any(
        r.status == "exception"
        and "DistNetworkError" in (r.error_type or "")
        and "EADDRINUSE" in (r.message or "")
        and f"port: {port}," in (r.message or "")
        for r in result.results
    )


def _run_world(
    fn_call: tuple, world_size: int, backend: str, device_type: str, timeout: float, env
) -> tuple[RanksResult, int]:
    """One start of ``run_ranks``' world on a freshly chosen rendezvous port (its arguments,
    checked); returns the result and the port."""
    module, qualname, call_args = fn_call
    run_dir = tempfile.mkdtemp(prefix="labkit-ranks-")
    scratch_dir = os.path.join(run_dir, "scratch")
    os.mkdir(scratch_dir)
    port = _free_port()
    procs: list = []
    method = "spawn"
    try:
        method = _start_method(device_type, env, claim=True)
        context = torch.multiprocessing.get_context(method)
        base = dict(os.environ) if method == "forkserver" else None
        start = time.monotonic()
        deadline = start + timeout
        for rank in range(world_size):
            if time.monotonic() >= deadline:  # the timeout covers the start-up too
                break
            call = {
                "rank": rank,
                "world_size": world_size,
                "backend": backend,
                "device_type": device_type,
                "scratch_dir": scratch_dir,
                "run_dir": run_dir,
                "module": module,
                "qualname": qualname,
                "args": call_args,
                "timeout": timeout,
            }
            bootstrap = {"ENV": _rank_env(rank, world_size, port, env), "CALL": call, "BASE": base}
            proc = context.Process(target=exec, args=(_BOOTSTRAP, bootstrap), name=f"labkit-rank{rank}")
            proc.start()
            procs.append(proc)
        ended, first_failed = _watch(procs, run_dir, start, deadline)
        killed_at = time.monotonic() - start
        _kill_all(procs)
        results = [
            _rank_result(rank, proc, run_dir, ended.get(rank, killed_at), rank in ended, first_failed, timeout)
            for rank, proc in enumerate(procs)
        ]
        results += [_never_started(rank, killed_at, timeout) for rank in range(len(procs), world_size)]
        if first_failed is not None:
            results = _name_the_first_failure(results, first_failed)
        return RanksResult(results, time.monotonic() - start, world_size, backend, float(timeout)), port
    finally:
        _kill_all(procs)  # also on KeyboardInterrupt in the notebook: no rank outlives the call
        shutil.rmtree(run_dir, ignore_errors=True)
        if method == "forkserver":
            _world_ended()


# --- the launcher's side -------------------------------------------------------------------


def _check_fn(fn: Callable | str) -> tuple[str, str]:
    """(module, qualname) of fn, checked here so a bad fn fails before any process starts."""
    try:
        module, qualname = _target(fn)
    except SandboxError as e:
        raise UsageError(str(e)) from None
    try:
        obj = importlib.import_module(module)
        for part in qualname.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError) as e:
        raise UsageError(f"fn={module}:{qualname}: cannot be imported by name ({e})") from None
    if not callable(obj):
        raise UsageError(f"fn={module}:{qualname}: not callable")
    return module, qualname


def _check_arguments(world_size, timeout, env) -> None:
    if isinstance(world_size, bool) or not isinstance(world_size, numbers.Integral) or world_size < 1:
        raise UsageError(f"world_size={world_size!r}: expected an int >= 1 (the number of ranks)")
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 0 < timeout < float("inf"):
        raise UsageError(f"timeout={timeout!r}: expected a positive number of seconds")
    if env is not None and not (isinstance(env, dict) and all(isinstance(k, str) for k in env)):
        raise UsageError(f"env={env!r}: expected a dict of environment variable names to values")


#: ranks per CPU core an emulated world may have: beyond it a world takes minutes to start and
#: its ranks fight for the cores (every rank is a process with torch in it)
RANKS_PER_CORE = 4


def _check_world_size(world_size: int, device_type: str) -> None:
    """At most ``RANKS_PER_CORE`` ranks per CPU core on the CPU (NCCL's one GPU per rank is
    ``_choose_backend``'s)."""
    cores = os.cpu_count() or 1
    if device_type == "cpu" and world_size > RANKS_PER_CORE * cores:
        raise UsageError(
            f"world_size={world_size}: at most {RANKS_PER_CORE * cores} ranks on this machine's {cores} CPU "
            f"core{'s' if cores != 1 else ''} ({RANKS_PER_CORE} per core: each rank is a process with torch)"
        )


def _choose_backend(backend: str, world_size: int) -> tuple[str, str]:
    """(backend, device type): NCCL with a GPU per rank, or gloo with CPU tensors."""
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if backend == "auto":
        # The interpreter tier computes on CPU tensors even where GPUs exist: gloo there.
        backend = "nccl" if labkit.TIER == "gpu" and world_size <= gpus else "gloo"
    elif backend == "nccl":
        if world_size > gpus:
            raise HardwareUnavailable(
                f"backend='nccl' needs one CUDA GPU per rank: world_size={world_size}, this machine has {gpus}"
            )
    elif backend != "gloo":
        raise UsageError(f"backend={backend!r}: expected 'auto', 'nccl' or 'gloo'")
    return backend, ("cuda" if backend == "nccl" else "cpu")


def _import_env(environ) -> dict:
    return {k: v for k, v in environ.items() if k.startswith(_IMPORT_ENV) and k != "OMP_NUM_THREADS"}


def _start_method(device_type: str, env: dict | None, claim: bool = False) -> str:
    """ "forkserver" where a fork of the preloaded server gives the rank spawn would, else "spawn";
    ``claim``: a world is about to start its ranks so (counted until ``_world_ended``).

    Forks only where no CUDA GPU is visible (a process that probed CUDA must not fork, and CPU
    ranks on a GPU machine may still use the GPU) and only for an ``env`` of at most
    OMP_NUM_THREADS (applied after the fork, ``rank_main.rank_main``). The server imports with the
    ``_IMPORT_ENV`` variables of the moment it starts (this process starts it at its first
    forkserver world); when one of them has changed since (torch sets TORCHINDUCTOR_CACHE_DIR
    when inductor first runs, a test sets one), the server is stopped, and the world starts a new
    one that imports with them as they are now. Spawned instead: while a forkserver world of this
    process is still running (another thread's: stopping its server would lose its ranks' exit
    reports), or where this Python's forkserver cannot be stopped."""
    global _server_env, _worlds_running
    if (
        device_type != "cpu"
        or torch.cuda.is_available()
        or "forkserver" not in multiprocessing.get_all_start_methods()
        or set(env or ()) - {"OMP_NUM_THREADS"}
    ):
        return "spawn"
    from multiprocessing import forkserver

    server = forkserver._forkserver
    now = _import_env(os.environ)
    with _server_lock:
        if _server_env is None:
            if getattr(server, "_forkserver_address", None) is not None:
                return "spawn"  # a server someone else started: what it imported is unknown
            forkserver.set_forkserver_preload(list(_PRELOAD))
            _server_env = now
        elif now != _server_env:
            if _worlds_running or not hasattr(server, "_stop"):
                return "spawn"
            try:
                server._stop()  # CPython's own (its tests use it): closes the server's pipe, waits for it to exit
            except OSError:  # already gone and reaped elsewhere: spawn rather than guess its state
                return "spawn"
            _server_env = now
        _worlds_running += claim
        return "forkserver"


def _world_ended() -> None:
    global _worlds_running
    with _server_lock:
        _worlds_running -= 1


#: where rendezvous ports are drawn from: below Linux's ephemeral range (32768-60999 by default),
#: which the kernel hands out to every outgoing connection in the meantime
_PORTS = range(20000, 32768)


def _free_port() -> int:
    """A port free now; rank 0 binds it a few seconds later. Another process may take it in
    between (then ``run_ranks`` starts the world once more): drawn at random below the ephemeral
    range, where no outgoing connection is given it, else any port the kernel offers."""
    import random

    for port in random.sample(_PORTS, 20):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rank_threads(world_size: int) -> int:
    """CPU threads for each rank's torch ops: the machine's cores shared out among the ranks.
    Left to torch, every rank takes all the cores: two ranks on 2 cores made a 64K-element fp64
    check 85 times slower (101 against 1.2 ms) as their threads fought for the cores."""
    return max(1, (os.cpu_count() or 1) // world_size)


def _rank_env(rank: int, world_size: int, port: int, env: dict | None) -> dict[str, str]:
    out = {k: str(v) for k, v in (env or {}).items()}
    if "OMP_NUM_THREADS" not in out and "OMP_NUM_THREADS" not in os.environ:
        out["OMP_NUM_THREADS"] = str(rank_threads(world_size))  # read by torch when the rank imports it
    out.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        RANK=str(rank),
        WORLD_SIZE=str(world_size),
        LOCAL_RANK=str(rank),
        LOCAL_WORLD_SIZE=str(world_size),
    )
    out.update(labkit.MULTICAST_OFF)
    return out


def _watch(procs: list, run_dir: str, start: float, deadline: float) -> tuple[dict, int | None]:
    """Wait until every rank is done, one has failed, or the deadline has passed.

    Returns ({rank: seconds when it exited}, the first rank seen to fail or None). A rank fails
    when it leaves a result that is not "ok", or exits without leaving one.
    """
    ended: dict[int, float] = {}
    payloads: dict[int, dict] = {}
    all_results_since = None
    while len(ended) < len(procs) and time.monotonic() < deadline:
        waiting = {p.sentinel: rank for rank, p in enumerate(procs) if rank not in ended}
        wait_s = min(_POLL_S, max(0.0, deadline - time.monotonic()))
        for sentinel in multiprocessing.connection.wait(list(waiting), timeout=wait_s):
            ended[waiting[sentinel]] = time.monotonic() - start
        for rank in range(len(procs)):  # a rank writes its file before it exits
            if rank not in payloads and (p := _load_payload(run_dir, rank)) is not None:
                payloads[rank] = p
        first = _first_failed(procs, ended, payloads)
        if first is not None:
            return ended, first
        # Every rank has returned, but one is still leaving (destroy_process_group can block
        # when a peer is gone): its result is safe, so wait a little, then kill it.
        if len(payloads) == len(procs):
            all_results_since = all_results_since or time.monotonic()
            if time.monotonic() - all_results_since > _TEARDOWN_S:
                break
    return ended, None


def _kill_all(procs: list) -> None:
    """SIGKILL every rank's session (the rank and what it started), then reap the ranks."""
    for proc in procs:
        if proc.exitcode is None:  # not reaped yet, so its pid (= its group id) is still its own
            try:
                os.killpg(proc.pid, _signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            proc.kill()  # a rank that has not reached its os.setsid() yet is in our group
    for proc in procs:
        proc.join()
