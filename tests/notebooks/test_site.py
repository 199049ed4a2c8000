"""The site (``make site``, scripts/build_site.py, docs/site.md): what it is built from, how its
links are rewritten, and, in headless Chromium, every page of a built site as a reader gets it
from ``python -m http.server -d site``: no link that 404s (or names a missing anchor), no image
that does not load, no console error, and every figure of every executed notebook on its page.

The browser test walks the site named by LABKIT_SITE_DIR (CI builds it with ``make site``), else
one built here into a temporary folder from the newest complete CPU run (or LABKIT_EXECUTED_RUN),
else it is skipped with the reason: executing every notebook inside a test would take too long.
"""

import base64
import importlib.util
import json
import os
import re
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import jupyterlab_browser as jb
import pytest

#: under pytest-xdist (make test) every test of this file runs in one worker: the site its module fixture builds
#: runs once, not once per worker
pytestmark = pytest.mark.xdist_group("site")

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("build_site", ROOT / "scripts" / "build_site.py")
build_site = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(build_site)
NAMES = build_site.notebook_names()
SITE_ENV = "LABKIT_SITE_DIR"


# --- what the site is built from (no browser, no Sphinx) --------------------------------------


def _stamp(day: int) -> str:
    """A run folder's timestamp (UTC, as labkit run names them) on the given day of one month."""
    return f"2026-01-{day:02d}T00-00-00Z"


def _fake_run(runs: Path, stamp: str, profile="cpu", complete=True, names=NAMES, status="ran") -> Path:
    run = runs / f"{stamp}_{profile}"
    results = []
    for n in map(build_site.run_name, names):
        (run / n).mkdir(parents=True)
        (run / n / f"{n}.ipynb").write_text("{}")
        results.append({"name": n, "status": status, "output": f"{n}/{n}.ipynb", "figures": []})
    doc = {"profile": profile, "complete": complete, "stopped_by": None if complete else "SIGTERM", "results": results}
    (run / "summary.json").write_text(json.dumps(doc))
    return run


def test_the_newest_complete_cpu_run_of_every_notebook_is_shown(tmp_path, monkeypatch):
    monkeypatch.delenv(build_site.RUN_ENV, raising=False)
    good = _fake_run(tmp_path, _stamp(1))
    _fake_run(tmp_path, _stamp(2), names=NAMES[:1])  # an --only run
    _fake_run(tmp_path, _stamp(3), complete=False)  # stopped
    _fake_run(tmp_path, _stamp(4), status="failed")
    _fake_run(tmp_path, _stamp(5), profile="gpu")
    (tmp_path / f"{_stamp(6)}_cpu").mkdir()  # still running: no summary
    assert build_site.find_run(None, tmp_path, NAMES) == good


def test_a_named_run_is_used_or_refused_with_the_reason(tmp_path, monkeypatch):
    partial = _fake_run(tmp_path, _stamp(2), names=NAMES[:1])
    monkeypatch.setenv(build_site.RUN_ENV, str(partial))
    with pytest.raises(build_site.SiteError, match=f"{build_site.RUN_ENV}.*notebook {NAMES[1]} was not run"):
        build_site.find_run(None, tmp_path, NAMES)
    good = _fake_run(tmp_path / "elsewhere", _stamp(1))
    monkeypatch.setenv(build_site.RUN_ENV, str(good))
    assert build_site.find_run(None, tmp_path, NAMES) == good


def test_make_site_without_an_executed_run_says_what_to_do_in_one_line(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != build_site.RUN_ENV}
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "build_site.py"), "--runs-dir", str(tmp_path), "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert proc.returncode == 1 and not proc.stdout, proc.stdout + proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and "run `make workbook` first" in proc.stderr, proc.stderr


def test_make_site_runs_the_build_script():
    out = subprocess.run(["make", "-n", "-s", "site"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    assert re.search(r"^\S*/python scripts/build_site\.py --out site$", out, re.M), out


def test_links_are_pointed_at_the_pages_and_files_of_the_site(tmp_path):
    stage = build_site.Stage(tmp_path)
    assert stage.link("../README.md", "docs/index.md") == "../index.md"  # the README is the landing page
    assert stage.link("docs/labs.md#the-labs", "README.md") == "docs/labs.md#the-labs"
    assert stage.link("#requirements", "README.md") == "#requirements"
    assert stage.link("https://example.org/x.md", "README.md") == "https://example.org/x.md"
    assert stage.link("02_collectives.ipynb", "notebooks/01_wrong_device.ipynb") == "02_collectives.ipynb"
    assert stage.link("../docs/labs.md", "notebooks/01_wrong_device.ipynb") == "../docs/labs.md"
    # any other file of the repository: a copy in the site, which Sphinx serves as a download
    # (MyST's path: scheme; a .md file too, which MyST would otherwise take for a page)
    assert stage.link("../labkit/kernels/copy.py", "docs/api.md") == "path:../_repo/labkit/kernels/copy.py"
    assert (tmp_path / "_repo/labkit/kernels/copy.py").read_bytes() == (ROOT / "labkit/kernels/copy.py").read_bytes()
    assert stage.link("../labkit/../README.md", "docs/api.md") == "../index.md"
    assert stage.link("../tests/fixtures/browser/broken_widgets.ipynb", "docs/x.md").startswith("path:../_repo/tests/")
    assert stage.link("../no/such/file.py", "docs/api.md") == "../no/such/file.py"  # left for Sphinx to fail
    text = stage.markdown('[a](../README.md "home") and [![b](x.png)](../labkit/kernels/copy.py)', "docs/x.md")
    assert text == '[a](../index.md "home") and [![b](x.png)](path:../_repo/labkit/kernels/copy.py)'


def test_images_of_the_repository_are_copied_where_the_pages_look_for_them(tmp_path):
    """A Markdown image is copied into the stage (Sphinx copies it on); raw HTML's <img src> is
    copied into the built site by build_site.build (Sphinx passes raw HTML through untouched)."""
    rel = "labkit/py.typed"  # any file of the repository: the rewrite does not look inside
    stage = build_site.Stage(tmp_path)
    md = stage.markdown(f'![fig](<{rel}> "t") <img src="{rel}" width="50%">', "README.md")
    assert md == f'![fig](_repo/{rel} "t") <img src="_repo/{rel}" width="50%">'
    assert (tmp_path / "_repo" / rel).is_file() and stage.raw == {rel}
    assert stage.markdown(f"![fig](../{rel})", "docs/x.md") == f"![fig](../_repo/{rel})"


def test_the_executed_notebook_is_staged_with_its_outputs_and_widgets_replaced(tmp_path):
    nb = {
        "cells": [
            {"cell_type": "markdown", "source": ["see [the docs](../docs/labs.md)"], "metadata": {}},
            {
                "cell_type": "code",
                "source": "",
                "outputs": [
                    {"output_type": "display_data", "data": {"image/png": "iVBORw0KGgo=", "text/plain": "<Figure>"}},
                    {"output_type": "display_data", "data": {jb.WIDGET_MIME: {"model_id": "x"}, "text/plain": "VBox"}},
                ],
            },
        ]
    }
    executed = tmp_path / "executed.ipynb"
    executed.write_text(json.dumps(nb))
    stage = build_site.Stage(tmp_path / "stage")
    name = f"notebooks/{NAMES[0]}.ipynb"
    assert stage.write_notebook(name, executed) == {"widgets": 1, "images": 1}
    staged = json.loads((tmp_path / "stage" / name).read_text())
    outs = staged["cells"][1]["outputs"]
    assert outs[0]["data"]["image/png"] == "iVBORw0KGgo=" and outs[1]["data"] == {"text/plain": build_site.WIDGET_NOTE}


def test_a_local_reference_that_names_no_file_is_found(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "ok.png").write_bytes(b"x")
    (tmp_path / "a" / "p.html").write_text(
        '<a href="ok.png">ok</a><a href="https://x.org/">ext</a><a href="#top">anchor</a>'
        '<img src="gone.png"><a href="../missing.html#x">m</a><link href="ok.png?v=1" rel="stylesheet">'
    )
    assert build_site.broken_refs(tmp_path) == ["a/p.html: gone.png", "a/p.html: ../missing.html#x"]


def test_the_api_reference_covers_every_module_docs_api_names():
    mods = build_site.module_files()
    named = re.findall(r"(?<![\w.])labkit(?:\.\w+)+", (ROOT / "docs" / "api.md").read_text())
    assert named, "docs/api.md names no labkit module"
    for dotted in named:
        assert any(dotted == m or dotted.startswith(m + ".") for m in mods), dotted
    assert "labkit.kernels.comm.collectives" in mods and all(not m.split(".")[-1].startswith("_") for m in mods)


# --- every page of a built site, in a browser ---------------------------------------------------


@pytest.fixture(scope="module")
def site_dir(tmp_path_factory):
    """The built site to walk: $LABKIT_SITE_DIR, else one built now from an executed run."""
    why = jb.missing()
    if why:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"browser tests cannot run: {why}; CI must install it (.ci/run)")
        pytest.skip(f"browser tests: {why}")
    given = os.environ.get(SITE_ENV)
    if given:
        site = Path(given)
        assert (site / build_site.MANIFEST).is_file(), f"{SITE_ENV}={given} holds no built site: run `make site`"
        return site
    try:
        run = build_site.find_run(None, ROOT / "runs", NAMES)
    except build_site.SiteError as e:
        pytest.skip(f"no built site ({SITE_ENV} unset) and none can be built: {e}")
    site = tmp_path_factory.mktemp("site") / "site"
    build_site.build(site, str(run))
    return site


def _serve(site: Path):
    """``python -m http.server -d SITE`` on 127.0.0.1 and a free port, as docs/site.md says to serve it."""
    port = jb.free_port()
    cmd = [sys.executable, "-m", "http.server", "-d", str(site), "-b", "127.0.0.1", str(port)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while True:
        try:
            with urllib.request.urlopen(base + "/", timeout=2) as r:
                assert r.status == 200
            return proc, base
        except (urllib.error.URLError, ConnectionError):
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                raise AssertionError(f"`{' '.join(cmd)}` did not serve {base}/") from None
            time.sleep(0.2)


#: Per page: every link, every image (after each has loaded or failed; none left lazy), and the
#: images inside notebook outputs (MyST-NB's .cell_output).
_READ_PAGE = r"""async () => {
  const imgs = Array.from(document.images);
  imgs.forEach(i => { i.loading = 'eager'; });
  await Promise.all(imgs.map(i => i.complete ? null : new Promise(r => { i.onload = i.onerror = r; })));
  return {
    links: Array.from(document.querySelectorAll('a[href]')).map(a => a.href),
    images: imgs.map(i => ({src: i.currentSrc || i.src, width: i.naturalWidth})),
    outputImages: document.querySelectorAll('.cell_output img').length,
  };
}"""


def _executed_images(notebook: Path) -> int:
    """Image outputs of an executed notebook (one <img> each on its page; widgets hold none)."""
    cells = json.loads(notebook.read_text())["cells"]
    return sum(
        any(k.startswith("image/") for k in out.get("data", {}))
        for cell in cells
        for out in cell.get("outputs", [])
        if jb.WIDGET_MIME not in out.get("data", {})
    )


_LOAD = re.compile(r"^Failed to load resource\b")


class _Targets:
    """Each link target fetched once: its HTTP status and, for a page, the ids it holds."""

    def __init__(self, request):
        self.request, self.seen = request, {}

    def problem(self, url: str) -> str | None:
        page_url, _, fragment = url.partition("#")
        if page_url not in self.seen:
            resp = self.request.get(page_url)
            body = resp.text() if resp.ok and "html" in resp.headers.get("content-type", "") else ""
            self.seen[page_url] = (resp.status, set(re.findall(r'\sid="([^"]+)"', body)))
        status, ids = self.seen[page_url]
        if status != 200:
            return f"HTTP {status}"
        if fragment and ids and urllib.parse.unquote(fragment) not in ids:
            return f"no element with id {fragment!r} there"
        return None


def walk_site(site_dir: Path, profile_dir: Path) -> tuple[list[str], str]:
    """Serve ``site_dir`` with ``python -m http.server`` and open every page of it in Chromium.
    Returns the problems (one line each, naming the page) and a line saying what was walked."""
    manifest = json.loads((site_dir / build_site.MANIFEST).read_text())
    run = Path(manifest["run"])
    assert (run / "summary.json").is_file(), f"the site shows run {run}, which is not here: its notebooks are compared"
    outputs = {r["name"]: r["output"] for r in json.loads((run / "summary.json").read_text())["results"]}
    pages = sorted(p.relative_to(site_dir).as_posix() for p in site_dir.rglob("*.html"))
    assert "index.html" in pages and set(manifest["notebooks"].values()) <= set(pages), pages
    problems, counts, started = [], {"links": 0, "images": 0}, time.monotonic()
    server, base = _serve(site_dir)
    try:
        with jb.chromium(profile_dir) as ctx:
            page = ctx.new_page()
            errors: list[str] = []
            # a failed load is named by its URL (the console's line for it does not say which); the
            # browser's own request for /favicon.ico is no request of the site's
            page.on(
                "console", lambda m: errors.append(m.text) if m.type == "error" and not _LOAD.match(m.text) else None
            )
            page.on("pageerror", lambda e: errors.append(str(e)))
            # the site works offline: nothing is fetched from another host (a CDN's script, a font)
            page.on(
                "request",
                lambda r: (
                    errors.append(f"fetches {r.url} from outside the site")
                    if not r.url.startswith((base, "data:", "blob:"))
                    else None
                ),
            )
            page.on("requestfailed", lambda r: errors.append(f"request failed: {r.url} ({r.failure})"))
            page.on(
                "response",
                lambda r: (
                    errors.append(f"HTTP {r.status} for {r.url}")
                    if r.status >= 400 and not r.url.endswith("/favicon.ico")
                    else None
                ),
            )
            targets = _Targets(ctx.request)
            for rel in pages:
                errors.clear()
                resp = page.goto(f"{base}/{rel}", wait_until="load")
                if resp is None or resp.status != 200:
                    problems.append(f"{rel}: HTTP {resp.status if resp else 'no response'}")
                    continue
                found = page.evaluate(_READ_PAGE)
                problems += [f"{rel}: console: {e}" for e in errors]
                problems += [f"{rel}: image {i['src']} does not load" for i in found["images"] if not i["width"]]
                for url in dict.fromkeys(found["links"]):  # in order, once
                    if url.startswith(base):
                        why = targets.problem(url)
                        if why:
                            problems.append(f"{rel}: link {url[len(base) :]}: {why}")
                counts["links"] += len(found["links"])
                counts["images"] += len(found["images"])
                name = next((n for n, p in manifest["notebooks"].items() if p == rel), None)
                if name:
                    want = _executed_images(run / outputs[build_site.run_name(name)])
                    if found["outputImages"] != want:
                        problems.append(
                            f"{rel}: {found['outputImages']} figure(s) on the page, {want} in the executed notebook"
                        )
    finally:
        server.terminate()
        server.wait(10)
    line = (
        f"site {site_dir} (run {run.name}): {len(pages)} pages, {counts['links']} links "
        f"({len(targets.seen)} targets), {counts['images']} images in {time.monotonic() - started:.0f} s"
    )
    return problems, line


@pytest.mark.browser
def test_every_page_of_the_site_loads_in_a_browser(site_dir, tmp_path, capsys):
    problems, line = walk_site(site_dir, tmp_path / "chromium-profile")
    with capsys.disabled():
        print(f"\n{line}")
    assert not problems, f"{len(problems)} problem(s):\n" + "\n".join(problems[:60])


#: A 1x1 PNG.
_PNG = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kgAAAABJRU5ErkJggg=="
)


@pytest.mark.browser
def test_the_walk_names_each_fault_planted_in_a_site(tmp_path):
    """A two-page site with one of each fault the walk looks for; it must name every one."""
    if jb.missing():
        pytest.skip(f"browser tests: {jb.missing()}")  # the site_dir fixture fails it under CI
    run, site = tmp_path / "run", tmp_path / "site"
    (run / "nb").mkdir(parents=True)
    (site / "notebooks").mkdir(parents=True)
    figure = {"output_type": "display_data", "data": {"image/png": "x", "text/plain": "<Figure>"}}
    (run / "nb" / "nb.ipynb").write_text(json.dumps({"cells": [{"cell_type": "code", "outputs": [figure, figure]}]}))
    (run / "summary.json").write_text(json.dumps({"results": [{"name": "nb", "output": "nb/nb.ipynb"}]}))
    manifest = {"run": str(run), "notebooks": {"nb": "notebooks/nb.html"}}
    (site / build_site.MANIFEST).write_text(json.dumps(manifest))
    (site / "fig.png").write_bytes(_PNG)
    (site / "index.html").write_text(
        '<a href="notebooks/nb.html#top">ok</a> <a href="missing.html">gone</a> <a href="notebooks/nb.html#nope">x</a>'
        '<img src="fig.png"> <img src="lost.png"> <script>console.error("planted error")</script>'
    )
    (site / "notebooks" / "nb.html").write_text(
        '<h1 id="top">nb</h1><div class="cell_output"><img src="../fig.png"></div>'
        '<img src="http://example.invalid/cdn.png">'
    )
    problems, _ = walk_site(site, tmp_path / "chromium-profile")
    text = "\n".join(problems)
    for expected in (
        "index.html: link /missing.html: HTTP 404",
        "index.html: link /notebooks/nb.html#nope: no element with id 'nope' there",
        "/lost.png does not load",
        "index.html: console: planted error",
        "notebooks/nb.html: console: fetches http://example.invalid/cdn.png from outside the site",
        "notebooks/nb.html: 1 figure(s) on the page, 2 in the executed notebook",
    ):
        assert expected in text, f"{expected!r} not among:\n{text}"
    assert not any("fig.png does not load" in p or "#top" in p for p in problems), text


def test_links_in_a_displayed_table_point_at_the_built_pages(tmp_path):
    """Notebook 00 displays the labs table (Markdown output): MyST-NB renders outputs without
    resolving links to documents, so a link to a notebook must already name its .html page."""
    stage = build_site.Stage(tmp_path)
    source = f"notebooks/{NAMES[0]}.ipynb"
    text = f"| [{NAMES[1]}]({NAMES[1]}.ipynb) | [docs](../docs/index.md#top) | [web](https://example.org/x.ipynb) |"
    out = stage.output_markdown(text, source)
    assert f"]({NAMES[1]}.html)" in out and "](../docs/index.html#top)" in out
    assert "](https://example.org/x.ipynb)" in out
