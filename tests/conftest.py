"""Shared fixtures. ``import labkit`` comes first: it picks the tier (TRITON_INTERPRET=1 on a
machine without a GPU) before any kernel module is imported.

Tests marked ``gpu`` or ``multigpu`` are skipped, with the gate's one-line reason, where the
hardware is missing; pytest prints every skip reason at the end of the run (``-ra``)."""
import labkit  # noqa: F401  (must precede kernel imports)
import pytest

from labkit.workbench import gates


def pytest_collection_modifyitems(config, items):
    one = gates.requires(gpus=1, compiled=True)
    two = gates.requires(gpus=2, compiled=True)
    for item in items:
        if item.get_closest_marker("multigpu") and not two.ok:
            item.add_marker(pytest.mark.skip(reason=two.reason))
        elif item.get_closest_marker("gpu") and not one.ok:
            item.add_marker(pytest.mark.skip(reason=one.reason))


@pytest.fixture
def output_dir(tmp_path, monkeypatch):
    """A notebook output folder of this test's own (LABKIT_OUTPUT_DIR)."""
    from labkit.workbench import results

    d = tmp_path / "out"
    monkeypatch.setenv(results.OUTPUT_ENV, str(d))
    return d
