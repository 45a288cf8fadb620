"""Host memory probe: this process, system RAM, swap, and the effective limit.

All sizes are in bytes. On Linux everything is read straight from ``/proc`` and
the cgroup filesystem (cheaper than psutil, and exact); elsewhere psutil and
``resource`` are used.

The *effective limit* is the memory the process can really use: the cgroup
v2 ``memory.max`` or v1 ``memory.limit_in_bytes`` of this process's cgroup
(the smallest along its ancestors) when that is lower than physical RAM, else
physical RAM. On Binder or in a container it is the number that matters.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Optional

from ..model import HostReading
from .cgroup import CGROUP, os_read

__all__ = ["read_host", "reset_peak_rss", "read_uss"]

_LINUX = sys.platform.startswith("linux")
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


class _SwapCounters:
    """pswpin/pswpout from /proc/vmstat. Without swap space nothing can page, so the
    counters are read once and kept until swap appears."""

    def __init__(self) -> None:
        self.value: tuple[Optional[int], Optional[int]] = (None, None)
        self.read_once = False

    def read(self, swap_total: Optional[int]) -> tuple[Optional[int], Optional[int]]:
        if self.read_once and swap_total == 0:
            return self.value
        data = os_read("/proc/vmstat")
        if data is None:
            self.value = (None, None)
        else:
            pin = _count_field(data, b"pswpin")
            pout = _count_field(data, b"pswpout")
            self.value = (None if pin is None else pin * _PAGE, None if pout is None else pout * _PAGE)
        self.read_once = True
        return self.value


_SWAP = _SwapCounters()


# --------------------------------------------------------------------------- /proc parsing


def _kb_field(data: bytes, key: bytes) -> Optional[int]:
    """Return the kB value of ``key`` (e.g. b"VmRSS:") in a /proc status-like file, in bytes."""
    i = data.find(key)
    if i < 0:
        return None
    j = data.find(b"\n", i)
    parts = data[i + len(key): j if j >= 0 else None].split()
    if not parts:
        return None
    return int(parts[0]) * 1024


def _count_field(data: bytes, key: bytes) -> Optional[int]:
    i = data.find(b"\n" + key + b" ")
    if i < 0:
        if data.startswith(key + b" "):
            i = -1
        else:
            return None
    start = i + 1 + len(key) + 1
    j = data.find(b"\n", start)
    return int(data[start: j if j >= 0 else None])


def read_uss() -> Optional[int]:
    """This process's unique set size in bytes (private clean + private dirty pages).

    Read from ``/proc/self/smaps_rollup`` on Linux (cost grows with the number of
    mappings, so it is not part of the fast snapshot), from psutil elsewhere.
    Returns ``None`` when unavailable.
    """
    if _LINUX:
        try:
            with open("/proc/self/smaps_rollup", "rb") as f:
                data = f.read()
            a = _kb_field(data, b"Private_Clean:")
            b = _kb_field(data, b"Private_Dirty:")
            if a is not None and b is not None:
                return a + b
        except OSError:
            pass
    try:
        import psutil

        return int(psutil.Process().memory_full_info().uss)
    except Exception:
        return None


def reset_peak_rss() -> bool:
    """Reset this process's peak RSS (``VmHWM``) to its current RSS.

    Linux only: writes ``5`` to ``/proc/self/clear_refs``. Returns ``True`` when the
    reset happened, ``False`` where it is not possible (then the peak is the
    lifetime ``ru_maxrss``, which cannot be reset).
    """
    if not _LINUX:
        return False
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _read_host_linux(uss: bool) -> HostReading:
    now = time.time()
    status = os_read("/proc/self/status")
    meminfo = os_read("/proc/meminfo")
    if status is None or meminfo is None:
        raise OSError("/proc is not readable")
    rss = _kb_field(status, b"VmRSS:") or 0
    hwm = _kb_field(status, b"VmHWM:")
    total = _kb_field(meminfo, b"MemTotal:") or 0
    avail = _kb_field(meminfo, b"MemAvailable:")
    if avail is None:  # kernels before 3.14
        avail = (_kb_field(meminfo, b"MemFree:") or 0) + (_kb_field(meminfo, b"Cached:") or 0)
    swap_total = _kb_field(meminfo, b"SwapTotal:")
    swap_free = _kb_field(meminfo, b"SwapFree:")
    swap_in, swap_out = _SWAP.read(swap_total)
    used = total - avail
    cg_limit, cg_usage, cg_source = CGROUP.read()
    if cg_limit is not None and cg_limit < total:
        limit, source = cg_limit, cg_source
        if cg_usage is not None:
            avail = max(0, min(avail, cg_limit - cg_usage))
    else:
        limit, source, cg_usage = total, "physical RAM", None
    return HostReading(
        time=now,
        total=total,
        available=avail,
        used=used,
        limit=limit,
        limit_source=source,
        cgroup_usage=cg_usage,
        process_rss=rss,
        process_peak=hwm,
        process_uss=read_uss() if uss else None,
        swap_total=swap_total,
        swap_used=None if swap_total is None or swap_free is None else swap_total - swap_free,
        swap_in=swap_in,
        swap_out=swap_out,
        peak_exact=hwm is not None,
    )


def _read_host_psutil(uss: bool) -> HostReading:
    import psutil

    now = time.time()
    proc = psutil.Process()
    vm = psutil.virtual_memory()
    sw = psutil.swap_memory()
    peak: Optional[int] = None
    try:
        import resource

        maxrss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        peak = int(maxrss) if sys.platform == "darwin" else int(maxrss) * 1024
    except Exception:
        peak = getattr(proc.memory_info(), "peak_wset", None)
    rss = int(proc.memory_info().rss)
    return HostReading(
        time=now,
        total=int(vm.total),
        available=int(vm.available),
        used=int(vm.total - vm.available),
        limit=int(vm.total),
        limit_source="physical RAM",
        cgroup_usage=None,
        process_rss=rss,
        process_peak=peak,
        process_uss=read_uss() if uss else None,
        swap_total=int(sw.total),
        swap_used=int(sw.used),
        swap_in=int(sw.sin),
        swap_out=int(sw.sout),
        peak_exact=False,
    )


def read_host(uss: bool = False) -> HostReading:
    """Read host memory now. Sizes in bytes.

    Args:
        uss: also read this process's USS (slower: it walks every mapping).
    """
    if _LINUX:
        try:
            return _read_host_linux(uss)
        except (OSError, ValueError):
            pass
    return _read_host_psutil(uss)
