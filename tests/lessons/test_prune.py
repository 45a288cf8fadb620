"""vramlab.lessons.prune: unstructured pruning keeps dense bytes; structured pruning shrinks them."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

from vramlab.lessons.prune import (  # noqa: E402
    attach_unstructured, csr_break_even_density, prune_neurons, prune_unstructured, sparse_bytes, sparsity,
)
from vramlab.lessons.quant import model_bytes  # noqa: E402


def mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 64), nn.GELU(), nn.Dropout(0.1),
                         nn.Linear(64, 10))


def test_unstructured_pruning_zeroes_weights_but_keeps_bytes():
    m = mlp()
    p = prune_unstructured(m, 0.9)
    assert sparsity(p) == pytest.approx(0.9, abs=0.01)
    assert sparsity(m) < 0.01
    assert model_bytes(p) == model_bytes(m)
    assert all(not hasattr(x, "weight_orig") for x in p.modules())


def test_attached_pruning_holds_more_bytes():
    m = mlp()
    before = model_bytes(m)
    attach_unstructured(m, 0.5)
    m(torch.randn(2, 32))
    assert model_bytes(m) > 1.5 * before  # weight_orig and weight_mask
    with pytest.raises(ValueError):
        attach_unstructured(mlp(), 1.5)


def test_sparse_bytes_and_break_even():
    assert csr_break_even_density() == pytest.approx(1 / 3)
    dense = torch.zeros(100, 100)
    dense.view(-1)[:1000] = 1.0  # 10% dense
    assert sparse_bytes(dense, "csr") == 1000 * 4 + 1000 * 8 + 101 * 8
    assert sparse_bytes(dense, "coo") == 1000 * 4 + 2 * 1000 * 8
    half = torch.ones(100, 100)
    half.view(-1)[::2] = 0
    assert sparse_bytes(half) > half.numel() * 4  # 50% dense: CSR is larger than dense
    with pytest.raises(ValueError):
        sparse_bytes(dense, "bsr")


def test_prune_neurons_shrinks_and_keeps_function_shape():
    m = mlp()
    p = prune_neurons(m, 0.5)
    assert p[0].out_features == 32 and p[2].in_features == 32
    assert p[2].out_features == 32 and p[5].in_features == 32
    assert p[5].out_features == 10  # outputs kept
    assert model_bytes(p) < 0.6 * model_bytes(m)
    assert p(torch.randn(3, 32)).shape == (3, 10)
    assert m[0].out_features == 64  # copy by default


def test_prune_neurons_keeps_the_strongest_units():
    lin1, lin2 = nn.Linear(4, 4, bias=False), nn.Linear(4, 1, bias=False)
    with torch.no_grad():
        lin1.weight.copy_(torch.diag(torch.tensor([1.0, 5.0, 0.1, 3.0])))
        lin2.weight.copy_(torch.tensor([[1.0, 2.0, 3.0, 4.0]]))
    p = prune_neurons(nn.Sequential(lin1, nn.ReLU(), lin2), 0.5)
    assert torch.equal(p[2].weight, torch.tensor([[2.0, 4.0]]))


def test_prune_neurons_stops_at_non_elementwise_layers():
    m = nn.Sequential(nn.Linear(8, 8), nn.LayerNorm(8), nn.Linear(8, 2))
    p = prune_neurons(m, 0.5)
    assert p[0].out_features == 8  # a LayerNorm mixes units: nothing pruned across it
