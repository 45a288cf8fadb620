"""``estimate()``: the peak memory of a training or inference step, without the memory.

The model is built on the meta device, materialised as fake tensors under
``torch._subclasses.fake_tensor.FakeTensorMode``, and one step runs on them: forward,
backward, optimizer step (twice with an optimizer: the first step creates the optimizer
state, the second is what every later step does). Fake tensors carry shapes, dtypes and
strides but no data, so a step of a billion-parameter model costs seconds and no memory.

The storages are counted by the same ledger as :class:`~vramlab.VirtualGPU` (a dispatch
mode and weakref finalizers; see ``docs/virtual-gpu.md``), so on CPU the estimated peak is
the peak the VirtualGPU measures for the same step (:func:`measure` runs it for real).

With a CUDA preset as ``device`` (``"A100-80GB"``), the estimate models what differs on a
CUDA card: each storage is rounded up to 512 bytes as the caching allocator does, an
optimizer given by name or class is built with ``foreach=True`` (CUDA's default, whose
intermediate lists take memory), and the verdict leaves room for the CUDA context
(:data:`~vramlab.sim.presets.CUDA_CONTEXT_OVERHEAD`). It does not model the allocator's
cache or fragmentation (``memory_reserved``), cuBLAS/cuDNN workspaces, or kernels whose CUDA
implementation allocates differently from the CPU one.

With ``world_size=N, strategy=`` (``"ddp"``, ``"zero1"``, ``"zero2"``, ``"fsdp"``) the estimate
is one rank's: torch's own data-parallel wrapper runs on the fake tensors over torch's fake
process group (:mod:`vramlab.sim.distributed`), and :func:`measure_distributed` runs the same
steps for real on N CPU processes with the gloo backend, each rank under a VirtualGPU.

All sizes are in bytes.
"""

from __future__ import annotations

import html
import inspect
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Union

from .._extras import require_torch

require_torch("estimate()")  # one line saying what to install, not a bare ModuleNotFoundError

import torch  # noqa: E402
from torch import nn

from ..units import format_bytes, parse_size
from .ledger import CATEGORIES, Ledger, LedgerHooks
from .presets import get_preset
from .virtual_gpu import VirtualGPU

__all__ = ["Estimate", "estimate", "measure", "measure_distributed", "measure_distributed_many", "RankReading",
           "measure_cuda", "warm_up_cuda", "OPTIMIZERS"]

#: Optimizers by name, for ``optimizer="adamw"``.
OPTIMIZERS: dict[str, type] = {
    "adam": torch.optim.Adam,
    "adamw": torch.optim.AdamW,
    "sgd": torch.optim.SGD,
    "rmsprop": torch.optim.RMSprop,
    "adagrad": torch.optim.Adagrad,
}

_LABELS = {"parameters": "parameters", "buffers": "buffers", "gradients": "gradients",
           "optimizer_state": "optimizer state", "activations": "activations (saved)", "other": "other / temporaries"}


@dataclass(frozen=True)
class Estimate:
    """The memory of one step. Sizes in bytes.

    Attributes:
        peak: the highest bytes allocated during the step(s).
        breakdown: bytes per category at the peak (parameters, buffers, gradients,
            optimizer_state, activations, other); they add up to ``peak``.
        fits: whether ``peak`` fits the device's budget; ``None`` without a device.
        device: the device's name (a preset's, or the size given), or ``None``.
        capacity: the device's memory, or ``None``.
        budget: what tensors may use on it: capacity minus the modelled CUDA context.
        after: bytes still allocated after the step (parameters, optimizer state, ...).
        parameters: the number of parameter elements (shared ones once).
        method: ``"estimated (FakeTensorMode)"`` or ``"measured (VirtualGPU)"``.
        seconds: how long it took.
        world_size: the data-parallel ranks (1 without a strategy).
        strategy: ``"ddp"``, ``"zero1"``, ``"zero2"`` (modelled), ``"fsdp"``, or ``None``.
        rank: the rank the figures describe, with a strategy (see :mod:`vramlab.sim.distributed`).
        rank_peaks: the peak of each rank estimated (all of them for ZeRO), in bytes.
    """

    peak: int
    breakdown: dict[str, int]
    fits: Optional[bool]
    device: Optional[str]
    capacity: Optional[int]
    budget: Optional[int]
    after: int
    parameters: int
    batch_size: int
    step: str
    steps: int
    dtype: Optional[str]
    round_blocks: bool
    method: str
    seconds: float
    notes: tuple[str, ...] = field(default_factory=tuple)
    world_size: int = 1
    strategy: Optional[str] = None
    rank: Optional[int] = None
    rank_peaks: tuple[int, ...] = ()

    @property
    def headroom(self) -> Optional[int]:
        """``budget - peak`` (negative when it does not fit), or ``None`` without a device."""
        return None if self.budget is None else self.budget - self.peak

    def verdict(self) -> str:
        """One line: fits or not, and by how much."""
        if self.fits is None:
            return f"peak {format_bytes(self.peak)} (no device given)"
        word = "fits" if self.fits else "does NOT fit"
        h = self.headroom or 0
        return (f"{word} on {self.device}: peak {format_bytes(self.peak)} of {format_bytes(self.budget)} usable "
                f"({format_bytes(abs(h))} {'to spare' if h >= 0 else 'short'})")

    def text(self) -> str:
        """A plain-text report: the verdict and the breakdown at the peak."""
        per_rank = (f", {self.strategy} on {self.world_size} ranks, rank {self.rank} (batch per rank)"
                    if self.strategy else "")
        lines = [f"{self.method}: {self.step} step, batch {self.batch_size}, {self.parameters:,} parameters"
                 + (f", {self.dtype}" if self.dtype else "") + per_rank,
                 "  " + self.verdict()]
        for k in CATEGORIES:
            n = self.breakdown.get(k, 0)
            share = 100.0 * n / self.peak if self.peak else 0.0
            lines.append(f"    {_LABELS[k]:<22}{format_bytes(n):>12}  {share:5.1f}%")
        lines.append(f"  after the step {format_bytes(self.after)}; took {self.seconds:.2f} s")
        lines.extend(f"  note: {n}" for n in self.notes)
        return "\n".join(lines)

    def __repr__(self) -> str:
        return f"<vramlab.Estimate peak={format_bytes(self.peak)} fits={self.fits} device={self.device!r}>"

    def _repr_html_(self) -> str:
        rows = "".join(
            f"<tr><td>{html.escape(_LABELS[k])}</td><td style='text-align:right'>"
            f"{html.escape(format_bytes(self.breakdown.get(k, 0)))}</td></tr>" for k in CATEGORIES)
        color = "#59a14f" if self.fits else ("#e15759" if self.fits is False else "#888")
        return (f"<div class='vramlab-estimate'><p style='border-left:3px solid {color};padding-left:6px'>"
                f"{html.escape(self.verdict())}</p><table><tr><th>at the peak</th><th>bytes</th></tr>{rows}"
                f"</table><p>{html.escape(self.method)}, {self.step} step, batch {self.batch_size}, "
                f"{self.parameters:,} parameters; {self.seconds:.2f} s</p></div>")

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, str]:
        return {"text/plain": self.text(), "text/html": self._repr_html_()}


# --------------------------------------------------------------------------- the step


def _default_loss(out: Any) -> torch.Tensor:
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
                return _default_loss(o)
    raise TypeError(f"cannot make a loss of a {type(out).__name__}: pass loss_fn=")


def _cast(batch: Any, dtype: Optional[torch.dtype]) -> Any:
    if dtype is None:
        return batch
    if isinstance(batch, torch.Tensor):
        return batch.to(dtype) if batch.is_floating_point() else batch
    if isinstance(batch, dict):
        return {k: _cast(v, dtype) for k, v in batch.items()}
    if isinstance(batch, (list, tuple)):
        return type(batch)(_cast(v, dtype) for v in batch)
    return batch


def _forward(model: nn.Module, batch: Any, loss_fn: Optional[Callable[..., Any]], want_loss: bool) -> Any:
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
    return loss_fn(out, *rest) if loss_fn is not None else _default_loss(out)


def _make_optimizer(spec: Any, model: nn.Module, cuda_like: bool) -> Optional[torch.optim.Optimizer]:
    if spec is None:
        return None
    if isinstance(spec, torch.optim.Optimizer):
        raise TypeError("pass the optimizer's class, name or a factory (params -> optimizer), not an instance: "
                        "it must be built on the model that the estimate creates")
    params = [p for p in model.parameters() if p.requires_grad]
    if isinstance(spec, str):
        cls = OPTIMIZERS.get(spec.lower())
        if cls is None:
            raise ValueError(f"unknown optimizer {spec!r}; known: {', '.join(OPTIMIZERS)}")
        spec = cls
    if isinstance(spec, type) and issubclass(spec, torch.optim.Optimizer):
        kw: dict[str, Any] = {}
        if cuda_like and "foreach" in inspect.signature(spec).parameters:
            kw["foreach"] = True  # CUDA's default: the multi-tensor path and its intermediates
        return spec(params, **kw)
    if callable(spec):
        return spec(params)
    raise TypeError(f"optimizer must be a name, an Optimizer class or a factory; got {spec!r}")


def _materialize(model: nn.Module) -> None:
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


def _init_parameters(model: nn.Module) -> None:
    with torch.no_grad():
        for m in model.modules():
            reset = getattr(m, "reset_parameters", None)
            if callable(reset):
                reset()


def _run_steps(model: nn.Module, make_batch: Callable[[int], Any], batch_size: int, opt: Any, loss_fn: Any,
               dtype: Optional[torch.dtype], train: bool, steps: int) -> None:
    for _ in range(steps):
        batch = _cast(make_batch(batch_size), dtype)
        if train:
            loss = _forward(model, batch, loss_fn, True)
            loss.backward()
            del loss
            if opt is not None:
                opt.step()
                opt.zero_grad(set_to_none=True)
            else:
                model.zero_grad(set_to_none=True)
        else:
            with torch.no_grad():
                out = _forward(model, batch, loss_fn, False)
            del out
        del batch


def _build_on_meta(build_model: Callable[[], nn.Module], dtype: Optional[torch.dtype]) -> nn.Module:
    with torch.device("meta"):
        model = build_model()
    if not isinstance(model, nn.Module):
        raise TypeError(f"build_model must return an nn.Module; got {type(model).__name__}")
    if dtype is not None:
        model = model.to(dtype)
    return model


def _count_params(model: nn.Module) -> int:
    seen: set[int] = set()
    n = 0
    for p in model.parameters():
        if id(p) not in seen:
            seen.add(id(p))
            n += p.numel()
    return n


@dataclass(frozen=True)
class _Target:
    name: Optional[str]
    capacity: Optional[int]
    context: int
    cuda_like: bool


def _target(device: Any) -> _Target:
    if device is None:
        return _Target(None, None, 0, False)
    if isinstance(device, VirtualGPU):
        return _Target(device.name, device.capacity, device.context_overhead, device.preset is not None)
    if isinstance(device, bool) or not isinstance(device, (int, str)):
        raise ValueError(f"device must be a GPU preset name, a size or bytes; got {device!r}")
    try:
        cap = parse_size(device)
    except ValueError:
        p = get_preset(str(device))  # ValueError listing the presets
        return _Target(p.name, p.memory, p.context_overhead, True)
    if cap <= 0:
        raise ValueError(f"device capacity must be positive; got {device!r}")
    return _Target(format_bytes(cap), cap, 0, False)


def _check_args(batch_size: int, step: str, steps: Optional[int], optimizer: Any) -> tuple[bool, int]:
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be an integer >= 1; got {batch_size!r}")
    if step not in ("train", "inference"):
        raise ValueError(f"step must be 'train' or 'inference'; got {step!r}")
    train = step == "train"
    if steps is None:
        steps = 2 if (train and optimizer is not None) else 1
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps must be an integer >= 1; got {steps!r}")
    return train, steps


def _result(acct: Ledger, tgt: _Target, model: nn.Module, *, batch_size: int, step: str, steps: int,
            dtype: Optional[torch.dtype], method: str, t0: float, notes: list[str],
            parallel: Optional[tuple[int, str, int, int, tuple[int, ...]]] = None) -> Estimate:
    budget = None if tgt.capacity is None else tgt.capacity - tgt.context
    if tgt.context:
        notes.append(f"{format_bytes(tgt.context)} set aside for the CUDA context (an assumed figure)")
    extra: dict[str, Any] = {}
    n_params = _count_params(model)
    if parallel is not None:
        extra = dict(world_size=parallel[0], strategy=parallel[1], rank=parallel[2], rank_peaks=parallel[4])
        n_params = parallel[3]
    return Estimate(
        peak=acct.peak, breakdown=dict(acct.peak_cats), fits=None if budget is None else acct.peak <= budget,
        device=tgt.name, capacity=tgt.capacity, budget=budget, after=acct.allocated, parameters=n_params,
        batch_size=batch_size, step=step, steps=steps, dtype=str(dtype).replace("torch.", "") if dtype else None,
        round_blocks=acct.round_blocks, method=method, seconds=time.perf_counter() - t0, notes=tuple(notes),
        **extra)


def estimate(build_model: Callable[[], nn.Module], make_batch: Callable[[int], Any], *, batch_size: int,
             optimizer: Any = None, dtype: Optional[torch.dtype] = None, step: str = "train",
             device: Union[None, str, int, VirtualGPU] = None, loss_fn: Optional[Callable[..., Any]] = None,
             steps: Optional[int] = None, round_blocks: Optional[bool] = None, world_size: int = 1,
             strategy: Any = None, rank: Optional[int] = None) -> Estimate:
    """Estimate the peak memory of a step without allocating it (see module docs).

    Args:
        build_model: returns the ``nn.Module``; it is called under ``torch.device("meta")``.
        make_batch: ``make_batch(batch_size)`` returns a tensor ``x`` (``model(x)``), a dict
            (``model(**batch)``) or a tuple ``(inputs, *targets)`` (``model(inputs)``, then
            ``loss_fn(output, *targets)``). It runs under ``FakeTensorMode``.
        batch_size: the batch size passed to ``make_batch``.
        optimizer: ``None`` (backward only), a name (``"adamw"``), an Optimizer class, or a
            factory ``params -> optimizer``.
        dtype: cast the model and the batch's floating tensors to it (``torch.bfloat16``).
        step: ``"train"`` (forward, backward, optimizer step) or ``"inference"`` (forward
            under ``no_grad``).
        device: the verdict's device: a GPU preset (``"A100-80GB"``), a size (``"24GiB"``),
            bytes or a VirtualGPU; ``None`` for no verdict.
        loss_fn: ``loss_fn(output, *targets)``; default: the output itself when it is a
            scalar, its ``.loss``, else its sum.
        steps: how many steps to run; default 2 with an optimizer (its state is created by
            the first), else 1. The peak is over all of them.
        round_blocks: count 512-byte blocks as CUDA does; default: on for a CUDA preset.
        world_size: data-parallel ranks; with ``strategy``, the figures are one rank's and
            ``batch_size`` is per rank.
        strategy: ``"ddp"``, ``"zero1"``, ``"zero2"`` (modelled), ``"fsdp"``, or an instance
            of :mod:`vramlab.sim.distributed`'s ``DDP``/``ZeRO1``/``ZeRO2``/``FSDP`` with
            options; it runs torch's own wrapper on a fake process group (see that module).
        rank: with a strategy, the one rank to estimate; default: every rank for ZeRO (their
            partitions differ; the highest peak is reported, ``rank_peaks`` has them all),
            rank 0 for DDP and FSDP (their ranks hold alike).

    Returns:
        An :class:`Estimate` (``.peak``, ``.breakdown``, ``.fits``, ``.device``).
    """
    from torch._subclasses.fake_tensor import FakeTensorMode

    t0 = time.perf_counter()
    train, steps = _check_args(batch_size, step, steps, optimizer)
    tgt = _target(device)
    rb = tgt.cuda_like if round_blocks is None else bool(round_blocks)
    if strategy is not None or world_size != 1:
        return _estimate_parallel(build_model, make_batch, batch_size=batch_size, optimizer=optimizer, dtype=dtype,
                                  train=train, step=step, steps=steps, tgt=tgt, rb=rb, loss_fn=loss_fn,
                                  world_size=world_size, strategy=strategy, rank=rank, t0=t0)
    model = _build_on_meta(build_model, dtype)
    acct = Ledger(None, round_blocks=rb, fake=True)
    hooks = LedgerHooks(acct)
    notes: list[str] = []
    with FakeTensorMode(allow_non_fake_inputs=True):
        hooks.install()
        try:
            with acct:
                _materialize(model)
                _init_parameters(model)
                hooks.classify_module(model, recurse=True)
                opt = _make_optimizer(optimizer, model, tgt.cuda_like)
                _run_steps(model, make_batch, batch_size, opt, loss_fn, dtype, train, steps)
        finally:
            hooks.remove()
    return _result(acct, tgt, model, batch_size=batch_size, step=step, steps=steps, dtype=dtype,
                   method="estimated (FakeTensorMode)", t0=t0, notes=notes)


def _kit() -> Any:
    """The single-device step's helpers, for :func:`vramlab.sim.distributed.prepare` (which
    does not import this module: the import goes one way)."""
    from .distributed import StepKit

    return StepKit(build_on_meta=_build_on_meta, materialize=_materialize, init_parameters=_init_parameters,
                   make_optimizer=_make_optimizer, optimizers=OPTIMIZERS)


def _estimate_parallel(build_model: Callable[[], nn.Module], make_batch: Callable[[int], Any], *, batch_size: int,
                       optimizer: Any, dtype: Optional[torch.dtype], train: bool, step: str, steps: int, tgt: _Target,
                       rb: bool, loss_fn: Any, world_size: int, strategy: Any, rank: Optional[int],
                       t0: float) -> Estimate:
    """One rank of a data-parallel step: torch's wrapper on a fake process group."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from . import distributed as D

    ws = D.check_world_size(world_size)
    if strategy is None:
        raise ValueError(f"world_size={ws} needs a strategy: one of {', '.join(D.STRATEGIES)}")
    strat = D.resolve_strategy(strategy)
    if not train:
        raise ValueError(f"strategy {strat.name!r} is for training steps; use step='train'")
    if isinstance(strat, (D.ZeRO1, D.ZeRO2)) and optimizer is not None:
        D.optimizer_class(optimizer, OPTIMIZERS)  # a factory cannot be partitioned: say so before the run
    if rank is not None and (isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < ws):
        raise ValueError(f"rank must be an integer in [0, {ws}); got {rank!r}")
    notes: list[str] = []
    if isinstance(strat, D.ZeRO2):
        notes.append("zero2 is vramlab's model (gradients reduced to their owner rank, no buckets): torch has no "
                     "ZeRO-2, and this is not verified against DeepSpeed")
    # ZeRO's ranks hold different partitions: each is estimated. DDP's and FSDP's are alike.
    ranks = [rank] if rank is not None else (list(range(ws)) if isinstance(strat, (D.ZeRO1, D.ZeRO2)) else [0])
    best: Optional[tuple[int, D.ShardLedger, Any, Any]] = None
    peaks: list[int] = []
    for r in ranks:
        acct = D.ShardLedger(None, round_blocks=rb, fake=True)
        hooks = LedgerHooks(acct)
        with D.fake_process_group(ws, r):
            mesh = D.device_mesh(strat)
            with FakeTensorMode(allow_non_fake_inputs=True), D.counted_storage_resize(acct):
                hooks.install()
                extra: list[Any] = []
                try:
                    with acct:
                        model, opt, extra = D.prepare(strat, build_model, dtype, optimizer, tgt.cuda_like, acct,
                                                      hooks, _kit(), mesh)
                        _run_steps(model, make_batch, batch_size, opt, loss_fn, dtype, train, steps)
                finally:
                    for h in extra:
                        h.remove()
                    hooks.remove()
        peaks.append(acct.peak)
        if best is None or acct.peak > best[1].peak:
            best = (r, acct, model, opt)  # alive until the result: ``after`` is what a rank keeps
        del model, opt
    assert best is not None
    r, acct, model, _opt = best
    if len(ranks) > 1:
        notes.append(f"the figures are rank {r}'s, the highest of the {len(ranks)} ranks' peaks "
                     f"({format_bytes(min(peaks))} to {format_bytes(max(peaks))})")
    n_params = _count_params(_build_on_meta(build_model, dtype))
    return _result(acct, tgt, model, batch_size=batch_size, step=step, steps=steps, dtype=dtype,
                   method="estimated (FakeTensorMode, fake process group)", t0=t0, notes=notes,
                   parallel=(ws, strat.name, r, n_params, tuple(peaks) if len(ranks) > 1 else (acct.peak,)))


# --------------------------------------------------------------------------- real data-parallel runs


@dataclass(frozen=True)
class RankReading:
    """One rank's measured step, in bytes: ``peak``, its ``breakdown`` and ``after`` the step."""

    rank: int
    peak: int
    breakdown: dict[str, int]
    after: int


def _measure_jobs(jobs: list) -> list[RankReading]:
    """In a rank of :func:`~vramlab.sim.distributed.run_ranks`: measure each job."""
    return [_measure_rank(*job) for job in jobs]


def _measure_rank(factory: Callable[[], tuple], strategy: Any, batch_size: int, optimizer: Any,
                  dtype: Optional[torch.dtype], steps: int) -> RankReading:
    from . import distributed as D

    build, make_batch, loss_fn = factory()
    mesh = D.device_mesh(strategy)
    gpu = D.shard_virtual_gpu()
    with gpu:
        model, opt, extra = D.prepare(strategy, build, dtype, optimizer, False, gpu.ledger, gpu._hooks, _kit(), mesh)
        _run_steps(model, make_batch, batch_size, opt, loss_fn, dtype, True, steps)
        for h in extra:
            h.remove()
    return RankReading(torch.distributed.get_rank(), gpu.peak, gpu.breakdown("peak"), gpu.allocated)


def measure_distributed(factory: Callable[[], tuple], *, world_size: int, strategy: Any, batch_size: int,
                        optimizer: Any = "adam", dtype: Optional[torch.dtype] = None, steps: int = 2,
                        timeout: float = 120.0) -> list[RankReading]:
    """Run a training step for real on ``world_size`` CPU processes (gloo), each rank under a
    VirtualGPU; return each rank's reading (bytes), rank 0 first.

    ``factory()`` returns ``(build_model, make_batch, loss_fn)`` as in
    :mod:`vramlab.lessons.models`; it must be picklable (a module-level function or a
    ``functools.partial`` of one): the ranks are started with ``spawn``. The ranks run
    exactly the steps :func:`~vramlab.sim.estimate.estimate` runs for the strategy, on the
    CPU's gloo backend (:mod:`vramlab.sim.distributed` says what that does not show),
    counted by its ``shard_virtual_gpu()`` (a VirtualGPU that counts a DTensor by its shard). ``timeout`` is in seconds, for the whole run; a rank that
    fails or outlives it raises ``RuntimeError``.
    """
    return measure_distributed_many([dict(factory=factory, strategy=strategy, batch_size=batch_size,
                                          optimizer=optimizer, dtype=dtype, steps=steps)],
                                    world_size=world_size, timeout=timeout)[0]


def measure_distributed_many(runs: list[dict[str, Any]], *, world_size: int,
                             timeout: float = 300.0) -> list[list[RankReading]]:
    """:func:`measure_distributed` for several runs (dicts of its keyword arguments but
    ``world_size`` and ``timeout``) in one start of the ranks: starting them costs more than
    a small model's step. Returns, per run, each rank's reading (bytes)."""
    from . import distributed as D

    world_size = D.check_world_size(world_size)
    jobs = []
    for r in runs:
        unknown = set(r) - {"factory", "strategy", "batch_size", "optimizer", "dtype", "steps"}
        if unknown or "factory" not in r or "strategy" not in r or "batch_size" not in r:
            raise ValueError(f"a run needs factory, strategy and batch_size (optimizer, dtype, steps optional); "
                             f"got {sorted(r)}")
        jobs.append((r["factory"], D.resolve_strategy(r["strategy"]), r["batch_size"], r.get("optimizer", "adam"),
                     r.get("dtype"), r.get("steps", 2)))
    per_rank = D.run_ranks(_measure_jobs, jobs, world_size=world_size, timeout=timeout)
    return [[per_rank[rank][i] for rank in range(world_size)] for i in range(len(jobs))]


def measure(build_model: Callable[[], nn.Module], make_batch: Callable[[int], Any], *, batch_size: int,
            optimizer: Any = None, dtype: Optional[torch.dtype] = None, step: str = "train",
            device: Union[None, str, int, VirtualGPU] = None, loss_fn: Optional[Callable[..., Any]] = None,
            steps: Optional[int] = None, round_blocks: Optional[bool] = None) -> Estimate:
    """Run the same step as :func:`estimate` for real, on the CPU, under a VirtualGPU.

    Same arguments and result; the model is built on the meta device and materialised
    inside the VirtualGPU, exactly as ``estimate`` does with fake tensors. With a
    ``device``, its capacity is enforced (``torch.OutOfMemoryError`` when the step does not
    fit); without one the VirtualGPU is unbounded. This uses real memory and compute.
    """
    t0 = time.perf_counter()
    train, steps = _check_args(batch_size, step, steps, optimizer)
    tgt = _target(device)
    rb = tgt.cuda_like if round_blocks is None else bool(round_blocks)
    model = _build_on_meta(build_model, dtype)
    cap = tgt.capacity if tgt.capacity is not None else 2**60
    gpu = VirtualGPU(cap, name=tgt.name, round_blocks=rb, context_overhead=tgt.context)
    with gpu:
        _materialize(model)
        _init_parameters(model)
        gpu.adopt(model)  # created inside: this gives them their categories
        opt = _make_optimizer(optimizer, model, tgt.cuda_like)
        _run_steps(model, make_batch, batch_size, opt, loss_fn, dtype, train, steps)
    return _result(gpu.ledger, tgt, model, batch_size=batch_size, step=step, steps=steps, dtype=dtype,
                   method="measured (VirtualGPU)", t0=t0, notes=[])


def _to_device(batch: Any, device: Any) -> Any:
    if isinstance(batch, torch.Tensor):
        return batch.to(device)
    if isinstance(batch, dict):
        return {k: _to_device(v, device) for k, v in batch.items()}
    if isinstance(batch, (list, tuple)):
        return type(batch)(_to_device(v, device) for v in batch)
    return batch


def warm_up_cuda(torch_mod: Any = torch, device: str = "cuda:0") -> None:
    """Load cuBLAS and cuDNN on ``device`` (their handles and workspaces, which the caching
    allocator counts) so that a baseline read afterwards holds them already."""
    dev = torch_mod.device(device)
    a = torch_mod.randn(256, 256, device=dev, requires_grad=True)
    (a @ a).sum().backward()
    conv = torch_mod.nn.Conv2d(3, 8, 3).to(dev)
    conv(torch_mod.randn(2, 3, 32, 32, device=dev)).sum().backward()
    torch_mod.cuda.synchronize(dev)
    del a, conv
    torch_mod.cuda.empty_cache()


def measure_cuda(build_model: Callable[[], nn.Module], make_batch: Callable[[int], Any], *, batch_size: int,
                 optimizer: Any = None, dtype: Optional[torch.dtype] = None, step: str = "train",
                 loss_fn: Optional[Callable[..., Any]] = None, steps: Optional[int] = None,
                 device: str = "cuda:0") -> int:
    """Run the very steps :func:`estimate` runs, for real on a CUDA device; return the peak
    bytes ``torch.cuda.max_memory_allocated`` reports above what was allocated before.

    The model is built on the device, the optimizer as ``estimate`` builds it for a CUDA
    preset (``foreach=True``), and ``make_batch``'s tensors are moved to the device. Call
    :func:`warm_up_cuda` once first, so that cuBLAS and cuDNN workspaces are not counted.
    """
    train, steps = _check_args(batch_size, step, steps, optimizer)
    dev = torch.device(device)
    torch.cuda.synchronize(dev)
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats(dev)
    base = torch.cuda.memory_allocated(dev)
    with torch.device(dev):
        model = build_model()
    if dtype is not None:
        model = model.to(dtype)
    opt = _make_optimizer(optimizer, model, True)
    _run_steps(model, lambda b: _to_device(make_batch(b), dev), batch_size, opt, loss_fn, dtype, train, steps)
    torch.cuda.synchronize(dev)
    peak = int(torch.cuda.max_memory_allocated(dev)) - int(base)
    del model, opt
    torch.cuda.empty_cache()
    return peak
