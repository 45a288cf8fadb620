"""A simulated NVIDIA driver, as the ``pynvml`` module of nvidia-ml-py presents it (tests only).

Put this folder first on ``PYTHONPATH`` and ``import pynvml`` gets this module instead of the
real binding. The machine it simulates is a JSON scenario in the environment variable
``VRAMLAB_NVML_SIM`` (or passed to :func:`configure`), read at ``nvmlInit()``::

    {"driver": "575.57.08",                # nvmlSystemGetDriverVersion
     "init_error": null,                   # e.g. "LIBRARY_NOT_FOUND": nvmlInit raises it
     "memory_v2": true,                    # the driver has nvmlDeviceGetMemoryInfo_v2
     "process_lists": ["v3", "v2", "v1"],  # the process-list symbols the driver has
     "gpus": [{"name": "NVIDIA H100 80GB HBM3", "uuid": "GPU-...", "total": ..., "used": ...,
               "reserved": ..., "util": 42,
               "lost": false,              # every read raises NVML_ERROR_GPU_IS_LOST
               "handle_error": null,       # nvmlDeviceGetHandleByIndex raises this (e.g. "GPU_IS_LOST")
               "unified": false,           # memory info is NOT_SUPPORTED (no separate memory)
               "procs": [{"pid": "self", "mem": 1073741824}],   # pid: int, "self", "parent", "hidden", "child"
               "graphics": [],
               "mig": [{"uuid": "MIG-...", "slot": 0, "gi": 7, "ci": 0, "total": ..., "used": ...,
                        "procs": [...]}]}]}

How it behaves, as the real driver and binding do:

- ``nvmlDeviceGetMemoryInfo(h)`` (v1) reports ``used`` *including* the driver's reserved
  memory; ``nvmlDeviceGetMemoryInfo(h, version=nvmlMemory_v2)`` reports ``used`` without it
  and ``reserved`` apart; ``free = total - used - reserved`` in both.
- The process lists: ``..._v3``, ``..._v2``, and the v1 C symbol through
  ``_nvmlGetFunctionPointer`` (nvidia-ml-py has no Python wrapper for it). A symbol the
  scenario's driver lacks raises ``NVMLError(NVML_ERROR_FUNCTION_NOT_FOUND)``, as the
  binding does on an old driver. ``usedGpuMemory`` of ``None`` is NVML_VALUE_NOT_AVAILABLE
  (the v1 symbol writes the raw ``2**64 - 1``).
- ``"hidden"`` PIDs are numbers above the kernel's ``pid_max``: they exist in no ``/proc``,
  like the host-namespace PIDs NVML reports inside a container.
- ``"child"`` (``"child+1"``, ...) is this process's first (second, ...) descendant, oldest
  first, looked up with psutil when the list is read: a real process the caller started.
- MIG instances sit at device slots whose GPU-instance ids are not their slot numbers.
- Every ``nvml*`` entry point this module does not model raises FUNCTION_NOT_FOUND.
"""

from __future__ import annotations

import ctypes
import json
import os
import types
from typing import Any, Optional

NVML_SUCCESS = 0
NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NO_PERMISSION = 4
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_INSUFFICIENT_SIZE = 7
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_FUNCTION_NOT_FOUND = 13
NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_UNKNOWN = 999
NVML_DEVICE_MIG_DISABLE = 0
NVML_DEVICE_MIG_ENABLE = 1
nvmlMemory_v2 = 0x02000028
_NOT_AVAILABLE = 2**64 - 1


class NVMLError(Exception):
    """As in nvidia-ml-py: ``value`` is the NVML return code."""

    def __init__(self, value: int) -> None:
        super().__init__(value)
        self.value = value

    def __str__(self) -> str:
        return {NVML_ERROR_GPU_IS_LOST: "GPU is lost", NVML_ERROR_FUNCTION_NOT_FOUND: "Function Not Found",
                NVML_ERROR_NOT_SUPPORTED: "Not Supported", NVML_ERROR_LIBRARY_NOT_FOUND: "NVML Shared Library Not Found",
                NVML_ERROR_DRIVER_NOT_LOADED: "Driver Not Loaded", NVML_ERROR_NOT_FOUND: "Not Found",
                }.get(self.value, f"NVML error {self.value}")


_SCENARIO: Optional[dict[str, Any]] = None
_STATE: dict[str, Any] = {"init": False, "calls": []}


def configure(scenario: Optional[dict[str, Any]]) -> None:
    """Use ``scenario`` (a dict as in the module docs) instead of ``VRAMLAB_NVML_SIM``."""
    global _SCENARIO
    _SCENARIO = scenario
    _STATE["init"] = False


def _scenario() -> dict[str, Any]:
    if _SCENARIO is not None:
        return _SCENARIO
    return json.loads(os.environ.get("VRAMLAB_NVML_SIM", '{"gpus": []}'))


def _err(name: str) -> NVMLError:
    return NVMLError(globals()[f"NVML_ERROR_{name}"])


def _check() -> dict[str, Any]:
    if not _STATE["init"]:
        raise NVMLError(NVML_ERROR_UNINITIALIZED)
    return _STATE["sc"]


def _pid_max() -> int:
    try:
        with open("/proc/sys/kernel/pid_max") as f:
            return int(f.read())
    except OSError:
        return 4194304


def _pid(p: Any) -> int:
    if p == "self":
        return os.getpid()
    if p == "parent":
        return os.getppid()
    if p == "hidden":
        return _pid_max() + 1000
    if isinstance(p, str) and p.startswith("hidden+"):
        return _pid_max() + 1000 + int(p[7:])
    if isinstance(p, str) and (p == "child" or p.startswith("child+")):
        import psutil

        n = int(p[6:]) if p != "child" else 0
        kids = sorted(psutil.Process().children(recursive=True), key=lambda c: (c.create_time(), c.pid))
        if n >= len(kids):
            raise ValueError(f"the scenario lists {p!r}, but this process has {len(kids)} descendant(s)")
        return kids[n].pid
    return int(p)


class _Handle:
    def __init__(self, gpu: dict[str, Any], index: int, mig: Optional[dict[str, Any]] = None) -> None:
        self.gpu, self.index, self.mig = gpu, index, mig

    @property
    def spec(self) -> dict[str, Any]:
        return self.mig if self.mig is not None else self.gpu

    def __repr__(self) -> str:
        return f"<sim handle {self.index}{'' if self.mig is None else '/' + str(self.mig.get('slot'))}>"


def _live(h: _Handle) -> dict[str, Any]:
    _check()
    if h.gpu.get("lost"):
        raise NVMLError(NVML_ERROR_GPU_IS_LOST)
    return h.spec


# --------------------------------------------------------------------------- init and devices


def nvmlInit() -> None:
    sc = _scenario()
    if sc.get("init_error"):
        raise _err(sc["init_error"])
    _STATE.update(init=True, sc=sc)


def nvmlShutdown() -> None:
    _STATE["init"] = False


def nvmlSystemGetDriverVersion() -> str:
    return _check().get("driver", "575.57.08")


def nvmlDeviceGetCount() -> int:
    return len(_check()["gpus"])


def nvmlDeviceGetHandleByIndex(i: int) -> _Handle:
    gpus = _check()["gpus"]
    if not 0 <= i < len(gpus):
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
    if gpus[i].get("handle_error"):
        raise _err(gpus[i]["handle_error"])
    return _Handle(gpus[i], i)


def nvmlDeviceGetIndex(h: _Handle) -> int:
    _live(h)
    if h.mig is not None:
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
    return h.index


def nvmlDeviceGetName(h: _Handle) -> str:
    spec = _live(h)
    return spec.get("name") or (h.gpu.get("name", "NVIDIA Simulated GPU") + (" MIG" if h.mig else ""))


def nvmlDeviceGetUUID(h: _Handle) -> str:
    return _live(h)["uuid"]


def nvmlDeviceGetMigMode(h: _Handle) -> tuple[int, int]:
    _live(h)
    if h.mig is not None:
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
    on = NVML_DEVICE_MIG_ENABLE if h.gpu.get("mig") else NVML_DEVICE_MIG_DISABLE
    return on, on


def nvmlDeviceGetMaxMigDeviceCount(h: _Handle) -> int:
    _live(h)
    return 7 if h.gpu.get("mig") else 0


def nvmlDeviceGetMigDeviceHandleByIndex(h: _Handle, j: int) -> _Handle:
    _live(h)
    for m in h.gpu.get("mig") or []:
        if m.get("slot", 0) == j:
            return _Handle(h.gpu, h.index, m)
    raise NVMLError(NVML_ERROR_NOT_FOUND)


def nvmlDeviceGetDeviceHandleFromMigDeviceHandle(h: _Handle) -> _Handle:
    _live(h)
    return _Handle(h.gpu, h.index)


def nvmlDeviceIsMigDeviceHandle(h: _Handle) -> int:
    return int(h.mig is not None)


def nvmlDeviceGetGpuInstanceId(h: _Handle) -> int:
    spec = _live(h)
    if h.mig is None:
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
    return int(spec["gi"])


def nvmlDeviceGetComputeInstanceId(h: _Handle) -> int:
    spec = _live(h)
    if h.mig is None:
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
    return int(spec.get("ci", 0))


# --------------------------------------------------------------------------- memory and utilisation


def nvmlDeviceGetMemoryInfo(h: _Handle, version: Optional[int] = None) -> Any:
    spec = _live(h)
    sc = _STATE["sc"]
    if version is not None and not sc.get("memory_v2", True):
        raise NVMLError(NVML_ERROR_FUNCTION_NOT_FOUND)
    if h.gpu.get("unified"):
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
    total, used = int(spec["total"]), int(spec.get("used", 0))
    reserved = int(spec.get("reserved", 0))
    free = total - used - reserved
    if version is None:  # v1: what the driver reserves is counted as used
        return types.SimpleNamespace(total=total, used=used + reserved, free=free)
    return types.SimpleNamespace(version=version, total=total, used=used, reserved=reserved, free=free)


def nvmlDeviceGetUtilizationRates(h: _Handle) -> Any:
    spec = _live(h)
    if h.mig is not None:
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
    return types.SimpleNamespace(gpu=int(spec.get("util", 0)), memory=0)


# --------------------------------------------------------------------------- process lists


def _procs(h: _Handle, kind: str, version: str) -> list[Any]:
    spec = _live(h)
    if version not in _STATE["sc"].get("process_lists", ["v3", "v2", "v1"]):
        raise NVMLError(NVML_ERROR_FUNCTION_NOT_FOUND)
    out = []
    for p in spec.get("procs" if kind == "compute" else "graphics", []):
        obj = types.SimpleNamespace(pid=_pid(p["pid"]), usedGpuMemory=p.get("mem"))
        if version in ("v2", "v3"):
            obj.gpuInstanceId = spec.get("gi", 0xFFFFFFFF) if h.mig is not None else 0xFFFFFFFF
            obj.computeInstanceId = spec.get("ci", 0xFFFFFFFF) if h.mig is not None else 0xFFFFFFFF
        out.append(obj)
    return out


def nvmlDeviceGetComputeRunningProcesses_v3(h: _Handle) -> list[Any]:
    return _procs(h, "compute", "v3")


def nvmlDeviceGetComputeRunningProcesses_v2(h: _Handle) -> list[Any]:
    return _procs(h, "compute", "v2")


def nvmlDeviceGetComputeRunningProcesses(h: _Handle) -> list[Any]:
    return nvmlDeviceGetComputeRunningProcesses_v3(h)  # as nvidia-ml-py: the unversioned name is v3


def nvmlDeviceGetGraphicsRunningProcesses_v3(h: _Handle) -> list[Any]:
    return _procs(h, "graphics", "v3")


def nvmlDeviceGetGraphicsRunningProcesses_v2(h: _Handle) -> list[Any]:
    return _procs(h, "graphics", "v2")


def nvmlDeviceGetGraphicsRunningProcesses(h: _Handle) -> list[Any]:
    return nvmlDeviceGetGraphicsRunningProcesses_v3(h)


def _v1_symbol(kind: str) -> Any:
    """The C function ``nvmlDevice<Kind>RunningProcesses`` (v1 struct: pid, usedGpuMemory)."""

    def fn(h: _Handle, count_ptr: Any, array: Any) -> int:
        try:
            procs = _procs(h, kind, "v1")
        except NVMLError as e:
            return e.value
        count = ctypes.cast(count_ptr, ctypes.POINTER(ctypes.c_uint)).contents
        if array is None or count.value < len(procs):
            count.value = len(procs)
            return NVML_SUCCESS if not procs else NVML_ERROR_INSUFFICIENT_SIZE
        for i, p in enumerate(procs):
            array[i].pid = p.pid
            array[i].usedGpuMemory = _NOT_AVAILABLE if p.usedGpuMemory is None else int(p.usedGpuMemory)
        count.value = len(procs)
        return NVML_SUCCESS

    return fn


def _nvmlGetFunctionPointer(name: str) -> Any:
    _check()
    if name == "nvmlDeviceGetComputeRunningProcesses" and "v1" in _STATE["sc"].get("process_lists", ["v3", "v2", "v1"]):
        return _v1_symbol("compute")
    if name == "nvmlDeviceGetGraphicsRunningProcesses" and "v1" in _STATE["sc"].get("process_lists", ["v3", "v2", "v1"]):
        return _v1_symbol("graphics")
    raise NVMLError(NVML_ERROR_FUNCTION_NOT_FOUND)


def __getattr__(name: str) -> Any:
    """Every entry point not modelled here: the driver lacks it."""
    if name.startswith("nvml"):
        def missing(*args: Any, **kwargs: Any) -> Any:
            raise NVMLError(NVML_ERROR_FUNCTION_NOT_FOUND)

        missing.__name__ = name
        return missing
    raise AttributeError(name)
