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


def pytest_sessionfinish(session, exitstatus):
    """Close every widget while ipywidgets is still intact (its __del__ fails at interpreter teardown)."""
    import sys

    from vramlab.runtime.sampler import get_sampler

    get_sampler().stop()
    w = sys.modules.get("ipywidgets")
    if w is not None:
        w.Widget.close_all()
