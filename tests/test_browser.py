"""End to end in a real browser: the live monitor in JupyterLab and Notebook 7, and the saved-notebook view.

A JupyterLab server runs on 127.0.0.1 (a free port, no token: loopback only) with its own settings,
workspaces, runtime and config folders, so the test neither reads nor changes the user's Jupyter
setup. Headless Chromium (Debian's ``/usr/bin/chromium``, driven by the ``playwright`` package) opens
a notebook and runs its cells with Shift+Enter, as a person would. Requests to anything other than
the server (or local files) are aborted, so nothing leaves the machine.

Screenshots go to ``artifacts/browser/`` (ignored by git). With ``VRAMLAB_README_SHOT=1`` the test
also writes the README's picture of the monitor, ``docs/img/monitor.png``.

Deselect locally with ``-m "not browser"``; CI runs these tests (``.ci/run`` installs chromium).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

pytestmark = pytest.mark.browser

CHROMIUM = "/usr/bin/chromium"
LAUNCH_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
               "--disable-sync", "--no-first-run"]
REPO = Path(__file__).resolve().parent.parent
ARTIFACTS = REPO / "artifacts" / "browser"
README_SHOT = REPO / "docs" / "img" / "monitor.png"

if not os.path.exists(CHROMIUM):
    pytest.skip(f"no Chromium at {CHROMIUM} (Debian's chromium package; .ci/run installs it)", allow_module_level=True)
try:
    from playwright.sync_api import expect
except ImportError:
    pytest.skip("the playwright package is not installed (it is in the test extra)", allow_module_level=True)

CELLS = [
    "%load_ext vramlab",
    "%vram",
    "%vram watch",
    "import numpy as np, time\na = np.ones(200 * 2**20 // 8)  # about 200 MiB on the host\ntime.sleep(3)\ndel a",
    "%vram stop",
]
SNAPSHOT, WATCH, ALLOC, STOP = 1, 2, 3, 4
MIB = 2**20
_UNITS = {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40}
FIGURE = re.compile(r"\d+(?:\.\d+)? (?:KiB|MiB|GiB|TiB)")
THIS_PROCESS = re.compile(r"this process\s+(\d+(?:\.\d+)?) (B|KiB|MiB|GiB|TiB)")
THEMES = {"light": "JupyterLab Light", "dark": "JupyterLab Dark"}
# Notebook 7 and JupyterLab 4 differ in their shells, not in the notebook widget: the same cell,
# prompt and output selectors work in both, the URL and the page's chrome differ.
URLS = {"lab": "/lab/tree/{path}", "notebook": "/notebooks/{path}"}


def write_notebook(path: Path) -> None:
    import nbformat

    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.cells = [nbformat.v4.new_code_cell(src) for src in CELLS]
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, str(path))


def this_process_bytes(text: str) -> int:
    m = THIS_PROCESS.search(text)
    assert m, f"no 'this process' figure in {text!r}"
    return int(float(m.group(1)) * _UNITS[m.group(2)])


def kernel_env() -> dict[str, str]:
    """The environment for servers and kernels: this checkout's vramlab first on the path."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    return env


# --------------------------------------------------------------------------- the server and the browser


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, base: Path) -> None:
        self.root = base / "root"
        self.settings = base / "settings"
        self.workspaces = base / "workspaces"
        for d in (self.root, self.settings):
            d.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = base / "server.log"
        env = kernel_env()
        env.update(
            JUPYTERLAB_SETTINGS_DIR=str(self.settings),
            JUPYTERLAB_WORKSPACES_DIR=str(self.workspaces),
            JUPYTER_RUNTIME_DIR=str(base / "runtime"),
            JUPYTER_CONFIG_DIR=str(base / "config"),
        )
        self.set_theme("light")
        # no "would you like news?" toast over the notebook
        self._write_setting("notification", {"fetchNews": "false", "checkForUpdates": False})
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "jupyter", "lab", "--no-browser", "--allow-root", "--ServerApp.ip=127.0.0.1",
             f"--ServerApp.port={self.port}", "--ServerApp.port_retries=0", "--IdentityProvider.token=",
             "--ServerApp.password=", f"--ServerApp.root_dir={self.root}"],
            cwd=str(self.root), env=env, stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True,
        )

    def _write_setting(self, name: str, value: dict) -> None:
        path = self.settings / "@jupyterlab" / "apputils-extension" / f"{name}.jupyterlab-settings"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(value))

    def set_theme(self, theme: str) -> None:
        """Both frontends read this file when a page loads (the settings API reads the same folder)."""
        self._write_setting("themes", {"theme": THEMES[theme]})

    def reset_workspaces(self) -> None:
        """Forget the saved layouts, so that each page starts as a first visit (JupyterLab would
        reopen the previous test's notebook in a second tab)."""
        shutil.rmtree(self.workspaces, ignore_errors=True)
        self.workspaces.mkdir(parents=True)

    def wait_ready(self, timeout: float = 90.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"jupyter lab exited with {self.proc.returncode}:\n{self.log()}")
            try:
                with urllib.request.urlopen(self.url + "/api", timeout=2) as r:
                    if r.status == 200 and "version" in json.loads(r.read()):
                        return
            except OSError:
                pass
            time.sleep(0.25)
        raise RuntimeError(f"jupyter lab did not answer on {self.url}/api within {timeout:.0f} s:\n{self.log()}")

    def kernel_connected(self, path: str) -> bool:
        """Whether the notebook at ``path`` has a kernel that is idle with a browser connected to it."""
        with urllib.request.urlopen(self.url + "/api/sessions", timeout=5) as r:
            sessions = json.loads(r.read())
        return any(s.get("path") == path and (s.get("kernel") or {}).get("execution_state") == "idle"
                   and (s["kernel"].get("connections") or 0) >= 1 for s in sessions)

    def log(self) -> str:
        self._log.flush()
        return self.log_path.read_text(errors="replace")[-4000:]

    def stop(self) -> None:
        """Stop the server and every kernel it started; kill what does not stop in time."""
        import psutil

        try:
            children = psutil.Process(self.proc.pid).children(recursive=True)
        except psutil.Error:
            children = []
        if self.proc.poll() is None:
            self.proc.terminate()  # the server shuts its kernels down on SIGTERM
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        _, alive = psutil.wait_procs(children, timeout=10)
        for p in alive:
            try:
                p.kill()
            except psutil.Error:
                pass
        self._log.close()


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    s = Server(tmp_path_factory.mktemp("jupyter"))
    try:
        s.wait_ready()
        yield s
    finally:
        s.stop()


class Page:
    """A browser page that can reach only ``allowed`` and local files, and keeps its errors.

    The route handler runs on this thread, only while a playwright call is waiting: wait with
    ``page.wait_for_timeout``, never ``time.sleep``, or the page's requests stall.
    """

    def __init__(self, browser, allowed: tuple[str, ...] = ()) -> None:
        self.context = browser.new_context(viewport={"width": 1280, "height": 1000})
        self.errors: list[tuple[str, str]] = []  # (phase, error)
        self.phase = "load"
        self.blocked: list[str] = []
        self.allowed = allowed + ("file:", "data:", "blob:")
        self.context.route("**/*", self._route)
        self.page = self.context.new_page()
        self.page.on("console", self._console)
        self.page.on("pageerror", self._pageerror)

    def _route(self, route) -> None:
        url = route.request.url
        if url.startswith(self.allowed):
            route.continue_()
        else:
            self.blocked.append(url)
            route.abort()

    def _console(self, msg) -> None:
        if msg.type == "error":
            self.errors.append((self.phase, f"console: {msg.text} at {msg.location}"))

    def _pageerror(self, err) -> None:
        self.errors.append((self.phase, f"pageerror: {err.message}\n{err.stack}"))

    def close(self) -> None:
        self.context.close()


# Errors of Notebook 7 (7.6) itself, raised from its own bundle (static/notebook/notebook_core...js)
# while the page loads, before any cell runs; both also come with a notebook whose kernel never
# loaded vramlab, so they are ignored there and only there:
# - its keyboard-shortcuts settings plugin: "Cannot read properties of undefined (reading 'schema')"
#   (on every load);
# - its file-browser restorer: "Command 'filebrowser:open-path' not registered" (the notebook page
#   has no file browser; it comes once JupyterLab has been open on the same server, even with the
#   saved workspaces removed).
FRONTEND_LOAD_NOISE = {"notebook": ("reading 'schema'", "Command 'filebrowser:open-path' not registered")}


def unrelated(error: str, frontend: str, phase: str) -> bool:
    """Whether ``error`` is the frontend's own noise: only while the page loads, only from its bundle."""
    return (phase == "load" and "/static/notebook/" in error
            and any(n in error for n in FRONTEND_LOAD_NOISE.get(frontend, ())))


# --------------------------------------------------------------------------- the live monitor

MONITOR_STATE = """(cell) => {
  const m = cell.querySelector('.jp-OutputArea .vramlab-monitor, .jp-OutputArea .vramlab-monitor-static');
  if (!m) return null;
  const seg = m.querySelector('.vramlab-bar [title^="this process"]');
  return {text: m.innerText, live: m.classList.contains('vramlab-monitor'),
          width: seg ? parseFloat(seg.style.width) : null};
}"""


def element_shot(locator, path: Path) -> None:
    """A screenshot of one element that is re-rendered live: again if its size changed meanwhile."""
    for _ in range(3):
        box = locator.bounding_box()
        locator.screenshot(path=str(path))
        if locator.bounding_box() == box:
            return


def run_cell(cells, i: int, wait: bool = True) -> None:
    """Shift+Enter on the active cell ``i``; then wait for its prompt to show an execution count."""
    cell = cells.nth(i)
    expect(cell).to_have_class(re.compile(r"\bjp-mod-active\b"), timeout=10_000)
    cell.page.keyboard.press("Shift+Enter")
    if wait:
        expect(cell.locator(".jp-InputPrompt")).to_have_text(re.compile(r"\[\d+\]:"), timeout=30_000)


def check_live_monitor(browser, server, frontend: str, theme: str) -> dict:
    sub = f"{frontend}-{theme}"
    write_notebook(server.root / sub / "x.ipynb")
    server.set_theme(theme)
    server.reset_workspaces()
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    p = Page(browser, allowed=(server.url + "/",))  # (websockets are not routed: the page opens its own)
    page = p.page
    result: dict = {}
    try:
        page.goto(server.url + URLS[frontend].format(path=f"{sub}/x.ipynb"))
        page.wait_for_selector(".jp-Notebook-ExecutionIndicator[data-status='idle']", timeout=90_000)
        # The indicator also reads "idle" for a moment before the kernel exists (then "initializing",
        # "connecting", "busy"); a cell run in that moment is dropped. The server counts the page's
        # websocket once it is past that: wait for it, then for the indicator's real "idle".
        deadline = time.monotonic() + 90
        while not server.kernel_connected(f"{sub}/x.ipynb"):
            assert time.monotonic() < deadline, f"no kernel connected for {sub}/x.ipynb:\n{server.log()}"
            page.wait_for_timeout(200)
        page.wait_for_selector(".jp-Notebook-ExecutionIndicator[data-status='idle']", timeout=60_000)
        assert page.evaluate("document.body.dataset.jpThemeName") == THEMES[theme]
        nb = page.locator(".jp-Notebook:visible")
        cells = nb.locator(".jp-Cell")
        expect(cells).to_have_count(len(CELLS))
        cells.nth(0).locator(".jp-InputArea-editor").click()
        p.phase = "cells"  # from here on, every error counts

        run_cell(cells, 0)
        run_cell(cells, SNAPSHOT)
        snap = cells.nth(SNAPSHOT).locator(".jp-OutputArea .vramlab-snapshot")
        expect(snap).to_be_visible()
        assert FIGURE.search(snap.inner_text()), snap.inner_text()
        assert "this process" in snap.inner_text()

        run_cell(cells, WATCH)
        watch = cells.nth(WATCH)
        monitor = watch.locator(".jp-OutputArea .vramlab-monitor")
        expect(monitor).to_be_visible(timeout=20_000)
        expect(monitor).to_contain_text("sampling every", timeout=10_000)
        expect(monitor).to_contain_text(FIGURE)
        expect(monitor.locator(".vramlab-bar").first).to_be_visible()
        page.wait_for_timeout(1000)  # let the reading settle after the import and the first render
        before = watch.evaluate(MONITOR_STATE)
        assert before and before["live"] and before["width"] is not None, before
        rss0 = this_process_bytes(before["text"])

        # the allocating cell: watch the figures while it runs
        prompt = cells.nth(ALLOC).locator(".jp-InputPrompt")
        run_cell(cells, ALLOC, wait=False)
        during, shot_taken = [], False
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            running = prompt.inner_text().strip() == "[*]:"
            state = watch.evaluate(MONITOR_STATE)
            if state is not None:
                state["running"] = running
                during.append(state)
                if (running and not shot_taken and this_process_bytes(state["text"]) > rss0 + 150 * MIB):
                    element_shot(monitor, ARTIFACTS / f"{sub}-monitor.png")
                    shot_taken = True
            if re.fullmatch(r"\[\d+\]:", prompt.inner_text().strip()):
                break
            page.wait_for_timeout(200)
        expect(prompt).to_have_text(re.compile(r"\[\d+\]:"), timeout=1000)
        page.wait_for_timeout(1500)  # the sampler reads every 0.5 s: the drop after `del a` shows within a second
        after = watch.evaluate(MONITOR_STATE)
        element_shot(monitor, ARTIFACTS / f"{sub}-monitor-after.png")  # the timeline: up and down
        while_running = [s for s in during if s["running"]]
        assert while_running, "never saw the monitor while the cell ran"
        assert any(s["text"] != before["text"] for s in while_running), "the figures did not change while it ran"
        peak = max(this_process_bytes(s["text"]) for s in during)
        assert peak >= rss0 + 150 * MIB, (rss0, peak)
        assert this_process_bytes(after["text"]) <= peak - 150 * MIB, (peak, after["text"])
        # the host bar's "this process" segment rose and fell with it
        widest = max(s["width"] for s in during)
        assert widest > before["width"] and after["width"] < widest, (before["width"], widest, after["width"])

        # %vram stop: the monitor says so and stays as it is
        run_cell(cells, STOP)
        expect(cells.nth(STOP).locator(".jp-OutputArea")).to_contain_text("sampler stopped")
        # the stopped monitor leaves its static copy in place of the widget: that is what gets saved
        frozen = watch.locator(".jp-OutputArea .vramlab-monitor-static")
        expect(frozen).to_contain_text("stopped", timeout=10_000)
        expect(watch.locator(".jp-OutputArea .vramlab-monitor")).to_have_count(0)
        first = watch.evaluate(MONITOR_STATE)
        page.screenshot(path=str(ARTIFACTS / f"{sub}.png"))
        watch.locator(".jp-OutputArea").screenshot(path=str(ARTIFACTS / f"{sub}-stopped.png"))
        page.wait_for_timeout(2000)
        second = watch.evaluate(MONITOR_STATE)
        assert first["text"] == second["text"] and first["width"] == second["width"], (first, second)
        assert FIGURE.search(second["text"]) and not second["live"], second

        assert page.locator(".jupyter-widgets-error-widget").count() == 0
        assert "Error displaying widget" not in nb.inner_text()
        errors = [e for phase, e in p.errors if not unrelated(e, frontend, phase)]
        assert not errors, "\n".join(errors)
        result = {"before": before, "peak": peak, "after": after, "stopped": second, "shot": shot_taken}
        return result
    finally:
        try:
            page.screenshot(path=str(ARTIFACTS / f"{sub}-last.png"))
        except Exception:
            pass
        (ARTIFACTS / f"{sub}.log").write_text(json.dumps(
            {"errors": p.errors, "blocked": p.blocked, "result": result}, indent=1, default=str))
        p.close()


@pytest.mark.parametrize("frontend,theme", [("lab", "light"), ("notebook", "dark"), ("lab", "dark"),
                                            ("notebook", "light")])
def test_live_monitor(browser, server, frontend, theme):
    r = check_live_monitor(browser, server, frontend, theme)
    if frontend == "lab" and theme == "light" and r.get("shot") and os.environ.get("VRAMLAB_README_SHOT"):
        write_readme_shot(ARTIFACTS / "lab-light-monitor-after.png", README_SHOT)


def write_readme_shot(src: Path, dst: Path) -> None:
    """The README's picture: the live monitor's screenshot, cut to what it draws, in a small palette."""
    from PIL import Image, ImageChops

    img = Image.open(src).convert("RGB")
    background = Image.new("RGB", img.size, img.getpixel((img.width - 1, img.height - 1)))
    box = ImageChops.difference(img, background).getbbox() or (0, 0, img.width, img.height)
    pad = 10
    out = Image.new("RGB", (box[2] - box[0] + 2 * pad, box[3] - box[1] + 2 * pad), background.getpixel((0, 0)))
    out.paste(img.crop(box), (pad, pad))
    dst.parent.mkdir(parents=True, exist_ok=True)
    out.quantize(colors=64).save(dst, optimize=True)


# --------------------------------------------------------------------------- the saved notebook


def test_saved_notebook_shows_the_static_copy(browser, tmp_path):
    import nbclient
    import nbformat
    from nbconvert import HTMLExporter

    path = tmp_path / "x.ipynb"
    write_notebook(path)
    nb = nbformat.read(str(path), as_version=4)
    nbclient.NotebookClient(nb, timeout=120, kernel_name="python3",
                            resources={"metadata": {"path": str(tmp_path)}}).execute(env=kernel_env())
    nbformat.write(nb, str(path))
    # nbclient saves the widget state, so nbconvert would pick the widget (blank without its CDN
    # scripts); the stopped monitor has replaced its output by the static copy
    assert "application/vnd.jupyter.widget-state+json" in nb.metadata.get("widgets", {})
    (out,) = [o for o in nb.cells[WATCH].outputs if o.output_type == "display_data"]
    assert "application/vnd.jupyter.widget-view+json" not in out.data, list(out.data)
    assert "vramlab-monitor-static" in out.data["text/html"]
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    for theme in ("light", "dark"):
        body, _ = HTMLExporter(theme=theme).from_notebook_node(nb)
        html = tmp_path / f"x-{theme}.html"
        html.write_text(body, encoding="utf-8")
        p = Page(browser)  # local files only: the CDN scripts of the template are aborted
        try:
            p.page.goto(html.as_uri())
            cells = p.page.locator(".jp-Cell")
            expect(cells).to_have_count(len(CELLS))
            snap = cells.nth(SNAPSHOT).locator(".vramlab-snapshot")
            expect(snap).to_be_visible()
            assert FIGURE.search(snap.inner_text())
            static = cells.nth(WATCH).locator(".vramlab-monitor-static")
            expect(static).to_be_visible()
            text = static.inner_text()
            assert FIGURE.search(text) and "this process" in text, text
            assert "stopped" in text, text
            p.page.screenshot(path=str(ARTIFACTS / f"saved-{theme}.png"), full_page=True)
            # offline, the template's own CDN scripts (require.js, MathJax, the widget manager) fail
            # to load, and only they may fail
            errors = [e for _, e in p.errors if not any(u in e for u in p.blocked)]
            assert not errors, "\n".join(errors)
        finally:
            (ARTIFACTS / f"saved-{theme}.log").write_text(json.dumps({"errors": p.errors, "blocked": p.blocked},
                                                                      indent=1))
            p.close()
