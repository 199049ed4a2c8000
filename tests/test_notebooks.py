"""Every notebook: committed stripped, parameters first, hardware stated, profile overrides
naming real parameters, and executing top to bottom under papermill in this machine's tier."""
import pytest

from labkit.workbench.runner import notebooks as nbs
from labkit.workbench.runner import profiles, run

NOTEBOOKS = nbs.discover()


def test_there_are_notebooks():
    assert "00_start_here" in NOTEBOOKS


@pytest.mark.parametrize("name", sorted(NOTEBOOKS))
def test_committed_stripped_with_parameters_first(name):
    nb = nbs.read(NOTEBOOKS[name])
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert all(not c.outputs and c.execution_count is None for c in code), "commit notebooks without outputs"
    assert nbs.parameters_cell(nb) is not None, "first code cell must be tagged 'parameters'"
    assert nb.cells[0].cell_type == "markdown" and "**Hardware:**" in nb.cells[0].source, \
        "the first cell must state the hardware the notebook needs"
    assert nbs.parameters(nb), "the parameters cell defines no parameter"


@pytest.mark.parametrize("profile", profiles.PROFILES)
def test_profile_overrides_name_real_parameters(profile):
    prof = profiles.load()[profile]
    for name, entry in (prof.get("notebooks") or {}).items():
        assert name in NOTEBOOKS, f"profiles.yml: {profile}.{name} is not a notebook"
        nbs.validate(name, entry.get("parameters") or {}, nbs.parameters(NOTEBOOKS[name]))


@pytest.mark.notebook
@pytest.mark.parametrize("name", sorted(NOTEBOOKS))
def test_notebook_executes(name, tmp_path):
    rep = run(only=[name], runs_dir=tmp_path, progress=False)
    (res,) = rep.results
    assert res.status == "ran", f"{name}: {res.line()}"
    for part in res.skipped_parts:
        print(f"{name}: part skipped here: {part['part']}: {part['reason']}")
