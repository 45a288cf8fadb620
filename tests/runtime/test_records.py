import sys

import numpy as np
import pytest

from vramlab.runtime.records import Recorder

MiB = 2**20
linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="exact VmHWM peaks are Linux-only")


@linux
def test_peak_of_a_transient_allocation_is_exact():
    r = Recorder()
    tok = r.begin(1)
    block = np.ones(300 * MiB // 8)
    del block
    rec = r.end(tok)
    assert rec.host.peak_delta >= 290 * MiB
    assert rec.host.rss_delta < 64 * MiB
    assert rec.peaks_reset and rec.execution_count == 1
    d = rec.to_dict()
    assert {"execution_count", "wall_s", "error", "host", "devices"} <= set(d)
    assert {"rss_delta", "peak_delta"} <= set(d["host"])


@linux
def test_reset_between_records():
    r = Recorder()
    tok = r.begin()
    block = np.ones(200 * MiB // 8)
    del block
    big = r.end(tok)
    tok = r.begin()
    small = r.end(tok)
    assert big.host.peak_delta >= 190 * MiB
    assert small.host.peak_delta < 50 * MiB


@linux
def test_keep_peaks_does_not_reset_and_reports_only_new_highs():
    from vramlab.probes.host import read_host, reset_peak_rss

    reset_peak_rss()
    r = Recorder()
    tok = r.begin(keep_peaks=True)
    block = np.ones(200 * MiB // 8)
    del block
    hwm_after_first = read_host().process_peak
    rec = r.end(tok)
    assert not rec.peaks_reset
    assert rec.host.peak_delta >= 190 * MiB  # a new high: known
    tok = r.begin(keep_peaks=True)
    rec2 = r.end(tok)
    assert rec2.host.peak_delta is None  # no new high: unknown, and the counter was left alone
    assert read_host().process_peak >= hwm_after_first


def test_error_is_recorded_by_type_name():
    r = Recorder()
    tok = r.begin()
    rec = r.end(tok, ZeroDivisionError("x"))
    assert rec.error == "ZeroDivisionError"
    assert "raised ZeroDivisionError" in rec.line()


def test_history_is_bounded():
    from vramlab.runtime import records as cells

    r = Recorder()
    assert r.history.maxlen == cells.HISTORY_SIZE
    assert r.end(None) is None
