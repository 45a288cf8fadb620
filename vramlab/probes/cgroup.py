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

A limit or usage file that cannot be read (missing where the kernel always writes it,
empty, not a byte count, not text) is never taken for "no limit" in silence: the reading
says which file and what it held (:attr:`CgroupLimit.limit_errors`, :class:`CgroupReading`),
and :func:`vramlab.probes.host.read_host` turns that into a note. ``max`` (v2) and the v1
"unlimited" value are not errors: they mean no limit.
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass
from typing import Callable, NamedTuple, Optional

__all__ = ["CgroupLimit", "CgroupReading", "parse_cgroup_limit", "parse_byte_count", "parse_inactive_file",
           "working_set", "find_cgroup_limit", "CgroupFiles", "CGROUP", "CGROUP_LIMIT_TTL", "os_read"]

_LINUX = sys.platform.startswith("linux")

# A v1 cgroup with no limit reports a huge number (PAGE_COUNTER_MAX * page size).
_V1_UNLIMITED = 1 << 62
# The kernel's memory counters are signed 64-bit: no limit or usage it writes reaches 2**63 bytes.
_MAX_BYTES = 1 << 63
# The longest figure shown in a note (a corrupt file may hold anything).
_SHOWN = 32


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
        usage_file: the path of the usage file of that cgroup (read for ``usage``).
        inactive_file: that cgroup's inactive page cache (``memory.stat``), in bytes, or
            ``None`` when unreadable.
        stat_file: the path of that ``memory.stat``, or ``None`` when it does not exist.
        limit_errors: one line for each limit file along the chain that could not be read,
            e.g. ``"memory.max of /: 'garbage'"`` (``limit`` is then the smallest of the others,
            or ``None``).
        usage_error: why ``usage`` is ``None`` (``"memory.current of /: missing"``), or ``None``.
        stat_error: why the ``memory.stat`` that exists could not be read, or ``None``.
        cgroup: the cgroup whose usage is read (the one that sets the limit, else this
            process's own), as a path below the hierarchy's mount point (``"/"`` for its root).
    """

    limit: Optional[int]
    usage: Optional[int]
    source: str
    version: int
    usage_file: Optional[str] = None
    inactive_file: Optional[int] = None
    stat_file: Optional[str] = None
    limit_errors: tuple[str, ...] = ()
    usage_error: Optional[str] = None
    stat_error: Optional[str] = None
    cgroup: str = "/"

    @property
    def working_set(self) -> Optional[int]:
        """``usage - inactive_file`` (kubelet's working set), in bytes; ``usage`` when the
        stat is unreadable, ``None`` when the usage is."""
        return working_set(self.usage, self.inactive_file)


# --------------------------------------------------------------------------- cgroups


def parse_byte_count(text: str | bytes) -> int:
    """A byte count as the kernel writes one in a cgroup file: decimal ASCII digits, below 2**63.

    Raises:
        ValueError: for anything else (empty, negative, not digits, not text, too large).
    """
    t = text.strip()
    # a length check first: int() of a huge string is slow, and refused above 4300 digits
    if not t or len(t) > 20 or not t.isdigit() or (isinstance(t, str) and not t.isascii()):
        raise ValueError(f"not a byte count: {_shown(t)}")
    value = int(t)
    if value >= _MAX_BYTES:
        raise ValueError(f"not a byte count: {_shown(t)}")
    return value


def parse_cgroup_limit(text: str, version: int) -> Optional[int]:
    """Parse the content of a cgroup memory limit file.

    ``version=2``: ``memory.max`` holds ``max`` or an integer.
    ``version=1``: ``memory.limit_in_bytes`` holds an integer; values at or above
    2**62 mean "no limit". Returns the limit in bytes, or ``None`` for no limit.

    Raises:
        ValueError: when the text is neither (also for a negative number, or one at or above
            2**63, which the kernel never writes).
    """
    t = text.strip()
    if version == 2 and t == "max":
        return None
    try:
        value = parse_byte_count(t)
    except ValueError:
        raise ValueError(f"unparseable cgroup v{version} memory limit: {_shown(t)}") from None
    if version == 1 and value >= _V1_UNLIMITED:
        return None
    return value


def _shown(text: str | bytes) -> str:
    """A file's content as a note shows it: quoted, cut to a few dozen characters."""
    t = text.strip()
    if isinstance(t, bytes):
        try:
            t = t.decode("utf-8")
        except UnicodeDecodeError:
            return "not UTF-8 text"
    if not t:
        return "empty"
    if len(t) > _SHOWN:
        return f"{t[:_SHOWN]!r}... ({len(t)} characters)"
    return repr(t)


def parse_inactive_file(text: str | bytes, version: int) -> Optional[int]:
    """The inactive page cache in a ``memory.stat``, in bytes, or ``None`` when absent.

    v2: ``inactive_file`` (a cgroup's stat counts its descendants). v1:
    ``total_inactive_file`` (the hierarchical count), else ``inactive_file``.
    """
    if isinstance(text, bytes):
        text = text.decode("ascii", "replace")
    keys = ("inactive_file",) if version == 2 else ("total_inactive_file", "inactive_file")
    fields = {}
    for line in text.splitlines():  # only the lines wanted are parsed (memory.stat has about 40)
        key, _, value = line.partition(" ")
        if key not in keys:
            continue
        try:
            fields[key] = parse_byte_count(value)
        except ValueError:
            continue  # not a count (a corrupt line): left out
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


def _read_checked(read: Callable[[str], Optional[str]], path: str) -> tuple[Optional[str], Optional[str]]:
    """``(text, None)``; ``(None, None)`` when the file does not exist; ``(None, why)`` when
    it exists but cannot be read as text (``read`` raised: not UTF-8, an I/O error)."""
    try:
        return read(path), None
    except UnicodeError:
        return None, "not UTF-8 text"
    except (OSError, ValueError) as e:
        return None, f"unreadable ({type(e).__name__}: {e})"


def find_cgroup_limit(
    cgroup_text: str,
    mountinfo_text: str,
    read: Callable[[str], Optional[str]],
    exists: Callable[[str], bool] = os.path.isdir,
    dirs: Optional[list[tuple[int, list[str], str]]] = None,
) -> Optional[CgroupLimit]:
    """Find this process's memory limit from ``/proc/self/cgroup`` and ``/proc/self/mountinfo``.

    ``read(path)`` returns a file's text or ``None`` when it does not exist (it may raise
    ``UnicodeDecodeError`` for a file that is not text: that file counts as unreadable);
    ``exists(path)`` says whether a directory exists. Both are parameters so the
    parser can be tested on copies of real files. Returns ``None`` when no
    cgroup with a memory controller is found. Sizes in bytes.

    A limit file that cannot be parsed is left out of the smallest limit and named in
    :attr:`CgroupLimit.limit_errors`; so is one that is missing where the cgroup has a
    memory controller (its usage file exists), except on the hierarchy's root above this
    process's cgroup, where the kernel writes none. ``dirs``: the cgroup directories these two
    texts give (:func:`_cgroup_dirs`), when the caller keeps them.
    """
    if dirs is None:
        dirs = _cgroup_dirs(cgroup_text, mountinfo_text, exists)
    for version, chain, _path in dirs:
        limit_file = "memory.max" if version == 2 else "memory.limit_in_bytes"
        usage_file = "memory.current" if version == 2 else "memory.usage_in_bytes"
        leaf_limit, leaf_err = _read_checked(read, os.path.join(chain[0], limit_file))
        if leaf_limit is None and leaf_err is None and _read_checked(read, os.path.join(chain[0], usage_file)) == (
                None, None):
            continue  # this hierarchy has no memory controller here
        best: Optional[int] = None
        best_dir = chain[0]
        errors: list[str] = []
        for d in chain:
            text, err = _read_checked(read, os.path.join(d, limit_file))
            where = f"{limit_file} of {_cg_rel(d, chain[-1])}"
            if text is None:
                if err is not None:
                    errors.append(f"{where}: {err}")
                elif (d != chain[-1] or len(chain) == 1) and _read_checked(read, os.path.join(d, usage_file)) != (
                        None, None):
                    errors.append(f"{where}: missing")  # a memory controller here, and no limit file
                continue
            try:
                value = parse_cgroup_limit(text, version)
            except ValueError:
                errors.append(f"{where}: {_shown(text)}")
                continue
            if value is not None and (best is None or value < best):
                best, best_dir = value, d
        # the usage that the limit is set against: the limiting cgroup's (siblings included)
        usage_dir = best_dir if best is not None else chain[0]
        rel = _cg_rel(usage_dir, chain[-1])
        usage_path = os.path.join(usage_dir, usage_file)
        usage_text, usage_err = _read_checked(read, usage_path)
        usage: Optional[int] = None
        if usage_text is None:
            usage_err = f"{usage_file} of {rel}: {usage_err or 'missing'}"
        else:
            try:
                usage = parse_byte_count(usage_text)
            except ValueError:
                usage_err = f"{usage_file} of {rel}: {_shown(usage_text)}"
        stat_path = os.path.join(usage_dir, "memory.stat")
        stat_text, stat_err = _read_checked(read, stat_path)
        inactive = parse_inactive_file(stat_text, version) if stat_text is not None else None
        source = f"cgroup v{version} {limit_file} ({_cg_rel(best_dir, chain[-1])})"
        return CgroupLimit(limit=best, usage=usage, source=source, version=version, usage_file=usage_path,
                           inactive_file=inactive,
                           stat_file=stat_path if stat_text is not None or stat_err is not None else None,
                           limit_errors=tuple(errors), usage_error=usage_err,
                           stat_error=None if stat_err is None else f"memory.stat of {rel}: {stat_err}",
                           cgroup=rel)
    return None


def _cg_rel(d: str, mpoint: str) -> str:
    rel = d[len(mpoint):] if d.startswith(mpoint) else d
    return rel or "/"


def _read_text(path: str) -> Optional[str]:
    """A cgroup file's text, ``None`` when it cannot be opened or read.

    Raises:
        UnicodeDecodeError: the file is not UTF-8 text (:func:`find_cgroup_limit` counts it
            as unreadable, and says so).
    """
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError:
        return None
    return data.decode("utf-8")


def _read_proc_text(path: str) -> Optional[str]:
    """``/proc/self/cgroup`` or ``/proc/self/mountinfo``, ``None`` when unreadable. Paths in
    them may hold any bytes: they are decoded as the OS decodes paths (``os.fsdecode``)."""
    try:
        with open(path, "rb") as f:
            return os.fsdecode(f.read())
    except OSError:
        return None


class CgroupReading(NamedTuple):
    """One reading of this process's cgroup (:meth:`CgroupFiles.read`). Sizes in bytes.

    Attributes:
        limit: the effective cgroup limit, or ``None`` when no level sets one (or none
            could be read: see ``limit_errors``).
        usage: the working set of the cgroup that sets the limit, or ``None`` when there is
            no limit or the usage could not be read (see ``usage_error``).
        source: where the limit comes from (``""`` without one).
        limit_errors: the limit files that could not be read, one line each (see
            :attr:`CgroupLimit.limit_errors`).
        usage_error: why ``usage`` is ``None`` while a limit applies, or ``None``.
        stat_error: why the ``memory.stat`` could not be read (the usage then counts the
            inactive page cache), or ``None``.
    """

    limit: Optional[int]
    usage: Optional[int]
    source: str
    limit_errors: tuple[str, ...] = ()
    usage_error: Optional[str] = None
    stat_error: Optional[str] = None


class _Found(NamedTuple):
    """What the last read of the limit files found (replaced as a whole: readers in other
    threads see one reading or the next, never half of each)."""

    limit: Optional[int] = None
    source: str = ""
    usage_file: Optional[str] = None
    stat_file: Optional[str] = None
    version: int = 2
    limit_errors: tuple[str, ...] = ()
    cgroup: str = "/"


class CgroupFiles:
    """This process's cgroup, found once per process; its limit is read with
    :func:`find_cgroup_limit` (the parser the tests check on copies of real files).
    Thread-safe: a reading never raises for a file it cannot read."""

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
        self._texts: Optional[tuple[str, str]] = texts
        self._dirs: Optional[list[tuple[int, list[str], str]]] = None
        self._found = _Found()
        self._limit_time = -float("inf")

    @property
    def usage_file(self) -> Optional[str]:
        """The usage file read on every reading (the limiting cgroup's), or ``None``."""
        return self._found.usage_file

    @property
    def stat_file(self) -> Optional[str]:
        """The ``memory.stat`` read on every reading, or ``None``."""
        return self._found.stat_file

    @property
    def version(self) -> int:
        """The cgroup version (1 or 2) of the last limit found."""
        return self._found.version

    def resolve(self) -> None:
        """Read ``/proc/self/cgroup`` and ``/proc/self/mountinfo`` (once per process). Counts
        as done only once it finished: an interrupt leaves it to the next reading."""
        if not _LINUX:
            self.resolved = True
            return
        cg = _read_proc_text("/proc/self/cgroup")
        mi = _read_proc_text("/proc/self/mountinfo")
        if cg and mi:
            self._texts = (cg, mi)
            self._dirs = None
        self.resolved = True

    def read(self) -> CgroupReading:
        """Read the limit and the working set now; see :class:`CgroupReading` (bytes).

        The working set is that of the cgroup that sets the limit (see the module docs).
        The limit files are re-read at most every :data:`CGROUP_LIMIT_TTL` seconds
        (limits are set by the container runtime and change rarely); the usage and
        ``memory.stat`` are read on every call when a limit applies.
        """
        if not self.resolved:
            self.resolve()
        now = time.monotonic()
        if now - self._limit_time >= CGROUP_LIMIT_TTL:
            self._found = self._read_limit()
            self._limit_time = now
        found = self._found
        if found.limit is None or found.usage_file is None:
            return CgroupReading(found.limit, None, found.source, found.limit_errors)
        usage: Optional[int] = None
        usage_error = stat_error = None
        raw = self._read_bytes(found.usage_file)
        where = f"{os.path.basename(found.usage_file)} of {found.cgroup}"
        if raw is None:
            usage_error = f"{where}: missing"
        else:
            try:
                usage = parse_byte_count(raw)
            except ValueError:
                usage_error = f"{where}: {_shown(raw)}"
        inactive = None
        if usage is not None and found.stat_file:
            stat = self._read_bytes(found.stat_file)
            if stat is not None:
                try:
                    inactive = parse_inactive_file(stat.decode("utf-8"), found.version)
                except UnicodeDecodeError:
                    stat_error = f"memory.stat of {found.cgroup}: not UTF-8 text"
        return CgroupReading(found.limit, working_set(usage, inactive), found.source, found.limit_errors,
                             usage_error, stat_error)

    def _read_limit(self) -> _Found:
        if self._texts is None:
            return _Found()
        if self._dirs is None:  # the texts are read once per process, so are the directories they give
            self._dirs = _cgroup_dirs(*self._texts, self._exists)
        found = find_cgroup_limit(*self._texts, self._read_text, self._exists, dirs=self._dirs)
        if found is None:
            return _Found()
        if found.limit is None:
            return _Found(limit_errors=found.limit_errors, version=found.version)
        return _Found(found.limit, found.source, found.usage_file, found.stat_file, found.version,
                      found.limit_errors, found.cgroup)


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
