"""Small reference models for lessons and accuracy checks: an MLP, a CNN and a GPT.

Each ``make_*`` returns a ``(build_model, make_batch, loss_fn)`` triple in the form
:func:`vramlab.sim.estimate.estimate` and :func:`vramlab.sim.measure.measure` take. ``gpt_config`` sizes a
GPT by parameter count (``gpt(**gpt_config("0.8B"))`` builds a 0.8-billion-parameter one).
Nothing here allocates until a builder is called.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["MLP", "CNN", "GPT", "make_mlp", "make_cnn", "make_gpt", "gpt_config"]


class MLP(nn.Module):
    """``depth`` hidden layers of ``width`` with GELU, then a ``classes``-way head."""

    def __init__(self, inputs: int = 784, width: int = 1024, depth: int = 3, classes: int = 10) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        d = inputs
        for _ in range(depth):
            layers += [nn.Linear(d, width), nn.GELU()]
            d = width
        layers.append(nn.Linear(d, classes))
        self.net = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class CNN(nn.Module):
    """A small VGG-style network for 3x32x32 images: conv-BN-ReLU blocks, pooling, a head."""

    def __init__(self, channels: tuple[int, ...] = (32, 64, 128), classes: int = 10) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        c = 3
        for w in channels:
            layers += [nn.Conv2d(c, w, 3, padding=1, bias=False), nn.BatchNorm2d(w), nn.ReLU(), nn.MaxPool2d(2)]
            c = w
        self.features = nn.Sequential(*layers)
        self.head = nn.Linear(c, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.flatten(F.adaptive_avg_pool2d(self.features(x), 1), 1))


class _Block(nn.Module):
    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.fc = nn.Linear(d, 4 * d)
        self.out = nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, c))
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class GPT(nn.Module):
    """A GPT-2-style decoder: token and position embeddings, pre-LN blocks with causal
    ``scaled_dot_product_attention``, a head tied to the token embedding."""

    def __init__(self, vocab: int = 8192, d: int = 256, layers: int = 4, heads: int = 4, context: int = 256) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Embedding(context, d)
        self.blocks = nn.ModuleList(_Block(d, heads) for _ in range(layers))
        self.ln = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)
        self.head.weight = self.tok.weight

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        t = idx.shape[1]
        x = self.tok(idx) + self.pos(torch.arange(t, device=idx.device))
        for blk in self.blocks:
            x = blk(x)
        return self.head(self.ln(x))


def gpt_config(size: str = "0.8B") -> dict[str, int]:
    """GPT sizes by parameter count: ``"micro"`` (~0.1M, for tests that compare two accountings of
    one step), ``"tiny"`` (~5M), ``"small"`` (~30M), ``"0.8B"`` (~0.8B), ``"7B"``
    (6.6B: the shape of the 7B open models, hidden size 4096, 32 layers, a 32,000-token vocabulary)."""
    table = {
        "micro": dict(vocab=256, d=64, layers=2, heads=4, context=128),
        "tiny": dict(vocab=8192, d=256, layers=4, heads=4, context=256),
        "small": dict(vocab=16384, d=512, layers=8, heads=8, context=512),
        "0.8B": dict(vocab=32000, d=1536, layers=26, heads=16, context=1024),
        "7B": dict(vocab=32000, d=4096, layers=32, heads=32, context=512),
    }
    if size not in table:
        raise ValueError(f"unknown GPT size {size!r}; known: {', '.join(table)}")
    return dict(table[size])


Triple = tuple[Callable[[], nn.Module], Callable[[int], Any], Callable[..., torch.Tensor]]


def make_mlp(**kw: Any) -> Triple:
    """An MLP on flat 784-dim inputs, cross-entropy on 10 classes."""
    inputs = kw.get("inputs", 784)
    return (lambda: MLP(**kw),
            lambda b: (torch.randn(b, inputs), torch.randint(0, kw.get("classes", 10), (b,))),
            F.cross_entropy)


def make_cnn(**kw: Any) -> Triple:
    """The CNN on 3x32x32 images, cross-entropy on 10 classes."""
    return (lambda: CNN(**kw),
            lambda b: (torch.randn(b, 3, 32, 32), torch.randint(0, kw.get("classes", 10), (b,))),
            F.cross_entropy)


def make_gpt(size: str = "tiny", seq: int | None = None) -> Triple:
    """A GPT of ``gpt_config(size)`` on token sequences of ``seq`` (default: its context),
    next-token cross-entropy."""
    cfg = gpt_config(size)
    t = seq or cfg["context"]
    v = cfg["vocab"]

    def loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(logits.flatten(0, 1), targets.flatten())

    return (lambda: GPT(**cfg),
            lambda b: (torch.randint(0, v, (b, t)), torch.randint(0, v, (b, t))),
            loss)
