"""Machines for the simulated driver (``tests/nvml_sim/pynvml.py``), as JSON-able dicts.

Sizes in bytes. ``run_snapshot(scenario, env)`` reads ``vramlab.snapshot()`` in a fresh
process whose ``pynvml`` is the simulated driver, as a user's kernel would.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any, Optional

GiB = 1 << 30
MiB = 1 << 20
SIM_DIR = Path(__file__).resolve().parent / "nvml_sim"
ROOT = Path(__file__).resolve().parent.parent


def gpu(n: int, name: str = "NVIDIA H100 80GB HBM3", total: int = 80 * GiB, used: int = 10 * GiB,
        reserved: int = 512 * MiB, procs: Optional[list[dict[str, Any]]] = None, **kw: Any) -> dict[str, Any]:
    """A whole GPU with UUID ``GPU-<n repeated>...``."""
    d = {"name": name, "uuid": f"GPU-{str(n) * 8}-0000-0000-0000-00000000000{n}", "total": total, "used": used,
         "reserved": reserved, "util": 40 + n, "procs": procs if procs is not None else []}
    d.update(kw)
    return d


def machine(*gpus: dict[str, Any], **kw: Any) -> dict[str, Any]:
    d: dict[str, Any] = {"driver": "575.57.08", "memory_v2": True, "process_lists": ["v3", "v2", "v1"],
                         "gpus": list(gpus)}
    d.update(kw)
    return d


def two_gpus() -> dict[str, Any]:
    """GPU 0: this process 3 GiB and another process (the parent, visible here) 5 GiB; GPU 1 idle."""
    return machine(gpu(0, procs=[{"pid": "self", "mem": 3 * GiB}, {"pid": "parent", "mem": 5 * GiB}],
                       graphics=[{"pid": "self", "mem": 3 * GiB}], used=8 * GiB),
                   gpu(1, used=0, reserved=512 * MiB))


def old_driver() -> dict[str, Any]:
    """A driver with only the v1 process list and v1 memory info."""
    sc = two_gpus()
    sc.update(memory_v2=False, process_lists=["v1"])
    return sc


def container() -> dict[str, Any]:
    """NVML lists host PIDs: this process is PID 'hidden' to itself, and so is another job."""
    return machine(gpu(0, procs=[{"pid": "hidden", "mem": 3 * GiB}, {"pid": "hidden+1", "mem": 5 * GiB}],
                       used=8 * GiB))


def no_figure() -> dict[str, Any]:
    """This process is listed, with usedGpuMemory not available (NVML_VALUE_NOT_AVAILABLE)."""
    return machine(gpu(0, procs=[{"pid": "self", "mem": None}], used=2 * GiB))


def mig() -> dict[str, Any]:
    """An A100 in MIG mode: device slots 0 and 1 hold GPU instances 7 and 13, then a whole GPU."""
    a100 = gpu(0, name="NVIDIA A100-SXM4-40GB", total=40 * GiB, used=0,
               mig=[{"uuid": "MIG-aaaaaaaa-1111-0000-0000-000000000000", "slot": 0, "gi": 7, "ci": 0,
                     "total": 20 * GiB, "used": 1 * GiB, "procs": []},
                    {"uuid": "MIG-bbbbbbbb-2222-0000-0000-000000000000", "slot": 1, "gi": 13, "ci": 0,
                     "total": 10 * GiB, "used": 2 * GiB, "procs": [{"pid": "self", "mem": 2 * GiB}]}])
    return machine(a100, gpu(1, name="NVIDIA A100-SXM4-40GB", total=40 * GiB))


def lost_among_three(how: str = "lost") -> dict[str, Any]:
    """Three GPUs; GPU 1 is lost (every read fails) or cannot be opened (``how="handle"``)."""
    bad = gpu(1, lost=True) if how == "lost" else gpu(1, handle_error="GPU_IS_LOST")
    return machine(gpu(0), bad, gpu(2, used=4 * GiB))


def no_library() -> dict[str, Any]:
    return machine(init_error="LIBRARY_NOT_FOUND")


def unified() -> dict[str, Any]:
    """A device with no separate memory (memory info NOT_SUPPORTED), as on a Grace-Hopper or Jetson."""
    return machine(gpu(0, name="NVIDIA GH200 480GB", unified=True))


def mixed() -> dict[str, Any]:
    """Two different GPUs: CUDA's default order need not be PCI order."""
    return machine(gpu(0, name="NVIDIA T4", total=15 * GiB, used=0), gpu(1))


def with_child() -> dict[str, Any]:
    """GPU 0: this process 3 GiB, a process it started 2 GiB (a ``torch.multiprocessing`` or
    ``notebook_launcher`` worker), its parent 5 GiB. Read it with :data:`CHILD_CODE`."""
    return machine(gpu(0, procs=[{"pid": "self", "mem": 3 * GiB}, {"pid": "child", "mem": 2 * GiB},
                                 {"pid": "parent", "mem": 5 * GiB}], used=10 * GiB))


def container_with_child() -> dict[str, Any]:
    """NVML does not list this PID (a container) but lists a child it started, 2 GiB, by a PID seen here."""
    return machine(gpu(0, procs=[{"pid": "hidden", "mem": 3 * GiB}, {"pid": "child", "mem": 2 * GiB}],
                       used=5 * GiB))


#: The snapshot of a process that has started one child (sleeping, killed after the reading);
#: ``child_pid`` is added to the snapshot's dict.
CHILD_CODE = """
import json, os, signal, subprocess, sys, vramlab
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"],
                         env={"PATH": os.environ.get("PATH", "")}, stdin=subprocess.DEVNULL,
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
try:
    d = vramlab.snapshot().to_dict()
    d["child_pid"] = child.pid
    print(json.dumps(d))
finally:
    child.kill()
    child.wait()
"""


def run_snapshot(scenario: dict[str, Any], env: Optional[dict[str, str]] = None,
                 code: str = "import json, vramlab; print(json.dumps(vramlab.snapshot().to_dict()))") -> dict[str, Any]:
    """``vramlab.snapshot().to_dict()`` in a fresh process whose pynvml is the simulated driver."""
    e = {k: v for k, v in os.environ.items() if k not in ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER")}
    e["PYTHONPATH"] = os.pathsep.join([str(SIM_DIR), str(ROOT)])
    e["VRAMLAB_NVML_SIM"] = json.dumps(scenario)
    e.update(env or {})
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=e,
                       preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    assert r.returncode == 0, r.stderr
    assert "Traceback" not in r.stderr, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])
