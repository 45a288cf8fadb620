"""``estimate()``: the peak memory of a training or inference step, without the memory.

The model is built on the meta device, materialised as fake tensors under
``torch._subclasses.fake_tensor.FakeTensorMode``, and one step runs on them: forward,
backward, optimizer step (twice with an optimizer: the first step creates the optimizer
state, the second is what every later step does). Fake tensors carry shapes, dtypes and
strides but no data, so a step of a billion-parameter model costs seconds and no memory.

The storages are counted by the same ledger as :class:`~vramlab.VirtualGPU` (a dispatch
mode and weakref finalizers; see ``docs/virtual-gpu.md``), so on CPU the estimated peak is
the peak the VirtualGPU measures for the same step (:func:`~vramlab.sim.measure.measure` runs it for real).

With a CUDA preset as ``device`` (``"A100-80GB"``), the estimate models what differs on a
CUDA card: each storage is rounded up to 512 bytes as the caching allocator does, an
optimizer given by name or class is built with ``foreach=True`` (CUDA's default, whose
intermediate lists take memory), and the verdict leaves room for the CUDA context
(:data:`~vramlab.sim.presets.CUDA_CONTEXT_OVERHEAD`). It does not model the allocator's
cache or fragmentation (``memory_reserved``), cuBLAS/cuDNN workspaces, or kernels whose CUDA
implementation allocates differently from the CPU one.

With ``world_size=N, strategy=`` (``"ddp"``, ``"zero1"``, ``"zero2"``, ``"fsdp"``) the estimate
is one rank's: torch's own data-parallel wrapper runs on the fake tensors over torch's fake
process group (:mod:`vramlab.sim.strategies`), and :func:`~vramlab.sim.measure.measure_distributed` runs the same
steps for real on N CPU processes with the gloo backend, each rank under a VirtualGPU.

``precision=`` takes Lightning's names (``"bf16-mixed"``, ``"16-mixed"``, ``"bf16-true"``, ...;
:mod:`vramlab.sim.precision` says what each means per strategy) and ``checkpoint="layers"``
(or a predicate ``module -> bool``) runs those modules as activation checkpoints.

The simulator's rooms: :mod:`~vramlab.sim.step` runs a step, :mod:`~vramlab.sim.precision` and
:mod:`~vramlab.sim.strategies` say how, :mod:`~vramlab.sim.ranks` gives the process groups,
this module estimates and :mod:`~vramlab.sim.measure` measures.

All sizes are in bytes.
"""

from __future__ import annotations

import contextlib
import functools
import html
import time
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Optional, TypeVar, Union

from .._extras import require_torch

require_torch("estimate()")  # one line saying what to install, not a bare ModuleNotFoundError

import torch  # noqa: E402
from torch import nn  # noqa: E402

from ..i18n import tr  # noqa: E402
from ..units import format_bytes, looks_like_size, parse_size  # noqa: E402
from .allocator import AllocConf, CachingAllocator  # noqa: E402
from .kernels import CudaKernels  # noqa: E402
from ..facts import Method  # noqa: E402
from .ledger import CATEGORIES, Ledger, LedgerHooks, ShardLedger, counted_storage_resize  # noqa: E402
from .precision import LossScaler, MasterWeights, Precision  # noqa: E402
from .presets import CONTEXT_FIGURES, get_preset  # noqa: E402
from .ranks import check_world_size, fake_process_group  # noqa: E402
from .optimizers import paged_bytes  # noqa: E402
from .step import (OPTIMIZERS, Loop, Step, StepRun, apply_checkpoint, as_step, build_on_meta,  # noqa: E402
                   checkpoint_modules, count_params, init_parameters, make_optimizer, materialize, run_steps)
from .strategies import (STRATEGIES, ZeRO1, ZeRO2, device_mesh, optimizer_class, prepare,  # noqa: E402
                         ranks_to_estimate, resolve_strategy, zero2_candidates, zero_partition)
from .virtual_gpu import VirtualGPU, allocator_conf  # noqa: E402

__all__ = ["Estimate", "estimate", "Target", "target", "make_estimate", "MODEL_STATES", "OPTIMIZERS",
           "allocator_conf", "resolve_allocator"]

#: The model states' categories (:attr:`Estimate.model_states`).
MODEL_STATES: tuple[str, ...] = ("parameters", "gradients", "optimizer_state")


def _labels() -> dict[str, str]:
    """The breakdown's category labels, in the current language (:func:`vramlab.i18n.tr`)."""
    return {"parameters": tr("parameters"), "buffers": tr("buffers"), "gradients": tr("gradients"),
            "optimizer_state": tr("optimizer state"), "activations": tr("activations (saved)"),
            "other": tr("other / temporaries")}


def _method(method: Method) -> str:
    """An :attr:`Estimate.method` in the current language."""
    return {Method.ESTIMATED: tr("estimated (FakeTensorMode)"),
            Method.ESTIMATED_RANKS: tr("estimated (FakeTensorMode, fake process group)"),
            Method.MEASURED: tr("measured (VirtualGPU)")}[Method(method)]


def _step(step: str) -> str:
    """``"train"`` or ``"inference"`` in the current language."""
    return {"train": tr("train"), "inference": tr("inference")}.get(step, step)


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
        method: how it was found (:class:`vramlab.facts.Method`: estimated on fake tensors, on
            fake ranks, or measured in a VirtualGPU).
        seconds: how long it took.
        world_size: the data-parallel ranks (1 without a strategy).
        strategy: ``"ddp"``, ``"zero1"``, ``"zero2"`` (modelled), ``"fsdp"``, or ``None``.
        rank: the rank the figures describe, with a strategy (see :mod:`vramlab.sim.distributed`).
        rank_peaks: the peak of each rank estimated, by rank (bytes): rank 0 for DDP and FSDP,
            rank 0 and the busiest rank for ZeRO, every rank with ``rank="all"``.
        model_states: what the rank holds when the (last) optimizer step ends, in bytes, by
            ``parameters`` (every copy: working and master weights), ``gradients`` and
            ``optimizer_state``; empty without an optimizer step. The ZeRO paper's "model states".
        precision: the precision's name (``"32-true"``, ``"bf16-mixed"``, ...: :mod:`vramlab.sim.precision`).
        checkpoint: how many modules were checkpointed (``checkpoint=``), 0 for none.
        peak_reserved: with ``allocator="caching"``, the highest bytes PyTorch's caching allocator
            held in segments (``max_memory_reserved``): what the card must have, the context aside;
            ``fits`` then compares it with the budget. ``None`` with exact accounting.
        allocator: ``"exact"`` (each storage's bytes, 512-byte blocks on a CUDA preset) or
            ``"caching"`` (:mod:`vramlab.sim.allocator`: blocks and segments as PyTorch's).
        accumulate: micro-batches per optimizer step (``batch_size`` is one micro-batch's).
        paged: bytes of optimizer state in CUDA unified memory (bitsandbytes' paged optimizers,
            :mod:`vramlab.sim.optimizers`): outside PyTorch's allocator, so in neither ``peak`` nor
            ``peak_reserved`` nor the verdict; the driver moves it to host RAM when the card is short.
        num_alloc_retries: with the caching allocator on a card, how many times it emptied its
            cache at the card's limit to go on (torch's ``num_alloc_retries``), when the step fits;
            ``None`` otherwise. With the caching allocator on a card, ``fits`` is the allocator's own
            verdict at the card's limit (it fits unless the allocator would raise).
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
    method: Method
    seconds: float
    notes: tuple[str, ...] = field(default_factory=tuple)
    world_size: int = 1
    strategy: Optional[str] = None
    rank: Optional[int] = None
    rank_peaks: dict[int, int] = field(default_factory=dict)
    model_states: dict[str, int] = field(default_factory=dict)
    precision: str = "32-true"
    checkpoint: int = 0
    peak_reserved: Optional[int] = None
    allocator: str = "exact"
    num_alloc_retries: Optional[int] = None
    accumulate: int = 1
    paged: int = 0

    @property
    def model_states_total(self) -> int:
        """Bytes of :attr:`model_states` together."""
        return sum(self.model_states.values())

    @property
    def headroom(self) -> Optional[int]:
        """``budget - needed`` (negative when it does not fit), or ``None`` without a device."""
        return None if self.budget is None else self.budget - self.needed

    @property
    def needed(self) -> int:
        """What the verdict compares with the budget: ``peak_reserved`` with the caching
        allocator, else ``peak`` (bytes)."""
        return self.peak_reserved if self.peak_reserved is not None else self.peak

    def verdict(self) -> str:
        """One line: fits or not, and by how much."""
        what = tr("reserved peak") if self.peak_reserved is not None else tr("peak")
        if self.fits is None:
            return tr("{what} {needed} (no device given)", what=what, needed=format_bytes(self.needed))
        h = self.headroom or 0
        margin = (tr("{size} to spare", size=format_bytes(abs(h))) if h >= 0
                  else tr("{size} short", size=format_bytes(abs(h))))
        fields = dict(device=self.device, what=what, needed=format_bytes(self.needed), budget=format_bytes(self.budget),
                      margin=margin)
        if self.fits:
            return tr("fits on {device}: {what} {needed} of {budget} usable ({margin})", **fields)
        return tr("does NOT fit on {device}: {what} {needed} of {budget} usable ({margin})", **fields)

    def text(self) -> str:
        """A plain-text report: the verdict and the breakdown at the peak."""
        per_rank = (tr(", {strategy} on {world_size} ranks, rank {rank} (batch per rank)", strategy=self.strategy,
                       world_size=self.world_size, rank=self.rank) if self.strategy else "")
        lines = [tr("{method}: {step} step, batch {batch}, {parameters} parameters", method=_method(self.method),
                    step=_step(self.step), batch=self.batch_size, parameters=f"{self.parameters:,}")
                 + (f", {self.dtype}" if self.dtype else "") + per_rank,
                 "  " + self.verdict()]
        labels = _labels()
        for k in CATEGORIES:
            n = self.breakdown.get(k, 0)
            share = 100.0 * n / self.peak if self.peak else 0.0
            lines.append(f"    {labels[k]:<22}{format_bytes(n):>12}  {share:5.1f}%")
        if self.model_states:
            ms = self.model_states
            lines.append("  " + tr("model states when the step ends {total}: parameters {parameters}, gradients "
                                   "{gradients}, optimizer state {optimizer_state}",
                                   total=format_bytes(self.model_states_total),
                                   parameters=format_bytes(ms.get("parameters", 0)),
                                   gradients=format_bytes(ms.get("gradients", 0)),
                                   optimizer_state=format_bytes(ms.get("optimizer_state", 0))))
        if self.peak_reserved is not None:
            lines.append("  " + tr("reserved by the caching allocator at most {reserved} ({above} above the allocated "
                                   "peak)", reserved=format_bytes(self.peak_reserved),
                                   above=format_bytes(self.peak_reserved - self.peak)))
        if self.checkpoint:
            lines.append("  " + tr("activation checkpointing on {n} modules", n=self.checkpoint))
        lines.append("  " + tr("after the step {after}; took {seconds} s", after=format_bytes(self.after),
                               seconds=f"{self.seconds:.2f}"))
        lines.extend("  " + tr("note: {note}", note=n) for n in self.notes)
        return "\n".join(lines)

    def __repr__(self) -> str:
        return f"<vramlab.Estimate peak={format_bytes(self.peak)} fits={self.fits} device={self.device!r}>"

    def _repr_html_(self) -> str:
        labels = _labels()
        rows = "".join(
            f"<tr><td>{html.escape(labels[k])}</td><td style='text-align:right'>"
            f"{html.escape(format_bytes(self.breakdown.get(k, 0)))}</td></tr>" for k in CATEGORIES)
        color = "#59a14f" if self.fits else ("#e15759" if self.fits is False else "#888")
        extra = ""
        if self.peak_reserved is not None:  # what text() says under the table, said here too
            extra += "<p>" + html.escape(tr("reserved by the caching allocator at most {reserved} ({above} above the "
                                            "allocated peak)", reserved=format_bytes(self.peak_reserved),
                                            above=format_bytes(self.peak_reserved - self.peak))) + "</p>"
        extra += "".join("<p>" + html.escape(tr("note: {note}", note=n)) + "</p>" for n in self.notes)
        about = tr("{method}, {step} step, batch {batch}, {parameters} parameters; {seconds} s",
                   method=_method(self.method), step=_step(self.step), batch=self.batch_size,
                   parameters=f"{self.parameters:,}", seconds=f"{self.seconds:.2f}")
        return (f"<div class='vramlab-estimate'><p style='border-left:3px solid {color};padding-left:6px'>"
                f"{html.escape(self.verdict())}</p><table><tr><th>{html.escape(tr('at the peak'))}</th>"
                f"<th>{html.escape(tr('bytes'))}</th></tr>{rows}"
                f"</table>{self._states_html()}{extra}<p>{html.escape(about)}</p></div>")

    def _states_html(self) -> str:
        if not self.model_states:
            return ""
        ms = self.model_states
        return "<p>" + html.escape(tr(
            "model states when the step ends: {total} (parameters {parameters}, gradients {gradients}, optimizer "
            "state {optimizer_state})", total=format_bytes(self.model_states_total),
            parameters=format_bytes(ms.get("parameters", 0)), gradients=format_bytes(ms.get("gradients", 0)),
            optimizer_state=format_bytes(ms.get("optimizer_state", 0)))) + "</p>"

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, str]:
        return {"text/plain": self.text(), "text/html": self._repr_html_()}


def resolve_allocator(allocator: Optional[str], alloc_conf: Optional[str], tgt: "Target") -> str:
    """``allocator=None`` means the target's: PyTorch's caching allocator on a GPU preset, a
    ``VirtualGPU``'s own (caching by default), exact accounting without a target or on a bare
    size; ``"caching"`` whenever ``alloc_conf`` is given."""
    if allocator is None:
        return "caching" if alloc_conf is not None else tgt.allocator
    return allocator


def _books(conf: Optional[AllocConf]) -> Optional[CachingAllocator]:
    """An unbounded caching allocator for an estimate's ledger (the verdict, not an OOM, says
    whether it fits), or ``None``."""
    return None if conf is None else CachingAllocator(1 << 62, conf)


def _note_ready(ready: list[tuple[int, int]], index: dict[int, int], acct: Ledger, p: Any) -> None:
    """A post-accumulate-grad hook: ``p``'s gradient is ready; note its index and the most bytes
    held since the previous gradient was ready."""
    ready.append((index[id(p)], max(acct.window_peak, acct.allocated)))
    acct.window_peak = acct.allocated


def _zero2_more_ranks(params: list[Any], ready: list[tuple[int, int]], acct: Ledger, world_size: int) -> list[int]:
    """After rank 0's ZeRO-2 run: the ranks that may peak above it
    (:func:`~vramlab.sim.strategies.zero2_candidates`), from its last backward (the order its
    gradients became ready, with the bytes it held) and the bytes per element its partition holds."""
    n = len(params)
    last = ready[-n:] if len(ready) >= n else ready
    numels = [p.numel() for p in params]
    owned = zero_partition(numels, world_size)[0]
    states = acct.after_step or {}
    working = sum(p.numel() * p.element_size() for p in params)
    per_element = (states.get("parameters", 0) - working + states.get("optimizer_state", 0)) / owned if owned else 0.0
    grad_bytes = float(params[0].element_size()) if params else 0.0
    return zero2_candidates(numels, last, world_size, grad_bytes, max(per_element, 0.0), acct.peak)


# --------------------------------------------------------------------------- the device


@dataclass(frozen=True)
class Target:
    """The verdict's device: its name, capacity and modelled CUDA context (bytes), whether
    it is a CUDA card (512-byte blocks, ``foreach`` optimizers), and its default allocator."""

    name: Optional[str]
    capacity: Optional[int]
    context: int
    cuda_like: bool
    allocator: str = "exact"
    cc: Optional[tuple[int, int]] = None  # a preset's compute capability: CUDA's kernels (sim.kernels)
    published_context: bool = False  # the context is a published figure for the card (presets.CONTEXT_FIGURES)

    def kernels(self, acct: Ledger) -> Any:
        """The context that makes ``acct`` hold what CUDA's kernels hold on this card
        (:class:`~vramlab.sim.kernels.CudaKernels`), or a null context off a preset."""
        return CudaKernels(acct, self.cc) if self.cc is not None else contextlib.nullcontext()


def target(device: Any) -> Target:
    """A :class:`Target` from ``device=``: ``None``, a preset name, a size, bytes or a VirtualGPU.

    A size must be positive and finite (:func:`~vramlab.units.parse_size`): ``"-1GiB"``, ``"nan"``
    and ``"1e400GiB"`` get that ``ValueError``, not "unknown GPU preset"."""
    if device is None:
        return Target(None, None, 0, False)
    if isinstance(device, VirtualGPU):
        cc = device.kernels.cc if device.kernels is not None else None
        return Target(device.name, device.capacity, device.context_overhead, device.preset is not None,
                      device.allocator_kind, cc)
    if isinstance(device, float):  # nan, inf: "not finite"; 1.5: bytes are an int
        parse_size(device, what="device capacity", positive=True)
    if isinstance(device, bool) or not isinstance(device, (int, str)):
        raise ValueError(f"device must be a GPU preset name, a size or bytes; got {device!r}")
    try:
        cap = parse_size(device, what="device capacity", positive=True)
    except ValueError as size_error:
        if not isinstance(device, str):
            raise
        try:
            p = get_preset(device)
        except ValueError as e:
            if looks_like_size(device):  # "-1GiB", "nan", "1e400GiB": the size's error, not an unknown preset
                raise ValueError(f"{size_error}; device is a size such as '24GiB', bytes or a GPU preset name "
                                 "such as 'T4'") from None
            raise ValueError(f"device {device!r} is neither a size (e.g. '24GiB') nor a GPU preset: {e}") from None
        return Target(p.name, p.memory, p.context_overhead, True, "caching", p.compute_capability,
                      published_context=p.name in CONTEXT_FIGURES)
    return Target(format_bytes(cap), cap, 0, False)


def make_estimate(acct: Ledger, tgt: Target, *, n_params: int, batch_size: int, step: str, steps: int,
                  prec: Precision, method: Method, t0: float, notes: list[str], checkpointed: int = 0,
                  parallel: Optional[tuple[int, str, int, dict[int, int]]] = None,
                  limit: Optional[tuple[bool, Optional[str]]] = None, loop: Optional[Loop] = None,
                  paged: int = 0) -> Estimate:
    """The :class:`Estimate` of a ledger's books after a run: its peak, breakdown and model
    states, the verdict on ``tgt``; ``parallel``: ``(world_size, strategy, rank, rank_peaks)``;
    ``limit``: ``(fits, what the refused request was)`` when the caching allocator ran at the
    card's limit (the verdict is then its own: ``acct`` is that run's books when it fitted,
    else an unbounded run's, for what the step needs); ``loop``: how the steps ran; ``paged``: bytes
    of optimizer state in unified memory (:attr:`Estimate.paged`)."""
    loop = loop if loop is not None else Loop()
    if loop.accumulate > 1:
        notes.append(tr("gradient accumulation: {n} micro-batches of {batch} per optimizer step (an effective batch "
                        "of {total}); the gradients are held from the first micro-batch to the step",
                        n=loop.accumulate, batch=batch_size, total=batch_size * loop.accumulate))
    if not loop.set_to_none:
        notes.append(tr("zero_grad(set_to_none=False): the gradients stay allocated, zeroed, between steps"))
    if loop.step_in_backward:
        notes.append(tr("the optimizer step runs inside backward (one optimizer per parameter, stepped by its "
                        "post-accumulate-grad hook): each gradient is freed as soon as it is applied"))
    if paged:
        notes.append(tr("{paged} of optimizer state is in CUDA unified memory (a paged optimizer): it is outside "
                        "PyTorch's allocator, so it is in neither peak nor verdict; it occupies the card while "
                        "there is room, and the driver pages it to host RAM when the allocator needs the memory",
                        paged=format_bytes(paged)))
    budget = None if tgt.capacity is None else tgt.capacity - tgt.context
    if tgt.context and tgt.published_context:
        notes.append(tr("{context} set aside for the CUDA context (a figure published for this card under torch 2.x; "
                        "vramlab.sim.presets.CONTEXT_FIGURES cites it)", context=format_bytes(tgt.context)))
    elif tgt.context:
        notes.append(tr("{context} set aside for the CUDA context (an assumed figure)", context=format_bytes(tgt.context)))
    extra: dict[str, Any] = {}
    if parallel is not None:
        extra = dict(world_size=parallel[0], strategy=parallel[1], rank=parallel[2], rank_peaks=dict(parallel[3]))
    states = {k: acct.after_step[k] for k in MODEL_STATES} if acct.after_step is not None else {}
    reserved = acct.allocator.peak_reserved if acct.allocator is not None else None
    needed = reserved if reserved is not None else acct.peak
    fits = None if budget is None else needed <= budget
    retries = acct.allocator.memory_stats()["num_alloc_retries"] if acct.allocator is not None else None
    if limit is not None and budget is not None:
        fits, refused = limit
        if fits and retries:
            notes.append(tr("fits only because the caching allocator, at the card's limit, emptied its cache and "
                            "retried (num_alloc_retries = {n}), as a card does: each time it waits for the GPU and "
                            "frees every cached segment", n=retries))
        elif not fits:
            retries = None  # the figures are the unbounded run's
            notes.append(tr("the caching allocator at the card's limit, after releasing its cache, refused a "
                            "request ({tried}): the figures are what the step needs on a larger card",
                            tried=refused or tr("its size unknown")))
    return Estimate(
        peak=acct.peak, breakdown=dict(acct.peak_cats), fits=fits, num_alloc_retries=retries,
        device=tgt.name, capacity=tgt.capacity, budget=budget, after=acct.allocated, parameters=n_params,
        batch_size=batch_size, step=step, steps=steps, dtype=prec.label,
        round_blocks=acct.round_blocks, method=method, seconds=time.perf_counter() - t0, notes=tuple(notes),
        model_states=states, precision=prec.name, checkpoint=checkpointed, peak_reserved=reserved,
        allocator="caching" if acct.allocator is not None else "exact", accumulate=loop.accumulate, paged=paged,
        **extra)


def estimate(build_model: Union[Callable[[], nn.Module], Step], make_batch: Optional[Callable[[int], Any]] = None, *,
             batch_size: Optional[int] = None, optimizer: Any = None, dtype: Optional[torch.dtype] = None, step: str = "train",
             device: Union[None, str, int, VirtualGPU] = None, loss_fn: Optional[Callable[..., Any]] = None,
             steps: Optional[int] = None, round_blocks: Optional[bool] = None, world_size: int = 1,
             strategy: Any = None, rank: Union[None, int, str] = None, precision: Optional[str] = None,
             checkpoint: Any = None, allocator: Optional[str] = None, alloc_conf: Optional[str] = None,
             accumulate: int = 1, set_to_none: bool = True, step_in_backward: bool = False) -> Estimate:
    """Estimate the peak memory of a step without allocating it (see module docs).

    The step is either a :class:`~vramlab.sim.step.Step` (``estimate(step, device=...)``) or its
    fields given here (``build_model``, ``make_batch``, ``batch_size``, ``optimizer``, ``loss_fn``,
    ``step``, ``steps``, ``precision``, ``dtype``, ``checkpoint``, ``accumulate``,
    ``set_to_none``, ``step_in_backward``); the rest says where and how it runs.

    Args:
        build_model: returns the ``nn.Module``; it is called under ``torch.device("meta")``.
            Or a whole :class:`~vramlab.sim.step.Step`.
        make_batch: ``make_batch(batch_size)`` returns a tensor ``x`` (``model(x)``), a dict
            (``model(**batch)``) or a tuple ``(inputs, *targets)`` (``model(inputs)``, then
            ``loss_fn(output, *targets)``). It runs under ``FakeTensorMode``.
        batch_size: the batch size passed to ``make_batch``.
        optimizer: ``None`` (backward only), a name (``"adamw"``, ``"paged_adamw8bit"``), an
            Optimizer class (bitsandbytes' too), or a factory ``params -> optimizer``; bitsandbytes'
            8-bit and paged optimizers are estimated from their memory layout, and a factory is
            probed once for the class and settings ZeRO and master weights need
            (:mod:`vramlab.sim.optimizers`).
        dtype: cast the model and the batch's floating tensors to it (``torch.bfloat16``): the
            older spelling of ``precision="bf16-true"``.
        precision: Lightning's names: ``"32-true"`` (default), ``"bf16-mixed"``, ``"16-mixed"``,
            ``"bf16-true"``, ``"16-true"`` (what each means per strategy: :mod:`vramlab.sim.precision`).
        checkpoint: activation checkpointing: ``"layers"`` (each block of every
            ``nn.ModuleList``/``nn.Sequential``) or a predicate ``module -> bool``; ``None`` for none.
        allocator: ``"caching"`` (the default on a CUDA target: a preset or a VirtualGPU) or
            ``"exact"`` (the default without one, or on a bare size): with ``"caching"`` every
            storage gets a block from a model of PyTorch's CUDA caching allocator
            (:mod:`vramlab.sim.allocator`), ``peak`` counts block sizes as ``memory_allocated``
            does, ``peak_reserved`` is reported and the verdict compares it with the card.
        alloc_conf: ``PYTORCH_CUDA_ALLOC_CONF`` for the caching allocator (default: the
            environment's).
        step: ``"train"`` (forward, backward, optimizer step) or ``"inference"`` (forward
            under ``no_grad``).
        device: the verdict's device: a GPU preset (``"A100-80GB"``), a size (``"24GiB"``),
            bytes or a VirtualGPU; ``None`` for no verdict.
        loss_fn: ``loss_fn(output, *targets)``; default: the output itself when it is a
            scalar, its ``.loss``, else its sum.
        steps: how many steps to run; default 2 with an optimizer (its state is created by
            the first), else 1. The peak is over all of them.
        round_blocks: count 512-byte blocks as CUDA does; default: on for a CUDA preset.
        world_size: data-parallel ranks, from 1 to 16384 (:data:`~vramlab.sim.ranks.MAX_WORLD_SIZE`:
            as many GPUs as Llama 3 405B trained on; FSDP's simulation time grows with it); with ``strategy``, the figures are one rank's and ``batch_size`` is per rank.
        strategy: ``"ddp"``, ``"zero1"``, ``"zero2"`` (modelled), ``"fsdp"``, or an instance
            of :mod:`vramlab.sim.strategies`' ``DDP``/``ZeRO1``/``ZeRO2``/``FSDP`` with
            options; it runs torch's own wrapper on a fake process group (see that module).
        rank: with a strategy, the one rank to estimate, or ``"all"`` for every rank; default:
            for ZeRO rank 0, the rank the partition rule gives the most elements and, under ZeRO-2,
            the ranks that may peak at the end of backward (the highest peak is reported,
            ``rank_peaks`` has those run), rank 0 for DDP and FSDP (their ranks hold alike).
        accumulate: micro-batches per optimizer step (gradient accumulation; ``batch_size`` is
            one micro-batch); ``steps`` counts optimizer steps.
        set_to_none: as ``optimizer.zero_grad(set_to_none=...)``: ``False`` keeps the gradients,
            zeroed, between steps.
        step_in_backward: the optimizer step fused into backward (one device; see
            :class:`~vramlab.sim.step.Loop`).

    A model without trainable parameters has nothing to backpropagate: with an optimizer or a
    strategy, ``ValueError``; without, a training step is estimated as its forward pass (its
    activations: ``step`` is ``"inference"`` in the result, and a note says so).

    Returns:
        An :class:`Estimate` (``.peak``, ``.breakdown``, ``.fits``, ``.device``).

    Raises:
        ValueError: naming the argument that is out of range: ``batch_size`` below 1, a
            ``device`` size that is negative, zero, not finite or above 8 EiB, a ``world_size``
            outside 1..16384, ...
    """
    spec = as_step(build_model, make_batch, dict(
        batch_size=batch_size, optimizer=optimizer, loss_fn=loss_fn, step=step, steps=steps, precision=precision,
        dtype=dtype, checkpoint=checkpoint, accumulate=accumulate, set_to_none=set_to_none,
        step_in_backward=step_in_backward))
    return estimate_step(spec, device=device, round_blocks=round_blocks, world_size=world_size, strategy=strategy,
                         rank=rank, allocator=allocator, alloc_conf=alloc_conf)


def estimate_step(spec: Step, *, device: Union[None, str, int, VirtualGPU] = None, round_blocks: Optional[bool] = None,
                  world_size: int = 1, strategy: Any = None, rank: Union[None, int, str] = None,
                  allocator: Optional[str] = None, alloc_conf: Optional[str] = None) -> Estimate:
    """:func:`estimate` of ``spec`` (the arguments are :func:`estimate`'s)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    t0 = time.perf_counter()
    run_ = spec.resolved()
    tgt = target(device)
    rb = tgt.cuda_like if round_blocks is None else bool(round_blocks)
    conf = allocator_conf(resolve_allocator(allocator, alloc_conf, tgt), alloc_conf)
    if strategy is not None or world_size != 1:
        return _estimate_parallel(run_, tgt=tgt, rb=rb, world_size=world_size, strategy=strategy, rank=rank, t0=t0,
                                  conf=conf)
    plan = run_.prec.plan(None)
    run_ = run_.checked(plan, None)
    train, step, optimizer = run_.train, spec.step, run_.optimizer
    model = build_on_meta(spec.build_model, plan.model_dtype)
    notes: list[str] = []
    lacking = _no_trainable_parameters(model)
    if train and lacking is not None:
        if optimizer is not None:
            raise ValueError(f"the model {lacking}, so optimizer={optimizer!r} has nothing to optimize (torch refuses "
                             "it: 'optimizer got an empty parameter list'); pass optimizer=None to estimate the "
                             "forward pass's activations, or give the model trainable parameters")
        # Nothing to backpropagate (torch's backward would refuse the loss): what such a step holds
        # is its forward pass, which is what runs, as step="inference" (the same peak: without a
        # parameter that requires grad, autograd saves nothing for backward).
        train, step = False, "inference"
        run_ = replace(run_, train=False)
        notes.append(tr("the model has no trainable parameters: there is nothing to backpropagate, so this is "
                        "the forward pass's memory (its activations), estimated as step='inference'"))
    loop = run_.loop

    def run(books: Optional[CachingAllocator], on_oom: Any) -> tuple[Ledger, int, Any]:
        ckpt = checkpoint_modules(model, spec.checkpoint)
        apply_checkpoint(ckpt)
        acct = Ledger(None, round_blocks=rb, fake=True, allocator=books, no_values=_no_values)
        if on_oom is not None:
            acct.on_oom = on_oom
        hooks = LedgerHooks(acct)
        with FakeTensorMode(allow_non_fake_inputs=True):
            hooks.install()
            try:
                with acct, tgt.kernels(acct) as kern:
                    materialize(model)
                    init_parameters(model)
                    hooks.classify_module(model, recurse=True)
                    wrap = MasterWeights.of if plan.master_weights else None
                    opt = make_optimizer(optimizer, model, tgt.cuda_like, wrap, loop)
                    scaler = LossScaler("cpu") if plan.scale_loss and train else None
                    run_steps(model, run_, opt, plan, scaler)
            finally:
                hooks.remove()
        # kept alive to the result: ``after`` is what the step keeps (the cuBLAS workspace too, as torch keeps it)
        return acct, len(ckpt), (model, opt, kern, scaler)

    def rebuild() -> None:
        nonlocal model
        model = build_on_meta(spec.build_model, plan.model_dtype)

    limit = _CardLimit(conf, tgt)
    acct, nck, _kept = limit.run(run, before_retry=rebuild)
    return make_estimate(acct, tgt, n_params=count_params(model), batch_size=spec.batch_size, step=step,
                         steps=run_.steps, prec=run_.prec, method=Method.ESTIMATED, t0=t0, notes=notes, checkpointed=nck,
                         limit=limit.verdict, loop=loop, paged=paged_bytes(_kept[1]))


_T = TypeVar("_T")


class _CardLimit:
    """The verdict of the caching allocator at the card's limit, with its release-and-retry chain,
    as a VirtualGPU of that card (or the card itself) runs the step: "does not fit" means it would
    raise. A run it refuses is run again without the limit, for what the step needs; ``refused``
    is what it refused (a size, for a note). Without a card or with exact accounting, one run."""

    def __init__(self, conf: Optional[AllocConf], tgt: "Target") -> None:
        self.conf, self.tgt = conf, tgt
        self.bounded = _card_books(conf, tgt) is not None
        self.refused: Optional[str] = None

    def _refuse(self, requested: int, pending: int) -> BaseException:
        self.refused = format_bytes(requested)
        return torch.OutOfMemoryError(f"out of memory: tried to allocate {requested} bytes")

    def run(self, fn: Callable[[Optional[CachingAllocator], Any], _T],
            before_retry: Optional[Callable[[], None]] = None) -> _T:
        """``fn(books, on_oom)``: bounded at the card (``on_oom`` records the refusal), then, if
        the allocator refused, unbounded (``before_retry()`` first: a fresh model)."""
        card = _card_books(self.conf, self.tgt)
        if card is None:
            return fn(_books(self.conf), None)
        try:
            return fn(card, self._refuse)
        except torch.OutOfMemoryError:
            self.refused = self.refused or tr("more than 1 EiB")
        if before_retry is not None:
            before_retry()
        return fn(_books(self.conf), None)

    @property
    def verdict(self) -> Optional[tuple[bool, Optional[str]]]:
        """:func:`make_estimate`'s ``limit``: ``(fits, what was refused)``, or ``None`` unbounded."""
        return (self.refused is None, self.refused) if self.bounded else None


class StepNeedsValuesError(ValueError):
    """The step needs tensor values, and :func:`estimate` runs it on fake tensors (shapes and
    memory, no values): a data-dependent shape (``nonzero``, boolean-mask indexing,
    ``unique``) or a read (``.item()``, ``if loss > x``). ``op``: the operator's name."""

    def __init__(self, op: str) -> None:
        self.op = op
        super().__init__(
            f"{op} needs tensor values (a value-dependent shape such as nonzero or boolean-mask indexing, or "
            f"a read such as .item()), and estimate() runs the step on fake tensors, which have shapes and "
            f"memory but no values. Either run the step for real on a virtual card with "
            f"vramlab.sim.measure(...) (the same arguments: real tensors, so the card must fit this machine's "
            f"RAM), or make its shapes independent of the values (a multiplication by the mask, torch.where, "
            f"instead of indexing with it).")


def _no_values(func: Any, error: BaseException) -> BaseException:
    return StepNeedsValuesError(str(getattr(func, "__name__", func)))


def _card_books(conf: Optional[AllocConf], tgt: "Target") -> Optional[CachingAllocator]:
    """The caching allocator of the target card, bounded as a VirtualGPU of it is (the card's
    memory less the modelled context; a fraction is of the whole card), or ``None`` (exact
    accounting, or no card)."""
    if conf is None or tgt.capacity is None:
        return None
    return CachingAllocator(tgt.capacity - tgt.context, conf, total_memory=tgt.capacity)


def _no_trainable_parameters(model: nn.Module) -> Optional[str]:
    """``None`` when ``model`` has a parameter that requires grad; else what it lacks, for a
    message: ``"has no parameters"`` or ``"has no trainable parameters (...)"``."""
    params = list(model.parameters())
    if any(p.requires_grad for p in params):
        return None
    if not params:
        return "has no parameters"
    return f"has no trainable parameters (its {count_params(model)} parameter elements all have requires_grad=False)"


def _estimate_parallel(run_: StepRun, *, tgt: Target, rb: bool, world_size: int, strategy: Any,
                       rank: Union[None, int, str], t0: float, conf: Optional[AllocConf] = None) -> Estimate:
    """One rank of a data-parallel step: torch's wrapper on a fake process group."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    spec, optimizer, train = run_.spec, run_.optimizer, run_.train
    build_model, checkpoint = spec.build_model, spec.checkpoint

    ws = check_world_size(world_size)
    if strategy is None:
        raise ValueError(f"world_size={ws} needs a strategy: one of {', '.join(STRATEGIES)}")
    strat = resolve_strategy(strategy)
    if not train:
        raise ValueError(f"strategy {strat.name!r} is for training steps; use step='train'")
    if isinstance(strat, (ZeRO1, ZeRO2)) and optimizer is not None:
        optimizer_class(optimizer)  # a factory cannot be partitioned: say so before the run
    if rank is not None and rank != "all" and (isinstance(rank, bool) or not isinstance(rank, int)
                                                or not 0 <= rank < ws):
        raise ValueError(f"rank must be an integer in [0, {ws}) or 'all'; got {rank!r}")
    plan = run_.prec.plan(strat.name)
    run_ = run_.checked(plan, strat.name)
    notes: list[str] = []
    if isinstance(strat, ZeRO2):
        notes.append(tr("zero2 is vramlab's model (gradients reduced to their owner rank, no buckets): torch has no "
                        "ZeRO-2, and this is not verified against DeepSpeed"))
    probe = build_on_meta(build_model, plan.model_dtype)
    lacking = _no_trainable_parameters(probe)
    if lacking is not None:
        raise ValueError(f"the model {lacking}: strategy {strat.name!r} replicates or shards parameters, gradients "
                         "and optimizer state, and there are none; estimate it without a strategy (world_size=1, "
                         "no optimizer) for the forward pass's activations")
    ranks = ranks_to_estimate(strat, probe, ws, rank)
    record: Optional[list[tuple[int, int]]] = [] if isinstance(strat, ZeRO2) and rank is None and 0 in ranks else None
    n_params = count_params(probe)
    del probe
    best: Optional[tuple[int, Ledger, Any, Any, int]] = None
    peaks: dict[int, int] = {}
    limit = _CardLimit(conf, tgt)
    params: list[Any] = []

    def run_rank(r: int, books: Optional[CachingAllocator], on_oom: Any) -> tuple[ShardLedger, Any, Any, int]:
        kern: Any = None
        scaler: Optional[LossScaler] = None
        nonlocal params
        model = build_on_meta(build_model, plan.model_dtype)  # built and cast before the fake mode and the ledger
        acct = ShardLedger(None, round_blocks=rb, fake=True, allocator=books, no_values=_no_values)
        if on_oom is not None:
            acct.on_oom = on_oom
        hooks = LedgerHooks(acct)
        with fake_process_group(ws, r):
            mesh = device_mesh(strat)
            with FakeTensorMode(allow_non_fake_inputs=True), counted_storage_resize(acct):
                hooks.install()
                extra: list[Any] = []
                try:
                    with acct, tgt.kernels(acct) as kern:
                        ckpt = len(checkpoint_modules(model, checkpoint))
                        model, opt, extra = prepare(strat, model, plan, optimizer, tgt.cuda_like, acct, hooks, mesh,
                                                    checkpoint)
                        if r == 0 and record is not None:  # the order in which gradients become ready
                            params = [p for p in model.parameters() if p.requires_grad]
                            index = {id(p): i for i, p in enumerate(params)}
                            note = functools.partial(_note_ready, record, index, acct)
                            extra.extend(p.register_post_accumulate_grad_hook(note) for p in params)
                        scaler = LossScaler("cpu") if plan.scale_loss else None
                        run_steps(model, run_, opt, plan, scaler)
                finally:
                    for h in extra:
                        h.remove()
                    hooks.remove()
        return acct, (model, kern, scaler), opt, ckpt  # the cuBLAS workspace and the scaler stay, as torch keeps them

    for r in ranks:
        # As for one device: each rank's verdict is its caching allocator's at the card's limit;
        # a rank it refuses is run again without the limit, for what it needs.
        acct, model, opt, ckpt = limit.run(functools.partial(run_rank, r))
        peaks[r] = acct.peak
        if r == 0 and record is not None:
            for c in _zero2_more_ranks(params, record, acct, ws):
                if c not in ranks:
                    ranks.append(c)
            params = []
        if best is None or acct.peak > best[1].peak:
            best = (r, acct, model, opt, ckpt)  # alive until the result: ``after`` is what a rank keeps
        del model, opt
    assert best is not None
    r, won, _model, _opt, ckpt = best
    if len(ranks) > 1:
        which = tr("every rank") if rank == "all" else \
            tr("ranks {ranks} (rank 0 and those the partition rule may make the busiest)",
               ranks=", ".join(map(str, sorted(ranks))))
        notes.append(tr("the figures are rank {rank}'s, the highest peak of {which} ({lowest} to {highest})", rank=r,
                        which=which, lowest=format_bytes(min(peaks.values())), highest=format_bytes(max(peaks.values()))))
    return make_estimate(won, tgt, n_params=n_params, batch_size=spec.batch_size, step=spec.step, steps=run_.steps,
                         prec=run_.prec, method=Method.ESTIMATED_RANKS, t0=t0, notes=notes,
                         checkpointed=ckpt, parallel=(ws, strat.name, r, peaks),
                         limit=limit.verdict, loop=run_.loop, paged=paged_bytes(_opt))
