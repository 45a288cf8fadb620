"""Optimizers as training scripts build them, for the estimate.

Three things real scripts do that a plain ``torch.optim`` class does not cover:

- **bitsandbytes' 8-bit and paged optimizers.** bitsandbytes cannot run on fake tensors (its
  quantisation maps are computed from values when the optimizer is built), so
  :class:`BnbLayout` reproduces its memory layout without the library, from its own code
  (bitsandbytes 0.50, ``bitsandbytes/optim/optimizer.py``: ``Optimizer2State.init_state``,
  ``Optimizer1State.init_state`` and ``Optimizer8bit.get_state_buffer``). Per parameter of
  ``n`` elements:

  - 8-bit state (``n >= min_8bit_size``, 4096 by default): each state buffer ``uint8``
    (``n`` bytes), plus a float32 ``absmax`` per block of 256 elements (``4 * ceil(n / 256)``
    bytes) for each buffer, and two 256-entry float32 quantisation maps shared by every
    parameter of the optimizer;
  - 32-bit state (``optim_bits=32``, or a parameter under ``min_8bit_size``): each state
    buffer float32 (``4n`` bytes);
  - paged (``PagedAdamW8bit``, ``PagedAdamW``, ...): on CUDA each state buffer of a parameter of
    at least 100,000 elements is CUDA unified memory (``cudaMallocManaged``, bitsandbytes'
    ``F.get_paged``), outside PyTorch's caching allocator: it is in neither
    ``memory_allocated`` nor ``memory_reserved``, and the driver moves it to host RAM when the
    card runs short. The ``absmax`` blocks and smaller parameters' state stay in the allocator.

  Two-state optimizers (Adam, AdamW, AdEMAMix's first two) keep two buffers, one-state ones
  (Lion, SGD with momentum, RMSprop, Adagrad) one. The update is one fused CUDA kernel that
  works in place, so a step allocates nothing more. :class:`BnbLayout`'s own ``step()``
  updates the parameters in place with plain SGD: it is for estimating memory, not for
  training (use bitsandbytes for that).

- **A factory** (``lambda params: AdamW(params, lr=3e-4)``) resolved to the class and the
  settings it uses (:func:`resolve_optimizer`), which ZeRO's ``ZeroRedundancyOptimizer`` and
  the master weights of mixed precision need, as torch's own ``ZeroRedundancyOptimizer`` takes
  ``optimizer_class`` and its keyword arguments. The factory is called once on a one-element
  float32 parameter to find them; its parameter groups are not kept (ZeroRedundancyOptimizer
  cannot take them either). A factory that builds a bitsandbytes optimizer gets its layout.

- **The step fused into backward** (:class:`StepInBackward`): one optimizer per parameter,
  stepped and emptied by a post-accumulate-grad hook as soon as the parameter's gradient is
  ready, as PyTorch's tutorial "How to save memory by fusing the optimizer step into the
  backward pass" does it, so that no gradient outlives its update.

All sizes are in bytes.
"""

from __future__ import annotations

import inspect
import math
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Optional

from .._extras import require_torch

require_torch("vramlab's simulator")

import torch  # noqa: E402
from torch.utils._python_dispatch import _get_current_dispatch_mode_stack  # noqa: E402

from .ledger import Ledger  # noqa: E402

__all__ = ["BnbLayout", "BNB_OPTIMIZERS", "OptimizerChoice", "resolve_optimizer", "StepInBackward",
           "paged_bytes", "BNB_BLOCKSIZE", "BNB_PAGED_MIN_NUMEL"]

#: bitsandbytes' block of elements per float32 ``absmax`` for its 8-bit optimizer state.
BNB_BLOCKSIZE = 256
#: bitsandbytes pages a state buffer only for a parameter of at least this many elements.
BNB_PAGED_MIN_NUMEL = 100_000
#: bitsandbytes' quantisation maps: 256 float32 entries each, two per optimizer.
_QMAP_ENTRIES = 256


class BnbLayout(torch.optim.Optimizer):
    """bitsandbytes' optimizer memory layout, without the library (module docs).

    Args:
        params: the parameters (or groups).
        lr: learning rate for the stand-in update.
        optim_bits: 8 or 32.
        states: 2 for Adam/AdamW, 1 for Lion/SGD-momentum/RMSprop/Adagrad.
        paged: bitsandbytes' paged variant (unified memory for large parameters' state).
        min_8bit_size: parameters with fewer elements keep 32-bit state (bitsandbytes' 4096).
        max_unorm: above 0, a one-element float32 ``unorm_vec`` per parameter, as bitsandbytes.

    ``paged_bytes`` is what it holds in unified memory (outside the allocator), in bytes.
    """

    optim_bits: int = 8
    states: int = 2
    paged: bool = False
    label: str = "bitsandbytes 8-bit"

    def __init__(self, params: Any, lr: float = 1e-3, *, optim_bits: Optional[int] = None,
                 states: Optional[int] = None, paged: Optional[bool] = None, min_8bit_size: int = 4096,
                 max_unorm: float = 0.0, **ignored: Any) -> None:
        super().__init__(params, dict(lr=lr))
        self.optim_bits = int(optim_bits if optim_bits is not None else type(self).optim_bits)
        self.states = int(states if states is not None else type(self).states)
        self.paged = bool(paged if paged is not None else type(self).paged)
        if self.optim_bits not in (8, 32):
            raise ValueError(f"optim_bits must be 8 or 32 (bitsandbytes' choices); got {self.optim_bits!r}")
        if self.states not in (1, 2):
            raise ValueError(f"states must be 1 or 2; got {self.states!r}")
        self.min_8bit_size = int(min_8bit_size)
        self.max_unorm = float(max_unorm)
        self.paged_bytes = 0
        self._qmaps: Optional[tuple[torch.Tensor, torch.Tensor]] = None

    @classmethod
    def of(cls, name: str, *, optim_bits: int, states: int = 2, paged: bool = False) -> type:
        """A subclass with these settings as its defaults (a class, for ZeroRedundancyOptimizer)."""
        return type(name, (cls,), {"optim_bits": optim_bits, "states": states, "paged": paged,
                                   "label": f"bitsandbytes {name} (layout)"})

    def _buffer(self, p: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        if self.paged and p.numel() >= BNB_PAGED_MIN_NUMEL:
            with _outside_allocator():
                buf = torch.zeros_like(p, dtype=dtype)
            self.paged_bytes += buf.numel() * buf.element_size()
            return buf
        return torch.zeros_like(p, dtype=dtype)

    @torch.no_grad()
    def _init_state(self, p: torch.Tensor) -> dict[str, Any]:
        state = self.state[p]
        state["step"] = 0
        eight = self.optim_bits == 8 and p.numel() >= self.min_8bit_size
        dtype = torch.uint8 if eight else torch.float32
        for i in range(1, self.states + 1):
            state[f"state{i}"] = self._buffer(p, dtype)
        if eight:
            if self._qmaps is None:  # bitsandbytes' name2qmap: one pair per optimizer and device
                self._qmaps = (torch.zeros(_QMAP_ENTRIES, dtype=torch.float32, device=p.device),
                               torch.zeros(_QMAP_ENTRIES, dtype=torch.float32, device=p.device))
            blocks = math.ceil(p.numel() / BNB_BLOCKSIZE)
            for i in range(1, self.states + 1):
                state[f"qmap{i}"] = self._qmaps[i - 1]
                state[f"absmax{i}"] = torch.zeros((blocks,), dtype=torch.float32, device=p.device)
        if self.max_unorm > 0.0:
            state["unorm_vec"] = torch.zeros((1,), device=p.device)
        return state

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        """Create each parameter's state on its first step, then update it in place (a stand-in:
        plain SGD; bitsandbytes' fused kernel allocates nothing either)."""
        loss = closure() if closure is not None else None
        for g in self.param_groups:
            for p in g["params"]:
                if p.grad is None:
                    continue
                state = self.state[p] if p in self.state else self._init_state(p)
                state["step"] += 1
                p.add_(p.grad, alpha=-g["lr"])
        return loss


def _outside_allocator() -> ExitStack:
    """Tensors made in this block are not PyTorch allocator memory: every active ledger (an
    estimate's, a VirtualGPU's) leaves them out, as ``cudaMallocManaged`` memory is."""
    stack = ExitStack()
    for mode in _get_current_dispatch_mode_stack():
        if isinstance(mode, Ledger):
            stack.enter_context(mode.paused())
    return stack


#: bitsandbytes' optimizer classes by their names, as :class:`BnbLayout` settings
#: ``(optim_bits, states, paged)``; ``optimizer="paged_adamw8bit"`` takes the lower-case names.
BNB_OPTIMIZERS: dict[str, tuple[int, int, bool]] = {
    "Adam8bit": (8, 2, False), "AdamW8bit": (8, 2, False),
    "Adam32bit": (32, 2, False), "AdamW32bit": (32, 2, False),
    "PagedAdam8bit": (8, 2, True), "PagedAdamW8bit": (8, 2, True),
    "PagedAdam": (32, 2, True), "PagedAdamW": (32, 2, True),
    "PagedAdam32bit": (32, 2, True), "PagedAdamW32bit": (32, 2, True),
    "Lion8bit": (8, 1, False), "Lion32bit": (32, 1, False), "PagedLion8bit": (8, 1, True), "PagedLion": (32, 1, True),
    "SGD8bit": (8, 1, False), "RMSprop8bit": (8, 1, False), "Adagrad8bit": (8, 1, False),
}
_LAYOUTS: dict[str, type] = {name: BnbLayout.of(name, optim_bits=b, states=s, paged=pg)
                             for name, (b, s, pg) in BNB_OPTIMIZERS.items()}
#: the names ``optimizer=`` takes: ``"adamw8bit"``, ``"paged_adamw8bit"``, ``"paged_adamw"``, ...
BNB_NAMES: dict[str, type] = {}
for _name, _cls in _LAYOUTS.items():
    _low = _name.lower()
    BNB_NAMES[_low.replace("paged", "paged_", 1) if _low.startswith("paged") else _low] = _cls


def _is_bnb(obj: Any) -> bool:
    mod = getattr(obj if isinstance(obj, type) else type(obj), "__module__", "") or ""
    return mod.split(".")[0] == "bitsandbytes"


def _bnb_layout_class(cls: type) -> type:
    """The layout of a bitsandbytes optimizer class, by its name (bitsandbytes' ``Adam``,
    ``AdamW`` and ``Lion`` are 32-bit by default, as their ``32bit`` names)."""
    name = {"Adam": "Adam32bit", "AdamW": "AdamW32bit", "Lion": "Lion32bit"}.get(cls.__name__, cls.__name__)
    if name not in _LAYOUTS:
        raise TypeError(f"vramlab has no layout for bitsandbytes' {cls.__name__}; known: {', '.join(BNB_OPTIMIZERS)}")
    return _LAYOUTS[name]


@dataclass(frozen=True)
class OptimizerChoice:
    """A factory resolved (:func:`resolve_optimizer`): ``build(params)`` makes it, and
    ``cls``/``kwargs`` are the class and settings it used, for ZeRO and master weights
    (``cls`` is ``None`` when the factory could not be probed: then only ``build`` works)."""

    build: Callable[[list[torch.nn.Parameter]], torch.optim.Optimizer]
    cls: Optional[type]
    kwargs: dict[str, Any] = field(default_factory=dict)
    why_not: str = ""

    def __call__(self, params: Iterable[torch.nn.Parameter]) -> torch.optim.Optimizer:
        return self.build(list(params))


def _probe(factory: Callable[..., Any]) -> Any:
    """The factory's optimizer on one real float32 parameter, with no mode active."""
    from torch.utils._python_dispatch import _disable_current_modes

    with _disable_current_modes():
        return factory([torch.nn.Parameter(torch.zeros(1))])


def _init_kwargs(cls: type, defaults: dict[str, Any]) -> dict[str, Any]:
    """The settings in ``defaults`` that ``cls(params, **kwargs)`` takes (an optimizer's
    ``defaults`` may hold more: torch's AdamW records ``decoupled_weight_decay``)."""
    try:
        sig = inspect.signature(cls)
    except (TypeError, ValueError):
        return dict(defaults)
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in sig.parameters.values()):
        return dict(defaults)
    return {k: v for k, v in defaults.items() if k in sig.parameters}


def resolve_optimizer(spec: Any) -> Any:
    """``spec`` as the simulator builds it: a bitsandbytes class becomes its layout class; a
    factory becomes an :class:`OptimizerChoice` (a bitsandbytes factory builds the layout with
    the factory's settings); names, torch classes and ``None`` are returned as given. Call it
    before any fake mode (it calls a factory once on a real one-element parameter)."""
    if spec is None or isinstance(spec, (str, OptimizerChoice)):
        return spec
    if isinstance(spec, type):
        return _bnb_layout_class(spec) if _is_bnb(spec) else spec
    if isinstance(spec, torch.optim.Optimizer) or not callable(spec):
        return spec  # refused with one message where it is used
    try:
        probe = _probe(spec)
    except Exception as e:  # noqa: BLE001 - any failure: the factory is kept as it is
        return OptimizerChoice(spec, None, {}, f"calling it on a one-element parameter raised {type(e).__name__}: {e}")
    if not isinstance(probe, torch.optim.Optimizer):
        return OptimizerChoice(spec, None, {}, f"it returned {type(probe).__name__}, not an Optimizer")
    kwargs = _init_kwargs(type(probe), probe.defaults)
    if _is_bnb(probe):
        layout: Any = _bnb_layout_class(type(probe))
        args = getattr(probe, "args", None)
        extra: dict[str, Any] = dict(lr=kwargs.get("lr", 1e-3), paged=bool(getattr(probe, "is_paged", layout.paged)))
        if args is not None:
            extra.update(optim_bits=int(getattr(args, "optim_bits", layout.optim_bits)),
                         min_8bit_size=int(getattr(args, "min_8bit_size", 4096)),
                         max_unorm=float(getattr(args, "max_unorm", 0.0)))
        return OptimizerChoice(lambda ps: layout(ps, **extra), layout, extra)
    return OptimizerChoice(spec, type(probe), kwargs)


class StepInBackward(torch.optim.Optimizer):
    """The optimizer step fused into backward (module docs): ``build([p])`` per parameter,
    stepped and zeroed (``set_to_none=True``) by ``p``'s post-accumulate-grad hook. Its own
    ``step()`` and ``zero_grad()`` do nothing (the hooks did it); they mark where the step ends,
    so that what the step keeps is read after the last hook; ``remove()`` takes the hooks off."""

    def __init__(self, build: Callable[[list[torch.nn.Parameter]], torch.optim.Optimizer],
                 params: Iterable[torch.nn.Parameter]) -> None:
        params = list(params)
        super().__init__(params, {})
        self.optimizers: dict[torch.Tensor, torch.optim.Optimizer] = {p: build([p]) for p in params}
        self.handles = [p.register_post_accumulate_grad_hook(self._step) for p in params]

    def _step(self, p: torch.Tensor) -> None:
        opt = self.optimizers[p]
        opt.step()
        opt.zero_grad(set_to_none=True)

    def step(self, closure: Any = None) -> None:  # type: ignore[override]
        return None

    def zero_grad(self, set_to_none: bool = True) -> None:
        return None

    def remove(self) -> None:
        for h in self.handles:
            h.remove()
        self.handles = []


def paged_bytes(opt: Any) -> int:
    """Bytes of optimizer state ``opt`` keeps in CUDA unified memory (bitsandbytes' paged
    optimizers), through ZeroRedundancyOptimizer, master weights and :class:`StepInBackward`."""
    if opt is None:
        return 0
    if isinstance(opt, StepInBackward):
        return sum(paged_bytes(o) for o in opt.optimizers.values())
    own = int(getattr(opt, "paged_bytes", 0) or 0) if isinstance(opt, BnbLayout) else 0
    for attr in ("optim", "inner"):  # ZeroRedundancyOptimizer's local optimizer; MasterWeights' inner
        inner = getattr(opt, attr, None)
        if isinstance(inner, torch.optim.Optimizer) and inner is not opt:
            own += paged_bytes(inner)
    return own
