"""Facts that cross vramlab's layers as values, never as sentences. A leaf: it imports nothing
from vramlab.

The probes, the reconciler and the runtime say what they found with these types: a
:class:`Note` (a :class:`NoteCode` with the device it concerns and the figures it names), a
:class:`Problem` (why something cannot be read), a :class:`Stop` (why the sampler stopped) and a
:class:`MarkerKind`. Words are made from them once, at the display edge
(:mod:`vramlab.display.words`), in the user's language; the catalog is keyed on each code's
template, never on a formatted sentence. ``detail`` fields carry what a library below said (an
exception's message, a file's error) exactly as it came: they are shown, not translated.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Optional

__all__ = ["Advice", "AdviceKind", "Category", "Method", "MarkerKind", "Note", "NoteCode", "Problem", "Reason", "Stop", "StopReason"]


class Reason(StrEnum):
    """Why NVML, or one device through it, cannot be read."""

    NO_LIBRARY = "no-library"  #: no NVML library: no NVIDIA driver installed
    DRIVER_NOT_LOADED = "driver-not-loaded"
    NO_PERMISSION = "no-permission"
    GPU_LOST = "gpu-lost"  #: fell off the bus or needs a reset
    NO_MODULE = "no-module"  #: the ``pynvml`` module cannot be imported (detail: the ImportError)
    ERROR = "error"  #: another error; ``detail`` says which


@dataclass(frozen=True)
class Problem:
    """Why something cannot be read: a :class:`Reason`, and the library's own words (``detail``,
    empty for the reasons that need none)."""

    reason: Reason
    detail: str = ""


class NoteCode(StrEnum):
    """What a snapshot's note says. Each code's English template is in
    :data:`vramlab.display.words.NOTE_TEMPLATES`, with the fields it names."""

    HOST_PROC_UNREADABLE = "host-proc-unreadable"  #: detail
    CGROUP_LIMIT_UNREADABLE = "cgroup-limit-unreadable"  #: detail; physical RAM shown
    CGROUP_LIMIT_UNREADABLE_PARENT = "cgroup-limit-unreadable-parent"  #: detail, source: a parent's limit shown
    CGROUP_USAGE_UNREADABLE = "cgroup-usage-unreadable"  #: detail
    CGROUP_STAT_UNREADABLE = "cgroup-stat-unreadable"  #: detail
    NVML_UNAVAILABLE = "nvml-unavailable"  #: problem
    NVML_NO_GPU = "nvml-no-gpu"
    NVML_READ_FAILED = "nvml-read-failed"  #: detail
    NVML_DEVICE_UNREADABLE = "nvml-device-unreadable"  #: device (``nvml:I`` or ``nvml:I.M``), problem
    UNIFIED_MEMORY = "unified-memory"  #: device (the GPU's name)
    TORCH_UNIMPORTABLE = "torch-unimportable"  #: detail
    TORCH_STATS_UNAVAILABLE = "torch-stats-unavailable"  #: device (``cuda:0``, ``mps``), detail
    PIDS_HIDDEN_SELF_UNLISTED = "pids-hidden-self-unlisted"  #: device, count
    SELF_UNLISTED = "self-unlisted"  #: device
    PIDS_HIDDEN = "pids-hidden"  #: device, count
    NO_PROCESS_MEMORY = "no-process-memory"  #: device
    NO_NVML_MATCH = "no-nvml-match"  #: device, source (torch's UUID)
    ORDER_ASSUMED = "order-assumed"  #: source (the GPUs' names, comma-separated)
    CUDA_NOT_INITIALISED = "cuda-not-initialised"
    TORCH_NOT_IMPORTED = "torch-not-imported"
    PROVIDER_FAILED = "provider-failed"  #: source (the provider's name), detail


@dataclass(frozen=True)
class Note:
    """One thing a reading could not read, or reads with a caveat.

    Attributes:
        code: what it says.
        device: the device it concerns (an id such as ``cuda:0`` or ``nvml:1``), or ``None``.
        count: the number it names (processes), or ``None``.
        source: the name it names (a cgroup, a UUID, GPU names, a provider), or ``""``.
        detail: what the layer below said (an error's text), shown as it came, or ``""``.
        problem: why something cannot be read, for the NVML codes, or ``None``.
    """

    code: NoteCode
    device: Optional[str] = None
    count: Optional[int] = None
    source: str = ""
    detail: str = ""
    problem: Optional[Problem] = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe: the code and the fields that are set (the display adds ``text``)."""
        d: dict[str, Any] = {"code": self.code.value}
        for k in ("device", "count", "source", "detail"):
            v = getattr(self, k)
            if v not in (None, ""):
                d[k] = v
        if self.problem is not None:
            d["reason"] = self.problem.reason.value
            if self.problem.detail:
                d["reason_detail"] = self.problem.detail
        return d


class StopReason(StrEnum):
    """Why the sampler stopped."""

    STOPPED = "stopped"  #: asked to (``%vram stop``, the end of a ``with`` block)
    UNLOADED = "unloaded"  #: the extension was unloaded
    FAILED_READINGS = "failed-readings"  #: too many readings in a row failed


@dataclass(frozen=True)
class Stop:
    """Why the sampler stopped: the reason, how many readings failed in a row, and the last
    error as ``where: Type: message`` (``FAILED_READINGS`` only)."""

    reason: StopReason
    count: int = 0
    detail: str = ""


class MarkerKind(StrEnum):
    """A point on the timeline."""

    CELL = "cell"  #: a cell started
    OOM = "oom"  #: a cell ran out of memory


class AdviceKind(StrEnum):
    """One remedy the out-of-memory explainer advises, most specific first."""

    BATCH_TWO_RUNS = "batch-two-runs"  #: ``batch`` -> ``to`` fits: the cell ran at ``to`` (peak ``peak``)
    BATCH_THIS_CELL = "batch-this-cell"  #: ``batch`` -> at most ``upper``, from the failed cell alone
    BATCH_HALVING = "batch-halving"  #: ``batch`` -> ``to`` (half), unchecked: the cell was not measured
    SHRINK_REQUEST = "shrink-request"  #: hold at most ``share`` of the failed request at once
    FRAGMENTED = "fragmented"  #: ``cached`` bytes cached but fragmented: expandable segments
    MIXED_PRECISION = "mixed-precision"
    CHECKPOINTING = "checkpointing"
    OFFLOAD = "offload"


@dataclass(frozen=True)
class Advice:
    """A remedy as data: its kind and the figures it names (sizes in bytes; ``share`` a fraction).

    Attributes:
        kind: which remedy.
        batch: the batch the cell failed at.
        to: the batch advised (one that ran, for ``BATCH_TWO_RUNS``; half, for ``BATCH_HALVING``).
        upper: an upper bound of the largest batch that fits.
        peak: the peak of the run at ``to``, in bytes.
        need: what the failed cell wanted at least, in bytes.
        budget: what was available to it, in bytes.
        cached: the fragmented cache, in bytes.
        share: the fraction of the failed request that fits in free memory.
    """

    kind: AdviceKind
    batch: Optional[int] = None
    to: Optional[int] = None
    upper: Optional[int] = None
    peak: Optional[int] = None
    need: Optional[int] = None
    budget: Optional[int] = None
    cached: Optional[int] = None
    share: Optional[float] = None


class Method(StrEnum):
    """How a step's memory was found (:attr:`Estimate.method <vramlab.sim.estimate.Estimate>`)."""

    ESTIMATED = "estimated"  #: run on fake tensors (torch's FakeTensorMode)
    ESTIMATED_RANKS = "estimated-ranks"  #: on fake tensors, with a fake process group per rank
    MEASURED = "measured"  #: really run in a VirtualGPU


class Category(StrEnum):
    """What a byte of a step is (the simulator's books, :attr:`Estimate.breakdown`)."""

    PARAMETERS = "parameters"
    BUFFERS = "buffers"
    GRADIENTS = "gradients"
    OPTIMIZER_STATE = "optimizer_state"
    ACTIVATIONS = "activations"  #: saved for backward
    OTHER = "other"  #: temporaries, workspaces, what no other category owns
