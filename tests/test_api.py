"""vramlab.api: the functions behind the magics, called from plain Python."""

from __future__ import annotations

import builtins

from vramlab import api
from vramlab.model import FreedReport


def test_no_shell_outside_ipython_and_the_running_shell_inside(ip, monkeypatch):
    monkeypatch.delattr(builtins, "get_ipython", raising=False)
    assert api._running_shell() is None
    monkeypatch.setattr(builtins, "get_ipython", lambda: ip, raising=False)
    assert api._running_shell() is ip


def test_free_outside_ipython_returns_a_report(monkeypatch):
    monkeypatch.delattr(builtins, "get_ipython", raising=False)
    rep = api.free()
    assert isinstance(rep, FreedReport) and rep.text().startswith("[vramlab] freed: host RSS")


def test_last_is_none_or_the_latest_record():
    from vramlab.runtime.records import get_recorder

    rec = get_recorder()
    rec.end(rec.begin(41))
    assert api.last() is rec.history[-1] and api.last().execution_count == 41
