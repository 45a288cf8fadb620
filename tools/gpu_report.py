"""``python3 tools/gpu_report.py OUTDIR``: the whole GPU check in one command, as one report.

A tool of the checkout, not of the package: it reads the checkout's ``notebooks/`` and
``benchmarks/``, which a wheel does not carry. Users have :mod:`vramlab.selftest`.

It runs, in one go, and writes ``OUTDIR/report.md`` (a PASS/FAIL table with the figures)
and the executed notebooks under ``OUTDIR/notebooks/``:

1. the self-check (:mod:`vramlab.selftest`), the estimator's steps included;
2. every notebook of ``notebooks/`` executed on CUDA at its large sizes (``VRAMLAB_SIZE=large``),
   each within its own time limit and all within the report's budget;
3. the GPU part of ``benchmarks/bench_snapshot.py`` (what vramlab's NVML and torch reads
   cost beside the raw calls), when the script is there;
4. the sampler while CUDA is busy: matrix products per second with and without the
   sampler at 0.1 s, its CPU time, and CUDA graphs captured while it samples every 10 ms
   (a runtime call from its thread would invalidate the capture);
5. what kind of sandbox the machine is (gVisor, a Firecracker microVM), with the evidence;
   NVML's process list against this PID around a 1 GiB tensor (attributed, or unattributed
   with the note);
6. three workloads' real allocator traces (``_record_memory_history``), written to
   ``allocator-traces.json.gz`` and replayed through :mod:`vramlab.sim.replay`;
7. in a real kernel: a ``%%vram`` cell's peak against ``torch.cuda.max_memory_allocated`` to the
   byte, a real CUDA out-of-memory error and vramlab's explanation, ``%vram free`` back to the
   baseline (the executed notebook is kept with the others, ``_in_kernel_checks.ipynb``);
8. the live monitor under load: the sampler at 0.5 s during a 20 s training loop against
   ``nvidia-smi --query-gpu=memory.used`` polled alongside (the largest gap, and whether timing
   explains it), and the sampler's CPU cost.

On a machine without CUDA every GPU row is SKIP, the exit status is 0, and it takes
seconds: CI runs it so. The exit status is 1 when a row FAILs. The whole run is sized to
finish in under 8 minutes on one GPU (``--budget`` seconds, 420 by default): a notebook
that would start past the budget is SKIP, with the reason.

Usage on a GPU machine, from a checkout (the notebooks and benchmarks are the checkout's)::

    python3 tools/gpu_report.py gpu-report/
"""

from __future__ import annotations

import argparse
import datetime as _dt
import os
import platform
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

from vramlab import selftest
from vramlab.selftest import Check
from vramlab._version import __version__
from vramlab.display.words import note_text
from vramlab.facts import NoteCode

#: the checkout this tool belongs to, and its tools folder (the children import this module from it)
ROOT = Path(__file__).resolve().parent.parent
TOOLS = ROOT / "tools"

__all__ = ["Row", "run_report", "main", "sandbox", "monitor_gaps", "TRACE_WORKLOADS"]

GiB = 1 << 30

#: the notes that say why this process's GPU memory is not attributed to it
_ATTRIBUTION_NOTES = (NoteCode.PIDS_HIDDEN, NoteCode.PIDS_HIDDEN_SELF_UNLISTED, NoteCode.SELF_UNLISTED,
                      NoteCode.NO_PROCESS_MEMORY)


def Row(section: str, name: str, status: str, detail: str) -> Check:
    """One line of the report (:class:`vramlab.selftest.Check`, in ``section``): ``status`` is
    PASS, FAIL, SKIP or INFO."""
    return Check(name, status, detail, section)


def _cuda() -> tuple[Any, Optional[str]]:
    """torch when CUDA is available, else (None, why)."""
    try:
        import torch
    except Exception as e:
        return None, f"torch cannot be imported: {type(e).__name__}: {e}"
    try:
        if not torch.cuda.is_available():
            return None, "no CUDA device (torch.cuda.is_available() is False)"
    except Exception as e:
        return None, f"torch.cuda fails: {type(e).__name__}: {e}"
    return torch, None


# --------------------------------------------------------------------------- sections


def _environment() -> list[Check]:
    from vramlab.probes.nvml import read_nvml

    rows = [Row("machine", "python", "INFO", f"{platform.python_version()} on {platform.machine()}"),
            Row("machine", "vramlab", "INFO", __version__)]
    try:
        import torch

        cuda = getattr(torch.version, "cuda", None)
        rows.append(Row("machine", "torch", "INFO", f"{torch.__version__} (CUDA {cuda})"))
    except Exception as e:
        rows.append(Row("machine", "torch", "INFO", f"not importable: {type(e).__name__}"))
    rows.append(Row("machine", "sandbox", "INFO", sandbox()))
    nv = read_nvml()
    if nv.reason is not None:
        rows.append(Row("machine", "NVML", "INFO", note_text(nv.reason, english=True)))
    else:
        names = ", ".join(f"{d.index}: {d.name}" for d in nv.devices if d.mig_index is None)
        rows.append(Row("machine", "NVML", "INFO", f"driver {nv.driver_version}; {names}"))
    return rows


def _read(path: str, size: int = 4096) -> str:
    try:
        with open(path, "rb") as f:
            return f.read(size).decode(errors="replace")
    except OSError:
        return ""


def sandbox() -> str:
    """What kind of machine this is (gVisor, a Firecracker microVM, or neither that it can
    tell), with the evidence: the kernel's release, its command line, the DMI vendor, and
    whether the files vramlab's exact peaks and child listing need exist."""
    release = platform.release()
    version = _read("/proc/version")
    cmdline = _read("/proc/cmdline")
    vendor = (_read("/sys/class/dmi/id/sys_vendor") + " " + _read("/sys/class/dmi/id/product_name")).strip()
    dmesg = ""
    try:
        dmesg = subprocess.run(["dmesg"], capture_output=True, text=True, timeout=5).stdout[:20000]
    except Exception:
        pass
    status = _read("/proc/self/status", 65536)
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        clear_refs = True
    except OSError:
        clear_refs = False
    children = os.path.exists(f"/proc/{os.getpid()}/task/{os.getpid()}/children")
    if "gvisor" in (version + dmesg).lower():
        kind = "gVisor"
    elif "firecracker" in (vendor + dmesg + cmdline).lower() or "virtio_mmio.device=" in cmdline:
        kind = "a Firecracker-style microVM (virtio-mmio devices)"
    else:
        kind = "neither gVisor nor Firecracker, as far as these signs tell"
    return (f"{kind}: kernel {release}; DMI {vendor or 'none'}; VmHWM {'yes' if 'VmHWM' in status else 'no'}, "
            f"clear_refs {'writable' if clear_refs else 'not writable'}, task children files {'yes' if children else 'no'}")


def _attribution(torch: Any, why: Optional[str]) -> list[Check]:
    """NVML's process list against this process's PID, before and after a 1 GiB tensor: is the
    memory attributed to this process, or shown as unattributed with the note that says why?"""
    name = "NVML process list vs this PID, 1 GiB"
    if torch is None:
        return [Row("attribution", name, "SKIP", why or "no CUDA")]
    from vramlab.probes.nvml import read_nvml
    from vramlab.reconcile import snapshot
    from vramlab.units import format_bytes

    nv0 = read_nvml()
    if nv0.reason is not None or not nv0.devices:
        why = note_text(nv0.reason, english=True) if nv0.reason is not None else "no device"
        return [Row("attribution", name, "SKIP", f"NVML: {why}")]
    x = torch.empty(GiB, dtype=torch.uint8, device="cuda:0")
    torch.cuda.synchronize()
    time.sleep(0.5)
    snap = snapshot()
    d = snap.device("cuda:0")
    nv = read_nvml()
    dev = next((v for v in nv.devices if v.uuid == d.uuid), nv.devices[0])
    del x
    torch.cuda.empty_cache()
    listed = f"PID {os.getpid()} listed: {dev.pid_listed}; NVML lists {len(dev.processes)} PIDs, {dev.hidden_pids} of them not in this namespace"
    unattributed = d.layer("unattributed")
    notes = [note_text(n, english=True) for n in snap.notes if n.code in _ATTRIBUTION_NOTES]
    if (d.process_used or 0) >= GiB:
        return [Row("attribution", name, "PASS", f"attributed to this process: {format_bytes(d.process_used)}; {listed}")]
    if unattributed >= GiB and notes:
        return [Row("attribution", name, "PASS", f"unattributed {format_bytes(unattributed)}, with the note "
                                                 f"'{notes[0][:160]}'; {listed}")]
    return [Row("attribution", name, "FAIL", f"the 1 GiB is neither this process's ({format_bytes(d.process_used)}) "
                                             f"nor unattributed with a note ({format_bytes(unattributed)}); {listed}")]


#: The allocator traces: (name, model factory, its kwargs, batch size, precision).
TRACE_WORKLOADS: tuple[tuple[str, str, dict[str, Any], int, Optional[str]], ...] = (
    ("MLP Adam fp32", "make_mlp", {}, 256, None),
    ("CNN Adam fp32 (cuDNN)", "make_cnn", {}, 64, None),
    ("GPT small Adam bf16-mixed", "make_gpt", {"size": "small", "seq": 256}, 4, "bf16-mixed"),
)


def _trace_child(index: int, out: str) -> None:
    """Record one workload's allocator trace from this process's first CUDA allocation (for
    :mod:`vramlab.sim.replay`) and write it to ``out`` as JSON."""
    import json

    import torch

    from vramlab.lessons import models
    from vramlab.sim.measure import measure_cuda

    name, factory, kw, batch_size, precision = TRACE_WORKLOADS[index]
    torch.cuda.memory._record_memory_history(enabled="all", context=None, stacks="python", max_entries=2_000_000)
    free, total = (int(v) for v in torch.cuda.mem_get_info(0))
    build, batch, loss_fn = getattr(models, factory)(**kw)
    peak = measure_cuda(build, batch, batch_size=batch_size, optimizer="adam", loss_fn=loss_fn, precision=precision)
    snap = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    events = [{k: e.get(k) for k in ("action", "addr", "size", "stream")} for e in snap["device_traces"][0]]
    with open(out, "w") as f:
        json.dump({"workload": name, "batch_size": batch_size, "capacity": free, "total": total, "peak_allocated": peak,
                   "torch": torch.__version__, "alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF"),
                   "events": events}, f)


def _traces(torch: Any, why: Optional[str], outdir: Path) -> list[Check]:
    """Three workloads' real allocator traces, each recorded in a fresh process, written to
    ``outdir/allocator-traces.json.gz`` and replayed through vramlab's allocator model: reserved
    bytes must agree after every alloc and free."""
    if torch is None:
        return [Row("allocator", f"trace: {w[0]}", "SKIP", why or "no CUDA") for w in TRACE_WORKLOADS]
    import gzip
    import json
    import tempfile

    from vramlab.sim.replay import replay

    rows, kept = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for i, (name, *_rest) in enumerate(TRACE_WORKLOADS):
            out = os.path.join(tmp, f"{i}.json")
            code = f"import sys\nsys.path.insert(0, {str(TOOLS)!r})\nfrom gpu_report import _trace_child\n" \
                "_trace_child(int(sys.argv[1]), sys.argv[2])"
            try:
                r = subprocess.run([sys.executable, "-c", code, str(i), out], capture_output=True, text=True, timeout=150,
                                   stdin=subprocess.DEVNULL, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
            except subprocess.TimeoutExpired:
                rows.append(Row("allocator", f"trace: {name}", "FAIL", "recording took over 150 s"))
                continue
            if r.returncode != 0 or not os.path.exists(out):
                tail = _clean(r.stderr).strip().splitlines()[-1:] or [f"exit {r.returncode}"]
                rows.append(Row("allocator", f"trace: {name}", "FAIL", f"recording failed: {tail[0][:300]}"))
                continue
            with open(out) as f:
                trace = json.load(f)
            kept.append(trace)
            result = replay(trace["events"], trace["capacity"], trace["alloc_conf"])
            rows.append(Row("allocator", f"trace: {name}", "PASS" if result.exact else "FAIL", result.text()))
    if kept:
        with gzip.open(outdir / "allocator-traces.json.gz", "wt") as f:
            json.dump(kept, f)
    return rows


#: The cells of the in-kernel checks: a %%vram cell's peak, a real CUDA OOM, and %vram free.
IN_KERNEL_CELLS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("%load_ext vramlab\nimport json, torch, vramlab\ntorch.empty(1, device='cuda')\ntorch.cuda.synchronize()\n"
     "base = [torch.cuda.memory_allocated(), torch.cuda.memory_reserved()]", ()),
    ("%%vram\nx = torch.empty(512 << 20, dtype=torch.uint8, device='cuda')\ny = x + 1\ndel x, y", ()),
    ("(d,) = [d for d in vramlab.last().devices if d.id == 'cuda:0']\n"
     "print('VRAMLAB_JSON', json.dumps({'vram_peak': d.peak_allocated, 'torch_peak': torch.cuda.max_memory_allocated()}))",
     ()),
    ("z = torch.empty(1 << 50, dtype=torch.uint8, device='cuda')  # a real CUDA OOM", ("raises-exception",)),
    ("%vram free", ()),
    ("torch.cuda.synchronize()\n"
     "print('VRAMLAB_JSON', json.dumps({'after_free': [torch.cuda.memory_allocated(), torch.cuda.memory_reserved()], "
     "'base': base}))", ()),
)


def _outputs_text(cell: Any) -> str:
    out = []
    for o in cell.get("outputs", []):
        if o.get("output_type") == "stream":
            out.append(o.get("text", ""))
        for key in ("text/plain", "text/html"):
            v = o.get("data", {}).get(key)
            if v:
                out.append(v if isinstance(v, str) else "".join(v))
        if o.get("output_type") == "error":
            out.append(_clean("\n".join(o.get("traceback", []))))
    return "\n".join(out)


def _in_kernel(torch: Any, why: Optional[str], notebooks_out: Path) -> list[Check]:
    """In a real kernel on CUDA: a ``%%vram`` cell's peak against ``torch.cuda.max_memory_allocated``
    to the byte; a real CUDA out-of-memory error and vramlab's explanation of it; ``%vram free``
    bringing allocated and reserved memory back to what they were before."""
    names = ("%%vram peak vs max_memory_allocated", "CUDA OOM explained", "%vram free back to the baseline")
    if torch is None:
        return [Row("in a kernel", n, "SKIP", why or "no CUDA") for n in names]
    import json
    import tempfile

    import nbformat

    notebooks_out.mkdir(parents=True, exist_ok=True)
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    for source, tags in IN_KERNEL_CELLS:
        cell = nbformat.v4.new_code_cell(source)
        if tags:
            cell.metadata["tags"] = list(tags)
        nb.cells.append(cell)
    out = notebooks_out / "_in_kernel_checks.ipynb"
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "in_kernel.ipynb"
        nbformat.write(nb, src)
        env = {k: v for k, v in os.environ.items() if k != "MPLBACKEND"}
        _, detail = _run_notebook(src, out, 105, env)
    if not out.exists():
        return [Row("in a kernel", n, "FAIL", f"the kernel did not run: {detail}") for n in names]
    done = nbformat.read(out, as_version=4)
    found: dict[str, Any] = {}
    for cell in done.cells:
        for line in _outputs_text(cell).splitlines():
            if line.startswith("VRAMLAB_JSON "):
                found.update(json.loads(line[len("VRAMLAB_JSON "):]))
    def compare(name: str, a: str, b: str, cell: int, detail: str) -> Check:
        """PASS when the kernel printed ``a`` and ``b`` and they are equal."""
        if a not in found or b not in found:
            return Row("in a kernel", name, "FAIL", "the cell printed no figures: " + _outputs_text(done.cells[cell])[-300:])
        return Row("in a kernel", name, "PASS" if found[a] == found[b] else "FAIL", detail.format(**found))

    rows = [compare(names[0], "vram_peak", "torch_peak", 2,
                    "%%vram peak {vram_peak} B, torch.cuda.max_memory_allocated {torch_peak} B")]
    oom = _outputs_text(done.cells[3])
    explained = "[vramlab] out of memory" in oom
    first = next((ln for ln in oom.splitlines() if "[vramlab]" in ln), oom.strip().splitlines()[-1:] or [""])
    rows.append(Row("in a kernel", names[1], "PASS" if explained and "OutOfMemoryError" in oom else "FAIL",
                    " ".join(oom.split())[:400] if explained else f"no explanation; the cell showed: {str(first)[:300]}"))
    rows.append(compare(names[2], "after_free", "base", 5,
                        "allocated, reserved after %vram free {after_free} B; before the cells {base} B"))
    return rows


def _smi_used(exe: str) -> Optional[int]:
    """``nvidia-smi``'s memory.used of GPU 0, in bytes (it prints MiB), or ``None``."""
    r = subprocess.run([exe, "--query-gpu=memory.used", "--format=csv,noheader,nounits", "-i", "0"],
                       capture_output=True, text=True, timeout=10)
    try:
        return int(float(r.stdout.strip().splitlines()[0])) * (1 << 20)
    except (ValueError, IndexError):
        return None


def monitor_gaps(samples: Sequence[tuple[float, int]], smi: Sequence[tuple[float, int]]) -> tuple[int, int, float, int]:
    """Compare the sampler's readings ``(time s, used bytes)`` with nvidia-smi's, each sample with
    the nvidia-smi reading nearest in time. Returns ``(offset, largest gap, its time, how much
    nvidia-smi's figure moved within 1 s of it)``: ``offset`` is the median difference (nvidia-smi
    counts the driver's reserved memory, NVML's v2 ``used`` does not), the gap is the largest
    distance from it. A gap no larger than the movement around it is a matter of timing."""
    import bisect
    import statistics

    times = [t for t, _ in smi]
    diffs = []
    for t, used in samples:
        i = bisect.bisect_left(times, t)
        j = min((k for k in (i - 1, i) if 0 <= k < len(times)), key=lambda k: abs(times[k] - t))
        diffs.append((t, smi[j][1] - used))
    offset = int(statistics.median(d for _, d in diffs))
    t_gap, d_gap = max(diffs, key=lambda x: abs(x[1] - offset))
    near = [u for t, u in smi if abs(t - t_gap) <= 1.0]
    moved = (max(near) - min(near)) if near else 0
    return offset, abs(d_gap - offset), t_gap, moved


def _monitor(torch: Any, why: Optional[str], seconds: float = 20.0) -> list[Check]:
    """The live monitor under load: the sampler at 0.5 s during a training loop whose memory
    keeps changing, against ``nvidia-smi --query-gpu=memory.used`` polled at the same pace; and
    the sampler's CPU cost."""
    import shutil
    import threading

    names = ("sampler vs nvidia-smi under load", "sampler CPU at 0.5 s")
    exe = shutil.which("nvidia-smi")
    if torch is None or exe is None:
        return [Row("monitor", n, "SKIP", why or "nvidia-smi not found") for n in names]
    from vramlab.lessons import models
    from vramlab.runtime.sampler import Sampler
    from vramlab.units import format_bytes

    build, batch, loss_fn = models.make_mlp()
    model = build().to("cuda:0")
    opt = torch.optim.Adam(model.parameters())
    smi: list[tuple[float, int]] = []
    stop = threading.Event()

    def poll() -> None:
        while not stop.is_set():
            t0 = time.time()
            used = _smi_used(exe)
            if used is not None:
                smi.append(((t0 + time.time()) / 2, used))
            stop.wait(max(0.0, 0.5 - (time.time() - t0)))

    sampler = Sampler()
    sampler.start(0.5)
    poller = threading.Thread(target=poll, daemon=True)
    poller.start()
    t0 = time.perf_counter()
    steps = 0
    sizes = (256, 4096, 16384, 65536)
    while time.perf_counter() - t0 < seconds:  # batches that grow and shrink, and a cache let go now and then
        x, y = batch(sizes[steps % len(sizes)])
        loss = loss_fn(model(x.to("cuda:0")), y.to("cuda:0"))
        opt.zero_grad()
        loss.backward()
        opt.step()
        del x, y, loss
        steps += 1
        if steps % 7 == 0:
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
    torch.cuda.synchronize()
    elapsed = time.perf_counter() - t0
    stop.set()
    poller.join(15)
    sampler.stop()
    del model, opt
    torch.cuda.empty_cache()
    got = [(smp.time, d.used) for smp in sampler.samples for d in smp.devices if d.id == "cuda:0" and d.used is not None]
    cpu = Row("monitor", names[1], "INFO", f"{100 * sampler.cpu_seconds / elapsed:.2f}% of one core over {elapsed:.0f} s "
                                            f"({len(sampler.samples)} samples, {sampler.errors} errors)")
    if len(got) < 5 or len(smi) < 5:
        return [Row("monitor", names[0], "FAIL", f"too few readings: {len(got)} samples, {len(smi)} from nvidia-smi"), cpu]
    offset, gap, when, moved = monitor_gaps(got, smi)
    timing = gap <= moved
    ok = gap <= 64 * (1 << 20) or timing
    detail = (f"{len(got)} samples against {len(smi)} nvidia-smi readings over {steps} steps; nvidia-smi reads "
              f"{format_bytes(offset)} more throughout (the driver's reservation); the largest gap beyond that is "
              f"{format_bytes(gap)}, while nvidia-smi's own figure moved {format_bytes(moved)} within 1 s of it "
              + ("(timing: the two read a second apart while memory changed)" if timing else "(not explained by timing)"))
    return [Row("monitor", names[0], "PASS" if ok else "FAIL", detail), cpu]


def _selfcheck(log: list[str]) -> list[Check]:
    checks = selftest.run_checks(log=log.append)
    return [Row("self-check", c.name, c.status, c.detail) for c in checks]  # the same rows, in their section


_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
#: A notebook starts only when at least this many seconds of the budget are left.
MIN_START_S = 45


def _clean(text: str) -> str:
    """``text`` without terminal colour codes."""
    return _ANSI.sub("", text)


def _notebook_child(path: str, out: str, limit_s: float) -> None:
    """Run one notebook (in its own process): save it after every cell, stop at a real deadline,
    and print one JSON line: ``{"status", "detail", "cell"}``."""
    import json

    import nbformat
    from nbclient import NotebookClient

    deadline = time.monotonic() + limit_s
    nb = nbformat.read(path, as_version=4)
    current: dict[str, Any] = {"index": None}

    def started(cell: Any, cell_index: int, **kw: Any) -> None:
        current["index"] = cell_index

    def executed(cell: Any, cell_index: int, **kw: Any) -> None:
        nbformat.write(nb, out)  # what ran so far survives a kill

    client = NotebookClient(nb, timeout_func=lambda cell: max(1, int(deadline - time.monotonic())),
                            kernel_name="python3", resources={"metadata": {"path": str(Path(path).parent)}},
                            on_cell_start=started, on_cell_executed=executed)
    status, detail = "PASS", ""
    try:
        client.execute()
    except Exception as e:
        i = current["index"]
        where = "" if i is None else f"cell {i} (`{_first_line(nb.cells[i].source)}`): "
        lines = [ln for ln in _clean(str(e)).splitlines() if ln.strip() and not set(ln.strip()) <= set("-=^")]
        errors = [ln for ln in lines if "Error" in ln or "timed out" in ln or "Timeout" in ln]
        status, detail = "FAIL", where + f"{type(e).__name__}: " + ((errors or lines or [""])[-1].strip()[:300])
    nbformat.write(nb, out)
    print(json.dumps({"status": status, "detail": detail, "cell": current["index"]}), flush=True)


def _first_line(source: str) -> str:
    lines = [ln for ln in source.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
    return (lines[0] if lines else "").strip()[:60]


def _kill_tree(pid: int) -> None:
    import psutil

    try:
        procs = [psutil.Process(pid)] + psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return
    for p in procs:
        try:
            p.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(procs, timeout=10)


def _run_notebook(src: Path, out: Path, limit: float, env: dict[str, str]) -> tuple[str, str]:
    """Run notebook ``src`` in its own process (:func:`_notebook_child`), saving it to ``out``;
    ``(status, detail)``. Past ``limit`` seconds the process and its kernel are killed."""
    import json

    code = (f"import sys\nsys.path.insert(0, {str(TOOLS)!r})\nfrom gpu_report import _notebook_child\n"
            "_notebook_child(sys.argv[1], sys.argv[2], float(sys.argv[3]))")
    proc = subprocess.Popen([sys.executable, "-c", code, str(src), str(out), str(limit - 5)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            stdin=subprocess.DEVNULL, cwd=str(src.parent),
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        stdout, stderr = proc.communicate(timeout=limit + 10)
    except subprocess.TimeoutExpired:
        _kill_tree(proc.pid)
        proc.communicate()
        return "FAIL", f"killed at its deadline of {limit:.0f} s (cells before it are saved)"
    got = [ln for ln in stdout.splitlines() if ln.startswith("{")]
    if got:
        result = json.loads(got[-1])
        return result["status"], result["detail"]
    tail = _clean(stderr).strip().splitlines()[-1:] or [""]
    return "FAIL", f"the runner printed no result (exit {proc.returncode}) {tail[0][:300]}".rstrip()


def _notebooks(src: Path, out: Path, deadline: float, per_notebook_s: int, torch: Any,
               why: Optional[str], on_row: Callable[[Check], None] = lambda r: None) -> list[Check]:
    """Each notebook in its own process with a real deadline: ``min(per_notebook_s, what is
    left of the budget)``, after which it and its kernel are killed; none starts with less than
    :data:`MIN_START_S` left. Kernels draw inline (MPLBACKEND is not passed on)."""
    paths = sorted(src.glob("*.ipynb")) if src.is_dir() else []
    if not paths:
        return [Row("notebooks", str(src), "SKIP", "no notebooks found there")]
    if torch is None:
        return [Row("notebooks", p.stem, "SKIP", f"{why}: CI runs them on the virtual GPU") for p in paths]
    out.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if k != "MPLBACKEND"}  # the kernels' default: inline figures
    env.update(VRAMLAB_SIZE="large", PYTHONUNBUFFERED="1")
    rows = []
    for p in paths:
        left = deadline - time.monotonic()
        if left < MIN_START_S:
            row = Row("notebooks", p.stem, "SKIP", f"the report's time budget is spent ({max(left, 0):.0f} s left, "
                                                   f"a notebook starts with {MIN_START_S} s or more)")
            rows.append(row)
            on_row(row)
            continue
        limit = min(per_notebook_s, left)
        t0 = time.perf_counter()
        status, detail = _run_notebook(p, out / p.name, limit, env)
        dt = time.perf_counter() - t0
        row = Row("notebooks", p.stem, status, f"{dt:.1f} s on CUDA, large sizes" + (f"; {detail}" if detail else ""))
        rows.append(row)
        on_row(row)
    return rows


def _benchmark(script: Path, torch: Any, why: Optional[str], log: list[str]) -> list[Check]:
    if torch is None:
        return [Row("benchmark", "bench_snapshot.py GPU part", "SKIP", why or "no CUDA")]
    if not script.is_file():
        return [Row("benchmark", "bench_snapshot.py GPU part", "SKIP", f"{script} is not here (run from a checkout)")]
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    r = subprocess.run([sys.executable, str(script), "--rounds", "40"], capture_output=True, text=True,
                       timeout=240, env=env)
    log.append(r.stdout + r.stderr)
    lines = [ln for ln in r.stdout.splitlines() if "GPU part" in ln or ln.startswith(("raw ", "vramlab read_nvml",
                                                                                      "vramlab read_torch"))]
    ok = r.returncode == 0 and any(ln.startswith("vramlab read_nvml") for ln in lines)
    return [Row("benchmark", "bench_snapshot.py GPU part", "PASS" if ok else "FAIL",
                "; ".join(" ".join(ln.split()) for ln in lines) or f"exit {r.returncode}")]


def _sampler(torch: Any, why: Optional[str]) -> list[Check]:
    if torch is None:
        return [Row("sampler", n, "SKIP", why or "no CUDA") for n in ("cost while CUDA is busy",
                                                                      "CUDA graph capture while sampling")]
    from vramlab.runtime.sampler import Sampler

    dev = torch.device("cuda:0")
    a = torch.randn(4096, 4096, device=dev, dtype=torch.bfloat16)

    def products_per_s(seconds: float) -> float:
        torch.cuda.synchronize(dev)
        n, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            for _ in range(20):
                a @ a  # noqa: F821 - a is deleted only after the last call
            torch.cuda.synchronize(dev)
            n += 20
        return n / (time.perf_counter() - t0)

    products_per_s(0.5)  # warm-up
    rates_off, rates_on, cpu = [], [], []
    for _ in range(3):  # interleaved, so that drift hits both alike
        rates_off.append(products_per_s(1.5))
        s = Sampler()
        s.start(0.1)
        rates_on.append(products_per_s(1.5))
        s.stop()
        cpu.append(s.cpu_seconds)
        if s.errors:
            return [Row("sampler", "cost while CUDA is busy", "FAIL", f"sampler errors: {s.last_error}")]
    off, on = sorted(rates_off)[1], sorted(rates_on)[1]
    rows = [Row("sampler", "cost while CUDA is busy", "INFO",
                f"{off:.0f} bf16 4096^2 products/s without the sampler, {on:.0f} with it at 0.1 s "
                f"(ratio {on / off:.3f}); sampler CPU {sum(cpu) / len(cpu):.3f} s per 1.5 s")]

    # CUDA graphs captured while the sampler reads every 10 ms from its own thread
    x = torch.randn(1024, 1024, device=dev)
    stream = torch.cuda.Stream(device=dev)
    with torch.cuda.stream(stream):  # warm-up on the capture stream, as torch's docs ask
        for _ in range(3):
            (x @ x).relu()
    torch.cuda.synchronize(dev)

    def capture() -> None:
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, stream=stream):
            (x @ x).relu()
        g.replay()

    try:
        capture()  # without the sampler: a failure here is not the sampler's
    except Exception as e:
        rows.append(Row("sampler", "CUDA graph capture while sampling", "SKIP",
                        f"capture fails even without the sampler: {type(e).__name__}: {str(e).splitlines()[0][:200]}"))
        return rows
    s = Sampler()
    s.start(0.01)
    failures = []
    try:
        for i in range(50):
            try:
                capture()
            except Exception as e:
                failures.append(f"capture {i}: {type(e).__name__}: {str(e).splitlines()[0][:200]}")
                break
        torch.cuda.synchronize(dev)
    finally:
        s.stop()
    samples = len(s.samples)
    rows.append(Row("sampler", "CUDA graph capture while sampling", "FAIL" if failures or s.errors else "PASS",
                    "; ".join(failures) or (f"50 captures and replays with the sampler at 10 ms ({samples} samples, "
                                            f"{s.errors} sampler errors)")))
    del a
    torch.cuda.empty_cache()
    return rows


# --------------------------------------------------------------------------- the report


def run_report(outdir: Path, *, notebooks: Path = ROOT / "notebooks",
               benchmark: Path = ROOT / "benchmarks" / "bench_snapshot.py", budget_s: float = 420.0,
               per_notebook_s: int = 120, echo: Callable[[str], None] = lambda s: None,
               notebooks_out: Optional[Path] = None) -> list[Check]:
    """Run every section and write ``outdir/report.md``; returns the rows.

    ``report.md`` is rewritten after every section and every notebook, so a run that is
    killed leaves what it had measured. The executed notebooks go to ``notebooks_out``
    (default ``outdir/notebooks``)."""
    t0 = time.monotonic()
    deadline = t0 + budget_s
    outdir.mkdir(parents=True, exist_ok=True)
    log: list[str] = []
    rows: list[Check] = []

    def save(done: bool = False) -> None:
        _write(outdir / "report.md", rows, log, time.monotonic() - t0, done)

    def section(title: str, fn: Callable[[], list[Check]]) -> None:
        s0 = time.perf_counter()
        n = len(rows)
        try:
            got = fn()
        except Exception as e:  # a section that crashes has failed, the others still run
            got = [Row(title, "(section)", "FAIL", _clean(f"{type(e).__name__}: {e}"))]
        del rows[n:]  # rows a section reported as it went (on_row) are replaced by its list
        rows.extend(got)
        save()
        echo(f"{title}: {time.perf_counter() - s0:.1f} s, " + ", ".join(f"{r.name} {r.status}" for r in got))

    def progress(row: Check) -> None:
        rows.append(row)
        save()

    section("machine", _environment)
    section("self-check", lambda: _selfcheck(log))
    torch, why = _cuda()
    section("attribution", lambda: _attribution(torch, why))
    section("sampler", lambda: _sampler(torch, why))
    section("allocator", lambda: _traces(torch, why, outdir))
    section("in a kernel", lambda: _in_kernel(torch, why, notebooks_out or outdir / "notebooks"))
    section("monitor", lambda: _monitor(torch, why))
    section("benchmark", lambda: _benchmark(benchmark, torch, why, log))
    section("notebooks", lambda: _notebooks(notebooks, notebooks_out or outdir / "notebooks", deadline, per_notebook_s,
                                            torch, why, on_row=progress))
    save(done=True)
    return rows


def _write(path: Path, rows: Sequence[Check], log: Sequence[str], elapsed: float, done: bool = True) -> None:
    counts = {s: sum(r.status == s for r in rows) for s in ("PASS", "FAIL", "SKIP", "INFO")}
    when = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    state = "in" if done else "so far (the run is still going, or was stopped), after"
    lines = [f"# vramlab GPU report, {when}", "",
             f"`python3 tools/gpu_report.py`: {counts['PASS']} passed, {counts['FAIL']} failed, "
             f"{counts['SKIP']} skipped, {state} {elapsed:.0f} s.", "",
             "| section | check | status | detail |", "|---|---|---|---|"]
    for r in rows:
        detail = _clean(r.detail).replace("|", "\\|").replace("\n", " ")
        lines.append(f"| {r.section} | {r.name} | {r.status} | {detail} |")
    if any(entry.strip() for entry in log):
        lines += ["", "## Output", "", "```"]
        lines += [_clean(entry).rstrip() for entry in log if entry.strip()]
        lines += ["```"]
    path.write_text("\n".join(lines) + "\n")


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run the report; exit 1 when a row failed, 2 on bad arguments."""
    p = argparse.ArgumentParser(prog="python3 tools/gpu_report.py",
                                description="Run vramlab's GPU checks, notebooks and measurements; write OUTDIR/report.md.")
    p.add_argument("outdir", type=Path, help="where report.md and the executed notebooks go")
    p.add_argument("--notebooks", type=Path, default=ROOT / "notebooks", help="the notebooks to run (default notebooks/)")
    p.add_argument("--benchmark", type=Path, default=ROOT / "benchmarks" / "bench_snapshot.py",
                   help="the snapshot benchmark script (default benchmarks/bench_snapshot.py)")
    p.add_argument("--budget", type=float, default=420.0, metavar="SECONDS",
                   help="no notebook starts after this many seconds (default 420)")
    p.add_argument("--notebooks-out", type=Path, default=None, metavar="DIR",
                   help="where the executed notebooks go (default OUTDIR/notebooks)")
    args = p.parse_args(argv)
    rows = run_report(args.outdir, notebooks=args.notebooks, benchmark=args.benchmark, budget_s=args.budget,
                      echo=lambda s: print(s, flush=True), notebooks_out=args.notebooks_out)
    print(f"wrote {args.outdir / 'report.md'}")
    return 1 if any(r.status == "FAIL" for r in rows) else 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
