"""Fine-tuning on a budget, for lessons: an 8-bit AdamW, LoRA adapters on a frozen base, and
the bytes per parameter of each way to train.

- :class:`Int8StateAdamW` keeps AdamW's two moments in 8 bits (1 byte each instead of 4), with
  one float32 scale per block of 2048 values. It is **not** bitsandbytes' algorithm (that
  uses a learned "dynamic" quantisation map and fused CUDA kernels); it uses a power-law
  companding map with the same storage: 2 bytes per parameter plus 2 x 4 / 2048 for scales.
  (Its name says what it stores, and differs from bitsandbytes' ``AdamW8bit`` on purpose.)
  It is plain PyTorch, so it runs on the CPU, on CUDA and under ``FakeTensorMode`` (so
  :func:`vramlab.sim.estimate.estimate` counts its state for a model you do not have). Each step
  dequantises one parameter's moments at a time: float32 temporaries of the largest
  parameter's size.
- :class:`LoRALinear` and :func:`add_lora` freeze a model and add trainable low-rank
  adapters (LoRA) to its linear layers: gradients and optimizer state exist only for the
  adapters.
- :func:`training_bytes_per_parameter` is the napkin formula: bytes per parameter of
  weights, gradients, optimizer state and the low-precision weight copies of autocast.

All sizes are in bytes.
"""

from __future__ import annotations

import math
from typing import Callable, Iterable, Optional

import torch
from torch import nn

__all__ = ["Int8StateAdamW", "LoRALinear", "add_lora", "training_bytes_per_parameter", "BLOCK"]

#: Values per quantisation scale in :class:`Int8StateAdamW` (as in the 8-bit optimizers paper).
BLOCK = 2048

_OPT_STATE_FP32 = {"adamw": 8.0, "adam": 8.0, "sgd": 0.0, "sgd-momentum": 4.0, "adamw-8bit": 2.0 + 8.0 / BLOCK}


def training_bytes_per_parameter(optimizer: str = "adamw", precision: str = "fp32",
                                 trainable: bool = True) -> dict[str, float]:
    """Bytes per parameter of a training step, by part.

    Args:
        optimizer: ``"adamw"``/``"adam"`` (two moments), ``"sgd-momentum"`` (one),
            ``"sgd"`` (none), ``"adamw-8bit"`` (two moments of 1 byte, plus block scales).
        precision: ``"fp32"``; ``"amp"`` (``torch.autocast``: fp32 weights, gradients and
            optimizer state, plus the 2-byte weight copies autocast caches during the forward
            pass); ``"bf16"`` (parameters, gradients and, for torch's optimizers, their state in
            bf16; the 8-bit optimizer's state stays 1 byte per moment).
        trainable: ``False`` for a frozen parameter: only its weight is kept.

    Returns:
        ``{"weights", "gradients", "optimizer_state", "autocast_copies", "total"}``. fp32 Adam
        gives 16 bytes; amp Adam 18 (16 + 2); bf16 Adam 8; bf16 with 8-bit AdamW about 6.
        These parts are not all alive at the same moment (the autocast copies are freed during
        backward; gradients appear during it), so the step's peak also depends on the
        activations and the order of the phases.
    """
    opt = optimizer.lower()
    if opt not in _OPT_STATE_FP32:
        raise ValueError(f"unknown optimizer {optimizer!r}; known: {', '.join(_OPT_STATE_FP32)}")
    if precision not in ("fp32", "amp", "bf16"):
        raise ValueError(f"precision must be 'fp32', 'amp' or 'bf16'; got {precision!r}")
    w = 2.0 if precision == "bf16" else 4.0
    if not trainable:
        parts = {"weights": w, "gradients": 0.0, "optimizer_state": 0.0, "autocast_copies": 0.0}
    else:
        state = _OPT_STATE_FP32[opt]
        if precision == "bf16" and opt != "adamw-8bit":
            state /= 2
        parts = {"weights": w, "gradients": w, "optimizer_state": state,
                 "autocast_copies": 2.0 if precision == "amp" else 0.0}
    parts["total"] = sum(parts.values())
    return parts


# ----------------------------------------------------------------------- 8-bit AdamW

def _quantize(x: torch.Tensor, signed: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Blockwise companded 8-bit codes of ``x`` (flattened, padded to BLOCK) and block scales."""
    flat = x.reshape(-1)
    pad = (-flat.numel()) % BLOCK
    if pad:
        flat = torch.cat((flat, flat.new_zeros(pad)))
    blocks = flat.view(-1, BLOCK)
    scale = blocks.abs().amax(dim=1, keepdim=True).clamp_min(1e-30)
    r = (blocks / scale).abs()
    if signed:  # sign * sqrt(|x|/max), 127 levels a side
        code = (r.sqrt() * 127).round().clamp_(0, 127) * blocks.sign()
        q = code.to(torch.int8)
    else:  # (x/max) ** (1/4), 255 levels: fine steps near zero
        q = (r.sqrt().sqrt() * 255).round().clamp_(0, 255).to(torch.uint8)
    return q.view(-1), scale.view(-1)


def _dequantize(q: torch.Tensor, scale: torch.Tensor, signed: bool, numel: int, shape: torch.Size) -> torch.Tensor:
    blocks = q.view(-1, BLOCK).float()
    if signed:
        v = (blocks / 127).abs().square() * blocks.sign()
    else:
        v = (blocks / 255).square().square()
    v = v * scale.view(-1, 1)
    return v.view(-1)[:numel].view(shape)


class Int8StateAdamW(torch.optim.Optimizer):
    """AdamW with its moments stored in 8 bits, blockwise (see module docs).

    State per parameter: ``m`` (int8 codes), ``m_scale`` (float32 per block), ``v`` (uint8
    codes), ``v_scale``, ``step``. Same arguments as ``torch.optim.AdamW``.
    """

    def __init__(self, params: Iterable, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 1e-2) -> None:
        if lr < 0 or eps < 0 or not (0 <= betas[0] < 1 and 0 <= betas[1] < 1):
            raise ValueError(f"bad hyper-parameters: lr={lr}, betas={betas}, eps={eps}")
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))

    @torch.no_grad()
    def step(self, closure: Optional[Callable[[], float]] = None) -> Optional[float]:  # type: ignore[override]
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            lr, (b1, b2), eps, wd = group["lr"], group["betas"], group["eps"], group["weight_decay"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                st = self.state[p]
                g = p.grad.float()
                if not st:
                    m = torch.zeros_like(g)
                    v = torch.zeros_like(g)
                    st["step"] = 0
                else:
                    m = _dequantize(st["m"], st["m_scale"], True, g.numel(), g.shape)
                    v = _dequantize(st["v"], st["v_scale"], False, g.numel(), g.shape)
                st["step"] += 1
                t = st["step"]
                m.lerp_(g, 1 - b1)
                v.mul_(b2).addcmul_(g, g, value=1 - b2)
                denom = (v / (1 - b2 ** t)).sqrt_().add_(eps)
                update = (m / (1 - b1 ** t)).div_(denom)
                if wd:
                    p.mul_(1 - lr * wd)
                p.add_(update.to(p.dtype), alpha=-lr)
                st["m"], st["m_scale"] = _quantize(m, True)
                st["v"], st["v_scale"] = _quantize(v, False)
                del g, m, v, denom, update
        return loss


# ----------------------------------------------------------------------- LoRA

class LoRALinear(nn.Module):
    """A frozen ``nn.Linear`` plus a trainable low-rank update: ``base(x) + (x A^T B^T) * alpha / r``.

    ``A`` (``rank x in``) starts random, ``B`` (``out x rank``) at zero, so the layer starts
    equal to the base. Only ``A`` and ``B`` require gradients.
    """

    def __init__(self, base: nn.Linear, rank: int = 16, alpha: float = 32.0) -> None:
        super().__init__()
        if rank < 1:
            raise ValueError(f"rank must be >= 1; got {rank}")
        self.base = base
        for p in base.parameters():
            p.requires_grad_(False)
        w = base.weight
        self.rank, self.scale = rank, alpha / rank
        self.lora_a = nn.Parameter(torch.empty(rank, base.in_features, device=w.device, dtype=w.dtype))
        self.lora_b = nn.Parameter(torch.empty(base.out_features, rank, device=w.device, dtype=w.dtype))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """A: Kaiming-uniform; B: zeros (the adapter starts as a no-op)."""
        nn.init.kaiming_uniform_(self.lora_a, a=math.sqrt(5))
        nn.init.zeros_(self.lora_b)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.base(x) + (x @ self.lora_a.t() @ self.lora_b.t()) * self.scale

    def extra_repr(self) -> str:
        return f"rank={self.rank}, scale={self.scale:g}"


def add_lora(model: nn.Module, rank: int = 16, alpha: float = 32.0, skip: tuple[str, ...] = ("head",)) -> nn.Module:
    """Freeze every parameter of ``model`` and wrap each ``nn.Linear`` (except those whose
    qualified name contains one of ``skip``) in a :class:`LoRALinear`. In place; returns it."""
    for p in model.parameters():
        p.requires_grad_(False)

    def walk(parent: nn.Module, prefix: str) -> None:
        for name, child in list(parent.named_children()):
            q = f"{prefix}.{name}" if prefix else name
            if isinstance(child, nn.Linear):
                if not any(s in q for s in skip):
                    setattr(parent, name, LoRALinear(child, rank=rank, alpha=alpha))
            elif not isinstance(child, LoRALinear):
                walk(child, q)

    walk(model, "")
    return model
