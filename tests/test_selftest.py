"""python -m vramlab.selftest: every check can FAIL. Each is fed readings from the simulated
driver (tests/nvml_sim) or made-up torch figures that must fail it, and ones that must pass."""

import dataclasses
import os
import stat
import subprocess
import sys

import driver_scenarios as sc
import pytest

from vramlab.selftest import (CHECKS, check_allocation, check_estimates, check_free_memory, check_mapping,
                              check_no_context, check_nvidia_smi, check_readings, run_checks)

GiB, MiB = sc.GiB, sc.MiB


@pytest.mark.slow
def test_selftest_without_gpu_skips_everything_and_exits_zero():
    checks = run_checks()
    assert [c.name for c in checks] == list(CHECKS)
    r = subprocess.run([sys.executable, "-m", "vramlab.selftest"], capture_output=True, text=True, timeout=300)
    if all(c.status == "SKIP" for c in checks):
        assert r.returncode == 0
        assert "0 failed" in r.stdout and r.stdout.count("SKIP") == len(checks)
    else:  # a GPU machine: the table is the report
        assert "PASS" in r.stdout or "FAIL" in r.stdout


def _snap(nvml_sim, scenario):
    from vramlab.reconcile import snapshot

    nvml_sim(scenario)
    return snapshot()


def _as_torch(d, allocated, reserved, uuid=None):
    """A device as the reconciled snapshot shows it once torch holds memory on it."""
    return dataclasses.replace(d, source="nvml+torch", torch_allocated=allocated, torch_reserved=reserved,
                               uuid=uuid or d.uuid)


def test_no_context():
    assert check_no_context(False, False, [0, 0])[0] is True
    assert check_no_context(False, True, [0])[0] is False          # the reading initialised CUDA
    assert check_no_context(False, False, [300 * MiB])[0] is False  # NVML sees this process on a GPU
    assert check_no_context(True, True, [])[0] is None


def _smi_rows(devices):
    return [{"index": str(d.index), "uuid": d.uuid, "name": d.name, "memory.total": str(d.total // MiB),
             "memory.used": str((d.used + (d.reserved or 0)) // MiB), "memory.free": str(d.free // MiB)}
            for d in devices if d.mig_index is None]


def test_nvidia_smi(nvml_sim):
    from vramlab.probes.nvml import read_nvml

    nvml_sim(sc.two_gpus())
    devs = read_nvml().devices
    rows = _smi_rows(devs)
    assert check_nvidia_smi(devs, rows)[0] is True
    assert check_nvidia_smi(devs, [dict(rows[0], **{"memory.total": str(79 * 1024)})])[0] is False
    assert check_nvidia_smi(devs, [dict(rows[0], name="NVIDIA A100")])[0] is False
    assert check_nvidia_smi(devs, [dict(rows[0], uuid="GPU-elsewhere")])[0] is False
    assert check_nvidia_smi(devs, [])[0] is False


def test_mapping(nvml_sim):
    s = _snap(nvml_sim, sc.two_gpus())
    uuids = [d.uuid[4:] for d in s.devices]  # torch reports them bare
    # before torch holds the devices, NVML's cuda:i are not matched by torch's UUIDs: FAIL
    assert check_mapping(s, uuids)[0] is False
    matched = dataclasses.replace(s, devices=tuple(_as_torch(d, 0, 0) for d in s.devices))
    ok, detail = check_mapping(matched, uuids)
    assert ok is True, detail
    assert check_mapping(matched, list(reversed(uuids)))[0] is False
    assert check_mapping(matched, uuids + ["ffff"])[0] is False  # a CUDA device vramlab does not show
    assert check_mapping(matched, [])[0] is False


def test_allocation(nvml_sim):
    d = _snap(nvml_sim, sc.two_gpus()).device("cuda:0")
    before = dataclasses.replace(_as_torch(d, 0, 2 * MiB), process_used=500 * MiB)
    good = dataclasses.replace(_as_torch(d, GiB, GiB + 2 * MiB), process_used=500 * MiB + GiB)
    assert check_allocation(before, good)[0] is True
    assert check_allocation(before, dataclasses.replace(good, torch_allocated=GiB - 512))[0] is False
    assert check_allocation(before, dataclasses.replace(good, torch_reserved=2 * MiB + GiB + 64 * MiB))[0] is False
    assert check_allocation(before, dataclasses.replace(good, process_used=500 * MiB))[0] is False  # NVML did not move


def test_readings(nvml_sim):
    for scenario in (sc.two_gpus(), sc.old_driver(), sc.lost_among_three()):
        ok, detail = check_readings(_snap(nvml_sim, scenario))
        assert ok is True, detail
    s = _snap(nvml_sim, sc.two_gpus())
    d0 = s.device("cuda:0")
    off = dataclasses.replace(s, devices=(dataclasses.replace(d0, free=d0.free - 10 * MiB),))
    assert check_readings(off)[0] is False
    short = dataclasses.replace(s, devices=(_as_torch(d0, GiB, 4 * GiB),))  # NVML says 3 GiB for this process
    assert check_readings(short)[0] is False
    assert check_readings(dataclasses.replace(s, devices=()))[0] is False


def test_free_memory(nvml_sim):
    d0 = _snap(nvml_sim, sc.two_gpus()).device("cuda:0")
    assert check_free_memory(d0, (d0.free, d0.total - d0.driver_reserved))[0] is True
    assert check_free_memory(d0, (d0.free - 100 * MiB, d0.total - d0.driver_reserved))[0] is False
    assert check_free_memory(d0, (d0.free, d0.total - 2 * GiB))[0] is False
    assert check_free_memory(dataclasses.replace(d0, free=None), (1, 1))[0] is False


def test_estimates():
    assert check_estimates([("MLP b=64", 100, 100), ("MLP b=256", 104, 100)])[0] is True
    assert check_estimates([("MLP b=64", 100, 100), ("CNN b=16", 94, 100)])[0] is False
    assert check_estimates([])[0] is False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="a shell script stands in for nvidia-smi")
@pytest.mark.parametrize("procs,smi_total_mib,expect", [([], None, ("PASS", "PASS")),
                                                        ([{"pid": "self", "mem": GiB}], 1, ("FAIL", "FAIL"))])
@pytest.mark.slow
def test_run_checks_end_to_end_on_the_simulated_driver(tmp_path, procs, smi_total_mib, expect):
    """The whole self-check in a fresh process: simulated NVML, a stand-in nvidia-smi, the
    CPU build of torch (so the CUDA checks skip). NVML listing this process without a CUDA
    context fails check 1; an nvidia-smi that disagrees with NVML fails check 2."""
    scenario = sc.machine(sc.gpu(0, procs=procs, used=GiB))
    g = scenario["gpus"][0]
    total_mib = smi_total_mib or g["total"] // MiB
    smi = tmp_path / "nvidia-smi"
    smi.write_text(f"#!/bin/sh\necho '0, {g['uuid']}, {g['name']}, {total_mib}, "
                   f"{(g['used'] + g['reserved']) // MiB}, 0'\n")
    smi.chmod(smi.stat().st_mode | stat.S_IEXEC)
    code = ("import json, sys, torch\nfrom vramlab.selftest import run_checks\n"
            "print(json.dumps([[c.status, c.detail] for c in run_checks()]))")
    env = {"PATH": f"{tmp_path}{os.pathsep}{os.environ.get('PATH', '')}"}
    out = sc.run_snapshot(scenario, env=env, code=code)
    assert (out[0][0], out[1][0]) == expect, out
    assert all(status == "SKIP" for status, _ in out[2:])  # torch.cuda is not available here


def test_without_nvml_the_torch_only_checks_still_run(monkeypatch):
    """NVML refused (a sandbox): the checks that need it say so instead of stopping the rest;
    here torch has no CUDA either, so the CUDA checks say that (on a GPU they run)."""
    import types

    import vramlab.selftest as st
    from vramlab.facts import Note, NoteCode, Problem, Reason
    from vramlab.probes import nvml as nvml_mod

    monkeypatch.setattr(nvml_mod, "read_nvml", lambda children=(): nvml_mod.NvmlReading(
        reason=Note(NoteCode.NVML_UNAVAILABLE, problem=Problem(Reason.ERROR, "NVML refused: sandbox"))))
    fake_torch = types.SimpleNamespace(cuda=types.SimpleNamespace(is_available=lambda: False,
                                                                  is_initialized=lambda: False))
    monkeypatch.setitem(sys.modules, "torch", fake_torch)
    checks = {c.name: c for c in st.run_checks()}
    assert checks[st.CHECKS[1]].status == "SKIP" and "NVML refused: sandbox" in checks[st.CHECKS[1]].detail
    for name in st.CHECKS[2:]:
        assert checks[name].status == "SKIP" and "torch.cuda is not available" in checks[name].detail, checks[name]
    assert "NVML refused" in checks[st.CHECKS[0]].detail


def test_selftest_help_is_help_and_a_bad_argument_is_one_line():
    """python -m vramlab.selftest --help ran the checks (hardening, small lies)."""
    import subprocess

    r = subprocess.run([sys.executable, "-m", "vramlab.selftest", "--help"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "PASS/FAIL" in r.stdout and "self-check ·" not in r.stdout
    r = subprocess.run([sys.executable, "-m", "vramlab.selftest", "--bogus"], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 2 and "unrecognized arguments: --bogus" in r.stderr and "Traceback" not in r.stderr
