"""One memory table for a ``torchrun`` job: every rank's figures, gathered to rank 0.

In a training script launched with ``torchrun`` (or any script that has called
``torch.distributed.init_process_group``), call it on **every** rank, e.g. at the end of
a step::

    import vramlab.distributed

    for step, batch in enumerate(loader):
        ...
        if step == 10:
            vramlab.distributed.report()          # rank 0 prints the table
            vramlab.distributed.reset_peaks()     # every rank: peaks restart from here

:func:`report` is a collective (it calls ``torch.distributed.all_gather``): a rank that does
not call it makes the others wait until the process group's timeout. On rank 0
of the group it prints one fixed-width table and returns a :class:`DistributedReport`; the
other ranks return ``None`` (or, with ``all_ranks=True``, the same report, which every rank
receives anyway).

Each rank reports, in bytes (``None`` where not known):

- **device**: ``"virtual"`` while a :class:`vramlab.VirtualGPU` is active in that process
  (its ``peak`` and ``allocated``; ``reserved`` is ``None``); else ``"cuda:i"`` when torch
  has initialised CUDA (``torch.cuda.max_memory_allocated`` / ``memory_allocated`` /
  ``memory_reserved`` of that device, and its UUID); else ``"cpu"`` (no device figures).
  CUDA is never initialised by this module for reading: a process that has not used CUDA
  reports ``"cpu"``.
- **host**: the process's RSS and peak RSS (``VmHWM`` on Linux) from :func:`vramlab.snapshot`.

The figures are read before the gather, so the gather's own small buffers (under 1 KiB per
rank) are not in them; they can show up in a later peak.

What travels is numbers only, never a pickle: each rank sends one fixed-size int64 vector
(a header word naming this format and its version, the count of fields, the numeric fields
with a sentinel for "not known", then the host name, device, device name and UUID as
length-prefixed UTF-8 in fixed-size slots, longer ones cut). What arrives is checked (header,
field count, the sender's rank, sane sizes and text); a rank that is out of step (it is in
another collective of the same size while this one is in :func:`report`) raises
:class:`RanksOutOfStep` on the ranks that received its data. An out-of-step peer whose
collective has another size may instead make the backend fail or wait until its timeout.

With the NCCL backend the gather's tensors go through the GPU, on
``torch.cuda.current_device()`` (torch's documented rule: the script should have called
``torch.cuda.set_device(local_rank)``). When a rank is still on the default ``cuda:0``
although its ``LOCAL_RANK`` names another visible GPU (a script that moved its model with
``.to(local_rank)`` but never called ``set_device``), the rank's device is taken to be
``cuda:LOCAL_RANK``: its figures are that device's and the gather runs there, so that the
ranks of a node do not all meet on ``cuda:0``. Tested: the gloo backend on CPU, 2 and 4
ranks on one host. **NCCL and the CUDA figures are untested** (no GPU where this was
written).

Importing this module imports neither torch nor ``torch.distributed``; :func:`report`
imports them when called, and without torch raises :class:`vramlab._extras.MissingExtra`.
"""

from __future__ import annotations

import contextlib
import html
import os
import socket
import struct
import sys
from dataclasses import asdict, dataclass
from typing import Any, Optional, TextIO

from ._extras import require_torch
from .i18n import tr
from .probes.host import reset_peak_rss
from .probes.torch_alloc import reset_peaks as _reset_torch_peaks
from .reconcile import reset_provider_peaks, snapshot
from .units import format_bytes

__all__ = ["RankReport", "DistributedReport", "RanksOutOfStep", "report", "reset_peaks"]


@dataclass(frozen=True)
class RankReport:
    """One rank's memory figures. Sizes in bytes; ``None`` where not known.

    Attributes:
        rank: the global rank (``torch.distributed.get_rank()``).
        local_rank: the rank on its host, from the ``LOCAL_RANK`` variable torchrun sets
            (``None`` when it is not set).
        hostname: ``socket.gethostname()``.
        pid: the process id.
        device: ``"virtual"`` (an active VirtualGPU), ``"cuda:i"``, or ``"cpu"``.
        device_name: the VirtualGPU's or the GPU's name, or ``None``.
        uuid: the GPU's UUID as torch reports it (else as :func:`vramlab.snapshot` has it),
            ``None`` for a VirtualGPU or the CPU.
        peak: the device's peak of allocated bytes since the last reset (CUDA:
            ``torch.cuda.max_memory_allocated``; VirtualGPU: ``peak``).
        allocated: bytes held by tensors now (``memory_allocated``; VirtualGPU: ``allocated``).
        reserved: bytes the CUDA caching allocator holds (``memory_reserved``); ``None`` for a
            VirtualGPU (it has no cache) and the CPU.
        host_rss: the process's resident set size.
        host_peak: the process's peak RSS (``VmHWM``), ``None`` where not available.
        time: ``time.time()`` of the reading, in seconds.
    """

    rank: int
    local_rank: Optional[int]
    hostname: str
    pid: int
    device: str
    device_name: Optional[str]
    uuid: Optional[str]
    peak: Optional[int]
    allocated: Optional[int]
    reserved: Optional[int]
    host_rss: Optional[int]
    host_peak: Optional[int]
    time: float

    def to_dict(self) -> dict[str, Any]:
        """A JSON-safe dict: sizes as ints in bytes, missing figures as ``None``."""
        return asdict(self)


_COLUMNS: tuple[tuple[str, str, bool], ...] = (
    # (field, header, is a size in bytes)
    ("rank", "rank", False),
    ("local_rank", "local", False),
    ("hostname", "host", False),
    ("pid", "pid", False),
    ("device", "device", False),
    ("uuid", "uuid", False),
    ("peak", "peak", True),
    ("allocated", "allocated", True),
    ("reserved", "reserved", True),
    ("host_rss", "RSS", True),
    ("host_peak", "peak RSS", True),
)
_RIGHT = {"rank", "local_rank", "pid", "peak", "allocated", "reserved", "host_rss", "host_peak"}


def printable(text: str) -> str:
    """``text`` as a table may show it: every control or format character (a newline that would
    forge a row, an ANSI escape that would clear the screen, a bidirectional override) written
    as its escape (``\\n``, ``\\x1b``, ``\\u202e``). Peers send their host and device names;
    their strings are shown, never obeyed."""
    if text.isprintable():
        return text
    return "".join(ch if ch.isprintable() else ch.encode("unicode_escape").decode("ascii") for ch in text)


def _header(name: str) -> str:
    """A column's header (:data:`_COLUMNS`) in the current language."""
    words = {"rank": tr("rank"), "local_rank": tr("local"), "hostname": tr("host"), "device": tr("device"),
             "peak": tr("peak"), "allocated": tr("allocated"), "reserved": tr("reserved"), "host_peak": tr("peak RSS")}
    return words.get(name) or next(h for f, h, _ in _COLUMNS if f == name)  # pid, uuid, RSS: the same in every language


@dataclass(frozen=True)
class DistributedReport:
    """Every rank's :class:`RankReport`, in group-rank order.

    Attributes:
        ranks: one report per rank of the group.
        backend: the process group's backend (``"gloo"``, ``"nccl"``, ...).
    """

    ranks: tuple[RankReport, ...]
    backend: str

    @property
    def world_size(self) -> int:
        """The number of ranks reported."""
        return len(self.ranks)

    def max_peak(self) -> Optional[RankReport]:
        """The rank with the highest device peak, or ``None`` when no rank knows its peak."""
        known = [r for r in self.ranks if r.peak is not None]
        return max(known, key=lambda r: (r.peak, -r.rank)) if known else None

    def _cells(self) -> tuple[list[tuple[str, str, bool]], list[list[str]]]:
        cols = [(name, _header(name), is_size) for name, _, is_size in _COLUMNS
                if name != "uuid" or any(r.uuid for r in self.ranks)]
        na = tr("n/a")
        rows = []
        for r in self.ranks:
            row = []
            for name, _, is_size in cols:
                v = getattr(r, name)
                row.append(na if v is None else format_bytes(v) if is_size else printable(str(v)))
            rows.append(row)
        return cols, rows

    def _title(self) -> str:
        n = self.world_size
        if n == 1:
            return tr("vramlab.distributed.report: {n} rank (backend {backend})", n=n, backend=self.backend)
        return tr("vramlab.distributed.report: {n} ranks (backend {backend})", n=n, backend=self.backend)

    def _footer(self) -> str:
        top = self.max_peak()
        if top is None:
            return tr("no rank knows a device peak (CPU-only ranks)")
        return tr("highest device peak: rank {rank} ({device}), {peak}", rank=top.rank, device=printable(top.device),
                  peak=format_bytes(top.peak))

    def text(self) -> str:
        """A fixed-width table, one line per rank; sizes in IEC units, ``n/a`` where unknown.

        The ``uuid`` column is left out when no rank knows a GPU UUID.
        """
        cols, rows = self._cells()
        widths = [max(len(h), *(len(row[i]) for row in rows)) if rows else len(h)
                  for i, (_, h, _) in enumerate(cols)]

        def line(cells: list[str]) -> str:
            out = []
            for (name, _, _), w, c in zip(cols, widths, cells):
                out.append(c.rjust(w) if name in _RIGHT else c.ljust(w))
            return "  ".join(out).rstrip()

        lines = [self._title(), line([h for _, h, _ in cols])]
        lines += [line(row) for row in rows]
        lines.append(self._footer())
        return "\n".join(lines)

    def html(self) -> str:
        """The same table as HTML (escaped)."""
        cols, rows = self._cells()
        head = "".join(f"<th>{html.escape(h)}</th>" for _, h, _ in cols)
        body = "".join(
            "<tr>" + "".join(
                f"<td style='text-align:{'right' if name in _RIGHT else 'left'}'>{html.escape(c)}</td>"
                for (name, _, _), c in zip(cols, row)) + "</tr>"
            for row in rows)
        return (f"<div><b>{html.escape(self._title())}</b><table><thead><tr>{head}</tr></thead>"
                f"<tbody>{body}</tbody></table><small>{html.escape(self._footer())}</small></div>")

    def to_dict(self) -> dict[str, Any]:
        """A JSON-safe dict: ``backend``, ``world_size`` and ``ranks`` (sizes as ints in bytes)."""
        return {"backend": self.backend, "world_size": self.world_size, "ranks": [r.to_dict() for r in self.ranks]}

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, str]:
        return {"text/plain": self.text(), "text/html": self.html()}

    def __str__(self) -> str:
        return self.text()

    def __repr__(self) -> str:
        n = self.world_size
        return f"<vramlab.DistributedReport {n} rank{'s' if n != 1 else ''}, backend {self.backend}>"


# --------------------------------------------------------------------------- reading one rank


def _local_rank() -> Optional[int]:
    v = os.environ.get("LOCAL_RANK")
    try:
        return int(v) if v is not None else None
    except ValueError:
        return None


def _cuda_index(torch: Any, local_rank: Optional[int], *, initialise: bool = False) -> Optional[int]:
    """This rank's CUDA device index, or ``None`` when CUDA is not in use.

    The current device, except the default ``cuda:0`` on a rank whose ``LOCAL_RANK`` names
    another visible GPU: then ``LOCAL_RANK``. Calls nothing that initialises CUDA. With
    ``initialise`` (a gather that will initialise it anyway), a process without CUDA yet
    gets ``LOCAL_RANK`` when it is a visible GPU, else 0."""
    cuda = getattr(torch, "cuda", None)
    if cuda is None:
        return None
    try:
        initialised = bool(cuda.is_initialized())
        if not initialised and not (initialise and cuda.is_available()):
            return None
        n = int(cuda.device_count())
        if not initialised:  # asking for the current device would initialise CUDA on cuda:0
            return local_rank if local_rank is not None and 0 <= local_rank < n else 0
        current = int(cuda.current_device())
    except Exception:
        return None
    if current == 0 and local_rank is not None and 0 < local_rank < n:
        return local_rank
    return current


def _cuda_uuid(torch: Any, i: int, snap: Any) -> Optional[str]:
    try:
        u = getattr(torch.cuda.get_device_properties(i), "uuid", None)
        if u is not None and str(u).strip():
            return str(u).strip()
    except Exception:
        pass
    for d in snap.devices:
        if d.id == f"cuda:{i}" and d.uuid:
            return str(d.uuid)
    return None


def _read_rank(torch: Any, rank: int) -> RankReport:
    """This process's figures, read now (no communication)."""
    snap = snapshot()
    local_rank = _local_rank()
    device, name, uuid = "cpu", None, None
    peak = allocated = reserved = None
    virtual = [d for d in snap.devices if d.kind == "virtual"]
    idx = _cuda_index(torch, local_rank)
    if virtual:
        v = virtual[0]
        device, name = "virtual", v.name
        peak, allocated = v.torch_peak_allocated, v.torch_allocated
    elif idx is not None:
        device = f"cuda:{idx}"
        try:
            peak = int(torch.cuda.max_memory_allocated(idx))
            allocated = int(torch.cuda.memory_allocated(idx))
            reserved = int(torch.cuda.memory_reserved(idx))
        except Exception:
            pass
        try:
            name = str(torch.cuda.get_device_name(idx))
        except Exception:
            pass
        uuid = _cuda_uuid(torch, idx, snap)
    h = snap.host
    return RankReport(rank=rank, local_rank=local_rank, hostname=socket.gethostname(), pid=os.getpid(),
                      device=device, device_name=name, uuid=uuid, peak=peak, allocated=allocated,
                      reserved=reserved, host_rss=h.process_rss, host_peak=h.process_peak, time=snap.time)


# --------------------------------------------------------------------------- the collective


def _dist(feature: str) -> tuple[Any, Any]:
    """torch and torch.distributed, with an initialised default process group; else one clear error."""
    torch = require_torch(feature)
    dist: Any
    try:
        import torch.distributed as dist
    except ImportError:
        dist = None
    if dist is None or not dist.is_available():
        raise RuntimeError(f"{feature} needs torch.distributed, which this torch build does not have")
    if not dist.is_initialized():
        raise RuntimeError(
            f"{feature} needs an initialised process group: call torch.distributed.init_process_group() "
            "first, on every rank (torchrun sets the environment it reads)")
    return torch, dist


class RanksOutOfStep(RuntimeError):
    """What a rank received in :func:`report` is not another rank's report: the ranks of the
    group are out of step (one of them is not in ``report()``, or runs another vramlab)."""


# The wire format: one int64 vector per rank. Word 0 is the header (magic and version), word 1
# the count of numeric fields, then the numeric fields (``_NONE`` where not known), then the
# text fields, each a length word and a fixed slot of bytes.
_MAGIC = 0x76726D6C6162  # "vramlab"
_VERSION = 1
_HEADER = (_MAGIC << 8) | _VERSION
_NONE = -(2**63)
_NUMERIC = ("rank", "local_rank", "pid", "peak", "allocated", "reserved", "host_rss", "host_peak", "time")
# ``time`` (seconds, a float) travels as the 64 bits of its IEEE double
_TEXT = (("hostname", 256), ("device", 32), ("device_name", 128), ("uuid", 64))  # (field, bytes)
_WORDS = 2 + len(_NUMERIC) + sum(1 + n // 8 for _, n in _TEXT)
_MAX_SIZE = 2**62  # bytes: no rank holds more; above it, a figure is not a size


def _cut(text: str, limit: int) -> bytes:
    """``text`` as UTF-8 in at most ``limit`` bytes, cut on a character boundary."""
    raw = text.encode("utf-8", "replace")
    if len(raw) <= limit:
        return raw
    return raw[:limit].decode("utf-8", "ignore").encode("utf-8")


def _encode(rep: RankReport) -> list[int]:
    """``rep`` as the :data:`_WORDS` int64 words of the wire format (sizes in bytes)."""
    values = dict(asdict(rep), time=struct.unpack("<q", struct.pack("<d", float(rep.time)))[0])
    words = [_HEADER, len(_NUMERIC)]
    words += [_NONE if values[f] is None else int(values[f]) for f in _NUMERIC]
    for f, n in _TEXT:
        v = values[f]
        raw = b"" if v is None else _cut(str(v), n)
        words.append(-1 if v is None else len(raw))
        words += list(struct.unpack(f"<{n // 8}q", raw.ljust(n, b"\0")))
    assert len(words) == _WORDS
    return words


def _decode(words: list[int], expected_rank: int, feature: str) -> RankReport:
    """A peer's words back into its :class:`RankReport`; :class:`RanksOutOfStep` when they are not one."""
    def bad(why: str) -> RanksOutOfStep:
        return RanksOutOfStep(
            f"{feature}: what rank {expected_rank} sent is not a report ({why}): the ranks are out of step; "
            "call report() on every rank of the group at the same point, with the same vramlab")

    if len(words) != _WORDS:
        raise bad(f"{len(words)} words, not {_WORDS}")
    if words[0] != _HEADER:
        raise bad(f"header {words[0]:#x}, not {_HEADER:#x}")
    if words[1] != len(_NUMERIC):
        raise bad(f"{words[1]} fields, not {len(_NUMERIC)}")
    nums = dict(zip(_NUMERIC, (None if w == _NONE else w for w in words[2:2 + len(_NUMERIC)])))
    if nums["rank"] != expected_rank:
        raise bad(f"it says it is rank {nums['rank']}")
    when = None if nums["time"] is None else struct.unpack("<d", struct.pack("<q", nums["time"]))[0]
    if nums["pid"] is None or nums["pid"] <= 0 or when is None or not 0 <= when < 2**40:
        raise bad("no process id or time")
    if nums["local_rank"] is not None and nums["local_rank"] < 0:
        raise bad(f"local rank {nums['local_rank']}")
    for f in ("peak", "allocated", "reserved", "host_rss", "host_peak"):
        size = nums[f]
        if size is not None and not 0 <= size < _MAX_SIZE:
            raise bad(f"{f} of {size} bytes")
    texts: dict[str, Optional[str]] = {}
    i = 2 + len(_NUMERIC)
    for f, n in _TEXT:
        length, slot = words[i], words[i + 1:i + 1 + n // 8]
        i += 1 + n // 8
        if not -1 <= length <= n:
            raise bad(f"{f} of {length} bytes")
        raw = struct.pack(f"<{n // 8}q", *slot)
        if any(raw[max(length, 0):]):
            raise bad(f"bytes after the end of {f}")
        if length == -1:
            texts[f] = None
            continue
        try:
            texts[f] = raw[:length].decode("utf-8")
        except UnicodeDecodeError:
            raise bad(f"{f} is not UTF-8") from None
    if texts["hostname"] is None or texts["device"] is None:
        raise bad("no host name or device")
    return RankReport(rank=expected_rank, local_rank=nums["local_rank"], hostname=texts["hostname"],
                      pid=nums["pid"], device=texts["device"], device_name=texts["device_name"],
                      uuid=texts["uuid"], peak=nums["peak"], allocated=nums["allocated"],
                      reserved=nums["reserved"], host_rss=nums["host_rss"], host_peak=nums["host_peak"],
                      time=when)


def _collectives_use_cuda(dist: Any, group: Any) -> bool:
    """Whether a collective on ``group`` needs CUDA tensors: torch's rule is a group whose only
    backend is NCCL (``"cpu:gloo,cuda:nccl"`` takes CPU tensors to gloo)."""
    try:
        backend = str(dist.get_backend(group)).lower()
    except Exception:
        return False
    return "nccl" in backend and "cpu" not in backend and "gloo" not in backend


def _global_ranks(dist: Any, group: Any, size: int) -> list[int]:
    """The global rank of each rank of ``group``, in group-rank order."""
    if group is None:
        return list(range(size))
    try:
        return [int(dist.get_global_rank(group, i)) for i in range(size)]
    except Exception:
        return list(range(size))


def _gather(torch: Any, dist: Any, group: Any, mine: RankReport, size: int,
            feature: str = "vramlab.distributed.report()") -> list[RankReport]:
    """Every rank's report, in group-rank order: one int64 vector each through ``dist.all_gather``
    (on this rank's GPU when the group needs CUDA tensors), checked as it is decoded."""
    t = torch.tensor(_encode(mine), dtype=torch.int64)
    guard: Any = contextlib.nullcontext()
    if _collectives_use_cuda(dist, group):
        idx = _cuda_index(torch, _local_rank(), initialise=True)
        if idx is not None:
            guard = torch.cuda.device(idx)
            t = t.to(torch.device("cuda", idx))
    with guard:
        out = [torch.zeros_like(t) for _ in range(size)]
        dist.all_gather(out, t, group=group)
    return [_decode([int(w) for w in o.cpu().tolist()], r, feature)
            for o, r in zip(out, _global_ranks(dist, group, size))]


def report(group: Any = None, *, print_table: bool = True, all_ranks: bool = False,
           file: Optional[TextIO] = None) -> Optional[DistributedReport]:
    """Gather every rank's memory figures (bytes) and return them on rank 0 as one report.

    A collective: call it on every rank of ``group`` (default: the default process group).

    Args:
        group: the process group to gather over (``None``: the default group). Ranks are
            reported by their global rank; "rank 0" is rank 0 of ``group``.
        print_table: rank 0 prints :meth:`DistributedReport.text` (to ``file``, default stdout).
        all_ranks: return the report on every rank, not only on rank 0 (no extra
            communication: the gather gives every rank every figure).
        file: where rank 0 prints (default ``sys.stdout``).

    Returns:
        On rank 0 of ``group``, a :class:`DistributedReport`; on the other ranks ``None``
        unless ``all_ranks``. A process outside ``group`` gets ``None`` and takes no part.

    Raises:
        MissingExtra: torch is not installed.
        RuntimeError: torch.distributed is unavailable or its process group is not initialised.
        RanksOutOfStep: what a rank sent is not a report (the ranks are out of step; a
            ``RuntimeError``).
    """
    feature = "vramlab.distributed.report()"
    torch, dist = _dist(feature)
    group_rank = dist.get_rank(group)
    if group_rank < 0:  # this process is not in ``group``
        return None
    size = dist.get_world_size(group)
    mine = _read_rank(torch, dist.get_rank())
    gathered = _gather(torch, dist, group, mine, size, feature)
    try:
        backend = str(dist.get_backend(group))
    except Exception:
        backend = "unknown"
    rep = DistributedReport(ranks=tuple(gathered), backend=backend)
    if group_rank == 0:
        if print_table:
            print(rep.text(), file=file or sys.stdout, flush=True)
        return rep
    return rep if all_ranks else None


def reset_peaks() -> None:
    """Reset this process's peak counters, so that the next :func:`report` shows peaks from here.

    Call it on every rank (it is local: no communication, no process group needed). It
    resets torch's CUDA peak statistics on every initialised device (global in torch: it
    also resets what the script's own ``max_memory_allocated`` reads), the active
    VirtualGPU's peak, and the host's peak RSS (Linux ``VmHWM``; elsewhere it cannot be reset).
    """
    reset_peak_rss()
    _reset_torch_peaks()
    reset_provider_peaks()

