"""The anatomy of a training step: what the device holds after each phase, and why.

:func:`trace_step` runs training steps on a lesson device (:func:`vramlab.pick_device`)
phase by phase (forward, backward, optimizer step, ``zero_grad``) and, after each phase,
splits what is allocated into

- ``parameters``: the unique storages of the model's parameters;
- ``gradients``: of their ``.grad`` tensors;
- ``optimizer_state``: of the tensors in ``optimizer.state`` (Adam's moments, ...);
- ``activations``: everything else: the batch, the tensors autograd saved for backward,
  the outputs and the loss, the autocast weight copies and temporaries.

The split is computed from the objects themselves, so it is the same on a CUDA GPU and on
the virtual GPU; each phase also records its peak (``dev.measure()``). Sizes are in bytes,
rounded to the 512-byte blocks of CUDA's allocator where the device rounds (CUDA, and the
virtual GPU with ``round_blocks``), so that the parts add up to ``dev.allocated()``.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Optional

from ..i18n import tr
from ..units import format_bytes

__all__ = ["PARTS", "Phase", "Anatomy", "trace_step", "storage_bytes"]

#: The parts of a phase, in display order.
PARTS: tuple[str, ...] = ("parameters", "gradients", "optimizer_state", "activations")

_BLOCK = 512


def storage_bytes(tensors: Iterable[Any], round_blocks: bool = False) -> int:
    """Bytes of the unique storages of ``tensors`` (``None`` entries and non-tensors skipped),
    each rounded up to 512 bytes when ``round_blocks``."""
    import torch

    seen: dict[int, int] = {}
    for t in tensors:
        if not isinstance(t, torch.Tensor):
            continue
        st = t.untyped_storage()
        n = st.nbytes()
        if round_blocks and n:
            n = -(-n // _BLOCK) * _BLOCK
        seen[st.data_ptr() or id(st)] = n
    return sum(seen.values())


@dataclass(frozen=True)
class Phase:
    """One phase of one step. Sizes in bytes.

    Attributes:
        step: the step's number, from 1.
        name: ``"forward"``, ``"backward"``, ``"optimizer step"`` or ``"zero_grad"``.
        allocated: bytes allocated on the device at the end of the phase.
        peak: the highest bytes allocated during the phase.
        parts: ``allocated`` split into :data:`PARTS` (they add up to it).
    """

    step: int
    name: str
    allocated: int
    peak: int
    parts: dict[str, int]


@dataclass(frozen=True)
class Anatomy:
    """The phases of :func:`trace_step`. Sizes in bytes.

    Attributes:
        phases: every phase of every step, in order; ``phases[0]`` is ``"model"``, the state
            before the first step.
        parameters: the number of parameter elements (shared ones once).
        trainable: how many of them require gradients.
        device: the device's description.
    """

    phases: tuple[Phase, ...]
    parameters: int
    trainable: int
    device: str

    @property
    def peak(self) -> int:
        """The highest bytes allocated over all the phases."""
        return max(p.peak for p in self.phases)

    def phase(self, name: str, step: Optional[int] = None) -> Phase:
        """The phase called ``name`` of ``step`` (default: the last step that has it)."""
        found = [p for p in self.phases if p.name == name and (step is None or p.step == step)]
        if not found:
            raise KeyError(f"no phase {name!r}" + (f" in step {step}" if step is not None else ""))
        return found[-1]

    def bytes_per_parameter(self) -> dict[str, float]:
        """Bytes per parameter (of all parameters) of weights, gradients (after the last
        backward) and optimizer state (after the last optimizer step), and their total."""
        n = max(self.parameters, 1)
        out = {"weights": self.phase("backward").parts["parameters"] / n,
               "gradients": self.phase("backward").parts["gradients"] / n,
               "optimizer_state": self.phase("optimizer step").parts["optimizer_state"] / n}
        out["total"] = sum(out.values())
        return out

    def table(self) -> list[dict[str, Any]]:
        """One row per phase: step, phase, allocated, peak and the parts (bytes)."""
        return [{"step": p.step, "phase": p.name, "allocated": p.allocated, "peak": p.peak, **p.parts}
                for p in self.phases]

    def text(self) -> str:
        """A plain-text table of the phases (its words in the current language, :func:`vramlab.i18n.tr`)."""
        names = [_phase_label(p.name) for p in self.phases]
        step = tr("step")
        ws = max(4, len(step))  # the columns widen to fit the words of the current language
        wp = max([15, *(len(n) for n in names)])
        heads = _part_headers()
        head = (f"  {step:>{ws}}  {tr('phase'):<{wp}}" + "".join(f"{heads[k][:15]:>16}" for k in PARTS)
                + f"{tr('allocated'):>12}{tr('peak'):>12}")
        lines = [tr("training-step anatomy on {device}: {parameters:,} parameters ({trainable:,} trainable)",
                    device=self.device, parameters=self.parameters, trainable=self.trainable), head]
        for p, name in zip(self.phases, names):
            lines.append(f"  {p.step:>{ws}}  {name:<{wp}}" + "".join(f"{format_bytes(p.parts[k]):>16}" for k in PARTS)
                         + f"{format_bytes(p.allocated):>12}{format_bytes(p.peak):>12}")
        return "\n".join(lines)

    def __repr__(self) -> str:
        return f"<vramlab.Anatomy {len(self.phases)} phases, peak {format_bytes(self.peak)}>"

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, str]:
        return {"text/plain": self.text()}

    def plot(self, ax: Any = None) -> Any:
        """Stacked bars of the parts after each phase, with each phase's peak marked (MiB)."""
        import matplotlib.pyplot as plt

        if ax is None:
            _, ax = plt.subplots(figsize=(8, 3))
        colors = {"parameters": "#4e79a7", "gradients": "#f28e2b", "optimizer_state": "#59a14f",
                  "activations": "#e15759"}
        x = range(len(self.phases))
        bottom = [0.0] * len(self.phases)
        labels = _part_labels()
        for k in PARTS:
            vals = [p.parts[k] / 2**20 for p in self.phases]
            ax.bar(x, vals, bottom=bottom, color=colors[k], label=labels[k])
            bottom = [b + v for b, v in zip(bottom, vals)]
        ax.scatter(list(x), [p.peak / 2**20 for p in self.phases], marker="_", s=300, color="k", zorder=3,
                   label=tr("peak during the phase"))
        ax.set_xticks(list(x), [f"{p.step}: {_phase_label(p.name)}" if p.step else _phase_label(p.name)
                                for p in self.phases], rotation=30, ha="right", fontsize=8)
        ax.set_ylabel(tr("MiB on the device"))
        ax.legend(fontsize=7, loc="upper left")
        return ax


def _phase_label(name: str) -> str:
    """A phase's name as a learner reads it, in the current language (:func:`vramlab.i18n.tr`).

    ``forward``, ``backward`` and ``zero_grad`` keep their names (the first two are the words
    the Portuguese edition uses too, the last is torch's method); :attr:`Phase.name` itself stays
    English, since :meth:`Anatomy.phase` looks phases up by it."""
    return {"model": tr("model"), "optimizer step": tr("optimizer step")}.get(name, name)


def _part_labels() -> dict[str, str]:
    """The parts' names in words, for a figure's legend."""
    return {"parameters": tr("parameters"), "gradients": tr("gradients"), "optimizer_state": tr("optimizer state"),
            "activations": tr("activations")}


def _part_headers() -> dict[str, str]:
    """The parts' column headers of :meth:`Anatomy.text` (at most 15 characters)."""
    return {"parameters": tr("parameters"), "gradients": tr("gradients"), "optimizer_state": tr("optimizer_state"),
            "activations": tr("activations")}


def _rounds(dev: Any) -> bool:
    if getattr(dev, "is_cuda", False):
        return True
    virtual = getattr(dev, "virtual", None)
    return bool(getattr(virtual, "round_blocks", False))


def _split(dev: Any, model: Any, opt: Any) -> tuple[int, dict[str, int]]:
    rb = _rounds(dev)
    params = list(model.parameters())
    state: list[Any] = []
    if opt is not None:
        for s in opt.state.values():
            state.extend(v for v in s.values())
    parts = {"parameters": storage_bytes(params, rb),
             "gradients": storage_bytes((p.grad for p in params), rb),
             "optimizer_state": storage_bytes(state, rb)}
    allocated = dev.allocated()
    parts["activations"] = max(allocated - sum(parts.values()), 0)
    return allocated, parts


def _default_loss(out: Any, *targets: Any) -> Any:
    import torch.nn.functional as F

    if targets:
        return F.cross_entropy(out.flatten(0, -2) if out.dim() > 2 else out, targets[0].flatten())
    return out.float().sum() if out.numel() > 1 else out


def trace_step(dev: Any, model: Any, make_batch: Callable[[], Any], optimizer: Any, *,
               loss_fn: Optional[Callable[..., Any]] = None, steps: int = 2,
               autocast_dtype: Optional[Any] = None) -> Anatomy:
    """Run ``steps`` training steps phase by phase and record each phase (see module docs).

    Args:
        dev: the lesson device (``vramlab.pick_device()``); ``model`` must be on it already
            (``dev.put(model)``).
        make_batch: ``make_batch()`` returns ``(inputs, *targets)`` on the device, or a tensor.
            It is called inside the forward phase, so the batch is counted there. The model's
            output is passed to ``loss_fn`` and not kept (a loop that keeps it, to compute an
            accuracy say, holds it through backward too).
        optimizer: an optimizer over the model's trainable parameters (``None``: no step).
        loss_fn: ``loss_fn(output, *targets)``; default cross-entropy with targets, else the
            output's sum.
        steps: how many steps (the first creates the optimizer state; the second shows the
            steady state).
        autocast_dtype: run the forward under ``torch.autocast`` with this dtype.

    Returns:
        An :class:`Anatomy`.
    """
    import torch

    if steps < 1:
        raise ValueError(f"steps must be >= 1; got {steps}")
    loss_fn = loss_fn or _default_loss
    device_type = "cuda" if getattr(dev, "is_cuda", False) else "cpu"
    phases: list[Phase] = []
    alloc, parts = _split(dev, model, optimizer)
    phases.append(Phase(0, "model", alloc, alloc, parts))

    def record(step: int, name: str, m: Any) -> None:
        a, p = _split(dev, model, optimizer)
        phases.append(Phase(step, name, a, max(m.peak, a), p))

    for step in range(1, steps + 1):
        with dev.measure() as m:
            batch = make_batch()
            inputs, targets = (batch[0], tuple(batch[1:])) if isinstance(batch, (tuple, list)) else (batch, ())
            ctx = (torch.autocast(device_type, dtype=autocast_dtype) if autocast_dtype is not None
                   else contextlib.nullcontext())
            with ctx:  # the output is not kept: only the loss (and what autograd saved) lives on
                loss = loss_fn(model(inputs), *targets)
        record(step, "forward", m)
        with dev.measure() as m:
            loss.backward()
        del loss
        record(step, "backward", m)
        if optimizer is not None:
            with dev.measure() as m:
                optimizer.step()
            record(step, "optimizer step", m)
            with dev.measure() as m:
                optimizer.zero_grad(set_to_none=True)
        else:
            with dev.measure() as m:
                model.zero_grad(set_to_none=True)
        del batch, inputs, targets
        record(step, "zero_grad", m)
    params = {id(p): p for p in model.parameters()}
    return Anatomy(phases=tuple(phases), parameters=sum(p.numel() for p in params.values()),
                   trainable=sum(p.numel() for p in params.values() if p.requires_grad),
                   device=str(getattr(dev, "name", dev)))
