"""NVIDIA probe through NVML (the ``pynvml`` module of package ``nvidia-ml-py``).

All sizes are in bytes. NVML is looked up once per process: when the library or
the driver is missing, :func:`read_nvml` returns no devices and a one-line
reason, and never raises.

Device order: NVML numbers GPUs by PCI bus; torch numbers them as CUDA does,
after ``CUDA_VISIBLE_DEVICES``: :mod:`vramlab.probes.cuda_order` maps one onto
the other.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass, field
from typing import Any, Optional

__all__ = ["NvmlDevice", "NvmlReading", "read_nvml"]


@dataclass(frozen=True)
class NvmlDevice:
    """One NVML device (a whole GPU, or a MIG instance). Sizes in bytes.

    Attributes:
        index: NVML index of the GPU (PCI bus order); for a MIG instance, its parent's.
        mig_index: the MIG instance's index on its parent, or ``None`` for a whole GPU.
        name, uuid: as NVML reports them (``GPU-...`` or ``MIG-...``).
        parent_uuid: the parent GPU's UUID for a MIG instance.
        mig_enabled: whether this whole GPU has MIG mode on (its memory is then split).
        total, used, free: framebuffer memory (``nvmlDeviceGetMemoryInfo``, v2 where the driver has it).
        reserved: memory the driver reserves (v2 only), excluded from ``used``; else ``None``.
        utilization: GPU utilisation in percent over the driver's last sample period, or ``None``.
        process_used: memory NVML attributes to this process (by PID), or ``None`` when
            NVML does not report per-process memory.
        other_processes_used: memory of all other processes NVML lists, or ``None``.
        pid_listed: whether this process's PID appears in NVML's process list.
        unified_memory: NVML has no separate memory info (unified memory); ``total``/``used``/``free``
            are then the host's.
    """

    index: int
    mig_index: Optional[int]
    name: str
    uuid: str
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
    note: Optional[str] = None


@dataclass(frozen=True)
class NvmlReading:
    """Every NVML device, in NVML order, plus why NVML is unavailable (``reason``)."""

    devices: tuple[NvmlDevice, ...] = ()
    reason: Optional[str] = None
    driver_version: Optional[str] = None
    notes: tuple[str, ...] = field(default_factory=tuple)


# --------------------------------------------------------------------------- NVML access


class _Nvml:
    """NVML, initialised once per process. Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._tried = False
        self._mod: Any = None
        self._reason: Optional[str] = None
        self._handles: list[tuple[Any, int, Optional[int], Optional[str], bool]] = []
        self._static: dict[int, tuple[str, str]] = {}
        self._driver: Optional[str] = None
        self._v2 = True

    def _init(self) -> None:
        self._tried = True
        try:
            import pynvml  # type: ignore[import-not-found]
        except Exception as e:  # pragma: no cover - nvidia-ml-py is a dependency
            self._reason = f"NVML unavailable: the pynvml module cannot be imported ({e})"
            return
        try:
            pynvml.nvmlInit()
        except Exception as e:
            self._reason = f"NVML unavailable: {_nvml_error_text(pynvml, e)}"
            return
        self._mod = pynvml
        try:
            drv = pynvml.nvmlSystemGetDriverVersion()
            self._driver = drv.decode() if isinstance(drv, bytes) else str(drv)
        except Exception:
            self._driver = None
        try:
            count = pynvml.nvmlDeviceGetCount()
        except Exception as e:
            self._reason = f"NVML unavailable: {_nvml_error_text(pynvml, e)}"
            self._mod = None
            return
        for i in range(count):
            try:
                h = pynvml.nvmlDeviceGetHandleByIndex(i)
            except Exception:
                continue
            mig_on = False
            try:
                current, _pending = pynvml.nvmlDeviceGetMigMode(h)
                mig_on = current == pynvml.NVML_DEVICE_MIG_ENABLE
            except Exception:
                mig_on = False
            parent_uuid = _text(pynvml.nvmlDeviceGetUUID(h))
            self._handles.append((h, i, None, None, mig_on))
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
                    self._handles.append((mh, i, j, parent_uuid, False))
        if not self._handles:
            self._reason = "NVML found no NVIDIA GPU"

    def read(self) -> NvmlReading:
        with self._lock:
            if not self._tried:
                self._init()
            if self._mod is None or not self._handles:
                return NvmlReading(reason=self._reason, driver_version=self._driver)
            pynvml = self._mod
            pid = os.getpid()
            devices = []
            notes: list[str] = []
            for h, idx, mig_idx, parent_uuid, mig_on in self._handles:
                try:
                    devices.append(self._read_one(pynvml, h, idx, mig_idx, parent_uuid, mig_on, pid))
                except Exception as e:
                    notes.append(f"NVML device {idx}: {_nvml_error_text(pynvml, e)}")
            return NvmlReading(devices=tuple(devices), driver_version=self._driver, notes=tuple(notes))

    def _read_one(self, pynvml: Any, h: Any, idx: int, mig_idx: Optional[int], parent_uuid: Optional[str],
                  mig_on: bool, pid: int) -> NvmlDevice:
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
            note = f"{name}: NVML reports no separate memory (unified memory); showing host memory instead"
        util = None
        try:
            util = int(pynvml.nvmlDeviceGetUtilizationRates(h).gpu)
        except Exception:
            util = None
        # pid -> bytes (None when NVML cannot attribute memory, e.g. under some containers/WDDM).
        per_pid: dict[int, Optional[int]] = {}
        got_any = False
        for getter in ("nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetGraphicsRunningProcesses"):
            fn = getattr(pynvml, getter, None)
            if fn is None:
                continue
            try:
                procs = fn(h)
            except Exception:
                continue
            got_any = True
            for p in procs:
                mem = getattr(p, "usedGpuMemory", None)
                mem = None if mem is None else int(mem)
                if p.pid in per_pid:  # listed as compute and graphics: one figure, keep the larger
                    old = per_pid[p.pid]
                    per_pid[p.pid] = None if old is None or mem is None else max(old, mem)
                else:
                    per_pid[p.pid] = mem
        listed = pid in per_pid
        mine: Optional[int] = None
        others: Optional[int] = None
        if got_any:
            mine = per_pid.get(pid, 0)
            rest = [v for k, v in per_pid.items() if k != pid]
            others = None if any(v is None for v in rest) else sum(v for v in rest if v is not None)
        return NvmlDevice(
            index=idx, mig_index=mig_idx, name=name, uuid=uuid, parent_uuid=parent_uuid, mig_enabled=mig_on,
            total=total, used=used, free=free, reserved=reserved, utilization=util,
            process_used=mine, other_processes_used=others, pid_listed=listed,
            unified_memory=unified, note=note,
        )


def _is(pynvml: Any, e: Exception, const: str) -> bool:
    return getattr(e, "value", None) == getattr(pynvml, const, object())


def _text(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def _nvml_error_text(pynvml: Any, e: Exception) -> str:
    value = getattr(e, "value", None)
    if value == getattr(pynvml, "NVML_ERROR_LIBRARY_NOT_FOUND", None):
        return "no NVML library (no NVIDIA driver installed)"
    if value == getattr(pynvml, "NVML_ERROR_DRIVER_NOT_LOADED", None):
        return "the NVIDIA driver is not loaded"
    if value == getattr(pynvml, "NVML_ERROR_NO_PERMISSION", None):
        return "no permission to talk to the NVIDIA driver"
    return str(e) or type(e).__name__


_NVML = _Nvml()


def read_nvml() -> NvmlReading:
    """Read every NVML device now. Never raises; see :attr:`NvmlReading.reason`."""
    try:
        return _NVML.read()
    except Exception as e:  # defensive: a probe never raises
        return NvmlReading(reason=f"NVML read failed: {type(e).__name__}: {e}")

