"""Shared fixtures."""

from __future__ import annotations

import pytest


@pytest.fixture
def ip():
    """A real IPython InteractiveShell with vramlab unloaded before and after."""
    from IPython.testing.globalipapp import get_ipython

    shell = get_ipython()
    shell.run_line_magic("unload_ext", "vramlab") if "vramlab" in shell.extension_manager.loaded else None
    yield shell
    if "vramlab" in shell.extension_manager.loaded:
        shell.run_line_magic("unload_ext", "vramlab")


@pytest.fixture
def nvml_sim(monkeypatch):
    """The simulated driver (tests/nvml_sim/pynvml.py) as this process's pynvml, with a fresh
    NVML probe; call the fixture's value with a scenario dict to choose the machine."""
    import importlib.util
    import sys
    from pathlib import Path

    from vramlab.probes import nvml as nvml_mod

    spec = importlib.util.spec_from_file_location("pynvml", Path(__file__).parent / "nvml_sim" / "pynvml.py")
    sim = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(sim)
    monkeypatch.setitem(sys.modules, "pynvml", sim)

    def use(scenario):
        sim.configure(scenario)
        monkeypatch.setattr(nvml_mod, "_NVML", nvml_mod._Nvml())
        return sim

    return use


@pytest.fixture(scope="module")
def browser():
    """Headless Chromium (Debian's, driven by playwright) for the browser tests of one module."""
    from playwright.sync_api import sync_playwright

    from tests.test_browser import CHROMIUM, LAUNCH_ARGS  # skips the test when there is no Chromium

    pw = sync_playwright().start()
    try:
        b = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=LAUNCH_ARGS)
        try:
            yield b
        finally:
            b.close()
    finally:
        pw.stop()


@pytest.fixture
def recorded_history():
    """A History of three real cell records (cell 7), four samples and one marker."""
    from vramlab.facts import MarkerKind
    from vramlab.model import History
    from vramlab.runtime.records import Recorder
    from vramlab.runtime.sampler import Sampler

    r = Recorder()
    for _ in range(3):
        r.end(r.begin(7))
    s = Sampler()
    for _ in range(4):
        s.sample_now()
    s.mark(MarkerKind.CELL, 7)
    return History(cells=tuple(r.history), samples=tuple(s.samples), markers=tuple(s.markers))


def pytest_sessionfinish(session, exitstatus):
    """Close every widget while ipywidgets is still intact (its __del__ fails at interpreter teardown)."""
    import sys

    from vramlab.runtime.sampler import get_sampler

    get_sampler().stop()
    w = sys.modules.get("ipywidgets")
    if w is not None:
        w.Widget.close_all()
