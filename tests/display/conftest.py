"""Fixtures for the renderers."""

import pytest

import dataclasses

from vramlab.model import DeviceSnapshot, HostSnapshot, Snapshot
from vramlab.reconcile import device_layers, host_layers, snapshot

GiB = 1 << 30


def _fake_gpu():
    layers = device_layers(80 * GiB, 30 * GiB, process_used=20 * GiB, torch_reserved=16 * GiB,
                           torch_allocated=12 * GiB)
    return DeviceSnapshot(id="cuda:0", kind="cuda", name="Test GPU", uuid="GPU-x", source="nvml+torch", nvml_index=0,
                          total=80 * GiB, free=50 * GiB, used=30 * GiB, driver_reserved=None,
                          process_used=20 * GiB, other_processes_used=10 * GiB, utilization=50,
                          torch_allocated=12 * GiB, torch_reserved=16 * GiB, torch_active=12 * GiB,
                          torch_inactive_split=GiB, torch_peak_allocated=14 * GiB, torch_peak_reserved=16 * GiB,
                          num_ooms=1, num_alloc_retries=0, mem_info_free=None, mem_info_total=None,
                          unified_memory=False, layers=layers)


@pytest.fixture
def gpu_snapshot():
    """This machine's host reading with one made-up 80 GiB GPU (12 GiB tensors, 4 GiB cache, ...)."""
    s = snapshot()
    return Snapshot(time=s.time, host=s.host, devices=(_fake_gpu(),), notes=())


@pytest.fixture
def children_snapshot(gpu_snapshot):
    """``gpu_snapshot`` whose host has two made-up workers (RSS 64 MiB summed, USS 16 MiB) and
    whose GPU lists a child holding 3 GiB of the other processes' 10 GiB."""
    MiB = 1 << 20
    h = gpu_snapshot.host
    fields = {k: v for k, v in vars(h).items() if k != "layers"}
    fields.update(children_count=2, children_rss=64 * MiB, children_uss=16 * MiB, children_pss=40 * MiB,
                  children_pids=(101, 102), used=max(h.used, h.process_rss + 64 * MiB))
    host = HostSnapshot(**fields, layers=())
    host = dataclasses.replace(host, layers=host_layers(host))
    d = gpu_snapshot.devices[0]
    d = dataclasses.replace(d, other_processes_used=7 * GiB, children_used=3 * GiB, layers=device_layers(
        80 * GiB, 30 * GiB, process_used=20 * GiB, torch_reserved=16 * GiB, torch_allocated=12 * GiB, children=3 * GiB))
    return dataclasses.replace(gpu_snapshot, host=host, devices=(d,))


@pytest.fixture
def children_record():
    """A cell that started two workers: RSS +64 MiB summed, USS +16 MiB."""
    from vramlab.model import CellRecord, HostDelta

    MiB = 1 << 20
    h = HostDelta(rss_start=100 * MiB, rss_end=101 * MiB, rss_delta=MiB, peak=101 * MiB, peak_delta=MiB,
                  swap_delta=None, peak_exact=True, children_count_start=0, children_count_end=2, children_rss_start=0,
                  children_rss_end=64 * MiB, children_rss_delta=64 * MiB, children_uss_start=0,
                  children_uss_end=16 * MiB, children_uss_delta=16 * MiB)
    return CellRecord(execution_count=4, started=0.0, wall_s=0.5, error=None, host=h)


@pytest.fixture
def speak():
    """``speak("pt-BR")`` or ``speak("en")``: the language the displays use; detection comes back after the test."""
    from vramlab.i18n import set_lang

    yield set_lang
    set_lang(None)
