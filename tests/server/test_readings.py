"""vramlab.server.readings without a server: how a reading attributes memory to kernels, and how
the service caches readings and keeps each kernel's history."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.driver_scenarios import GiB, MiB, gpu, machine
from vramlab.server.readings import KernelMemoryService, KernelRef, read_kernels


def test_remote_and_gone_kernels_have_no_figures(nvml_sim, sleeper):
    nvml_sim(machine(gpu(0, procs=[{"pid": sleeper, "mem": 1 * GiB}])))
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    data = read_kernels([KernelRef("k", sleeper, "python3", "a.ipynb"), KernelRef("r", None, "python3"),
                         KernelRef("g", gone.pid, "python3")])
    k = {row["id"]: row for row in data["kernels"]}
    assert k["k"]["state"] == "running" and k["k"]["gpu"] == [1 * GiB] and k["k"]["path"] == "a.ipynb"
    assert k["r"]["state"] == "remote" and k["r"]["rss"] is None and "%vram" in k["r"]["note"]
    assert k["g"]["state"] == "gone" and k["g"]["gpu"] == [None]
    assert data["others"] == [0] and data["unattributed"] == []


def test_visible_processes_that_are_no_kernels_are_others(nvml_sim, sleeper):
    nvml_sim(machine(gpu(0, procs=[{"pid": "self", "mem": 300 * MiB}, {"pid": "parent", "mem": 2 * GiB},
                                   {"pid": sleeper, "mem": 1 * GiB}])))
    data = read_kernels([KernelRef("k", sleeper)])
    assert data["kernels"][0]["gpu_used"] == 1 * GiB
    assert data["others"] == [2 * GiB + 300 * MiB]


def test_a_missing_figure_or_process_list_makes_the_kernels_share_unknown(nvml_sim, sleeper):
    nvml_sim(machine(gpu(0, procs=[{"pid": sleeper, "mem": None}]), gpu(1, procs=[{"pid": sleeper, "mem": 5 * MiB}]),
                     process_lists=["v3"]))
    row = read_kernels([KernelRef("k", sleeper)])["kernels"][0]
    assert row["gpu"] == [None, 5 * MiB] and row["gpu_used"] is None
    nvml_sim(machine(gpu(0, procs=[{"pid": sleeper, "mem": 1 * GiB}]), process_lists=[]))
    data = read_kernels([KernelRef("k", sleeper)])
    assert data["kernels"][0]["gpu"] == [None]
    assert any("no process list" in n for n in data["notes"])


def test_without_nvml_the_reading_says_why(nvml_sim, sleeper):
    nvml_sim(machine(init_error="LIBRARY_NOT_FOUND"))
    data = read_kernels([KernelRef("k", sleeper)])
    assert data["gpu"]["available"] is False and data["gpu"]["reason"]
    assert data["kernels"][0]["rss"] > 0 and data["kernels"][0]["gpu"] == []
    assert data["kernels"][0]["gpu_used"] is None  # not 0: there is no GPU to hold nothing on


def test_the_service_serves_one_reading_per_interval_and_keeps_history(nvml_sim, sleeper, monkeypatch):
    nvml_sim(machine(gpu(0)))
    clock = [1000.0]
    from vramlab.server import readings

    monkeypatch.setattr(readings, "_monotonic", lambda: clock[0])
    monkeypatch.setattr(readings, "_now", lambda: clock[0])
    s = KernelMemoryService(min_interval=1.0, history_seconds=60.0)
    refs = [KernelRef("k", sleeper, "python3", "a.ipynb", "idle")]
    first = s.read(refs)
    again = s.read([KernelRef("k", sleeper, "python3", "b.ipynb", "busy")])
    assert s.readings == 1 and again["time"] == first["time"]
    assert again["kernels"][0]["path"] == "b.ipynb" and again["kernels"][0]["execution_state"] == "busy"
    s.read(refs, uss=True)  # USS was not read: read anew
    assert s.readings == 2
    s.read(refs)  # a USS reading serves a plain request
    assert s.readings == 2
    for _ in range(3):
        clock[0] += 1.5
        latest = s.read(refs)
    assert s.readings == 5
    h = latest["kernels"][0]["history"]
    assert len(h) == 4 and all(len(x) == 3 and x[1] > 0 for x in h)  # the two readings at 1000 s share a point
    assert [x[0] for x in h] == sorted(x[0] for x in h)
    s.read([])  # the kernel is gone: its history too
    assert s._history == {}


def test_history_keeps_only_the_window(nvml_sim, sleeper, monkeypatch):
    nvml_sim(machine(gpu(0)))
    from vramlab.server import readings

    now = [0.0]
    monkeypatch.setattr(readings, "_now", lambda: now[0])
    s = KernelMemoryService(min_interval=0.0, history_seconds=10.0)
    for t in range(0, 30, 2):
        now[0] = float(t)
        h = s.read([KernelRef("k", sleeper)])["kernels"][0]["history"]
    assert [x[0] for x in h] == [18.0, 20.0, 22.0, 24.0, 26.0, 28.0]


def test_readings_closer_than_a_slot_share_one_point_with_their_peak(nvml_sim, sleeper, monkeypatch):
    from vramlab.server import readings

    nvml_sim(machine(gpu(0, procs=[{"pid": sleeper, "mem": 1 * GiB}])))
    now = [1000.0]
    monkeypatch.setattr(readings, "_now", lambda: now[0])
    s = KernelMemoryService(min_interval=0.0, history_seconds=readings.HISTORY_POINTS * 1.0)  # 1 s slots
    refs = [KernelRef("k", sleeper)]
    figures = iter([100, 300, 200, 50])
    real = readings.read_kernels

    def fake_rss(kernels, uss=False):
        data = real(kernels, uss)
        data["kernels"][0]["rss"] = next(figures)
        return data

    monkeypatch.setattr(readings, "read_kernels", fake_rss)
    for t in (1000.1, 1000.5, 1000.9, 1001.2):
        now[0] = t
        h = s.read(refs)["kernels"][0]["history"]
    assert h == [[1000.9, 300, 1 * GiB], [1001.2, 50, 1 * GiB]]


def test_a_starting_kernel_is_not_a_remote_one(nvml_sim):
    nvml_sim(machine(gpu(0)))
    rows = read_kernels([KernelRef("s", None, "python3", remote=False), KernelRef("r", None, "python3")])["kernels"]
    assert [(r["state"], "%vram" in r["note"]) for r in rows] == [("starting", False), ("remote", True)]


def test_mig_instances_replace_their_gpu_so_nothing_counts_twice(nvml_sim, sleeper):
    sc = machine(gpu(0, name="NVIDIA A100-SXM4-40GB", total=40 * GiB, used=0,
                     mig=[{"uuid": "MIG-aaaaaaaa-1111-0000-0000-000000000000", "slot": 0, "gi": 7, "ci": 0,
                           "total": 20 * GiB, "used": 0, "procs": []},
                          {"uuid": "MIG-bbbbbbbb-2222-0000-0000-000000000000", "slot": 1, "gi": 13, "ci": 0,
                           "total": 10 * GiB, "used": 1 * GiB, "procs": [{"pid": sleeper, "mem": 1 * GiB}]}],
                     procs=[{"pid": sleeper, "mem": 1 * GiB}]),
                 gpu(1, name="NVIDIA A100-SXM4-40GB", total=40 * GiB, used=0))
    nvml_sim(sc)
    data = read_kernels([KernelRef("k", sleeper)])
    labels = [d["label"] for d in data["gpu"]["devices"]]
    assert labels == ["GPU 0 MIG 0", "GPU 0 MIG 1", "GPU 1"]
    assert data["kernels"][0]["gpu"] == [0, 1 * GiB, 0] and data["kernels"][0]["gpu_used"] == 1 * GiB


def test_requests_that_wait_for_a_slow_reading_are_served_it(nvml_sim, sleeper, monkeypatch):
    """The cache counts a reading's age from when it ended: requests queued behind a slow reading
    get that reading instead of each reading again."""
    import threading
    import time

    from vramlab.server import readings

    nvml_sim(machine(gpu(0)))
    real = readings.read_kernels

    def slow(kernels, uss=False):
        time.sleep(0.5)  # longer than min_interval
        return real(kernels, uss)

    monkeypatch.setattr(readings, "read_kernels", slow)
    s = KernelMemoryService(min_interval=0.2)
    refs = [KernelRef("k", sleeper)]
    got = []
    threads = [threading.Thread(target=lambda: got.append(s.read(refs))) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert s.readings == 1 and len({g["time"] for g in got}) == 1


def test_a_server_running_as_another_user_reads_a_kernel_it_cannot_fully_read(sleeper, nvml_sim):
    """A server run by an unprivileged user, reading a kernel of another user (root here): the
    kernel is running, with its RSS, and its USS (which needs the owner's permission) is unknown,
    never a wrong figure and never "gone" (hardening, finding 8). The reading runs in a child
    forked from this process that drops to the user 'nobody' (the interpreter is already loaded:
    it may live where that user cannot read). Skips where that cannot be done."""
    import json
    import os
    import pwd

    import psutil  # noqa: F401 - loaded before the child drops its rights

    if os.geteuid() != 0 or not hasattr(os, "fork"):
        pytest.skip("switching to another user needs root and fork")
    try:
        nobody = pwd.getpwnam("nobody")
    except KeyError:
        pytest.skip("no unprivileged user 'nobody' here")
    nvml_sim(machine(gpu(0)))
    read_kernels([KernelRef("warm", os.getpid(), "python3")], uss=True)  # every lazy import done here
    rfd, wfd = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: drop to nobody, read, write the row, exit without cleanup
        try:
            os.close(rfd)
            os.setgroups([])
            os.setgid(nobody.pw_gid)
            os.setuid(nobody.pw_uid)
            row = read_kernels([KernelRef("k", sleeper, "python3", "a.ipynb")], uss=True)["kernels"][0]
            os.write(wfd, json.dumps({"uid": os.getuid(), "row": row}).encode())
        except BaseException as e:  # noqa: BLE001 - reported to the parent
            os.write(wfd, json.dumps({"error": repr(e)}).encode())
        finally:
            os._exit(0)
    os.close(wfd)
    with os.fdopen(rfd, "rb") as f:
        got = json.loads(f.read() or b"{}")
    os.waitpid(pid, 0)
    assert "error" not in got, got
    assert got["uid"] == nobody.pw_uid
    row = got["row"]
    assert row["state"] == "running" and row["pid"] == sleeper
    assert row["rss"] and row["rss"] > 0
    assert row["uss"] is None  # another user's USS cannot be read: unknown, not 0
