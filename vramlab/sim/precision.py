"""Numeric precision of a training step, by Lightning's names, and what it means per strategy.

``precision=`` takes the names PyTorch Lightning uses (``Trainer(precision=...)``):

- ``"32-true"``: everything in float32 (the default);
- ``"bf16-true"``, ``"16-true"``: the model, its gradients, the optimizer state and the
  batch's floating tensors in bfloat16 / float16 (what ``dtype=`` has always done);
- ``"bf16-mixed"``, ``"16-mixed"``: 16-bit compute over 32-bit weights, as the frameworks
  run it. Where the weights live depends on the strategy (:meth:`Precision.plan`):

  - one device, and DDP: the model stays in float32 and the forward runs under
    ``torch.autocast`` (Lightning's ``MixedPrecision``); gradients are float32;
  - ZeRO-1 and ZeRO-2: 16-bit working weights and gradients, and a float32 master copy of the
    rank's partition that the optimizer updates and whose state it keeps (DeepSpeed's
    ``bf16``/``fp16`` optimizers; the paper's "mixed precision training" in §3.1);
  - FSDP2: float32 sharded parameters with ``MixedPrecisionPolicy(param_dtype=16-bit,
    reduce_dtype=float32)``: the all-gathered parameters are 16-bit, the gradients are
    reduced and kept in float32.

  ``"16-mixed"`` adds loss scaling (a ``GradScaler``): the loss is multiplied by the scale
  before backward and the gradients are unscaled in place before the optimizer step. The
  scaler's own tensors are a few bytes; its check for inf/NaN is not run (a fake tensor has
  no values), so every step is taken.

On a fake or virtual device the forward runs under ``torch.autocast("cpu")``. Its op lists are
the CPU's without a card (matmuls, convolutions and linear layers in 16 bits, the losses in
float32, but softmax, layer_norm, exp, pow and sum in the input's dtype); on a GPU preset (a
VirtualGPU of one, or ``estimate(device="T4")``) the card's kernel model gives CPU autocast CUDA's
lists (:mod:`vramlab.sim.kernels`: softmax, log_softmax, layer_norm, exp, pow, sum, the losses, ...
in float32, as ``torch.autocast("cuda")`` runs them). On a CUDA device it is CUDA's own.

All sizes are in bytes.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Iterator, Optional

from .._extras import require_torch

require_torch("vramlab's simulator")

import torch  # noqa: E402

__all__ = ["PRECISIONS", "Precision", "Plan", "resolve_precision", "MasterWeights", "LossScaler"]

#: Lightning's precision names that ``precision=`` takes (its short aliases ``"32"``, ``"16"``,
#: ``"bf16"`` map as Lightning maps them: to ``"32-true"``, ``"16-mixed"``, ``"bf16-mixed"``).
PRECISIONS: tuple[str, ...] = ("32-true", "bf16-mixed", "16-mixed", "bf16-true", "16-true", "64-true")

_ALIASES = {"32": "32-true", "16": "16-mixed", "bf16": "bf16-mixed", "64": "64-true"}
_DTYPES = {"32": torch.float32, "bf16": torch.bfloat16, "16": torch.float16, "64": torch.float64}
_NAMES = {torch.float32: "32-true", torch.bfloat16: "bf16-true", torch.float16: "16-true", torch.float64: "64-true"}


@dataclass(frozen=True)
class Plan:
    """How one step runs under a precision and a strategy.

    Attributes:
        model_dtype: the model is cast to it before it is sharded or materialised (``None``: as built).
        batch_dtype: the batch's floating tensors are cast to it (``None``: as made).
        autocast: the forward runs under ``torch.autocast`` with this dtype (``None``: no autocast).
        scale_loss: loss scaling (``"16-mixed"``): :class:`LossScaler`.
        master_weights: the optimizer keeps float32 master copies (:class:`MasterWeights`).
        fsdp_param_dtype: FSDP2's ``MixedPrecisionPolicy(param_dtype=..., reduce_dtype=float32)``.
    """

    model_dtype: Optional[torch.dtype] = None
    batch_dtype: Optional[torch.dtype] = None
    autocast: Optional[torch.dtype] = None
    scale_loss: bool = False
    master_weights: bool = False
    fsdp_param_dtype: Optional[torch.dtype] = None


@dataclass(frozen=True)
class Precision:
    """A precision by Lightning's name: ``dtype`` is its low-precision type (``None`` for
    ``"32-true"``), ``mixed`` whether float32 weights stay under 16-bit compute."""

    name: str
    dtype: Optional[torch.dtype]
    mixed: bool

    @property
    def label(self) -> Optional[str]:
        """What the estimate's ``dtype`` field shows: ``None`` for float32, the dtype's name for
        the ``-true`` precisions, the precision's name for the mixed ones."""
        if self.mixed:
            return self.name
        return None if self.dtype is None else str(self.dtype).replace("torch.", "")

    def plan(self, strategy: Optional[str]) -> Plan:
        """How a step runs under this precision and ``strategy`` (``None``, ``"ddp"``,
        ``"zero1"``, ``"zero2"``, ``"fsdp"``): module docs."""
        if not self.mixed:
            return Plan(model_dtype=self.dtype, batch_dtype=self.dtype)
        scale = self.dtype == torch.float16
        if strategy in ("zero1", "zero2"):
            return Plan(model_dtype=self.dtype, batch_dtype=self.dtype, scale_loss=scale, master_weights=True)
        if strategy == "fsdp":
            return Plan(fsdp_param_dtype=self.dtype, scale_loss=scale)
        return Plan(autocast=self.dtype, scale_loss=scale)


def resolve_precision(precision: Any = None, dtype: Optional[torch.dtype] = None) -> Precision:
    """A :class:`Precision` from ``precision=`` (a name of :data:`PRECISIONS` or an alias) and/or
    ``dtype=`` (the older spelling of the ``-true`` precisions); one ``ValueError`` when they
    disagree or are unknown."""
    if dtype is not None and not isinstance(dtype, torch.dtype):
        raise ValueError(f"dtype must be a torch.dtype (torch.bfloat16); got {dtype!r}")
    if dtype is not None and not dtype.is_floating_point:
        raise ValueError(f"dtype must be a floating-point type; got {dtype}")
    if precision is None:
        if dtype is None:
            return Precision("32-true", None, False)
        return Precision(_NAMES.get(dtype, f"{str(dtype).replace('torch.', '')}-true"),
                         None if dtype == torch.float32 else dtype, False)
    name = _ALIASES.get(str(precision), precision)
    if not isinstance(name, str) or name not in PRECISIONS:
        raise ValueError(f"unknown precision {precision!r}; one of {', '.join(PRECISIONS)} (Lightning's names)")
    base, kind = name.split("-")
    p_dtype = _DTYPES[base]
    p = Precision(name, None if p_dtype == torch.float32 else p_dtype, kind == "mixed")
    if dtype is not None and not (kind == "true" and dtype == p_dtype):
        raise ValueError(f"dtype={dtype} and precision={precision!r} disagree: give one of them "
                         f"(dtype=torch.bfloat16 is precision='bf16-true')")
    return p


@contextlib.contextmanager
def autocast(device_type: str, dtype: Optional[torch.dtype]) -> Iterator[None]:
    """``torch.autocast(device_type, dtype)`` for the block, or nothing when ``dtype`` is ``None``."""
    if dtype is None:
        yield
        return
    with torch.autocast(device_type=device_type, dtype=dtype):
        yield


class LossScaler:
    """The memory of ``GradScaler``: a one-element float32 scale on the device, the loss
    multiplied by it before backward, and the gradients unscaled in place before the step
    (the inf/NaN check is not modelled: module docs). ``init_scale`` as torch's default."""

    def __init__(self, device: Any, init_scale: float = 2.0**16) -> None:
        self.scale_ = torch.full((), init_scale, dtype=torch.float32, device=device)

    def scale(self, loss: torch.Tensor) -> torch.Tensor:
        """``loss * scale``."""
        return loss * self.scale_.to(loss.dtype)

    def unscale(self, params: Any) -> None:
        """Divide each parameter's gradient by the scale, in place."""
        with torch.no_grad():
            inv = self.scale_.reciprocal()
            for p in params:
                g = getattr(p, "grad", None)
                if g is not None:
                    g.mul_(inv.to(g.dtype))


class MasterWeights(torch.optim.Optimizer):
    """A 16-bit model's optimizer with float32 master weights (DeepSpeed's ``bf16``/``fp16``
    optimizer, and the ZeRO paper's mixed-precision Adam).

    It holds a float32 copy of each parameter it is given; ``step()`` copies each 16-bit
    gradient into a float32 one, steps ``inner`` (an Optimizer class) on the copies, writes
    them back into the 16-bit parameters and drops the float32 gradients. Its own
    ``param_groups`` are the 16-bit parameters (so ZeroRedundancyOptimizer partitions and
    broadcasts those); the masters and ``inner``'s state are its state. Per parameter of
    ``n`` elements: ``4n`` bytes of master weights, the inner optimizer's state on them (Adam:
    ``8n``), and ``4n`` of float32 gradient during the step.
    """

    inner_class: type = torch.optim.Adam
    inner_kwargs: dict[str, Any] = {}

    def __init__(self, params: Any, **kwargs: Any) -> None:
        super().__init__(params, dict(kwargs))
        masters = []
        for g in self.param_groups:
            ms = []
            for p in g["params"]:
                with torch.no_grad():
                    ms.append(p.detach().to(torch.float32).requires_grad_(p.requires_grad))
            masters.append({"params": ms})
        self.masters = masters
        self.inner = self.inner_class(masters, **{**self.inner_kwargs, **kwargs})

    @classmethod
    def of(cls, inner: type, **inner_kwargs: Any) -> type:
        """A subclass whose inner optimizer is ``inner`` (for ZeroRedundancyOptimizer's
        ``optimizer_class``, which wants a class)."""
        name = f"MasterWeights{inner.__name__}"
        return type(name, (cls,), {"inner_class": inner, "inner_kwargs": dict(inner_kwargs)})

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        pairs = [(p, m) for g, mg in zip(self.param_groups, self.masters) for p, m in zip(g["params"], mg["params"])]
        for p, m in pairs:
            m.grad = None if p.grad is None else p.grad.to(torch.float32)
        self.inner.step()
        for p, m in pairs:
            m.grad = None
            p.copy_(m)
        return None
