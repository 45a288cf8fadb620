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
def recorded_history():
    """A History of three real cell records (cell 7), four samples and one marker."""
    from vramlab.model import History
    from vramlab.runtime.records import Recorder
    from vramlab.runtime.sampler import Sampler

    r = Recorder()
    for _ in range(3):
        r.end(r.begin(7))
    s = Sampler()
    for _ in range(4):
        s.sample_now()
    s.mark("cell", "[7]")
    return History(cells=tuple(r.history), samples=tuple(s.samples), markers=tuple(s.markers))


def pytest_sessionfinish(session, exitstatus):
    """Close every widget while ipywidgets is still intact (its __del__ fails at interpreter teardown)."""
    import sys

    from vramlab.runtime.sampler import get_sampler

    get_sampler().stop()
    w = sys.modules.get("ipywidgets")
    if w is not None:
        w.Widget.close_all()
