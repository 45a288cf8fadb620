"""Pruning for lessons: why zeroing weights does not shrink a dense tensor, and what does.

- :func:`prune_unstructured` zeroes the smallest-magnitude weights of every ``nn.Linear``
  with ``torch.nn.utils.prune.l1_unstructured`` and makes it permanent
  (``prune.remove``): the weights are still a dense tensor of the same shape and dtype,
  so their bytes are unchanged. While the pruning is attached (before ``remove``) each
  pruned layer holds *more*: ``weight_orig``, ``weight_mask`` and the recomputed ``weight``.
- :func:`sparse_bytes` is what a sparse layout (CSR or COO) of a tensor takes: values plus
  int64 indices, so it saves memory only when few enough entries are non-zero
  (:func:`csr_break_even_density`).
- :func:`prune_neurons` is structured pruning: it removes whole hidden units (rows of one
  ``nn.Linear`` and the matching columns of the next) and returns a smaller dense model,
  whose bytes really shrink.
- :func:`sparsity` is the fraction of zero weights.

All sizes are in bytes.
"""

from __future__ import annotations

import copy
import warnings
from typing import Optional, cast

import torch
from torch import nn

__all__ = ["prune_unstructured", "attach_unstructured", "sparsity", "sparse_bytes", "csr_break_even_density",
           "prune_neurons"]

# Layers that act elementwise (or not at all) on the features between two Linear layers:
# removing a hidden unit removes one input and one output of these.
_ELEMENTWISE = (nn.ReLU, nn.GELU, nn.SiLU, nn.Tanh, nn.Sigmoid, nn.LeakyReLU, nn.ELU, nn.Dropout, nn.Identity,
                nn.Mish, nn.Softplus, nn.Hardswish)


def _linears(model: nn.Module) -> list[nn.Linear]:
    return [m for m in model.modules() if isinstance(m, nn.Linear)]


def attach_unstructured(model: nn.Module, amount: float) -> nn.Module:
    """Attach L1 unstructured pruning of ``amount`` (a fraction) to every ``nn.Linear`` of
    ``model`` in place, *without* making it permanent: each layer then holds
    ``weight_orig`` (a parameter), ``weight_mask`` (a buffer) and ``weight`` (recomputed by
    a forward pre-hook). Returns ``model``."""
    from torch.nn.utils import prune

    if not 0.0 <= amount <= 1.0:
        raise ValueError(f"amount must be a fraction in [0, 1]; got {amount}")
    for lin in _linears(model):
        prune.l1_unstructured(lin, "weight", amount=amount)
    return model


def prune_unstructured(model: nn.Module, amount: float, inplace: bool = False) -> nn.Module:
    """Zero the ``amount`` fraction of smallest-magnitude weights of every ``nn.Linear``
    (per layer) and make it permanent. The result is dense: same shapes, same bytes."""
    from torch.nn.utils import prune

    m = model if inplace else copy.deepcopy(model)
    attach_unstructured(m, amount)
    for lin in _linears(m):
        prune.remove(lin, "weight")
    return m


def sparsity(model: nn.Module) -> float:
    """The fraction of ``nn.Linear`` weights that are exactly zero."""
    zeros = total = 0
    for lin in _linears(model):
        w = lin.weight.detach()
        zeros += int((w == 0).sum())
        total += w.numel()
    return zeros / total if total else 0.0


def sparse_bytes(t: torch.Tensor, layout: str = "csr") -> int:
    """Bytes of ``t`` in a sparse layout: ``"csr"`` (values, int64 column indices, int64
    row pointers) or ``"coo"`` (values and an int64 index per dimension)."""
    t = t.detach()
    if layout == "csr":
        with warnings.catch_warnings():  # "Sparse CSR tensor support is in beta state"
            warnings.simplefilter("ignore")
            s = t.to_sparse_csr()
        parts: tuple[torch.Tensor, ...] = (s.values(), s.col_indices(), s.crow_indices())
    elif layout == "coo":
        s = t.to_sparse().coalesce()
        parts = (s.values(), s.indices())
    else:
        raise ValueError(f"layout must be 'csr' or 'coo'; got {layout!r}")
    return sum(p.numel() * p.element_size() for p in parts)


def csr_break_even_density(element_size: int = 4, index_size: int = 8) -> float:
    """The density (fraction of non-zeros) below which CSR is smaller than dense, ignoring
    the row pointers: each non-zero costs ``element_size + index_size`` bytes instead of
    ``element_size``. For float32 and int64 indices: 4 / 12 = 1/3."""
    return element_size / (element_size + index_size)


def prune_neurons(model: nn.Module, amount: float, inplace: bool = False) -> nn.Module:
    """Structured pruning: remove the ``amount`` fraction of hidden units with the smallest
    L2 norm of incoming weights, in every ``nn.Sequential`` of the model.

    A hidden unit is an output of a ``nn.Linear`` that is followed, through elementwise
    layers only (ReLU, GELU, Dropout, ...), by another ``nn.Linear``; the last Linear of
    each Sequential (the model's outputs) keeps all its outputs. The new layers are dense
    and smaller: their bytes shrink with the units removed.

    Returns the pruned model (a deep copy unless ``inplace``).
    """
    if not 0.0 <= amount < 1.0:
        raise ValueError(f"amount must be a fraction in [0, 1); got {amount}")
    m = model if inplace else copy.deepcopy(model)
    seqs = [s for s in m.modules() if isinstance(s, nn.Sequential)]
    for seq in seqs:
        layers = list(seq)
        for i, a in enumerate(layers):
            if not isinstance(a, nn.Linear):
                continue
            j: Optional[int] = None
            for k in range(i + 1, len(layers)):
                if isinstance(layers[k], nn.Linear):
                    j = k
                    break
                if not isinstance(layers[k], _ELEMENTWISE):
                    break
            if j is None:
                continue
            a = cast(nn.Linear, seq[i])  # may have been replaced as the "next" of an earlier pair
            b = cast(nn.Linear, seq[j])
            keep_n = max(1, round(a.out_features * (1.0 - amount)))
            with torch.no_grad():
                score = a.weight.norm(dim=1)
                keep = torch.argsort(score, descending=True)[:keep_n].sort().values
                new_a = nn.Linear(a.in_features, keep_n, bias=a.bias is not None,
                                  device=a.weight.device, dtype=a.weight.dtype)
                new_a.weight.copy_(a.weight[keep])
                if a.bias is not None:
                    new_a.bias.copy_(a.bias[keep])
                new_b = nn.Linear(keep_n, b.out_features, bias=b.bias is not None,
                                  device=b.weight.device, dtype=b.weight.dtype)
                new_b.weight.copy_(b.weight[:, keep])
                if b.bias is not None:
                    new_b.bias.copy_(b.bias)
            seq[i] = new_a
            seq[j] = new_b
    return m
