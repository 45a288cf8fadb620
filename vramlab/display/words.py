"""Facts into words: the one place where a :mod:`vramlab.facts` value becomes a sentence, in the
user's language (:func:`vramlab.i18n.tr`). The catalog is keyed on each template below, never
on a formatted sentence, so a note that names a device or a count translates like any other.

Every other module asks here for words; none parses them back.
"""

from __future__ import annotations

from typing import Any

from ..facts import Advice, AdviceKind, MarkerKind, Note, NoteCode, Problem, Reason, Stop, StopReason
from ..i18n import N_, tr
from ..units import format_bytes

__all__ = ["ADVICE_TEMPLATES", "NOTE_TEMPLATES", "advice_text", "REASON_TEXTS", "marker_text", "note_dict", "note_text", "problem_text", "stop_text"]

#: Each note's English template; the fields are :class:`vramlab.facts.Note`'s (``why`` is its
#: problem in words).
NOTE_TEMPLATES: dict[NoteCode, str] = {
    NoteCode.HOST_PROC_UNREADABLE: N_("host memory: /proc could not be read ({detail}): read through psutil, "
                                      "without the cgroup limit"),
    NoteCode.CGROUP_LIMIT_UNREADABLE: N_("cgroup memory limit unreadable ({detail}): showing physical RAM"),
    NoteCode.CGROUP_LIMIT_UNREADABLE_PARENT: N_("cgroup memory limit unreadable ({detail}): showing the limit of "
                                                "{source}, which may be too high"),
    NoteCode.CGROUP_USAGE_UNREADABLE: N_("cgroup memory usage unreadable ({detail}): available memory is capped at "
                                         "the limit, and may be lower"),
    NoteCode.CGROUP_STAT_UNREADABLE: N_("cgroup memory.stat unreadable ({detail}): the cgroup's usage counts its "
                                        "inactive page cache"),
    NoteCode.NVML_UNAVAILABLE: N_("NVML unavailable: {why}"),
    NoteCode.NVML_NO_GPU: N_("NVML found no NVIDIA GPU"),
    NoteCode.NVML_READ_FAILED: N_("NVML read failed: {detail}"),
    NoteCode.NVML_DEVICE_UNREADABLE: N_("{device} cannot be read: {why}; it is left out of the figures"),
    NoteCode.UNIFIED_MEMORY: N_("{device}: NVML reports no separate memory (unified memory); showing host memory "
                                "instead"),
    NoteCode.TORCH_UNIMPORTABLE: N_("torch cannot be imported: {detail}"),
    NoteCode.TORCH_STATS_UNAVAILABLE: N_("torch {device} stats unavailable: {detail}"),
    NoteCode.PIDS_HIDDEN_SELF_UNLISTED: N_("{device}: NVML lists {count} process(es) whose PIDs this PID namespace "
                                           "cannot see (a container): their memory, this process's own if it has "
                                           "any, is shown as unattributed, not as other processes"),
    NoteCode.SELF_UNLISTED: N_("{device}: NVML does not list this process (a PID namespace?): context and other "
                               "processes are shown together as unattributed"),
    NoteCode.PIDS_HIDDEN: N_("{device}: NVML lists {count} process(es) whose PIDs this PID namespace cannot see: "
                             "their memory is shown as unattributed, not as other processes"),
    NoteCode.NO_PROCESS_MEMORY: N_("{device}: NVML gives no memory figure for this process (usedGpuMemory not "
                                   "available): what torch does not hold is shown as unattributed"),
    NoteCode.NO_NVML_MATCH: N_("{device}: no NVML device has torch's UUID {source}: allocator figures only"),
    NoteCode.ORDER_ASSUMED: N_("the cuda:i order is assumed to be PCI bus order: with CUDA_DEVICE_ORDER="
                               "FASTEST_FIRST (CUDA's default) these different GPUs ({source}) may be numbered "
                               "otherwise; set CUDA_DEVICE_ORDER=PCI_BUS_ID, or let torch initialise CUDA, for the "
                               "exact order"),
    NoteCode.CUDA_NOT_INITIALISED: N_("torch has not initialised CUDA: allocator figures are not read (no context "
                                      "is created)"),
    NoteCode.TORCH_NOT_IMPORTED: N_("torch is not imported: allocator figures are not read"),
    NoteCode.PROVIDER_FAILED: N_("device provider {source} failed: {detail}"),
}

#: Each reason in English; ``{detail}`` is the library's own words (``Reason.ERROR`` is its detail alone).
REASON_TEXTS: dict[Reason, str] = {
    Reason.NO_LIBRARY: N_("no NVML library (no NVIDIA driver installed)"),
    Reason.DRIVER_NOT_LOADED: N_("the NVIDIA driver is not loaded"),
    Reason.NO_PERMISSION: N_("no permission to talk to the NVIDIA driver"),
    Reason.GPU_LOST: N_("the GPU is lost (it fell off the bus or needs a reset)"),
    Reason.NO_MODULE: N_("the pynvml module cannot be imported ({detail})"),
}


def _say(message: str, english: bool, **fields: object) -> str:
    return message.format(**fields) if english else tr(message, **fields)


def problem_text(p: Problem, english: bool = False) -> str:
    """Why something cannot be read, in the current language (in English with ``english``)."""
    if p.reason is Reason.ERROR:
        return p.detail
    return _say(REASON_TEXTS[p.reason], english, detail=p.detail)


def note_text(n: Note, english: bool = False) -> str:
    """A note in the current language (in English with ``english``: for JSON and logs)."""
    why = problem_text(n.problem, english) if n.problem is not None else ""
    return _say(NOTE_TEMPLATES[n.code], english, device=n.device or "", count="?" if n.count is None else n.count,
                source=n.source, detail=n.detail, why=why)


def note_dict(n: Note) -> dict[str, Any]:
    """A note for JSON: its code and fields (:meth:`vramlab.facts.Note.to_dict`) and its ``text``
    in English (JSON is read by programs and searched for; the code is what they compare)."""
    return {**n.to_dict(), "text": note_text(n, english=True)}


def stop_text(s: Stop) -> str:
    """Why the sampler stopped, in the current language."""
    if s.reason is StopReason.UNLOADED:
        return tr("extension unloaded")
    if s.reason is StopReason.FAILED_READINGS:
        return tr("stopped after {n} failed readings: {error}", n=s.count, error=s.detail)
    return tr("stopped")


def marker_text(kind: MarkerKind, execution_count: Any) -> str:
    """A timeline marker's label (``[7]``, ``OOM in [7]``) in the current language."""
    n = "?" if execution_count is None else execution_count
    if kind is MarkerKind.OOM:
        return tr("OOM in [{n}]", n=n)
    return f"[{n}]"


#: Each remedy's English template; the fields are :class:`vramlab.facts.Advice`'s, sizes in words.
ADVICE_TEMPLATES: dict[AdviceKind, str] = {
    AdviceKind.BATCH_TWO_RUNS: N_(
        "batch size {bs} -> {seen} fits: this cell ran at batch {seen} (peak {peak}); the largest batch that "
        "fits is at most {upper}: at {bs} it needed at least {need}, and {budget} was available to it. A batch "
        "between them is not advised, because vramlab cannot check it without running the step: the caching "
        "allocator's rounding and fragmentation do not grow in proportion to the batch. "
        "vramlab.find_max_batch_size(step, start={seen}) runs each trial on a virtual card and finds the "
        "largest exactly"),
    AdviceKind.BATCH_THIS_CELL: N_(
        "batch size {bs} -> at most {fit}, an upper bound from this cell alone: it wanted at least {need} "
        "({per} per sample, as if all of it grew with the batch) and {budget} was available to it; what "
        "does not grow with the batch (weights, optimizer state) makes the true limit lower, so no batch is "
        "known to fit. Run the cell once at a smaller batch that fits and vramlab names it with a tighter "
        "bound; vramlab.find_max_batch_size finds the largest exactly"),
    AdviceKind.BATCH_HALVING: N_(
        "batch size {bs} -> try {half}, a first guess that vramlab has not checked: it did not measure this "
        "cell (%vram auto on, or %%vram, does), so only halving can be advised; vramlab.find_max_batch_size "
        "finds the largest batch that fits"),
    AdviceKind.SHRINK_REQUEST: N_("shrink what this step holds at once (the batch) to at most {pct}% of the failed "
                                  "request's size"),
    AdviceKind.FRAGMENTED: N_("{cached} is cached but fragmented: set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True "
                              "before torch starts (torch.cuda.empty_cache() does not help: the allocator already "
                              "frees its cache and retries before it raises)"),
    AdviceKind.MIXED_PRECISION: N_("mixed precision (torch.autocast with bf16/fp16) halves activation bytes"),
    AdviceKind.CHECKPOINTING: N_("gradient checkpointing (torch.utils.checkpoint) trades recompute for activations"),
    AdviceKind.OFFLOAD: N_("offload activations (torch.autograd.graph.save_on_cpu) or optimizer state to host RAM"),
}


def _size(n: Any) -> str:
    return format_bytes(n) if n is not None else "?"


def advice_text(a: Advice) -> str:
    """A remedy in the current language, with its figures (sizes in IEC units)."""
    per = _size(a.need / a.batch) if a.need is not None and a.batch else "?"
    return tr(ADVICE_TEMPLATES[a.kind], bs=a.batch, seen=a.to, half=a.to, fit=a.upper, upper=a.upper,
              peak=_size(a.peak), need=_size(a.need), per=per, budget=_size(a.budget), cached=_size(a.cached),
              pct=f"{100.0 * a.share:.0f}" if a.share is not None else "?")
