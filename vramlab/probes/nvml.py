"""NVIDIA probe through NVML (the ``pynvml`` module of package ``nvidia-ml-py``).

All sizes are in bytes. NVML is looked up once per process: when the library or
the driver is missing, :func:`read_nvml` returns no devices and a one-line
reason, and never raises.

Device order: NVML numbers GPUs by PCI bus; torch numbers them as CUDA does,
after ``CUDA_VISIBLE_DEVICES``: :mod:`vramlab.probes.cuda_order` maps one onto
the other. Each device keeps the index NVML reports for it, and a GPU that cannot be
read (lost, or its handle fails) stays in the list as a device with no figures and a
note, so that it never shifts the devices after it.

Real drivers, as this probe meets them:

- *memory*: ``nvmlDeviceGetMemoryInfo_v2`` where the driver has it (``used`` without the
  driver's reserved memory, ``reserved`` apart); else v1, whose ``used`` includes it;
- *process lists*: v3, then v2, then the v1 C symbol (old drivers), for compute and
  graphics processes alike; ``usedGpuMemory`` may be unavailable (``None``);
- *PID namespaces* (Docker, Kubernetes, Colab, gVisor): NVML lists host PIDs, so this
  process's own PID is usually absent and the listed PIDs do not exist in this ``/proc``.
  Their memory is *unattributed*, not "other processes": a listed PID that exists here and
  is not this process is another process, or this process's child when it descends from
  it (``read_nvml(children=...)``: the PIDs the host probe found);
- *MIG*: the instances of a MIG-enabled GPU, each with its GPU-instance and
  compute-instance ids (the legacy ``MIG-GPU-<uuid>/<gi>/<ci>`` names use those ids);
- *unified memory* (no separate framebuffer): memory info is NOT_SUPPORTED; the host's
  figures stand in, with a note.
"""

from __future__ import annotations

import ctypes
import functools
import os
import sys
import threading
import warnings
from dataclasses import dataclass
from typing import Any, Callable, Collection, Optional

from ..facts import Note, NoteCode, Problem, Reason

__all__ = ["NvmlDevice", "NvmlReading", "read_nvml", "pid_visible"]


@dataclass(frozen=True)
class NvmlDevice:
    """One NVML device (a whole GPU, or a MIG instance). Sizes in bytes.

    Attributes:
        index: the NVML index of the GPU (``nvmlDeviceGetIndex``, PCI bus order); for a MIG
            instance, its parent's.
        mig_index: the MIG instance's device slot on its parent, or ``None`` for a whole GPU.
        name, uuid: as NVML reports them (``GPU-...`` or ``MIG-...``); ``uuid`` is ``None``
            when the device could not be read.
        parent_uuid: the parent GPU's UUID for a MIG instance.
        mig_enabled: whether this whole GPU has MIG mode on (its memory is then split).
        gpu_instance_id, compute_instance_id: a MIG instance's ids (``None`` for a whole GPU).
        total, used, free: framebuffer memory (``nvmlDeviceGetMemoryInfo``, v2 where the driver has it).
        reserved: memory the driver reserves (v2 only), excluded from ``used``; else ``None``.
        utilization: GPU utilisation in percent over the driver's last sample period, or ``None``.
        process_used: memory NVML attributes to this process (by PID): 0 when it is not listed,
            ``None`` when NVML gives no process list or no figure for it.
        other_processes_used: memory of the other listed processes that exist in this PID
            namespace and are not this process's children, or ``None`` when NVML gives no
            figure for one of them.
        children_used: memory of the listed PIDs that descend from this process (the
            ``children`` given to :func:`read_nvml`), or ``None`` when NVML gives no figure
            for one of them; 0 when none is listed.
        children_listed: how many of this process's descendants NVML lists.
        processes: every PID NVML lists on this device (compute and graphics, once each), with
            its memory in bytes or ``None`` when NVML gives no figure; sorted by PID. The PIDs
            are the driver's: in a container they may not exist in this PID namespace.
        unattributed_used: memory of listed PIDs that this PID namespace cannot see (a
            container), or ``None`` when NVML gives no figure for one of them.
        hidden_pids: how many listed PIDs this namespace cannot see.
        pid_listed: whether this process's PID appears in NVML's process list.
        process_list: which process-list API answered (``"v3"``, ``"v2"``, ``"v1"``), or ``None``.
        unified_memory: NVML has no separate memory info (unified memory); ``total``/``used``/``free``
            are then the host's.
        readable: ``False`` for a device that could not be read (lost GPU): no figures, a note.
    """

    index: int
    mig_index: Optional[int]
    name: str
    uuid: Optional[str]
    parent_uuid: Optional[str]
    mig_enabled: bool
    total: Optional[int]
    used: Optional[int]
    free: Optional[int]
    reserved: Optional[int]
    utilization: Optional[int]
    process_used: Optional[int]
    other_processes_used: Optional[int]
    pid_listed: bool
    unified_memory: bool = False
    note: Optional[Note] = None
    gpu_instance_id: Optional[int] = None
    compute_instance_id: Optional[int] = None
    unattributed_used: Optional[int] = 0
    hidden_pids: int = 0
    process_list: Optional[str] = None
    readable: bool = True
    unreadable: Optional[Problem] = None
    children_used: Optional[int] = 0
    children_listed: int = 0
    processes: tuple[tuple[int, Optional[int]], ...] = ()


@dataclass(frozen=True)
class NvmlReading:
    """Every NVML device, in NVML order, plus why NVML is unavailable (``reason``: a note with
    code ``NVML_UNAVAILABLE``, ``NVML_NO_GPU`` or ``NVML_READ_FAILED``)."""

    devices: tuple[NvmlDevice, ...] = ()
    reason: Optional[Note] = None
    driver_version: Optional[str] = None

    @property
    def notes(self) -> tuple[Note, ...]:
        """Every gap of this reading, as every probe reports them: why NVML is unavailable, then
        each device's note (a lost GPU, unified memory), in NVML order."""
        return ((self.reason,) if self.reason is not None else ()) + tuple(d.note for d in self.devices
                                                                            if d.note is not None)


# --------------------------------------------------------------------------- process lists

_NOT_AVAILABLE = 2**64 - 1  # NVML_VALUE_NOT_AVAILABLE for an unsigned long long


class _ProcessInfoV1(ctypes.Structure):
    """``nvmlProcessInfo_v1_t``: what the unversioned (v1) process-list symbols fill in."""

    _fields_ = [("pid", ctypes.c_uint), ("usedGpuMemory", ctypes.c_ulonglong)]


def _v1_lister(pynvml: Any, symbol: str) -> Callable[[Any], list[tuple[int, Optional[int]]]]:
    """The v1 process list: nvidia-ml-py wraps only v2/v3, so call the C symbol directly
    (as nvitop does on old drivers). Raises NVMLError(FUNCTION_NOT_FOUND) when absent."""
    fn = pynvml._nvmlGetFunctionPointer(symbol)

    def call(handle: Any) -> list[tuple[int, Optional[int]]]:
        count = ctypes.c_uint(0)
        ret = fn(handle, ctypes.pointer(count), None)
        if ret == pynvml.NVML_SUCCESS:
            return []
        if ret != pynvml.NVML_ERROR_INSUFFICIENT_SIZE:
            raise pynvml.NVMLError(ret)
        count.value = count.value * 2 + 5
        procs = (_ProcessInfoV1 * count.value)()
        ret = fn(handle, ctypes.pointer(count), procs)
        if ret != pynvml.NVML_SUCCESS:
            raise pynvml.NVMLError(ret)
        return [(int(procs[i].pid), None if procs[i].usedGpuMemory == _NOT_AVAILABLE else int(procs[i].usedGpuMemory))
                for i in range(count.value)]

    return call


def _versioned_lister(fn: Callable[[Any], Any]) -> Callable[[Any], list[tuple[int, Optional[int]]]]:
    def call(handle: Any) -> list[tuple[int, Optional[int]]]:
        out = []
        for p in fn(handle):
            mem = getattr(p, "usedGpuMemory", None)
            out.append((int(p.pid), None if mem is None else int(mem)))
        return out

    return call


def pid_visible(pid: int) -> bool:
    """Whether ``pid`` exists in this PID namespace (``/proc/<pid>``); ``True`` off Linux."""
    if not sys.platform.startswith("linux"):
        return True
    return os.path.exists(f"/proc/{pid}")


# --------------------------------------------------------------------------- NVML access


@dataclass(frozen=True)
class _CachedDevice:
    """One device NVML listed at initialisation: its handle and what was read with it once.

    Attributes:
        handle: the NVML device handle, or ``None`` when it could not be opened.
        index: the NVML index of the GPU (for a MIG instance, its parent's).
        mig_index: the MIG instance's device slot on its parent, or ``None`` for a whole GPU.
        parent_uuid: the parent GPU's UUID for a MIG instance, else ``None``.
        mig_enabled: whether this whole GPU has MIG mode on.
        gpu_instance_id, compute_instance_id: a MIG instance's ids (``None`` for a whole GPU,
            or when NVML does not give them).
        unreadable: why the device cannot be read, or ``None``.
    """

    handle: Any
    index: int
    mig_index: Optional[int] = None
    parent_uuid: Optional[str] = None
    mig_enabled: bool = False
    gpu_instance_id: Optional[int] = None
    compute_instance_id: Optional[int] = None
    unreadable: Optional[Problem] = None


class _Nvml:
    """NVML, initialised once per process. Thread-safe.

    The initialisation counts as done once it finished or failed with an ordinary
    exception (then :attr:`_reason` says why, and it is not tried again). An interrupt
    (``KeyboardInterrupt``, or any other ``BaseException`` such as the CLI's termination)
    that lands in it propagates, and leaves the probe as it was before: NVML shut down again
    if it had been initialised, nothing cached, and the next reading tries again.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._tried = False
        self._reset()

    def _reset(self) -> None:
        """Forget everything the initialisation found (the state before the first reading)."""
        self._mod: Any = None
        self._reason: Optional[Note] = None
        self._handles: list[_CachedDevice] = []
        self._static: dict[int, tuple[str, Optional[str]]] = {}
        self._driver: Optional[str] = None
        self._v2 = True
        # kind -> (version, lister) once one answered; tried in order v3, v2, v1
        self._listers: dict[str, tuple[str, Callable[[Any], list[tuple[int, Optional[int]]]]]] = {}
        self._no_lister: set[str] = set()

    def _init(self) -> None:
        """Initialise NVML and open every device; see the class's docs for what an
        interruption leaves behind."""
        inited: list[Any] = []  # the pynvml module, once its nvmlInit succeeded
        try:
            self._init_steps(inited)
        except Exception as e:  # defensive: a step that should not raise did; not tried again
            self._undo(inited)
            self._reason = Note(NoteCode.NVML_UNAVAILABLE, problem=Problem(Reason.ERROR, f"{type(e).__name__}: {e}"))
        except BaseException:
            # an interrupt: undo what was done, so that the next reading tries again
            self._undo(inited)
            raise
        self._tried = True

    def _undo(self, inited: list[Any]) -> None:
        """Shut NVML down again when this initialisation started it, and forget its results."""
        self._reset()
        for pynvml in inited:
            try:
                pynvml.nvmlShutdown()  # nvmlInit is reference-counted: one shutdown per init
            except Exception:
                pass
        inited.clear()

    def _init_steps(self, inited: list[Any]) -> None:
        with warnings.catch_warnings():
            # the deprecated ``pynvml`` package (a shim over nvidia-ml-py, which some tools
            # still pull in) warns on import; vramlab already depends on nvidia-ml-py, and a
            # probe never prints
            warnings.simplefilter("ignore", FutureWarning)
            try:
                import pynvml
            except Exception as e:  # pragma: no cover - nvidia-ml-py is a dependency
                self._reason = Note(NoteCode.NVML_UNAVAILABLE, problem=Problem(Reason.NO_MODULE, str(e)))
                return
        try:
            pynvml.nvmlInit()
        except Exception as e:
            self._reason = Note(NoteCode.NVML_UNAVAILABLE, problem=_nvml_problem(pynvml, e))
            return
        inited.append(pynvml)
        driver: Optional[str]
        try:
            drv = pynvml.nvmlSystemGetDriverVersion()
            driver = drv.decode() if isinstance(drv, bytes) else str(drv)
        except Exception:
            driver = None
        try:
            count = pynvml.nvmlDeviceGetCount()
        except Exception as e:
            self._undo(inited)
            self._reason = Note(NoteCode.NVML_UNAVAILABLE, problem=_nvml_problem(pynvml, e))
            self._driver = driver
            return
        handles: list[_CachedDevice] = []
        for i in range(count):
            try:
                h = pynvml.nvmlDeviceGetHandleByIndex(i)
            except Exception as e:
                # keep its place: a GPU that cannot be opened must not shift the ones after it
                handles.append(_CachedDevice(handle=None, index=i, unreadable=_nvml_problem(pynvml, e)))
                continue
            idx = i
            try:
                idx = int(pynvml.nvmlDeviceGetIndex(h))
            except Exception:
                idx = i
            mig_on = False
            try:
                current, _pending = pynvml.nvmlDeviceGetMigMode(h)
                mig_on = current == pynvml.NVML_DEVICE_MIG_ENABLE
            except Exception:
                mig_on = False
            try:
                parent_uuid: Optional[str] = _text(pynvml.nvmlDeviceGetUUID(h))
            except Exception as e:
                handles.append(_CachedDevice(handle=h, index=idx, unreadable=_nvml_problem(pynvml, e)))
                continue
            handles.append(_CachedDevice(handle=h, index=idx, mig_enabled=mig_on))
            if mig_on:
                try:
                    n = pynvml.nvmlDeviceGetMaxMigDeviceCount(h)
                except Exception:
                    n = 0
                for j in range(n):
                    try:
                        mh = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(h, j)
                    except Exception:
                        continue  # no instance at this slot
                    gi = ci = None
                    try:
                        gi = int(pynvml.nvmlDeviceGetGpuInstanceId(mh))
                        ci = int(pynvml.nvmlDeviceGetComputeInstanceId(mh))
                    except Exception:
                        pass
                    handles.append(_CachedDevice(handle=mh, index=idx, mig_index=j, parent_uuid=parent_uuid,
                                           gpu_instance_id=gi, compute_instance_id=ci))
        # every step done: publish the results together
        self._mod, self._driver, self._handles = pynvml, driver, handles
        if not handles:
            self._reason = Note(NoteCode.NVML_NO_GPU)

    def read(self, children: frozenset[int] = frozenset()) -> NvmlReading:
        with self._lock:
            if not self._tried:
                self._init()
            if self._mod is None or not self._handles:
                return NvmlReading(reason=self._reason, driver_version=self._driver)
            pynvml = self._mod
            pid = os.getpid()
            devices = []
            for dev in self._handles:
                why = dev.unreadable
                if dev.handle is not None and why is None:
                    try:
                        devices.append(self._read_one(pynvml, dev, pid, children))
                        continue
                    except Exception as e:
                        why = _nvml_problem(pynvml, e)
                name, uuid = self._static.get(id(dev.handle), ("?", None)) if dev.handle is not None else ("?", None)
                where = f"nvml:{dev.index}" + (f".{dev.mig_index}" if dev.mig_index is not None else "")
                devices.append(NvmlDevice(
                    index=dev.index, mig_index=dev.mig_index, name=name, uuid=uuid,
                    parent_uuid=dev.parent_uuid, mig_enabled=dev.mig_enabled, total=None, used=None, free=None,
                    reserved=None, utilization=None, process_used=None, other_processes_used=None, pid_listed=False,
                    note=Note(NoteCode.NVML_DEVICE_UNREADABLE, device=where, problem=why), unreadable=why,
                    gpu_instance_id=dev.gpu_instance_id, compute_instance_id=dev.compute_instance_id,
                    unattributed_used=None, readable=False, children_used=None))
            return NvmlReading(devices=tuple(devices), driver_version=self._driver)

    def _processes(self, pynvml: Any, h: Any, kind: str) -> Optional[tuple[str, list[tuple[int, Optional[int]]]]]:
        """(version, [(pid, bytes or None)]) for ``kind``, trying v3, v2 then v1 until one
        answers; the one that answered is used from then on. ``None`` when none answers."""
        known = self._listers.get(kind)
        if known is not None:
            version, call = known
            return version, call(h)
        if kind in self._no_lister:
            return None
        symbol = f"nvmlDeviceGet{kind}RunningProcesses"
        candidates: list[tuple[str, Callable[[], Callable[[Any], list[tuple[int, Optional[int]]]]]]] = []
        for version in ("v3", "v2"):
            fn = getattr(pynvml, f"{symbol}_{version}", None)
            if fn is not None:
                candidates.append((version, functools.partial(_versioned_lister, fn)))
        candidates.append(("v1", lambda: _v1_lister(pynvml, symbol)))
        for version, make in candidates:
            try:
                call = make()
                procs = call(h)
            except pynvml.NVMLError as e:
                if _is(pynvml, e, "NVML_ERROR_FUNCTION_NOT_FOUND"):
                    continue  # an older driver: try the next version
                raise
            except (AttributeError, TypeError):
                continue  # a binding without this entry point
            self._listers[kind] = (version, call)
            return version, procs
        self._no_lister.add(kind)
        return None

    def _read_one(self, pynvml: Any, dev: _CachedDevice, pid: int, children: frozenset[int] = frozenset()) -> NvmlDevice:
        """Read one device now (sizes in bytes). Raises NVML's error when the device fails."""
        h = dev.handle
        key = id(h)
        if key not in self._static:
            self._static[key] = (_text(pynvml.nvmlDeviceGetName(h)), _text(pynvml.nvmlDeviceGetUUID(h)))
        name, uuid = self._static[key]
        total = used = free = reserved = None
        unified = False
        note = None
        try:
            m = None
            if self._v2:
                try:
                    m = pynvml.nvmlDeviceGetMemoryInfo(h, version=pynvml.nvmlMemory_v2)
                    reserved = int(m.reserved)
                except pynvml.NVMLError as e:
                    if _is(pynvml, e, "NVML_ERROR_FUNCTION_NOT_FOUND"):
                        self._v2 = False  # an old driver: v1 only, from now on
                    elif not _is(pynvml, e, "NVML_ERROR_NOT_SUPPORTED"):
                        raise
                    m = None  # try v1 for this device
                except (TypeError, AttributeError):
                    self._v2 = False  # an old nvidia-ml-py without the version argument
            if m is None:
                m = pynvml.nvmlDeviceGetMemoryInfo(h)
            total, used, free = int(m.total), int(m.used), int(m.free)
        except pynvml.NVMLError as e:
            if not _is(pynvml, e, "NVML_ERROR_NOT_SUPPORTED"):
                raise
            from .host import read_host  # a sibling probe, only for unified-memory devices

            host = read_host()
            total, free, used = host.total, host.available, host.used
            unified = True
            note = Note(NoteCode.UNIFIED_MEMORY, device=name)
        util = None
        try:
            util = int(pynvml.nvmlDeviceGetUtilizationRates(h).gpu)
        except Exception:
            util = None
        # pid -> bytes (None when NVML cannot attribute memory, e.g. under WDDM).
        per_pid: dict[int, Optional[int]] = {}
        versions: list[str] = []
        for kind in ("Compute", "Graphics"):
            try:
                got = self._processes(pynvml, h, kind)
            except Exception:
                got = None
            if got is None:
                continue
            versions.append(got[0])
            for p, mem in got[1]:
                if p in per_pid:  # listed as compute and graphics: one figure, keep the larger
                    old = per_pid[p]
                    per_pid[p] = None if old is None or mem is None else max(old, mem)
                else:
                    per_pid[p] = mem
        listed = pid in per_pid
        mine: Optional[int] = None
        others: Optional[int] = None
        hidden_mem: Optional[int] = None
        kids_mem: Optional[int] = 0
        hidden = kids_listed = 0
        if versions:
            mine = per_pid.get(pid, 0)
            kids = [v for k, v in per_pid.items() if k != pid and k in children]
            visible = [v for k, v in per_pid.items() if k != pid and k not in children and pid_visible(k)]
            unseen = [v for k, v in per_pid.items() if k != pid and k not in children and not pid_visible(k)]
            hidden, kids_listed = len(unseen), len(kids)
            others = _total(visible)
            hidden_mem = _total(unseen)
            kids_mem = _total(kids)
        return NvmlDevice(
            index=dev.index, mig_index=dev.mig_index, name=name, uuid=uuid, parent_uuid=dev.parent_uuid,
            mig_enabled=dev.mig_enabled, total=total, used=used, free=free, reserved=reserved, utilization=util,
            process_used=mine, other_processes_used=others, pid_listed=listed,
            unified_memory=unified, note=note, gpu_instance_id=dev.gpu_instance_id,
            compute_instance_id=dev.compute_instance_id,
            unattributed_used=hidden_mem, hidden_pids=hidden, process_list=versions[0] if versions else None,
            children_used=kids_mem, children_listed=kids_listed, processes=tuple(sorted(per_pid.items())),
        )


def _total(figures: list[Optional[int]]) -> Optional[int]:
    """The sum in bytes, or ``None`` when one figure is missing."""
    return None if any(v is None for v in figures) else sum(v for v in figures if v is not None)


def _is(pynvml: Any, e: Exception, const: str) -> bool:
    return getattr(e, "value", None) == getattr(pynvml, const, object())


def _text(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def _nvml_problem(pynvml: Any, e: Exception) -> Problem:
    """What an NVML error means: a :class:`~vramlab.facts.Reason` for the errors a user can act
    on, else the library's own message."""
    value = getattr(e, "value", None)
    for name, reason in (("NVML_ERROR_LIBRARY_NOT_FOUND", Reason.NO_LIBRARY),
                         ("NVML_ERROR_DRIVER_NOT_LOADED", Reason.DRIVER_NOT_LOADED),
                         ("NVML_ERROR_NO_PERMISSION", Reason.NO_PERMISSION),
                         ("NVML_ERROR_GPU_IS_LOST", Reason.GPU_LOST)):
        if value is not None and value == getattr(pynvml, name, None):
            return Problem(reason)
    return Problem(Reason.ERROR, str(e) or type(e).__name__)


_NVML = _Nvml()


def read_nvml(children: Collection[int] = ()) -> NvmlReading:
    """Read every NVML device now. Never raises; see :attr:`NvmlReading.reason`.

    Args:
        children: the PIDs of this process's descendants (the host probe's
            ``children_pids``): their memory is counted apart, as ``children_used``.
    """
    try:
        return _NVML.read(frozenset(children))
    except Exception as e:  # defensive: a probe never raises
        return NvmlReading(reason=Note(NoteCode.NVML_READ_FAILED, detail=f"{type(e).__name__}: {e}"))
