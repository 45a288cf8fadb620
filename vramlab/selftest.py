"""``python -m vramlab.selftest``: run every GPU-dependent path and print a PASS/FAIL table.

With no GPU each check is reported as skipped and the exit status is 0. Without NVML (a
sandbox that refuses it, no driver library) the checks that need it are skipped with the
reason, and those that need only torch (no context on read, the 1 GiB allocation's torch
figures, the estimator) still run.
On a CUDA machine it checks, in this order:

1. reading (a snapshot with torch imported) creates no CUDA context;
2. each NVML device reading agrees with ``nvidia-smi --query-gpu`` (total within 2 MiB,
   used within 64 MiB, the same name);
3. vramlab's ``cuda:i`` is torch's ``cuda:i``: NVML matched every CUDA device (source
   ``nvml+torch``) and NVML's UUID is torch's;
4. allocating 1 GiB moves torch allocated by exactly 1 GiB, reserved by 1 GiB within the
   allocator's rounding, and NVML's process-used with reserved (within 32 MiB);
5. the raw readings agree before any clamping: NVML's used + free + reserved is its total,
   and NVML's figure for this process covers torch's reserved memory;
6. NVML's free memory agrees with ``torch.cuda.mem_get_info`` (within 64 MiB), and
   ``mem_get_info``'s total with NVML's total less the driver's reservation;
7. ``vramlab.estimate`` of a training step is within 5% of ``torch.cuda.max_memory_allocated``
   for the very step function the estimate runs (MLP, CNN, small GPT in fp32 and in
   bf16-mixed; Adam), each step run once first so that cuBLAS and cuDNN have chosen their
   algorithms for its shapes;
8. its ``peak_reserved`` is within 10% of ``torch.cuda.max_memory_reserved`` for the same steps.

Each check is a pure function of its readings (``check_*``), so the tests feed each one
readings that must fail and see it FAIL. Exit status 1 when any check fails.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence

from .display.words import note_text
from .probes.cuda_order import bare_uuid

__all__ = ["Check", "run_checks", "main", "CHECKS", "check_no_context", "check_nvidia_smi", "check_mapping",
           "check_allocation", "check_readings", "check_free_memory", "check_estimates"]

GiB = 1 << 30
MiB = 1 << 20

#: The checks' names, in order.
CHECKS = ("no context on read", "NVML vs nvidia-smi", "cuda:i is torch's cuda:i", "1 GiB allocation",
          "readings agree", "NVML free vs mem_get_info", "estimate vs max_memory_allocated",
          "estimate vs max_memory_reserved")

Verdict = tuple[Optional[bool], str]  # (True PASS / False FAIL / None SKIP, detail)


@dataclass
class Check:
    """One check's outcome: ``status`` is PASS, FAIL or SKIP (INFO, for a figure a report only
    states); ``section`` groups the rows of a longer report (the checkout's GPU report)."""

    name: str
    status: str
    detail: str
    section: str = ""


# --------------------------------------------------------------------------- the checks (pure)


def check_no_context(initialised_before: bool, initialised_after: bool, process_used: Sequence[int]) -> Verdict:
    """Reading with torch imported must leave CUDA uninitialised and this process off the GPU."""
    if initialised_before:
        return None, "CUDA was initialised before the check"
    ok = not initialised_after and not any(process_used)
    return ok, (f"is_initialized after a reading={initialised_after}, "
                f"NVML process-used={[n for n in process_used if n] or 0}")


def check_nvidia_smi(nvml_devices: Sequence[Any], smi_rows: Sequence[dict[str, str]]) -> Verdict:
    """NVML's whole GPUs against ``nvidia-smi`` rows (MiB figures, as it prints them)."""
    whole = {d.uuid: d for d in nvml_devices if d.mig_index is None and d.uuid}
    bad = []
    for row in smi_rows:
        d = whole.get(row["uuid"])
        if d is None:
            bad.append(f"{row['uuid']} missing")
            continue
        tot = int(float(row["memory.total"])) * MiB
        used = int(float(row["memory.used"])) * MiB
        if d.total is None or abs(d.total - tot) > 2 * MiB:
            bad.append(f"{d.uuid} total {d.total} vs {tot}")
        # nvidia-smi's used includes driver-reserved memory on v2 drivers.
        nv_used = (d.used or 0) + (d.reserved or 0)
        if abs(nv_used - used) > 64 * MiB and abs((d.used or 0) - used) > 64 * MiB:
            bad.append(f"{d.uuid} used {nv_used} vs {used}")
        if d.name != row["name"]:
            bad.append(f"{d.uuid} name {d.name!r} vs {row['name']!r}")
    if not smi_rows:
        return False, "nvidia-smi listed no GPU"
    return not bad, "; ".join(bad) or f"{len(smi_rows)} device(s) agree (total within 2 MiB, used within 64 MiB)"


def check_mapping(snap: Any, torch_uuids: Sequence[str]) -> Verdict:
    """``snap``'s ``cuda:i`` must be NVML's reading of torch's device ``i`` (by UUID)."""
    bad = []
    for i, u in enumerate(torch_uuids):
        try:
            d = snap.device(f"cuda:{i}")
        except KeyError:
            bad.append(f"cuda:{i} missing")
            continue
        if d.source != "nvml+torch":
            bad.append(f"cuda:{i}: NVML did not match it (source {d.source})")
        elif bare_uuid(d.uuid) != bare_uuid(u):
            bad.append(f"cuda:{i}: NVML {d.uuid} vs torch {u}")
    if not torch_uuids:
        return False, "torch reports no CUDA device"
    return not bad, "; ".join(bad) or f"{len(torch_uuids)} device(s), NVML matched each by torch's UUID"


def check_allocation(before: Any, after: Any, size: int = GiB) -> Verdict:
    """Device readings before and after allocating ``size`` bytes in one tensor."""
    from .units import format_bytes

    da = (after.torch_allocated or 0) - (before.torch_allocated or 0)
    dr = (after.torch_reserved or 0) - (before.torch_reserved or 0)
    dp = None if after.process_used is None or before.process_used is None else after.process_used - before.process_used
    ok = da == size and size <= dr <= size + 20 * MiB and (dp is None or abs(dp - dr) <= 32 * MiB)
    return ok, (f"allocated +{format_bytes(da)}, reserved +{format_bytes(dr)}, NVML process "
                + ("n/a (PID not listed)" if dp is None else f"+{format_bytes(dp)}"))


def check_readings(snap: Any) -> Verdict:
    """The raw figures agree before the layers clamp them: NVML's used + free + reserved is
    its total (1 MiB), and NVML's figure for this process covers torch's reserved memory."""
    bad = []
    n = 0
    for d in snap.devices:
        if not d.id.startswith("cuda:") or d.total is None or d.used is None or d.free is None:
            continue
        n += 1
        gap = d.total - d.used - d.free - (d.driver_reserved or 0)
        if abs(gap) > MiB:
            bad.append(f"{d.id}: used + free + reserved is {gap:+d} bytes off the total")
        if d.process_used is not None and d.torch_reserved is not None and d.process_used < d.torch_reserved:
            bad.append(f"{d.id}: NVML's process figure {d.process_used} is below torch reserved {d.torch_reserved}")
    if not n:
        return False, "no CUDA device with NVML figures"
    return not bad, "; ".join(bad) or f"{n} device(s): NVML adds up, and covers torch's reserved memory"


def check_free_memory(device: Any, mem_get_info: tuple[int, int]) -> Verdict:
    """NVML's free memory of ``device`` against ``torch.cuda.mem_get_info`` ``(free, total)``."""
    from .units import format_bytes

    free, total = mem_get_info
    if device.free is None or device.total is None:
        return False, f"{device.id}: NVML gives no free figure"
    diff = abs(device.free - free)
    rd = device.driver_reserved or 0
    ok_total = device.total - rd - 64 * MiB <= total <= device.total
    return diff <= 64 * MiB and ok_total, (
        f"NVML free {format_bytes(device.free)} vs mem_get_info {format_bytes(free)} (diff {format_bytes(diff)}); "
        f"totals NVML {format_bytes(device.total)} (reserved {format_bytes(rd)}) vs mem_get_info {format_bytes(total)}")


def check_estimates(pairs: Sequence[tuple[str, int, int]], tolerance: float = 0.05) -> Verdict:
    """``(label, estimated peak, measured peak)`` per step: each within ``tolerance``."""
    if not pairs:
        return False, "no step was measured"
    errs = [(label, (est - real) / real if real else float("inf")) for label, est, real in pairs]
    ok = all(abs(e) <= tolerance for _, e in errs)
    return ok, "estimate vs measured: " + ", ".join(f"{label} {e:+.1%}" for label, e in errs)


# --------------------------------------------------------------------------- readings on the GPU


def _nvidia_smi() -> Optional[list[dict[str, str]]]:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    fields = "index,uuid,name,memory.total,memory.used,memory.free"
    out = subprocess.run([exe, f"--query-gpu={fields}", "--format=csv,noheader,nounits"],
                         capture_output=True, text=True, timeout=30)
    if out.returncode != 0:
        return None
    rows = []
    for line in out.stdout.strip().splitlines():
        parts = [p.strip() for p in line.split(",")]
        rows.append(dict(zip(fields.split(","), parts)))
    return rows


#: The estimator check's steps: (label, model factory name, kwargs, batch sizes, precision). The
#: CNN's batches are large enough (200 and 370 MiB estimated) that a cuDNN workspace, which the
#: estimate does not model, stays well under the 5% the check allows.
ESTIMATE_STEPS: tuple[tuple[str, str, dict[str, Any], tuple[int, ...], Optional[str]], ...] = (
    ("MLP", "make_mlp", {}, (64, 256), None),
    ("CNN", "make_cnn", {}, (256, 512), None),
    ("GPT small", "make_gpt", {"size": "small", "seq": 256}, (2, 4), None),
    ("GPT small bf16-mixed", "make_gpt", {"size": "small", "seq": 256}, (4,), "bf16-mixed"),
)


def estimate_pairs(torch: Any, log: Callable[[str], None] = lambda s: None) -> list[tuple[str, int, int, int, int]]:
    """``(label, estimated peak, measured peak, estimated peak reserved, measured peak reserved)``
    on cuda:0 for :data:`ESTIMATE_STEPS` (bytes): ``max_memory_allocated`` and
    ``max_memory_reserved`` against the estimate's ``peak`` and ``peak_reserved``. Each step runs
    once unmeasured first, so that cuDNN and cuBLAS have chosen their algorithms for its shapes."""
    from .lessons import models
    from .sim.estimate import estimate
    from .sim.measure import measure_cuda_peaks, warm_up_cuda

    warm_up_cuda(torch)
    out = []
    for label, factory, kw, batches, precision in ESTIMATE_STEPS:
        build, batch, loss_fn = getattr(models, factory)(**kw)
        for b in batches:
            est = estimate(build, batch, batch_size=b, optimizer="adam", loss_fn=loss_fn, device="H100-80GB",
                           precision=precision)
            kwargs = dict(batch_size=b, optimizer="adam", loss_fn=loss_fn, steps=est.steps, precision=precision)
            measure_cuda_peaks(build, batch, **kwargs)  # warm-up for these exact shapes
            real, real_reserved = measure_cuda_peaks(build, batch, **kwargs)
            out.append((f"{label} b={b}", est.peak, real, int(est.peak_reserved or 0), real_reserved))
            log(f"{label} b={b}: estimated {est.peak} allocated, {est.peak_reserved} reserved; "
                f"measured {real}, {real_reserved}")
    return out


def run_checks(log: Callable[[str], None] = lambda s: None) -> list[Check]:
    """Run every check on this machine; returns their outcomes (never raises)."""
    from .probes.nvml import read_nvml
    from .reconcile import snapshot

    checks: list[Check] = []

    def add(name: str, verdict: Verdict) -> None:
        ok, detail = verdict
        checks.append(Check(name, "SKIP" if ok is None else ("PASS" if ok else "FAIL"), detail))
        log(f"{checks[-1].status:4}  {name}: {detail}")

    def guarded(name: str, fn: Callable[[], Verdict]) -> None:
        try:
            add(name, fn())
        except Exception as e:  # a check that crashes has failed
            add(name, (False, f"{type(e).__name__}: {e}"))

    nv = read_nvml()
    # without NVML, the checks that need it are skipped and the torch-only ones still run
    why = note_text(nv.reason, english=True) if nv.reason is not None else "NVML found no NVIDIA device"
    no_nvml = f"skipped: {why}" if nv.reason is not None or not nv.devices else None

    def with_nvml(name: str, fn: Callable[[], Verdict]) -> None:
        if no_nvml:
            add(name, (None, no_nvml))
        else:
            guarded(name, fn)
    torch: Any
    try:
        import torch
    except Exception as e:
        torch = None
        torch_reason = f"torch cannot be imported: {e}"
    cuda_ok = torch is not None and torch.cuda.is_available()

    # 1. no context on read
    if torch is None:
        add(CHECKS[0], (None, torch_reason))
    elif not cuda_ok and no_nvml:
        add(CHECKS[0], (None, f"torch.cuda is not available and NVML neither: {no_nvml}"))
    else:
        def no_context() -> Verdict:
            was = torch.cuda.is_initialized()
            snap = snapshot()
            return check_no_context(was, torch.cuda.is_initialized(),
                                    [d.process_used or 0 for d in snap.devices])
        guarded(CHECKS[0], no_context)

    # 2. NVML vs nvidia-smi
    try:
        smi = _nvidia_smi()
    except Exception as e:
        smi = None
        log(f"nvidia-smi failed: {e}")
    if smi is None and not no_nvml:
        add(CHECKS[1], (None, "nvidia-smi not found or failed"))
    else:
        with_nvml(CHECKS[1], lambda: check_nvidia_smi(read_nvml().devices, smi or []))

    if not cuda_ok:
        for n in CHECKS[2:]:
            add(n, (None, "torch.cuda is not available"))
        return checks

    dev = torch.device("cuda:0")
    torch.empty(1, device=dev)  # create the context now, so later deltas are the allocation alone
    torch.cuda.synchronize()

    # 3. mapping
    with_nvml(CHECKS[2], lambda: check_mapping(
        snapshot(), [str(torch.cuda.get_device_properties(i).uuid) for i in range(torch.cuda.device_count())]))

    # 4. 1 GiB allocation
    def allocation() -> Verdict:
        time.sleep(0.2)
        before = snapshot().device("cuda:0")
        x = torch.empty(GiB, dtype=torch.uint8, device=dev)
        torch.cuda.synchronize()
        time.sleep(0.5)  # NVML's per-process figure is sampled by the driver
        after = snapshot().device("cuda:0")
        del x
        return check_allocation(before, after)
    guarded(CHECKS[3], allocation)

    # 5. raw readings agree
    with_nvml(CHECKS[4], lambda: check_readings(snapshot()))

    # 6. mem_get_info
    def free_memory() -> Verdict:
        info = tuple(int(v) for v in torch.cuda.mem_get_info(0))
        return check_free_memory(snapshot().device("cuda:0"), info)  # type: ignore[arg-type]
    with_nvml(CHECKS[5], free_memory)
    torch.cuda.empty_cache()

    # 7, 8. the estimator against the real allocator: allocated, then reserved (within 10%: the
    # reserved peak also holds the allocator's rounding to segments)
    pairs: list[tuple[str, int, int, int, int]] = []

    def estimates() -> Verdict:
        pairs.extend(estimate_pairs(torch, log))
        return check_estimates([(label, est, real) for label, est, real, _, _ in pairs])
    guarded(CHECKS[6], estimates)
    if pairs:
        guarded(CHECKS[7], lambda: check_estimates([(label, est, real) for label, _, _, est, real in pairs],
                                                   tolerance=0.10))
    else:
        add(CHECKS[7], (None, "the estimator's steps did not run"))
    return checks


def table(checks: Sequence[Check]) -> str:
    """The PASS/FAIL table and its totals, as ``main`` prints them."""
    w = max(len(c.name) for c in checks)
    lines = [f"{c.status:4}  {c.name:<{w}}  {c.detail}" for c in checks]
    counts = {s: sum(c.status == s for c in checks) for s in ("PASS", "FAIL", "SKIP")}
    lines.append(f"\n{counts['PASS']} passed, {counts['FAIL']} failed, {counts['SKIP']} skipped")
    return "\n".join(lines)


def main(argv: Optional[list[str]] = None) -> int:
    """Print the PASS/FAIL table; exit 1 when a check failed (``--help``: what it checks; any
    other argument: one line and exit status 2)."""
    import argparse

    parser = argparse.ArgumentParser(
        prog="python -m vramlab.selftest",
        description="Run every GPU-dependent path of vramlab on this machine and print a PASS/FAIL table "
                    "(NVML against nvidia-smi, cuda:i against torch's UUIDs, a 1 GiB allocation, free memory "
                    "against mem_get_info, estimate() against torch's peaks). Without a GPU every check is SKIP "
                    "and the exit status is 0; it is 1 when a check FAILs.")
    parser.parse_args(sys.argv[1:] if argv is None else argv)
    print(f"vramlab self-check · python {sys.version.split()[0]} · pid {os.getpid()}")
    checks = run_checks(log=lambda s: None)
    print()
    print(table(checks))
    return 1 if any(c.status == "FAIL" for c in checks) else 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
