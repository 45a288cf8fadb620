"""Each kernel's memory, as the Jupyter server sees it: what the status bar and the side panel show.

A reading names every running kernel of the server with its PID tree's host memory (the
kernel and every process it started: DataLoader workers, ``torch.multiprocessing``, a
``%%bash`` cell) and the GPU memory NVML lists for those PIDs, device by device. It reads
through vramlab's probes, as ``%vram`` does in the kernel, so the figures agree with it:
the kernel's RSS plus its children's is ``process_rss + children_rss`` there, and its GPU
memory is ``process_used + children_used`` there. No torch, no IPython: the server never
imports them.

All sizes are in bytes and all times in seconds (``time.time()``). The reading is a plain
JSON-able dict (see :func:`read_kernels`); :class:`KernelMemoryService` caches it, so that any
number of browser tabs polling the server cost at most one reading per ``min_interval``, and
keeps each kernel's recent history for the side panel's sparklines.
"""

from __future__ import annotations

import os
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Any, Optional, Sequence

from ..display.words import note_text
from ..probes.host import ProcessTreeReading, read_host, read_process_tree
from ..probes.nvml import NvmlDevice, NvmlReading, pid_visible, read_nvml
from ..units import format_bytes

__all__ = ["KernelRef", "KernelMemoryService", "read_kernels", "SCHEMA_VERSION"]

SCHEMA_VERSION = 1


def _now() -> float:
    """Wall-clock time of a reading, in seconds (``time.time``; tests replace it)."""
    return time.time()


def _monotonic() -> float:
    """The cache's clock, in seconds (``time.monotonic``; tests replace it)."""
    return time.monotonic()
HISTORY_POINTS = 150  # at most about this many points per kernel's history, whatever the polling rate


def _max(a: Optional[int], b: Optional[int]) -> Optional[int]:
    return b if a is None else a if b is None else max(a, b)


@dataclass(frozen=True)
class KernelRef:
    """A kernel of the server, as its kernel and session managers list it.

    Attributes:
        id: the kernel's id.
        pid: the PID of its process on this machine, or ``None`` when this server does not run
            it (a gateway such as Enterprise Gateway, or a remote provisioner).
        name: its kernelspec's name (``python3``).
        path: the notebook (or console) its session is for, relative to the server's root; ``None``
            for a kernel without a session.
        execution_state: ``idle``, ``busy``, ``starting``... as the kernel manager last heard it.
        remote: whether the kernel runs elsewhere (a gateway, a remote provisioner); a kernel
            with no PID that is not remote is still starting (its process is not launched yet).
    """

    id: str
    pid: Optional[int]
    name: str = ""
    path: Optional[str] = None
    execution_state: str = "unknown"
    remote: bool = True


def _device_label(d: NvmlDevice) -> str:
    return f"GPU {d.index}" if d.mig_index is None else f"GPU {d.index} MIG {d.mig_index}"


def _sum(figures: Sequence[Optional[int]]) -> Optional[int]:
    """The sum in bytes, or ``None`` when one figure is missing."""
    return None if any(f is None for f in figures) else sum(f for f in figures if f is not None)


def _devices(devices: Sequence[NvmlDevice]) -> list[dict[str, Any]]:
    return [{
        "index": d.index, "mig_index": d.mig_index, "label": _device_label(d), "name": d.name, "uuid": d.uuid,
        "total": d.total, "used": d.used, "free": d.free, "readable": d.readable,
        "process_list": d.process_list is not None, "note": note_text(d.note) if d.note is not None else None,
    } for d in devices]


def _split_devices(nv: NvmlReading) -> list[NvmlDevice]:
    """The devices whose memory is split by kernel: whole GPUs, and the MIG instances of a
    MIG-enabled GPU instead of that GPU (its processes run on the instances, and NVML lists them
    there; counting the parent too would count them twice). A MIG-enabled GPU with no instance
    readable stays, so that its memory is still shown."""
    parents_with_instances = {d.index for d in nv.devices if d.mig_index is not None}
    return [d for d in nv.devices
            if not (d.mig_index is None and d.mig_enabled and d.index in parents_with_instances)]


def read_kernels(kernels: Sequence[KernelRef], uss: bool = False) -> dict[str, Any]:
    """Read every kernel's host and GPU memory now. Never raises; sizes in bytes.

    Returns a JSON-able dict::

        {"version": 1, "time": <s>, "uss": bool,
         "host": {"total", "used", "available", "limit", "limit_source", "swap_total", "swap_used"},
         "gpu": {"available": bool, "reason": str | None, "driver": str | None,
                 "devices": [{"index", "mig_index", "label", "name", "uuid", "total", "used", "free",
                              "readable", "process_list", "note"}]},
         "kernels": [{"id", "name", "path", "execution_state", "state", "pid", "pids", "rss", "uss",
                      "gpu": [<bytes or None per device>], "gpu_used": <bytes or None>, "note"}],
         "others": [<bytes or None per device>],        # visible processes that are no kernel's
         "unattributed": [{"device", "pids", "used"}],   # PIDs this server cannot see
         "notes": [str]}

    A kernel's ``state`` is ``"running"``, ``"gone"`` (its process ended between the listing
    and the reading: no figures), or ``"remote"`` (no process on this machine: no figures).
    ``gpu[i]`` is ``None`` when device ``i`` gives no process list or no figure for one of
    the kernel's processes.
    """
    host = read_host(children=False)
    notes = [note_text(n) for n in host.notes]  # the server's children are the kernels, read below
    trees: dict[str, Optional[ProcessTreeReading]] = {}
    for k in kernels:
        trees[k.id] = read_process_tree(k.pid, uss=uss) if k.pid is not None else None
    owner: dict[int, str] = {}
    for kid, tree in trees.items():
        for p in tree.pids if tree is not None else ():
            owner.setdefault(p, kid)
    nv = read_nvml()
    devices = _split_devices(nv)
    per_kernel: dict[str, list[Optional[int]]] = {k.id: [] for k in kernels}
    others: list[Optional[int]] = []
    unattributed: list[dict[str, Any]] = []
    server_pid = os.getpid()
    for i, d in enumerate(devices):
        if not d.readable or d.process_list is None:
            for kid in per_kernel:
                per_kernel[kid].append(None)
            others.append(None)
            if d.readable:
                notes.append(f"{_device_label(d)}: NVML gives no process list, so its memory is not split by kernel")
            continue
        mine: dict[str, list[Optional[int]]] = {kid: [] for kid in per_kernel}
        rest: list[Optional[int]] = []
        hidden: list[Optional[int]] = []
        for pid, mem in d.processes:
            if pid in owner:
                mine[owner[pid]].append(mem)
            elif pid != server_pid and not pid_visible(pid):
                hidden.append(mem)
            else:
                rest.append(mem)
        for kid, figures in mine.items():
            per_kernel[kid].append(_sum(figures))
        others.append(_sum(rest))
        if hidden:
            used = _sum(hidden)
            unattributed.append({"device": i, "pids": len(hidden), "used": used})
            notes.append(
                f"{_device_label(d)}: NVML lists {len(hidden)} process(es) that this server cannot see "
                f"({format_bytes(used) if used is not None else 'an unknown amount'}): the driver reports PIDs of "
                "another PID namespace, as in a container, so that memory is not attributed to any kernel")
    rows: list[dict[str, Any]] = []
    for k in kernels:
        tree = trees[k.id]
        row: dict[str, Any] = {"id": k.id, "name": k.name, "path": k.path, "execution_state": k.execution_state,
                               "pid": k.pid, "pids": [], "rss": None, "uss": None, "gpu": [None] * len(devices),
                               "gpu_used": None, "note": None}
        if tree is None and not k.remote:
            row.update(state="starting", note="the kernel's process is not launched yet")
        elif tree is None:
            row.update(state="remote", note="this server does not run the kernel's process (a gateway or a remote "
                                            "provisioner): read its memory inside the kernel, with %vram")
        elif not tree.alive:
            row.update(state="gone", note="the kernel's process has ended")
        else:
            gpu = per_kernel[k.id]
            row.update(state="running", pids=list(tree.pids), rss=tree.rss, uss=tree.uss, gpu=gpu,
                       gpu_used=_sum(gpu) if gpu else None)
        rows.append(row)
    return {
        "version": SCHEMA_VERSION, "time": _now(), "uss": uss,
        "host": {"total": host.total, "used": host.used, "available": host.available, "limit": host.limit,
                 "limit_source": host.limit_source, "swap_total": host.swap_total, "swap_used": host.swap_used},
        "gpu": {"available": bool(devices), "reason": note_text(nv.reason) if nv.reason is not None else None, "driver": nv.driver_version,
                "devices": _devices(devices)},
        "kernels": rows, "others": others, "unattributed": unattributed, "notes": notes,
    }


def _relabelled(data: dict[str, Any], kernels: Sequence[KernelRef]) -> dict[str, Any]:
    """A cached reading with each kernel's notebook path and execution state as listed now."""
    refs = {k.id: k for k in kernels}
    rows = []
    for row in data["kernels"]:
        k = refs.get(row["id"])
        rows.append(row if k is None else {**row, "name": k.name, "path": k.path, "execution_state": k.execution_state})
    return {**data, "kernels": rows}


class KernelMemoryService:
    """Cached readings and each kernel's recent history (thread-safe).

    Args:
        min_interval: a reading younger than this many seconds is served again instead of
            reading anew (for the same kernels, and with USS when USS is asked for).
        history_seconds: how far back each kernel's history goes, in seconds. It keeps about
            :data:`HISTORY_POINTS` points: readings closer together than ``history_seconds /
            HISTORY_POINTS`` s (one slot) share one point, with the slot's largest figures (a
            sparkline shows peaks) at its latest time.
    """

    def __init__(self, min_interval: float = 1.0, history_seconds: float = 600.0) -> None:
        self.min_interval = float(min_interval)
        self.history_seconds = float(history_seconds)
        self._lock = threading.Lock()
        self._last: Optional[dict[str, Any]] = None
        self._last_key: Optional[tuple[frozenset[tuple[str, Optional[int]]], bool]] = None
        self._last_mono = 0.0
        self._history: dict[str, deque[tuple[float, Optional[int], Optional[int]]]] = {}
        self.readings = 0  # how many readings were made (not served from the cache)

    def read(self, kernels: Sequence[KernelRef], uss: bool = False) -> dict[str, Any]:
        """A reading of ``kernels`` (see :func:`read_kernels`), at most ``min_interval`` s old,
        each kernel with its ``history``: ``[[time, rss, gpu_used], ...]``, oldest first."""
        key = frozenset((k.id, k.pid) for k in kernels)
        with self._lock:  # a request that waited for a reading in progress is served that reading
            last = self._last
            if (last is not None and self._last_key is not None and self._last_key[0] == key
                    and (self._last_key[1] or not uss) and _monotonic() - self._last_mono < self.min_interval):
                return _relabelled(last, kernels)
            data = read_kernels(kernels, uss=uss)
            self.readings += 1
            self._remember(data)
            # the reading's age counts from when it ended, so a slow reading is not read again at once
            self._last, self._last_key, self._last_mono = data, (key, uss), _monotonic()
            return data

    @property
    def last(self) -> Optional[dict[str, Any]]:
        """The latest reading, or ``None`` (what a request that times out is served, marked stale)."""
        return self._last

    def _remember(self, data: dict[str, Any]) -> None:
        t = float(data["time"])
        live = set()
        for row in data["kernels"]:
            live.add(row["id"])
            h = self._history.setdefault(row["id"], deque())
            if row["state"] == "running":
                point = (t, row["rss"], row["gpu_used"])
                step = self.history_seconds / HISTORY_POINTS
                if h and step > 0 and int(h[-1][0] // step) == int(t // step):
                    # the same slot as the last point: one point with the slot's largest figures
                    last = h.pop()
                    point = (t, _max(last[1], point[1]), _max(last[2], point[2]))
                h.append(point)
            while h and h[0][0] < t - self.history_seconds:
                h.popleft()
            row["history"] = [list(x) for x in h]
        for kid in list(self._history):
            if kid not in live:
                del self._history[kid]
