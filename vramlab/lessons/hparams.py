"""Hyper-parameters under a memory budget, for lessons: fits, a feasible grid, and the models.

- :func:`polyfit` fits a polynomial (least squares) and reports its R².
- :func:`feasible_grid` measures the peak of a step at every point of a two-parameter grid
  and marks which fit a budget; an out-of-memory error marks a point infeasible (the error
  and its traceback are dropped at once, so that the failed step's tensors are freed).
- :class:`ConvNet` is a small CNN whose width is a multiplier and whose blocks can run
  under gradient checkpointing; :func:`naive_attention` is attention written out, which
  materialises the ``T x T`` score matrix that fused kernels
  (``F.scaled_dot_product_attention``) avoid.
- :func:`checkpoint_segments` runs a stack of layers split into any number of near-equal
  segments under gradient checkpointing (``checkpoint_sequential`` with even segments), and
  :func:`segment_bounds` says where the segments start and stop.

Sizes are in bytes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint as _checkpoint

from ..runtime.oom import drop_traceback, is_oom

__all__ = ["Fit", "polyfit", "Grid", "feasible_grid", "ConvNet", "naive_attention", "segment_bounds",
           "checkpoint_segments"]


@dataclass(frozen=True)
class Fit:
    """A least-squares polynomial fit: ``coeffs`` highest power first (as ``numpy.polyfit``)."""

    coeffs: tuple[float, ...]
    r2: float

    def __call__(self, x: Any) -> Any:
        """The fitted values at ``x``."""
        return np.polyval(self.coeffs, x)


def polyfit(xs: Sequence[float], ys: Sequence[float], degree: int = 1) -> Fit:
    """Fit ``ys`` against ``xs`` with a polynomial of ``degree``; R² is ``1 - SS_res / SS_tot``."""
    x = np.asarray(xs, dtype=float)
    y = np.asarray(ys, dtype=float)
    if len(x) != len(y) or len(x) <= degree:
        raise ValueError(f"need more than {degree} points of (x, y); got {len(x)} and {len(y)}")
    c = np.polyfit(x, y, degree)
    ss_res = float(((y - np.polyval(c, x)) ** 2).sum())
    ss_tot = float(((y - y.mean()) ** 2).sum())
    return Fit(tuple(float(v) for v in c), 1.0 - ss_res / ss_tot if ss_tot else 1.0)


@dataclass(frozen=True)
class Grid:
    """A measured grid. ``peak[i][j]`` is the peak (bytes) at ``rows[i]``, ``cols[j]``, or
    ``None`` where the step ran out of memory; ``feasible`` marks peaks within ``budget``."""

    rows: tuple[Any, ...]
    cols: tuple[Any, ...]
    peak: tuple[tuple[Optional[int], ...], ...]
    budget: int

    @property
    def feasible(self) -> np.ndarray:
        """Booleans, ``rows x cols``: the step ran and its peak is within the budget."""
        return np.array([[p is not None and p <= self.budget for p in row] for row in self.peak], dtype=bool)

    @property
    def count(self) -> int:
        """How many points are feasible."""
        return int(self.feasible.sum())

    def frontier(self) -> list[Any]:
        """For each column, the largest row value that is feasible (``None`` if none is)."""
        f = self.feasible
        out = []
        for j in range(len(self.cols)):
            ok = [self.rows[i] for i in range(len(self.rows)) if f[i, j]]
            out.append(max(ok) if ok else None)
        return out


def feasible_grid(step: Callable[[Any, Any], int], rows: Sequence[Any], cols: Sequence[Any], budget: int, *,
                  prune: bool = True) -> Grid:
    """Measure ``step(row, col)`` (which returns the peak in bytes) over the grid.

    An out-of-memory error counts as infeasible. With ``prune`` (the default), once a row
    value is infeasible for a column, the larger row values of that column are not run:
    they are assumed infeasible too, which holds when memory grows with the row parameter
    (list ``rows`` in increasing order of cost).
    """
    import gc

    peaks: list[list[Optional[int]]] = [[None] * len(cols) for _ in rows]
    for j, c in enumerate(cols):
        for i, r in enumerate(rows):
            try:
                peaks[i][j] = int(step(r, c))
            except Exception as e:  # noqa: BLE001 (re-raised unless it is an OOM)
                if not is_oom(e):
                    raise
                drop_traceback(e)
                del e
                gc.collect()
                peaks[i][j] = None
            got = peaks[i][j]
            if prune and (got is None or got > budget):
                break
    return Grid(tuple(rows), tuple(cols), tuple(tuple(p) for p in peaks), int(budget))


class ConvNet(nn.Module):
    """Three conv-BN-ReLU-pool blocks of ``16k, 32k, 64k`` channels (``k = width``), a global
    average pool and a linear head, for images of any side.

    ``checkpoint=True`` runs each block under ``torch.utils.checkpoint`` (non-reentrant): only
    the block's input is kept for backward, and the block's forward runs again during backward
    to recompute the rest. (BatchNorm's running statistics are then updated twice per step, a
    known side effect of checkpointing BatchNorm.)"""

    def __init__(self, width: int = 1, classes: int = 10, checkpoint: bool = False) -> None:
        super().__init__()
        chans = (16 * width, 32 * width, 64 * width)
        blocks = []
        c = 3
        for w in chans:
            blocks.append(nn.Sequential(nn.Conv2d(c, w, 3, padding=1, bias=False), nn.BatchNorm2d(w),
                                        nn.ReLU(), nn.MaxPool2d(2)))
            c = w
        self.blocks = nn.ModuleList(blocks)
        self.head = nn.Linear(c, classes)
        self.checkpoint = checkpoint

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for b in self.blocks:
            if self.checkpoint and torch.is_grad_enabled():
                x = _checkpoint(b, x, use_reentrant=False)
            else:
                x = b(x)
        return self.head(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


def naive_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Attention written out: ``softmax(q k^T / sqrt(d)) v``. Its ``T x T`` scores and their
    softmax are kept for backward: memory grows as the square of the sequence length."""
    scores = (q @ k.transpose(-2, -1)) * (q.shape[-1] ** -0.5)
    return torch.softmax(scores, dim=-1) @ v


def segment_bounds(n: int, segments: int) -> list[tuple[int, int]]:
    """``(start, stop)`` of ``segments`` contiguous segments of ``n`` layers whose lengths differ
    by at most one (the longer ones last)."""
    if not 1 <= segments <= n:
        raise ValueError(f"segments must be between 1 and the number of layers ({n}); got {segments}")
    edges = [n * i // segments for i in range(segments + 1)]
    return list(zip(edges[:-1], edges[1:]))


def checkpoint_segments(layers: Sequence[nn.Module], segments: int, x: torch.Tensor) -> torch.Tensor:
    """Run ``layers`` in order on ``x``, split into ``segments`` near-equal segments
    (:func:`segment_bounds`); every segment but the last runs under ``torch.utils.checkpoint``
    (non-reentrant), so only its input is kept for backward and its forward runs again there.

    The last segment is not checkpointed: its forward would be recomputed at once. This is
    ``torch.utils.checkpoint.checkpoint_sequential`` when ``segments`` divides ``len(layers)``;
    for other counts that function makes ``segments - 1`` segments of ``len(layers) // segments``
    layers and gives the rest to the last, unchecked one (at ``segments > len(layers) / 2``, half
    the layers or more), where this one keeps the segments even. ``segments=1``: no checkpointing.
    """
    layers = list(layers.children()) if isinstance(layers, nn.Sequential) else list(layers)
    bounds = segment_bounds(len(layers), segments)

    def run(start: int, stop: int) -> Callable[[torch.Tensor], torch.Tensor]:
        def forward(h: torch.Tensor) -> torch.Tensor:
            for layer in layers[start:stop]:
                h = layer(h)
            return h
        return forward

    for start, stop in bounds[:-1]:
        x = _checkpoint(run(start, stop), x, use_reentrant=False)
    return run(*bounds[-1])(x)
