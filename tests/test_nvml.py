"""NVML probe. The fake binding below stands in for NVML only to test parsing logic
(MIG enumeration, v2 memory info, unified-memory fallback, process attribution);
the real library path runs in ``python -m vramlab.selftest`` on a GPU machine."""

import os
import types

import pytest

from vramlab.probes import nvml as nvml_mod
from vramlab.probes.cuda_order import map_visible_devices, parse_visible_devices
from vramlab.probes.nvml import NvmlDevice, read_nvml


def dev(i, uuid, mig_index=None, parent=None, mig_enabled=False):
    return NvmlDevice(index=i, mig_index=mig_index, name="X", uuid=uuid, parent_uuid=parent, mig_enabled=mig_enabled,
                      total=1, used=0, free=1, reserved=None, utilization=None, process_used=0,
                      other_processes_used=0, pid_listed=False)


G0 = dev(0, "GPU-aaaa1111-0000-0000-0000-000000000000")
G1 = dev(1, "GPU-bbbb2222-0000-0000-0000-000000000000")
G2 = dev(2, "GPU-abcd3333-0000-0000-0000-000000000000")
PLAIN = [G0, G1, G2]


def ids(devs):
    return [d.uuid for d in devs]


def test_parse_visible_devices():
    assert parse_visible_devices(None) is None
    assert parse_visible_devices("") == []
    assert parse_visible_devices(" 1, 0 ") == ["1", "0"]


@pytest.mark.parametrize("value,expected", [
    (None, [G0, G1, G2]),
    ("", []),
    ("2,0", [G2, G0]),
    ("1", [G1]),
    ("0,7,1", [G0]),            # stops at the first invalid entry
    ("-1", []),
    ("1,1", [G1]),              # a repeated device ends the list
    ("GPU-bbbb2222-0000-0000-0000-000000000000", [G1]),
    ("GPU-bbbb", [G1]),         # unique prefix
    ("GPU-a", []),              # ambiguous prefix: invalid
    ("GPU-abcd,0", [G2, G0]),
    ("gpu-aaaa1111", [G0]),     # case-insensitive
    ("1,GPU-nope,2", [G1]),
])
def test_map_plain_gpus(value, expected):
    assert ids(map_visible_devices(value, PLAIN)) == ids(expected)


def test_map_mig_instances():
    parent = dev(0, "GPU-1111aaaa-0000-0000-0000-000000000000", mig_enabled=True)
    m0 = dev(0, "MIG-0a0a0a0a-0000-0000-0000-000000000000", mig_index=0, parent=parent.uuid)
    m1 = dev(0, "MIG-1b1b1b1b-0000-0000-0000-000000000000", mig_index=1, parent=parent.uuid)
    other = dev(1, "GPU-2222bbbb-0000-0000-0000-000000000000")
    devices = [parent, m0, m1, other]
    assert ids(map_visible_devices(None, devices)) == ids([m0, m1, other])
    assert ids(map_visible_devices("MIG-1b1b", devices)) == ids([m1])
    assert ids(map_visible_devices("MIG-1b1b1b1b-0000-0000-0000-000000000000,1", devices)) == ids([m1, other])
    assert ids(map_visible_devices("MIG-GPU-1111aaaa-0000-0000-0000-000000000000/1/0", devices)) == ids([m1])
    assert ids(map_visible_devices("0", devices)) == ids([m0])
    assert ids(map_visible_devices("1,0", devices)) == ids([other, m0])


def test_no_library_is_a_reason_not_an_exception():
    r = read_nvml()
    if r.devices:
        pytest.skip("this machine has NVIDIA devices")
    assert r.reason and "\n" not in r.reason
    assert r.reason.startswith("NVML")


# ---------------------------------------------------------------- a fake binding, for parsing logic only


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


def read_with(monkeypatch, fake):
    import sys

    monkeypatch.setitem(sys.modules, "pynvml", fake)
    state = nvml_mod._Nvml()
    monkeypatch.setattr(nvml_mod, "_NVML", state)
    return read_nvml()


def test_fake_v2_memory_and_processes(monkeypatch):
    GiB = 1 << 30
    r = read_with(monkeypatch, fake_pynvml())
    assert r.reason is None and r.driver_version == "575.57"
    d0 = r.devices[0]
    assert (d0.total, d0.used, d0.reserved) == (80 * GiB, 10 * GiB, GiB // 2)
    assert d0.utilization == 42
    assert d0.process_used == 3 * GiB          # listed as compute and graphics: counted once
    assert d0.other_processes_used == 5 * GiB
    assert d0.pid_listed


def test_fake_v1_driver(monkeypatch):
    r = read_with(monkeypatch, fake_pynvml(v2=False))
    assert all(d.reserved is None for d in r.devices)
    assert r.devices[0].total == 80 << 30


def test_fake_mig_instances_are_devices(monkeypatch):
    r = read_with(monkeypatch, fake_pynvml(mig=True))
    uuids = [d.uuid for d in r.devices]
    assert uuids == ["GPU-0", "MIG-0-0", "MIG-0-1", "GPU-1"]
    assert r.devices[0].mig_enabled and r.devices[1].parent_uuid == "GPU-0"
    visible = map_visible_devices(None, r.devices)
    assert [d.uuid for d in visible] == ["MIG-0-0", "MIG-0-1", "GPU-1"]


def test_fake_unified_memory_falls_back_to_host(monkeypatch):
    from vramlab.probes.host import read_host

    r = read_with(monkeypatch, fake_pynvml(unified=True))
    d1 = r.devices[1]
    assert d1.unified_memory and "unified memory" in d1.note
    assert d1.total == read_host().total


def test_fake_init_failure_is_looked_up_once(monkeypatch):
    calls = []
    fake = fake_pynvml()

    def init():
        calls.append(1)
        raise FakeError(9)

    fake.nvmlInit = init
    r = read_with(monkeypatch, fake)
    assert r.reason == "NVML unavailable: the NVIDIA driver is not loaded"
    read_nvml(), read_nvml()
    assert len(calls) == 1


def test_fake_process_not_listed(monkeypatch):
    r = read_with(monkeypatch, fake_pynvml(pid=999999999))
    assert not r.devices[0].pid_listed
    assert r.devices[0].process_used == 0
