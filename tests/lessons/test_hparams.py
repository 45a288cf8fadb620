"""vramlab.lessons.hparams: polynomial fits, the feasible grid, ConvNet and written-out attention."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402

from vramlab.lessons.hparams import ConvNet, Grid, feasible_grid, naive_attention, polyfit  # noqa: E402
from vramlab.sim.virtual_gpu import VirtualGPU  # noqa: E402


def test_polyfit_exact_and_r2():
    f = polyfit([1, 2, 3, 4], [3, 5, 7, 9], 1)
    assert f.coeffs == pytest.approx((2.0, 1.0)) and f.r2 == pytest.approx(1.0)
    assert f(10) == pytest.approx(21.0)
    q = polyfit([1, 2, 3, 4, 5], [1, 4, 9, 16, 25], 2)
    assert q.coeffs[0] == pytest.approx(1.0)
    noisy = polyfit([1, 2, 3, 4], [1, 3, 2, 4], 1)
    assert 0 < noisy.r2 < 1
    with pytest.raises(ValueError):
        polyfit([1, 2], [1, 2], 2)


def test_feasible_grid_budget_oom_and_pruning():
    calls = []

    def step(r, c):
        calls.append((r, c))
        if r * c > 12:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 1 GiB")
        return r * c * 10

    g = feasible_grid(step, [1, 2, 3, 4, 5], [1, 2, 3], budget=60)
    assert isinstance(g, Grid)
    assert g.peak[0] == (10, 20, 30) and g.peak[4][0] == 50
    assert g.feasible.tolist()[2] == [True, True, False]  # 90 > budget
    assert (4, 3) not in calls and (5, 3) not in calls  # pruned after the first infeasible row
    assert g.frontier() == [5, 3, 2]
    assert g.count == 5 + 3 + 2


def test_feasible_grid_reraises_other_errors():
    def step(r, c):
        raise KeyError("boom")

    with pytest.raises(KeyError):
        feasible_grid(step, [1], [1], budget=1)


@pytest.mark.parametrize("allocator,frontier", [
    ("exact", [4]),
    ("caching", [1]),  # 1 MiB fits a 2 MiB small-pool segment; 2 MiB asks a 20 MiB segment of an 8 MiB card
])
@pytest.mark.slow
def test_feasible_grid_on_a_virtual_gpu_catches_real_ooms(allocator, frontier):
    gpu = VirtualGPU("8MiB", allocator=allocator)

    def step(n, _):
        with gpu:
            gpu.reset_peak()
            t = torch.empty(n * 2**20, dtype=torch.uint8)
            del t
        return gpu.peak

    g = feasible_grid(step, [1, 2, 4, 16], [0], budget=8 * 2**20)
    assert g.frontier() == frontier and g.peak[3][0] is None and gpu.allocated == 0


def test_convnet_shapes_and_checkpointing_saves_memory():
    x = torch.randn(4, 3, 64, 64)
    for width in (1, 2):
        assert ConvNet(width)(x).shape == (4, 10)
    peaks = {}
    for ck in (False, True):
        torch.manual_seed(0)
        model = ConvNet(1, checkpoint=ck)
        gpu = VirtualGPU("1GiB")
        with gpu:
            F.cross_entropy(model(x), torch.zeros(4, dtype=torch.long)).backward()
        peaks[ck] = gpu.peak
    assert peaks[True] < peaks[False]


def test_naive_attention_matches_sdpa():
    q, k, v = (torch.randn(1, 2, 16, 8) for _ in range(3))
    assert torch.allclose(naive_attention(q, k, v), F.scaled_dot_product_attention(q, k, v), atol=1e-5)


def test_segment_bounds_are_even_and_cover_the_layers():
    from vramlab.lessons.hparams import segment_bounds

    assert segment_bounds(16, 4) == [(0, 4), (4, 8), (8, 12), (12, 16)]
    assert segment_bounds(16, 1) == [(0, 16)]
    for n in (1, 7, 16):
        for k in range(1, n + 1):
            b = segment_bounds(n, k)
            lengths = [stop - start for start, stop in b]
            assert len(b) == k and b[0][0] == 0 and b[-1][1] == n
            assert all(b[i][1] == b[i + 1][0] for i in range(k - 1))
            assert max(lengths) - min(lengths) <= 1 and min(lengths) >= 1
    with pytest.raises(ValueError):
        segment_bounds(4, 5)
    with pytest.raises(ValueError):
        segment_bounds(4, 0)


def _deep_mlp(n=8, w=32):
    from torch import nn

    torch.manual_seed(0)
    return nn.Sequential(*[nn.Sequential(nn.Linear(w, w), nn.ReLU()) for _ in range(n)])


def _step_peak(run, net, x):
    net.zero_grad(set_to_none=True)
    gpu = VirtualGPU("1GiB")
    with gpu:
        run(net, x).sum().backward()
    return gpu.peak, [p.grad.clone() for p in net.parameters()]


def test_checkpoint_segments_matches_plain_and_checkpoint_sequential():
    from torch.utils.checkpoint import checkpoint_sequential

    from vramlab.lessons.hparams import checkpoint_segments

    net, x = _deep_mlp(), torch.randn(64, 32)
    plain_peak, plain_grads = _step_peak(lambda m, h: m(h), net, x)
    peaks = {}
    for k in range(1, 9):
        peaks[k], grads = _step_peak(lambda m, h: checkpoint_segments(m, k, h), net, x)
        assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(grads, plain_grads))  # same gradients
        if 8 % k == 0:  # even segments: torch's checkpoint_sequential, byte for byte
            assert peaks[k] == _step_peak(lambda m, h: checkpoint_sequential(m, k, h, use_reentrant=False), net, x)[0]
    assert peaks[1] == plain_peak  # one segment: no checkpointing
    assert min(peaks.values()) < peaks[8] < plain_peak * 1.01  # per layer: barely better than none
    assert 1 < min(peaks, key=peaks.get) < 8  # the optimum is interior


def test_checkpoint_segments_recomputes_all_but_the_last_segment():
    from vramlab.lessons.hparams import checkpoint_segments, segment_bounds

    net, x = _deep_mlp(), torch.randn(4, 32)
    calls = []
    for layer in net:  # a pre-hook: recomputation stops once the last saved tensor is back (early stop),
        layer.register_forward_pre_hook(lambda *_: calls.append(1))  # before a module's forward returns
    for k in (1, 3, 8):
        calls.clear()
        checkpoint_segments(net, k, x).sum().backward()
        start, stop = segment_bounds(8, k)[-1]
        assert len(calls) == 8 + (8 - (stop - start))
