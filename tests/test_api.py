"""vramlab.api: the functions behind the magics, called from plain Python."""

from __future__ import annotations

import builtins

import pytest

from vramlab import api
from vramlab.model import FreedReport


def test_no_shell_outside_ipython_and_the_running_shell_inside(ip, monkeypatch):
    monkeypatch.delattr(builtins, "get_ipython", raising=False)
    assert api._running_shell() is None
    monkeypatch.setattr(builtins, "get_ipython", lambda: ip, raising=False)
    assert api._running_shell() is ip


@pytest.mark.slow
def test_free_outside_ipython_returns_a_report(monkeypatch):
    monkeypatch.delattr(builtins, "get_ipython", raising=False)
    rep = api.free()
    assert isinstance(rep, FreedReport) and rep.text().startswith("[vramlab] freed: host RSS")


def test_last_is_none_or_the_latest_record():
    from vramlab.runtime.records import get_recorder

    rec = get_recorder()
    rec.end(rec.begin(41))
    assert api.last() is rec.history[-1] and api.last().execution_count == 41


def test_plot_passes_last_and_last_s_on(monkeypatch):
    from vramlab.display import plot as plot_mod

    seen = {}
    monkeypatch.setattr(plot_mod, "plot_history", lambda h, **kw: seen.update(kw) or "figure")
    assert api.plot(60.0, last=5) == "figure"
    assert seen == {"last_s": 60.0, "last": 5}
    assert api.plot() == "figure" and seen == {"last_s": None, "last": None}
