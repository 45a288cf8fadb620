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


def _with_cuda(snap, allocated, reserved, peak):
    """``snap`` with one cuda:0 as NVML shows it; torch figures when ``allocated`` is not None."""
    import dataclasses

    from vramlab.model import DeviceSnapshot
    from vramlab.reconcile import device_layers

    GiB = 2**30
    torch_on = allocated is not None
    d = DeviceSnapshot(id="cuda:0", kind="cuda", name="sim", uuid="GPU-0", source="nvml+torch" if torch_on else "nvml",
                       nvml_index=0, total=16 * GiB, free=15 * GiB, used=GiB, driver_reserved=None,
                       process_used=GiB if torch_on else 0, other_processes_used=0, utilization=0,
                       torch_allocated=allocated, torch_reserved=reserved, torch_active=allocated,
                       torch_inactive_split=0 if torch_on else None, torch_peak_allocated=peak,
                       torch_peak_reserved=reserved, num_ooms=0 if torch_on else None, num_alloc_retries=None,
                       mem_info_free=None, mem_info_total=None, unified_memory=False,
                       layers=device_layers(16 * GiB, GiB, process_used=GiB, torch_reserved=reserved,
                                            torch_allocated=allocated))
    return dataclasses.replace(snap, devices=(d,))


@pytest.mark.parametrize("keep", [False, True])
def test_the_cell_that_creates_the_cuda_context_shows_its_allocation_and_peak(monkeypatch, keep):
    """Before the cell NVML shows cuda:0 and torch has no figures; after it torch holds 1 GiB."""
    from vramlab.reconcile import snapshot as real
    from vramlab.runtime import records

    GiB = 2**30
    readings = iter([_with_cuda(real(), None, None, None), _with_cuda(real(), GiB, 2 * GiB, 3 * GiB // 2)])
    monkeypatch.setattr(records, "snapshot", lambda: next(readings))
    r = Recorder()
    rec = r.end(r.begin(5, keep_peaks=keep))
    (d,) = rec.devices
    assert (d.allocated_start, d.allocated_delta, d.reserved_delta) == (0, GiB, 2 * GiB)
    assert (d.peak_allocated, d.peak_allocated_delta) == (3 * GiB // 2, 3 * GiB // 2)
    assert "cuda:0" in rec.line() and "peak +1.50 GiB" in rec.line()


class _Items:
    """A dataset held in a Python list; each worker walks the whole list once when it starts
    (``touch``), which writes every object's reference count and so copies its page."""

    def __init__(self, n):
        self.items = [(i, str(i)) for i in range(n)]

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        return self.items[i][0]


def _touch_all(worker_id):
    import signal

    signal.signal(signal.SIGINT, signal.SIG_DFL)  # not inherited from however the tests were started
    import torch.utils.data

    info = torch.utils.data.get_worker_info()
    for _ in info.dataset.items:
        pass


@linux
def test_dataloader_workers_show_as_children_and_their_copy_on_write_growth():
    pytest.importorskip("torch")
    from torch.utils.data import DataLoader

    from vramlab.reconcile import snapshot

    n = 200_000
    ds = _Items(n)
    touched = n * sys.getsizeof(ds.items[0])  # the tuples' own bytes: each worker copies at least these pages
    r = Recorder()
    tok = r.begin(7, uss=True)
    loader = DataLoader(ds, batch_size=256, num_workers=2, persistent_workers=True, worker_init_fn=_touch_all,
                        multiprocessing_context="fork")
    it = iter(loader)
    for _ in range(4):
        next(it)
    rec = r.end(tok)
    try:
        alive = snapshot()
        full = snapshot(uss=True).host
    finally:
        del it, loader  # the workers end with their iterator
    h = rec.host
    assert h.children_count_end - h.children_count_start == 2
    assert h.children_rss_delta > 0 and h.children_uss_delta is not None
    # the workers' private pages grew by at least the objects they touched (copy-on-write)
    assert h.children_uss_delta >= 2 * touched * 0.5
    assert "children" in rec.text() and "children" in rec.line()
    assert alive.host.layer("children") > 0 and alive.host.children_count >= 2
    assert sum(n for _, n in alive.host.layers) == alive.host.limit
    # sharing made visible: what they hold alone is less than their RSS summed
    assert full.children_uss is not None and full.children_uss < full.children_rss
    assert full.children_pss is not None and full.children_uss <= full.children_pss <= full.children_rss
    assert full.layer("children") <= full.children_uss
