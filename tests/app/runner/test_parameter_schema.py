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
        ("start_here.COPY_SIZES_BYTES=[1024, 0]", "parameter COPY_SIZES_BYTES: item 1: expected an int from 1 to"),
        ("grouped_gemm.CHECK_TOKENS=20", "parameter CHECK_TOKENS: expected an int >= 38"),
        ("collectives.WORLD_SIZES=[1, 2]", "parameter WORLD_SIZES: item 0: expected an int from 2 to"),
        ("collectives.BROKEN_LOAD=heavy", "parameter BROKEN_LOAD: 'heavy' is not one of 'late', 'gemm', 'held'"),
        ("memory_model.LIVE_TESTS=[MP, XYZ]", "parameter LIVE_TESTS: item 1: 'XYZ' is not one of"),
        ("memory_model.LIVE_INSTANCES=1000000000", "parameter LIVE_INSTANCES: expected an int from 1 to"),
        ("fp8_dispatch.SIZE=-0.5", "parameter SIZE: expected a finite number >= 0"),
        # list parameters bound their items and their length (reliability review, "accepted")
        ("collectives.SWEEP_SIZES=[-5]", r"parameter SWEEP_SIZES: item 0: expected an int from 1 to"),
        ("collectives.SWEEP_SIZES=[a]", r"parameter SWEEP_SIZES: item 0: expected an int from 1 to"),
        ("collectives.SWEEP_SIZES=[[1, 1], [1]]", r"parameter SWEEP_SIZES: item 0: expected an int"),
        ("collectives.LINK_SIZES=[]", r"parameter LINK_SIZES: expected at least one item, got \[\]"),
        ("collectives.WORLD_SIZES=[100000]", r"parameter WORLD_SIZES: item 0: expected an int from 2 to"),
        ("start_here.COPY_SIZES_BYTES=[1000000000000000000000]", "parameter COPY_SIZES_BYTES: item 0: expected an"),
        ("stream_races.RACE_SLEEPS_MS=[1e9]", r"parameter RACE_SLEEPS_MS: item 0: expected a finite number >= 0 and"),
        ("memory_model.BROKEN_DELAYS=[-1]", "parameter BROKEN_DELAYS: item 0: expected an int from 0 to"),
        (
            "start_here.REFERENCE_MACHINES=[" + ", ".join(["h200x2"] * 65) + "]",
            "parameter REFERENCE_MACHINES: expected at most 64 items, got 65",
        ),
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


#: a valid item for each list parameter whose default is empty
_SAMPLE_ITEMS = {"COPY_SIZES_BYTES": 4096, "REFERENCE_MACHINES": "h200x2"}


def test_every_list_parameter_has_a_rule_that_bounds_its_length():
    """A list parameter without a rule took 43 million items (reliability review, finding 8):
    every list of every notebook has a rule, and the rule refuses ``max_len + 1`` valid items."""
    found = nbs.discover()
    for name, path in found.items():
        rules = schema.schema_of(name)
        for p in nbs.parameters(path).values():
            assert p.type != "any", f"{name}.{p.name}: the parameters cell must give it a literal default"
            if p.type != "list":
                continue
            rule = rules.get(p.name)
            assert rule is not None and hasattr(rule, "max_len"), f"{name}.{p.name}: a list without a list_of rule"
            item = p.default[0] if p.default else _SAMPLE_ITEMS[p.name]
            assert rule([item] * rule.max_len) == "", (name, p.name)
            assert f"at most {rule.max_len} items" in rule([item] * (rule.max_len + 1)), (name, p.name)


def test_a_parameter_written_as_arithmetic_has_its_value_and_type():
    """``SWEEP_SIZES = [4 << 10, ...]``: the type check and the rule see the list, not "any"."""
    p = nbs.parameters(nbs.discover()["collectives"])["SWEEP_SIZES"]
    assert (p.type, p.default[:2], p.help) == ("list", [4096, 65536], "bytes per rank for the live GPU sweep")
    order = nbs.parameters(nbs.discover()["collectives"])["ORDER_SHARD_BYTES"]
    assert order.help.startswith("bytes per rank for the live all-gather order comparison")


# --- the YAML of --set, --params and profiles.yml ---------------------------------------------


def _params(tmp_path, text):
    f = tmp_path / "p.yml"
    f.write_text(text)
    return profiles.read_params_file(f)


def test_an_alias_bomb_is_refused_at_once(tmp_path):
    import time

    text = "[1,1,1,1,1,1,1,1,1]"
    for name in "abcdefg":
        text = f"[&{name} {text}," + ",".join([f"*{name}"] * 8) + "]"
    start = time.monotonic()
    with pytest.raises(RunError, match=r"p\.yml: anchor &h: anchors and aliases are not accepted here"):
        _params(tmp_path, f"collectives:\n  SWEEP_SIZES: &h {text}\n")
    assert time.monotonic() - start < 0.5
    with pytest.raises(RunError, match=r"alias \*a: anchors and aliases are not accepted"):
        profiles.parse_set("collectives.SWEEP_SIZES=[*a]")


def test_a_document_has_bounded_size(tmp_path):
    with pytest.raises(RunError, match=f"p\\.yml: more than {profiles.MAX_NODES} values"):
        _params(tmp_path, "collectives:\n  SWEEP_SIZES: [" + ",".join(["1"] * profiles.MAX_NODES) + "]\n")
    with pytest.raises(RunError, match="nested deeper than"):
        profiles.parse_set("collectives.SWEEP_SIZES=" + "[" * 2000 + "]" * 2000)
    with pytest.raises(RunError, match="p\\.yml is larger than 1024 KiB"):
        _params(tmp_path, "# " + "x" * profiles.MAX_BYTES + "\n")


@pytest.mark.parametrize(
    "text, value",
    [
        ("1e9", 1e9),
        ("1e-300", 1e-300),
        ("-2E+3", -2000.0),
        ("1.0e9", 1e9),
        ("2.5", 2.5),
        (".5", 0.5),
        ("10", 10),
        ("0", 0),
        ("-3", -3),
        ("0x10", 16),
        ("1_000", 1000),
        ("1:30", "1:30"),
        (".inf", float("inf")),
        ("e9", "e9"),
    ],
)
def test_numbers_read_the_same_in_set_and_params(tmp_path, text, value):
    """YAML 1.1 reads ``1e9`` as a string and ``1:30`` as 90; here an exponent makes a float."""
    from_set = profiles.parse_set(f"start_here.X={text}")[2]
    from_file = _params(tmp_path, f"start_here:\n  X: {text}\n")["start_here"]["X"]
    assert from_set == from_file == value and type(from_set) is type(from_file) is type(value)


@pytest.mark.parametrize(
    "text, write", [("010", "write 10 or 8"), ("-007", "write -7"), ("08", "write 8"), ("00", "write 0")]
)
def test_a_leading_zero_is_refused(tmp_path, text, write):
    """YAML 1.1 reads ``010`` as 8, silently."""
    with pytest.raises(RunError, match=f"^--set 'start_here.REPS={text}': {text}: a leading zero: {write}"):
        profiles.parse_set(f"start_here.REPS={text}")
    with pytest.raises(RunError, match=f"p\\.yml: {text}: a leading zero: {write}"):
        _params(tmp_path, f"start_here:\n  REPS: {text}\n")
    assert profiles.parse_set(f"start_here.PROFILE='{text}'")[2] == text  # quoted: a string


def test_an_exponent_is_a_float_parameter():
    _, jobs = resolve_jobs(only=["start_here"], profile="cpu", sets=["start_here.HANG_TIMEOUT_S=1e3"])
    assert jobs[0][2]["HANG_TIMEOUT_S"] == 1000.0
    with pytest.raises(RunError, match="parameter REPS expects int .*got float 1000.0"):
        resolve_jobs(only=["start_here"], profile="cpu", sets=["start_here.REPS=1e3"])


def test_a_key_given_twice_keeps_the_last(tmp_path):
    """Accepted (reliability review N98, N105): YAML's and argparse's usual last-wins."""
    f = tmp_path / "p.yml"
    f.write_text("start_here:\n  REPS: 1\n  REPS: 3\n")
    _, jobs = resolve_jobs(only=["start_here"], profile="cpu", params_file=str(f), sets=[])
    assert jobs[0][2]["REPS"] == 3
    _, jobs = resolve_jobs(only=["start_here"], profile="cpu", sets=["start_here.REPS=1", "start_here.REPS=2"])
    assert jobs[0][2]["REPS"] == 2
