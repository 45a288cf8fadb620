import json

from hypothesis import given, strategies as st

import vramlab
from vramlab.facts import NoteCode
from vramlab.model import DEVICE_LAYERS, HOST_LAYERS, HostReading
from vramlab.reconcile import device_layers, host_layers, snapshot

REQUIRED_HOST = {"total", "available", "limit", "limit_source", "process_rss", "process_peak", "swap_total", "swap_used"}
REQUIRED_DEV = {"id", "kind", "name", "total", "free", "used", "process_used", "torch_allocated", "torch_reserved",
                "torch_peak_allocated"}


def test_snapshot_is_frozen_and_json_safe():
    s = vramlab.snapshot()
    d = s.to_dict()
    assert json.loads(json.dumps(d)) == d
    assert {"time", "host", "devices", "notes"} <= set(d)
    assert REQUIRED_HOST <= set(d["host"])
    for dev in d["devices"]:
        assert REQUIRED_DEV <= set(dev)
    try:
        s.time = 0
    except Exception as e:
        assert type(e).__name__ == "FrozenInstanceError"
    else:
        raise AssertionError("Snapshot must be frozen")


def test_no_gpu_is_explained_in_notes():
    s = snapshot()
    if not any(d.id.startswith("cuda") for d in s.devices):
        assert any(n.code in (NoteCode.NVML_UNAVAILABLE, NoteCode.NVML_NO_GPU) for n in s.notes)


def test_host_layers_sum_to_limit():
    s = snapshot()
    assert sum(n for _, n in s.host.layers) == s.host.limit
    assert s.host.layer("process") == min(s.host.process_rss, s.host.limit)


def test_repr_is_short_and_stable():
    assert repr(snapshot()) == repr(snapshot())
    assert len(repr(snapshot())) < 120


def test_device_layers_example():
    GiB = 1 << 30
    layers = dict(device_layers(80 * GiB, 20 * GiB, driver_reserved=GiB // 2, process_used=12 * GiB,
                                torch_reserved=10 * GiB, torch_allocated=7 * GiB))
    assert layers == {"tensors": 7 * GiB, "torch_cache": 3 * GiB, "context": 2 * GiB, "children": 0, "unattributed": 0,
                      "other_processes": 8 * GiB, "driver_reserved": GiB // 2, "free": 80 * GiB - 20 * GiB - GiB // 2}


def test_device_layers_hidden_pids_are_unattributed_not_other_processes():
    GiB = 1 << 30
    layers = dict(device_layers(80 * GiB, 20 * GiB, process_used=12 * GiB, torch_reserved=10 * GiB,
                                torch_allocated=7 * GiB, unattributed=5 * GiB))
    assert (layers["context"], layers["unattributed"], layers["other_processes"]) == (2 * GiB, 5 * GiB, 3 * GiB)
    # this process unknown: known others stay others, the rest is unattributed
    layers = dict(device_layers(80 * GiB, 20 * GiB, process_used=None, torch_reserved=10 * GiB,
                                torch_allocated=7 * GiB, other_processes=4 * GiB))
    assert (layers["unattributed"], layers["other_processes"]) == (6 * GiB, 4 * GiB)


def test_device_layers_children_are_not_other_processes():
    GiB = 1 << 30
    layers = device_layers(80 * GiB, 20 * GiB, process_used=12 * GiB, torch_reserved=10 * GiB,
                           torch_allocated=7 * GiB, children=6 * GiB)
    d = dict(layers)
    assert (d["context"], d["children"], d["other_processes"]) == (2 * GiB, 6 * GiB, 2 * GiB)
    assert [k for k, _ in layers] == [k for k in DEVICE_LAYERS if k in d]  # in the labels' order
    # this process unknown: its children known, the rest unattributed except known others
    d = dict(device_layers(80 * GiB, 20 * GiB, process_used=None, torch_reserved=10 * GiB, torch_allocated=7 * GiB,
                           children=6 * GiB, other_processes=1 * GiB))
    assert (d["children"], d["unattributed"], d["other_processes"]) == (6 * GiB, 3 * GiB, 1 * GiB)
    # None (no figure for a child) counts as none
    assert dict(device_layers(100, 60, process_used=20, children=None))["children"] == 0


def _host(total=16 << 30, avail=8 << 30, rss=2 << 30, limit=None, usage=None, kids_rss=0, kids_uss=None, count=0):
    return HostReading(time=0.0, total=total, available=avail, used=max(total - avail, 0), limit=limit or total,
                       limit_source="x", cgroup_usage=usage, process_rss=rss, process_peak=rss, process_uss=None,
                       swap_total=0, swap_used=0, swap_in=0, swap_out=0, peak_exact=True, children_count=count,
                       children_rss=kids_rss, children_uss=kids_uss, children_pids=tuple(range(1000, 1000 + count)))


def test_host_children_are_a_layer_of_their_own():
    GiB = 1 << 30
    d = dict(host_layers(_host(kids_rss=3 * GiB, count=2)))
    assert (d["process"], d["children"], d["others"], d["available"]) == (2 * GiB, 3 * GiB, 3 * GiB, 8 * GiB)
    assert [k for k, _ in host_layers(_host())] == list(HOST_LAYERS)
    # their USS, when read, is the layer: the pages they share with this process are in its RSS already
    d = dict(host_layers(_host(kids_rss=3 * GiB, kids_uss=GiB, count=2)))
    assert (d["children"], d["others"]) == (GiB, 5 * GiB)


def test_host_children_rss_summed_never_pushes_available():
    GiB = 1 << 30
    # forked workers: each RSS counts the pages shared with this process; summed it exceeds what is used
    d = dict(host_layers(_host(kids_rss=40 * GiB, count=8)))
    assert (d["children"], d["others"], d["available"]) == (6 * GiB, 0, 8 * GiB)
    assert sum(d.values()) == 16 * GiB


def test_device_layers_unknown_process_goes_to_unattributed():
    layers = dict(device_layers(100, 60, process_used=None, torch_reserved=30, torch_allocated=10))
    assert layers["unattributed"] == 30 and "context" not in layers
    assert sum(layers.values()) == 100


sizes = st.integers(min_value=0, max_value=2**40)


@given(total=sizes, used=sizes, rd=st.one_of(st.none(), sizes), p=st.one_of(st.none(), sizes), r=sizes, a=sizes,
       u=st.one_of(st.none(), sizes), o=st.one_of(st.none(), sizes), c=st.one_of(st.none(), sizes))
def test_device_layers_always_sum_to_total(total, used, rd, p, r, a, u, o, c):
    layers = device_layers(total, used, driver_reserved=rd, process_used=p, torch_reserved=r, torch_allocated=a,
                           unattributed=u, other_processes=o, children=c)
    assert sum(n for _, n in layers) == total
    assert all(n >= 0 for _, n in layers)


@given(total=st.integers(1, 2**40), avail=sizes, rss=sizes, limit=st.integers(1, 2**40),
       usage=st.one_of(st.none(), sizes), kids_rss=sizes, kids_uss=st.one_of(st.none(), sizes))
def test_host_layers_always_sum_to_limit(total, avail, rss, limit, usage, kids_rss, kids_uss):
    h = HostReading(time=0.0, total=total, available=avail, used=max(total - avail, 0), limit=limit, limit_source="x",
                    cgroup_usage=usage, process_rss=rss, process_peak=rss, process_uss=None, swap_total=0, swap_used=0,
                    swap_in=0, swap_out=0, peak_exact=True, children_count=1, children_rss=kids_rss,
                    children_uss=kids_uss)
    layers = host_layers(h)
    assert sum(n for _, n in layers) == limit
    assert all(n >= 0 for _, n in layers)
    # the children never take from what is available
    plain = dict(host_layers(HostReading(**{**vars(h), "children_rss": 0, "children_uss": None})))
    assert dict(layers)["available"] == plain["available"]


def test_provider_devices_are_included():
    from vramlab.reconcile import DeviceSnapshot, register_device_provider, unregister_device_provider

    def provider():
        return [DeviceSnapshot(id="virtual:0", kind="virtual", name="T", uuid=None, source="virtual", nvml_index=None,
                               total=100, free=60, used=40, driver_reserved=None, process_used=40,
                               other_processes_used=0, utilization=None, torch_allocated=40, torch_reserved=40,
                               torch_active=None, torch_inactive_split=None, torch_peak_allocated=50,
                               torch_peak_reserved=None, num_ooms=0, num_alloc_retries=None, mem_info_free=None,
                               mem_info_total=None, unified_memory=False,
                               layers=device_layers(100, 40, process_used=40, torch_reserved=40, torch_allocated=40))]

    def broken():
        raise RuntimeError("boom")

    register_device_provider(provider)
    register_device_provider(broken)
    try:
        s = snapshot()
        assert s.device("virtual:0").layer("tensors") == 40
        assert any(n.code is NoteCode.PROVIDER_FAILED and n.detail == "RuntimeError: boom" for n in s.notes)
    finally:
        unregister_device_provider(provider)
        unregister_device_provider(broken)
    assert all(d.id != "virtual:0" for d in snapshot().devices)
