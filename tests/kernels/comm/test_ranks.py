"""run_ranks: W ranks with torch.distributed up; values, failures and hangs per rank.

A spawned rank is a fresh interpreter that imports torch (seconds); without a GPU most ranks are
forks of one server instead. The CPU tests share a few launches: one W=4 run (spawned: its ``env``
must be set before the ranks import labkit) that several tests inspect, one failing run and one
hung run.
"""

import datetime
import os
import secrets
import time

import pytest
import rank_fns
import torch
import torch.distributed as dist

import labkit  # first: picks the tier
from labkit.kernels.comm.ranks import RankFailure, RanksResult, run_ranks
from labkit.workbench.errors import UsageError
from labkit.workbench.gates import HardwareUnavailable

#: under pytest-xdist (make test) every test of this file runs in one worker: the W=4 world of its module fixture
#: runs once, not once per worker
pytestmark = pytest.mark.xdist_group("ranks")

N = 1000  # numbers per rank in the all_reduce


def reference_sum(seed: int, world_size: int) -> torch.Tensor:
    return sum(rank_fns.inputs(seed, r, N).double() for r in range(world_size))


@pytest.fixture(scope="module")
def four_ranks():
    """One W=4 gloo run of rank_fns.report, with fresh random inputs."""
    seed = secrets.randbelow(2**31)
    # TRITON_INTERPRET=0 proves `env` is set before the rank imports labkit (which reads it).
    res = run_ranks(
        rank_fns.report, 4, seed, N, backend="gloo", timeout=60, env={"LABKIT_RANKS_PROBE": 42, "TRITON_INTERPRET": "0"}
    )
    return seed, res


def test_values_come_back_in_rank_order_with_each_ranks_context(four_ranks):
    _, res = four_ranks
    assert res.ok, res.summary() + "".join(r.stderr for r in res.results)
    values = res.unwrap()
    assert values == res.values and len(values) == 4 == res.world_size
    assert res.backend == "gloo"
    assert len({v["pid"] for v in values} | {os.getpid()}) == 5  # four processes of their own
    for rank, v in enumerate(values):
        assert (v["rank"], v["dist_rank"]) == (rank, rank)
        assert v["world_size"] == v["dist_world_size"] == 4
        assert (v["device"], v["backend"]) == ("cpu", "gloo")
        assert v["env"] == {
            "RANK": str(rank),
            "WORLD_SIZE": "4",
            "LOCAL_RANK": str(rank),
            "NCCL_NVLS_ENABLE": "0",
            "LABKIT_RANKS_PROBE": "42",
        }
        assert v["tier"] == ("gpu" if torch.cuda.is_available() else "cpu")
    assert res.summary().splitlines() == [r.summary() for r in res.results]
    assert res.summary().startswith("rank 0 ok (")


def test_all_reduce_in_the_ranks_matches_a_float64_reference(four_ranks):
    seed, res = four_ranks
    ref = reference_sum(seed, 4)
    for v in res.values:
        assert v["sum"].dtype == torch.float32
        torch.testing.assert_close(v["sum"].double(), ref, rtol=1e-5, atol=1e-5)


def test_scratch_dir_is_shared_by_the_ranks_and_removed_afterwards(four_ranks):
    _, res = four_ranks
    writer = res.values[0]["pid"]
    assert {v["scratch_dir"] for v in res.values} == {res.values[0]["scratch_dir"]}
    assert all(v["seen"] == f"written by pid {writer}" for v in res.values)
    assert not os.path.exists(res.values[0]["scratch_dir"])
    assert not os.path.exists(os.path.dirname(res.values[0]["scratch_dir"]))


def test_ranks_share_the_cores_unless_told_otherwise(monkeypatch):
    """Two ranks each taking every core made the ranks' host checks 85x slower (see
    ``rank_threads``): each rank gets its share; OMP_NUM_THREADS, where given, wins."""
    from labkit.kernels.comm import ranks

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    share = ranks.rank_threads(2)
    assert share == max(1, (os.cpu_count() or 1) // 2)
    assert run_ranks(rank_fns.torch_threads, 2, timeout=120).unwrap() == [share, share]
    # an explicit count wins (torch caps it at the cores, so pick one it can honour, other than share)
    given = 1 if share > 1 else min(2, os.cpu_count() or 1)
    assert (
        run_ranks(rank_fns.torch_threads, 2, timeout=120, env={"OMP_NUM_THREADS": str(given)}).unwrap() == [given] * 2
    )


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA GPU is visible: the ranks are spawned")
def test_without_a_gpu_the_ranks_are_forks_of_one_server_with_the_launchers_environment(monkeypatch):
    """The emulated world's ranks are forks of a server that imported torch once; each still sees
    the launcher's environment as it is at the call, not as it was when the server started."""
    from multiprocessing import forkserver

    from labkit.kernels.comm import ranks

    assert ranks.start_fork_server()
    monkeypatch.setenv("RANKS_ORIGIN_PROBE", secrets.token_hex(4))  # set after the server started
    server = forkserver._forkserver._forkserver_pid
    got = run_ranks(rank_fns.origin, 2, "RANKS_ORIGIN_PROBE", timeout=60).unwrap()
    assert got == [{"ppid": server, "value": os.environ["RANKS_ORIGIN_PROBE"]}] * 2
    assert server != os.getpid()


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA GPU is visible: the ranks are spawned")
def test_an_env_beyond_the_thread_count_is_spawned():
    """An ``env`` beyond OMP_NUM_THREADS must reach the rank before it imports torch: spawned."""
    from labkit.kernels.comm import ranks

    assert ranks.start_fork_server()
    assert ranks._start_method("cpu", None) == ranks._start_method("cpu", {"OMP_NUM_THREADS": "1"}) == "forkserver"
    assert ranks._start_method("cpu", {"LABKIT_RANKS_PROBE": "1"}) == "spawn"
    assert ranks._start_method("cuda", None) == "spawn"


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA GPU is visible: the ranks are spawned")
def test_a_changed_import_variable_starts_the_server_again(monkeypatch):
    """A variable read on import that changed since the server started: the server stops, and
    the world's ranks are forks of a new one that imported with the variable as it is now."""
    from multiprocessing import forkserver

    from labkit.kernels.comm import ranks

    assert ranks.start_fork_server()
    first = forkserver._forkserver._forkserver_pid
    monkeypatch.setenv("TRITON_RANKS_PROBE", "1")  # read by nothing, but named like what Triton reads
    got = run_ranks(rank_fns.origin, 2, "TRITON_RANKS_PROBE", timeout=120).unwrap()
    second = forkserver._forkserver._forkserver_pid
    assert second not in (None, first) and got == [{"ppid": second, "value": "1"}] * 2
    assert ranks._server_env["TRITON_RANKS_PROBE"] == "1"
    # while a world of this process runs, its server stays: a changed variable spawns instead
    monkeypatch.setattr(ranks, "_worlds_running", 1)
    monkeypatch.delenv("TRITON_RANKS_PROBE")
    assert ranks._start_method("cpu", None) == "spawn" and forkserver._forkserver._forkserver_pid == second


def test_every_variable_labkit_reads_on_import_keeps_ranks_from_a_stale_fork():
    """A LABKIT_* variable read at a module's top level (a constant fixed on import) is one the
    fork server's ranks would see as it was when the server imported labkit: ``_IMPORT_ENV``
    names each, so a change of one makes the ranks spawned."""
    import ast
    from pathlib import Path

    from labkit.kernels.comm import ranks

    found = set()
    for path in Path(labkit.__file__).parent.rglob("*.py"):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                continue
            text = ast.unparse(node)
            if "environ" in text or "getenv" in text:
                found |= {
                    (path.name, c.value)
                    for c in ast.walk(node)
                    if isinstance(c, ast.Constant) and isinstance(c.value, str) and c.value.startswith("LABKIT_")
                }
    assert {name for _, name in found} >= {"LABKIT_SCALAR_SIGNALS", "LABKIT_FAST_LAUNCH"}  # the scan sees them
    assert [f for f in found if not f[1].startswith(ranks._IMPORT_ENV)] == []


def test_cpu_symmetric_buffers_are_refused_outside_the_interpreter():
    """An emulated world (gloo ranks, CPU tensors) with compiled kernels, e.g. 2 ranks where one
    GPU is visible: the buffer is refused naming ``device``, not launched into a Triton error."""
    got = run_ranks(rank_fns.cpu_symm_buffer, 2, backend="gloo", timeout=120, env={"TRITON_INTERPRET": "0"}).unwrap()
    assert all(m.startswith("device=cpu: CPU symmetric buffers belong to the emulated world") for m in got), got


def test_a_rank_that_raises_is_reported_and_the_others_are_aborted_at_once():
    t0 = time.monotonic()
    res = run_ranks(rank_fns.raise_on_rank, 2, 1, 60.0, timeout=60)
    assert time.monotonic() - t0 < 30  # rank 0 was killed, not waited for (it sleeps 60 s)
    bad, other = res.results[1], res.results[0]
    assert bad.status == "exception"
    assert bad.error_type == "builtins.ValueError"
    assert bad.message == "planted failure on rank 1"
    assert "raise_on_rank" in bad.traceback and "ValueError" in bad.traceback
    assert other.status in ("ok", "aborted")
    if other.status == "aborted":
        assert "rank 1" in other.message
    assert not res.ok and res.values[1] is None
    assert res.first_failure is bad
    with pytest.raises(RankFailure, match=r"rank 1 exception: builtins.ValueError: planted") as e:
        res.unwrap()
    assert "planted failure on rank 1" in str(e.value)  # with the rank's traceback
    assert e.value.result is res and isinstance(e.value, RuntimeError)


def test_a_hung_rank_becomes_a_timeout_and_the_run_ends_soon_after():
    t0 = time.monotonic()
    res = run_ranks(rank_fns.spin_on_missing_peer, 2, 60.0, timeout=8)
    took = time.monotonic() - t0
    assert 8 <= took < 30, (took, res.summary())
    assert res.results[0].status == "ok" and res.values[0] == "rank 0 done"
    hung = res.results[1]
    assert hung.status == "timeout" and hung.value is None
    assert "did not finish within 8 s" in hung.summary()
    assert hung.where == "fn"  # what it was doing when killed: its fn, no collective call
    with pytest.raises(RankFailure, match=r"rank 1 did not finish within 8 s, in fn \(hung\?"):
        res.unwrap()


@pytest.mark.parametrize(
    "bad, name",
    [
        ({"world_size": 0}, "world_size"),
        ({"world_size": "2"}, "world_size"),
        ({"world_size": 1.5}, "world_size"),
        ({"world_size": True}, "world_size"),
        ({"timeout": 0}, "timeout"),
        ({"timeout": -1.0}, "timeout"),
        ({"backend": "mpi"}, "backend"),
        ({"env": ["X=1"]}, "env"),
        ({"fn": lambda ctx: 1}, "lambda"),
        ({"fn": "rank_fns"}, "module:function"),
        ({"fn": "rank_fns:no_such_function"}, "no_such_function"),
    ],
)
def test_bad_input_is_refused_before_any_process_starts(monkeypatch, bad, name):
    def no_spawn(*a, **k):
        raise AssertionError("a process was about to start")

    monkeypatch.setattr(torch.multiprocessing, "get_context", no_spawn)
    call = {"fn": rank_fns.report, "world_size": 2, **bad}
    fn, world_size = call.pop("fn"), call.pop("world_size")
    with pytest.raises(UsageError, match=name):
        run_ranks(fn, world_size, 0, N, **call)


def test_unpicklable_arguments_and_too_few_gpus_are_refused(monkeypatch):
    monkeypatch.setattr(torch.multiprocessing, "get_context", None)
    with pytest.raises(UsageError, match="cannot be pickled"):
        run_ranks(rank_fns.report, 2, lambda: 0, N)
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    with pytest.raises(HardwareUnavailable, match=f"world_size={gpus + 1}, this machine has {gpus}"):
        run_ranks(rank_fns.report, gpus + 1, 0, N, backend="nccl")


@pytest.mark.multigpu
def test_two_gpu_ranks_all_reduce_over_nccl():
    seed = secrets.randbelow(2**31)
    res = run_ranks(rank_fns.report, 2, seed, N, timeout=120)
    assert isinstance(res, RanksResult) and res.backend == "nccl"
    values = res.unwrap()
    assert [v["device"] for v in values] == ["cuda:0", "cuda:1"]
    ref = reference_sum(seed, 2)
    for v in values:
        torch.testing.assert_close(v["sum"].double(), ref, rtol=1e-5, atol=1e-5)


def test_rank_zero_keeps_the_store_until_every_rank_has_counted_itself_in(monkeypatch):
    """Rank 0 hosts the TCP store; leaving before a peer's init has returned closes the store under
    that peer ("Failed to recv"): a fn that needs no collective can end a world that way under load."""
    import threading

    from labkit.kernels.comm import rank_main

    store = dist.TCPStore("127.0.0.1", 0, 1, True, timeout=datetime.timedelta(seconds=10))
    monkeypatch.setattr(dist.distributed_c10d, "_get_default_store", lambda: store)
    store.add(rank_main._INITIALIZED_KEY, 1)  # rank 0 is in; rank 1 counts itself in 0.3 s later
    threading.Timer(0.3, lambda: store.add(rank_main._INITIALIZED_KEY, 1)).start()
    start = time.monotonic()
    rank_main._hold_the_store(2, timeout=10)
    assert 0.25 < time.monotonic() - start < 5
    start = time.monotonic()
    rank_main._hold_the_store(3, timeout=0.2)  # a rank that never counts itself in: bounded by the timeout
    assert 0.15 < time.monotonic() - start < 2


def test_first_failure_is_the_earliest_rank_that_failed_on_its_own():
    """An aborted rank is a consequence, even when it was marked first; None when all returned."""
    from labkit.kernels.comm.ranks import RankResult

    aborted = RankResult(0, "aborted", seconds=1.0)
    crashed = RankResult(1, "signal", seconds=2.0, signal="SIGSEGV")
    later = RankResult(2, "exception", seconds=3.0)
    res = RanksResult([aborted, crashed, later], 3.0, 3)
    assert res.first_failure is crashed
    assert RanksResult([RankResult(0, "ok")], 1.0, 1).first_failure is None


def test_a_world_whose_rendezvous_port_was_taken_starts_once_more(monkeypatch):
    """The port is free when chosen and bound by rank 0 seconds later; another process taking it
    in between fails every rank in init_process_group, before ``fn`` runs: the world starts once
    more on another port. The same error naming another port (``fn``'s own) is ``fn``'s result."""
    from labkit.kernels.comm import ranks as R

    def world(port, message):
        failed = R.RankResult(0, "exception", error_type="torch.distributed.DistNetworkError", message=message)
        return R.RanksResult([failed, R.RankResult(1, "aborted")], 1.0, 2), port

    taken = "The server socket has failed to listen ... port: {}, useIpv6: false, code: -98, name: EADDRINUSE"
    starts = []

    def run_world(**kw):
        starts.append(kw["world_size"])
        if len(starts) == 1:
            return world(37005, taken.format(37005))
        return R.RanksResult([R.RankResult(0, "ok", value=1), R.RankResult(1, "ok", value=2)], 1.0, 2), 21000

    monkeypatch.setattr(R, "_run_world", run_world)
    assert run_ranks(rank_fns.__name__ + ":torch_threads", 2).unwrap() == [1, 2] and starts == [2, 2]
    starts.clear()
    monkeypatch.setattr(R, "_run_world", lambda **kw: starts.append(1) or world(37005, taken.format(40000)))
    res = run_ranks(rank_fns.__name__ + ":torch_threads", 2)
    assert starts == [1] and res.results[0].status == "exception"
    starts.clear()
    monkeypatch.setattr(R, "_run_world", lambda **kw: starts.append(1) or world(37005, taken.format(37005)))
    assert run_ranks(rank_fns.__name__ + ":torch_threads", 2).results[0].status == "exception"
    assert starts == [1, 1]  # once more, not again and again


def test_rendezvous_ports_are_drawn_below_the_ephemeral_range():
    from labkit.kernels.comm import ranks as R

    ports = {R._free_port() for _ in range(5)}
    assert all(20000 <= p < 32768 for p in ports)


# --- the reliability review: world sizes, start-up, timeout lines, messages, SIGTERM ----------


def test_a_world_larger_than_four_ranks_per_core_is_refused_before_any_process_starts(monkeypatch):
    """``run_ranks(fn, 10**6, timeout=5)`` started interpreters one after another for minutes."""
    from labkit.kernels.comm import ranks

    monkeypatch.setattr(torch.multiprocessing, "get_context", None)
    monkeypatch.setattr(ranks.os, "cpu_count", lambda: 2)
    for size in (9, 10**6):
        with pytest.raises(UsageError, match=rf"world_size={size}: at most 8 ranks on this machine's 2 CPU cores"):
            run_ranks(rank_fns.report, size, 0, N, backend="gloo")


def test_the_timeout_covers_the_start_up(monkeypatch):
    """Ranks still to start when the timeout passes are never started, and said so."""
    from labkit.kernels.comm import ranks

    real = ranks._rank_env

    def slow_env(*a, **k):  # each rank's start takes 0.6 s
        time.sleep(0.6)
        return real(*a, **k)

    monkeypatch.setattr(ranks, "_rank_env", slow_env)
    t0 = time.monotonic()
    res = run_ranks(rank_fns.sleeps_then_returns, 4, 0.0, timeout=1.0)
    assert time.monotonic() - t0 < 10, res.summary()
    assert [r.status for r in res.results][2:] == ["timeout", "timeout"], res.summary()
    assert "never started: starting the ranks before it took the whole timeout (1 s)" in res.results[3].message


@pytest.mark.parametrize(
    "where, says",
    [
        (None, "did not start within 5 s (still importing"),
        ("starting", "did not start within 5 s (still importing"),
        ("init_process_group", "did not start within 5 s: still in init_process_group"),
        ("fn", "did not finish within 5 s, in fn (hung?"),
        ("all_reduce (one_shot), call 3", "did not finish within 5 s, in all_reduce (one_shot), call 3 (hung?"),
    ],
)
def test_the_timeout_line_says_what_the_rank_was_doing(where, says):
    from labkit.kernels.comm.ranks import _timeout_message

    assert _timeout_message(where, 5.0).startswith(says)


def test_an_unpicklable_return_value_is_said_to_be_the_return_value():
    res = run_ranks(rank_fns.returns_a_lock, 2, timeout=60)
    for r in res.results:
        assert r.status == "exception" and r.error_type == "labkit.workbench.sandbox.ResultNotPicklable", r
        assert r.message.startswith("rank_fns.returns_a_lock returned normally, but its return value (a _thread.lock)")


def test_a_rank_whose_peer_failed_first_is_aborted_naming_the_peers_error():
    """Rank 1 reported gloo's "Connection closed by peer ... GLHF!" as its own exception."""
    res = run_ranks(rank_fns.float64_on_rank_0, 2, timeout=60)
    cause, victim = res.results
    assert cause.status == "exception" and "dtype: torch.float64" in cause.message
    assert res.first_failure is cause
    if victim.status != "ok":  # it may have been killed before its own error
        assert victim.status == "aborted", victim
        assert "rank 0 failed first (exception: builtins.TypeError: dtype: torch.float64" in victim.message


def test_peer_lost_errors_are_told_from_a_ranks_own():
    from labkit.kernels.comm.ranks import _first_failed, _peer_lost

    gone = {"status": "exception", "message": "[pair.cc:553] Connection closed by peer [127.0.0.1]:1"}
    own = {"status": "exception", "message": "dtype: torch.float64 is not supported"}
    assert _peer_lost(gone) and not _peer_lost(own) and not _peer_lost(None)
    assert _first_failed([None, None], {}, {0: gone, 1: own}) == 1
    assert _first_failed([None, None], {}, {0: gone}) == 0
    assert _first_failed([None, None], {}, {0: {"status": "ok"}}) is None


def test_sigterm_raises_while_run_ranks_runs_and_the_previous_handler_comes_back():
    import signal

    from labkit.kernels.comm import ranks

    def mine(signum, frame):
        pass

    previous = signal.signal(signal.SIGTERM, mine)
    try:
        with ranks._removing_on_sigterm():
            installed = signal.getsignal(signal.SIGTERM)
        assert installed is not mine and callable(installed)
        with pytest.raises(ranks.Terminated):
            installed(signal.SIGTERM, None)
        assert signal.getsignal(signal.SIGTERM) is mine
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        with ranks._removing_on_sigterm():  # an ignored SIGTERM stays ignored
            assert signal.getsignal(signal.SIGTERM) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGTERM, previous)
