"""Notebook parameters are checked by VALUE before any cell runs, from one schema per notebook
(``labkit.workbench.parameters``), with an error naming the notebook and the parameter.

Without the check, `--set start_here.PROFILE=banana` runs cells for seconds and dies with
``KeyError: 'banana'``, and `HANG_TIMEOUT_S=-1` dies as run_isolated's ``timeout``. No notebook
is executed here: ``resolve_jobs`` only reads them. Each lab keeps its rules in
``labkit.labs.<lab>.parameters``."""

import pytest

from labkit.app.runner import RunError, profiles, schema
from labkit.app.runner import notebooks as nbs
from labkit.app.runner.execute import resolve_jobs


@pytest.mark.parametrize(
    "setting, match",
    [
        ("start_here.PROFILE=banana", "parameter PROFILE: 'banana' is not one of 'auto', 'cpu', 'gpu'"),
        ("start_here.REPS=-1", "parameter REPS: expected an int >= 0"),
        ("start_here.HANG_TIMEOUT_S=-1", "parameter HANG_TIMEOUT_S: expected a finite number > 0"),
        ("start_here.HANG_TIMEOUT_S=.nan", "parameter HANG_TIMEOUT_S: expected a finite number > 0"),
        ("start_here.COPY_SIZES_BYTES=[1024, 0]", r"parameter COPY_SIZES_BYTES: item 1: expected an int >= 1"),
        ("grouped_gemm.CHECK_TOKENS=20", "parameter CHECK_TOKENS: expected an int >= 38"),
        ("collectives.WORLD_SIZES=[1, 2]", r"parameter WORLD_SIZES: item 0: expected an int >= 2"),
        ("collectives.BROKEN_LOAD=heavy", "parameter BROKEN_LOAD: 'heavy' is not one of 'late', 'gemm', 'held'"),
        ("memory_model.LIVE_TESTS=[MP, XYZ]", "parameter LIVE_TESTS: item 1: 'XYZ' is not one of"),
        ("memory_model.LIVE_INSTANCES=1000000000", "parameter LIVE_INSTANCES: expected an int from 1 to"),
        ("fp8_dispatch.SIZE=-0.5", "parameter SIZE: expected a finite number >= 0"),
    ],
)
def test_a_bad_value_is_refused_before_anything_runs(setting, match):
    notebook = setting.split(".", 1)[0]
    with pytest.raises(RunError, match=f"notebook {notebook}: {match}"):
        resolve_jobs(only=[notebook], profile="cpu", sets=[setting])


def test_parameters_for_a_notebook_left_out_are_checked_too():
    """``--only start_here --set wrong_device.EXACTNESS_TRIALS=2.5`` was accepted: only the
    selected notebooks' parameters were read. A typo for a notebook left out is still a typo."""
    with pytest.raises(RunError, match="notebook wrong_device: .*EXACTNESS_TRIALS"):
        resolve_jobs(only=["start_here"], profile="cpu", sets=["wrong_device.EXACTNESS_TRIALS=2.5"])
    with pytest.raises(RunError, match="notebook memory_model: parameter LIVE_TESTS"):
        resolve_jobs(only=["start_here"], profile="cpu", sets=["memory_model.LIVE_TESTS=[XYZ]"])
    (job,) = resolve_jobs(only=["start_here"], profile="cpu", sets=["wrong_device.EXACTNESS_TRIALS=3"])[1]
    assert job[0] == "start_here"


def test_the_schema_names_only_parameters_that_exist():
    found = nbs.discover()
    assert set(schema.schemas()) == set(found), "one schema per notebook"
    for name, rules in schema.schemas().items():
        declared = nbs.parameters(found[name])
        assert set(rules) <= set(declared), (name, set(rules) - set(declared))


def test_every_default_and_profile_value_passes():
    found = nbs.discover()
    for name, path in found.items():
        schema.check(name, {p.name: p.default for p in nbs.parameters(path).values()})
    for prof in profiles.load().values():
        for name, entry in (prof.get("notebooks") or {}).items():
            schema.check(name, entry.get("parameters") or {})


def test_good_values_pass():
    _, jobs = resolve_jobs(only=["start_here"], profile="cpu", sets=["start_here.PROFILE=gpu", "start_here.REPS=3"])
    assert jobs[0][2]["PROFILE"] == "gpu"
