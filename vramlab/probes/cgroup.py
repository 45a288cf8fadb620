"""cgroup v1/v2 memory limits: find the effective limit of this process's cgroup.

The *effective limit* is the memory the process can really use: the cgroup
v2 ``memory.max`` or v1 ``memory.limit_in_bytes`` of this process's cgroup
(the smallest along its ancestors). On Binder or in a container it is the
number that matters. All sizes are in bytes.

The usage set against that limit is the usage of the cgroup **that sets the limit**: when
an ancestor sets it (a JupyterHub user's systemd slice, a Kubernetes pod around its
containers), everything charged below that ancestor counts, siblings included. And it is
the **working set**, as kubelet computes it for its eviction and OOM decisions: the charge
(``memory.current``, v1 ``memory.usage_in_bytes``) minus the inactive page cache
(``inactive_file`` in ``memory.stat``; v1 ``total_inactive_file``, which is hierarchical),
since the kernel reclaims that cache before it kills anything.

:func:`find_cgroup_limit` is a pure parser over the texts of ``/proc/self/cgroup``
and ``/proc/self/mountinfo`` and a file reader, so the tests run it on copies of
real files; :data:`CGROUP` applies it to this process once and re-reads the limit
files at most every :data:`CGROUP_LIMIT_TTL` seconds.
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass
from typing import Callable, Optional

__all__ = ["CgroupLimit", "parse_cgroup_limit", "parse_inactive_file", "working_set", "find_cgroup_limit",
           "CgroupFiles", "CGROUP", "CGROUP_LIMIT_TTL", "os_read"]

_LINUX = sys.platform.startswith("linux")

# A v1 cgroup with no limit reports a huge number (PAGE_COUNTER_MAX * page size).
_V1_UNLIMITED = 1 << 62


@dataclass(frozen=True)
class CgroupLimit:
    """A memory limit found in the cgroup hierarchy.

    Attributes:
        limit: the smallest limit along the process's cgroup and its ancestors, in bytes,
            or ``None`` when no level sets one.
        usage: the charge (``memory.current`` / ``memory.usage_in_bytes``) of the cgroup that
            sets the limit (this process's own cgroup when none does), in bytes, or ``None``
            when unreadable.
        source: where the limit came from, e.g. ``"cgroup v2 memory.max (/user.slice)"``.
        version: 1 or 2.
        usage_file: the path of the usage file read for ``usage``.
        inactive_file: that cgroup's inactive page cache (``memory.stat``), in bytes, or
            ``None`` when unreadable.
        stat_file: the path of that ``memory.stat``.
    """

    limit: Optional[int]
    usage: Optional[int]
    source: str
    version: int
    usage_file: Optional[str] = None
    inactive_file: Optional[int] = None
    stat_file: Optional[str] = None

    @property
    def working_set(self) -> Optional[int]:
        """``usage - inactive_file`` (kubelet's working set), in bytes; ``usage`` when the
        stat is unreadable, ``None`` when the usage is."""
        return working_set(self.usage, self.inactive_file)


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


def parse_inactive_file(text: str | bytes, version: int) -> Optional[int]:
    """The inactive page cache in a ``memory.stat``, in bytes, or ``None`` when absent.

    v2: ``inactive_file`` (a cgroup's stat counts its descendants). v1:
    ``total_inactive_file`` (the hierarchical count), else ``inactive_file``.
    """
    if isinstance(text, bytes):
        text = text.decode("ascii", "replace")
    fields = {}
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        if value.strip().isdigit():
            fields[key] = int(value)
    keys = ("inactive_file",) if version == 2 else ("total_inactive_file", "inactive_file")
    for k in keys:
        if k in fields:
            return fields[k]
    return None


def working_set(usage: Optional[int], inactive_file: Optional[int]) -> Optional[int]:
    """``usage - inactive_file``, never below 0, in bytes (kubelet's working set)."""
    if usage is None:
        return None
    if inactive_file is None:
        return usage
    return max(usage - inactive_file, 0)


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
        # the usage that the limit is set against: the limiting cgroup's (siblings included)
        usage_dir = best_dir if best is not None else chain[0]
        usage_path = os.path.join(usage_dir, usage_file)
        usage_text = read(usage_path)
        usage = None
        if usage_text is not None:
            try:
                usage = int(usage_text.strip())
            except ValueError:
                usage = None
        stat_path = os.path.join(usage_dir, "memory.stat")
        stat_text = read(stat_path)
        inactive = parse_inactive_file(stat_text, version) if stat_text is not None else None
        source = f"cgroup v{version} {limit_file} ({_cg_rel(best_dir, chain[-1])})"
        return CgroupLimit(limit=best, usage=usage, source=source, version=version,
                           usage_file=usage_path if usage_text is not None else None,
                           inactive_file=inactive, stat_file=stat_path if inactive is not None else None)
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


class CgroupFiles:
    """This process's cgroup, found once per process; its limit is read with
    :func:`find_cgroup_limit` (the parser the tests check on copies of real files)."""

    def __init__(self, texts: Optional[tuple[str, str]] = None,
                 read_text: Optional[Callable[[str], Optional[str]]] = None,
                 read_bytes: Optional[Callable[[str], Optional[bytes]]] = None,
                 exists: Optional[Callable[[str], bool]] = None) -> None:
        # texts: (/proc/self/cgroup, /proc/self/mountinfo); the readers default to the real files
        # (the tests give copies of real files instead)
        self.resolved = texts is not None
        self._read_text = read_text or _read_text
        self._read_bytes = read_bytes or os_read
        self._exists = exists or os.path.isdir
        self.usage_file: Optional[str] = None
        self.stat_file: Optional[str] = None
        self.version = 2
        self._texts: Optional[tuple[str, str]] = texts
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

    def read(self) -> tuple[Optional[int], Optional[int], str]:
        """Return (limit, working set, source) in bytes; limit ``None`` when unlimited.

        The working set is that of the cgroup that sets the limit (see the module docs).
        The limit files are re-read at most every :data:`CGROUP_LIMIT_TTL` seconds
        (limits are set by the container runtime and change rarely); the usage and
        ``memory.stat`` are read on every call when a limit applies.
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
            raw = self._read_bytes(self.usage_file)
            if raw is not None:
                try:
                    usage = int(raw)
                except ValueError:
                    usage = None
            inactive = None
            if usage is not None and self.stat_file:
                stat = self._read_bytes(self.stat_file)
                inactive = parse_inactive_file(stat, self.version) if stat is not None else None
            usage = working_set(usage, inactive)
        return best, usage, source

    def _read_limit(self) -> tuple[Optional[int], str]:
        if self._texts is None:
            return None, ""
        found = find_cgroup_limit(*self._texts, self._read_text, self._exists)
        if found is None or found.limit is None:
            self.usage_file = self.stat_file = None
            return None, ""
        self.usage_file, self.stat_file, self.version = found.usage_file, found.stat_file, found.version
        return found.limit, found.source



#: Seconds between re-reads of the cgroup limit files (the usage is read every time).
CGROUP_LIMIT_TTL = 2.0


def os_read(path: str, size: int = 65536) -> Optional[bytes]:
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


#: This process's cgroup (read by :func:`vramlab.probes.host.read_host`).
CGROUP = CgroupFiles()
