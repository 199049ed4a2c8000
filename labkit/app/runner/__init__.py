"""``labkit run``: execute the workbook's notebooks with papermill, validated and contained.

Its names are imported on first use: a notebook's child process imports ``runner.child`` alone,
without the rest of the runner (which imports torch)."""

__all__ = ["run", "RunReport", "NotebookResult", "RunError"]


def __getattr__(name: str):
    if name in ("run", "RunReport", "NotebookResult"):
        from labkit.app.runner import execute

        return getattr(execute, name)
    if name == "RunError":
        from labkit.app.runner.notebooks import RunError

        return RunError
    raise AttributeError(f"module 'labkit.app.runner' has no attribute {name!r}")
