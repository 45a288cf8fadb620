"""VirtualGPU(allocator="caching") and estimate(allocator="caching"): real tensors and fake
ones through the model of PyTorch's caching allocator (sim/allocator.py)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import vramlab  # noqa: E402
from vramlab.lessons import models  # noqa: E402
from vramlab.sim.estimate import estimate  # noqa: E402
from vramlab.sim.measure import measure  # noqa: E402
from vramlab.sim.virtual_gpu import VirtualGPU  # noqa: E402

MiB = 1 << 20


def _bytes(n: int) -> torch.Tensor:
    return torch.empty(n, dtype=torch.uint8)


def test_fragmentation_raises_torchs_oom_on_real_tensors() -> None:
    """Three 20 MiB segments each pinned by a 2 MiB tensor, their 18 MiB neighbours freed: a
    30 MiB tensor does not fit a 60 MiB card though 54 MiB are cached, and the message says so."""
    gpu = VirtualGPU("60MiB", allocator="caching")
    with gpu:
        keep, drop = [], []
        for _ in range(3):
            keep.append(_bytes(2 * MiB))
            drop.append(_bytes(18 * MiB))
        del drop
        assert (gpu.allocated, gpu.reserved) == (6 * MiB, 60 * MiB)
        with pytest.raises(torch.OutOfMemoryError) as err:
            _bytes(30 * MiB)
        msg = str(err.value)
        assert "Tried to allocate 30.00 MiB" in msg
        assert "6.00 MiB is allocated by PyTorch, and 54.00 MiB is reserved by PyTorch but unallocated" in msg
        assert "expandable_segments:True" in msg
        assert gpu.allocated == 6 * MiB and gpu.num_ooms == 1  # nothing of the failed tensor is counted
        st = gpu.memory_stats()
        assert st["num_ooms"] == 1 and st["num_alloc_retries"] == 1
        assert st["inactive_split_bytes.all.current"] == 54 * MiB


def test_expandable_segments_let_the_same_program_through() -> None:
    """A 50 MiB tensor freed, a 40 MiB one in its place, then 56 MiB on a 100 MiB card: fixed
    segments strand 10 MiB and run out; expandable ones map pages after the free tail."""
    for conf, fits in (("", False), ("expandable_segments:True", True)):
        gpu = VirtualGPU("100MiB", allocator="caching", alloc_conf=conf)
        with gpu:
            x = _bytes(50 * MiB)
            del x
            y = _bytes(40 * MiB)
            if fits:
                z = _bytes(56 * MiB)
                assert gpu.reserved == 100 * MiB
                del z
            else:
                with pytest.raises(torch.OutOfMemoryError):
                    _bytes(56 * MiB)
            del y


def test_the_alloc_conf_comes_from_the_environment(monkeypatch) -> None:
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
    assert VirtualGPU("1GiB", allocator="caching").alloc_conf.expandable_segments
    assert not VirtualGPU("1GiB", allocator="caching", alloc_conf="").alloc_conf.expandable_segments


def test_freed_tensors_stay_reserved_until_empty_cache() -> None:
    gpu = VirtualGPU("1GiB", allocator="caching")
    with gpu:
        a, b = _bytes(1000), _bytes(30 * MiB)
        assert gpu.reserved == 2 * MiB + 30 * MiB and gpu.allocated == 1024 + 30 * MiB
        del a, b
        assert gpu.allocated == 0 and gpu.reserved == 32 * MiB
        assert gpu.free == gpu.budget - 32 * MiB  # cached memory is not free on the device
        gpu.empty_cache()
        assert gpu.reserved == 0 and gpu.max_reserved == 32 * MiB


def test_a_storage_resize_gets_a_new_block_before_the_old_one_is_freed() -> None:
    """CUDA's storage resize allocates the new size, copies, then frees the old block."""
    gpu = VirtualGPU("1GiB", allocator="caching")
    with gpu:
        t = _bytes(12 * MiB)
        t.untyped_storage().resize_(30 * MiB)
        assert gpu.allocated == 30 * MiB and gpu.reserved == 42 * MiB  # 12 MiB cached, 30 MiB new
        assert gpu.memory_stats()["allocated_bytes.all.peak"] == 42 * MiB
        t.untyped_storage().resize_(0)
        assert gpu.allocated == 0


def test_the_snapshot_shows_reserved_memory_as_torchs_cache() -> None:
    gpu = VirtualGPU("1GiB", allocator="caching")
    with gpu:
        x = _bytes(3 * MiB)  # a 20 MiB segment: 17 MiB cached
        dev = vramlab.snapshot().devices[0]
        layers = dict(dev.layers)
        assert dev.torch_allocated == 3 * MiB and dev.torch_reserved == 20 * MiB
        assert layers["tensors"] == 3 * MiB and layers["torch_cache"] == 17 * MiB
        assert dev.used == 20 * MiB + gpu.context_overhead  # what nvidia-smi would show
        del x


def test_vram_text_and_html_show_the_cache_and_what_nvidia_smi_would_show() -> None:
    from vramlab.display.html import snapshot_html
    from vramlab.display.text import snapshot_text

    gpu = VirtualGPU("T4")
    with gpu:
        x = _bytes(3 * MiB)
        snap = vramlab.snapshot()
    text, page = snapshot_text(snap), snapshot_html(snap)
    used = vramlab.format_bytes(20 * MiB + gpu.context_overhead)
    assert "torch cache" in text and "17.00 MiB" in text
    assert f"nvidia-smi on a real card would show {used} used" in text
    assert f"nvidia-smi on a real card would show {used} used" in page and "torch cache" in page
    del x


def test_memory_dump_renders_with_torchs_memory_viz() -> None:
    from torch.cuda import _memory_viz

    gpu = VirtualGPU("1GiB", allocator="caching")
    gpu.record_memory_history()
    with gpu:
        x, y = _bytes(3 * MiB), _bytes(12 * MiB)
        del x
        dump = gpu.memory_dump()
        assert "total_reserved: 20.0MiB" in _memory_viz.segsum(dump)
        assert "cudaMalloc" in _memory_viz.trace(dump)
        assert [s["total_size"] for s in gpu.memory_snapshot()] == [20 * MiB]
        del y


@pytest.mark.parametrize("kw, match", [
    (dict(allocator="buddy"), "allocator must be one of"),
    (dict(allocator="exact", alloc_conf="expandable_segments:True"), "applies to allocator='caching'"),
    (dict(allocator="caching", alloc_conf="max_split_size_mb:1"), "too small"),
])
def test_bad_allocator_arguments_get_one_clear_message(kw, match) -> None:
    with pytest.raises(ValueError, match=match):
        VirtualGPU("1GiB", **kw)
    build, make_batch, loss_fn = models.make_mlp(width=32, depth=1)
    with pytest.raises(ValueError, match=match):
        estimate(build, make_batch, batch_size=2, loss_fn=loss_fn, **kw)


def test_the_caching_allocator_is_the_default() -> None:
    gpu = VirtualGPU("1GiB")
    assert gpu.allocator_kind == "caching"
    with gpu:
        t = torch.empty(1000, dtype=torch.uint8)
        assert gpu.allocated == 1024 and gpu.reserved == 2 * 2**20  # a 2 MiB small-pool segment
    del t


def test_exact_accounting_has_no_allocator_snapshot() -> None:
    gpu = VirtualGPU("1GiB", allocator="exact")
    assert gpu.reserved == gpu.allocated == 0 and gpu.memory_stats()["reserved_bytes.all.current"] == 0
    with pytest.raises(ValueError, match="allocator='caching'"):
        gpu.memory_snapshot()


# --------------------------------------------------------------------------- the estimator


CASES = [(lambda: models.make_gpt("micro", seq=64), 4), (lambda: models.make_cnn(channels=(16, 32)), 16),
         (lambda: models.make_mlp(width=512, depth=3), 64)]


@pytest.mark.parametrize("case", range(len(CASES)))
@pytest.mark.parametrize("conf", ["", "expandable_segments:True", "max_split_size_mb:21"])
@pytest.mark.slow
def test_estimate_with_the_caching_allocator_equals_the_virtual_gpu(case, conf) -> None:
    """Fake tensors and real ones through the same allocator model: the same allocated peak,
    breakdown and reserved peak."""
    factory, b = CASES[case]
    build, make_batch, loss_fn = factory()
    kw = dict(batch_size=b, optimizer="adam", loss_fn=loss_fn, device="T4", allocator="caching", alloc_conf=conf)
    e = estimate(build, make_batch, **kw)
    m = measure(build, make_batch, **kw)
    assert (e.peak, e.breakdown, e.peak_reserved) == (m.peak, m.breakdown, m.peak_reserved)
    assert e.peak_reserved >= e.peak and e.allocator == "caching"


def test_the_verdict_compares_reserved_memory_with_the_card() -> None:
    """The MLP's step allocates at most 17.5 MiB (blocks of 512 bytes with the allocator) but
    the allocator reserves 32 MiB of segments: on a 24 MiB card exact accounting says it fits,
    the caching model says it does not."""
    build, make_batch, loss_fn = models.make_mlp(width=512, depth=3)
    kw = dict(batch_size=64, optimizer="adam", loss_fn=loss_fn, device="24MiB")
    exact = estimate(build, make_batch, **kw)
    caching = estimate(build, make_batch, allocator="caching", **kw)
    assert exact.peak <= caching.peak < 24 * MiB < caching.peak_reserved
    assert exact.fits and not caching.fits
    assert "reserved peak" in caching.verdict() and "reserved by the caching allocator" in caching.text()
