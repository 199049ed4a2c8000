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
a batch scheduler, ``kill``): a notebook that ``labkit run`` was executing would go on running on
the GPUs, unseen, beside the next job. So while it waits, the parent turns SIGTERM into
``SystemExit`` (from the main thread, :func:`signals_raise`), which kills the child's group
before the parent leaves.

Nothing the child started outlives the call, however the call ends (Linux, where /proc is read):
the child's environment carries a variable unique to the call, ``LABKIT_SANDBOX_<token>=<the
call's temporary folder>``, which every process below it inherits (a Jupyter kernel too), even
one that left the child's session or was re-parented away (a daemon). A small watchdog process
(``python -I -S``, in a session of its own) waits on a pipe from the parent; when the pipe closes,
because the call returned or because the parent died (SIGKILL of ``labkit run`` runs no handler),
it kills every process whose environment holds that variable (and, if the parent died, removes
the call's ``labkit-sandbox-*`` temporary folder). Not covered: a process that clears its
environment when it starts (``env -i``), or one of another user.

Nor does a temporary folder of a process below the child outlive the call: the group kill gives
that process no time to remove it (a notebook's own ``run_isolated`` call under ``labkit run``,
whose kernel is killed when ``labkit run`` is stopped). A process names such a folder with
:func:`remove_with_call` (``run_isolated`` names its own); it is written into the temporary folder
of every call above it (``remove-after``), and each of those calls removes it when it ends (or its
watchdog does, if the parent died). Only folders whose name starts with ``labkit-`` are removed.

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

import contextlib
import dataclasses
import faulthandler
import importlib
import os
import pickle
import re
import secrets
import shutil
import signal as _signal
import subprocess
import sys
import tempfile
import threading
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
#: the file, in a call's temporary folder, naming folders to remove when the call ends
REMOVE_AFTER = "remove-after"
#: the watchdog: waits for EOF on stdin, then kills every process whose environment holds the
#: variable named by argv[1] (three passes, for processes started during the first); unless the
#: parent said "returned" before closing the pipe (it died, or is exiting without its
#: cleanup), it also removes the call's temporary folder (argv[2]) and the folders named in its
#: REMOVE_AFTER file, which the parent's own cleanup would have removed
_WATCHDOG = r"""
import os, shutil, signal, sys
returned = sys.stdin.buffer.read() == b"returned"
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
if not returned and os.path.basename(sys.argv[2]).startswith("labkit-sandbox-"):
    try:
        with open(os.path.join(sys.argv[2], "remove-after"), errors="replace") as f:
            named = f.read().splitlines()
    except OSError:
        named = []
    for path in named:
        if os.path.isabs(path) and os.path.basename(path).startswith("labkit-"):
            shutil.rmtree(path, ignore_errors=True)
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
    with tempfile.TemporaryDirectory(prefix="labkit-sandbox-") as tmp:
        remove_with_call(tmp)  # by the calls above this one, should this process be killed
        child_env[token] = tmp
        call_file, result_file = os.path.join(tmp, "call.pkl"), os.path.join(tmp, "result.pkl")
        try:
            with open(call_file, "wb") as f:
                pickle.dump({"module": module, "qualname": qualname, "args": args, "kwargs": kwargs}, f)
        except (pickle.PicklingError, TypeError, AttributeError) as e:
            raise SandboxError(f"arguments of {module}.{qualname} cannot be pickled: {e}") from None
        out_path, err_path = os.path.join(tmp, "stdout"), os.path.join(tmp, "stderr")
        start = time.monotonic()
        watchdog = _start_watchdog(token, tmp)
        with open(out_path, "w") as out_f, open(err_path, "w") as err_f, signals_raise(_signal.SIGTERM):
            proc, timed_out = None, False
            try:
                proc = subprocess.Popen(
                    [sys.executable, "-m", "labkit.workbench.sandbox", call_file, result_file],
                    stdout=out_f,
                    stderr=err_f,
                    stdin=subprocess.DEVNULL,
                    env=child_env,
                    cwd=cwd,
                    start_new_session=True,
                )
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                timed_out = True
            finally:
                if proc is not None:
                    _kill_group(proc)  # also reaps ranks or kernels the child left behind
                _stop_watchdog(watchdog)  # and what left the tree: daemons, re-parented orphans
                _remove_named(tmp)  # the temporary folders of what was killed
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
        [sys.executable, "-I", "-S", "-c", _WATCHDOG, token, folder],
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
        # "returned": this process lives on and removes the folder itself; EOF alone means it died
        # (a dying process closes its files before it is a zombie: /proc cannot tell in time)
        with contextlib.suppress(OSError):
            watchdog.stdin.write(b"returned")
        with contextlib.suppress(OSError):
            watchdog.stdin.close()
        watchdog.wait(timeout=30)
    except subprocess.TimeoutExpired:
        watchdog.kill()
        watchdog.wait()


class _Stopping:
    """Whether a signal of :func:`signals_raise` has fired, and how many blocks are open."""

    fired: int | None = None
    depth = 0


@contextlib.contextmanager
def signals_raise(*signums: int):
    """While the block runs, make the signals ``signums`` (default SIGINT and SIGTERM) raise, so
    ``finally`` blocks run (the child's group kill, temporary folders): SIGINT raises
    KeyboardInterrupt, any other signal SystemExit(128 + its number), as a shell reports it.

    Once one has fired, every later signal of an open block is ignored until the outermost block
    ends: a second Ctrl+C or ``kill`` cannot cut the cleanup short. A signal that this process
    ignores (``nohup``, a background job's SIGINT) stays ignored; outside the main thread, where
    handlers cannot be set, the block changes nothing. ``run_isolated`` waits inside
    ``signals_raise(SIGTERM)``, ``labkit run`` runs inside ``signals_raise()``."""
    signums = signums or (_signal.SIGINT, _signal.SIGTERM)
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum, frame):
        if _Stopping.fired is not None:
            return  # the cleanup of the first one is under way
        _Stopping.fired = signum
        if signum == _signal.SIGINT:
            raise KeyboardInterrupt
        raise SystemExit(128 + signum)

    previous = {}
    for signum in signums:
        if _signal.getsignal(signum) is not _signal.SIG_IGN:
            previous[signum] = _signal.signal(signum, stop)
    _Stopping.depth += 1
    try:
        yield
    finally:
        _Stopping.depth -= 1
        for signum, handler in previous.items():
            _signal.signal(signum, handler if handler is not None else _signal.SIG_DFL)
        if _Stopping.depth == 0:
            _Stopping.fired = None


def remove_with_call(folder: str | os.PathLike) -> None:
    """Have every ``run_isolated`` call this process runs under remove ``folder`` when it ends.

    For a temporary folder (its name starting with ``labkit-``) that this process removes itself
    when it ends normally, and that must not outlive it when it is killed with the call's group
    (see the module docstring). Outside any call, nothing happens."""
    folder = os.path.abspath(folder)
    if not os.path.basename(folder).startswith("labkit-") or "\n" in folder:
        raise SandboxError(f"folder={folder!r}: expected a folder whose name starts with 'labkit-'")
    for name, call_dir in os.environ.items():
        if name.startswith(TOKEN_PREFIX) and os.path.isabs(call_dir) and call_dir != folder:
            try:
                fd = os.open(
                    os.path.join(call_dir, REMOVE_AFTER), os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o600
                )
            except OSError:
                continue  # that call has ended (its folder is gone), or is not one of ours
            with os.fdopen(fd, "a") as f:
                f.write(folder + "\n")


def _remove_named(call_dir: str) -> None:
    """Remove the folders named with :func:`remove_with_call` in the call's folder."""
    try:
        with open(os.path.join(call_dir, REMOVE_AFTER), errors="replace") as f:
            named = f.read().splitlines()
    except OSError:
        return
    for path in named:
        if os.path.isabs(path) and os.path.basename(path).startswith("labkit-"):
            shutil.rmtree(path, ignore_errors=True)


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
