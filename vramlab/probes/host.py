"""Host memory probe: this process, system RAM, swap, and the effective limit.

All sizes are in bytes. On Linux everything is read straight from ``/proc`` and
the cgroup filesystem (cheaper than psutil, and exact); elsewhere psutil and
``resource`` are used.

The *effective limit* is the memory the process can really use: the cgroup
v2 ``memory.max`` or v1 ``memory.limit_in_bytes`` of this process's cgroup
(the smallest along its ancestors) when that is lower than physical RAM, else
physical RAM. On Binder or in a container it is the number that matters. A cgroup file
that cannot be read is said in a note (:attr:`HostReading.notes <vramlab.model.HostReading>`), never taken for "no
limit" in silence, and ``available`` never exceeds the limit shown.

*Children* are the processes that descend from this one (recursively): DataLoader
workers, ``torch.multiprocessing`` and ``notebook_launcher`` workers, a ``%%bash`` cell.
They are found through ``/proc/<pid>/task/<tid>/children`` where the kernel has it
(``CONFIG_PROC_CHILDREN``: one small read per thread of this process and of each
descendant), else with psutil, which reads ``/proc/<pid>/stat`` of every process on the
machine to find their parents (milliseconds where there are hundreds). Their RSS is read on every
reading (``/proc/<pid>/statm``, through psutil); their USS and PSS only on request
(``uss=True``: ``smaps_rollup`` walks every mapping).
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass, replace
from typing import Any, Optional, TypedDict

from ..facts import Note, NoteCode
from ..model import HostReading
from .cgroup import CGROUP, CgroupReading, os_read

__all__ = ["read_host", "reset_peak_rss", "read_uss", "read_children", "ChildrenReading", "descendant_pids",
           "read_process_tree", "ProcessTreeReading"]

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


# --------------------------------------------------------------------------- descendants


@dataclass(frozen=True)
class ChildrenReading:
    """This process's descendants. Sizes in bytes.

    Attributes:
        pids: their PIDs, parents before their children; zombies left out.
        rss: their RSS, summed (each counts the pages it shares with this process and its
            siblings again: copy-on-write after ``fork`` makes that most of a worker's RSS).
        uss: their USS (private pages), summed; ``None`` unless asked for, or when one
            could not be read.
        pss: their PSS (shared pages split between the processes that map them), summed;
            ``None`` unless asked for, where the OS does not give it, or one could not be read.
    """

    pids: tuple[int, ...] = ()
    rss: int = 0
    uss: Optional[int] = None
    pss: Optional[int] = None


def _children_files(proc: str, pid: int) -> Optional[list[int]]:
    """The direct children of ``pid`` from ``<proc>/<pid>/task/*/children``; ``None`` when
    the kernel does not have these files (``CONFIG_PROC_CHILDREN`` off)."""
    task = f"{proc}/{pid}/task"
    try:
        tids = os.listdir(task)
    except OSError:
        return []  # the process is gone
    out: list[int] = []
    found = False
    for tid in tids:
        data = os_read(f"{task}/{tid}/children")
        if data is None:
            continue
        found = True
        out.extend(int(x) for x in data.split())
    if not found and tids:
        return None
    return out


def descendant_pids(pid: Optional[int] = None, proc: str = "/proc") -> Optional[tuple[int, ...]]:
    """The PIDs that descend from ``pid`` (this process by default), parents first, read
    from ``<proc>/<pid>/task/<tid>/children``. ``None`` where the kernel has no such files
    (then :func:`read_children` asks psutil)."""
    root = os.getpid() if pid is None else pid
    first = _children_files(proc, root)
    if first is None:
        return None
    seen: dict[int, None] = {}
    queue = list(first)
    while queue:
        p = queue.pop(0)
        if p in seen or p == root:
            continue
        seen[p] = None
        queue.extend(_children_files(proc, p) or ())
    return tuple(seen)


_PROC_CHILDREN: Optional[bool] = None  # whether /proc has the children files (looked up once)


def _list_descendants(pid: Optional[int] = None) -> tuple[int, ...]:
    """The PIDs that descend from ``pid`` (this process by default): /proc's children files
    where the kernel has them, else psutil; ``()`` for a process that is gone."""
    global _PROC_CHILDREN
    if _LINUX and _PROC_CHILDREN is not False:
        pids = descendant_pids(pid)
        if pids is not None:
            _PROC_CHILDREN = True
            return pids
        _PROC_CHILDREN = False
    import psutil

    try:
        return tuple(p.pid for p in psutil.Process(pid).children(recursive=True))
    except psutil.Error:
        return ()


def _sum_memory(pids: tuple[int, ...], uss: bool) -> ChildrenReading:
    """The summed RSS (and with ``uss=True`` USS and PSS) of ``pids``, in bytes; a process
    that ended, or is a zombie, is left out of ``pids`` and of the sums."""
    import psutil

    kept: list[int] = []
    rss = 0
    uss_sum: Optional[int] = 0 if uss else None
    pss_sum: Optional[int] = 0 if uss else None
    for pid in pids:
        try:
            p = psutil.Process(pid)
            if p.status() == psutil.STATUS_ZOMBIE:
                continue
            if uss:
                m: Any
                try:
                    m = p.memory_full_info()
                except psutil.AccessDenied:  # another user's (a setuid helper): RSS only
                    m = p.memory_info()
                rss += int(m.rss)
                u, ps = getattr(m, "uss", None), getattr(m, "pss", None)
                uss_sum = None if uss_sum is None or u is None else uss_sum + int(u)
                pss_sum = None if pss_sum is None or ps is None else pss_sum + int(ps)
            else:
                rss += int(p.memory_info().rss)
        except psutil.NoSuchProcess:  # ended meanwhile (ZombieProcess is one too)
            continue
        except psutil.Error:
            continue
        kept.append(pid)
    return ChildrenReading(pids=tuple(kept), rss=rss, uss=uss_sum, pss=pss_sum)


def read_children(uss: bool = False) -> ChildrenReading:
    """Read this process's descendants now: their PIDs and summed RSS, and with ``uss=True``
    their summed USS and PSS (slower: it walks every mapping of each). Sizes in bytes.
    Never raises: a process that ends while it is read is left out."""
    try:
        pids = _list_descendants()
    except Exception:
        return ChildrenReading()
    if not pids:
        return ChildrenReading(uss=0 if uss else None, pss=0 if uss else None)
    return _sum_memory(pids, uss)


@dataclass(frozen=True)
class ProcessTreeReading:
    """Another process and its descendants (a Jupyter kernel and its workers). Sizes in bytes.

    Attributes:
        pid: the process asked about.
        alive: whether it was running when read (``False``: it ended, or never existed here).
        pids: it and its descendants that were read, parents before children; zombies left out.
        rss: their RSS, summed (shared pages counted once per process that maps them).
        uss: their USS (private pages), summed; ``None`` unless asked for, or when one could
            not be read (another user's process).
    """

    pid: int
    alive: bool
    pids: tuple[int, ...] = ()
    rss: int = 0
    uss: Optional[int] = None


def read_process_tree(pid: int, uss: bool = False) -> ProcessTreeReading:
    """Read process ``pid`` and its descendants now: their PIDs and summed RSS, and with
    ``uss=True`` their summed USS (slower). Sizes in bytes. Never raises: a process that ends
    while it is read is left out, and a ``pid`` that is gone reads as ``alive=False``."""
    try:
        got = _sum_memory((pid,) + _list_descendants(pid), uss)
    except Exception:  # a /proc race
        return ProcessTreeReading(pid=pid, alive=False)
    if pid not in got.pids:
        return ProcessTreeReading(pid=pid, alive=False)
    return ProcessTreeReading(pid=pid, alive=True, pids=got.pids, rss=got.rss, uss=got.uss)


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


def _cgroup_notes(cg: CgroupReading, limit_source: Optional[str]) -> list[Note]:
    """The notes for what the cgroup reading could not read. ``limit_source`` is the cgroup
    limit's source when that limit is the one shown, ``None`` when physical RAM is."""
    notes: list[Note] = []
    if cg.limit_errors:
        errors = "; ".join(cg.limit_errors)
        notes.append(Note(NoteCode.CGROUP_LIMIT_UNREADABLE, detail=errors) if limit_source is None
                     else Note(NoteCode.CGROUP_LIMIT_UNREADABLE_PARENT, source=limit_source, detail=errors))
    if limit_source is not None:
        if cg.usage_error:
            notes.append(Note(NoteCode.CGROUP_USAGE_UNREADABLE, detail=cg.usage_error))
        if cg.stat_error:
            notes.append(Note(NoteCode.CGROUP_STAT_UNREADABLE, detail=cg.stat_error))
    return notes


def _read_host_linux(uss: bool, notes: list[Note], children: bool = True) -> HostReading:
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
    cg = CGROUP.read()
    cg_usage: Optional[int] = None
    if cg.limit is not None and cg.limit < total:
        limit, source, cg_usage = cg.limit, cg.source, cg.usage
        # never more available than the limit leaves: what it leaves beyond the usage, or
        # (usage unreadable) the limit itself
        avail = max(0, min(avail, cg.limit - (cg_usage or 0)))
        notes.extend(_cgroup_notes(cg, source))
    else:
        limit, source = total, "physical RAM"
        notes.extend(_cgroup_notes(cg, None))
    kids = read_children(uss) if children else ChildrenReading()
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
        **_children_fields(kids),
    )


def _read_host_psutil(uss: bool, children: bool = True) -> HostReading:
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
    kids = read_children(uss) if children else ChildrenReading()
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
        **_children_fields(kids),
    )


class _ChildrenFields(TypedDict):
    children_count: int
    children_rss: int
    children_uss: Optional[int]
    children_pss: Optional[int]
    children_pids: tuple[int, ...]


def _children_fields(k: ChildrenReading) -> _ChildrenFields:
    return {"children_count": len(k.pids), "children_rss": k.rss, "children_uss": k.uss, "children_pss": k.pss,
            "children_pids": k.pids}


def read_host(uss: bool = False, children: bool = True) -> HostReading:
    """Read host memory now. Sizes in bytes; what could not be read as it should is in the
    reading's ``notes`` (an unreadable cgroup limit or usage file, ``/proc`` that could not be
    parsed), with what is shown instead.

    Args:
        uss: also read the USS of this process and of its descendants, and their PSS
            (slower: it walks every mapping of each).
        children: also read this process's descendants (``children_*``); ``False`` leaves them
            at zero (a Jupyter server reads its kernels' trees apart, with their own names).
    """
    found: list[Note] = []
    if _LINUX:
        try:
            reading = _read_host_linux(uss, found, children)
        except (OSError, ValueError) as e:
            found = [Note(NoteCode.HOST_PROC_UNREADABLE, detail=f"{type(e).__name__}: {e}")]
        else:
            return replace(reading, notes=tuple(found)) if found else reading
    reading = _read_host_psutil(uss, children)
    return replace(reading, notes=tuple(found)) if found else reading
