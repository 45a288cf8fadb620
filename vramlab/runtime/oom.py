"""Out-of-memory explainer and recovery.

:func:`explain_oom` turns a ``torch.OutOfMemoryError`` (CUDA, or the virtual GPU) into
what a person needs to act: what was requested, what was free, what is reserved but
unallocated (fragmentation), the largest live consumers, and suggestions ranked by
those numbers. A batch size that fits is derived when vramlab recorded the same cell at a
smaller batch that fitted (two runs of one cell give a line, memory against batch); with
the failed cell's record alone, only an upper bound; without it, halving is advised. :func:`free_last_error` drops what the last traceback keeps alive and
returns the memory to the device and the host.

Sizes are in bytes.
"""

from __future__ import annotations

import gc
import re
import sys
from typing import Any, Iterable, NamedTuple, Optional

from ..facts import Advice, AdviceKind
from ..i18n import tr
from ..model import CellRecord, Consumer, FreedDevice, FreedReport, OOMExplanation
from ..reconcile import empty_provider_caches, snapshot
from ..units import parse_size
from .cells import batch_size_in
from .holders import holders, release

__all__ = ["OOMExplanation", "FreedReport", "is_oom", "drop_traceback", "parse_oom_message", "explain_oom",
           "free_last_error"]

_SIZE = r"([0-9.]+\s*(?:bytes|B|KiB|MiB|GiB|TiB|PiB|KB|MB|GB|TB))"
_PATTERNS = {
    "requested": re.compile(r"Tried to allocate " + _SIZE, re.I),
    "total": re.compile(r"total capacity of " + _SIZE, re.I),
    "free": re.compile(r"of which " + _SIZE + r" is free", re.I),
    "torch_allocated": re.compile(r"Of the allocated memory " + _SIZE + r" is allocated by PyTorch", re.I),
    "reserved_unallocated": re.compile(_SIZE + r" is reserved by PyTorch but unallocated", re.I),
    "process_in_use": re.compile(r"(?:Process \d+|Including non-PyTorch memory, this process) has " + _SIZE
                                 + r" memory in use", re.I),
}
_GPU_INDEX = re.compile(r"GPU (\d+) has a total capacity", re.I)


def is_oom(exc: Optional[BaseException]) -> bool:
    """Whether ``exc`` is a device out-of-memory error, without importing torch.

    ``torch.OutOfMemoryError`` (CUDA's caching allocator and the virtual GPU), or a
    ``RuntimeError`` whose message says ``out of memory`` (HIP, XPU, MPS, and CUDA errors
    raised outside the caching allocator, such as ``CUDA error: out of memory``).
    """
    if exc is None:
        return False
    for cls in type(exc).__mro__:
        if cls.__name__ == "OutOfMemoryError" and cls.__module__.startswith("torch"):
            return True
    return isinstance(exc, RuntimeError) and "out of memory" in str(exc).lower()


def drop_traceback(exc: Optional[BaseException]) -> list[str]:
    """Release what a caught exception keeps alive: clear the locals of every frame in its
    traceback and in those of its chained exceptions (``__cause__``/``__context__``), then
    detach the tracebacks, so that the tensors of a failed step can be freed.

    Returns one ``"frames of <type>"`` entry (in the current language) per exception whose frames were cleared
    (a frame that is still executing cannot be cleared and is left alone).
    """
    cleared: list[str] = []
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if _clear_frames(exc.__traceback__):
            cleared.append(tr("frames of {exception}", exception=type(exc).__name__))
        exc.__traceback__ = None
        exc = exc.__cause__ or exc.__context__
    return cleared


def _clear_frames(tb: Any) -> int:
    """Clear the frames of one traceback; returns how many could be cleared."""
    n = 0
    while tb is not None:
        try:
            tb.tb_frame.clear()
            n += 1
        except RuntimeError:
            pass  # a frame still executing
        tb = tb.tb_next
    return n


def parse_oom_message(message: str) -> dict[str, Optional[int]]:
    """Read the figures out of a CUDA-style OOM message (bytes; ``None`` where absent)."""
    out: dict[str, Optional[int]] = {}
    for key, pat in _PATTERNS.items():
        m = pat.search(message)
        value: Optional[int] = None
        if m:
            try:
                value = parse_size(m.group(1).replace("bytes", "B"))
            except ValueError:
                value = None
        out[key] = value
    g = _GPU_INDEX.search(message)
    out["gpu_index"] = int(g.group(1)) if g else None
    return out


def _live_consumers(ns: Optional[dict[str, Any]], limit: int = 5) -> list[Consumer]:
    """The largest holders of tensors named in ``ns`` (:func:`vramlab.runtime.holders.holders`:
    tensors, modules, optimizer state, autograd graphs, cached outputs)."""
    return holders(ns)[:limit]


class _FailedRun(NamedTuple):
    """The failed cell on one device, in bytes above what was allocated when the cell began."""

    device: str  #: the record's device id
    peak: int  #: the cell's measured peak (its allocation during the cell)
    need: int  #: a lower bound of what the cell needed at its batch
    budget_lo: int  #: a lower bound of what the device could give the cell, its fragmented cache left out
    budget_hi: int  #: an upper bound of the same
    cached: int  #: the fragmented cache: usable only once given back (``torch.cuda.empty_cache()``)


def _failed_run(record: CellRecord, f: dict[str, Optional[int]], requested: int, free: int) -> Optional[_FailedRun]:
    """What the failed cell's record and the OOM message say about what it needed and had.

    ``held`` is what the cell held when the request failed; what the device could give it is
    ``held + free``. The message states torch's allocation at that moment: less the
    allocation at the cell's start (the record's) it is ``held`` exactly. Without it (or when
    the two disagree: another device's message), the peak is at least ``held``, and the
    allocation at the cell's end, which the traceback keeps alive, at most ``held`` (nothing is
    allocated after the failure). The fragmented cache is not counted: it could not serve the
    request.
    """
    devs = [d for d in record.devices if d.peak_allocated_delta is not None]
    if not devs:
        return None
    d = max(devs, key=lambda x: x.peak_allocated_delta or 0)
    peak = max(d.peak_allocated_delta or 0, 0)
    torch_allocated = f.get("torch_allocated")
    exact = None
    if torch_allocated is not None and d.allocated_start is not None:
        exact = torch_allocated - d.allocated_start
        if not 0 <= exact <= peak:
            exact = None
    if exact is not None:
        held_lo = held_hi = exact
    else:
        held_hi = peak
        held_lo = min(max(d.allocated_delta or 0, 0), peak)
    # the peak was held at once, and so were ``held`` and the request: both bound the need below.
    # (The peak plus the request is not a bound: the peak may have come earlier, then been freed.)
    need = max(peak, held_lo + requested)
    return _FailedRun(d.id, peak, need, held_lo + free, held_hi + free, max(f.get("reserved_unallocated") or 0, 0))


class _TwoRuns(NamedTuple):
    """A batch derived from a successful run of the same cell and the failed one."""

    fit: int  #: a batch that fits
    line: int  #: where the line through the two runs meets the budget: an estimate of the largest batch
    upper: int  #: at least the largest batch that fits
    seen: int  #: the successful run's batch
    peak: int  #: its peak, bytes above its start


def _from_two_runs(failed: _FailedRun, bs: int, seen: int, peak: int) -> Optional[_TwoRuns]:
    """A batch that fits, from a run of the same cell at ``seen < bs`` that fitted with a peak
    of ``peak`` bytes, and the failed run at ``bs``; ``None`` when none can be shown to fit.

    The model: the cell needs ``D(b) = fixed + k * b`` bytes above what it began with, the same
    in both runs, ``fixed >= 0`` (weights, optimizer state, workspaces the cell makes) and
    ``k >= 0`` (activations). What is known:

    - ``D(seen) = peak``, measured;
    - ``D(bs) >= need``, only a lower bound: the cell stopped at the failed request and never
      allocated the rest of its step.

    **The line through the two observations is not safe.** Its slope ``k_lo = (need - peak) /
    (bs - seen)`` is at most ``k``, so for every ``b > seen`` the line lies at or *below* the true
    cost, and the batch where it meets the budget, ``seen + (budget - peak) / k_lo`` (``line``),
    is not a batch known to fit: for a straight-line step it is an upper bound of the largest.
    For a step whose peak moves (from the optimizer step at a small batch to the backward pass
    at a large one) it is neither: the cost then bends upwards, and the line through two of its
    points lies above it in between. It is kept as an estimate, between ``fit`` and ``upper``,
    and not advised.

    **A slope that is at least ``k`` comes from the successful run alone**: ``fixed >= 0`` gives
    ``k <= peak / seen``, as if all of its peak grew with the batch. For ``b >= seen``,
    ``D(b) = peak + k * (b - seen) <= peak * b / seen``, so ``fit = floor(seen * budget / peak)``
    fits whenever ``budget >= peak``. This holds beyond the straight line: a step whose
    allocation at every moment is some ``fixed_t + k_t * b`` with both parts >= 0 (the peak of
    a small batch in the optimizer step, of a large one in the backward pass) has
    ``fixed_t + k_t * b <= (fixed_t + k_t * seen) * b / seen <= peak * b / seen`` at every moment.
    It is the largest batch that can be shown to fit: a step whose whole peak grows with the
    batch (``fixed = 0``) meets both observations and does not fit one more.

    **That proof is about allocated bytes, not about a card.** The caching allocator rounds
    each request to blocks, takes segments of 2 or 20 MiB (or the request rounded to 2 MiB) and
    splits them; what it reserves, and how its cache fragments, is not in proportion to the
    batch. A batch derived this way has run out of memory from an empty card (this round's
    newcomer review: a CNN on a 4 GiB card, where the rule gave 1180 and the largest batch that
    runs is 1148). So ``fit`` is not advised:
    :func:`explain_oom` advises ``seen``, which ran, and gives ``upper`` as the bound.

    When the budget is below the successful run's peak (the device has less room than that run
    used), a smaller batch would need a lower bound of the slope below ``seen``, and ``k_lo``
    is not one once the step is not one straight line; nothing is derived (``None``). Neither
    when the two observations contradict the model (``k_lo > peak / seen``: the cost grows
    faster than in proportion to the batch, or the cell freed memory it began with).

    ``upper`` holds for that same model: at every moment ``fixed_t + k_t * b >= (fixed_t + k_t *
    bs) * b / bs`` for ``b <= bs``, so a batch ``b`` that fits has ``need * b / bs <= budget``.

    The suggested batch uses the budget without the fragmented cache (``budget_lo``); the upper
    bound counts the cache as given back. Rounding to the allocator's 512-byte blocks and its
    segments is not in the model: a fit derived from the peak keeps
    ``fixed * (fit / seen - 1)`` bytes to spare for it, and ``%vram free`` (with
    ``torch.cuda.empty_cache()``) before the next run gives the cache back.
    """
    if not 0 < seen < bs or peak <= 0 or failed.budget_lo < peak:
        return None
    rise, run = failed.need - peak, bs - seen  # k_lo = rise / run, a lower bound of the slope
    if rise * seen > peak * run:  # k_lo > peak / seen: fixed < 0, the model does not hold
        return None
    fit = (seen * failed.budget_lo) // peak  # the slope peak / seen, at least the true one: it fits
    upper = min((bs * (failed.budget_hi + failed.cached)) // failed.need, bs - 1)
    if fit < 1 or fit > upper:  # fit >= bs: the model says bs fits, and it did not
        return None
    # fixed + k_lo * b = budget: an estimate, not a bound (the failed run's need is only a lower bound)
    line = seen + ((failed.budget_lo - peak) * run) // rise if rise > 0 else upper
    return _TwoRuns(fit, min(max(line, fit), upper), upper, seen, peak)


def _earlier_runs(record: CellRecord, history: Iterable[CellRecord], device: str, bs: int) -> list[tuple[int, int]]:
    """``(batch, peak)`` of the runs of the same cell in ``history`` that fitted at a smaller
    batch, with a measured peak on ``device`` (bytes above the cell's start)."""
    out = []
    for r in history:
        if (r is record or r.error is not None or r.cell_key is None or r.cell_key != record.cell_key
                or r.batch_size is None or not 0 < r.batch_size < bs):
            continue
        for d in r.devices:
            if d.id == device and d.peak_allocated_delta is not None and d.peak_allocated_delta > 0:
                out.append((r.batch_size, d.peak_allocated_delta))
    return out


def explain_oom(exc: BaseException, user_ns: Optional[dict[str, Any]] = None,
                record: Optional[CellRecord] = None,
                history: Optional[Iterable[CellRecord]] = None) -> OOMExplanation:
    """Explain an out-of-memory error.

    Args:
        exc: the exception.
        user_ns: the namespace to search for live tensors, modules, optimizers and a
            batch size variable (``batch_size``, ``bs``, ``batch``).
        record: the cell's :class:`~vramlab.model.CellRecord`, when one was taken: its
            allocation during the cell gives the measured per-sample cost.
        history: earlier cell records (default: this kernel's, ``vramlab.history().cells``).
            A run of the same cell (the same :attr:`~vramlab.model.CellRecord.cell_key`) at
            a smaller batch that fitted gives a batch that fits.

    The batch advice, best first (:attr:`~vramlab.model.OOMExplanation.batch_basis`):

    - ``"two runs"``: the same cell fitted at a smaller batch: the largest such batch is the one
      advised (it ran), the failed run gives an upper bound of the largest, and the line
      ``fixed + k * batch`` (bytes) through the two an estimate of it (``batch_estimate``, not
      advised: :func:`_from_two_runs` says why no batch between them is known to fit);
    - ``"this cell"``: only the failed cell's record: ``bs * budget // need``, an upper bound;
      no batch is advised as one that fits;
    - ``"halving"``: the cell was not measured: half the batch, as an unchecked first try.
    """
    msg = str(exc)
    f = parse_oom_message(msg)
    requested, free, frag = f["requested"], f["free"], f["reserved_unallocated"]
    # What torch reserved but has not allocated could not serve the request: the allocator
    # tries its cached blocks first and releases the wholly free ones before it gives up, so
    # what is left sits in split blocks (segments that still hold live tensors), none large
    # enough. It is not usable; it is fragmentation.
    shortfall = None
    frag_cause = False
    if requested is not None and free is not None:
        shortfall = max(requested - free, 0)
        frag_cause = bool(frag) and free + (frag or 0) >= requested
    consumers = tuple(_live_consumers(user_ns))
    bs = batch_size_in(user_ns)
    if bs is None and record is not None:
        bs = record.batch_size
    fit_bs = upper = seen = estimate = None
    basis = None
    suggestions: list[Advice] = []
    failed = (_failed_run(record, f, requested, free)
              if record is not None and requested is not None and free is not None else None)
    two: Optional[_TwoRuns] = None
    if bs is not None and failed is not None and record is not None and record.cell_key is not None:
        if history is None:
            from .records import get_recorder

            history = tuple(get_recorder().history)
        found = [t for b1, p1 in _earlier_runs(record, history, failed.device, bs)
                 if (t := _from_two_runs(failed, bs, b1, p1)) is not None]
        if found:
            # every run that fitted gives a batch that fits and an upper bound: the largest of the
            # former fits, and the smallest of the latter bounds the largest batch
            two = max(found, key=lambda t: t.seen)
            two = two._replace(upper=min(t.upper for t in found))
            two = two._replace(line=min(two.line, two.upper))
    if bs is not None and failed is not None and two is not None:
        # Only a batch that ran is advised as one that fits: the proportional rule of
        # _from_two_runs holds for the bytes the cell allocates, not for what the caching
        # allocator reserves around them (block rounding, segments, fragmentation are not in
        # proportion to the batch), and vramlab cannot rerun the cell to check a batch between.
        fit_bs, upper, seen, estimate, basis = two.seen, two.upper, two.seen, two.line, "two runs"
        suggestions.append(Advice(AdviceKind.BATCH_TWO_RUNS, batch=bs, to=seen, upper=upper, peak=two.peak,
                                  need=failed.need, budget=failed.budget_lo))
    elif bs is not None and failed is not None:
        # the cell's own growth is known: it wanted at least ``need`` and had at most ``budget_hi``.
        # If memory grew in proportion to the batch, bs * budget / need would be the limit; whatever
        # does not grow with the batch makes the true limit lower, so it is an upper bound, and no
        # batch is known to fit.
        upper = min(max(int(bs * failed.budget_hi // failed.need), 0), bs - 1)
        basis = "this cell"
        suggestions.append(Advice(AdviceKind.BATCH_THIS_CELL, batch=bs, upper=upper, need=failed.need,
                                  budget=failed.budget_hi))
    elif bs is not None and bs > 1:
        # without the cell's own measurement, the failed request says nothing about the rest of
        # the step: no batch can be derived, only halving tried
        basis = "halving"
        upper = bs - 1
        suggestions.append(Advice(AdviceKind.BATCH_HALVING, batch=bs, to=bs // 2))
    elif requested is not None and free is not None and requested > 0:
        suggestions.append(Advice(AdviceKind.SHRINK_REQUEST, share=free / requested))
    if frag and requested and (frag_cause or frag >= 0.5 * requested):
        # when free memory and the cache together could hold the request, fragmentation is the cause
        at = 0 if frag_cause else len(suggestions)
        suggestions.insert(at, Advice(AdviceKind.FRAGMENTED, cached=frag))
    suggestions.extend(Advice(k) for k in (AdviceKind.MIXED_PRECISION, AdviceKind.CHECKPOINTING, AdviceKind.OFFLOAD))
    return OOMExplanation(message=msg, requested=requested, total=f["total"], free=free, reserved_unallocated=frag,
                          torch_allocated=f["torch_allocated"], shortfall=shortfall, consumers=consumers,
                          fragmentation_is_cause=frag_cause,
                          suggestions=tuple(suggestions), batch_size=bs, fitting_batch_size=fit_bs,
                          batch_basis=basis, batch_upper_bound=upper, batch_seen=seen, batch_estimate=estimate)


def free_last_error(shell: Any = None, user_ns: Optional[dict[str, Any]] = None) -> FreedReport:
    """Drop the last exception and everything its frames keep alive, and what the namespace
    holds without a value the user keeps; collect; empty the cache.

    Clears ``sys.last_value``/``last_traceback``/``last_type`` (and ``last_exc``),
    the locals of every frame in the traceback and its chained exceptions, IPython's
    copy of the last traceback; then, in ``user_ns`` (default: the shell's), detaches the
    autograd graph of every tensor that keeps one (a ``loss``: its value stays) and removes the
    cached outputs that hold tensors (:func:`vramlab.runtime.holders.release`); then runs
    ``gc.collect()`` and, where torch has initialised CUDA, ``torch.cuda.empty_cache()`` (and an
    active virtual GPU's ``empty_cache()``). The report names what was released and what still
    holds tensors (modules, optimizer state, tensors: the user's, left alone).
    """
    before = snapshot()
    exc = getattr(sys, "last_exc", None) or getattr(sys, "last_value", None)
    tb = getattr(sys, "last_traceback", None)
    cleared = drop_traceback(exc)
    _clear_frames(tb)
    for name in ("last_exc", "last_value", "last_traceback", "last_type"):
        if getattr(sys, name, None) is not None:
            setattr(sys, name, None)
            cleared.append(f"sys.{name}")
    if shell is not None:
        for holder in ("InteractiveTB", "SyntaxTB"):
            obj = getattr(shell, holder, None)
            if obj is not None and getattr(obj, "tb", None) is not None:
                obj.tb = None
                cleared.append(f"{holder}.tb")
    del exc, tb
    if user_ns is None and shell is not None:
        user_ns = getattr(shell, "user_ns", None)
    released = release(user_ns, shell)
    gc.collect()
    torch = sys.modules.get("torch")
    if torch is not None:
        try:
            if torch.cuda.is_initialized():
                torch.cuda.empty_cache()
        except Exception:
            pass
    empty_provider_caches()  # an active virtual GPU's cache, as on a card
    after = snapshot()
    prev = {d.id: d for d in before.devices}
    devs = []
    for d in after.devices:
        p = prev.get(d.id)
        if p is None:
            continue
        devs.append(FreedDevice(d.id, (p.torch_allocated or 0) - (d.torch_allocated or 0),
                                (p.torch_reserved or 0) - (d.torch_reserved or 0)))
    return FreedReport(host=before.host.process_rss - after.host.process_rss, devices=tuple(devs),
                       cleared=tuple(cleared), released=tuple(released), kept=tuple(holders(user_ns)))
