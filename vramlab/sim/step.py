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
from dataclasses import dataclass, fields, replace
from typing import Any, Callable, Iterable, Optional

from .._extras import require_torch

require_torch("vramlab's simulator")

import torch  # noqa: E402
from torch import nn  # noqa: E402

from .optimizers import BNB_NAMES, OptimizerChoice, StepInBackward, resolve_optimizer  # noqa: E402
from .precision import LossScaler, Plan, Precision, autocast, resolve_precision  # noqa: E402

__all__ = ["OPTIMIZERS", "CHECKPOINT_CHOICES", "default_loss", "cast_batch", "forward", "make_optimizer",
           "materialize", "init_parameters", "run_steps", "build_on_meta", "count_params", "check_args",
           "to_device", "default_units", "checkpoint_modules", "apply_checkpoint", "optimizer_spec", "Loop",
           "MAX_ACCUMULATE", "Step", "StepRun", "as_step"]

#: Optimizers by name, for ``optimizer="adamw"``.
OPTIMIZERS: dict[str, type] = {
    "adam": torch.optim.Adam,
    "adamw": torch.optim.AdamW,
    "sgd": torch.optim.SGD,
    "rmsprop": torch.optim.RMSprop,
    "adagrad": torch.optim.Adagrad,
    **BNB_NAMES,  # bitsandbytes' 8-bit and paged optimizers, as their layout (vramlab.sim.optimizers)
}

#: the most micro-batches per optimizer step ``accumulate=`` takes.
MAX_ACCUMULATE = 65536


@dataclass(frozen=True)
class Loop:
    """How a training script runs its steps, where it changes what memory holds.

    Attributes:
        accumulate: micro-batches per optimizer step (gradient accumulation): each runs
            forward and backward on ``batch_size`` samples, the gradients add up in place
            between them (the loss divided by ``accumulate``), then one optimizer step.
        set_to_none: as ``optimizer.zero_grad(set_to_none=...)``: ``True`` (torch's default
            since 2.0) frees the gradients after the step; ``False`` keeps them, zeroed, so they
            are held through the next forward.
        step_in_backward: the optimizer step fused into backward (one optimizer per parameter,
            stepped by its post-accumulate-grad hook, :class:`~vramlab.sim.optimizers.StepInBackward`):
            each gradient is freed as soon as it is applied. One device only; not with
            ``accumulate > 1`` (each gradient is applied as soon as it is ready) nor with loss
            scaling (``"16-mixed"``: unscaling and the inf check need every gradient first).
    """

    accumulate: int = 1
    set_to_none: bool = True
    step_in_backward: bool = False

    def check(self, *, optimizer: Any, scale_loss: bool, strategy: Optional[str]) -> "Loop":
        """This loop, or one ``ValueError`` naming the argument that cannot be."""
        a = self.accumulate
        if isinstance(a, bool) or not isinstance(a, int) or not 1 <= a <= MAX_ACCUMULATE:
            raise ValueError(f"accumulate must be an integer from 1 to {MAX_ACCUMULATE} (micro-batches per optimizer "
                             f"step); got {a!r}")
        if not isinstance(self.set_to_none, bool):
            raise ValueError(f"set_to_none must be True or False; got {self.set_to_none!r}")
        if not isinstance(self.step_in_backward, bool):
            raise ValueError(f"step_in_backward must be True or False; got {self.step_in_backward!r}")
        if self.step_in_backward:
            if optimizer is None:
                raise ValueError("step_in_backward=True fuses the optimizer step into backward: it needs an optimizer")
            if a > 1:
                raise ValueError("step_in_backward=True applies each gradient as soon as it is ready, so it cannot "
                                 f"accumulate {a} micro-batches (as in PyTorch's tutorial); use accumulate=1")
            if scale_loss:
                raise ValueError("step_in_backward=True cannot run with loss scaling (precision '16-mixed'): the "
                                 "scaler unscales and checks every gradient before any step; use 'bf16-mixed'")
            if strategy is not None:
                raise ValueError(f"step_in_backward=True is estimated on one device; strategy {strategy!r} reduces "
                                 "the gradients in its own hooks first")
        return self

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


def _class_kwargs(cls: type, cuda_like: bool) -> dict[str, Any]:
    if cuda_like and "foreach" in inspect.signature(cls).parameters:
        return {"foreach": True}  # CUDA's default: the multi-tensor path and its intermediates
    return {}


def make_optimizer(spec: Any, model: nn.Module, cuda_like: bool, wrap: Optional[Callable[..., type]] = None,
                   loop: Optional[Loop] = None) -> Any:
    """The optimizer of ``model``'s trainable parameters from a name, a class or a factory
    (``params -> optimizer``, or an :class:`~vramlab.sim.optimizers.OptimizerChoice`); ``None``
    for none. ``cuda_like``: a class gets ``foreach=True`` (CUDA's default, whose intermediate
    lists take memory). ``wrap``: applied to the class and its settings (e.g.
    :meth:`~vramlab.sim.precision.MasterWeights.of`). ``loop.step_in_backward``: one optimizer
    per parameter, stepped in backward (:class:`~vramlab.sim.optimizers.StepInBackward`)."""
    if spec is None:
        return None
    spec = optimizer_spec(spec)
    params = [p for p in model.parameters() if p.requires_grad]
    build: Callable[[list[Any]], Any]
    if isinstance(spec, type) and issubclass(spec, torch.optim.Optimizer):
        kw = _class_kwargs(spec, cuda_like)
        cls = wrap(spec) if wrap is not None else spec
        build = functools.partial(cls, **kw)
    elif isinstance(spec, OptimizerChoice) and wrap is not None:
        if spec.cls is None:
            raise TypeError("mixed precision with master weights needs the optimizer's class (it keeps float32 copies "
                            f"of the parameters for it), and the factory could not be probed: {spec.why_not}")
        inner = {k: v for k, v in spec.kwargs.items() if not (k == "foreach" and v is None)}
        build = functools.partial(wrap(spec.cls, **inner), **_class_kwargs(spec.cls, cuda_like))
    elif callable(spec):
        if wrap is not None:
            raise TypeError("mixed precision with master weights needs the optimizer as a name, an Optimizer "
                            f"class or a factory vramlab can probe; got {spec!r}")
        build = spec
    else:
        raise TypeError(f"optimizer must be a name, an Optimizer class or a factory; got {spec!r}")
    if cuda_like and not isinstance(spec, type):
        build = functools.partial(_cuda_default_foreach, build)
    if loop is not None and loop.step_in_backward:
        return StepInBackward(build, params)
    return build(params)


def _cuda_default_foreach(build: Callable[[list[Any]], Any], params: list[Any]) -> Any:
    """A factory's optimizer as CUDA runs it: a group that left ``foreach`` unset takes the
    multi-tensor path (torch picks it when every tensor is on CUDA; the fake ones are on the CPU)."""
    opt = build(params)
    for g in getattr(opt, "param_groups", []):
        if "foreach" in g and g["foreach"] is None:
            g["foreach"] = True
    return opt


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
                    # a tensor built with its values (_MetaParameters) keeps them; a meta one gets storage
                    data = torch.empty_like(t, device="cpu") if t.is_meta else t.detach().clone()
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


def run_steps(model: nn.Module, run: "StepRun", opt: Any, plan: Plan, scaler: Optional[LossScaler] = None, *,
              device_type: str = "cpu", make_batch: Optional[Callable[[int], Any]] = None) -> None:
    """Run ``run.steps`` steps of ``run.spec``: the batch (``make_batch``, by default the step's)
    cast as ``plan`` says, the forward under its autocast (``device_type``'s), and for training,
    per micro-batch of ``loop.accumulate``, the loss (divided by ``accumulate`` when above 1,
    scaled by ``scaler``) and backward; then unscale, the optimizer step and
    ``zero_grad(set_to_none=loop.set_to_none)`` (none of them when the step runs in backward)."""
    spec, loop, train, steps = run.spec, run.loop, run.train, run.steps
    make_batch = make_batch if make_batch is not None else spec.make_batch
    batch_size, loss_fn = spec.batch_size, spec.loss_fn
    for _ in range(steps):
        if not train:
            batch = cast_batch(make_batch(batch_size), plan.batch_dtype)
            with torch.no_grad(), autocast(device_type, plan.autocast):
                out = forward(model, batch, loss_fn, False)
            del out, batch
            continue
        for _micro in range(loop.accumulate):
            batch = cast_batch(make_batch(batch_size), plan.batch_dtype)
            with autocast(device_type, plan.autocast):
                loss = forward(model, batch, loss_fn, True)
            if loop.accumulate > 1:
                loss = loss / loop.accumulate
            if scaler is not None:
                loss = scaler.scale(loss)
            loss.backward()
            del loss, batch
        if scaler is not None:
            scaler.unscale(model.parameters())
        if opt is not None:
            opt.step()
            opt.zero_grad(set_to_none=loop.set_to_none)
        else:
            model.zero_grad(set_to_none=loop.set_to_none)


class _MetaParameters(torch.overrides.TorchFunctionMode):
    """``torch.device("meta")`` for what may become a parameter: a floating-point tensor made by
    a constructor (``empty``, ``zeros``, ``randn``, ...) is a meta tensor. Integer and boolean
    tensors (position ids, token type ids, causal masks) and tensors made from data (``tensor``,
    ``arange``, ``linspace``, ...) are made on the CPU with their values: they are small, and a
    step run for real from this model (:func:`~vramlab.sim.measure.measure`) indexes with them
    (uninitialised position ids index out of range); a model's ``__init__`` may also read them
    (``linspace(...).tolist()``), which a meta tensor cannot. :func:`materialize` keeps their values."""

    _DATA = frozenset({torch.tensor, torch.as_tensor, torch.asarray, torch.arange, torch.range, torch.linspace,
                       torch.logspace, torch.scalar_tensor, torch.tril_indices, torch.triu_indices, torch.randint,
                       torch.randperm})

    def __init__(self) -> None:
        super().__init__()
        from torch.utils._device import _device_constructors

        self._constructors = _device_constructors()

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: Optional[dict] = None) -> Any:
        kwargs = kwargs or {}
        if func in self._constructors and kwargs.get("device") is None and func not in self._DATA:
            dtype = kwargs.get("dtype")
            dtype = torch.get_default_dtype() if dtype is None else dtype
            if dtype.is_floating_point or dtype.is_complex:
                kwargs["device"] = torch.device("meta")
        return func(*args, **kwargs)


def build_on_meta(build_model: Callable[[], nn.Module], dtype: Optional[torch.dtype]) -> nn.Module:
    """``build_model()`` with its parameters on the meta device (:class:`_MetaParameters`: small
    integer and data tensors keep their values on the CPU), cast to ``dtype``: call it before any
    fake mode or ledger is active (a meta tensor cast under FakeTensorMode cannot be swapped)."""
    with _MetaParameters():
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


@dataclass(frozen=True)
class Step:
    """One training or inference step, as one value: what :func:`~vramlab.sim.estimate.estimate`,
    :func:`~vramlab.sim.measure.measure` and the batch finder run. The fields are those functions'
    arguments of the same names (sizes in bytes, ``batch_size`` in samples per micro-batch);
    :meth:`with_batch` gives the same step at another batch.

    ``estimate(Step(build, make_batch, batch_size=8, optimizer="adamw"), device="T4")`` is
    ``estimate(build, make_batch, batch_size=8, optimizer="adamw", device="T4")``.
    """

    build_model: Callable[[], nn.Module]
    make_batch: Callable[[int], Any]
    batch_size: int
    optimizer: Any = None
    loss_fn: Optional[Callable[..., Any]] = None
    step: str = "train"
    steps: Optional[int] = None
    precision: Optional[str] = None
    dtype: Optional[torch.dtype] = None
    checkpoint: Any = None
    accumulate: int = 1
    set_to_none: bool = True
    step_in_backward: bool = False

    def with_batch(self, batch_size: int) -> "Step":
        """This step at ``batch_size``."""
        return replace(self, batch_size=batch_size)

    def resolved(self) -> "StepRun":
        """This step checked (one ``ValueError`` naming a bad field) and resolved for running;
        its loop is checked against a strategy by the runner that knows it
        (:meth:`StepRun.checked`)."""
        train, steps = check_args(self.batch_size, self.step, self.steps, self.optimizer)
        prec = resolve_precision(self.precision, self.dtype)
        optimizer = resolve_optimizer(self.optimizer)
        return StepRun(self, train, steps, prec, optimizer, Loop(self.accumulate, self.set_to_none,
                                                                 self.step_in_backward))


#: the names of :class:`Step`'s fields (the step's arguments of estimate() and measure())
STEP_FIELDS = tuple(f.name for f in fields(Step))


@dataclass(frozen=True)
class StepRun:
    """A :class:`Step`, checked and resolved: whether it trains, how many steps, its precision,
    its optimizer (names and factories resolved, :mod:`vramlab.sim.optimizers`) and its loop."""

    spec: Step
    train: bool
    steps: int
    prec: Precision
    optimizer: Any
    loop: Loop

    def checked(self, plan: Plan, strategy: Optional[str]) -> "StepRun":
        """This run, its loop checked under ``plan`` and ``strategy`` (one ``ValueError``)."""
        loop = self.loop.check(optimizer=self.optimizer, scale_loss=plan.scale_loss and self.train, strategy=strategy)
        return replace(self, loop=loop)


def as_step(first: Any, make_batch: Any, given: dict[str, Any]) -> Step:
    """The :class:`Step` that ``estimate()``/``measure()`` were called with: ``first`` itself
    when it is one (then no step field may be given apart), else one made of
    ``(first, make_batch, **given)``."""
    if isinstance(first, Step):
        extra = sorted(k for k, v in given.items() if v != _DEFAULTS.get(k))
        if make_batch is not None or extra:
            raise ValueError("pass either a Step or the step's arguments, not both (given beside the Step: "
                             f"{', '.join(['make_batch'] * (make_batch is not None) + extra)}); "
                             "use step.with_batch(n) or dataclasses.replace(step, ...) to change it")
        return first
    if make_batch is None:
        raise TypeError("make_batch is missing: pass build_model and make_batch, or a vramlab.sim.step.Step")
    return Step(first, make_batch, **given)


_DEFAULTS = {f.name: f.default for f in fields(Step) if f.name not in ("build_model", "make_batch")}
_DEFAULTS["batch_size"] = None
