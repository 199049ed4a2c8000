"""JupyterLab in headless Chromium, looked at as a reader would: the browser tests' machinery.

``tests/notebooks/test_browser.py`` uses it; nothing in ``labkit`` does. Three parts:

* :class:`LabServer`: JupyterLab started through ``labkit lab`` (the command ``make lab`` runs),
  on 127.0.0.1, a free port, a random token, ``--no-browser``; stopped with its whole process
  tree (kernels and their children included) whatever happens.
* :func:`check_notebook`: open a notebook in the page, Run > Run All Cells, wait for the kernel
  to go idle, save it, then compare what the page shows with what the saved notebook holds:
  no error outputs, every widget output rendered as a widget view, every figure as an image
  that loaded; then in each widget panel change one control, press its button and see the
  panel's output change; a full-page screenshot at the end.
* :func:`check_index`: open a ``labkit run`` folder's ``index.html`` and load every link and
  thumbnail it has.

Each check returns the problems it found as lines naming the notebook, the cell and the widget,
so a failing test says what a reader would have seen.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import http.server
import json
import os
import re
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

#: Debian's Chromium (``apt-get install chromium``); Playwright's own browser download does not
#: work on the project's machines. LABKIT_CHROMIUM points elsewhere.
CHROMIUM = Path(os.environ.get("LABKIT_CHROMIUM", "/usr/bin/chromium"))
#: The flags that work headless here (no sandbox as root, no GPU, nothing fetched in the background).
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
VIEWPORT = {"width": 1400, "height": 1000}
#: Tallest full-page screenshot (pixels); a longer notebook is cut there.
MAX_SCREENSHOT_HEIGHT = 30000

WIDGET_MIME = "application/vnd.jupyter.widget-view+json"
IMAGE_MIMES = ("image/png", "image/jpeg", "image/svg+xml")
#: A widget's text fallback (what the page shows when no widget view renders), e.g. ``VBox(children=(...``
FALLBACK = re.compile(r"^\s*[A-Z]\w*\((children|value|description|options|layout)=")
#: What jupyterlab_widgets writes instead of a view: a missing model, a missing view module.
WIDGET_ERROR_TEXT = ("Error displaying widget", "Loading widget")

#: The one active notebook panel of the page.
PANEL = ".jp-NotebookPanel:not(.lm-mod-hidden)"


def missing() -> str | None:
    """Why the browser tests cannot run on this machine, or None."""
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "Python Playwright is not installed (it is in the test extra: pip install -e '.[test]')"
    if not (CHROMIUM.is_file() and os.access(CHROMIUM, os.X_OK)):
        return f"no Chromium at {CHROMIUM} (Debian: apt-get install chromium; or set LABKIT_CHROMIUM)"
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# --------------------------------------------------------------------------------------------
# The server
# --------------------------------------------------------------------------------------------


def lab_settings(folder: Path) -> Path:
    """A JupyterLab settings folder of the test's own: the defaults a new reader gets, less the
    news and update-check toasts (they would cover the page and reach the network)."""
    f = folder / "@jupyterlab" / "apputils-extension" / "notification.jupyterlab-settings"
    f.parent.mkdir(parents=True, exist_ok=True)
    f.write_text(json.dumps({"fetchNews": "false", "checkForUpdates": False}))
    return folder


class LabServer:
    """``labkit lab`` serving ``root``; ``with LabServer(...) as lab:`` starts and always stops it.

    ``env`` is added to this process's environment for the server, whose kernels inherit it."""

    def __init__(self, root: Path, env: dict[str, str], log: Path, start_timeout_s: float = 120.0):
        self.root, self.env, self.log_path, self.start_timeout_s = Path(root), dict(env), Path(log), start_timeout_s
        self.proc: subprocess.Popen | None = None
        self.port = 0
        self.token = ""
        self.argv: list[str] = []
        self.ctx = None  # the browser context that looks at it (set by the test)
        self.run_dir: Path | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> LabServer:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self, attempts: int = 3) -> None:
        for attempt in range(attempts):
            self.port, self.token = free_port(), secrets.token_urlsafe(24)
            # The same entry point a reader uses (make lab -> labkit lab), with a test's options:
            # only 127.0.0.1, this port or fail (no silent retry on another), never a browser.
            self.argv = [
                sys.executable,
                "-m",
                "labkit",
                "lab",
                "--no-browser",
                "--ip=127.0.0.1",
                f"--port={self.port}",
                "--ServerApp.port_retries=0",
                f"--ServerApp.root_dir={self.root}",
                "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
            ]
            # The token goes by environment (JupyterLab reads JUPYTER_TOKEN), not on a command line
            # that any local user can read with ps.
            env = {**os.environ, **self.env, "JUPYTER_TOKEN": self.token}
            env.pop("JUPYTER_PORT", None)
            with open(self.log_path, "ab") as log:
                log.write(f"\n--- start {attempt + 1}: {' '.join(self.argv)}\n".encode())
                log.flush()
                self.proc = subprocess.Popen(
                    self.argv,
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            deadline = time.monotonic() + self.start_timeout_s
            while time.monotonic() < deadline and self.proc.poll() is None:
                try:
                    self.api("GET", "/api/status")
                    return
                except (OSError, urllib.error.URLError):
                    time.sleep(0.3)
            self.stop()
        raise RuntimeError(
            f"JupyterLab did not start through labkit lab in {attempts} attempts; "
            f"its log: {self.log_path}\n{self.log_tail()}"
        )

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def api(self, method: str, path: str, body: dict | None = None, token: bool = True, timeout: float = 10.0):
        """One call of the server's REST API; the decoded JSON (None for an empty body)."""
        req = urllib.request.Request(
            self.url + path, method=method, data=None if body is None else json.dumps(body).encode()
        )
        if token:
            req.add_header("Authorization", f"token {self.token}")
        with urllib.request.urlopen(req, timeout=timeout) as r:
            data = r.read()
        return json.loads(data) if data else None

    def refuses_without_token(self) -> bool:
        try:
            self.api("GET", "/api/sessions", token=False)
        except urllib.error.HTTPError as e:
            return e.code in (401, 403)
        return False

    def session(self, path: str) -> dict | None:
        """The server's session of the notebook at ``path`` (relative to the root), or None."""
        for s in self.api("GET", "/api/sessions") or []:
            if s.get("path") == path:
                return s
        return None

    def kernel(self, path: str) -> dict | None:
        s = self.session(path)
        return self.api("GET", f"/api/kernels/{s['kernel']['id']}") if s and s.get("kernel") else None

    def close_session(self, path: str) -> None:
        s = self.session(path)
        if s:
            self.api("DELETE", f"/api/sessions/{s['id']}")

    def stop(self) -> None:
        """Stop the server, its kernels and everything they started; never leaves one running."""
        proc, self.proc = self.proc, None
        if proc is None:
            return
        tree = []
        with contextlib.suppress(Exception):
            import psutil

            tree = psutil.Process(proc.pid).children(recursive=True)
        if proc.poll() is None:
            with contextlib.suppress(Exception):
                self.api("POST", "/api/shutdown", timeout=5)  # kernels shut down first, cleanly
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(15)
        for sig in (signal.SIGTERM, signal.SIGKILL):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, sig)  # the server's process group (start_new_session)
            for p in tree:  # kernels and their children may have sessions of their own
                with contextlib.suppress(Exception):
                    p.send_signal(sig)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(10)
            if proc.poll() is not None and not any(_alive(p) for p in tree):
                break


def _alive(p) -> bool:
    try:
        return p.is_running() and p.status() != "zombie"
    except Exception:
        return False


@contextlib.contextmanager
def chromium(profile_dir: Path):
    """A headless Chromium (Debian's) driven by Playwright, with a fresh profile folder."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        ctx = p.chromium.launch_persistent_context(
            str(profile_dir), executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS, viewport=VIEWPORT
        )
        try:
            yield ctx
        finally:
            ctx.close()


# --------------------------------------------------------------------------------------------
# One notebook in JupyterLab
# --------------------------------------------------------------------------------------------


@dataclasses.dataclass
class NotebookCheck:
    name: str
    problems: list[str] = dataclasses.field(default_factory=list)
    lines: list[str] = dataclasses.field(default_factory=list)  # what was done and seen
    screenshot: Path | None = None
    saved: Path | None = None  # the notebook as JupyterLab saved it
    seconds: float = 0.0

    def problem(self, text: str) -> None:
        self.problems.append(f"{self.name}: {text}")

    def report(self) -> str:
        head = f"{self.name}: {'FAILED' if self.problems else 'ok'} in {self.seconds:.0f} s"
        return "\n".join([head] + [f"  {x}" for x in self.lines + self.problems])


#: Per cell of the open notebook: its prompt and, per top-level output, what the page shows.
#: Top-level widget outputs are tagged data-labkit-widget="<n>" to be found again.
#: a prompt that shows an execution count ("[3]:"): the cell ran
_COUNTED = re.compile(r"\[\s*\d+\s*\]")
_READ_CELLS = r"""panelSel => {
  const panel = document.querySelector(panelSel);
  if (!panel) return null;
  panel.querySelectorAll('[data-labkit-widget]').forEach(e => e.removeAttribute('data-labkit-widget'));
  let n = 0;
  return Array.from(panel.querySelectorAll('.jp-Notebook .jp-Cell')).map(cell => ({
    code: cell.classList.contains('jp-CodeCell'),
    prompt: ((cell.querySelector('.jp-InputArea-prompt') || {}).textContent || '').trim(),
    outputs: Array.from(cell.querySelectorAll('.jp-OutputArea-output'))
      .filter(o => !o.parentElement.closest('.jp-OutputArea-output'))
      .map(o => {
        const widget = o.classList.contains('jupyter-widgets') || !!o.querySelector('.jupyter-widgets');
        const text = o.innerText || '';
        const broken = !!o.querySelector('.jupyter-widgets-error-widget')
          || text.includes('Error displaying widget') || text.includes('Loading widget');
        const rec = {mime: o.getAttribute('data-mime-type') || '', widget, broken, text: text.slice(0, 300),
                     images: Array.from(o.querySelectorAll('img')).map(i => i.complete && i.naturalWidth > 0)};
        if (widget && !broken) { rec.tag = String(n); o.setAttribute('data-labkit-widget', String(n++)); }
        return rec;
      }),
  }));
}"""

#: The controls of a widget panel, in page order, and whether it has an output to watch.
_READ_CONTROLS = r"""el => {
  const label = w => {
    const l = w.querySelector(':scope > .widget-label');
    return (l && l.textContent.trim()) || '';
  };
  const out = [], seen = {};
  el.querySelectorAll('.widget-dropdown, .widget-toggle-buttons, .widget-checkbox, .widget-slider, '
                      + '.widget-text, .widget-button').forEach(w => {
    if (w.classList.contains('widget-toggle-button')
        || w.closest('.widget-toggle-buttons') && w.classList.contains('widget-button')) return;
    let kind = w.classList.contains('widget-dropdown') ? 'dropdown'
      : w.classList.contains('widget-toggle-buttons') ? 'toggle'
      : w.classList.contains('widget-checkbox') ? 'checkbox'
      : w.classList.contains('widget-slider') ? 'slider'
      : w.classList.contains('widget-text') ? 'text' : 'button';
    const disabled = !!w.querySelector('[disabled]') || w.hasAttribute('disabled')
      || w.classList.contains('mod-disabled');
    const name = kind === 'button' ? (w.textContent.trim() || w.getAttribute('title') || '') : label(w);
    const index = seen[kind] = (kind in seen) ? seen[kind] + 1 : 0;   // nth of its kind in the panel
    out.push({kind, name, disabled, index});
  });
  const outputs = el.querySelectorAll('.widget-html-content, .widget-htmlmath-content, .widget-output, '
                                      + '.widget-label-basic, .widget-textarea, .widget-image').length;
  return {controls: out, outputs};
}"""

#: What a panel's outputs show now (text and images), controls left out.
_OUTPUT_SIGNATURE = r"""el => {
  const parts = [];
  el.querySelectorAll('.widget-html-content, .widget-htmlmath-content, .widget-output, .widget-label-basic')
    .forEach(o => { if (!o.parentElement.closest('.widget-output')) parts.push(o.innerText); });
  el.querySelectorAll('.widget-textarea textarea').forEach(t => parts.push(t.value));
  el.querySelectorAll('img').forEach(i => parts.push('img:' + i.src.length + ':' + i.src.slice(-64)));
  return parts.join('\n\u241e\n');
}"""


def _first_line(src: str) -> str:
    for line in src.splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            return line.strip()[:90]
    return src.strip()[:90]


def _widget_name(output: dict) -> str:
    """A widget output's name in a message: its text repr, shortened (``VBox(children=(Button(...``)."""
    text = "".join(output.get("data", {}).get("text/plain", "")) or "a widget"
    return text if len(text) <= 140 else text[:137] + "..."


class NotebookPage:
    """The JupyterLab page of one open notebook (a Playwright page on the server)."""

    def __init__(self, ctx, server: LabServer, path: str):
        self.ctx, self.server, self.path = ctx, server, path
        self.page = ctx.new_page()

    def open(self, timeout_s: float = 120.0) -> None:
        q = urllib.parse.urlencode({"token": self.server.token})
        self.page.goto(
            f"{self.server.url}/lab/tree/{urllib.parse.quote(self.path)}?reset&{q}", timeout=timeout_s * 1000
        )
        self.page.wait_for_selector(f"{PANEL} .jp-Notebook .jp-Cell", timeout=timeout_s * 1000)
        self.wait_kernel_idle(timeout_s, started=True)

    def status(self) -> str:
        """The kernel status the notebook's toolbar shows (idle, busy, ...)."""
        return self.page.evaluate(
            f"() => (document.querySelector('{PANEL} .jp-Notebook-ExecutionIndicator') || {{}}).dataset?.status || ''"
        )

    def kernel_state(self) -> dict:
        k = self.server.kernel(self.path)
        return k or {}

    def wait_kernel_idle(self, timeout_s: float, started: bool = False) -> bool:
        """Until the page and the server both say idle (the page's indicator, the server's state)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.status() == "idle" and self.kernel_state().get("execution_state") == "idle":
                return True
            time.sleep(0.5)
        return False

    def menu(self, menu: str, command: str) -> None:
        """A reader's click: the menu bar's ``menu``, then its item for ``command``."""
        self.page.click(f".lm-MenuBar-itemLabel:text-is('{menu}')")
        self.page.click(f".lm-Menu-item[data-command='{command}']")

    def cells(self) -> list[dict]:
        return self.page.evaluate(_READ_CELLS, PANEL) or []

    def run_all(self, timeout_s: float) -> tuple[bool, float]:
        """Run > Run All Cells, then wait until no cell is queued or running and the kernel is idle
        (page and server, twice in a row a second apart). Returns (finished, seconds)."""
        t0 = time.monotonic()
        self.running: list[int] = []
        self.menu("Run", "runmenu:run-all")
        deadline, calm_since = t0 + timeout_s, None
        time.sleep(0.2)
        while time.monotonic() < deadline:
            # the cells first, then the dialog: a kernel that dies at once must still leave the
            # cell it died in named (read before the dialog replaces what the page shows)
            cells = self.cells()
            running = [i for i, c in enumerate(cells) if c["code"] and "*" in c["prompt"]]
            if running:
                self.running = running[:1]  # the cell running now: the first of those queued
            if self.dialog():
                if not self.running:  # died before a poll saw it run: the first code cell without a count
                    uncounted = [i for i, c in enumerate(cells) if c["code"] and not _COUNTED.search(c["prompt"])]
                    self.running = uncounted[:1]
                return False, time.monotonic() - t0
            now = time.monotonic()
            if not running and self.status() == "idle" and self.kernel_state().get("execution_state") == "idle":
                calm_since = now if calm_since is None else calm_since
                if now - calm_since >= 1.0 and now - t0 >= 2.0:  # idle at looks a second apart, not at once
                    return True, now - t0
            else:
                calm_since = None
            time.sleep(0.25 if now - t0 < 5 else 1.0)  # quick looks while the first cells start
        return False, time.monotonic() - t0

    def dialog(self) -> str:
        """The text of a dialog JupyterLab shows (e.g. "Kernel Restarting": the kernel died), or ""."""
        d = self.page.locator(".jp-Dialog")
        return d.first.inner_text().strip() if d.count() else ""

    def wait_widgets_settled(self, timeout_s: float = 30.0) -> None:
        """Until no output says "Loading widget..." (a missing model turns into an error by then)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if not any("Loading widget" in o["text"] for c in self.cells() for o in c["outputs"]):
                return
            time.sleep(0.5)

    def save(self, file: Path, timeout_s: float = 30.0) -> bool:
        """File > Save Notebook; True once the file on disk is newer and the tab is clean."""
        before = file.stat().st_mtime_ns if file.exists() else 0
        self.menu("File", "docmanager:save")
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            dirty = self.page.locator(".lm-TabBar-tab.jp-mod-current.jp-mod-dirty").count()
            if file.exists() and file.stat().st_mtime_ns != before and not dirty:
                return True
            time.sleep(0.3)
        return False

    def log_console_count(self) -> int:
        """Messages the status bar's log console item counts (widget callbacks' errors go there)."""
        item = self.page.locator(".jp-LogConsoleStatusItem")
        if not item.count() or "lm-mod-hidden" in (item.get_attribute("class") or ""):
            return 0
        m = re.search(r"\d+", item.inner_text())
        return int(m.group()) if m else 0

    def log_console_text(self) -> str:
        """Open the log console (a reader's click on the status bar item), read it, close it."""
        text = ""
        with contextlib.suppress(Exception):
            self.page.click(".jp-LogConsoleStatusItem", timeout=5000)
            self.page.wait_for_selector(".jp-LogConsolePanel", timeout=5000)
            time.sleep(0.5)
            text = self.page.inner_text(".jp-LogConsolePanel")
        with contextlib.suppress(Exception):
            self.page.locator(".lm-TabBar-tab:has-text('Log:') .lm-TabBar-tabCloseIcon").first.click(timeout=5000)
        return text

    def screenshot(self, path: Path) -> Path:
        """The whole notebook in one image: the window grown to the notebook's height first
        (JupyterLab scrolls inside the page, so a plain full-page shot shows one screen), the
        notebook scrolled to its top."""
        # how much taller the notebook's scroller must be to hold its last cell (its scrollHeight
        # would not do: JupyterLab pads a notebook by a screen to scroll past its end)
        measure = f"""() => {{
            const s = document.querySelector('{PANEL} .jp-WindowedPanel-outer');
            const cells = document.querySelectorAll('{PANEL} .jp-Notebook .jp-Cell');
            if (!s || !cells.length) return 0;
            s.scrollTop = 0;
            const bottom = cells[cells.length - 1].getBoundingClientRect().bottom - s.getBoundingClientRect().top;
            return Math.ceil(bottom + 30 - s.clientHeight); }}"""
        height = VIEWPORT["height"]
        try:
            for _ in range(5):  # cells drawn for the first time may grow the notebook: measure again
                extra = int(self.page.evaluate(measure))
                if extra <= 2 or height >= MAX_SCREENSHOT_HEIGHT:
                    break
                height = min(height + extra, MAX_SCREENSHOT_HEIGHT)
                self.page.set_viewport_size({"width": VIEWPORT["width"], "height": height})
                time.sleep(1.0)
            self.page.evaluate(measure)
            time.sleep(0.5)
            path.parent.mkdir(parents=True, exist_ok=True)
            self.page.screenshot(path=str(path), full_page=True)
        finally:
            self.page.set_viewport_size(VIEWPORT)
        return path

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.server.close_session(self.path)  # the kernel goes with it
        with contextlib.suppress(Exception):
            self.page.close()


def check_notebook(
    ctx, server: LabServer, path: str, name: str, timeout_s: float, screenshot: Path, panel_timeout_s: float = 300.0
) -> NotebookCheck:
    """Open ``path`` (relative to the server's root) in the page, run it, look at it, use its panels.

    ``timeout_s`` bounds the run of all cells (the profile's timeout for the notebook);
    ``panel_timeout_s`` each panel's rerun."""
    res = NotebookCheck(name)
    file = server.root / path
    t0 = time.monotonic()
    nb = NotebookPage(ctx, server, path)
    try:
        nb.open()
        finished, seconds = nb.run_all(timeout_s)
        res.lines.append(f"Run > Run All Cells: {'kernel idle' if finished else 'stopped'} after {seconds:.0f} s")
        if not finished:
            cell = f"cell {nb.running[0]}" if nb.running else "an unknown cell"
            dialog = " | ".join(ln for ln in nb.dialog().splitlines() if ln.strip())
            res.problem(
                f"JupyterLab shows a dialog while running {cell}: {dialog[:300]}"
                if dialog
                else f"did not finish in {timeout_s:.0f} s (the profile's timeout); running {cell}"
            )
            return res
        nb.wait_widgets_settled()
        if not nb.save(file):
            res.problem("File > Save Notebook did not write the notebook")
            return res
        res.saved = file
        saved = json.loads(file.read_text(encoding="utf-8"))
        panels = _check_outputs(res, saved["cells"], nb.cells())
        for tag, where, widget in panels:
            _use_panel(res, nb, tag, where, widget, panel_timeout_s)
    except Exception as e:
        res.problem(f"the browser check stopped: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
    finally:
        with contextlib.suppress(Exception):
            res.screenshot = nb.screenshot(screenshot)
        nb.close()
        res.seconds = time.monotonic() - t0
    return res


def _check_outputs(res: NotebookCheck, file_cells: list[dict], dom_cells: list[dict]) -> list[tuple[str, str, str]]:
    """Saved notebook against the page, cell by cell. Returns the widgets to use: (tag, where, name)."""
    if len(file_cells) != len(dom_cells):
        res.problem(f"the page shows {len(dom_cells)} cells, the saved notebook has {len(file_cells)}")
        return []
    panels, widgets, images, draws = [], 0, 0, False
    for i, (fc, dc) in enumerate(zip(file_cells, dom_cells)):
        if fc["cell_type"] != "code":
            continue
        src = "".join(fc["source"])
        where = f"cell {i} `{_first_line(src)}`"
        draws = draws or bool(re.search(r"\bplot\.(save|beside)\(", src))
        outs = fc.get("outputs", [])
        for o in outs:
            if o["output_type"] == "error":
                first = (str(o.get("evalue", "")).strip().splitlines() or [""])[0]
                res.problem(f"{where} raised {o.get('ename')}: {first}")
        for o in dc["outputs"]:
            if (
                o["mime"] == "application/vnd.jupyter.stderr"
                and "Traceback" in o["text"]
                and not any(x["output_type"] == "error" for x in outs)
            ):
                res.problem(f"{where} wrote a traceback to stderr: {o['text'][:200]!r}")
            if FALLBACK.match(o["text"]) and not o["widget"]:
                res.problem(f"{where} shows a widget's text fallback instead of its view: {o['text'][:120]!r}")
        # widgets: every widget output of the saved cell is a rendered widget view on the page
        expected = [o for o in outs if WIDGET_MIME in o.get("data", {})]
        shown = [o for o in dc["outputs"] if o["widget"] and not o["broken"]]
        broken = [o for o in dc["outputs"] if o["broken"] or (FALLBACK.match(o["text"]) and not o["widget"])]
        widgets += len(expected)
        if len(shown) < len(expected):
            # name the widgets that did not render: in output order, the ones past those that did
            dom_widgetish = [o for o in dc["outputs"] if o["widget"] or o["broken"] or FALLBACK.match(o["text"])]
            for k, o in enumerate(expected):
                seen = dom_widgetish[k] if k < len(dom_widgetish) else None
                if seen is None or seen["broken"] or not seen["widget"]:
                    what = seen["text"].strip()[:120] if seen else "nothing"
                    res.problem(
                        f"{where}: widget {_widget_name(o)} is not rendered as a widget view (the page shows {what!r})"
                    )
        elif broken:
            for o in broken:
                res.problem(f"{where}: a widget output shows {o['text'].strip()[:120]!r}")
        if len(shown) == len(expected):
            many = len(expected) > 1
            panels += [
                (o["tag"], f"{where}{f' widget {k + 1}' if many else ''}", _widget_name(f))
                for k, (o, f) in enumerate(zip(shown, expected))
                if "tag" in o
            ]
        # figures: every image output is an image that loaded; every "saved X.png" line is shown
        want = sum(any(m in o.get("data", {}) for m in IMAGE_MIMES) for o in outs)
        loaded = sum(ok for o in dc["outputs"] for ok in o["images"])
        failed = sum(not ok for o in dc["outputs"] for ok in o["images"])
        said = [
            ln
            for o in outs
            if o["output_type"] == "stream"
            for ln in "".join(o["text"]).splitlines()
            if re.match(r"saved .*\.(png|svg|jpg)$", ln)
        ]
        if failed:
            res.problem(f"{where}: {failed} image(s) did not load (naturalWidth 0)")
        if loaded < want:
            res.problem(f"{where}: {want} figure output(s) in the notebook, {loaded} shown as images")
        if loaded < len(said):
            res.problem(
                f"{where}: saved {len(said)} figure(s) ({', '.join(Path(s).name for s in said)}) "
                f"but shows {loaded} inline"
            )
        images += loaded
    if draws and not images:
        res.problem("calls plot.save/plot.beside but shows no image")
    res.lines.append(f"{widgets} widget output(s), {len(panels)} rendered as views; {images} image(s) shown")
    return panels


def _use_panel(res: NotebookCheck, nb: NotebookPage, tag: str, where: str, widget: str, timeout_s: float) -> None:
    """Change one control of a widget panel and press its button; its output must change.

    A widget without controls (a progress bar) or without an output widget is not a panel: said
    in the lines, not used."""
    page = nb.page
    el = page.locator(f"{PANEL} [data-labkit-widget='{tag}']")
    el.scroll_into_view_if_needed()
    info = el.evaluate(_READ_CONTROLS)
    controls = [c for c in info["controls"] if not c["disabled"]]
    buttons = [c for c in controls if c["kind"] == "button"]
    if not controls or not info["outputs"]:
        why = "no control" if not controls else "no output widget to watch"
        res.lines.append(f"{where}: {widget[:70]}: {why}, not a panel")
        return
    label = f"{where}: panel" + (
        f" with button {buttons[0]['name']!r}"
        if buttons
        else f" of {', '.join(c['kind'] + ' ' + repr(c['name']) for c in controls)}"
    )
    before = el.evaluate(_OUTPUT_SIGNATURE)
    logs_before = nb.log_console_count()
    activity = nb.kernel_state().get("last_activity")
    did = []
    # the first control, in this order of kinds, that can be changed (a one-option dropdown cannot)
    for kind in ("dropdown", "toggle", "checkbox", "slider", "text"):
        for c in (c for c in controls if c["kind"] == kind):
            done = _change(el, c)
            if done:
                did.append(done)
                break
        if did:
            break
    if not did and not buttons:
        res.problem(f"{label}: none of its controls could be changed (each has one value only)")
        return
    if buttons:
        button = el.locator("button.widget-button:not(.widget-toggle-button)")
        if buttons[0]["name"]:
            button = button.filter(has_text=buttons[0]["name"])
        button.first.click()
        did.append(f"pressed {buttons[0]['name']!r}")
    action = ", ".join(d for d in did if d)
    # wait: the output changed, the kernel is idle again and the output stayed the same 1.5 s;
    # or the kernel answered (its last activity moved), is idle, and nothing changed for 5 s
    t0 = time.monotonic()
    deadline, last, stable_since, quiet_since = t0 + timeout_s, None, None, None
    outcome = "timeout"
    while time.monotonic() < deadline:
        now = el.evaluate(_OUTPUT_SIGNATURE)
        k = nb.kernel_state()
        idle = k.get("execution_state") == "idle" and nb.status() == "idle"
        if now != last:
            last, stable_since = now, time.monotonic()
        if now != before and idle and time.monotonic() - stable_since >= 1.5:
            outcome = "changed"
            break
        if now == before and idle and k.get("last_activity") != activity:
            quiet_since = quiet_since or time.monotonic()
            if time.monotonic() - quiet_since >= 5.0:
                outcome = "unchanged"
                break
        else:
            quiet_since = None
        time.sleep(0.25)
    seconds = time.monotonic() - t0
    new_logs = nb.log_console_count() - logs_before
    if outcome == "changed":
        res.lines.append(f"{label}: {action}; output changed in {seconds:.1f} s")
        if "Traceback" in last:
            res.problem(f"{label}: after {action} the output shows a traceback: {last[:200]!r}")
    elif outcome == "unchanged":
        res.problem(f"{label}: {action}; the kernel answered but the panel's output did not change")
    else:
        res.problem(f"{label}: {action}; the panel's output did not settle on a new value in {timeout_s:.0f} s")
    if new_logs > 0:
        text = nb.log_console_text()
        if "Traceback" in text or "Error" in text:
            errors = [ln.strip() for ln in text.splitlines() if re.match(r"\s*\w*(Error|Exception)\b.*:", ln)]
            res.problem(
                f"{label}: {action}; the widget's callback raised (log console: "
                f"{errors[-1] if errors else text.strip()[-200:]})"
            )


def _change(el, c: dict) -> str:
    """Change one control the way a reader would; returns what was done."""
    name = c["name"] or c["kind"]
    if c["kind"] == "dropdown":
        sel = el.locator(".widget-dropdown select").nth(c["index"])
        options = sel.evaluate("s => Array.from(s.options).map(o => o.value)")
        cur = sel.input_value()
        if len(options) < 2:
            return ""
        new = options[(options.index(cur) + 1) % len(options)] if cur in options else options[0]
        sel.select_option(new)
        return f"set dropdown {name!r} from {cur!r} to {new!r}"
    if c["kind"] == "toggle":
        box = el.locator(".widget-toggle-buttons").nth(c["index"])
        other = box.locator("button.widget-toggle-button:not(.mod-active)").first
        text = other.inner_text().strip()
        other.click()
        return f"picked {text!r} in {name!r}"
    if c["kind"] == "checkbox":
        el.locator(".widget-checkbox input[type=checkbox]").nth(c["index"]).click()
        return f"toggled checkbox {name!r}"
    if c["kind"] == "slider":
        box = el.locator(".widget-slider").nth(c["index"])
        handle = box.locator(".noUi-handle").first
        readout = box.locator(".widget-readout").first
        before = readout.inner_text()
        handle.focus()
        handle.press("ArrowRight")
        if readout.inner_text() == before:
            handle.press("ArrowLeft")
        return f"moved slider {name!r} from {before!r} to {readout.inner_text()!r}"
    if c["kind"] == "text":
        inp = el.locator(".widget-text").nth(c["index"]).locator("input").first
        cur = inp.input_value()
        try:
            new = str(int(float(cur)) + 1)
        except ValueError:
            new = cur + "x"
        inp.fill(new)
        inp.press("Enter")
        return f"typed {new!r} into {name!r} (was {cur!r})"
    return ""


# --------------------------------------------------------------------------------------------
# A run folder's index.html
# --------------------------------------------------------------------------------------------


@contextlib.contextmanager
def serve_folder(folder: Path):
    """A static HTTP server for ``folder`` on 127.0.0.1 (a free port), stopped on exit."""

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(folder)))
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(10)


_READ_INDEX = r"""() => ({
  links: Array.from(document.querySelectorAll('a[href]')).map(a => ({href: a.href, text: a.textContent.trim()})),
  images: Array.from(document.querySelectorAll('img')).map(i => ({src: i.src, ok: i.complete && i.naturalWidth > 0,
                                                                   width: i.naturalWidth})),
})"""


def check_index(ctx, run_dir: Path) -> tuple[list[str], list[str]]:
    """Open ``run_dir/index.html`` over HTTP and from disk; every link must load (HTTP 200, a
    notebook that parses, an image that decodes) and every thumbnail must show (naturalWidth > 0).
    Every notebook and figure of ``summary.json`` must be linked. Returns (problems, lines)."""
    problems, lines = [], []
    summary = json.loads((run_dir / "summary.json").read_text())
    page = ctx.new_page()
    try:
        with serve_folder(run_dir) as base:
            page.goto(f"{base}/index.html", wait_until="load")
            found = page.evaluate(_READ_INDEX)
            for img in found["images"]:
                if not img["ok"]:
                    problems.append(f"index.html: thumbnail {img['src']} does not show (naturalWidth {img['width']})")
            for link in found["links"]:
                resp = page.request.get(link["href"])
                body = resp.body() if resp.ok else b""
                if not resp.ok or not body:
                    problems.append(
                        f"index.html: link {link['text']!r} -> {link['href']}: HTTP {resp.status}"
                        f"{', empty' if resp.ok else ''}"
                    )
                elif link["href"].endswith(".ipynb"):
                    try:
                        assert json.loads(body)["cells"]
                    except Exception:
                        problems.append(f"index.html: link {link['text']!r} -> {link['href']} is not a notebook")
                elif link["href"].endswith(".png") and not body.startswith(b"\x89PNG"):
                    problems.append(f"index.html: link {link['text']!r} -> {link['href']} is not a PNG")
            hrefs = {urllib.parse.unquote(urllib.parse.urlparse(x["href"]).path).lstrip("/") for x in found["links"]}
            srcs = {urllib.parse.unquote(urllib.parse.urlparse(x["src"]).path).lstrip("/") for x in found["images"]}
            for r in summary["results"]:
                if r.get("output") and r["output"] not in hrefs:
                    problems.append(f"index.html: no link to {r['name']}'s executed notebook {r['output']}")
                for f in r.get("figures", []):
                    if f not in srcs:
                        problems.append(f"index.html: no thumbnail of {r['name']}'s figure {f}")
            lines.append(f"over HTTP: {len(found['links'])} link(s) and {len(found['images'])} thumbnail(s) checked")
        # as a reader opens it: the file itself, relative paths from disk
        page.goto((run_dir / "index.html").resolve().as_uri(), wait_until="load")
        found = page.evaluate(_READ_INDEX)
        bad = [i["src"] for i in found["images"] if not i["ok"]]
        problems += [f"index.html opened from disk: thumbnail {s} does not show" for s in bad]
        missing_files = [
            x["href"]
            for x in found["links"]
            if x["href"].startswith("file:")
            and not Path(urllib.parse.unquote(urllib.parse.urlparse(x["href"]).path)).is_file()
        ]
        problems += [f"index.html opened from disk: link {h} has no file" for h in missing_files]
        lines.append(f"from disk: {len(found['images'])} thumbnail(s) shown, {len(found['links'])} link(s) to files")
        page.screenshot(path=str(run_dir / "index.png"), full_page=True)
    finally:
        page.close()
    return problems, lines
