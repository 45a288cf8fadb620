"""One training or inference step, as the estimator and every measurement run it.

Build the model on the meta device (and cast it, before any fake mode or ledger sees it),
give it storage once per tensor, initialise it, build the optimizer, and run steps: forward
(under autocast for a mixed precision), loss, backward, optimizer step. The same functions
serve :func:`~vramlab.sim.estimate.estimate` on fake tensors, :func:`~vramlab.sim.measure.measure`
under a VirtualGPU, the real ranks, and a CUDA device; that sameness is why an estimate equals
the measurement of the same step.

All sizes are in bytes.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any, Callable, Iterable, Optional

from .._extras import require_torch

require_torch("vramlab's simulator")

import torch  # noqa: E402
from torch import nn  # noqa: E402

from .precision import LossScaler, Plan, autocast  # noqa: E402

__all__ = ["OPTIMIZERS", "CHECKPOINT_CHOICES", "default_loss", "cast_batch", "forward", "make_optimizer",
           "materialize", "init_parameters", "run_steps", "build_on_meta", "count_params", "check_args",
           "to_device", "default_units", "checkpoint_modules", "apply_checkpoint", "optimizer_spec"]

#: Optimizers by name, for ``optimizer="adamw"``.
OPTIMIZERS: dict[str, type] = {
    "adam": torch.optim.Adam,
    "adamw": torch.optim.AdamW,
    "sgd": torch.optim.SGD,
    "rmsprop": torch.optim.RMSprop,
    "adagrad": torch.optim.Adagrad,
}

#: ``checkpoint=`` by name: ``"layers"`` checkpoints each unit of :func:`default_units`.
CHECKPOINT_CHOICES: tuple[str, ...] = ("layers",)


def default_loss(out: Any) -> torch.Tensor:
    """The loss of an output: the output itself when it is a scalar, its ``.loss`` (or
    ``["loss"]``), else the sum of its first floating tensor."""
    if isinstance(out, torch.Tensor):
        return out if out.numel() == 1 else out.sum()
    loss = getattr(out, "loss", None)
    if isinstance(loss, torch.Tensor):
        return loss
    if isinstance(out, dict):
        if isinstance(out.get("loss"), torch.Tensor):
            return out["loss"]
        out = list(out.values())
    if isinstance(out, (list, tuple)):
        for o in out:
            if isinstance(o, torch.Tensor) and o.is_floating_point():
                return default_loss(o)
    raise TypeError(f"cannot make a loss of a {type(out).__name__}: pass loss_fn=")


def cast_batch(batch: Any, dtype: Optional[torch.dtype]) -> Any:
    """The batch with its floating tensors cast to ``dtype`` (integer ones untouched)."""
    if dtype is None:
        return batch
    if isinstance(batch, torch.Tensor):
        return batch.to(dtype) if batch.is_floating_point() else batch
    if isinstance(batch, dict):
        return {k: cast_batch(v, dtype) for k, v in batch.items()}
    if isinstance(batch, (list, tuple)):
        return type(batch)(cast_batch(v, dtype) for v in batch)
    return batch


def to_device(batch: Any, device: Any) -> Any:
    """The batch with every tensor moved to ``device``."""
    if isinstance(batch, torch.Tensor):
        return batch.to(device)
    if isinstance(batch, dict):
        return {k: to_device(v, device) for k, v in batch.items()}
    if isinstance(batch, (list, tuple)):
        return type(batch)(to_device(v, device) for v in batch)
    return batch


def forward(model: nn.Module, batch: Any, loss_fn: Optional[Callable[..., Any]], want_loss: bool) -> Any:
    """Call the model on a batch: a tensor ``x``, a dict of keyword arguments, or a tuple
    ``(inputs, *targets)`` (``inputs`` itself a tuple for several positional arguments)."""
    if isinstance(batch, dict):
        out = model(**batch)
        rest: tuple = (batch,)
    elif isinstance(batch, (list, tuple)):
        inputs, rest = batch[0], tuple(batch[1:])
        out = model(*inputs) if isinstance(inputs, (list, tuple)) else model(inputs)
    else:
        out = model(batch)
        rest = ()
    if not want_loss:
        return out
    return loss_fn(out, *rest) if loss_fn is not None else default_loss(out)


def optimizer_spec(spec: Any) -> Any:
    """A name resolved to its Optimizer class (``ValueError`` listing the known names);
    a class or factory as given; an instance refused with one ``TypeError``."""
    if isinstance(spec, torch.optim.Optimizer):
        raise TypeError("pass the optimizer's class, name or a factory (params -> optimizer), not an instance: "
                        "it must be built on the model that the estimate creates")
    if isinstance(spec, str):
        cls = OPTIMIZERS.get(spec.lower())
        if cls is None:
            raise ValueError(f"unknown optimizer {spec!r}; known: {', '.join(OPTIMIZERS)}")
        return cls
    return spec


def make_optimizer(spec: Any, model: nn.Module, cuda_like: bool, wrap: Optional[Callable[[type], type]] = None
                   ) -> Optional[torch.optim.Optimizer]:
    """The optimizer of ``model``'s trainable parameters from a name, a class or a factory
    (``params -> optimizer``); ``None`` for none. ``cuda_like``: a class gets ``foreach=True``
    (CUDA's default, whose intermediate lists take memory). ``wrap``: applied to the class
    (e.g. :meth:`~vramlab.sim.precision.MasterWeights.of`)."""
    if spec is None:
        return None
    spec = optimizer_spec(spec)
    params = [p for p in model.parameters() if p.requires_grad]
    if isinstance(spec, type) and issubclass(spec, torch.optim.Optimizer):
        kw: dict[str, Any] = {}
        if cuda_like and "foreach" in inspect.signature(spec).parameters:
            kw["foreach"] = True  # CUDA's default: the multi-tensor path and its intermediates
        return (wrap(spec) if wrap is not None else spec)(params, **kw)
    if callable(spec):
        if wrap is not None:
            raise TypeError("mixed precision with master weights needs the optimizer as a name or an Optimizer "
                            f"class (it keeps float32 copies of the parameters for it); got {spec!r}")
        return spec(params)
    raise TypeError(f"optimizer must be a name, an Optimizer class or a factory; got {spec!r}")


def materialize(model: nn.Module) -> None:
    """Give every meta parameter and buffer CPU storage (fake under FakeTensorMode), once per
    tensor: unlike ``Module.to_empty``, shared (tied) weights stay shared."""
    memo: dict[int, torch.Tensor] = {}
    keep: list[torch.Tensor] = []  # the originals, so that ids stay unique during the walk
    for m in model.modules():
        pairs: tuple[tuple[dict[str, Any], bool], ...] = ((m._parameters, True), (m._buffers, False))
        for slots, is_param in pairs:
            for name, t in list(slots.items()):
                if t is None:
                    continue
                new = memo.get(id(t))
                if new is None:
                    keep.append(t)
                    data = torch.empty_like(t, device="cpu")
                    new = nn.Parameter(data, requires_grad=t.requires_grad) if is_param else data
                    memo[id(t)] = new
                slots[name] = new


def init_parameters(model: nn.Module) -> None:
    """Run every module's ``reset_parameters()`` under ``no_grad``."""
    with torch.no_grad():
        for m in model.modules():
            reset = getattr(m, "reset_parameters", None)
            if callable(reset):
                reset()


def run_steps(model: nn.Module, make_batch: Callable[[int], Any], batch_size: int, opt: Any, loss_fn: Any,
              plan: Plan, train: bool, steps: int, device_type: str = "cpu",
              scaler: Optional[LossScaler] = None) -> None:
    """Run ``steps`` steps: the batch cast as ``plan`` says, the forward under its autocast
    (``device_type``'s), and for training the loss (scaled by ``scaler``), backward,
    unscale, optimizer step and ``zero_grad(set_to_none=True)``."""
    for _ in range(steps):
        batch = cast_batch(make_batch(batch_size), plan.batch_dtype)
        if train:
            with autocast(device_type, plan.autocast):
                loss = forward(model, batch, loss_fn, True)
            if scaler is not None:
                loss = scaler.scale(loss)
            loss.backward()
            del loss
            if scaler is not None:
                scaler.unscale(model.parameters())
            if opt is not None:
                opt.step()
                opt.zero_grad(set_to_none=True)
            else:
                model.zero_grad(set_to_none=True)
        else:
            with torch.no_grad(), autocast(device_type, plan.autocast):
                out = forward(model, batch, loss_fn, False)
            del out
        del batch


def build_on_meta(build_model: Callable[[], nn.Module], dtype: Optional[torch.dtype]) -> nn.Module:
    """``build_model()`` under ``torch.device("meta")``, cast to ``dtype``: call it before any
    fake mode or ledger is active (a meta tensor cast under FakeTensorMode cannot be swapped)."""
    with torch.device("meta"):
        model = build_model()
    if not isinstance(model, nn.Module):
        raise TypeError(f"build_model must return an nn.Module; got {type(model).__name__}")
    if dtype is not None:
        model = model.to(dtype)
        if dtype in (torch.float16, torch.bfloat16):
            keep_adapters_in_fp32(model)
    return model


def keep_adapters_in_fp32(model: nn.Module) -> int:
    """Cast PEFT's adapter weights back to fp32 after the model was cast to 16 bits, as PEFT does
    by default: ``get_peft_model(..., autocast_adapter_dtype=True)`` upcasts the fp16/bf16
    parameters of each tuner layer's ``adapter_layer_names`` (``lora_A``, ``lora_B``, ...) to
    fp32 (peft/tuners/tuners_utils.py, ``BaseTunerLayer._cast_adapter_dtype``), so a LoRA on a
    bf16 base trains fp32 adapters with fp32 gradients and optimizer state. Returns the
    parameters cast (elements). Without PEFT's layers, nothing changes."""
    n = 0
    for m in model.modules():
        if not any(c.__name__ == "BaseTunerLayer" and c.__module__.startswith("peft") for c in type(m).__mro__):
            continue
        for name in getattr(m, "adapter_layer_names", ()):
            sub = getattr(m, name, None)
            if not isinstance(sub, nn.Module):
                continue
            for p in sub.parameters():
                if p.dtype in (torch.float16, torch.bfloat16):
                    p.data = p.data.to(torch.float32)
                    n += p.numel()
    return n


def count_params(model: nn.Module) -> int:
    """Parameter elements, shared ones once."""
    seen: set[int] = set()
    n = 0
    for p in model.parameters():
        if id(p) not in seen:
            seen.add(id(p))
            n += p.numel()
    return n


def check_args(batch_size: int, step: str, steps: Optional[int], optimizer: Any) -> tuple[bool, int]:
    """``(train, steps)`` from the arguments, or one ``ValueError`` naming the bad one."""
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive integer (>= 1); got {batch_size!r}")
    if step not in ("train", "inference"):
        raise ValueError(f"step must be 'train' or 'inference'; got {step!r}")
    train = step == "train"
    if steps is None:
        steps = 2 if (train and optimizer is not None) else 1
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps must be an integer >= 1; got {steps!r}")
    return train, steps


def default_units(model: nn.Module) -> list[nn.Module]:
    """Every child of an ``nn.ModuleList``/``nn.Sequential`` that has parameters, inner ones
    first: the transformer blocks or layers of most models. FSDP shards them as units and
    ``checkpoint="layers"`` checkpoints them."""
    out: list[nn.Module] = []
    seen: set[int] = set()

    def walk(m: nn.Module) -> None:
        for c in m.children():
            walk(c)
            if isinstance(m, (nn.ModuleList, nn.Sequential)) and id(c) not in seen \
                    and any(True for _ in c.parameters()):
                seen.add(id(c))
                out.append(c)

    walk(model)
    return out


def checkpoint_modules(model: nn.Module, checkpoint: Any) -> list[nn.Module]:
    """The modules ``checkpoint=`` names: ``None`` none, ``"layers"`` the units of
    :func:`default_units` (outermost ones only: a checkpointed block recomputes its insides),
    or a predicate ``module -> bool`` (outermost matches only)."""
    if checkpoint is None or checkpoint is False:
        return []
    if isinstance(checkpoint, str):
        if checkpoint not in CHECKPOINT_CHOICES:
            raise ValueError(f"checkpoint must be one of {', '.join(CHECKPOINT_CHOICES)} or a predicate "
                             f"module -> bool; got {checkpoint!r}")
        chosen = {id(m) for m in default_units(model)}

        def pick(m: nn.Module) -> bool:
            return id(m) in chosen
    elif callable(checkpoint):
        pick = checkpoint
    else:
        raise ValueError(f"checkpoint must be one of {', '.join(CHECKPOINT_CHOICES)} or a predicate "
                         f"module -> bool; got {checkpoint!r}")
    out: list[nn.Module] = []

    def walk(m: nn.Module) -> None:
        for c in m.children():
            if pick(c):
                out.append(c)
            else:
                walk(c)

    walk(model)
    return out


def _hf_checkpointing_layer(m: nn.Module) -> bool:
    """Whether ``m`` is a Hugging Face ``GradientCheckpointingLayer`` (transformers'
    modeling_layers.py: the decoder and encoder blocks of its models), without importing transformers."""
    return any(c.__name__ == "GradientCheckpointingLayer" and c.__module__.startswith("transformers")
               for c in type(m).__mro__)


def apply_checkpoint(modules: Iterable[nn.Module]) -> None:
    """Make each module's forward an activation checkpoint (``torch.utils.checkpoint``,
    non-reentrant, as torch recommends): its insides are not saved for backward but
    recomputed during it; only its inputs are saved.

    A Hugging Face layer (``GradientCheckpointingLayer``) is switched as
    ``model.gradient_checkpointing_enable()`` switches it: ``gradient_checkpointing = True`` with the
    same non-reentrant checkpoint. Its own forward wrapper then checkpoints it in training with its
    key/value cache dropped (``use_cache=False``, ``cache=None``): a layer that writes the cache in
    its forward (T5's and BART's decoder blocks: its self-attention appends to it, its
    cross-attention fills it once) finds it written when backward recomputes it, takes another
    path and saves other tensors, and torch's checkpoint refuses that (``CheckpointError``)."""
    from torch.utils.checkpoint import checkpoint

    for m in modules:
        if _hf_checkpointing_layer(m):
            m._gradient_checkpointing_func = functools.partial(checkpoint, use_reentrant=False)  # type: ignore[assignment]
            m.gradient_checkpointing = True  # type: ignore[assignment]
            continue
        inner = m.forward
        m.forward = functools.partial(checkpoint, inner, use_reentrant=False)
