"""``labkit run``: execute the workbook's notebooks with papermill, validated and contained."""

from labkit.workbench.runner.execute import NotebookResult, RunReport, run
from labkit.workbench.runner.notebooks import RunError

__all__ = ["run", "RunReport", "NotebookResult", "RunError"]
