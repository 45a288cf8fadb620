"""The data: frozen readings and records, their layer keys and labels. Nothing above it.

Every size is an ``int`` in bytes and every time a ``float`` in seconds (``time.time()``
for moments, ``perf_counter`` differences for durations); ``None`` means "not read".

- :class:`HostReading`, :class:`HostSnapshot`, :class:`DeviceSnapshot`, :class:`Snapshot`:
  one reconciled reading of every layer (:mod:`vramlab.reconcile` makes them);
- :class:`CellRecord` (with :class:`HostDelta`, :class:`DeviceDelta`): what one cell did;
- :class:`Sample` (with :class:`DeviceSample`), :class:`Marker`, :class:`History`: the
  sampler's ring and the timeline;
- :class:`OOMExplanation`, :class:`FreedReport`: what an OOM asked for, and what
  ``%vram free`` returned.

These classes do not render themselves. :mod:`vramlab.display` registers its renderers
here (:func:`register_renderer`) when it is imported, which ``import vramlab`` does, and
``_repr_mimebundle_``/``text()`` look them up by name: the data never imports the display.
"""

from __future__ import annotations

import datetime as _dt
import os
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, NamedTuple, Optional

from .facts import Advice, MarkerKind, Note, Problem
from .files import write_atomically

__all__ = [
    "Consumer",
    "FreedDevice",
    "DEVICE_LAYERS",
    "HOST_LAYERS",
    "HostReading",
    "HostSnapshot",
    "DeviceSnapshot",
    "Snapshot",
    "HostDelta",
    "DeviceDelta",
    "CellRecord",
    "DeviceSample",
    "Sample",
    "Marker",
    "History",
    "OOMExplanation",
    "FreedReport",
    "register_renderer",
]

#: Device layer keys, bottom to top, with their labels.
DEVICE_LAYERS: dict[str, str] = {
    "tensors": "tensors",
    "torch_cache": "torch cache",
    "context": "context & non-torch",
    "children": "child processes",
    "unattributed": "unattributed",
    "other_processes": "other processes",
    "driver_reserved": "driver reserved",
    "free": "free",
}

#: Host layer keys with their labels.
HOST_LAYERS: dict[str, str] = {
    "process": "this process",
    "children": "child processes",
    "others": "others",
    "out_of_reach": "out of reach",
    "available": "available",
}

# --------------------------------------------------------------------------- renderers

_RENDERERS: dict[str, Callable[..., str]] = {}


def register_renderer(name: str, fn: Callable[..., str]) -> None:
    """Register the function that renders one kind of output, e.g. ``"snapshot.html"``.

    :mod:`vramlab.display` registers ``snapshot.text``, ``snapshot.html``, ``record.text``,
    ``record.html``, ``record.line``, ``history.text``, ``oom.text``, ``oom.html`` and
    ``freed.text``. A later registration under the same name replaces the earlier one.
    """
    _RENDERERS[name] = fn


def _render(name: str, obj: Any, **kwargs: Any) -> str:
    fn = _RENDERERS.get(name)
    if fn is None:  # only when vramlab.display failed to import
        return repr(obj)
    return fn(obj, **kwargs)


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
        cgroup_usage: when a cgroup limit applies, the working set of the cgroup that sets
            it (its charge, siblings included, minus the inactive page cache the kernel
            reclaims before an OOM kill; kubelet's figure), else ``None``.
        process_rss: this process's resident set size.
        process_peak: this process's peak RSS (``VmHWM``; resettable on Linux).
        process_uss: unique set size (private pages), only when asked for (it is costly).
        swap_total, swap_used: swap space.
        swap_in, swap_out: cumulative bytes paged in from / out to swap since boot.
        peak_exact: whether ``process_peak`` is exact and resettable (Linux ``VmHWM``).
        children_count: how many processes descend from this one (children, recursively:
            DataLoader workers, ``torch.multiprocessing``, ``notebook_launcher`` workers),
            zombies left out.
        children_rss: their RSS, summed. Forked workers share pages with this process and
            with each other (copy-on-write), and each RSS counts every shared page again, so
            the sum over-counts what they add.
        children_uss: their unique set sizes (pages no other process maps), summed: what
            they add beyond this process. Only when asked for (costly), and ``None`` when
            one of them could not be read.
        children_pss: their proportional set sizes (each shared page split between the
            processes that map it), summed; when asked for, where the OS gives it (Linux).
        children_pids: their PIDs, in the order they were found (parents before children).
        notes: what could not be read as it should, and what is shown instead
            (:class:`~vramlab.facts.Note`: an unreadable cgroup file, ``/proc`` unreadable).
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
    children_count: int = 0
    children_rss: int = 0
    children_uss: Optional[int] = None
    children_pss: Optional[int] = None
    children_pids: tuple[int, ...] = ()
    notes: tuple[Note, ...] = ()


@dataclass(frozen=True)
class HostSnapshot(HostReading):
    """Host memory, in bytes (every field of :class:`HostReading`), with its reconciled
    layers: ``process``, ``children``, ``others``, ``out_of_reach``, ``available`` (see
    :mod:`vramlab.reconcile`)."""

    layers: tuple[tuple[str, int], ...] = ()

    def layer(self, key: str) -> int:
        """The size of one layer in bytes (0 when absent)."""
        return dict(self.layers).get(key, 0)


@dataclass(frozen=True)
class DeviceSnapshot:
    """One accelerator, in bytes, reconciled across NVML and the torch allocator.

    ``id`` is torch's name for the device (``cuda:0``), or ``nvml:N`` for an NVIDIA
    GPU this process cannot see (hidden by CUDA_VISIBLE_DEVICES), or ``virtual:0``.
    ``source`` says which readings it combines (``"nvml+torch"``, ``"nvml"``,
    ``"torch"``, ``"virtual"``). ``children_used`` is what NVML lists under the PIDs of
    this process's descendants (``None`` when not read); ``other_processes_used`` leaves it out.
    ``unreadable`` says why a device NVML lists has no figures (a lost GPU), else ``None``.
    """

    id: str
    kind: str
    name: Optional[str]
    uuid: Optional[str]
    source: str
    nvml_index: Optional[int]
    total: Optional[int]
    free: Optional[int]
    used: Optional[int]
    driver_reserved: Optional[int]
    process_used: Optional[int]
    other_processes_used: Optional[int]
    utilization: Optional[int]
    torch_allocated: Optional[int]
    torch_reserved: Optional[int]
    torch_active: Optional[int]
    torch_inactive_split: Optional[int]
    torch_peak_allocated: Optional[int]
    torch_peak_reserved: Optional[int]
    num_ooms: Optional[int]
    num_alloc_retries: Optional[int]
    mem_info_free: Optional[int]
    mem_info_total: Optional[int]
    unified_memory: bool
    layers: tuple[tuple[str, int], ...]
    children_used: Optional[int] = None
    unreadable: Optional[Problem] = None

    def layer(self, key: str) -> int:
        """The size of one layer in bytes (0 when absent)."""
        return dict(self.layers).get(key, 0)


@dataclass(frozen=True)
class Snapshot:
    """A frozen reading of every layer. ``to_dict()`` is JSON-safe.

    Attributes:
        time: seconds since the epoch (``time.time()``).
        host: the host reading.
        devices: every accelerator, torch order first.
        notes: one :class:`~vramlab.facts.Note` for each reading that is missing, and why
            (:func:`vramlab.display.words.note_text` says it in words).
    """

    time: float
    host: HostSnapshot
    devices: tuple[DeviceSnapshot, ...]
    notes: tuple[Note, ...] = field(default_factory=tuple)

    def device(self, id: str) -> DeviceSnapshot:
        """The device named ``id`` (``"cuda:0"``); ``KeyError`` when absent."""
        for d in self.devices:
            if d.id == id:
                return d
        raise KeyError(f"no device {id!r} in this snapshot (have: {', '.join(d.id for d in self.devices) or 'none'})")

    def to_dict(self) -> dict[str, Any]:
        """A JSON-safe dict: sizes as ints in bytes, missing readings as ``None``, each note as its
        code and fields (:meth:`vramlab.facts.Note.to_dict`; the CLI's JSON adds its text)."""
        host = asdict(self.host)
        host["layers"] = dict(self.host.layers)
        host["children_pids"] = list(self.host.children_pids)
        host["notes"] = [n.to_dict() for n in self.host.notes]
        devices = []
        for d in self.devices:
            dd = asdict(d)
            dd["layers"] = dict(d.layers)
            devices.append(dd)
        return {
            "time": self.time,
            "time_iso": _dt.datetime.fromtimestamp(self.time, _dt.timezone.utc).isoformat(),
            "host": host,
            "devices": devices,
            "notes": [n.to_dict() for n in self.notes],
        }

    def __repr__(self) -> str:
        ids = ", ".join(d.id for d in self.devices) or "no accelerators"
        return f"<vramlab.Snapshot host + {ids}>"

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, str]:
        return {"text/plain": _render("snapshot.text", self), "text/html": _render("snapshot.html", self)}


@dataclass(frozen=True)
class HostDelta:
    """Host changes over one cell (bytes). ``peak_delta`` is the peak RSS during the
    cell minus RSS at its start; ``None`` when the peak is not known.

    ``children_*``: this process's descendants (see :class:`HostReading`) at the cell's
    start and end: their number, their summed RSS (which counts the pages they share
    with this process once in each), and their summed USS (what they add beyond this
    process), ``None`` unless the record read it (``Recorder(uss=True)``).

    ``uss_start``/``uss_end``/``uss_delta``: this process's own USS (its private pages) at
    the cell's start and end, ``None`` unless the record read USS.
    """

    rss_start: int
    rss_end: int
    rss_delta: int
    peak: Optional[int]
    peak_delta: Optional[int]
    swap_delta: Optional[int]
    peak_exact: bool
    children_count_start: int = 0
    children_count_end: int = 0
    children_rss_start: int = 0
    children_rss_end: int = 0
    children_rss_delta: int = 0
    children_uss_start: Optional[int] = None
    children_uss_end: Optional[int] = None
    children_uss_delta: Optional[int] = None
    uss_start: Optional[int] = None
    uss_end: Optional[int] = None
    uss_delta: Optional[int] = None


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
    """What one cell did to memory.

    ``cell_key`` identifies the cell's code with its batch size left out
    (:func:`vramlab.runtime.cells.cell_key`): two runs of one cell at different batch sizes
    share it. ``batch_size`` is the batch variable's value (``batch_size``, ``bs``, ...) in
    the user's namespace when the cell ended. Both are ``None`` where not known.
    """

    execution_count: Optional[int]
    started: float
    wall_s: float
    error: Optional[str]
    host: HostDelta
    devices: tuple[DeviceDelta, ...] = field(default_factory=tuple)
    peaks_reset: bool = True
    cell_key: Optional[str] = None
    batch_size: Optional[int] = None

    def to_dict(self) -> dict[str, Any]:
        """A JSON-safe dict."""
        d = asdict(self)
        d["devices"] = [asdict(x) for x in self.devices]
        return d

    def line(self) -> str:
        """One compact line, as ``%vram auto on`` prints it."""
        return _render("record.line", self)

    def text(self) -> str:
        """A small aligned table."""
        return _render("record.text", self)

    def __repr__(self) -> str:
        return f"<vramlab.CellRecord cell {self.execution_count}>"

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, str]:
        return {"text/plain": self.text(), "text/html": _render("record.html", self)}


class DeviceSample(NamedTuple):
    """One device in a :class:`Sample`. Sizes in bytes; ``None`` where not read.

    A named tuple, so it still unpacks as ``(id, allocated, reserved, used, total)``.

    Attributes:
        id: torch's name for the device (``cuda:0``), ``nvml:N`` or ``virtual:0``.
        allocated: torch's allocated bytes (``None`` when torch has not used the device).
        reserved: torch's reserved bytes (``None`` likewise).
        used: the device's used bytes (NVML, or the virtual GPU's); ``None`` when the
            device could not be read.
        total: the device's total bytes; ``None`` when the device could not be read.
    """

    id: str
    allocated: Optional[int]
    reserved: Optional[int]
    used: Optional[int]
    total: Optional[int]


@dataclass(frozen=True)
class Sample:
    """A compact reading kept in the ring buffer. Sizes in bytes, time in seconds (epoch).

    ``devices`` holds one :class:`DeviceSample` per device: ``allocated``/``reserved`` are
    torch's (``None`` when torch has not used the device) and ``used``/``total`` are the
    device's (NVML, or the virtual GPU's). Plain 5-tuples given here are turned into
    :class:`DeviceSample`.
    """

    time: float
    rss: int
    peak: Optional[int]
    host_used: int
    available: int
    limit: int
    swap_used: Optional[int]
    swap_in: Optional[int]
    swap_out: Optional[int]
    devices: tuple[DeviceSample, ...]

    def __post_init__(self) -> None:
        devices = self.devices
        if not all(type(d) is DeviceSample for d in devices):
            object.__setattr__(self, "devices", tuple(DeviceSample(*d) for d in devices))


@dataclass(frozen=True)
class Marker:
    """A point on the timeline (``time`` in seconds since the epoch): a cell started, or ran out
    of memory (``kind``), with the cell's execution count (``None`` when IPython gave none)."""

    time: float
    kind: MarkerKind
    execution_count: Optional[int] = None


def _cell_row(r: CellRecord) -> dict[str, Any]:
    row: dict[str, Any] = {
        "execution_count": r.execution_count, "started": r.started, "wall_s": r.wall_s, "error": r.error,
        "host_rss_delta": r.host.rss_delta, "host_peak_delta": r.host.peak_delta, "host_swap_delta": r.host.swap_delta,
        "host_children": r.host.children_count_end, "host_children_rss_delta": r.host.children_rss_delta,
        "host_children_uss_delta": r.host.children_uss_delta, "batch_size": r.batch_size, "cell_key": r.cell_key,
    }
    for d in r.devices:
        row[f"{d.id}_allocated_delta"] = d.allocated_delta
        row[f"{d.id}_peak_allocated_delta"] = d.peak_allocated_delta
        row[f"{d.id}_reserved_delta"] = d.reserved_delta
        row[f"{d.id}_nvml_delta"] = d.nvml_delta
    return row


def _sample_row(s: Sample) -> dict[str, Any]:
    row: dict[str, Any] = {"time": s.time, "rss": s.rss, "peak": s.peak, "host_used": s.host_used,
                           "available": s.available, "limit": s.limit, "swap_used": s.swap_used,
                           "swap_in": s.swap_in, "swap_out": s.swap_out}
    for d in s.devices:
        row[f"{d.id}_allocated"] = d.allocated
        row[f"{d.id}_reserved"] = d.reserved
        row[f"{d.id}_used"] = d.used
        row[f"{d.id}_total"] = d.total
    return row


@dataclass(frozen=True)
class History:
    """A frozen copy of the cell records, samples and markers."""

    cells: tuple[CellRecord, ...]
    samples: tuple[Sample, ...]
    markers: tuple[Marker, ...]

    def cell_rows(self) -> list[dict[str, Any]]:
        """One flat dict per cell record."""
        return [_cell_row(r) for r in self.cells]

    def sample_rows(self) -> list[dict[str, Any]]:
        """One flat dict per sample."""
        return [_sample_row(s) for s in self.samples]

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe: ``{"cells": [...], "samples": [...], "markers": [...]}``."""
        return {"cells": [r.to_dict() for r in self.cells], "samples": self.sample_rows(),
                "markers": [asdict(m) for m in self.markers]}

    def to_pandas(self, which: str = "cells") -> Any:
        """A DataFrame of the cells (``which="cells"``) or samples (``"samples"``); needs pandas."""
        try:
            import pandas as pd
        except ImportError:
            raise ImportError("History.to_pandas() needs pandas: pip install pandas") from None
        rows = self.cell_rows() if which == "cells" else self.sample_rows()
        return pd.DataFrame(rows)

    def export(self, path: str | os.PathLike[str], which: str = "cells") -> str:
        """Write ``path``: ``.json`` gets everything, ``.csv`` one table (``which``: cells or samples).

        The file is written whole or not at all: the data goes to a new temporary file in
        the same folder (a hidden ``.NAME.*.tmp`` with an unpredictable name, created
        exclusively), which then replaces ``path`` in one rename. A failed export (a full
        disk, an error mid-way) leaves an existing ``path`` as it was and removes the
        temporary file. When ``path`` is a symbolic link, the link itself is replaced by a
        regular file holding the export; the file it pointed to is not touched. The new
        file gets the usual mode of a new file (``0o666`` less the process's umask), not
        the temporary file's ``0o600``. Returns ``path`` as a string.

        Raises:
            ValueError: an unknown suffix or table.
            OSError: the path cannot be written (the message names it).
        """
        p = os.fspath(path)
        suffix = os.path.splitext(p)[1].lower()
        if suffix not in (".csv", ".json"):
            raise ValueError(f"cannot tell the format of {p!r}: use a .csv or .json suffix")
        if which not in ("cells", "samples"):
            raise ValueError(f"unknown table {which!r}: cells or samples")
        parent = os.path.dirname(os.path.abspath(p))
        if not os.path.isdir(parent):
            raise OSError(f"cannot write {p!r}: the folder {parent!r} does not exist")
        if suffix == ".json":
            import json

            write_atomically(p, json.dumps(self.to_dict(), indent=1).encode("utf-8"))
            return p
        rows = self.cell_rows() if which == "cells" else self.sample_rows()
        cols: list[str] = []
        for r in rows:
            cols.extend(k for k in r if k not in cols)
        import csv
        import io

        buf = io.StringIO(newline="")
        w = csv.DictWriter(buf, fieldnames=cols)
        w.writeheader()
        w.writerows(rows)
        write_atomically(p, buf.getvalue().encode("utf-8"))
        return p

    def text(self, last: int = 20) -> str:
        """A table of the last ``last`` cells."""
        return _render("history.text", self, last=last)

    def __repr__(self) -> str:
        return f"<vramlab.History {len(self.cells)} cells, {len(self.samples)} samples>"

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, str]:
        return {"text/plain": self.text()}


class Consumer(NamedTuple):
    """A name in the user's namespace that holds tensors: their unique storages' bytes and devices.

    ``kind`` says how it holds them (:mod:`vramlab.runtime.holders`): ``"tensor"``,
    ``"tensors"`` (a list, tuple or dict of them), ``"module"`` (parameters, buffers,
    gradients), ``"optimizer state"``, ``"autograd graph"`` (what the graph of the name's
    tensors saved for backward, that no other name holds) or ``"output cache"`` (``Out[n]``)."""

    name: str
    nbytes: int  #: bytes of the unique storages it keeps alive
    devices: str  #: the devices they are on, comma-separated (``"cuda:0"``, ``"cpu, cuda:0"``)
    kind: str = "tensor"


class FreedDevice(NamedTuple):
    """What :func:`vramlab.runtime.oom.free_last_error` returned on one device, in bytes."""

    id: str
    allocated: int  #: torch's allocated bytes before less after
    reserved: int  #: torch's reserved bytes before less after


@dataclass(frozen=True)
class OOMExplanation:
    """What an OOM asked for and what could be done. Sizes in bytes.

    ``reserved_unallocated`` is torch's cache that could not serve the request (it sits in
    split blocks, none large enough): it is not counted as available. ``shortfall`` is the
    request less the free memory; ``fragmentation_is_cause`` says that free memory and that
    cache together would have held the request.

    The batch advice (``batch_size``: the batch variable's value when the cell failed):

    - ``batch_basis="two runs"``: this cell also ran, and fitted, at the batch
      ``batch_seen``; ``fitting_batch_size`` is that batch, the largest known to fit because
      it ran (vramlab cannot rerun the cell to check a larger one: the caching allocator's
      rounding and fragmentation are not in proportion to the batch), ``batch_estimate`` is
      where the line through the two runs meets the budget (an estimate of the largest batch
      that fits, unchecked) and ``batch_upper_bound`` is at least the largest;
    - ``batch_basis="this cell"``: only the failed cell's record was known;
      ``batch_upper_bound`` is an upper bound of the largest batch that fits, and
      ``fitting_batch_size`` is ``None``: no batch is known to fit;
    - ``batch_basis="halving"``: the cell was not measured: halving is suggested as an
      unchecked first try, and no batch is derived (``fitting_batch_size`` is ``None``).
    """

    message: str
    requested: Optional[int]
    total: Optional[int]
    free: Optional[int]
    reserved_unallocated: Optional[int]
    torch_allocated: Optional[int]
    shortfall: Optional[int]
    consumers: tuple[Consumer, ...]
    suggestions: tuple[Advice, ...]
    batch_size: Optional[int] = None
    fitting_batch_size: Optional[int] = None
    fragmentation_is_cause: bool = False
    batch_basis: Optional[str] = None
    batch_upper_bound: Optional[int] = None
    batch_seen: Optional[int] = None
    batch_estimate: Optional[int] = None

    def text(self) -> str:
        """A plain-text explanation."""
        return _render("oom.text", self)

    def __repr__(self) -> str:
        return "<vramlab.OOMExplanation>"

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, str]:
        return {"text/plain": self.text(), "text/html": _render("oom.html", self)}


@dataclass(frozen=True)
class FreedReport:
    """Bytes returned by :func:`vramlab.runtime.oom.free_last_error`: host RSS, and per device
    allocated/reserved (measured before and after). ``released``: what was dropped from the
    namespace, each with the bytes it held (autograd graphs detached, cached outputs removed);
    ``kept``: what still holds tensors after it, named and left alone (the user's modules,
    optimizer state and tensors), largest first."""

    host: int
    devices: tuple[FreedDevice, ...] = field(default_factory=tuple)
    cleared: tuple[str, ...] = field(default_factory=tuple)
    released: tuple[Consumer, ...] = field(default_factory=tuple)
    kept: tuple[Consumer, ...] = field(default_factory=tuple)

    def text(self) -> str:
        """One line per layer."""
        return _render("freed.text", self)

    def __repr__(self) -> str:
        return "<vramlab.FreedReport>"

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, str]:
        return {"text/plain": self.text()}
