"""The check a reader makes: every notebook opened in JupyterLab in a real browser, run, looked at.

JupyterLab is started through ``labkit lab`` (what ``make lab`` runs) on 127.0.0.1 with a free
port and a random token; Debian's Chromium, headless, is driven by Playwright. For every notebook
in notebooks/ (found when the tests are collected: a new notebook is in without an edit here) a
copy with the cpu profile's parameters injected (labkit's runner does the injection, as for
``labkit run``) is opened, run with Run > Run All Cells, and checked: no error output, every
widget rendered as a widget view, every figure as an image, and in every widget panel one control
changed and the button pressed changes the panel's output. A full-page screenshot per notebook
goes to ``runs/<timestamp>_browser/<notebook>.png``. The same browser then opens the
``index.html`` of a ``labkit run`` and loads every link and thumbnail.

Where Chromium or Playwright is missing these tests are skipped with the reason; under CI
(CI=true) that is a failure instead: CI installs both (.ci/run).
"""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import jupyterlab_browser as jb
import pytest

from labkit.app.cli import lab_argv
from labkit.app.runner import notebooks as nbs
from labkit.app.runner import profiles
from labkit.app.runner.execute import kernel_env, prepare, resolve_jobs
from labkit.workbench import gates, results

#: under pytest-xdist (make test) every test of this file runs in one worker: one JupyterLab, one Chromium
pytestmark = pytest.mark.xdist_group("browser")

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "browser"
NOTEBOOKS = nbs.discover()
PROFILE = "cpu"
#: Seconds beyond a notebook's own timeout for opening it, its panels and the screenshot.
PANELS_GRACE_S = 900


def _timeout(name: str) -> float:
    prof = profiles.load()[PROFILE]
    return float(((prof.get("notebooks") or {}).get(name) or {}).get("timeout_s") or prof["timeout_s"])


# --- the entry point a reader uses (no browser needed) ---------------------------------------


def test_labkit_lab_serves_the_workbook_and_passes_arguments_through():
    argv = lab_argv(["--port=8899", "--IdentityProvider.token=abc"], euid=1000)
    assert argv[:3] == [sys.executable, "-m", "jupyterlab"]
    assert f"--ServerApp.root_dir={nbs.NOTEBOOKS_DIR}" in argv
    assert argv[-2:] == ["--port=8899", "--IdentityProvider.token=abc"]
    assert "--allow-root" not in argv


def test_labkit_lab_allows_root_as_root():
    """As root (containers on GPU clouds) jupyter lab exits at once without --allow-root."""
    assert "--allow-root" in lab_argv([], euid=0)
    assert lab_argv(["--allow-root"], euid=0).count("--allow-root") == 1


def test_labkit_lab_leaves_the_folder_to_the_reader():
    for given in (["elsewhere/"], ["--ServerApp.root_dir=/x"], ["--notebook-dir=/x"]):
        assert not any(
            a.startswith("--ServerApp.root_dir=") and a != "--ServerApp.root_dir=/x" for a in lab_argv(given, euid=1000)
        ), given


@pytest.mark.parametrize(
    "given",
    [
        ["--port", "8899"],  # the value after a space, not an `=`: a port, not a folder
        ["--port", "8899", "--no-browser"],
        ["--no-browser", "--port", "8899", "--IdentityProvider.token", "abc"],
        ["--ip", "0.0.0.0", "--ServerApp.port", "8899", "--debug"],
        ["--log-level", "DEBUG", "-y"],
    ],
)
def test_labkit_lab_serves_the_workbook_when_option_values_follow_a_space(given):
    argv = lab_argv(given, euid=1000)
    assert f"--ServerApp.root_dir={nbs.NOTEBOOKS_DIR}" in argv and argv[-len(given) :] == given


@pytest.mark.parametrize(
    "given",
    [
        ["--no-browser", "elsewhere/"],
        ["--port", "8899", "elsewhere/"],
        ["--ServerApp.root_dir", "/x"],
        ["--debug", "x.ipynb"],
    ],
)
def test_labkit_lab_takes_a_folder_after_flags_and_option_values(given):
    """A bare argument after a flag (no value) or after an option's value names what to serve."""
    assert not any(a.startswith("--ServerApp.root_dir=") for a in lab_argv(given, euid=1000)), given


def test_make_lab_runs_labkit_lab_with_its_arguments():
    """`make lab ARGS=...` is `labkit lab ...`: the entry point the browser test starts."""
    out = subprocess.run(
        ["make", "-n", "-s", "lab", "ARGS=--port=8899 --no-browser"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert re.search(r"^\S*/labkit lab --port=8899 --no-browser$", out, re.M), out


# --- the comparison of page and saved notebook (no browser needed) ---------------------------


def _code(src, *outputs):
    return {"cell_type": "code", "source": src, "outputs": list(outputs)}


def _dom(*outputs, prompt="[1]:"):
    return {"code": True, "prompt": prompt, "outputs": list(outputs)}


WIDGET_OUT = {
    "output_type": "display_data",
    "data": {jb.WIDGET_MIME: {"model_id": "x"}, "text/plain": "VBox(children=(Button(description='Go'),))"},
}


def test_comparison_names_a_widget_shown_as_its_text_fallback():
    """What a reader sees without the widget extension: the widget's repr as text."""
    res = jb.NotebookCheck("nb")
    panels = jb._check_outputs(
        res,
        [_code("display(panel())", WIDGET_OUT)],
        [
            _dom(
                {
                    "mime": "text/plain",
                    "widget": False,
                    "broken": False,
                    "images": [],
                    "text": "VBox(children=(Button(description='Go'),))",
                }
            )
        ],
    )
    assert not panels
    assert any(
        "cell 0 `display(panel())`: widget VBox(children=(Button(description='Go'),)) is not rendered" in p
        for p in res.problems
    ), res.problems
    assert any("text fallback" in p for p in res.problems), res.problems


def test_comparison_names_an_image_that_did_not_load_and_a_missing_figure():
    png = {"output_type": "display_data", "data": {"image/png": "iVBO", "text/plain": "<Figure>"}}
    res = jb.NotebookCheck("nb")
    jb._check_outputs(
        res,
        [_code("plot.save(fig)", png, png)],
        [_dom({"mime": "image/png", "widget": False, "broken": False, "images": [False], "text": ""})],
    )
    assert any("1 image(s) did not load" in p for p in res.problems), res.problems
    assert any("2 figure output(s) in the notebook, 0 shown" in p for p in res.problems), res.problems
    assert any("calls plot.save/plot.beside but shows no image" in p for p in res.problems), res.problems


def test_comparison_passes_a_rendered_widget_on_to_be_used():
    res = jb.NotebookCheck("nb")
    panels = jb._check_outputs(
        res,
        [_code("display(panel())", WIDGET_OUT)],
        [_dom({"mime": "", "widget": True, "broken": False, "images": [], "text": "Go", "tag": "0"})],
    )
    assert not res.problems and panels == [("0", "cell 0 `display(panel())`", WIDGET_OUT["data"]["text/plain"])]


# --- fixtures ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """One JupyterLab server (through labkit lab) and one headless Chromium for this file's tests
    (stopped when they are done, not at the end of the whole suite);
    ``lab.run_dir`` is runs/<timestamp>_browser/ (screenshots, saved notebooks, the server's log)."""
    why = jb.missing()
    if why:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"browser tests cannot run: {why}; CI must install it (.ci/run)")
        pytest.skip(f"browser tests: {why}")
    run_dir = results.new_run_dir("browser")
    root = run_dir / "lab"
    root.mkdir()
    tmp = tmp_path_factory.mktemp("jupyterlab")
    env = {
        **kernel_env(PROFILE),
        results.OUTPUT_ENV: str(run_dir / "outputs"),  # what the notebooks write
        "JUPYTERLAB_SETTINGS_DIR": str(jb.lab_settings(tmp / "settings")),  # a new reader's settings
        "JUPYTERLAB_WORKSPACES_DIR": str(tmp / "workspaces"),
        "PYTHONUNBUFFERED": "1",
    }
    with jb.LabServer(root, env, run_dir / "jupyterlab.log") as server:
        assert server.refuses_without_token(), "the server answered a request without its token"
        with jb.chromium(tmp / "chromium-profile") as ctx:
            server.ctx, server.run_dir = ctx, run_dir
            yield server


def _run_in_browser(
    lab, path: Path, name: str, folder: str, profiles_file=None, notebooks_dir=None, capsys=None, panel_timeout_s=300.0
) -> jb.NotebookCheck:
    _, jobs = resolve_jobs(only=[name], profile=PROFILE, notebooks_dir=notebooks_dir, profiles_file=profiles_file)
    ((_, src, params, timeout, needs),) = jobs
    gate = gates.requires(**needs)
    if not gate.ok:
        pytest.skip(f"{name}: {gate.reason}")
    rel = f"{folder}/{name}.ipynb"
    (lab.root / folder).mkdir(exist_ok=True)
    prepare(src, lab.root / rel, params)
    shot = lab.run_dir / (f"{name}.png" if folder == "notebooks" else f"{folder}_{name}.png")
    res = jb.check_notebook(lab.ctx, lab, rel, name, timeout, shot, panel_timeout_s=panel_timeout_s)
    if capsys is not None:
        with capsys.disabled():
            print(f"\n{res.report()}\n  screenshot: {res.screenshot}\n  saved notebook: {res.saved}")
    return res


# --- every notebook ---------------------------------------------------------------------------


@pytest.mark.browser
@pytest.mark.notebook
@pytest.mark.parametrize(
    "name", [pytest.param(n, marks=pytest.mark.timeout(_timeout(n) + PANELS_GRACE_S)) for n in sorted(NOTEBOOKS)]
)
def test_notebook_in_jupyterlab(name, lab, capsys):
    res = _run_in_browser(lab, NOTEBOOKS[name], name, "notebooks", capsys=capsys)
    assert res.screenshot and res.screenshot.is_file(), f"{name}: no screenshot"
    assert not res.problems, "\n".join(res.problems) + f"\nscreenshot: {res.screenshot}"


# --- the test of the test -------------------------------------------------------------------


@pytest.mark.browser
def test_checker_fails_a_notebook_with_broken_widgets(lab, capsys):
    """tests/fixtures/browser/broken_widgets.ipynb: each planted fault is named, with the notebook
    and the widget; its working panel and figure are not."""
    res = _run_in_browser(
        lab,
        FIXTURES / "broken_widgets.ipynb",
        "broken_widgets",
        "fixtures",
        profiles_file=FIXTURES / "profiles.yml",
        notebooks_dir=FIXTURES,
        capsys=capsys,
        panel_timeout_s=60.0,
    )
    text = "\n".join(res.problems)
    assert all(p.startswith("broken_widgets: ") for p in res.problems), text
    expected = {
        "dead button": r"button 'Dead button'.*did not change",
        "missing model": r"widget VBox\(children=\(Button\(description='Ghost button'.*not rendered as a widget view"
        r".*Error displaying widget",
        "raising callback": r"button 'Raising button'.*callback raised.*planted callback failure",
        "figure not shown": r"saved 1 figure\(s\) \(never_shown.png\) but shows 0 inline",
        "cell error": r"raised RuntimeError: planted cell failure",
    }
    for what, pattern in expected.items():
        assert re.search(pattern, text), f"the checker missed the {what}:\n{text}"
    assert len(res.problems) == len(expected), text
    assert "Working button" not in text, text
    assert any("'Working button'" in line and "output changed" in line for line in res.lines), res.lines
    # a panel whose first control has one option: the next control that can change is used
    assert any("picked 'most_recent' in 'algo'" in line and "output changed" in line for line in res.lines), res.lines
    # the copy opened is the parameterised one (the runner's injection), run in the page
    saved = json.loads(res.saved.read_text())
    assert any("injected-parameters" in c["metadata"].get("tags", []) for c in saved["cells"])
    assert any(
        "injected by the cpu profile" in "".join(o.get("text", ""))
        for c in saved["cells"]
        if c["cell_type"] == "code"
        for o in c.get("outputs", [])
    )


@pytest.mark.browser
def test_checker_stops_at_a_dead_kernel(lab, capsys):
    """A kernel that dies makes JupyterLab show a dialog: the check reports it at once instead of
    waiting for the notebook's timeout (300 s in the fixture's profile)."""
    res = _run_in_browser(
        lab,
        FIXTURES / "kernel_dies.ipynb",
        "kernel_dies",
        "fixtures",
        profiles_file=FIXTURES / "profiles.yml",
        notebooks_dir=FIXTURES,
        capsys=capsys,
    )
    assert len(res.problems) == 1 and re.search(
        r"^kernel_dies: JupyterLab shows a dialog while running "
        r"cell 2: Kernel Restarting.*appears to have died",
        res.problems[0],
        re.I,
    ), res.problems
    assert res.seconds < 120, res.seconds


# --- a labkit run's index.html -------------------------------------------------------------


def _smallest_notebook_with_figures() -> str:
    """The notebook with the fewest code cells among those that draw figures (plot.save/beside)."""

    def size(name):
        cells = [c for c in nbs.read(NOTEBOOKS[name]).cells if c.cell_type == "code"]
        draws = any(re.search(r"\bplot\.(save|beside)\(", c.source) for c in cells)
        return (not draws, len(cells), name)

    return min(NOTEBOOKS, key=size)


@pytest.mark.browser
@pytest.mark.notebook
def test_run_index_links_and_thumbnails_resolve(lab, executed_notebooks, capsys):
    """The index.html of the run LABKIT_EXECUTED_RUN names (every notebook), or else of the run
    that executed the smallest notebook with figures for this session."""
    name = _smallest_notebook_with_figures()
    run_dir = executed_notebooks(name).run_dir
    summary = json.loads((run_dir / "summary.json").read_text())
    assert any(r["figures"] for r in summary["results"]), f"{run_dir}: no figure saved: no thumbnail to check"
    problems, lines = jb.check_index(lab.ctx, run_dir)
    with capsys.disabled():
        print(f"\n{run_dir / 'index.html'}\n  " + "\n  ".join(lines + problems))
    assert not problems, "\n".join(problems)
