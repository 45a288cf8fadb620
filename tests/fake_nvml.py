"""A fake ``pynvml`` binding for the tests (not shipped): two GPUs, optional MIG, v1/v2
memory info, unified memory, and a process list with this process and another."""

import os
import types


class FakeError(Exception):
    def __init__(self, value):
        self.value = value


def fake_pynvml(mig=False, unified=False, v2=True, pid=None):
    m = types.SimpleNamespace()
    m.NVMLError = FakeError
    m.NVML_ERROR_NOT_SUPPORTED = 3
    m.NVML_ERROR_FUNCTION_NOT_FOUND = 13
    m.NVML_ERROR_LIBRARY_NOT_FOUND = 12
    m.NVML_ERROR_DRIVER_NOT_LOADED = 9
    m.NVML_ERROR_NO_PERMISSION = 4
    m.NVML_DEVICE_MIG_ENABLE = 1
    m.nvmlMemory_v2 = 33554472
    GiB = 1 << 30
    m.nvmlInit = lambda: None
    m.nvmlSystemGetDriverVersion = lambda: b"575.57"
    m.nvmlDeviceGetCount = lambda: 2
    m.nvmlDeviceGetHandleByIndex = lambda i: ("gpu", i)
    m.nvmlDeviceGetMigMode = lambda h: (1 if (mig and h == ("gpu", 0)) else 0, 0)
    m.nvmlDeviceGetMaxMigDeviceCount = lambda h: 7

    def mig_handle(h, j):
        if j >= 2:
            raise FakeError(3)
        return ("mig", h[1], j)

    m.nvmlDeviceGetMigDeviceHandleByIndex = mig_handle
    m.nvmlDeviceGetUUID = lambda h: (f"GPU-{h[1]}" if h[0] == "gpu" else f"MIG-{h[1]}-{h[2]}").encode()
    m.nvmlDeviceGetName = lambda h: b"NVIDIA Test GPU"

    def meminfo(h, version=None):
        if unified and h == ("gpu", 1):
            raise FakeError(3)
        if version is not None and not v2:
            raise FakeError(13)
        tot = 80 * GiB if h[0] == "gpu" else 40 * GiB
        ns = types.SimpleNamespace(total=tot, used=10 * GiB, free=tot - 10 * GiB - (GiB // 2 if version else 0))
        if version is not None:
            ns.reserved = GiB // 2
        return ns

    m.nvmlDeviceGetMemoryInfo = meminfo
    m.nvmlDeviceGetUtilizationRates = lambda h: types.SimpleNamespace(gpu=42, memory=7)
    me = pid if pid is not None else os.getpid()
    m.nvmlDeviceGetComputeRunningProcesses = lambda h: [
        types.SimpleNamespace(pid=me, usedGpuMemory=3 * GiB),
        types.SimpleNamespace(pid=12345, usedGpuMemory=5 * GiB),
    ]
    m.nvmlDeviceGetGraphicsRunningProcesses = lambda h: [types.SimpleNamespace(pid=me, usedGpuMemory=3 * GiB)]
    return m
