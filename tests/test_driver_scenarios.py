"""``vramlab.snapshot()`` in a fresh process against a simulated NVIDIA driver
(``tests/nvml_sim/pynvml.py``), one scenario each, as a user's kernel sees them."""

from __future__ import annotations

import sys

import pytest

import driver_scenarios as sc

GiB, MiB = sc.GiB, sc.MiB
linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PID visibility is read from /proc")


def layers(d):
    return d["layers"]


def exact(d):
    assert sum(d["layers"].values()) == d["total"], d["layers"]


def test_two_gpus():
    s = sc.run_snapshot(sc.two_gpus())
    assert [d["id"] for d in s["devices"]] == ["cuda:0", "cuda:1"]
    d0, d1 = s["devices"]
    assert d0["uuid"].startswith("GPU-0000") and d1["uuid"].startswith("GPU-1111")
    assert d0["source"] == "nvml" and d0["driver_reserved"] == 512 * MiB
    # listed as compute and graphics: counted once; the parent process is another process
    assert layers(d0)["context"] == 3 * GiB and layers(d0)["other_processes"] == 5 * GiB
    assert layers(d0)["unattributed"] == 0
    assert layers(d1)["free"] == 80 * GiB - 512 * MiB
    exact(d0), exact(d1)


@pytest.mark.parametrize("value", ["1,0", "GPU-1111,GPU-0000", "1,GPU-0000"])
def test_reordered_by_cuda_visible_devices(value):
    s = sc.run_snapshot(sc.two_gpus(), env={"CUDA_VISIBLE_DEVICES": value})
    assert [(d["id"], d["uuid"][:8]) for d in s["devices"]] == [("cuda:0", "GPU-1111"), ("cuda:1", "GPU-0000")]


def test_hidden_by_cuda_visible_devices_is_listed_as_nvml():
    s = sc.run_snapshot(sc.two_gpus(), env={"CUDA_VISIBLE_DEVICES": "1"})
    assert [(d["id"], d["uuid"][:8]) for d in s["devices"]] == [("cuda:0", "GPU-1111"), ("nvml:0", "GPU-0000")]


def test_old_driver_still_attributes_per_process_memory():
    s = sc.run_snapshot(sc.old_driver())
    d0 = s["devices"][0]
    assert d0["driver_reserved"] is None  # v1 memory info has no reserved figure
    assert d0["used"] == 8 * GiB + 512 * MiB  # v1's used includes what the driver reserves
    assert layers(d0)["context"] == 3 * GiB  # from the v1 process list, through the C symbol
    assert layers(d0)["other_processes"] == 5 * GiB + 512 * MiB
    exact(d0)


@linux
def test_container_pids_are_unattributed_not_other_processes():
    s = sc.run_snapshot(sc.container())
    d0 = s["devices"][0]
    assert layers(d0)["other_processes"] == 0
    assert layers(d0)["unattributed"] == 8 * GiB
    assert any(n["code"] in ("pids-hidden", "pids-hidden-self-unlisted") and n["count"] == 2 for n in s["notes"])
    exact(d0)


@linux
@pytest.mark.slow
def test_container_with_torch_imported_says_the_same():
    code = "import json, torch, vramlab; print(json.dumps(vramlab.snapshot().to_dict()))"
    s = sc.run_snapshot(sc.container(), code=code)
    assert layers(s["devices"][0])["unattributed"] == 8 * GiB


@linux
def test_a_child_process_is_this_kernels_child_not_another_process():
    s = sc.run_snapshot(sc.with_child(), code=sc.CHILD_CODE)
    assert s["child_pid"] in s["host"]["children_pids"] and s["host"]["children_count"] >= 1
    d0 = s["devices"][0]
    assert d0["children_used"] == 2 * GiB and d0["other_processes_used"] == 5 * GiB
    assert (layers(d0)["context"], layers(d0)["children"], layers(d0)["other_processes"]) == (3 * GiB, 2 * GiB, 5 * GiB)
    assert list(layers(d0)) == ["tensors", "torch_cache", "context", "children", "unattributed", "other_processes",
                                "driver_reserved", "free"]
    exact(d0)


@linux
def test_a_child_is_told_apart_even_when_this_pid_is_not_listed():
    s = sc.run_snapshot(sc.container_with_child(), code=sc.CHILD_CODE)
    d0 = s["devices"][0]
    assert (layers(d0)["children"], layers(d0)["unattributed"], layers(d0)["other_processes"]) == (2 * GiB, 3 * GiB, 0)
    exact(d0)


def test_used_gpu_memory_not_available():
    s = sc.run_snapshot(sc.no_figure())
    d0 = s["devices"][0]
    assert layers(d0)["unattributed"] == 2 * GiB and layers(d0)["other_processes"] == 0
    assert any(n["code"] == "no-process-memory" for n in s["notes"])
    exact(d0)


def test_mig_by_default_one_instance_is_cuda_0():
    s = sc.run_snapshot(sc.mig())
    ids = [(d["id"], d["uuid"]) for d in s["devices"]]
    assert ids[0] == ("cuda:0", "MIG-aaaaaaaa-1111-0000-0000-000000000000")
    assert ids[1][0] == "cuda:1" and ids[1][1].startswith("GPU-1111")
    assert ("nvml:0.1", "MIG-bbbbbbbb-2222-0000-0000-000000000000") in ids


@pytest.mark.parametrize("value", ["MIG-bbbbbbbb", "MIG-GPU-00000000-0000-0000-0000-000000000000/13/0"])
def test_mig_selected_by_uuid_and_by_the_legacy_form(value):
    s = sc.run_snapshot(sc.mig(), env={"CUDA_VISIBLE_DEVICES": value})
    d0 = s["devices"][0]
    assert (d0["id"], d0["uuid"]) == ("cuda:0", "MIG-bbbbbbbb-2222-0000-0000-000000000000")
    assert d0["total"] == 10 * GiB and layers(d0)["context"] == 2 * GiB
    exact(d0)


def test_legacy_form_by_slot_number_names_no_device():
    s = sc.run_snapshot(sc.mig(), env={"CUDA_VISIBLE_DEVICES": "MIG-GPU-00000000-0000-0000-0000-000000000000/1/0"})
    assert not [d for d in s["devices"] if d["id"].startswith("cuda:")]


@pytest.mark.parametrize("how", ["lost", "handle"])
def test_a_lost_gpu_among_three_shifts_nothing(how):
    s = sc.run_snapshot(sc.lost_among_three(how))
    assert [d["id"] for d in s["devices"]] == ["cuda:0", "cuda:1", "cuda:2"]
    d0, d1, d2 = s["devices"]
    assert d0["uuid"].startswith("GPU-0000") and d2["uuid"].startswith("GPU-2222")
    assert d1["total"] is None and d1["layers"] == {}
    assert d2["used"] == 4 * GiB
    assert {"code": "nvml-device-unreadable", "device": "nvml:1", "reason": "gpu-lost"} in s["notes"]
    assert d1["unreadable"] == {"reason": "gpu-lost", "detail": ""}


def test_no_nvml_library():
    s = sc.run_snapshot(sc.no_library())
    assert s["devices"] == []
    assert {"code": "nvml-unavailable", "reason": "no-library"} in s["notes"]


def test_unified_memory_shows_the_host():
    s = sc.run_snapshot(sc.unified())
    d0 = s["devices"][0]
    assert d0["unified_memory"] and d0["total"] == s["host"]["total"]
    assert any(n["code"] == "unified-memory" for n in s["notes"])


@pytest.mark.slow
def test_mixed_gpus_say_the_order_is_assumed_unless_pci_order_is_asked_for():
    s = sc.run_snapshot(sc.mixed())
    assert any(n["code"] == "order-assumed" for n in s["notes"])
    s = sc.run_snapshot(sc.mixed(), env={"CUDA_DEVICE_ORDER": "PCI_BUS_ID"})
    assert not any(n["code"] == "order-assumed" for n in s["notes"])
    s = sc.run_snapshot(sc.two_gpus())  # alike GPUs: the orders agree
    assert not any(n["code"] == "order-assumed" for n in s["notes"])


def test_every_unmodelled_entry_point_is_function_not_found():
    import importlib.util

    spec = importlib.util.spec_from_file_location("pynvml_sim", sc.SIM_DIR / "pynvml.py")
    sim = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(sim)
    sim.configure(sc.two_gpus())
    sim.nvmlInit()
    h = sim.nvmlDeviceGetHandleByIndex(0)
    with pytest.raises(sim.NVMLError) as e:
        sim.nvmlDeviceGetPowerUsage(h)
    assert e.value.value == sim.NVML_ERROR_FUNCTION_NOT_FOUND
