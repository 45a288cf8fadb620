"""NVML probe. The fake binding (``tests/fake_nvml.py``) stands in for NVML only to test parsing logic
(MIG enumeration, v2 memory info, unified-memory fallback, process attribution);
the real library path runs in ``python -m vramlab.selftest`` on a GPU machine."""

import pytest
from fake_nvml import FakeError, fake_pynvml

from vramlab.probes import nvml as nvml_mod
from vramlab.probes.cuda_order import map_visible_devices
from vramlab.probes.nvml import read_nvml


def test_no_library_is_a_reason_not_an_exception():
    r = read_nvml()
    if r.devices:
        pytest.skip("this machine has NVIDIA devices")
    assert r.reason and "\n" not in r.reason
    assert r.reason.startswith("NVML")


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
