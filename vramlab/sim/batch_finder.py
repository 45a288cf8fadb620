"""``find_max_batch_size()``: the exact largest batch that fits, in about 2·log2(max) trials.

The search doubles the batch from ``start`` until the first out-of-memory error, then
binary-searches between the last batch that fitted and the first that did not, down to
the exact boundary. With ``start=1`` and a largest fitting batch ``B``, the doubling takes
``k + 1`` trials (where ``2**(k-1) <= B < 2**k``) and the bisection ``k - 1``: ``2k``
trials, never more than ``2*log2(B) + 2``. The doubling stops at ``limit``, by default
:data:`DEFAULT_LIMIT` (2**20): a step that never runs out of memory ends after 21 trials,
``capped``, with a note saying how to search further.

How it differs from the two common finders:

- accelerate's ``find_executable_batch_size`` starts high (128 by default) and, on every
  OOM, retries at ``int(0.9 * batch)``. It never goes up, so it finds *a* batch that fits,
  up to 10% below the largest, only if it started above it, and it needs about
  ``log(start/B)/log(1/0.9)`` trials (22 from 2048 to 246).
- Lightning's ``BatchSizeFinder(mode="binsearch")`` doubles from 2 and bisects as here,
  running ``steps_per_trial=3`` steps per trial, and then returns the result reduced by a
  5% safety margin (``margin=0.05``): ``int(B * 0.95)``, not ``B``.
- This finder returns ``B`` itself: the margin is yours to choose, knowing the peak of
  every trial (``BatchSearch.trials``). Between trials it drops the OOM exception and its
  traceback (which keep the failed step's tensors alive) before ``gc.collect()`` and
  ``torch.cuda.empty_cache()``. What was alive before the search is set aside with
  ``gc.freeze()`` for its duration, so each collection scans only what the trials made.

Any exception other than an out-of-memory error is re-raised at once, unchanged.
All sizes are in bytes.
"""

from __future__ import annotations

import gc
import math
import sys
import html
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Union

from ..i18n import tr
from ..runtime.oom import drop_traceback, is_oom
from ..display.text import search_done_line, trial_line
from ..units import format_bytes

__all__ = ["BatchSearch", "Trial", "find_max_batch_size", "DEFAULT_LIMIT"]

#: The largest batch tried when ``limit=None``: 2**20 = 1,048,576 samples, 21 doublings from 1.
#: That is above any per-device batch in use (large-batch training spreads 32k-64k samples over
#: hundreds of devices), and it bounds a step that never runs out of memory (one that ignores
#: its batch size, or allocates nothing per sample): without it the doubling went on for
#: thousands of trials on ever larger integers. Pass ``limit=`` to search beyond it.
DEFAULT_LIMIT = 2**20


@dataclass(frozen=True)
class Trial:
    """One trial: the batch size, whether the step fitted, and its peak allocated bytes
    (for a failed trial, the peak reached before the OOM)."""

    batch: int
    fits: bool
    peak: Optional[int]


class TrialTable(list):
    """A batch search's trials as rows (dicts: ``batch``, ``fits``, ``peak`` in bytes) that
    render as a table in a notebook and as text elsewhere."""

    def _rows(self) -> list[tuple[str, str, str, str]]:
        yes, na = tr("yes"), tr("n/a")
        return [(str(i), str(r["batch"]), yes if r["fits"] else "OOM", na if r["peak"] is None else format_bytes(r["peak"]))
                for i, r in enumerate(self, 1)]

    def __str__(self) -> str:
        head = ("#", tr("batch"), tr("fits"), tr("peak"))
        lines = [f"{head[0]:>3}  {head[1]:>7}  {head[2]:<4}  {head[3]:>12}"]
        lines += [f"{a:>3}  {b:>7}  {c:<4}  {d:>12}" for a, b, c, d in self._rows()]
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        head = "".join(f"<th>{html.escape(h)}</th>" for h in ("#", tr("batch"), tr("fits"), tr("peak")))
        rows = "".join("<tr>" + "".join(f"<td>{'<b>OOM</b>' if c == 'OOM' else html.escape(c)}</td>" for c in row)
                       + "</tr>" for row in self._rows())
        return f"<table><tr>{head}</tr>{rows}</table>"

    def _repr_pretty_(self, p: Any, cycle: bool) -> None:
        p.text(str(self))


@dataclass(frozen=True)
class BatchSearch:
    """The result of :func:`find_max_batch_size`.

    Attributes:
        max_batch_size: the largest batch that fitted (0 when even ``start`` did not and
            no smaller batch fitted either).
        trials: every trial in order.
        device: what it ran on (``"virtual:0 (T4)"``, ``"cuda:0"``).
        limit: the largest batch it would try: the ``limit`` given, or :data:`DEFAULT_LIMIT`
            (2**20) for ``limit=None``.
        capped: whether the search stopped at ``limit`` (the true maximum may be larger); a
            note says so when that was the default limit.
        notes: what to know about the result, in the current language.
    """

    max_batch_size: int
    trials: tuple[Trial, ...]
    device: str
    limit: Optional[int] = None
    capped: bool = False
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def num_trials(self) -> int:
        """How many trials were run."""
        return len(self.trials)

    def table(self) -> "TrialTable":
        """The trials as rows: ``{"batch", "fits", "peak"}`` (peak in bytes), a list that a
        notebook shows as a table (and ``pandas.DataFrame(search.table())`` takes as it is)."""
        return TrialTable({"batch": t.batch, "fits": t.fits, "peak": t.peak} for t in self.trials)

    def text(self) -> str:
        """A plain-text table."""
        head = tr("max batch size {n}{capped} on {device}, {trials} trials", n=self.max_batch_size,
                  capped=self._capped(), device=self.device, trials=self.num_trials)
        lines = [head] + ["  " + line for line in str(self.table()).splitlines()]
        lines.extend("  " + tr("note: {note}", note=n) for n in self.notes)
        return "\n".join(lines)

    def _capped(self) -> str:
        return " " + tr("(stopped at the limit)") if self.capped else ""

    def __repr__(self) -> str:
        return f"<vramlab.BatchSearch max_batch_size={self.max_batch_size} trials={self.num_trials} on {self.device}>"

    def _repr_html_(self) -> str:
        head = tr("max batch size <b>{n}</b>{capped} on {device}, {trials} trials", n=self.max_batch_size,
                  capped=html.escape(self._capped()), device=html.escape(self.device), trials=self.num_trials)
        return f"<div class='vramlab-batch'><p>{head}</p>{self.table()._repr_html_()}</div>"

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, str]:
        return {"text/plain": self.text(), "text/html": self._repr_html_()}


class _Runner:
    """Runs one trial on a device and reads its peak."""

    def __init__(self, device: Any, values: Optional[bool] = None) -> None:
        import torch

        from .virtual_gpu import VirtualGPU, active_virtual_gpu

        self.torch = torch
        self.virtual: Optional[VirtualGPU] = None
        self.fresh = False  # a new VirtualGPU per trial
        self.cuda: Any = None
        self.spec: Any = None
        self.values = True  # a fresh VirtualGPU's values (see _choose_values)
        self.host: Optional[tuple[int, int]] = None  # (available, margin) when values=False was chosen for the host
        if device is None:
            active = active_virtual_gpu()
            if active is not None:
                self.virtual = active
            elif torch.cuda.is_available():
                self.cuda = torch.device("cuda", torch.cuda.current_device())
            else:
                raise ValueError("no device to search on: no VirtualGPU is active and CUDA is not available; "
                                 "pass device= a VirtualGPU, a capacity ('8GiB'), a GPU preset ('T4') or 'cuda'")
        elif isinstance(device, VirtualGPU):
            self.virtual = device
        elif isinstance(device, torch.device) or (isinstance(device, str) and device.split(":")[0] == "cuda"):
            dev = torch.device(device)
            if dev.type != "cuda":
                raise ValueError(f"device {device!r}: only CUDA devices and virtual GPUs are searched")
            self.cuda = dev if dev.index is not None else torch.device("cuda", torch.cuda.current_device())
        else:
            self.spec = device
            self.fresh = True
            card = VirtualGPU(device)  # validates the capacity now: ValueError for a bad one
            self.values = self._choose_values(card.budget) if values is None else bool(values)
        if values is not None and not self.fresh:
            raise ValueError("values= applies to a device given as a capacity or a preset (a fresh VirtualGPU per "
                             "trial); a VirtualGPU passed in keeps its own")

    def _choose_values(self, budget: int) -> bool:
        """Real values while the host can hold the card's whole budget beside its margin; else
        ``values=False`` (shapes and memory only), as a card larger than the host needs."""
        from ..probes.host import read_host
        from .virtual_gpu import host_margin

        h = read_host(children=False)
        margin = host_margin(h.limit)
        if budget <= h.available - margin:
            return True
        self.host = (h.available, margin)
        return False

    def describe(self) -> str:
        if self.cuda is not None:
            return str(self.cuda)
        gpu = self.virtual if self.virtual is not None else self._new()
        return f"virtual:0 ({gpu.name}, {format_bytes(gpu.capacity)})"

    def _new(self) -> Any:
        from .virtual_gpu import VirtualGPU

        return VirtualGPU(self.spec, values=self.values)

    def cleanup(self) -> None:
        """Between trials: collect, then give the cache back, on CUDA and on a reused virtual card
        alike, so that one trial's cached blocks do not fragment the next."""
        gc.collect()
        if self.cuda is not None:
            self.torch.cuda.empty_cache()
        elif self.virtual is not None and not self.fresh:
            self.virtual.empty_cache()

    def run(self, step_fn: Callable[[int], Any], batch: int) -> tuple[bool, Optional[int]]:
        """Run ``step_fn(batch)``; ``(fits, peak)``. Non-OOM exceptions propagate unchanged."""
        if self.cuda is not None:
            torch, dev = self.torch, self.cuda
            torch.cuda.synchronize(dev)
            torch.cuda.reset_peak_memory_stats(dev)
            fits = _attempt(lambda: (step_fn(batch), torch.cuda.synchronize(dev)))
            return fits, int(torch.cuda.max_memory_allocated(dev))
        gpu = self.virtual if not self.fresh else self._new()
        assert gpu is not None  # without CUDA, the finder always has a virtual GPU
        entered = not gpu.active
        if entered:
            gpu.__enter__()
        try:
            gpu.reset_peak()
            fits = _attempt(lambda: step_fn(batch))
            return fits, gpu.peak
        finally:
            if entered:
                gpu.__exit__(None, None, None)


def _attempt(fn: Callable[[], Any]) -> bool:
    """Run ``fn``: ``True`` when it returns, ``False`` on an OOM (dropped with its
    traceback); any other exception propagates unchanged."""
    try:
        fn()
    except Exception as e:
        if not is_oom(e):
            raise
        drop_traceback(e)
        return False
    return True


class _Progress:
    """Where a search reports its trials: a notebook's bar, stderr's lines, or nowhere."""

    def __init__(self, wanted: Optional[bool], limit: int) -> None:
        self.limit = limit
        self.bar: Any = None
        self.lines = False
        if wanted is False:
            return
        from ..display.widget import trial_progress

        self.bar = trial_progress()
        if self.bar is None:
            try:
                self.lines = bool(wanted) or sys.stderr.isatty()
            except Exception:
                self.lines = bool(wanted)

    def trial(self, trials: list[Trial]) -> None:
        if self.bar is None and not self.lines:
            return
        t = trials[-1]
        lo = max((x.batch for x in trials if x.fits), default=0)
        hi = min((x.batch for x in trials if not x.fits), default=None)
        if hi is None:  # still doubling: the doublings to the limit, then a bisection of the last step
            steps = max(math.ceil(math.log2(self.limit / max(lo, 1))), 0)
            left = steps + (math.ceil(math.log2(max(lo, 2))) if steps else 0)
        else:
            left = math.ceil(math.log2(hi - lo)) if hi - lo > 1 else 0
        line = trial_line(len(trials), t.batch, t.fits, t.peak, lo, hi)
        self._say(line, len(trials), left)

    def done(self, best: int, n: int) -> None:
        line = search_done_line(best, n)
        if self.bar is not None:
            self.bar.close(line)
        elif self.lines:
            self._print(line)

    def _say(self, line: str, done: int, left: int) -> None:
        if self.bar is not None:
            self.bar.update(line, done, left)
        else:
            self._print(line)

    @staticmethod
    def _print(line: str) -> None:
        try:
            print(line, file=sys.stderr, flush=True)
        except Exception:
            pass


def _search(trial: Callable[[int], bool], start: int, limit: int) -> tuple[int, Optional[int], bool]:
    """Doubling then bisection; returns (largest fit or 0, smallest OOM or None, capped).

    ``limit`` is always given (:data:`DEFAULT_LIMIT` for none): the doubling ends there after at
    most ``log2(limit / start) + 1`` trials, even for a step that never runs out of memory."""
    b = min(start, limit)
    lo, hi = 0, None  # lo: largest known fit; hi: smallest known OOM
    capped = False
    while hi is None:
        if trial(b):
            lo = b
            if b >= limit:
                capped = True
                break
            b = min(b * 2, limit)
        else:
            hi = b
    if hi is not None:
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if trial(mid):
                lo = mid
            else:
                hi = mid
    return lo, hi, capped


def find_max_batch_size(step_fn: Callable[[int], Any], *, start: int = 1, limit: Optional[int] = None,
                        device: Union[None, str, int, Any] = None, values: Optional[bool] = None,
                        progress: Optional[bool] = None) -> BatchSearch:
    """The largest batch size for which ``step_fn(batch_size)`` runs without running out of memory.

    Args:
        step_fn: runs one step (forward, backward, optimizer step: whatever must fit) at the
            batch size it is given. It should create what depends on the batch inside, and
            leave nothing behind that grows with it.
        start: the first batch size tried (``>= 1``).
        limit: the largest batch size worth trying; the search stops there when it fits.
            ``None``: :data:`DEFAULT_LIMIT` (2**20 = 1,048,576, or ``start`` if larger), so that
            a step that never runs out of memory ends after about 21 trials; when the search
            stops there, ``capped`` is true and a note says how to go further.
        device: where to run: ``None`` (the active VirtualGPU, else the current CUDA
            device), a :class:`~vramlab.VirtualGPU`, ``"cuda"``/``"cuda:N"``, or a capacity
            or GPU preset (``"256MiB"``, ``"T4"``, bytes): a fresh VirtualGPU of that size
            for every trial, so every trial starts empty.
        values: for a capacity or preset, whether the trials compute values
            (:class:`~vramlab.VirtualGPU`'s ``values``). ``None``: real values when this machine
            can hold the whole card beside a margin (:func:`~vramlab.sim.virtual_gpu.host_margin`),
            else ``values=False``, shapes and memory only, so that a card larger than the host is
            searched as :func:`~vramlab.estimate` counts it (a note says so; a step that reads a
            value then raises :class:`~vramlab.sim.virtual_gpu.ValuesNotComputedError`).
        progress: report each trial as it ends: in a notebook a progress bar with the last
            trial's line, elsewhere a line per trial on stderr. ``None``: in a notebook, or when
            stderr is a terminal; ``False``: never.

    Returns:
        A :class:`BatchSearch`: ``max_batch_size`` and the trials (batch, fits, peak).

    Raises:
        ValueError: for a bad ``start``/``limit`` (integers from 1 to ``2**63 - 1``) or device.
        Exception: whatever ``step_fn`` raises other than an out-of-memory error, unchanged.
    """
    most = 2**63 - 1  # torch's sizes are int64: no larger batch can be a tensor's dimension
    if isinstance(start, bool) or not isinstance(start, int) or not 1 <= start <= most:
        raise ValueError(f"start must be an integer from 1 to 2**63 - 1; got {start!r}")
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= most):
        raise ValueError(f"limit must be an integer from 1 to 2**63 - 1, or None (the default limit, "
                         f"{DEFAULT_LIMIT}); got {limit!r}")
    default = limit is None
    if limit is None:
        limit = max(DEFAULT_LIMIT, start)
    runner = _Runner(device, values)
    trials: list[Trial] = []
    report = _Progress(progress, limit)

    def trial(b: int) -> bool:
        fits, peak = runner.run(step_fn, b)
        runner.cleanup()  # the exception and its traceback are already gone
        trials.append(Trial(b, fits, peak))
        report.trial(trials)
        return fits

    # Everything alive now survives the search: collect once, then freeze it out of the
    # collector's view (gc.freeze), so that the gc.collect() after each trial scans only
    # what the trials made (a full collection of a process that imported torch takes
    # ~0.1 s). Unfrozen at the end, whatever happens.
    gc.collect()
    gc.freeze()
    try:
        lo, hi, capped = _search(trial, start, limit)
    finally:
        gc.unfreeze()
    report.done(lo, len(trials))
    notes = []
    if runner.host is not None:
        notes.append(tr("the trials ran with values=False (shapes and memory, no values): the card's {budget} does "
                        "not fit beside this machine's {available} of available RAM less {margin} kept free",
                        budget=format_bytes(runner._new().budget), available=format_bytes(runner.host[0]),
                        margin=format_bytes(runner.host[1])))
    if lo == 0:
        notes.append(tr("no batch size fitted, not even 1") if start == 1 else
                     tr("batch size {start} did not fit, nor any smaller one", start=start))
    if capped and default:
        notes.append(tr("stopped at the default limit of {limit}: every batch tried fitted, so the step may not "
                        "grow with the batch size; pass limit= to search further (e.g. limit={larger})",
                        limit=limit, larger=min(limit * 16, most)))
    return BatchSearch(max_batch_size=lo, trials=tuple(trials), device=runner.describe(), limit=limit,
                       capped=capped, notes=tuple(notes))
