"""vramlab.lessons.ramplan: the RAM plan, tiers, peak RSS, streaming reads and the heap trim."""

from __future__ import annotations

import gc
import mmap

import numpy as np
import pytest

from vramlab.lessons.ramplan import (
    TIERS_GB, WORKER_OVERHEAD, RamPlan, iter_npy_batches, peak_rss_during, ram_needs, release_free_heap, tier_for,
)

GiB, MiB = 2**30, 2**20


def test_tiers():
    assert TIERS_GB == (16, 32, 64)
    assert tier_for(1 * GiB) == 16
    assert tier_for(12 * GiB) == 16  # 16 GiB less 25%
    assert tier_for(12 * GiB + 1) == 32
    assert tier_for(40 * GiB) == 64
    assert tier_for(60 * GiB) is None
    assert tier_for(15 * GiB, reserve=0.0) == 16
    with pytest.raises(ValueError):
        tier_for(1, reserve=1.0)


def test_plan_adds_up_and_streaming_drops_the_dataset():
    whole = ram_needs(dataset_bytes=10 * GiB, batch_bytes=100 * MiB, model_parameters=25_000_000,
                      baseline=500 * MiB, limit=None)
    assert isinstance(whole, RamPlan)
    assert whole.total == sum(i.bytes for i in whole.items)
    assert whole.item("dataset in memory") == 10 * GiB
    assert whole.item("batches in flight") == 200 * MiB  # no workers: two batches
    assert whole.item("model copies on the host") == 100_000_000
    assert whole.tier_gb == 16 and whole.fits_limit is None
    stream = ram_needs(dataset_bytes=10 * GiB, load="stream", batch_bytes=100 * MiB, workers=4,
                       prefetch_factor=2, pin_memory=True, baseline=500 * MiB, limit=2 * GiB)
    assert stream.item("dataset in memory") == 0
    assert stream.item("batches in flight") == 9 * 100 * MiB
    assert stream.item("pinned staging copies") == 200 * MiB
    assert stream.item("data-loader workers") == 4 * WORKER_OVERHEAD
    assert stream.fits_limit is False and "does NOT fit" in stream.text()
    assert "total" in whole.text()


def test_plan_defaults_measure_this_process():
    p = ram_needs(dataset_bytes=0)
    assert p.item("interpreter and libraries") > 10 * MiB
    assert p.limit is None or p.limit > 0


def test_plan_rejects_bad_arguments():
    with pytest.raises(ValueError):
        ram_needs(load="lazy")
    with pytest.raises(ValueError):
        ram_needs(workers=-1)


def test_peak_rss_during_sees_a_transient_array():
    def job():
        # an anonymous mapping, every page written: new resident memory whatever the heap
        # already holds (a malloc could be served from freed, still-resident heap pages)
        m = mmap.mmap(-1, 64 * MiB)
        a = np.frombuffer(m, dtype=np.uint8)
        a[::4096] = 1
        s = float(a[::4096].sum())
        del a
        m.close()
        return s

    result, peak = peak_rss_during(job)
    assert result > 0
    if peak.exact:
        assert peak.delta >= 60 * MiB
        assert peak.after - peak.before < 32 * MiB


def test_iter_npy_batches_reads_the_file_in_blocks(tmp_path):
    a = np.arange(1000 * 3, dtype=np.float32).reshape(1000, 3)
    path = tmp_path / "a.npy"
    np.save(path, a)
    blocks = list(iter_npy_batches(path, 300))
    assert [len(b) for b in blocks] == [300, 300, 300, 100]
    assert np.array_equal(np.concatenate(blocks), a)
    with pytest.raises(ValueError):
        next(iter_npy_batches(path, 0))


def test_release_free_heap_returns_a_bool():
    junk = [bytearray(512) for _ in range(10000)]
    del junk
    gc.collect()
    assert release_free_heap() in (True, False)
