"""CUDA_VISIBLE_DEVICES and MIG names mapped onto NVML devices, as the CUDA runtime does."""

import pytest

from vramlab.probes.cuda_order import map_visible_devices, parse_visible_devices
from vramlab.probes.nvml import NvmlDevice


def dev(i, uuid, mig_index=None, parent=None, mig_enabled=False, gi=None, ci=None):
    return NvmlDevice(index=i, mig_index=mig_index, name="X", uuid=uuid, parent_uuid=parent, mig_enabled=mig_enabled,
                      total=1, used=0, free=1, reserved=None, utilization=None, process_used=0,
                      other_processes_used=0, pid_listed=False, gpu_instance_id=gi, compute_instance_id=ci)


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
    """NVIDIA's MIG user guide: a CUDA process enumerates a single MIG device; the legacy
    MIG-GPU-<uuid>/<gi>/<ci> names an instance by its GPU-instance and compute-instance ids."""
    parent = dev(0, "GPU-1111aaaa-0000-0000-0000-000000000000", mig_enabled=True)
    # device slots 0 and 1 hold GPU instances 7 and 13 (ids are not slot numbers)
    m0 = dev(0, "MIG-0a0a0a0a-0000-0000-0000-000000000000", mig_index=0, parent=parent.uuid, gi=7, ci=0)
    m1 = dev(0, "MIG-1b1b1b1b-0000-0000-0000-000000000000", mig_index=1, parent=parent.uuid, gi=13, ci=0)
    other = dev(1, "GPU-2222bbbb-0000-0000-0000-000000000000")
    devices = [parent, m0, m1, other]
    assert ids(map_visible_devices(None, devices)) == ids([m0, other])
    assert ids(map_visible_devices("MIG-1b1b", devices)) == ids([m1])
    assert ids(map_visible_devices("MIG-1b1b1b1b-0000-0000-0000-000000000000,1", devices)) == ids([m1, other])
    assert ids(map_visible_devices("MIG-GPU-1111aaaa-0000-0000-0000-000000000000/13/0", devices)) == ids([m1])
    assert ids(map_visible_devices("MIG-GPU-1111aaaa-0000-0000-0000-000000000000/1/0", devices)) == []  # a slot, not an id
    assert ids(map_visible_devices("0", devices)) == ids([m0])
    assert ids(map_visible_devices("1,0", devices)) == ids([other, m0])
    assert ids(map_visible_devices("MIG-0a0a,MIG-1b1b", devices)) == ids([m0])  # one MIG device per process


def test_integers_are_nvml_indices_and_an_unreadable_gpu_keeps_its_place():
    lost = NvmlDevice(index=1, mig_index=None, name="?", uuid=None, parent_uuid=None, mig_enabled=False, total=None,
                      used=None, free=None, reserved=None, utilization=None, process_used=None,
                      other_processes_used=None, pid_listed=False, readable=False)
    g2 = dev(2, "GPU-cccc")
    devices = [G0, lost, g2]
    assert [d.index for d in map_visible_devices(None, devices)] == [0, 1, 2]
    assert [d.index for d in map_visible_devices("2,0", devices)] == [2, 0]
    assert map_visible_devices("GPU-cccc", devices) == [g2]
