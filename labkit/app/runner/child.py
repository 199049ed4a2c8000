"""What ``labkit run`` executes in each notebook's child process: papermill, and no more.

The child (:func:`labkit.workbench.sandbox.run_isolated`) imports this module by name, which
imports papermill and nbformat but not the rest of the runner; under the ``cpu`` profile the child
imports no torch either (``labkit run`` gives it TRITON_INTERPRET=1, ``execute.kernel_env``, from
which ``labkit.TIER`` is decided without torch), so it is ready for papermill in about a second
rather than the seconds torch takes. The notebook's own kernel, below papermill, imports what the
notebook uses.

The kernel's connection file (its ports and HMAC key) goes in Jupyter's runtime folder,
``JUPYTER_RUNTIME_DIR``: ``labkit run`` gives each child one inside the run folder, which it removes
when the run ends and the next run removes if a killed run left it (jupyter_client's own default,
a ``tmp*.json`` in the system's temporary folder, would stay there after a kill)."""

from __future__ import annotations

import os
import uuid

from labkit.app.runner import notebooks as nbs  # nbformat, as the runner reads it (see there)


def execute(
    input_path: str, output_path: str, parameters: dict, cwd: str, timeout_s: float, prepare_only: bool = False
) -> dict:
    """Runs in the child: papermill with labkit's kernel; returns the outcome as plain data.

    prepare_only: papermill reads the notebook, injects the parameters and writes the output
    without starting a kernel (the tests check this step emits no nbformat warning)."""
    import papermill as pm
    from nbclient.exceptions import CellTimeoutError, DeadKernelError

    try:
        pm.execute_notebook(
            input_path,
            output_path,
            parameters=parameters,
            kernel_name="python3",
            cwd=cwd,
            progress_bar=False,
            log_output=False,
            execution_timeout=int(timeout_s),
            prepare_only=prepare_only,
            # every output is in the notebook once the last cell is done: kill the kernel then. A
            # graceful shutdown would wait for the kernel's own teardown (torch, Triton, matplotlib),
            # 1.5 to 3 s a notebook on the 2-core machine, for nothing the notebook keeps.
            shutdown_kernel="immediate",
            kernel_manager_class=_kernel_manager_class(),
        )
    except pm.PapermillExecutionError as e:
        first = str(e.evalue).strip().splitlines()[0] if str(e.evalue).strip() else ""
        return {"status": "failed", "detail": f"cell {e.cell_index} (In [{e.exec_count}]) raised {e.ename}: {first}"}
    except (CellTimeoutError, DeadKernelError) as e:
        # papermill saved the notebook up to the cell that was running: name that cell.
        cell = running_cell(output_path)
        what = (
            f"timed out after {timeout_s:.0f} s"
            if isinstance(e, CellTimeoutError)
            else "killed the notebook's kernel (a crash: segfault, abort, illegal memory access?)"
        )
        return {"status": "failed", "detail": f"cell {cell} {what}" if cell is not None else what}
    return {"status": "ran"}


def _kernel_manager_class() -> type:
    """nbclient's kernel manager, its connection file in Jupyter's runtime folder (created 0700)."""
    from jupyter_client import AsyncKernelManager
    from jupyter_core.paths import jupyter_runtime_dir
    from traitlets import default

    class RuntimeDirKernelManager(AsyncKernelManager):
        @default("connection_file")
        def _connection_file_in_runtime_dir(self) -> str:
            folder = jupyter_runtime_dir()
            os.makedirs(folder, mode=0o700, exist_ok=True)
            return os.path.join(folder, f"kernel-{uuid.uuid4()}.json")

    return RuntimeDirKernelManager


def running_cell(path: str) -> int | None:
    """Index of the cell that was executing when papermill stopped: the last one it started.

    After a timeout or a dead kernel papermill marks that cell "completed" (not "failed") in the
    saved notebook; the cells after it stay "pending"."""
    try:
        nb = nbs.read(path)
    except Exception:
        return None
    started = [
        i
        for i, c in enumerate(nb.cells)
        if c.get("metadata", {}).get("papermill", {}).get("status") not in (None, "pending")
    ]
    return started[-1] if started else None
