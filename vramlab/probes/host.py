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
from dataclasses import dataclass
from typing import Callable, Optional

__all__ = [
    "HostReading",
    "CgroupLimit",
    "read_host",
    "reset_peak_rss",
    "read_uss",
    "parse_cgroup_limit",
    "find_cgroup_limit",
]

_LINUX = sys.platform.startswith("linux")
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096

# A v1 cgroup with no limit reports a huge number (PAGE_COUNTER_MAX * page size).
_V1_UNLIMITED = 1 << 62


@dataclass(frozen=True)
class CgroupLimit:
    """A memory limit found in the cgroup hierarchy.

    Attributes:
        limit: the smallest limit along the process's cgroup and its ancestors, in bytes,
            or ``None`` when no level sets one.
        usage: the cgroup's current charge (``memory.current`` / ``memory.usage_in_bytes``)
            in bytes, or ``None`` when unreadable.
        source: where the limit came from, e.g. ``"cgroup v2 memory.max (/user.slice)"``.
        version: 1 or 2.
        usage_file: the path of the usage file read for ``usage``.
    """

    limit: Optional[int]
    usage: Optional[int]
    source: str
    version: int
    usage_file: Optional[str] = None


@dataclass(frozen=True)
class HostReading:
    """One reading of host memory. Sizes in bytes; ``None`` where unavailable.

    Attributes:
        time: ``time.time()`` of the reading, in seconds.
        total: physical RAM.
        available: memory available to new allocations without swapping (``MemAvailable``),
            capped by what the cgroup limit leaves.
        used: ``total - MemAvailable``, system-wide.
        limit: the effective limit (cgroup limit when lower than RAM, else RAM).
        limit_source: where ``limit`` comes from.
        cgroup_usage: the cgroup's current charge, when a cgroup limit applies.
        process_rss: this process's resident set size.
        process_peak: this process's peak RSS (``VmHWM``; resettable on Linux).
        process_uss: unique set size (private pages), only when asked for (it is costly).
        swap_total, swap_used: swap space.
        swap_in, swap_out: cumulative bytes paged in from / out to swap since boot.
        peak_exact: whether ``process_peak`` is exact and resettable (Linux ``VmHWM``).
    """

    time: float
    total: int
    available: int
    used: int
    limit: int
    limit_source: str
    cgroup_usage: Optional[int]
    process_rss: int
    process_peak: Optional[int]
    process_uss: Optional[int]
    swap_total: Optional[int]
    swap_used: Optional[int]
    swap_in: Optional[int]
    swap_out: Optional[int]
    peak_exact: bool


# --------------------------------------------------------------------------- cgroups


def parse_cgroup_limit(text: str, version: int) -> Optional[int]:
    """Parse the content of a cgroup memory limit file.

    ``version=2``: ``memory.max`` holds ``max`` or an integer.
    ``version=1``: ``memory.limit_in_bytes`` holds an integer; values at or above
    2**62 mean "no limit". Returns the limit in bytes, or ``None`` for no limit.

    Raises:
        ValueError: when the text is neither.
    """
    t = text.strip()
    if version == 2 and t == "max":
        return None
    try:
        value = int(t)
    except ValueError:
        raise ValueError(f"unparseable cgroup v{version} memory limit: {text!r}") from None
    if value < 0 or (version == 1 and value >= _V1_UNLIMITED):
        return None
    return value


def _parse_mountinfo(mountinfo: str) -> list[tuple[str, str, str, str]]:
    """Return (fstype, root, mount_point, super_options) for cgroup mounts."""
    out = []
    for line in mountinfo.splitlines():
        left, sep, right = line.partition(" - ")
        if not sep:
            continue
        fields = left.split()
        rfields = right.split()
        if len(fields) < 5 or not rfields:
            continue
        fstype = rfields[0]
        if fstype not in ("cgroup", "cgroup2"):
            continue
        opts = rfields[2] if len(rfields) > 2 else ""
        out.append((fstype, _unescape(fields[3]), _unescape(fields[4]), opts))
    return out


def _unescape(path: str) -> str:
    return path.replace("\\040", " ").replace("\\011", "\t").replace("\\012", "\n").replace("\\134", "\\")


def _cgroup_dirs(cgroup_text: str, mountinfo_text: str, exists: Callable[[str], bool]) -> list[tuple[int, list[str], str]]:
    """Candidate (version, [dir, parent, ..., mount point], cgroup path) chains for the memory controller."""
    mounts = _parse_mountinfo(mountinfo_text)
    chains: list[tuple[int, list[str], str]] = []
    for line in cgroup_text.splitlines():
        parts = line.strip().split(":", 2)
        if len(parts) != 3:
            continue
        hid, controllers, path = parts
        if hid == "0" and controllers == "":
            version = 2
            candidates = [m for m in mounts if m[0] == "cgroup2"]
        elif "memory" in controllers.split(","):
            version = 1
            candidates = [m for m in mounts if m[0] == "cgroup" and "memory" in m[3].split(",")]
        else:
            continue
        for _fstype, root, mpoint, _opts in candidates:
            if path == root or path.startswith(root.rstrip("/") + "/") or root == "/":
                rel = path[len(root):] if root != "/" else path
            else:
                # A cgroup namespace: our cgroup is the mount's root.
                rel = "/"
            rel = rel.strip("/")
            leaf = os.path.join(mpoint, rel) if rel else mpoint
            if not exists(leaf):
                leaf = mpoint  # the path is outside our namespace: the mount root is ours
            chain = []
            d = leaf
            while True:
                chain.append(d)
                if d == mpoint or len(d) <= len(mpoint):
                    break
                d = os.path.dirname(d)
            chains.append((version, chain, path))
    # Prefer v2 (unified) when it has a memory controller; v1 otherwise.
    chains.sort(key=lambda c: -c[0])
    return chains


def find_cgroup_limit(
    cgroup_text: str,
    mountinfo_text: str,
    read: Callable[[str], Optional[str]],
    exists: Callable[[str], bool] = os.path.isdir,
) -> Optional[CgroupLimit]:
    """Find this process's memory limit from ``/proc/self/cgroup`` and ``/proc/self/mountinfo``.

    ``read(path)`` returns a file's text or ``None`` when it does not exist;
    ``exists(path)`` says whether a directory exists. Both are parameters so the
    parser can be tested on copies of real files. Returns ``None`` when no
    cgroup with a memory controller is found.
    """
    for version, chain, path in _cgroup_dirs(cgroup_text, mountinfo_text, exists):
        limit_file = "memory.max" if version == 2 else "memory.limit_in_bytes"
        usage_file = "memory.current" if version == 2 else "memory.usage_in_bytes"
        leaf_limit = read(os.path.join(chain[0], limit_file))
        if leaf_limit is None and read(os.path.join(chain[0], usage_file)) is None:
            continue  # this hierarchy has no memory controller here
        best: Optional[int] = None
        best_dir = chain[0]
        for d in chain:
            text = read(os.path.join(d, limit_file))
            if text is None:
                continue
            try:
                value = parse_cgroup_limit(text, version)
            except ValueError:
                continue
            if value is not None and (best is None or value < best):
                best, best_dir = value, d
        usage_path = os.path.join(chain[0], usage_file)
        usage_text = read(usage_path)
        usage = None
        if usage_text is not None:
            try:
                usage = int(usage_text.strip())
            except ValueError:
                usage = None
        source = f"cgroup v{version} {limit_file} ({_cg_rel(best_dir, chain[-1])})"
        return CgroupLimit(limit=best, usage=usage, source=source, version=version,
                           usage_file=usage_path if usage_text is not None else None)
    return None


def _cg_rel(d: str, mpoint: str) -> str:
    rel = d[len(mpoint):] if d.startswith(mpoint) else d
    return rel or "/"


def _read_text(path: str) -> Optional[str]:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return None


class _CgroupFiles:
    """This process's cgroup, found once per process; its limit is read with
    :func:`find_cgroup_limit` (the parser the tests check on copies of real files)."""

    def __init__(self) -> None:
        self.resolved = False
        self.usage_file: Optional[str] = None
        self._texts: Optional[tuple[str, str]] = None
        self._limit: tuple[Optional[int], str] = (None, "")
        self._limit_time = -float("inf")

    def resolve(self) -> None:
        self.resolved = True
        if not _LINUX:
            return
        cg = _read_text("/proc/self/cgroup")
        mi = _read_text("/proc/self/mountinfo")
        if not cg or not mi:
            return
        self._texts = (cg, mi)
        found = find_cgroup_limit(cg, mi, _read_text)
        self.usage_file = found.usage_file if found is not None else None

    def read(self) -> tuple[Optional[int], Optional[int], str]:
        """Return (limit, usage, source) in bytes; limit ``None`` when unlimited.

        The limit files are re-read at most every :data:`CGROUP_LIMIT_TTL` seconds
        (limits are set by the container runtime and change rarely); the usage
        file is read on every call when a limit applies.
        """
        if not self.resolved:
            self.resolve()
        now = time.monotonic()
        if now - self._limit_time >= CGROUP_LIMIT_TTL:
            self._limit = self._read_limit()
            self._limit_time = now
        best, source = self._limit
        usage = None
        if best is not None and self.usage_file:
            raw = _os_read(self.usage_file)
            if raw is not None:
                try:
                    usage = int(raw)
                except ValueError:
                    usage = None
        return best, usage, source

    def _read_limit(self) -> tuple[Optional[int], str]:
        if self._texts is None:
            return None, ""
        found = find_cgroup_limit(*self._texts, _read_text)
        if found is None or found.limit is None:
            return None, ""
        return found.limit, found.source


_CGROUP = _CgroupFiles()

#: Seconds between re-reads of the cgroup limit files (the usage is read every time).
CGROUP_LIMIT_TTL = 2.0


def _os_read(path: str, size: int = 65536) -> Optional[bytes]:
    """Read a small /proc or /sys file with one syscall pair; ``None`` when unreadable."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        return os.read(fd, size)
    except OSError:
        return None
    finally:
        os.close(fd)


class _SwapCounters:
    """pswpin/pswpout from /proc/vmstat. Without swap space nothing can page, so the
    counters are read once and kept until swap appears."""

    def __init__(self) -> None:
        self.value: tuple[Optional[int], Optional[int]] = (None, None)
        self.read_once = False

    def read(self, swap_total: Optional[int]) -> tuple[Optional[int], Optional[int]]:
        if self.read_once and swap_total == 0:
            return self.value
        data = _os_read("/proc/vmstat")
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
    status = _os_read("/proc/self/status")
    meminfo = _os_read("/proc/meminfo")
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
    cg_limit, cg_usage, cg_source = _CGROUP.read()
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
