"""The NVML probe against the simulated driver (tests/nvml_sim/pynvml.py), in this process.

The scenarios as a user sees them, through ``snapshot()`` in a fresh process, are in
tests/test_driver_scenarios.py; the real library runs in ``python -m vramlab.selftest``.
"""

import os

import driver_scenarios as sc
import pytest

from vramlab.display.words import note_text
from vramlab.facts import Note, NoteCode, Problem, Reason
from vramlab.probes.nvml import read_nvml

GiB, MiB = sc.GiB, sc.MiB


def test_no_library_is_a_reason_not_an_exception():
    r = read_nvml()
    if r.devices:
        pytest.skip("this machine has NVIDIA devices")
    assert r.reason is not None and r.reason.code in (NoteCode.NVML_UNAVAILABLE, NoteCode.NVML_NO_GPU)
    assert "\n" not in note_text(r.reason) and note_text(r.reason).startswith("NVML")


def test_v2_memory_and_the_v3_process_list(nvml_sim):
    nvml_sim(sc.two_gpus())
    r = read_nvml()
    assert r.reason is None and r.driver_version == "575.57.08"
    d0 = r.devices[0]
    assert (d0.total, d0.used, d0.reserved) == (80 * GiB, 8 * GiB, 512 * MiB)
    assert d0.free == 80 * GiB - 8 * GiB - 512 * MiB
    assert d0.utilization == 40 and d0.process_list == "v3"
    assert d0.process_used == 3 * GiB  # listed as compute and graphics: counted once
    assert d0.other_processes_used == 5 * GiB and d0.unattributed_used == 0
    assert d0.pid_listed and d0.index == 0


@pytest.mark.parametrize("lists,expected", [(["v3", "v2", "v1"], "v3"), (["v2", "v1"], "v2"), (["v1"], "v1")])
def test_process_lists_fall_back_v3_v2_v1(nvml_sim, lists, expected):
    scenario = sc.two_gpus()
    scenario["process_lists"] = lists
    nvml_sim(scenario)
    d0 = read_nvml().devices[0]
    assert d0.process_list == expected
    assert d0.process_used == 3 * GiB and d0.other_processes_used == 5 * GiB


def test_a_driver_without_any_process_list_reports_none(nvml_sim):
    scenario = sc.two_gpus()
    scenario["process_lists"] = []
    nvml_sim(scenario)
    d0 = read_nvml().devices[0]
    assert d0.process_list is None and d0.process_used is None and d0.other_processes_used is None


def test_v1_memory_info_counts_reserved_as_used(nvml_sim):
    nvml_sim(sc.old_driver())
    d0 = read_nvml().devices[0]
    assert d0.reserved is None and d0.used == 8 * GiB + 512 * MiB and d0.total == 80 * GiB


def test_mig_instances_carry_their_instance_ids(nvml_sim):
    nvml_sim(sc.mig())
    r = read_nvml()
    assert [(d.index, d.mig_index, d.gpu_instance_id) for d in r.devices] == [(0, None, None), (0, 0, 7), (0, 1, 13),
                                                                             (1, None, None)]
    assert r.devices[0].mig_enabled and r.devices[2].parent_uuid == r.devices[0].uuid


def test_unified_memory_falls_back_to_host(nvml_sim):
    from vramlab.probes.host import read_host

    nvml_sim(sc.unified())
    d0 = read_nvml().devices[0]
    assert d0.unified_memory and d0.note == Note(NoteCode.UNIFIED_MEMORY, device=d0.name)
    assert d0.total == read_host().total


def test_init_failure_is_a_reason_looked_up_once(nvml_sim):
    sim = nvml_sim(sc.machine(init_error="DRIVER_NOT_LOADED"))
    calls = []
    init = sim.nvmlInit

    def counted():
        calls.append(1)
        init()

    sim.nvmlInit = counted
    r = read_nvml()
    assert r.reason == Note(NoteCode.NVML_UNAVAILABLE, problem=Problem(Reason.DRIVER_NOT_LOADED))
    assert note_text(r.reason) == "NVML unavailable: the NVIDIA driver is not loaded"
    read_nvml(), read_nvml()
    assert len(calls) == 1


def test_a_lost_gpu_keeps_its_index_and_says_why(nvml_sim):
    nvml_sim(sc.lost_among_three())
    r = read_nvml()
    assert [(d.index, d.readable) for d in r.devices] == [(0, True), (1, False), (2, True)]
    assert r.devices[1].unreadable == Problem(Reason.GPU_LOST) and r.devices[2].used == 4 * GiB
    assert r.devices[1].note == Note(NoteCode.NVML_DEVICE_UNREADABLE, device="nvml:1", problem=Problem(Reason.GPU_LOST))


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="PID visibility is read from /proc")
def test_hidden_pids_are_counted_apart(nvml_sim):
    nvml_sim(sc.container())
    d0 = read_nvml().devices[0]
    assert not d0.pid_listed and d0.process_used == 0
    assert d0.hidden_pids == 2 and d0.unattributed_used == 8 * GiB and d0.other_processes_used == 0


def _sleeper():
    import signal
    import subprocess
    import sys

    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"],
                            env={"PATH": os.environ.get("PATH", "")}, stdin=subprocess.DEVNULL,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


def test_the_pids_of_children_are_counted_apart_from_other_processes(nvml_sim):
    child = _sleeper()
    try:
        scenario = sc.with_child()
        for proc in scenario["gpus"][0]["procs"]:  # this child, by its PID: the test process may have others
            if proc["pid"] == "child":
                proc["pid"] = child.pid
        nvml_sim(scenario)
        d0 = read_nvml(children=[child.pid]).devices[0]
        assert (d0.process_used, d0.children_used, d0.other_processes_used) == (3 * GiB, 2 * GiB, 5 * GiB)
        assert d0.children_listed == 1 and d0.unattributed_used == 0
        d0 = read_nvml().devices[0]  # not told which PIDs are children: another process
        assert (d0.children_used, d0.other_processes_used, d0.children_listed) == (0, 7 * GiB, 0)
    finally:
        child.kill()
        child.wait()


def test_a_pynvml_that_warns_on_import_prints_nothing(tmp_path):
    """The deprecated ``pynvml`` package warns (FutureWarning) when imported; a snapshot stays silent."""
    import signal
    import subprocess
    import sys

    # a stand-in for the deprecated shim: it warns, then forwards to the simulated driver
    (tmp_path / "pynvml.py").write_text(
        "import warnings\n"
        "warnings.warn('The pynvml package is deprecated.', FutureWarning)\n"
        "import importlib.util, sys\n"
        f"spec = importlib.util.spec_from_file_location('_sim_pynvml', {str(sc.SIM_DIR / 'pynvml.py')!r})\n"
        "mod = importlib.util.module_from_spec(spec); spec.loader.exec_module(mod)\n"
        "globals().update({k: v for k, v in vars(mod).items() if not k.startswith('__')})\n")
    env = {k: v for k, v in os.environ.items() if k not in ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER")}
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), str(sc.ROOT)])
    env["VRAMLAB_NVML_SIM"] = __import__("json").dumps(sc.two_gpus())
    env["PYTHONWARNINGS"] = "default"  # shown unless vramlab silences it
    r = subprocess.run([sys.executable, "-c", "import vramlab; print(len(vramlab.snapshot().devices))"],
                       capture_output=True, text=True, timeout=60, env=env,
                       preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    assert r.returncode == 0 and r.stderr == "", r.stderr
    assert r.stdout.strip() == "2"  # the driver behind the shim was read


class _Once:
    """A stand-in that raises KeyboardInterrupt on its first call and forwards the later ones."""

    def __init__(self, real):
        self.real, self.calls = real, 0

    def __call__(self, *args, **kw):
        self.calls += 1
        if self.calls == 1:
            raise KeyboardInterrupt
        return self.real(*args, **kw)


def _counted(sim, name, calls):
    real = getattr(sim, name)

    def call(*args, **kw):
        out = real(*args, **kw)
        calls.append(name)  # counted once it succeeded
        return out

    setattr(sim, name, call)


def test_an_interrupt_in_nvml_init_propagates_and_the_next_reading_tries_again(nvml_sim):
    sim = nvml_sim(sc.two_gpus())
    sim.nvmlInit = _Once(sim.nvmlInit)
    with pytest.raises(KeyboardInterrupt):
        read_nvml()
    r = read_nvml()
    assert r.reason is None and [d.index for d in r.devices] == [0, 1]
    assert r.devices[0].process_used == 3 * GiB and sim.nvmlInit.calls == 2


def test_an_interrupt_in_the_import_of_pynvml_propagates_and_the_next_reading_tries_again(nvml_sim, monkeypatch):
    import importlib.abc
    import importlib.util
    import sys

    sim = nvml_sim(sc.two_gpus())
    monkeypatch.delitem(sys.modules, "pynvml")
    finds = []

    class Loader(importlib.abc.Loader):
        def create_module(self, spec):
            return sim

        def exec_module(self, module):
            pass

    class Finder(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name != "pynvml":
                return None
            finds.append(name)
            if len(finds) == 1:
                raise KeyboardInterrupt
            return importlib.util.spec_from_loader(name, Loader())

    monkeypatch.setattr(sys, "meta_path", [Finder()] + sys.meta_path)
    with pytest.raises(KeyboardInterrupt):
        read_nvml()
    r = read_nvml()
    assert len(finds) == 2 and r.reason is None and [d.index for d in r.devices] == [0, 1]


def test_an_interrupt_after_nvml_init_shuts_it_down_and_the_retry_initialises_it_once(nvml_sim):
    sim = nvml_sim(sc.mig())
    calls = []
    _counted(sim, "nvmlInit", calls)
    _counted(sim, "nvmlShutdown", calls)
    sim.nvmlDeviceGetMigDeviceHandleByIndex = _Once(sim.nvmlDeviceGetMigDeviceHandleByIndex)
    with pytest.raises(KeyboardInterrupt):
        read_nvml()
    assert calls == ["nvmlInit", "nvmlShutdown"]  # nothing left initialised by the interrupted try
    r = read_nvml()
    assert calls == ["nvmlInit", "nvmlShutdown", "nvmlInit"]
    assert r.reason is None
    # the retry found every device once: nothing kept from the interrupted try
    assert [(d.index, d.mig_index, d.gpu_instance_id) for d in r.devices] == [(0, None, None), (0, 0, 7), (0, 1, 13),
                                                                             (1, None, None)]
    read_nvml()
    assert calls.count("nvmlInit") == 2


def test_a_device_count_failure_is_a_reason_and_nvml_is_shut_down_again(nvml_sim):
    sim = nvml_sim(sc.two_gpus())
    calls = []
    _counted(sim, "nvmlInit", calls)
    _counted(sim, "nvmlShutdown", calls)

    def fail():
        raise sim.NVMLError(sim.NVML_ERROR_UNKNOWN)

    sim.nvmlDeviceGetCount = fail
    r = read_nvml()
    assert r.reason is not None and r.reason.code is NoteCode.NVML_UNAVAILABLE and not r.devices and r.driver_version == "575.57.08"
    read_nvml()
    assert calls == ["nvmlInit", "nvmlShutdown"]  # failed once: not tried again, nothing left initialised


def test_cached_devices_are_read_by_name(nvml_sim):
    """The per-device cache is a named record, not a bare tuple (the readers use its fields' names)."""
    from vramlab.probes import nvml as nvml_mod

    nvml_sim(sc.mig())
    read_nvml()
    handles = nvml_mod._NVML._handles
    assert handles and not any(isinstance(h, tuple) for h in handles)
    mig = [h for h in handles if h.mig_index is not None]
    assert [(h.index, h.mig_index, h.gpu_instance_id, h.unreadable) for h in mig] == [(0, 0, 7, None), (0, 1, 13, None)]
    assert mig[0].parent_uuid == sc.mig()["gpus"][0]["uuid"] and handles[0].mig_enabled
