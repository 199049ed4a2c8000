"""Run an experiment that may crash or hang in a child process, and say what happened.

    res = run_isolated(labkit.kernels.fault.write_out_of_bounds, timeout=60)
    res.status    # "illegal_memory_access" on a GPU, "signal" (SIGSEGV) under the interpreter
    res.summary() # one line for the notebook

Why a child process: a CUDA illegal memory access poisons the whole CUDA context of the process
that made it (every later CUDA call fails), and a spin barrier that never completes hangs the
calling thread for good. In a child, the notebook kernel's own context stays healthy and a hang
becomes a timeout. The child is a fresh interpreter (``python -m labkit.workbench.sandbox``), never a fork:
a forked child of a process that touched CUDA cannot use CUDA at all.

The child runs in its own process group (session), so on timeout the whole group is killed,
including any ranks the experiment started, and so is every process below the child that made a
session of its own (a Jupyter kernel under papermill: ``labkit run`` executes notebooks this
way). Being in its own session, the child would outlive a parent stopped by SIGTERM (``timeout``,
a batch scheduler, ``kill``): a notebook that ``labkit run`` was executing went on running on the
GPUs, unseen, beside the next job. So while it waits, the parent turns SIGTERM into
``SystemExit`` (from the main thread), which kills the child's group before the parent leaves.

Nothing the child started outlives the call, however the call ends (Linux, where /proc is read):
the child's environment carries a variable unique to the call, ``LABKIT_SANDBOX_<token>=1``,
which every process below it inherits (a Jupyter kernel too), even one that left the child's
session or was re-parented away (a daemon). A small watchdog process (``python -I -S``, in a
session of its own) waits on a pipe from the parent; when the pipe closes, because the call
returned or because the parent died (SIGKILL of ``labkit run`` runs no handler), it kills every
process whose environment holds that variable (and, if the parent died, removes the call's
``labkit-sandbox-*`` temporary folder). Not covered: a process that clears its
environment when it starts (``env -i``), or one of another user.

Outcomes, in the order they are decided:

=======================  ===========================================================
status                   meaning
=======================  ===========================================================
ok                       the function returned; ``value`` holds its return value
timeout                  no result within ``timeout`` seconds (a hang); group killed
illegal_memory_access    CUDA reported an illegal memory access (exception or log)
cuda_error               another CUDA / cuBLAS / NCCL error
exception                a Python exception (``error_type``, ``message``, ``traceback``); a
                         return value pickle cannot send back is one too, with error_type
                         ``labkit.workbench.sandbox.ResultNotPicklable`` ("returned normally, but")
signal                   killed by a signal (``signal``: SIGSEGV, SIGABRT, ...)
exit                     exited with a non-zero code and no result
=======================  ===========================================================
"""

from __future__ import annotations

import dataclasses
import faulthandler
import importlib
import os
import pickle
import re
import secrets
import signal as _signal
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import labkit

STATUSES = ("ok", "timeout", "illegal_memory_access", "cuda_error", "exception", "signal", "exit")
_ILLEGAL = re.compile(
    r"illegal memory access|illegal address|CUDA_ERROR_ILLEGAL_ADDRESS|"
    r"cudaErrorIllegalAddress",
    re.I,
)
_CUDA = re.compile(
    r"CUDA error|CUDA_ERROR_|cudaError|AcceleratorError|CUBLAS_STATUS|"
    r"NCCL (?:error|WARN)|device-side assert|unspecified launch failure",
    re.I,
)
_TAIL = 20_000  # characters of the child's stdout/stderr kept in the result


class SandboxError(ValueError):
    """The call cannot be sent to a child process (not importable, not picklable, bad timeout)."""


class ResultNotPicklable(Exception):
    """The function returned, but its return value cannot be pickled back to the parent (the
    ``error_type`` the child reports, ``labkit.workbench.sandbox.ResultNotPicklable``)."""


#: prefix of the variable that marks every process below one call's child (see the docstring)
TOKEN_PREFIX = "LABKIT_SANDBOX_"
#: the watchdog: waits for EOF on stdin, then kills every process whose environment holds the
#: variable named by argv[1] (three passes, for processes started during the first); if its
#: parent (argv[3]) is gone, it also removes the call's temporary folder (argv[2]), which the
#: parent's own cleanup would have removed
_WATCHDOG = r"""
import os, shutil, signal, sys
sys.stdin.buffer.read()
mark, me = sys.argv[1].encode() + b"=", os.getpid()
for _ in range(3):
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit() and int(name) != me:
            try:
                with open("/proc/" + name + "/environ", "rb") as f:
                    if any(v.startswith(mark) for v in f.read().split(b"\0")):
                        found.append(int(name))
            except OSError:
                pass
    if not found:
        break
    for pid in found:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
parent = int(sys.argv[3])
try:  # a dying parent closes its files before its children are re-parented: look at its state too
    gone = os.getppid() != parent or open(f"/proc/{parent}/stat").read().rsplit(")", 1)[1].split()[0] in "ZX"
except OSError:
    gone = True
if gone and os.path.basename(sys.argv[2]).startswith("labkit-sandbox-"):
    shutil.rmtree(sys.argv[2], ignore_errors=True)
"""


@dataclasses.dataclass
class SandboxResult:
    status: str
    value: Any = None
    error_type: str | None = None
    message: str | None = None
    traceback: str | None = None
    signal: str | None = None
    returncode: int | None = None
    seconds: float = 0.0
    stdout: str = ""
    stderr: str = ""

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def summary(self) -> str:
        """One line: the outcome and the most telling detail."""
        t = f"{self.seconds:.1f} s"
        if self.status == "ok":
            return f"ok ({t})"
        if self.status == "timeout":
            return f"timeout: no result after {self.seconds:.0f} s (hung); its process group was killed"
        if self.status == "signal":
            return f"signal: killed by {self.signal} ({t})"
        if self.status == "exit":
            return f"exit: code {self.returncode} and no result ({t})"
        msg = (self.message or "").strip().splitlines()
        first = msg[0] if msg else ""
        return (
            f"{self.status}: {self.error_type}: {first} ({t})" if self.error_type else f"{self.status}: {first} ({t})"
        )

    def unwrap(self) -> Any:
        """The value if ok, else raise RuntimeError with the summary (and the child's traceback)."""
        if self.ok:
            return self.value
        detail = f"\n--- child traceback ---\n{self.traceback}" if self.traceback else ""
        raise RuntimeError(f"isolated call failed: {self.summary()}{detail}")


def _target(fn: Callable | str) -> tuple[str, str]:
    """(module, qualname) that a fresh interpreter can import."""
    if isinstance(fn, str):
        if ":" not in fn:
            raise SandboxError(f"fn={fn!r}: expected 'module:function'")
        module, qualname = fn.split(":", 1)
        return module, qualname
    module = getattr(fn, "__module__", None)
    qualname = getattr(fn, "__qualname__", None)
    if module is None or qualname is None:
        raise SandboxError(f"fn={fn!r}: not a function or class that can be imported by name")
    if module == "__main__":
        raise SandboxError(
            f"fn={qualname}: defined in __main__ (a notebook or script), which a child process "
            "cannot import; put it in a module (labkit.*) or pass 'module:function'"
        )
    if "<locals>" in qualname or "<lambda>" in qualname:
        raise SandboxError(f"fn={qualname}: a lambda or nested function cannot be imported; define it at module level")
    return module, qualname


def classify(returncode: int | None, payload: dict | None, stderr: str, timed_out: bool) -> dict:
    """Decide the status from what the child left behind (pure function; unit-tested)."""
    if timed_out:
        return {"status": "timeout"}
    if payload is not None and payload.get("status") == "ok":
        return {"status": "ok", "value": payload.get("value")}
    if payload is not None:  # the child caught a Python exception
        text = f"{payload.get('type', '')}: {payload.get('message', '')}"
        status = (
            "illegal_memory_access" if _ILLEGAL.search(text) else "cuda_error" if _CUDA.search(text) else "exception"
        )
        return {
            "status": status,
            "error_type": payload.get("type"),
            "message": payload.get("message"),
            "traceback": payload.get("traceback"),
        }
    # No result: the process died. CUDA often logs the cause before aborting.
    tail = stderr[-_TAIL:]
    if _ILLEGAL.search(tail):
        status = "illegal_memory_access"
    elif _CUDA.search(tail):
        status = "cuda_error"
    elif returncode is not None and returncode < 0:
        status = "signal"
    else:
        status = "exit"
    out = {"status": status, "message": _last_lines(tail, 5) or None}
    if returncode is not None and returncode < 0:
        try:
            out["signal"] = _signal.Signals(-returncode).name
        except ValueError:
            out["signal"] = f"signal {-returncode}"
    return out


def _last_lines(text: str, n: int) -> str:
    return "\n".join(text.strip().splitlines()[-n:])


def run_isolated(
    fn: Callable | str,
    *args,
    timeout: float = 120.0,
    env: dict | None = None,
    cwd: str | os.PathLike | None = None,
    **kwargs,
) -> SandboxResult:
    """Call ``fn(*args, **kwargs)`` in a fresh child process; never raises for what the child does.

    fn:      a module-level function (or "module:function"); arguments and the return value
             travel by pickle.
    timeout: seconds (an int or float > 0, not a bool) before the child (and its process group)
             is killed and "timeout" returned.
    env:     extra environment variables for the child (e.g. {"CUDA_LAUNCH_BLOCKING": "1"});
             labkit's multicast-off variables are always set.
    Every process the child started is killed when the call ends (see the module docstring).
    """
    if isinstance(timeout, bool) or not (isinstance(timeout, (int, float)) and timeout > 0):
        raise SandboxError(f"timeout={timeout!r}: expected a positive number of seconds")
    module, qualname = _target(fn)
    child_env = dict(os.environ)
    child_env.update({k: str(v) for k, v in (env or {}).items()})
    child_env.update(labkit.MULTICAST_OFF)
    root = str(Path(labkit.__file__).resolve().parent.parent)
    child_env["PYTHONPATH"] = os.pathsep.join(p for p in (root, child_env.get("PYTHONPATH")) if p)
    child_env["PYTHONUNBUFFERED"] = "1"
    token = f"{TOKEN_PREFIX}{secrets.token_hex(8)}"
    child_env[token] = "1"
    with tempfile.TemporaryDirectory(prefix="labkit-sandbox-") as tmp:
        call_file, result_file = os.path.join(tmp, "call.pkl"), os.path.join(tmp, "result.pkl")
        try:
            with open(call_file, "wb") as f:
                pickle.dump({"module": module, "qualname": qualname, "args": args, "kwargs": kwargs}, f)
        except (pickle.PicklingError, TypeError, AttributeError) as e:
            raise SandboxError(f"arguments of {module}.{qualname} cannot be pickled: {e}") from None
        out_path, err_path = os.path.join(tmp, "stdout"), os.path.join(tmp, "stderr")
        start = time.monotonic()
        watchdog = _start_watchdog(token, tmp)
        with open(out_path, "w") as out_f, open(err_path, "w") as err_f:
            proc = subprocess.Popen(
                [sys.executable, "-m", "labkit.workbench.sandbox", call_file, result_file],
                stdout=out_f,
                stderr=err_f,
                stdin=subprocess.DEVNULL,
                env=child_env,
                cwd=cwd,
                start_new_session=True,
            )
            timed_out = False
            previous = _exit_on_sigterm()
            try:
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                timed_out = True
            finally:
                _kill_group(proc)  # also reaps ranks or kernels the child left behind
                _stop_watchdog(watchdog)  # and what left the tree: daemons, re-parented orphans
                if previous is not None:
                    _signal.signal(_signal.SIGTERM, previous)
        seconds = time.monotonic() - start
        payload = None
        if not timed_out and os.path.exists(result_file):
            try:
                with open(result_file, "rb") as f:
                    payload = pickle.load(f)
            except Exception as e:  # a result the parent cannot read back
                payload = {
                    "status": "exception",
                    "type": type(e).__name__,
                    "message": f"could not read the child's result: {e}",
                }
        stdout = Path(out_path).read_text(errors="replace")[-_TAIL:]
        stderr = Path(err_path).read_text(errors="replace")[-_TAIL:]
    fields = classify(proc.returncode, payload, stderr, timed_out)
    return SandboxResult(returncode=proc.returncode, seconds=seconds, stdout=stdout, stderr=stderr, **fields)


def _start_watchdog(token: str, folder: str) -> subprocess.Popen | None:
    """The watchdog of one call (see the module docstring), or None without /proc. Its stdin is
    a pipe only this process holds: closing it, or this process dying, sets it off. ``folder``:
    the call's temporary folder, removed by the watchdog only if this process died first."""
    if not os.path.exists("/proc/self/environ"):
        return None
    env = {k: v for k, v in os.environ.items() if not k.startswith(TOKEN_PREFIX)}
    return subprocess.Popen(
        [sys.executable, "-I", "-S", "-c", _WATCHDOG, token, folder, str(os.getpid())],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=env,
        start_new_session=True,  # a Ctrl+C or group kill of the caller does not stop it first
        close_fds=True,
    )


def _stop_watchdog(watchdog: subprocess.Popen | None) -> None:
    """Set the watchdog off (the call is over) and wait for its sweep."""
    if watchdog is None:
        return
    try:
        watchdog.stdin.close()
        watchdog.wait(timeout=30)
    except subprocess.TimeoutExpired:
        watchdog.kill()
        watchdog.wait()


def _exit_on_sigterm():
    """Make SIGTERM raise SystemExit(143) in this process, so ``finally`` blocks (the child's
    group kill) run; returns the handler to put back, or None where signals cannot be set (a
    thread other than the main one)."""
    import threading

    if threading.current_thread() is not threading.main_thread():
        return None

    def leave(signum, frame):
        raise SystemExit(128 + signum)

    return _signal.signal(_signal.SIGTERM, leave)


def _descendants(pid: int) -> list[int]:
    """Every process below ``pid``, read from /proc (Linux; empty elsewhere)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(stat.parent.name))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def _kill_group(proc: subprocess.Popen) -> None:
    """Kill the child's process group and every process below the child. The group alone is not
    enough: a process that made a session of its own (a Jupyter kernel: jupyter_client starts
    each in a new session; ranks started the same way) would live on. The tree is read before
    the kill, since an orphan is re-parented and can no longer be found from the child."""
    below = _descendants(proc.pid)  # empty once the child has exited: its orphans were re-parented
    try:
        os.killpg(proc.pid, _signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    for pid in below:
        try:
            os.kill(pid, _signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    proc.wait()


def _exception_payload(kind: type | None, message: str, text: str) -> dict:
    """The child's report of an exception being handled now (kind None: ResultNotPicklable)."""
    name = f"{kind.__module__}.{kind.__qualname__}" if kind else "labkit.workbench.sandbox.ResultNotPicklable"
    return {"status": "exception", "type": name, "message": message, "repr": text, "traceback": traceback.format_exc()}


def _child_main(call_file: str, result_file: str) -> None:
    """Entry point of the child: import, call, pickle the outcome, and leave without teardown."""
    faulthandler.enable()  # a segfault prints the Python stack to stderr, which the parent keeps
    with open(call_file, "rb") as f:
        call = pickle.load(f)
    try:
        obj = importlib.import_module(call["module"])
        for part in call["qualname"].split("."):
            obj = getattr(obj, part)
        payload = {"status": "ok", "value": obj(*call["args"], **call["kwargs"])}
    except BaseException as e:
        payload = _exception_payload(type(e), str(e), repr(e))
    try:
        blob = pickle.dumps(payload)
    except Exception as e:
        if payload["status"] == "ok":  # the function returned: say so, not as if it had raised
            value = payload["value"]
            message = (
                f"{call['module']}.{call['qualname']} returned normally, but its return value (a "
                f"{type(value).__module__}.{type(value).__qualname__}) cannot be pickled to send back: "
                f"{type(e).__name__}: {e}"
            )
            payload = _exception_payload(None, message, message)
        else:  # an exception whose message holds something unpicklable
            payload = {**payload, "message": payload["repr"]}
        blob = pickle.dumps(payload)
    with open(result_file + ".tmp", "wb") as f:
        f.write(blob)
    os.replace(result_file + ".tmp", result_file)
    sys.stdout.flush()
    sys.stderr.flush()
    # os._exit skips interpreter teardown: after a CUDA fault, destructors can abort or hang,
    # and the result is already safe on disk.
    os._exit(0 if payload["status"] == "ok" else 1)


if __name__ == "__main__":
    _child_main(sys.argv[1], sys.argv[2])
