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

All sizes are in bytes, times in seconds.
"""

from __future__ import annotations

import collections
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Deque, Optional

from ._sizes import format_bytes

__all__ = ["CellRecord", "DeviceDelta", "HostDelta", "Recorder", "get_recorder"]

HISTORY_SIZE = 10_000  # cell records kept


@dataclass(frozen=True)
class HostDelta:
    """Host changes over one cell (bytes). ``peak_delta`` is the peak RSS during the
    cell minus RSS at its start; ``None`` when the peak is not known."""

    rss_start: int
    rss_end: int
    rss_delta: int
    peak: Optional[int]
    peak_delta: Optional[int]
    swap_delta: Optional[int]
    peak_exact: bool


@dataclass(frozen=True)
class DeviceDelta:
    """One device's changes over one cell (bytes). ``peak_allocated_delta`` is the peak
    allocated during the cell minus allocated at its start."""

    id: str
    allocated_start: Optional[int]
    allocated_delta: Optional[int]
    peak_allocated: Optional[int]
    peak_allocated_delta: Optional[int]
    reserved_delta: Optional[int]
    nvml_delta: Optional[int]


@dataclass(frozen=True)
class CellRecord:
    """What one cell did to memory."""

    execution_count: Optional[int]
    started: float
    wall_s: float
    error: Optional[str]
    host: HostDelta
    devices: tuple[DeviceDelta, ...] = field(default_factory=tuple)
    peaks_reset: bool = True

    def to_dict(self) -> dict[str, Any]:
        """A JSON-safe dict."""
        d = asdict(self)
        d["devices"] = [asdict(x) for x in self.devices]
        return d

    def line(self) -> str:
        """One compact line, as auto mode prints it."""
        h = self.host
        parts = [f"[vramlab] cell {self.execution_count if self.execution_count is not None else '-'}",
                 f"{self.wall_s:.3f} s"]
        host = f"RSS {format_bytes(h.rss_delta, signed=True)}"
        if h.peak_delta is not None:
            host += f" (peak +{format_bytes(max(h.peak_delta, 0))})"
        parts.append(host)
        for d in self.devices:
            if d.allocated_delta is None and d.nvml_delta is None:
                continue
            s = f"{d.id} alloc {format_bytes(d.allocated_delta, signed=True)}"
            if d.peak_allocated_delta is not None:
                s += f" (peak +{format_bytes(max(d.peak_allocated_delta, 0))})"
            if d.reserved_delta:
                s += f" reserved {format_bytes(d.reserved_delta, signed=True)}"
            if d.nvml_delta:
                s += f" nvml {format_bytes(d.nvml_delta, signed=True)}"
            parts.append(s)
        if self.error:
            parts.append(f"raised {self.error}")
        return " · ".join(parts)

    def __repr__(self) -> str:
        return f"<vramlab.CellRecord cell {self.execution_count}>"

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, str]:
        from .display.html import record_html

        return {"text/plain": self.text(), "text/html": record_html(self)}

    def text(self) -> str:
        """A small aligned table."""
        from .display.text import record_text

        return record_text(self)


def _reset_all_peaks() -> bool:
    from .probes.host import reset_peak_rss
    from .probes.torch_ import reset_peaks

    ok = reset_peak_rss()
    reset_peaks()
    virt = sys.modules.get("vramlab.probes.virtual")
    if virt is not None:
        gpu = virt.active_virtual_gpu()
        if gpu is not None:
            gpu.reset_peak()
    return ok


class Recorder:
    """Takes cell records and keeps the history (bounded)."""

    def __init__(self) -> None:
        self.history: Deque[CellRecord] = collections.deque(maxlen=HISTORY_SIZE)
        self.keep_peaks = False

    def begin(self, execution_count: Optional[int] = None, keep_peaks: Optional[bool] = None) -> Any:
        """Start a record: reset the peak counters (unless keeping them), then read every layer.

        Returns a token to pass to :meth:`end`.
        """
        from ._snapshot import snapshot

        keep = self.keep_peaks if keep_peaks is None else keep_peaks
        host_reset = False
        if not keep:
            host_reset = _reset_all_peaks()
        snap = snapshot()  # right after the reset: the peaks now equal the current figures
        return (snap, time.time(), time.perf_counter(), execution_count, keep, host_reset)

    def end(self, token: Any, error: Optional[BaseException] = None) -> Optional[CellRecord]:
        """Finish the record ``token`` (from :meth:`begin`); ``None`` when there is none."""
        if token is None:
            return None
        from ._snapshot import snapshot

        s0, started, t0, count, keep, host_reset = token
        wall = time.perf_counter() - t0
        s1 = snapshot()
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
        )
        before = {d.id: d for d in s0.devices}
        devices = []
        for d1 in s1.devices:
            d0 = before.get(d1.id)
            # a device that appeared during the cell (torch initialised it) started from 0
            a0 = d0.torch_allocated if d0 is not None else (0 if d1.torch_allocated is not None else None)
            r0 = d0.torch_reserved if d0 is not None else (0 if d1.torch_reserved is not None else None)
            p1 = d1.torch_peak_allocated
            p0 = d0.torch_peak_allocated if d0 is not None else None
            if p1 is not None and (not keep or d0 is None or (p0 is not None and p1 > p0)):
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
                         devices=tuple(devices), peaks_reset=not keep)
        self.history.append(rec)
        return rec


def _sub(a: Optional[int], b: Optional[int]) -> Optional[int]:
    return None if a is None or b is None else a - b


_RECORDER: Optional[Recorder] = None


def get_recorder() -> Recorder:
    """The kernel's one recorder."""
    global _RECORDER
    if _RECORDER is None:
        _RECORDER = Recorder()
    return _RECORDER
