"""End to end in a real browser: vramlab's status-bar item and side panel in JupyterLab, and the
side panel in Notebook 7's right sidebar, served by vramlab's server extension.

The server is the one tests/test_browser.py starts (loopback, no token, its own settings and
workspaces); the frontend extension and the server extension are those this checkout installed
(``pip install -e .`` builds and installs both). A second kernel is started through the REST API,
as another user tab would, so that the side panel has two kernels to list.

Screenshots go to ``artifacts/browser/``; with ``VRAMLAB_README_SHOT=1`` the JupyterLab test also
writes the README's picture, ``docs/img/lab-kernels.png``.
"""

from __future__ import annotations

import json
import os
import re
import time
import urllib.request
from pathlib import Path

import pytest

from tests.test_browser import ARTIFACTS, REPO, Page, Server, run_cell, unrelated

pytestmark = pytest.mark.browser

from playwright.sync_api import expect  # noqa: E402 (after test_browser's skip when playwright is missing)

README_SHOT = REPO / "docs" / "img" / "lab-kernels.png"
_UNITS = {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40}
MIB = 2**20
# the status bar for a kernel: "GPU 3.2 / 80 GiB · RAM 2.1 / 16 GiB" or "RAM 312 MiB / 16 GiB"
KERNEL_STATUS = re.compile(r"^(?:GPU .+ · )?RAM (\d+(?:\.\d+)?)(?: (B|KiB|MiB|GiB|TiB))? / (\d+(?:\.\d+)?) (B|KiB|MiB|GiB|TiB)$")
ALLOC = "x = b'x' * (200 << 20)  # 200 MiB that the kernel writes, so they are resident"


def ram_bytes(text: str) -> int:
    """The kernel's RAM figure in a status-bar text, in bytes."""
    m = KERNEL_STATUS.match(text)
    assert m, f"not a kernel's status: {text!r}"
    unit = m.group(2) or m.group(4)  # "2.1 / 16 GiB" shares the total's unit
    return int(float(m.group(1)) * _UNITS[unit])


def write_notebook(path: Path, cells: list[str]) -> None:
    import nbformat

    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.cells = [nbformat.v4.new_code_cell(c) for c in cells]
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, str(path))


def api(server: Server, path: str, body: dict | None = None) -> object:
    """GET (or POST ``body`` to) the server's REST API; a POST carries the XSRF cookie and header
    that Jupyter Server asks of a client without a token."""
    import http.cookiejar

    jar = http.cookiejar.CookieJar()
    opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(jar))
    headers = {"Content-Type": "application/json"}
    if body is not None:
        opener.open(server.url + "/lab", timeout=60).read()
        headers["X-XSRFToken"] = next(c.value for c in jar if c.name == "_xsrf")
    req = urllib.request.Request(server.url + path, method="POST" if body is not None else "GET",
                                 data=json.dumps(body).encode() if body is not None else None, headers=headers)
    with opener.open(req, timeout=60) as r:
        return json.loads(r.read())


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """A JupyterLab server with a second kernel already running for other.ipynb."""
    s = Server(tmp_path_factory.mktemp("jupyter-lab-ext"))
    try:
        s.wait_ready()
        write_notebook(s.root / "other.ipynb", ["y = 1"])
        api(s, "/api/sessions", {"path": "other.ipynb", "type": "notebook", "name": "other.ipynb",
                                 "kernel": {"name": "python3"}})
        yield s
    finally:
        s.stop()


def open_notebook(p: Page, server: Server, url: str, path: str) -> None:
    page = p.page
    page.goto(server.url + url)
    page.wait_for_selector(".jp-Notebook-ExecutionIndicator[data-status='idle']", timeout=90_000)
    deadline = time.monotonic() + 90
    while not server.kernel_connected(path):
        assert time.monotonic() < deadline, f"no kernel connected for {path}:\n{server.log()}"
        page.wait_for_timeout(200)
    page.wait_for_selector(".jp-Notebook-ExecutionIndicator[data-status='idle']", timeout=60_000)


def check_panel(panel, names: set[str]) -> None:
    """The side panel lists a card for each of these notebooks' kernels (others may be there too,
    from tests that ran before), each with its RAM. Names settle within a reading or two:
    JupyterLab names a new session by a temporary path first."""
    for name in names:
        card = panel.locator(".vramlab-Kernel", has=panel.page.locator(".vramlab-Kernel-title", has_text=name))
        expect(card).to_have_count(1, timeout=20_000)
        expect(card.locator(".vramlab-Kernel-figures")).to_have_text(re.compile(r"^RAM \d+(\.\d+)? (KiB|MiB|GiB)"),
                                                                     timeout=10_000)


def test_status_bar_and_side_panel_in_jupyterlab(browser, server):
    write_notebook(server.root / "train.ipynb", [ALLOC])
    server.reset_workspaces()
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    p = Page(browser, allowed=(server.url + "/",))
    page = p.page
    log: dict = {}
    try:
        open_notebook(p, server, "/lab/tree/train.ipynb", "train.ipynb")
        status = page.locator(".vramlab-StatusItem")
        expect(status).to_have_text(KERNEL_STATUS, timeout=30_000)
        # its text sits on the line of its neighbours' text (it sat 4 px higher: hardening, display nits)
        middle = ("e => { const r = document.createRange(); r.selectNodeContents(e); "
                  "const b = r.getBoundingClientRect(); return b.top + b.height / 2; }")
        neighbour = page.locator(".jp-StatusBar-TextItem:visible").first
        offset = status.evaluate(middle) - neighbour.evaluate(middle)
        log["text_offset_px"] = offset
        assert abs(offset) <= 1, f"the status item's text is {offset:+.1f} px off its neighbours' line"
        interval = api(server, "/vramlab/kernels")["interval"]  # type: ignore[index]
        # JupyterLab names a new session by a temporary path and renames it a moment later: the
        # tooltip names the notebook from the next reading on
        expect(status).to_have_attribute("title", re.compile(r"^train\.ipynb \(python3, PID \d+"), timeout=20_000)
        before = ram_bytes(status.inner_text())
        tooltip = status.get_attribute("title") or ""
        assert "This kernel:" in tooltip and "Host:" in tooltip, tooltip

        p.phase = "cells"
        cells = page.locator(".jp-Notebook:visible .jp-Cell")
        cells.nth(0).locator(".jp-InputArea-editor").click()
        run_cell(cells, 0)
        ran = time.monotonic()
        # the next readings (one per interval) must show the 200 MiB: wait a few intervals at most
        deadline = ran + 3 * interval + 10
        seen = []
        while time.monotonic() < deadline:
            seen.append(ram_bytes(status.inner_text()))
            if seen[-1] >= before + 150 * MIB:
                break
            page.wait_for_timeout(200)
        log.update(before=before, seen=seen, rose_after_s=round(time.monotonic() - ran, 2), interval=interval)
        assert seen[-1] >= before + 150 * MIB, (before, seen)
        # the same kernel, as the server extension reads it
        reading = api(server, "/vramlab/kernels")
        (row,) = [k for k in reading["kernels"] if k["path"] == "train.ipynb"]  # type: ignore[index]
        assert row["rss"] >= before + 150 * MIB

        # the side panel: both kernels, the one in focus with its history
        status.click()
        panel = page.locator(".vramlab-KernelsPanel")
        expect(panel).to_be_visible(timeout=10_000)
        check_panel(panel, {"train.ipynb", "other.ipynb"})
        card = panel.locator(".vramlab-Kernel", has_text="train.ipynb")
        expect(card.locator(".vramlab-Sparkline-rss")).to_have_attribute("points", re.compile(r"\d.* \d"))
        expect(card.locator(".vramlab-Sparkline-caption")).to_contain_text("peak RAM")
        page.wait_for_timeout(1000)
        page.screenshot(path=str(ARTIFACTS / "lab-kernels.png"))
        if os.environ.get("VRAMLAB_README_SHOT"):
            write_shot(ARTIFACTS / "lab-kernels.png", README_SHOT)

        # its Open button opens the other kernel's notebook
        panel.locator(".vramlab-Kernel", has_text="other.ipynb").locator(".vramlab-Kernel-open").click()
        expect(page.locator(".lm-DockPanel-tabBar .lm-TabBar-tabLabel", has_text="other.ipynb")).to_be_visible(
            timeout=20_000)
        errors = [e for phase, e in p.errors if not unrelated(e, "lab", phase)]
        assert not errors, "\n".join(errors)
    finally:
        try:
            page.screenshot(path=str(ARTIFACTS / "lab-kernels-last.png"))
        except Exception:
            pass
        (ARTIFACTS / "lab-kernels.log").write_text(json.dumps({"errors": p.errors, "blocked": p.blocked, **log},
                                                              indent=1, default=str))
        p.close()


def test_side_panel_in_notebook7_right_sidebar(browser, server):
    write_notebook(server.root / "nb7.ipynb", ["z = 2"])
    p = Page(browser, allowed=(server.url + "/",))
    page = p.page
    try:
        open_notebook(p, server, "/notebooks/nb7.ipynb", "nb7.ipynb")
        p.phase = "panel"
        page.locator(".lm-MenuBar-itemLabel", has_text="View").click()
        page.locator(".lm-Menu-itemLabel", has_text="Right Sidebar").hover()
        page.locator(".lm-Menu-itemLabel", has_text="Show Kernel memory (vramlab)").click()
        panel = page.locator(".vramlab-KernelsPanel")
        expect(panel).to_be_visible(timeout=10_000)
        check_panel(panel, {"nb7.ipynb", "other.ipynb"})
        page.screenshot(path=str(ARTIFACTS / "notebook7-kernels.png"))
        errors = [e for phase, e in p.errors if not unrelated(e, "notebook", phase)]
        assert not errors, "\n".join(errors)
    finally:
        (ARTIFACTS / "notebook7-kernels.log").write_text(json.dumps({"errors": p.errors, "blocked": p.blocked},
                                                                    indent=1, default=str))
        p.close()


def write_shot(src: Path, dst: Path) -> None:
    """The README's picture: the page from the status-bar item rightwards (the notebook, the side panel and
    the status bar), in a small palette."""
    from PIL import Image

    img = Image.open(src).convert("RGB")
    w, h = img.size
    out = img.crop((w * 3 // 16, 0, w, h))
    dst.parent.mkdir(parents=True, exist_ok=True)
    out.quantize(colors=64).save(dst, optimize=True)
