"""CUDA_VISIBLE_DEVICES and MIG names mapped onto NVML devices, as the CUDA runtime does."""

import pytest

from vramlab.probes.cuda_order import map_visible_devices, parse_visible_devices
from vramlab.probes.nvml import NvmlDevice


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
