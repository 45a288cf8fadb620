"""Fixtures for the renderers."""

import pytest

from vramlab.model import DeviceSnapshot, Snapshot
from vramlab.reconcile import device_layers, snapshot

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
