"""The sandbox: each failure kind is classified, the parent survives, hangs become timeouts."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import labkit
from labkit.workbench import sandbox
from labkit.workbench.sandbox import SandboxError, classify, run_isolated


def test_returns_value_from_child():
    res = run_isolated(os.getpid)
    assert res.status == "ok" and res.ok
    assert isinstance(res.value, int) and res.value != os.getpid()


def test_python_exception_is_classified_with_type_and_message():
    res = run_isolated("labkit.labs.start_here.experiments:raises_python_error")
    assert res.status == "exception"
    assert res.error_type == "builtins.ValueError"
    assert "raised on purpose" in res.message
    assert "raises_python_error" in res.traceback
    with pytest.raises(RuntimeError, match="raised on purpose"):
        res.unwrap()


def test_abort_is_a_signal_and_parent_survives():
    res = run_isolated(os.abort)
    assert res.status == "signal"
    assert res.signal == "SIGABRT"
    assert res.returncode == -signal.SIGABRT
    assert torch.ones(3).sum().item() == 3.0  # the parent still computes


def test_hang_becomes_timeout_and_group_is_killed():
    t0 = time.monotonic()
    res = run_isolated("labkit.labs.start_here.experiments:spin_forever", timeout=2)
    assert res.status == "timeout"
    assert 2 <= time.monotonic() - t0 < 30
    assert "hung" in res.summary()


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc (Linux)")
def test_a_parent_stopped_by_sigterm_takes_its_child_along():
    """`timeout` or a scheduler stopping `labkit run` must not leave its notebook running: the
    child is in its own session, so only the parent's SIGTERM handling can kill it."""
    code = (
        "from labkit.workbench.sandbox import run_isolated\n"
        "res = run_isolated('time:sleep', 120, timeout=300)\n"
        "print('returned', res.status)\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 60
    kids = []
    while not kids and time.monotonic() < deadline and parent.poll() is None:
        time.sleep(0.2)
        kids = sandbox._descendants(parent.pid)
    assert kids, "the sandbox child never started"
    time.sleep(0.5)
    parent.send_signal(signal.SIGTERM)
    out, err = parent.communicate(timeout=30)
    assert parent.returncode == 128 + signal.SIGTERM, (parent.returncode, err[-2000:])
    assert b"returned" not in out
    for _ in range(50):
        if not any(_alive(k) for k in kids):
            break
        time.sleep(0.1)
    assert not any(_alive(k) for k in kids), f"the sandbox child {kids} outlived its parent"


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc (Linux)")
def test_a_timeout_also_kills_what_left_the_childs_session(tmp_path):
    """A process the child started in a session of its own (a Jupyter kernel, under papermill)
    is outside the child's process group; a timeout must kill it too."""
    pid_file = tmp_path / "pid"
    res = run_isolated(
        "rank_fns:start_detached_sleeper",
        str(pid_file),
        timeout=10,
        env={"PYTHONPATH": str(Path(__file__).resolve().parents[1])},
    )
    assert res.status == "timeout", res.summary()
    grandchild = int(pid_file.read_text())
    for _ in range(50):
        if not _alive(grandchild):
            break
        time.sleep(0.1)
    assert not _alive(grandchild), "the detached grandchild outlived the timeout"


def test_out_of_bounds_kernel_store_is_contained():
    """The real faulting kernel: SIGSEGV under the interpreter, illegal memory access on a GPU."""
    res = run_isolated("labkit.kernels.fault:write_out_of_bounds", timeout=120)
    if labkit.workbench.tier.interpreted():
        assert res.status == "signal" and res.signal == "SIGSEGV", res.summary()
        assert "write_out_of_bounds" in res.stderr  # faulthandler's stack of the child
    else:
        assert res.status == "illegal_memory_access", res.summary() + res.stderr[-2000:]
    # the parent's own kernel launches still work
    from labkit.kernels import copy

    x = torch.randn(1000, device=labkit.workbench.tier.kernel_device())
    assert torch.equal(copy(x), x)


def test_fault_kernel_checks_its_argument():
    from labkit.kernels import write_out_of_bounds

    with pytest.raises(ValueError, match="elements_past_end"):
        write_out_of_bounds(-1)


def test_environment_reaches_the_child_and_multicast_stays_off():
    assert run_isolated("os:getenv", "LABKIT_TEST_VAR", env={"LABKIT_TEST_VAR": "42"}).value == "42"
    for k, v in labkit.MULTICAST_OFF.items():
        assert run_isolated("os:getenv", k, env={k: "1" if v == "0" else "0"}).value == v


def test_refuses_what_a_child_cannot_import():
    def nested():
        return 1

    with pytest.raises(SandboxError, match="nested"):
        run_isolated(nested)
    with pytest.raises(SandboxError, match="lambda"):
        run_isolated(lambda: 1)
    with pytest.raises(SandboxError, match="module:function"):
        run_isolated("no_colon_here")
    with pytest.raises(SandboxError, match="timeout"):
        run_isolated(os.getpid, timeout=0)


def test_refuses_functions_defined_in_main(monkeypatch):
    def f():
        return 1

    f.__module__ = "__main__"
    f.__qualname__ = "f"
    with pytest.raises(SandboxError, match="__main__"):
        run_isolated(f)


def test_unimportable_target_is_reported_as_exception():
    res = run_isolated("labkit.no_such_module:f")
    assert res.status == "exception" and "ModuleNotFoundError" in res.error_type


@pytest.mark.parametrize(
    "payload,stderr,rc,expected",
    [
        (
            {
                "status": "exception",
                "type": "torch.AcceleratorError",
                "message": "CUDA error: an illegal memory access was encountered",
            },
            "",
            1,
            "illegal_memory_access",
        ),
        (
            {"status": "exception", "type": "RuntimeError", "message": "CUDA error: invalid device ordinal"},
            "",
            1,
            "cuda_error",
        ),
        (
            {
                "status": "exception",
                "type": "ValueError",
                "message": "Pointer argument (at 0) cannot be accessed from Triton",
            },
            "",
            1,
            "exception",
        ),
        (
            None,
            "terminate called after throwing ... CUDA error: an illegal memory access was encountered",
            -6,
            "illegal_memory_access",
        ),
        (None, "NCCL error in: ... unhandled cuda error", -6, "cuda_error"),
        (None, "Fatal Python error: Segmentation fault", -11, "signal"),
        (None, "", 3, "exit"),
    ],
)
def test_classify(payload, stderr, rc, expected):
    assert classify(rc, payload, stderr, timed_out=False)["status"] == expected


def test_classify_timeout_wins():
    assert classify(None, {"status": "ok"}, "", timed_out=True)["status"] == "timeout"


@pytest.mark.gpu
def test_parent_cuda_context_healthy_after_child_illegal_access():
    before = torch.arange(10, device="cuda").sum().item()
    res = run_isolated("labkit.kernels.fault:write_out_of_bounds", timeout=120)
    assert res.status == "illegal_memory_access", res.summary()
    assert torch.arange(10, device="cuda").sum().item() == before == 45
    torch.cuda.synchronize()


@pytest.mark.gpu
def test_launch_blocking_reports_fault_at_the_launch():
    """With CUDA_LAUNCH_BLOCKING=1 the error surfaces at the faulting launch, not at a later sync."""
    res = run_isolated(
        "labkit.kernels.fault:write_out_of_bounds_no_sync", timeout=120, env={"CUDA_LAUNCH_BLOCKING": "1"}
    )
    assert res.status == "illegal_memory_access", res.summary()
    # no synchronize is called on this path, so the error must come from the launch line itself
    assert "_store_at_kernel[(1,)]" in res.traceback, res.traceback


# --- what the doc of bad inputs found (sandbox rows) -----------------------------------------

FNS = {"PYTHONPATH": str(Path(__file__).resolve().parents[1])}  # tests/sandbox_fns.py


def test_an_unpicklable_return_value_is_not_reported_as_a_raise():
    res = run_isolated("sandbox_fns:returns_a_lock", env=FNS)
    assert res.status == "exception" and res.error_type == "labkit.workbench.sandbox.ResultNotPicklable"
    assert "returned normally, but its return value" in res.message and "_thread.lock" in res.message
    assert "returned normally" in res.summary()


@pytest.mark.parametrize("timeout", [True, False, "10", None, -1.0, float("nan")])
def test_timeout_must_be_a_positive_number_not_a_bool(timeout):
    with pytest.raises(SandboxError, match="timeout"):
        run_isolated(os.getpid, timeout=timeout)


def _wait_dead(pid: int, seconds: float = 10.0) -> bool:
    deadline = time.monotonic() + seconds
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    return not _alive(pid)


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc (Linux)")
@pytest.mark.parametrize("fn", ["start_detached_and_return", "start_daemon_and_return"])
def test_what_the_child_started_dies_when_it_returns(tmp_path, fn):
    """A process started in a session of its own (or daemonised, re-parented away) by a function
    that then returned normally must not outlive the call."""
    pid_file = tmp_path / "pid"
    res = run_isolated(f"sandbox_fns:{fn}", str(pid_file), timeout=60, env=FNS)
    assert res.ok, res.summary() + res.stderr[-2000:]
    assert _wait_dead(res.value), f"{fn}: process {res.value} outlived the call"


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc (Linux)")
def test_a_parent_killed_by_sigkill_takes_its_child_and_grandchild_along(tmp_path):
    """SIGKILL of the caller (`labkit run`) runs no handler; the child and what it started in a
    session of its own (the notebook's kernel) must still die."""
    pid_file = tmp_path / "pid"
    code = (
        "from labkit.workbench.sandbox import run_isolated\n"
        f"run_isolated('sandbox_fns:start_detached_and_hang', {str(pid_file)!r}, timeout=300, env={FNS!r})\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", code], stderr=subprocess.PIPE)
    deadline = time.monotonic() + 60
    while not (pid_file.exists() and pid_file.read_text()) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert pid_file.exists(), "the grandchild never started"
    grandchild = int(pid_file.read_text())
    kids = [k for k in sandbox._descendants(parent.pid) if _alive(k)]
    folders = {
        Path(a).parent
        for k in kids
        for a in Path(f"/proc/{k}/cmdline").read_bytes().decode(errors="replace").split("\0")
        if a.endswith("call.pkl")
    }
    assert len(folders) == 1, folders  # the call's temporary folder (call and result pickles)
    parent.kill()
    parent.wait()
    assert _wait_dead(grandchild), "the grandchild outlived its SIGKILLed caller"
    for k in kids:
        assert _wait_dead(k), f"process {k} below the caller outlived it"
    deadline = time.monotonic() + 10
    while any(f.exists() for f in folders) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(f.exists() for f in folders), f"{folders} left behind"


def _caller(code: str, tmp: Path) -> subprocess.Popen:
    """A Python process that runs ``code``, with ``tmp`` for its TMPDIR (whatever is left there
    is the call's) and tests/ on its path."""
    env = {
        **os.environ,
        "TMPDIR": str(tmp),
        "PYTHONPATH": os.pathsep.join([FNS["PYTHONPATH"], os.environ.get("PYTHONPATH", "")]),
    }
    return subprocess.Popen([sys.executable, "-c", code], env=env, stderr=subprocess.PIPE, text=True)


def _wait_for(path: Path, proc: subprocess.Popen, seconds: float = 60) -> str:
    deadline = time.monotonic() + seconds
    while not (path.exists() and path.read_text()) and time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()[1][-2000:]
        time.sleep(0.1)
    assert path.exists(), "the call never started"
    return path.read_text()


def _labkit_leftovers(folder: Path) -> list[str]:
    return sorted(n for n in os.listdir(folder) if n.startswith("labkit-"))


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc (Linux)")
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_stopped_caller_leaves_no_sandbox_folder_of_a_call_below_its_child(tmp_path, signum):
    """Ctrl+C or SIGTERM of `labkit run` kills the notebook's kernel, which held a sandbox call
    of its own: that call's folder (N111, N112) goes too, though nothing ran in the kernel."""
    tmp, started = tmp_path / "tmp", tmp_path / "started"
    tmp.mkdir()
    code = (
        "from labkit.workbench.sandbox import run_isolated\n"
        f"run_isolated('sandbox_fns:sleep_in_a_sandbox_of_its_own', {str(started)!r}, timeout=300)\n"
    )
    caller = _caller(code, tmp)
    inner = int(_wait_for(started, caller))
    assert len(_labkit_leftovers(tmp)) == 2  # the caller's call and the one below it
    caller.send_signal(signum)
    _, err = caller.communicate(timeout=60)
    assert caller.returncode in (-signum, 128 + signum, 1), (caller.returncode, err[-2000:])
    assert _labkit_leftovers(tmp) == [], err[-2000:]
    assert _wait_dead(inner), "the inner call's child outlived its caller"


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc (Linux)")
def test_a_timeout_removes_the_folders_named_below_it(tmp_path):
    tmp, named = tmp_path / "tmp", tmp_path / "named"
    tmp.mkdir()
    res = run_isolated("sandbox_fns:hold_a_named_folder", str(named), timeout=5, env={**FNS, "TMPDIR": str(tmp)})
    assert res.status == "timeout", res.summary() + res.stderr[-2000:]
    folder = Path(named.read_text())
    assert folder.parent == tmp and folder.name.startswith("labkit-test-") and not folder.exists()


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc (Linux)")
def test_the_watchdog_removes_the_folders_named_below_a_sigkilled_caller(tmp_path):
    tmp, named = tmp_path / "tmp", tmp_path / "named"
    tmp.mkdir()
    code = (
        "from labkit.workbench.sandbox import run_isolated\n"
        f"run_isolated('sandbox_fns:hold_a_named_folder', {str(named)!r}, timeout=300)\n"
    )
    caller = _caller(code, tmp)
    folder = Path(_wait_for(named, caller))
    caller.kill()
    caller.wait()
    deadline = time.monotonic() + 10
    while _labkit_leftovers(tmp) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _labkit_leftovers(tmp) == [] and not folder.exists()


def test_remove_with_call_takes_only_labkit_folders_and_outside_a_call_does_nothing(tmp_path):
    with pytest.raises(SandboxError, match="folder=.*expected a folder whose name starts with 'labkit-'"):
        sandbox.remove_with_call(tmp_path / "mine")
    assert not any(k.startswith(sandbox.TOKEN_PREFIX) for k in os.environ)
    sandbox.remove_with_call(tmp_path / "labkit-x")  # no call above this process: nothing to tell


def test_signals_raise_turns_sigterm_and_sigint_into_exceptions_once():
    """The first signal raises (so finally blocks run); a second one during that cleanup is
    ignored; the handlers are put back when the block ends."""
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    cleaned = []
    with pytest.raises(SystemExit) as stopped:
        with sandbox.signals_raise():
            try:
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(5)
            finally:
                os.kill(os.getpid(), signal.SIGINT)  # a second Ctrl+C, impatient
                time.sleep(0.1)
                cleaned.append(True)
    assert stopped.value.code == 143 and cleaned == [True]
    assert {s: signal.getsignal(s) for s in before} == before
    with pytest.raises(KeyboardInterrupt):
        with sandbox.signals_raise(), sandbox.signals_raise(signal.SIGTERM):  # nested, as labkit run
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(5)
    assert {s: signal.getsignal(s) for s in before} == before


def test_signals_raise_leaves_an_ignored_signal_ignored():
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)  # a background job's SIGINT
    try:
        with sandbox.signals_raise():
            assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.1)
    finally:
        signal.signal(signal.SIGINT, previous)
