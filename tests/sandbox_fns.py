"""Functions for tests/workbench/test_sandbox.py to run in a sandbox child (importable by name)."""

import os
import subprocess
import sys
import threading
import time


def returns_a_lock():
    """Returns normally, with a value pickle cannot send back."""
    return threading.Lock()


def start_detached_and_return(pid_file: str) -> int:
    """Start a process in a session of its own (as jupyter_client starts a kernel), write its
    pid, and return at once: the process is still running when the function has returned."""
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"], start_new_session=True)
    with open(pid_file, "w") as f:
        f.write(str(p.pid))
    return p.pid


def start_daemon_and_return(pid_file: str) -> int:
    """A daemon: started through an intermediate process that exits at once, so the daemon is
    re-parented (no longer below the child) before the function returns."""
    code = (
        "import subprocess, sys\n"
        "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)'], start_new_session=True)\n"
        f"open({pid_file!r}, 'w').write(str(p.pid))\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
    for _ in range(100):
        if os.path.exists(pid_file) and open(pid_file).read():
            break
        time.sleep(0.05)
    return int(open(pid_file).read())


def start_detached_and_hang(pid_file: str) -> None:
    """Start a process in a session of its own, write its pid, then hang."""
    start_detached_and_return(pid_file)
    time.sleep(300)


def returns_a_lambda():
    return lambda: 1


class BadExc(Exception):
    """An exception holding something pickle cannot send back."""

    def __init__(self, msg):
        super().__init__(msg)
        self.lock = threading.Lock()


def raises_with_a_lock():
    raise BadExc("x")


def _explode():
    raise RuntimeError("unpickled in the parent")


class _ExplodesInParent:
    def __reduce__(self):
        return (_explode, ())


def returns_what_the_parent_cannot_unpickle():
    return _ExplodesInParent()


def sleep_in_a_sandbox_of_its_own(started: str) -> None:
    """A call that makes a sandbox call of its own (as a notebook does under ``labkit run``),
    whose child writes ``started`` and then sleeps."""
    from labkit.workbench import sandbox

    sandbox.run_isolated("sandbox_fns:write_and_sleep", started, timeout=600)


def write_and_sleep(path: str) -> None:
    with open(path, "w") as f:
        f.write(str(os.getpid()))
    time.sleep(600)


def hold_a_named_folder(path_file: str) -> None:
    """Make a ``labkit-`` temporary folder, name it with ``remove_with_call``, write its path, hang."""
    import tempfile

    from labkit.workbench import sandbox

    folder = tempfile.mkdtemp(prefix="labkit-test-")
    sandbox.remove_with_call(folder)
    with open(path_file, "w") as f:
        f.write(folder)
    time.sleep(600)
