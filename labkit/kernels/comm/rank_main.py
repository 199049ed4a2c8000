"""A rank's side of ``ranks.run_ranks``: what every rank process runs (``ranks._BOOTSTRAP`` calls
``rank_main`` once the rank's environment is set): its output into files, the process group up,
``fn`` called, the outcome left in a file the launcher reads, then the teardown and exit.
"""

from __future__ import annotations

import datetime
import faulthandler
import importlib
import inspect
import multiprocessing
import os
import pickle
import shutil
import sys
import threading
import time
import traceback

import torch
import torch.distributed as dist

from labkit.kernels.comm import rank_results
from labkit.kernels.comm.ranks import RankContext, _result_path, _where_path, note_call


def rank_main(call: dict) -> None:
    """A rank's life: run fn with the process group up, leave the outcome in a file, exit."""
    rank = call["rank"]
    _redirect_output(call["run_dir"], rank)
    rank_results._where_file = _where_path(call["run_dir"], rank)
    note_call("starting")
    faulthandler.enable()  # a segfault prints the Python stack into the rank's stderr file
    threads = os.environ.get("OMP_NUM_THREADS", "")
    if threads.isdigit() and int(threads) > 0:  # a forked rank's torch read it in the server
        torch.set_num_threads(int(threads))
    _exit_with_launcher(call["run_dir"])
    try:
        fn = importlib.import_module(call["module"])
        for part in call["qualname"].split("."):
            fn = getattr(fn, part)
        args, kwargs = pickle.loads(call["args"])
        device = torch.device(call["device_type"], rank if call["device_type"] == "cuda" else None)
        ctx = RankContext(rank, call["world_size"], device, call["backend"], call["scratch_dir"])
        if device.type == "cuda":
            torch.cuda.set_device(device)
        note_call("init_process_group")
        _init_process_group(ctx, call["timeout"])
        dist.distributed_c10d._get_default_store().add(_INITIALIZED_KEY, 1)
        note_call("fn")
        value = fn(ctx, *args, **kwargs)
    except BaseException as e:
        ok, blob = False, _exception_blob(e)
    else:
        ok, blob = _value_blob(value, call)
    path = _result_path(call["run_dir"], rank)
    with open(path + ".tmp", "wb") as f:
        f.write(blob)
    os.replace(path + ".tmp", path)  # the launcher never reads half a file
    # Tear down after the result is safe: destroy_process_group can block when a peer has died.
    try:
        if dist.is_initialized():
            if rank == 0:
                _hold_the_store(call["world_size"], call["timeout"])
            dist.destroy_process_group()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        # os._exit skips interpreter teardown, which can abort or hang after a CUDA fault.
        os._exit(0 if ok else 1)


#: the store key every rank adds 1 to once its ``init_process_group`` has returned
_INITIALIZED_KEY = "labkit/ranks_initialized"


def _hold_the_store(world_size: int, timeout: float) -> None:
    """Rank 0 hosts the TCP store that every rank's ``init_process_group`` reads. A fn that needs
    no collective can return on rank 0 while a peer is still inside its init (gloo's mesh set-up
    reads the store after rank 0's side is done); rank 0 leaving then closes the store under it
    ("Failed to recv, got 0 bytes"). So rank 0 leaves only once every rank has counted itself in.
    Bounded: a rank that fails before counting is reported, and the launcher kills the others."""
    store = dist.distributed_c10d._get_default_store()
    deadline = time.monotonic() + timeout
    while store.add(_INITIALIZED_KEY, 0) < world_size and time.monotonic() < deadline:
        time.sleep(0.005)


def _redirect_output(run_dir: str, rank: int) -> None:
    for fd, ext in ((1, "out"), (2, "err")):
        f = os.open(os.path.join(run_dir, f"rank{rank}.{ext}"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        os.dup2(f, fd)
        os.close(f)
    sys.stdout.reconfigure(line_buffering=True)  # what was printed before a kill is kept


def _exit_with_launcher(run_dir: str) -> None:
    """Exit when the launcher dies: in its own session, a rank would outlive a kernel restart.
    The world's folder goes too: a launcher killed by SIGKILL never reaches its own removal."""
    launcher = multiprocessing.parent_process()

    def watch():
        launcher.join()
        shutil.rmtree(run_dir, ignore_errors=True)
        os._exit(1)

    if launcher is not None:
        threading.Thread(target=watch, name="labkit-launcher-watch", daemon=True).start()


def _init_process_group(ctx: RankContext, timeout: float) -> None:
    kwargs = {
        "backend": ctx.backend,
        "rank": ctx.rank,
        "world_size": ctx.world_size,
        "timeout": datetime.timedelta(seconds=timeout),
    }
    # device_id (torch >= 2.3) binds the NCCL communicator to this rank's GPU at once.
    if ctx.backend == "nccl" and "device_id" in inspect.signature(dist.init_process_group).parameters:
        kwargs["device_id"] = ctx.device
    dist.init_process_group(**kwargs)  # env://: MASTER_ADDR and MASTER_PORT from _rank_env


def _value_blob(value, call: dict) -> tuple[bool, bytes]:
    """(ok, the pickled result) of a fn that returned; a value that cannot be pickled is reported
    as such (``sandbox.ResultNotPicklable``, as ``run_isolated`` reports it), not as if fn raised."""
    try:
        return True, pickle.dumps({"status": "ok", "value": value})
    except Exception as e:
        kind = type(value)
        message = (
            f"{call['module']}.{call['qualname']} returned normally, but its return value (a "
            f"{kind.__module__}.{kind.__qualname__}) cannot be pickled to send back: {type(e).__name__}: {e}"
        )
        payload = {
            "status": "exception",
            "type": "labkit.workbench.sandbox.ResultNotPicklable",
            "message": message,
            "traceback": traceback.format_exc(),
        }
        return False, pickle.dumps(payload)


def _exception_blob(e: BaseException) -> bytes:
    payload = {
        "status": "exception",
        "type": f"{type(e).__module__}.{type(e).__qualname__}",
        "message": str(e),
        "traceback": traceback.format_exc(),
    }  # strings: they pickle
    return pickle.dumps(payload)
