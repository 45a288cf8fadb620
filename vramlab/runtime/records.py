"""Per-cell memory records: what a cell did to every layer, with exact peaks.

A record is taken around a cell (``%%vram``, or every cell with ``%vram auto on``):

- at the start, a snapshot, and the peak counters are reset: the host's ``VmHWM``
  (``/proc/self/clear_refs``, Linux), torch's ``reset_peak_memory_stats`` on every
  initialised CUDA/XPU device, and the virtual GPU's peak;
- at the end, a second snapshot; the peaks read then are the cell's own.

Resetting peak counters is **global**: code that reads ``torch.cuda.max_memory_allocated``
or ``VmHWM`` across cells sees them reset. With ``keep_peaks=True`` (``--keep-peaks``)
nothing is reset; a cell's peak is then known only when it set a new high since the
counters were last reset, and is ``None`` (unknown) otherwise.

The processes this one started (DataLoader workers, ``torch.multiprocessing``) are in the
record too: their number and summed RSS at the start and the end of the cell, and, with
``uss=True``, their summed USS, which is what copy-on-write makes them add (touching a
Python object in a forked worker writes its reference count, and so copies its page).
Their peak is not recorded: a worker that starts and ends within the cell is not seen.

All sizes are in bytes, times in seconds.
"""

from __future__ import annotations

import collections
import dataclasses
import time
from typing import Deque, NamedTuple, Optional

from ..model import CellRecord, DeviceDelta, DeviceSnapshot, HostDelta, Snapshot
from ..probes.host import reset_peak_rss
from ..probes.torch_alloc import reset_peaks
from ..reconcile import reset_provider_peaks, snapshot, take_departed_devices

__all__ = ["Recorder", "RecordToken", "get_recorder", "HISTORY_SIZE"]

HISTORY_SIZE = 10_000  # cell records kept


def _reset_all_peaks() -> bool:
    """Reset the host's VmHWM, torch's peaks and every registered device provider's peak
    (the active virtual GPU's). Returns whether the host's peak could be reset."""
    ok = reset_peak_rss()
    reset_peaks()
    reset_provider_peaks()
    return ok


class RecordToken(NamedTuple):
    """A record begun by :meth:`Recorder.begin`, to pass to :meth:`Recorder.end`."""

    snapshot: Snapshot  #: the reading right after the peak counters were reset
    started: float  #: epoch seconds
    perf_start: float  #: ``time.perf_counter()`` at the start, in seconds
    execution_count: Optional[int]  #: the cell's number as known at the start
    keep_peaks: bool  #: the peak counters were left alone
    host_reset: bool  #: the host's peak (``VmHWM``) was reset
    uss: bool  #: USS is read at both ends


class Recorder:
    """Takes cell records and keeps the history (bounded)."""

    def __init__(self) -> None:
        self.history: Deque[CellRecord] = collections.deque(maxlen=HISTORY_SIZE)
        self.keep_peaks = False
        self.uss = False  # also read USS (this process's and its children's) at both ends: slower

    def begin(self, execution_count: Optional[int] = None, keep_peaks: Optional[bool] = None,
              uss: Optional[bool] = None) -> RecordToken:
        """Start a record: reset the peak counters (unless keeping them), then read every layer.

        Args:
            execution_count: the cell's number, for the record.
            keep_peaks: leave the peak counters alone (default: :attr:`keep_peaks`).
            uss: also read the children's USS at both ends (default: :attr:`uss`); it walks
                every mapping of each, so a cell's record costs more.

        Returns a token to pass to :meth:`end`.
        """
        keep = self.keep_peaks if keep_peaks is None else keep_peaks
        want_uss = self.uss if uss is None else uss
        host_reset = False
        if not keep:
            host_reset = _reset_all_peaks()
        take_departed_devices()  # cards left before this cell are not its own
        snap = _read(want_uss)  # right after the reset: the peaks now equal the current figures
        return RecordToken(snap, time.time(), time.perf_counter(), execution_count, keep, host_reset, want_uss)

    def end(self, token: Optional[RecordToken], error: Optional[BaseException] = None,
            execution_count: Optional[int] = None, cell_key: Optional[str] = None,
            batch_size: Optional[int] = None) -> Optional[CellRecord]:
        """Finish the record ``token`` (from :meth:`begin`); ``None`` when there is none.

        Args:
            token: what :meth:`begin` returned.
            error: the exception the cell raised, if any (its type's name is recorded).
            execution_count: the cell's number, when it is known better now than at the start.
            cell_key: the cell's code with its batch size left out
                (:func:`vramlab.runtime.cells.cell_key`), so that runs of one cell can be compared.
            batch_size: the batch variable's value when the cell ended
                (:func:`vramlab.runtime.cells.batch_size_in`).
        """
        if token is None:
            return None
        s0, started, t0, count, keep, host_reset, want_uss = token
        if execution_count is not None:
            count = execution_count
        wall = time.perf_counter() - t0
        s1 = _read(want_uss)
        h0, h1 = s0.host, s1.host
        if h1.process_peak is not None and (host_reset or (h0.process_peak is not None and h1.process_peak > h0.process_peak)):
            peak: Optional[int] = h1.process_peak
        else:
            peak = None
        host = HostDelta(
            rss_start=h0.process_rss, rss_end=h1.process_rss, rss_delta=h1.process_rss - h0.process_rss,
            peak=peak, peak_delta=None if peak is None else peak - h0.process_rss,
            swap_delta=None if h0.swap_used is None or h1.swap_used is None else h1.swap_used - h0.swap_used,
            peak_exact=h1.peak_exact,
            children_count_start=h0.children_count, children_count_end=h1.children_count,
            children_rss_start=h0.children_rss, children_rss_end=h1.children_rss,
            children_rss_delta=h1.children_rss - h0.children_rss,
            children_uss_start=h0.children_uss, children_uss_end=h1.children_uss,
            children_uss_delta=_sub(h1.children_uss, h0.children_uss),
            uss_start=h0.process_uss, uss_end=h1.process_uss, uss_delta=_sub(h1.process_uss, h0.process_uss),
        )
        before = {d.id: d for d in s0.devices}
        devices = []
        # a virtual card entered and left inside the cell (``with VirtualGPU(...):``, the
        # documented way) is no longer in the snapshot: its last reading stands for its end,
        # with the highest peak it reached (it may have been entered more than once)
        now = {d.id for d in s1.devices}
        gone: dict[str, DeviceSnapshot] = {}
        for d in take_departed_devices():
            if d.id in now:
                continue
            prev = gone.get(d.id)
            if prev is not None and (prev.torch_peak_allocated or 0) > (d.torch_peak_allocated or 0):
                d = dataclasses.replace(d, torch_peak_allocated=prev.torch_peak_allocated)
            gone[d.id] = d
        for d1 in list(s1.devices) + list(gone.values()):
            d0 = before.get(d1.id)
            # torch's counters began during the cell (the first cell that creates a CUDA
            # context, or a device that appeared): they started from 0, and their peak is the cell's
            fresh = d1.torch_allocated is not None and (d0 is None or d0.torch_allocated is None)
            a0 = 0 if fresh else (d0.torch_allocated if d0 is not None else None)
            r0 = 0 if fresh else (d0.torch_reserved if d0 is not None else None)
            p1 = d1.torch_peak_allocated
            p0 = d0.torch_peak_allocated if d0 is not None else None
            if p1 is not None and (not keep or fresh or (p0 is not None and p1 > p0)):
                pk: Optional[int] = p1
            else:
                pk = None
            u0 = d0.process_used if d0 is not None else None
            devices.append(DeviceDelta(
                id=d1.id,
                allocated_start=a0,
                allocated_delta=_sub(d1.torch_allocated, a0),
                peak_allocated=pk,
                peak_allocated_delta=_sub(pk, a0),
                reserved_delta=_sub(d1.torch_reserved, r0),
                nvml_delta=_sub(d1.process_used, u0) if d0 is not None else None,
            ))
        err = None if error is None else type(error).__name__
        rec = CellRecord(execution_count=count, started=started, wall_s=wall, error=err, host=host,
                         devices=tuple(devices), peaks_reset=not keep, cell_key=cell_key, batch_size=batch_size)
        self.history.append(rec)
        return rec


def _read(uss: bool) -> Snapshot:
    return snapshot(uss=True) if uss else snapshot()


def _sub(a: Optional[int], b: Optional[int]) -> Optional[int]:
    return None if a is None or b is None else a - b


_RECORDER: Optional[Recorder] = None


def get_recorder() -> Recorder:
    """The kernel's one recorder."""
    global _RECORDER
    if _RECORDER is None:
        _RECORDER = Recorder()
    return _RECORDER
