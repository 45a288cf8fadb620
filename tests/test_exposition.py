"""The Prometheus exposition (:mod:`vramlab.exposition`): it parses, its values are the
snapshot's bytes, its layers add up as the snapshot's do, and the file is replaced atomically."""

import os
import sys
from collections import defaultdict

import driver_scenarios as sc
import pytest
from prometheus_client.parser import text_string_to_metric_families

from vramlab._extras import MissingExtra
from vramlab.exposition import SnapshotCollector, check_labels, exposition_text, write_textfile
from vramlab.model import DEVICE_LAYERS, HOST_LAYERS, DeviceSnapshot, Snapshot
from vramlab.reconcile import device_layers, snapshot

GiB, MiB = sc.GiB, sc.MiB


def samples(text):
    """{metric name: [(labels, value)]} of an exposition text, as Prometheus' own parser reads it."""
    out = defaultdict(list)
    for fam in text_string_to_metric_families(text):
        assert fam.type == "gauge", fam.name
        for s in fam.samples:
            out[s.name].append((s.labels, s.value))
    return out


def _device(id, total, used, uuid="GPU-x", name="Test GPU", **kw):
    layers = device_layers(total, used, **kw)
    return DeviceSnapshot(id=id, kind="cuda", name=name, uuid=uuid, source="nvml", nvml_index=0, total=total,
                          free=None if total is None or used is None else total - used, used=used,
                          driver_reserved=kw.get("driver_reserved"), process_used=kw.get("process_used"),
                          other_processes_used=None, utilization=None, torch_allocated=kw.get("torch_allocated"),
                          torch_reserved=kw.get("torch_reserved"), torch_active=None, torch_inactive_split=None,
                          torch_peak_allocated=None, torch_peak_reserved=None, num_ooms=None, num_alloc_retries=None,
                          mem_info_free=None, mem_info_total=None, unified_memory=False, layers=layers)


@pytest.fixture
def snap():
    """This machine's host reading with two made-up GPUs (one with every layer) and one without a reading."""
    s = snapshot()
    full = _device("cuda:0", 80 * GiB + 7, 30 * GiB + 3, process_used=20 * GiB, torch_reserved=16 * GiB,
                   torch_allocated=12 * GiB + 1, driver_reserved=512 * MiB)
    other = _device("nvml:1", 40 * GiB, 5 * GiB, uuid=None, name=None)
    unread = _device("cuda:2", None, None)
    return Snapshot(time=s.time, host=s.host, devices=(full, other, unread), notes=())


def test_it_parses_and_every_value_is_the_snapshots_bytes(snap):
    got = samples(exposition_text(snap, pid=4242))
    layer = {(lb["device"], lb["layer"]): v for lb, v in got["vramlab_device_layer_bytes"]}
    expected = {(d.id, k): n for d in snap.devices for k, n in d.layers}
    assert layer == {k: float(n) for k, n in expected.items()}
    assert all(float(n) == layer[k] and int(layer[k]) == n for k, n in expected.items())  # exact, not rounded
    keys = {k for _, k in layer}
    assert keys == {k for d in snap.devices for k, _ in d.layers} and set(DEVICE_LAYERS) >= keys
    totals = {lb["device"]: v for lb, v in got["vramlab_device_total_bytes"]}
    assert totals == {"cuda:0": 80 * GiB + 7, "nvml:1": 40 * GiB}  # cuda:2 has no reading: no series
    host = {lb["layer"]: v for lb, v in got["vramlab_host_layer_bytes"]}
    assert host == {k: float(n) for k, n in snap.host.layers} and set(HOST_LAYERS) >= set(host)
    [(lb, limit)] = got["vramlab_host_limit_bytes"]
    assert limit == snap.host.limit and lb["limit_source"] == snap.host.limit_source
    [(_, ts)] = got["vramlab_snapshot_timestamp_seconds"]
    assert ts == snap.time
    if snap.host.swap_total is not None:
        assert got["vramlab_swap_total_bytes"][0][1] == snap.host.swap_total
        assert got["vramlab_swap_used_bytes"][0][1] == snap.host.swap_used


def test_the_layers_add_up_to_the_totals_as_the_snapshots_do(snap):
    got = samples(exposition_text(snap))
    per_device = defaultdict(float)
    for lb, v in got["vramlab_device_layer_bytes"]:
        per_device[lb["device"]] += v
    for lb, total in got["vramlab_device_total_bytes"]:
        d = snap.device(lb["device"])
        assert per_device[lb["device"]] == total == d.total == sum(n for _, n in d.layers)
    assert sum(v for _, v in got["vramlab_host_layer_bytes"]) == snap.host.limit == sum(n for _, n in snap.host.layers)


def test_labels_name_the_device_its_uuid_and_name_and_the_pid(snap):
    got = samples(exposition_text(snap, pid=4242))
    by_device = {lb["device"]: lb for lb, _ in got["vramlab_device_total_bytes"]}
    assert by_device["cuda:0"] == {"device": "cuda:0", "uuid": "GPU-x", "gpu_name": "Test GPU", "pid": "4242"}
    assert by_device["nvml:1"]["uuid"] == "" and by_device["nvml:1"]["gpu_name"] == ""  # unknown: empty
    assert all(lb["pid"] == "4242" for series in got.values() for lb, _ in series)
    assert all(lb["pid"] == str(os.getpid()) for series in samples(exposition_text(snap)).values() for lb, _ in series)


def test_extra_labels_go_on_every_series_and_bad_ones_are_refused(snap):
    got = samples(exposition_text(snap, labels={"slurm_job_id": "77", "node_role": "train"}))
    assert all(lb["slurm_job_id"] == "77" and lb["node_role"] == "train" for s in got.values() for lb, _ in s)
    for bad in ("0x", "a-b", "__x", "pid", "layer", "device"):
        with pytest.raises(ValueError, match=repr(bad)):
            check_labels({bad: "v"})
    assert check_labels({"job": 5}) == {"job": "5"}


def test_a_simulated_two_gpu_machine_is_exported_as_snapshot_reads_it(nvml_sim):
    nvml_sim(sc.two_gpus())
    s = snapshot()
    got = samples(exposition_text(s))
    layer = {(lb["device"], lb["layer"]): v for lb, v in got["vramlab_device_layer_bytes"]}
    assert layer == {(d.id, k): float(n) for d in s.devices for k, n in d.layers}
    totals = {lb["uuid"]: v for lb, v in got["vramlab_device_total_bytes"]}
    assert totals == {sc.gpu(0)["uuid"]: 80 * GiB, sc.gpu(1)["uuid"]: 80 * GiB}
    assert {lb["gpu_name"] for lb, _ in got["vramlab_device_total_bytes"]} == {"NVIDIA H100 80GB HBM3"}
    assert layer[("cuda:0", "driver_reserved")] == 512 * MiB


def test_the_collector_registers_on_a_registry_of_ones_own(snap):
    from prometheus_client import CollectorRegistry, generate_latest

    reg = CollectorRegistry(auto_describe=False)
    reg.register(SnapshotCollector(snap, pid=1))
    assert generate_latest(reg).decode() == exposition_text(snap, pid=1)


def test_write_textfile_replaces_the_file_atomically(snap, tmp_path, monkeypatch):
    path = tmp_path / "vramlab.prom"
    path.write_text("old\n")
    seen = []
    real_replace = os.replace

    def spy(src, dst):
        # at the moment of the rename: the new text is complete beside the old file, which is intact
        assert os.path.dirname(os.path.abspath(src)) == str(tmp_path) and os.fspath(dst) == str(path)
        assert os.path.basename(src) != path.name and not os.path.basename(src).endswith(".prom")
        assert path.read_text() == "old\n"
        seen.append(samples(open(src).read()))
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", spy)
    assert write_textfile(path, snap, pid=9) == str(path)
    assert len(seen) == 1 and samples(path.read_text()) == seen[0]
    assert path.read_text() == exposition_text(snap, pid=9)
    assert os.listdir(tmp_path) == ["vramlab.prom"]  # no temporary file left


@pytest.mark.parametrize("failing", ["replace", "write", "fsync"])
def test_a_failed_write_leaves_the_old_file_and_no_temporary(snap, tmp_path, monkeypatch, failing):
    path = tmp_path / "vramlab.prom"
    path.write_text("old\n")

    def fail(*args, **kw):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, failing, fail)
    with pytest.raises(OSError, match="No space left"):
        write_textfile(path, snap)
    assert path.read_text() == "old\n"
    assert os.listdir(tmp_path) == ["vramlab.prom"]


def test_an_interrupt_during_the_write_leaves_no_temporary(snap, tmp_path, monkeypatch):
    path = tmp_path / "vramlab.prom"
    path.write_text("old\n")

    def interrupted(src, dst):
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "replace", interrupted)
    with pytest.raises(KeyboardInterrupt):
        write_textfile(path, snap)
    assert path.read_text() == "old\n" and os.listdir(tmp_path) == ["vramlab.prom"]


@pytest.mark.skipif(not hasattr(os, "symlink") or sys.platform == "win32", reason="POSIX symbolic links")
def test_a_symlink_planted_at_the_old_temporary_name_is_not_written_through(snap, tmp_path):
    """prometheus_client's write_to_textfile wrote to ``FILE.<pid>.<thread ident>``, following a
    symbolic link planted there; the temporary file now has a name no one can guess, made with O_EXCL."""
    import threading

    folder = tmp_path / "textfile"
    folder.mkdir()
    path = folder / "vramlab.prom"
    target = tmp_path / "victim"
    target.write_text("precious\n")
    planted = folder / f"vramlab.prom.{os.getpid()}.{threading.current_thread().ident}"
    planted.symlink_to(target)
    write_textfile(path, snap, pid=3)
    assert target.read_text() == "precious\n" and planted.is_symlink()
    assert path.read_text() == exposition_text(snap, pid=3) and not path.is_symlink()
    assert sorted(os.listdir(folder)) == sorted([path.name, planted.name])


def test_the_temporary_is_made_exclusively_in_the_same_folder_with_an_unpredictable_name(snap, tmp_path, monkeypatch):
    import tempfile

    made = []
    real = tempfile.mkstemp

    def spy(*args, **kw):
        fd, name = real(*args, **kw)
        made.append((kw, name))
        return fd, name

    monkeypatch.setattr(tempfile, "mkstemp", spy)
    path = tmp_path / "vramlab.prom"
    write_textfile(path, snap)
    write_textfile(path, snap)
    [(kw, first), (_, second)] = made
    assert kw["dir"] == str(tmp_path) and kw["prefix"] == f".vramlab.prom.{os.getpid()}." and kw["suffix"] == ".tmp"
    assert first != second and not os.path.exists(first) and os.listdir(tmp_path) == ["vramlab.prom"]


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX modes")
@pytest.mark.parametrize("umask,mode", [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)])
def test_the_file_has_the_mode_the_umask_gives_a_new_file(snap, tmp_path, umask, mode):
    path = tmp_path / "vramlab.prom"
    path.write_text("old\n")
    os.chmod(path, 0o600)
    old = os.umask(umask)
    try:
        write_textfile(path, snap)
    finally:
        os.umask(old)
    assert os.stat(path).st_mode & 0o777 == mode


def test_write_textfile_reads_a_snapshot_when_given_none(tmp_path):
    path = write_textfile(tmp_path / "now.prom")
    got = samples(open(path).read())
    assert {lb["layer"] for lb, _ in got["vramlab_host_layer_bytes"]} == {k for k, _ in snapshot().host.layers}
    assert got["vramlab_host_limit_bytes"][0][1] > 0


def test_without_prometheus_client_it_says_what_to_install(snap, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "prometheus_client", None)  # import prometheus_client raises ImportError
    for call in (lambda: exposition_text(snap), lambda: write_textfile(tmp_path / "x.prom", snap)):
        with pytest.raises(MissingExtra, match=r"pip install 'vramlab\[prometheus\]'") as e:
            call()
        assert "\n" not in str(e.value) and e.value.name == "prometheus_client"
    assert os.listdir(tmp_path) == []
