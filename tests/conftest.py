"""Shared fixtures and settings of the test suite. ``import labkit`` comes first: it picks the tier
(TRITON_INTERPRET=1 on a machine without a GPU) before any kernel module is imported.

* Tests marked ``gpu`` or ``multigpu`` are skipped, with the gate's one-line reason, where the
  hardware is missing; pytest prints every skip reason at the end of the run (``-ra``).
* A broken Triton interpreter stops the run at its start, with the one line that says why.
* ``output_dir``: a notebook output folder of the test's own.
* ``executed_notebooks``: the workbook's notebooks, each executed at most once per session, or read
  from the run folder ``LABKIT_EXECUTED_RUN`` names (``executed_run.py``).

The test files sit in folders mirroring the package (``tests/kernels/comm/``, ``tests/labs/<lab>/``,
...; docs/testing.md); this folder holds what they share: the helper modules that tests and their
child processes import by name (``rank_fns``, ``plan_fns``, ``check_fns``, ``helpers``, ...), on
sys.path through pyproject's ``pythonpath = ["tests"]``.

The options that split a run over several pytest processes (``--labkit-shard``,
``--labkit-skips-to``, ``--labkit-nodeids``: ``labkit gpu-tier``) are the plugin
``sharding.py`` beside this file."""

import pytest

import labkit  # noqa: F401  (must precede kernel imports)
from labkit.workbench import gates

pytest_plugins = ["sharding"]


@pytest.hookimpl(trylast=True)  # after -m, -k and the shards have deselected theirs, and after pytest-xdist
def pytest_collection_modifyitems(config, items):
    _name_xdist_groups(config, items)
    one = gates.requires(gpus=1, compiled=True)
    two = gates.requires(gpus=2, compiled=True)
    for item in items:
        if item.get_closest_marker("multigpu") and not two.ok:
            item.add_marker(pytest.mark.skip(reason=two.reason))
        elif item.get_closest_marker("gpu") and not one.ok:
            item.add_marker(pytest.mark.skip(reason=one.reason))


def _name_xdist_groups(config, items) -> None:
    """``--dist loadgroup`` (make test): a pytest-xdist worker names each test's ``xdist_group``
    in the node id it reports (``...::test@group``), which is what the scheduler groups by.
    pytest-xdist writes it into ``item._nodeid``, which pytest 9.2 no longer reads (its node ids
    are structured): the groups are lost and every grouped test is dealt out alone
    (pytest-dev/pytest-xdist#1386). Where a grouped test's node id lacks its group, this writes
    it into the structured id; where pytest-xdist's own suffix took effect, nothing."""
    if not config.getoption("loadgroup", default=False):  # set on the workers of --dist loadgroup
        return
    for item in items:
        names = {m.args[0] if m.args else m.kwargs.get("name", "default") for m in item.iter_markers("xdist_group")}
        node_id = getattr(item, "_id", None)
        if names and node_id is not None and "@" not in item.nodeid:
            item._id = type(node_id).parse(f"{item.nodeid}@{'_'.join(sorted(map(str, names)))}")


def pytest_configure(config):
    from labkit.workbench import interpreter

    # A broken interpreter (e.g. triton 3.6 with NumPy 2.4) would fail most tests with one
    # traceback each: stop here with the one line that says why and what to install.
    broken = interpreter.problem()
    if broken:
        raise pytest.UsageError(f"labkit's CPU tier cannot run here: {broken}")


@pytest.fixture
def output_dir(tmp_path, monkeypatch):
    """A notebook output folder of this test's own (LABKIT_OUTPUT_DIR)."""
    from labkit.workbench import results

    d = tmp_path / "out"
    monkeypatch.setenv(results.OUTPUT_ENV, str(d))
    return d


@pytest.fixture(scope="session")
def executed_notebooks(tmp_path_factory):
    """``executed_notebooks(name)``: that notebook's outcome and executed copy (``executed_run.py``)."""
    import executed_run

    return executed_run.from_environment(tmp_path_factory.mktemp("workbook"))
