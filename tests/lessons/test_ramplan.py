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


@pytest.mark.slow
def test_release_free_heap_returns_a_bool():
    junk = [bytearray(512) for _ in range(10000)]
    del junk
    gc.collect()
    assert release_free_heap() in (True, False)


def _plans():
    whole = ram_needs(dataset_bytes=10 * GiB, batch_bytes=100 * MiB, model_parameters=25_000_000,
                      baseline=500 * MiB, limit=None)
    stream = ram_needs(dataset_bytes=10 * GiB, load="stream", batch_bytes=100 * MiB, workers=4,
                       pin_memory=True, baseline=500 * MiB, limit=2 * GiB)
    huge = ram_needs(dataset_bytes=100 * GiB, batch_bytes=1, baseline=1, limit=200 * GiB)
    return whole, stream, huge


def test_plan_text_in_english_is_unchanged(lang_back):
    lang_back("en")
    whole, stream, huge = _plans()
    assert whole.text() == (
        "  interpreter and libraries     500.00 MiB  given\n"
        "  dataset in memory              10.00 GiB  loaded whole\n"
        "  batches in flight             200.00 MiB  2 x 100.00 MiB\n"
        "  pinned staging copies                0 B  pin_memory off\n"
        "  model copies on the host       95.37 MiB  1 x 25,000,000 params x 4 B\n"
        "  data-loader workers                  0 B  none\n"
        "  total                          10.78 GiB\n"
        "  needs: the 16 GB tier (keeping 25% of RAM for the OS and others)")
    assert stream.text().splitlines()[1:] == [
        "  dataset in memory                    0 B  streamed: only batches are resident",
        "  batches in flight             900.00 MiB  9 x 100.00 MiB",
        "  pinned staging copies         200.00 MiB  2 batches",
        "  model copies on the host             0 B  1 x 0 params x 4 B",
        "  data-loader workers           800.00 MiB  4 x 200.00 MiB (assumed)",
        "  total                           2.34 GiB",
        "  needs: the 16 GB tier (keeping 25% of RAM for the OS and others)",
        "  here: limit 2.00 GiB: does NOT fit"]
    assert huge.text().splitlines()[-2:] == ["  needs: more than 64 GB", "  here: limit 200.00 GiB: fits"]
    notes = RamPlan(items=(), total=0, reserve=0.25, tier_gb=16, limit=None, notes=("a",))
    assert notes.text().splitlines()[-1] == "  note: a"


def test_plan_text_speaks_portuguese(lang_back):
    lang_back("pt-BR")  # needs the catalog with vramlab/lessons' strings
    whole, stream, huge = _plans()
    assert whole.item("dataset in memory") == 10 * GiB  # the lines keep their English names
    text = whole.text() + "\n" + stream.text() + "\n" + huge.text()
    for words in ("interpretador e bibliotecas", "conjunto de dados na RAM", "batches em trânsito",
                  "cópias em memória fixada", "cópias do modelo no host", "workers do carregador", "informado",
                  "carregado inteiro", "lido em streaming", "pin_memory desligado", "25,000,000 parâmetros",
                  "(valor suposto)", "nenhum", "precisa da faixa de 16 GB (deixando 25% da RAM",
                  "precisa de mais de 64 GB", "aqui: limite de 2.00 GiB: NÃO cabe", "aqui: limite de 200.00 GiB: cabe"):
        assert words in text, words
    for english in ("interpreter", "dataset in memory", "in flight", "loaded whole", "needs:", "here:", "fits",
                    "assumed", "params"):
        assert english not in text, english
    rows = whole.text().splitlines()[:7]
    assert all(line[:42].endswith("B") and line[42:44] in ("  ", "") for line in rows)  # the sizes stay aligned
    notes = RamPlan(items=(), total=0, reserve=0.25, tier_gb=16, limit=None, notes=("a",))
    assert notes.text().splitlines()[-1] == "  nota: a"
