import contextlib

import pytest
import torch

import vramlab
from vramlab.lessons.transfer import (SwapArea, bucketed_batches, dequantize_int8, measure_copy, padding_stats,
                                      page_cache_fraction, quantize_int8, random_batches, read_swaps, save_on_host)


def test_copy_without_cuda_says_what_it_measured():
    dev = vramlab.pick_device(virtual="64MiB", force_virtual=True)
    r = measure_copy(dev, 8 * 2**20, repeats=3)
    assert r.nbytes == 8 * 2**20 and r.seconds > 0 and "host→host" in r.kind
    with pytest.raises(ValueError, match="CUDA"):
        measure_copy(dev, 2**20, pinned=True)
    # without CUDA a device→device copy is a host→host one too, and says so
    d = measure_copy(dev, 4 * 2**20 + 3, repeats=3, device_to_device=True, fastest=True)
    assert d.nbytes == 4 * 2**20 and d.seconds > 0 and "host→host" in d.kind


def test_fastest_is_the_fastest_run(monkeypatch):
    from types import SimpleNamespace

    from vramlab.lessons import transfer

    dev = vramlab.pick_device(virtual="64MiB", force_virtual=True)
    for fastest, expected in ((True, 1.0), (False, 2.0)):  # the fastest run, or the median
        ticks = iter([0.0, 9.0, 10.0, 13.0, 20.0, 21.0, 30.0, 32.0])  # runs of 9 (dropped), 3, 1 and 2 seconds
        monkeypatch.setattr(transfer, "time", SimpleNamespace(perf_counter=lambda: next(ticks)))
        assert measure_copy(dev, 1024, repeats=3, fastest=fastest).seconds == expected


def test_save_on_host_lowers_the_virtual_peak_and_keeps_gradients():
    dev = vramlab.pick_device(virtual="512MiB", force_virtual=True)
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.Tanh()) for _ in range(6)])
    dev.put(model)
    x = torch.randn(2048, 256)
    peaks, grads = [], []
    for ctx in (contextlib.nullcontext, lambda: save_on_host(dev)):
        peaks.append(_step_peak(dev, model, x, ctx))
        grads.append([p.grad.clone() for p in model.parameters()])
    # saved for backward: each tanh's output (the next linear saves the same storage), float32
    acts = 6 * 2048 * 256 * 4
    assert peaks[0] - peaks[1] > 0.5 * acts
    for a, b in zip(*grads):
        assert torch.allclose(a, b)


def _step_peak(dev, model, x, ctx):
    model.zero_grad(set_to_none=True)
    with dev.measure() as m:
        with ctx():
            loss = model(x).square().mean()
        loss.backward()
        del loss
    return m.peak_delta


def test_the_virtual_gpu_counts_save_on_cpus_host_copies():
    # the virtual card's memory is host memory: torch's save_on_cpu() keeps the CPU tensor itself
    # (.cpu() of a CPU tensor is that tensor), and with pin_memory=True makes copies that are CPU
    # tensors created while the card is active, which it counts. save_on_host's NumPy buffers it does not.
    dev = vramlab.pick_device(virtual="512MiB", force_virtual=True)
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(128, 128), torch.nn.Tanh()) for _ in range(4)])
    dev.put(model)
    x = torch.randn(1024, 128)
    acts = 4 * 1024 * 128 * 4
    on = _step_peak(dev, model, x, contextlib.nullcontext)
    plain = _step_peak(dev, model, x, lambda: torch.autograd.graph.save_on_cpu())
    pinned = _step_peak(dev, model, x, lambda: torch.autograd.graph.save_on_cpu(pin_memory=True))
    host = _step_peak(dev, model, x, lambda: save_on_host(dev))
    assert plain == on
    assert pinned > on + 0.5 * acts  # one copy per saved tensor: a tanh output saved twice is copied twice
    assert on - host > 0.5 * acts


def test_page_cache_fraction(tmp_path):
    import os
    import sys

    if not sys.platform.startswith("linux"):
        assert page_cache_fraction(__file__) is None
        return
    empty = tmp_path / "empty.bin"
    empty.write_bytes(b"")
    assert page_cache_fraction(str(empty)) == 1.0
    path = tmp_path / "data.bin"
    path.write_bytes(os.urandom(16 * 2**20))
    path.read_bytes()
    assert page_cache_fraction(str(path)) == 1.0  # just written and read: every page is in RAM
    fd = os.open(path, os.O_RDONLY)
    os.fsync(fd)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    os.close(fd)
    dropped = page_cache_fraction(str(path))
    if dropped == 1.0:
        pytest.skip("this filesystem keeps the file in RAM (tmpfs)")
    assert 0.0 <= dropped < 0.5
    with open(path, "rb") as f:
        f.read(2**20)  # the first sixteenth (the kernel may read ahead a little more)
    partly = page_cache_fraction(str(path))
    assert dropped < partly < 1.0 and partly >= 1 / 16


def test_read_swaps(tmp_path):
    text = ("Filename\t\t\t\tType\t\tSize\t\tUsed\t\tPriority\n"
            "/swap\\040file\t\t\t\tfile\t\t8388604\t\t1024\t\t-2\n"
            "/dev/nvme0n1p3                          partition\t2097148\t\t0\t\t10\n")
    p = tmp_path / "swaps"
    p.write_text(text)
    assert read_swaps(str(p)) == [SwapArea("/swap file", "file", 8388604 * 1024, 1024 * 1024, -2),
                                  SwapArea("/dev/nvme0n1p3", "partition", 2097148 * 1024, 0, 10)]
    header_only = tmp_path / "none"
    header_only.write_text(text.splitlines()[0] + "\n")
    assert read_swaps(str(header_only)) == []
    assert read_swaps(str(tmp_path / "missing")) == []


def test_int8_round_trip():
    t = torch.randn(1000)
    q, scale = quantize_int8(t)
    assert q.dtype == torch.int8 and q.nbytes * 4 == t.nbytes
    assert (dequantize_int8(q, scale) - t).abs().max() <= scale / 2 + 1e-6


def test_bucketing_wastes_less_padding():
    import random

    rng = random.Random(1)
    lengths = [max(1, int(rng.lognormvariate(3.5, 0.8))) for _ in range(5000)]
    r = padding_stats(lengths, random_batches(lengths, 32))
    b = padding_stats(lengths, bucketed_batches(lengths, 32))
    assert r.real == b.real == sum(lengths)
    assert b.wasted < 0.5 * r.wasted
    assert sorted(i for batch in bucketed_batches(lengths, 32) for i in batch) == list(range(5000))


def test_the_copy_says_what_it_measured_in_the_notebooks_language(lang_back, monkeypatch):
    from types import SimpleNamespace

    dev = vramlab.pick_device(virtual="64MiB", force_virtual=True)
    # the CUDA path's words, on the CPU: a "CUDA" device that is the CPU, whose synchronise does nothing
    cuda_like = SimpleNamespace(is_cuda=True, device=torch.device("cpu"))
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)
    lang_back("en")
    assert measure_copy(dev, 2**20, repeats=1).kind == "host→host (no CUDA device)"
    assert measure_copy(cuda_like, 2**20, repeats=1).kind == "host→cpu (pageable)"
    assert measure_copy(cuda_like, 2**20, repeats=1, non_blocking=True).kind == "host→cpu (pageable, non_blocking)"
    lang_back("pt-BR")  # needs the catalog with vramlab/lessons' strings
    assert measure_copy(dev, 2**20, repeats=1).kind == "host→host (sem dispositivo CUDA)"
    assert measure_copy(cuda_like, 2**20, repeats=1).kind == "host→cpu (memória paginável)"
    assert (measure_copy(cuda_like, 2**20, repeats=1, non_blocking=True).kind
            == "host→cpu (memória paginável, non_blocking)")
