"""Build the labkit site (``make site``): static HTML from the README, docs/, every notebook as a
CPU run of ``labkit run`` executed it, and an API reference from the docstrings.

    python scripts/build_site.py [--run RUN_DIR] [--out site]

Nothing is executed here: the notebooks come with their outputs from the run folder (the newest
complete CPU run under runs/, or the one named by --run or LABKIT_EXECUTED_RUN). The sources are
staged into a temporary folder laid out as the repository is (README.md as index.md, docs/,
notebooks/, api/), so the relative links between them hold on the site; a link to any other file
of the repository is pointed at that file, copied into the site. Sphinx (docs/conf.py) then builds
with -W --keep-going, and every local href and src of the built pages must name a file.
docs/site.md says why this builder and what each step guarantees.
"""

from __future__ import annotations

import argparse
import html.parser
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.parse
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RUN_ENV = "LABKIT_EXECUTED_RUN"
#: In the built site: the run folder it shows and each notebook's page.
MANIFEST = "build.json"
#: What a user imports beyond the kernels: the modules docs/api.md names are added to these.
API_PACKAGES = ("labkit/kernels",)
WIDGET_MIME = "application/vnd.jupyter.widget-view+json"
WIDGET_NOTE = "[an interactive panel: it needs a running kernel. Open the notebook in JupyterLab (make lab) to use it]"
#: The target of a Markdown link or image: (target) or (<target>) or (target "title")
_TARGET = r"(<[^>]+>|[^)\s]+)((?:\s+\"[^\"]*\")?\))"
#: ![alt](target): an image
_IMAGE = re.compile(r"(!\[[^\]]*\]\()" + _TARGET)
#: [text](target), not an image; the text may hold one level of brackets ([![badge](x.png)](y))
_LINK = re.compile(r"((?<!!)\[(?:[^\[\]]|\[[^\[\]]*\])*\]\()" + _TARGET)
#: <img src="target"> in raw HTML, which Sphinx passes through without copying the file
_RAW_IMG = re.compile(r"(<img\b[^>]*?\bsrc=)[\"']([^\"']+)([\"'])", re.I)


class SiteError(Exception):
    """What stops the build, in one line."""


# --- the executed run -------------------------------------------------------------------------


def notebook_names(root: Path = ROOT) -> list[str]:
    """The notebooks' file stems (``03_stream_races``): the site keeps the files' names."""
    return sorted(p.stem for p in (root / "notebooks").glob("*.ipynb"))


def run_name(stem: str) -> str:
    """The name a run's summary knows the notebook ``stem`` by (its lab's: ``stream_races``)."""
    from labkit.app.runner.notebooks import notebook_name

    return notebook_name(stem)


def run_problem(run_dir: Path, names: list[str]) -> str | None:
    """Why ``run_dir`` is not a complete CPU run of every notebook, or None."""
    summary = run_dir / "summary.json"
    if not summary.is_file():
        return f"{run_dir} has no summary.json (not a finished labkit run)"
    doc = json.loads(summary.read_text())
    if doc.get("profile") != "cpu":
        return f"{run_dir} ran the {doc.get('profile')!r} profile, not 'cpu'"
    if not doc.get("complete"):
        return f"{run_dir} is incomplete ({doc.get('stopped_by')})"
    if doc.get("solutions") or doc.get("exercises_only"):
        return f"{run_dir} ran the exercises' solutions or the exercises alone: the site shows the learner's notebooks"
    ran = {r["name"]: r for r in doc.get("results", [])}
    for name in names:
        r = ran.get(run_name(name))
        if r is None or r.get("status") != "ran":
            outcome = "was not run" if r is None else f"{r['status']}: {r.get('detail')}"
            return f"{run_dir}: notebook {name} {outcome}"
        if not (run_dir / r["output"]).is_file():
            return f"{run_dir}: {r['output']} is missing"
    return None


def find_run(given: str | None, runs_dir: Path, names: list[str]) -> Path:
    """The run folder the site shows: ``given`` (or $LABKIT_EXECUTED_RUN), else the newest complete
    CPU run under ``runs_dir``. Raises SiteError saying what to do when there is none."""
    given = given or os.environ.get(RUN_ENV)
    if given:
        run_dir = Path(given).resolve()
        why = run_problem(run_dir, names)
        if why:
            raise SiteError(f"the executed run named by --run/{RUN_ENV} cannot be used: {why}")
        return run_dir
    candidates = sorted(runs_dir.glob("*_cpu"), reverse=True)  # names start with a UTC timestamp
    for run_dir in candidates:
        if run_problem(run_dir, names) is None:
            return run_dir
    raise SiteError(
        f"no complete CPU run of every notebook under {runs_dir}: run `make workbook` first "
        f"(or name one with {RUN_ENV}=runs/<timestamp>_cpu)"
    )


# --- staging ----------------------------------------------------------------------------------


class Stage:
    """The source folder Sphinx reads. ``docs`` maps a repository path (README.md, docs/x.md,
    notebooks/x.ipynb) to its path in the stage; links are rewritten against that map."""

    def __init__(self, folder: Path, root: Path = ROOT):
        self.folder, self.root = folder, root
        self.docs: dict[str, str] = {"README.md": "index.md"}
        self.docs.update({f"docs/{p.name}": f"docs/{p.name}" for p in sorted((root / "docs").glob("*.md"))})
        self.docs.update({f"notebooks/{n}.ipynb": f"notebooks/{n}.ipynb" for n in notebook_names(root)})
        self.copied: set[str] = set()
        self.raw: set[str] = set()  # files raw HTML names: copied into the built site as they are

    def link(self, target: str, source: str, kind: str = "link") -> str:
        """``target`` as written in the repository file ``source``, rewritten for the stage.
        ``kind``: "link", "image" (Markdown) or "raw" (an <img src> of raw HTML)."""
        bare = target[1:-1] if target.startswith("<") else target
        if re.match(r"^[a-z][a-z0-9+.-]*:", bare, re.I) or bare.startswith(("#", "/")):
            return target  # a URL, an anchor on the page, or an absolute path (left for Sphinx to judge)
        path, _, anchor = bare.partition("#")
        repo_path = os.path.normpath(os.path.join(os.path.dirname(source), urllib.parse.unquote(path)))
        here = os.path.dirname(self.docs.get(source, source)) or "."
        if repo_path in self.docs and kind == "link":
            new = os.path.relpath(self.docs[repo_path], here)
        elif (self.root / repo_path).is_file() and not repo_path.startswith(".."):
            # any other file of the repository: copied into the stage under _repo/. A link uses MyST's
            # path: scheme, so the site serves the copy as a download (a .md or .ipynb file too, which
            # MyST would otherwise take for a page); an image is copied by Sphinx as any image is.
            dest = self.folder / "_repo" / repo_path
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(self.root / repo_path, dest)
            self.copied.add(repo_path)
            if kind == "raw":
                self.raw.add(repo_path)
            new = ("path:" if kind == "link" else "") + os.path.relpath(f"_repo/{repo_path}", here)
        else:
            return target  # Sphinx reports it, or the check of the built pages does: the build fails
        return new + (f"#{anchor}" if anchor else "")

    def markdown(self, text: str, source: str) -> str:
        text = _IMAGE.sub(lambda m: m.group(1) + self.link(m.group(2), source, "image") + m.group(3), text)
        text = _RAW_IMG.sub(lambda m: m.group(1) + '"' + self.link(m.group(2), source, "raw") + '"', text)
        return _LINK.sub(lambda m: m.group(1) + self.link(m.group(2), source) + m.group(3), text)

    def output_markdown(self, text: str, source: str) -> str:
        """Markdown a cell displayed: its links to pages point at the built pages (``.html``), since
        MyST-NB renders outputs without resolving links to documents; other links as in a cell."""

        def page(m):
            target = m.group(2)
            path, _, anchor = target.partition("#")
            repo_path = os.path.normpath(os.path.join(os.path.dirname(source), urllib.parse.unquote(path)))
            if repo_path not in self.docs or re.match(r"^[a-z][a-z0-9+.-]*:", path, re.I):
                return m.group(1) + self.link(target, source) + m.group(3)
            here = os.path.dirname(self.docs[source]) or "."
            built = os.path.splitext(os.path.relpath(self.docs[repo_path], here))[0] + ".html"
            return m.group(1) + built + (f"#{anchor}" if anchor else "") + m.group(3)

        return _LINK.sub(page, text)

    def write_page(self, source: str, text: str) -> None:
        dest = self.folder / self.docs[source]
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_text(self.markdown(text, source))

    def write_notebook(self, source: str, executed: Path) -> dict:
        """The executed notebook, its markdown links rewritten and its widget outputs replaced by a
        note (a widget needs a live kernel). Returns counts for the summary."""
        nb = json.loads(executed.read_text())
        widgets = images = 0
        for cell in nb["cells"]:
            if cell["cell_type"] == "markdown":
                src = "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
                cell["source"] = self.markdown(src, source)
            for out in cell.get("outputs", []):
                data = out.get("data", {})
                if "text/markdown" in data:
                    md = data["text/markdown"]
                    data["text/markdown"] = self.output_markdown("".join(md) if isinstance(md, list) else md, source)
                if WIDGET_MIME in data:
                    out["data"] = {"text/plain": WIDGET_NOTE}
                    widgets += 1
                images += any(k.startswith("image/") for k in out.get("data", {}))
        # the widgets' saved state: with it MyST-NB would load the widget manager from a CDN
        nb.get("metadata", {}).pop("widgets", None)
        dest = self.folder / self.docs[source]
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_text(json.dumps(nb))
        return {"widgets": widgets, "images": images}


def module_files(root: Path = ROOT) -> list[str]:
    """Dotted names of the modules the API reference documents: every module under API_PACKAGES
    and every module docs/api.md names (its longest dotted prefix that is a module file)."""
    mods = set()
    for pkg in API_PACKAGES:
        for p in (root / pkg).rglob("*.py"):
            rel = p.relative_to(root).with_suffix("")
            parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
            if not any(x.startswith("_") for x in parts):
                mods.add(".".join(parts))
    # a dotted name that starts with labkit (not torch.ops.labkit.copy, an op's name)
    for dotted in re.findall(r"(?<![\w.])labkit(?:\.\w+)+", (root / "docs" / "api.md").read_text()):
        parts = dotted.split(".")
        for n in range(len(parts), 1, -1):
            base = root.joinpath(*parts[:n])
            if base.with_suffix(".py").is_file() or (base / "__init__.py").is_file():
                mods.add(".".join(parts[:n]))
                break
    return sorted(mods)


def first_line(path: Path) -> str:
    """The first line of a module's docstring, read from the file (nothing imported here)."""
    m = re.match(r'\s*(?:#[^\n]*\n\s*)*[rRuU]?("""|\'\'\')\s*(.*?)(?:\n|\1)', path.read_text())
    return m.group(2).strip() if m else ""


def write_api(stage: Stage, modules: list[str]) -> None:
    api = stage.folder / "api"
    api.mkdir(parents=True, exist_ok=True)
    rows = []
    for mod in modules:
        base = stage.root.joinpath(*mod.split("."))
        path = base.with_suffix(".py") if base.with_suffix(".py").is_file() else base / "__init__.py"
        (api / f"{mod}.md").write_text(f"# `{mod}`\n\n```{{eval-rst}}\n.. automodule:: {mod}\n```\n")
        summary = first_line(path).replace("|", "\\|")
        rows.append(f"| [`{mod}`]({mod}.md) | {summary} |")
    (api / "index.md").write_text(
        "# API reference\n\n"
        "Generated from the docstrings of what a user imports: every module of `labkit.kernels`, and\n"
        "the modules the [public API](../docs/api.md) names. Each page links its source.\n\n"
        "| module | what it holds |\n|---|---|\n" + "\n".join(rows) + "\n\n"
        "```{toctree}\n:hidden:\n\n" + "\n".join(modules) + "\n```\n"
    )


def landing_toc(stage: Stage, run_dir: Path) -> str:
    """What the staged README gets at its end: where the site's other pages are, and the trees
    Sphinx needs to place every page in the navigation."""
    # docs/index.md first, then in the order its table lists them, then any it does not list
    listed = re.findall(r"\]\(([\w.-]+\.md)\)", (stage.root / "docs" / "index.md").read_text())
    order = ["index.md", *listed]
    docs = sorted(
        (v[:-3] for k, v in stage.docs.items() if k.startswith("docs/")),
        key=lambda d: (order.index(d[5:] + ".md") if d[5:] + ".md" in order else len(order), d),
    )
    nbs = [v[: -len(".ipynb")] for k, v in stage.docs.items() if k.startswith("notebooks/")]
    lines = [
        "",
        "## On this site",
        "",
        f"- The notebooks as `labkit run` executed them on the CPU tier (run `{run_dir.name}`), with the",
        "  figures recorded on GPU machines that they show:",
        *[f"  [{Path(n).name}]({n}.ipynb)" + ("," if i < len(nbs) - 1 else ".") for i, n in enumerate(nbs)],
        "- The [API reference](api/index.md), from the docstrings.",
        "",
    ]
    for caption, entries in (("Docs", docs), ("Notebooks", nbs), ("API", ["api/index"])):
        lines += ["```{toctree}", ":hidden:", f":caption: {caption}", "", *entries, "```", ""]
    return "\n".join(lines)


def stage_sources(folder: Path, run_dir: Path, root: Path = ROOT) -> dict:
    stage = Stage(folder, root)
    stage.write_page("README.md", (root / "README.md").read_text() + landing_toc(stage, run_dir))
    for source in stage.docs:
        if source.startswith("docs/"):
            stage.write_page(source, (root / source).read_text())
    summary = json.loads((run_dir / "summary.json").read_text())
    outputs = {r["name"]: run_dir / r["output"] for r in summary["results"]}
    counts = {}
    for name in notebook_names(root):
        counts[name] = stage.write_notebook(f"notebooks/{name}.ipynb", outputs[run_name(name)])
    write_api(stage, module_files(root))
    return {"notebooks": counts, "copied": sorted(stage.copied), "raw": sorted(stage.raw)}


# --- build and check --------------------------------------------------------------------------


def sphinx(stage: Path, out: Path, doctrees: Path, root: Path = ROOT) -> None:
    cmd = [sys.executable, "-m", "sphinx", "-b", "html", "-q", "-W", "--keep-going"]
    cmd += ["-c", str(root / "docs"), "-d", str(doctrees), str(stage), str(out)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")]).rstrip(":")}
    proc = subprocess.run(cmd, env=env, text=True, capture_output=True)
    if proc.stdout.strip() or proc.stderr.strip():
        print((proc.stdout + proc.stderr).rstrip(), file=sys.stderr)
    if proc.returncode:
        raise SiteError(f"sphinx-build failed (exit {proc.returncode}): the warnings above name each broken page")


class _Refs(html.parser.HTMLParser):
    def __init__(self):
        super().__init__()
        self.refs: list[str] = []

    def handle_starttag(self, tag, attrs):
        for key, value in attrs:
            if value and (key, tag) in {("href", "a"), ("src", "img"), ("src", "script"), ("href", "link")}:
                self.refs.append(value)


def broken_refs(site: Path) -> list[str]:
    """Every local href/src of the built pages that names no file, as 'page: target'."""
    bad = []
    for page in sorted(site.rglob("*.html")):
        parser = _Refs()
        parser.feed(page.read_text(errors="replace"))
        for ref in parser.refs:
            parsed = urllib.parse.urlparse(ref)
            if parsed.scheme or parsed.netloc or not parsed.path:
                continue
            target = (page.parent / urllib.parse.unquote(parsed.path)).resolve()
            if target.is_dir():
                target = target / "index.html"
            if not target.is_file():
                bad.append(f"{page.relative_to(site)}: {ref}")
    return bad


def build(out: Path, run: str | None = None, runs_dir: Path | None = None, root: Path = ROOT) -> dict:
    """Build the site into ``out`` (replaced); returns what was built. Raises SiteError."""
    names = notebook_names(root)
    run_dir = find_run(run, runs_dir or root / "runs", names)
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="labkit-site-") as tmp:
        staged = stage_sources(Path(tmp) / "src", run_dir, root)
        fresh = Path(tmp) / "html"
        sphinx(Path(tmp) / "src", fresh, Path(tmp) / "doctrees", root)
        (fresh / ".buildinfo").unlink(missing_ok=True)
        for repo_path in staged["raw"]:  # raw HTML's images, where its rewritten src looks for them
            (fresh / "_repo" / repo_path).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(root / repo_path, fresh / "_repo" / repo_path)
        bad = broken_refs(fresh)
        if bad:
            raise SiteError(f"{len(bad)} link(s) on the built pages name no file: " + "; ".join(bad[:10]))
        # what the site was built from: the browser test compares each notebook page with it
        manifest = {"run": str(run_dir), "notebooks": {n: f"notebooks/{n}.html" for n in names}}
        (fresh / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
        if out.exists():
            shutil.rmtree(out)
        shutil.copytree(fresh, out)
    return {"run": str(run_dir), "out": str(out), "seconds": time.perf_counter() - start, **staged}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--run", help=f"the executed CPU run folder (default: ${RUN_ENV}, else the newest under runs/)")
    ap.add_argument("--runs-dir", type=Path, default=ROOT / "runs", help="where to look for runs (default: runs/)")
    ap.add_argument("--out", type=Path, default=ROOT / "site", help="the site folder (default: site/)")
    args = ap.parse_args(argv)
    try:
        info = build(args.out.resolve(), args.run, args.runs_dir.resolve())
    except SiteError as e:
        print(f"make site: {e}", file=sys.stderr)
        return 1
    pages = sum(1 for _ in Path(info["out"]).rglob("*.html"))
    print(f"site: {pages} pages in {info['out']} from {info['run']} in {info['seconds']:.0f} s")
    print(f"serve it: python -m http.server -d {info['out']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
