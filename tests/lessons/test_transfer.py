import contextlib

import pytest
import torch

import vramlab
from vramlab.lessons.transfer import (bucketed_batches, dequantize_int8, measure_copy, padding_stats, quantize_int8,
                                  random_batches, save_on_host)


def test_copy_without_cuda_says_what_it_measured():
    dev = vramlab.pick_device(virtual="64MiB", force_virtual=True)
    r = measure_copy(dev, 8 * 2**20, repeats=3)
    assert r.nbytes == 8 * 2**20 and r.seconds > 0 and "host→host" in r.kind
    with pytest.raises(ValueError, match="CUDA"):
        measure_copy(dev, 2**20, pinned=True)


def test_save_on_host_lowers_the_virtual_peak_and_keeps_gradients():
    dev = vramlab.pick_device(virtual="512MiB", force_virtual=True)
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.Tanh()) for _ in range(6)])
    dev.put(model)
    x = torch.randn(2048, 256)
    peaks, grads = [], []
    for offload in (False, True):
        model.zero_grad(set_to_none=True)
        with dev.measure() as m:
            with save_on_host(dev) if offload else contextlib.nullcontext():
                loss = model(x).square().mean()
            loss.backward()
            del loss
        peaks.append(m.peak_delta)
        grads.append([p.grad.clone() for p in model.parameters()])
    # saved for backward: each tanh's output (the next linear saves the same storage), float32
    acts = 6 * 2048 * 256 * 4
    assert peaks[0] - peaks[1] > 0.5 * acts
    for a, b in zip(*grads):
        assert torch.allclose(a, b)


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
