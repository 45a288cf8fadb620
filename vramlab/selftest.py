"""``python -m vramlab.selftest``: run every GPU-dependent path and print a PASS/FAIL table.

With no GPU (or no NVML) each check is reported as skipped and the exit status is 0.
On a CUDA machine it checks, in this order:

1. reading (a snapshot with torch imported) creates no CUDA context;
2. each NVML device reading agrees with ``nvidia-smi --query-gpu``;
3. vramlab's ``cuda:i`` is torch's ``cuda:i`` (same UUID);
4. allocating 1 GiB moves torch allocated by exactly 1 GiB, reserved and NVML's
   process-used by 1 GiB within the allocator's rounding;
5. the layers of every device add up to its total;
6. NVML free agrees with ``torch.cuda.mem_get_info``;
7. ``vramlab.estimate`` of a training step (MLP, CNN, small GPT; Adam) is within 5% of
   ``torch.cuda.max_memory_allocated`` for the same step run for real.

Exit status 1 when any check fails.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Callable, Optional

__all__ = ["Check", "run_checks", "main"]

GiB = 1 << 30
MiB = 1 << 20


@dataclass
class Check:
    """One check's outcome: ``status`` is PASS, FAIL or SKIP."""

    name: str
    status: str
    detail: str


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


def run_checks(log: Callable[[str], None] = lambda s: None) -> list[Check]:
    """Run every check; returns their outcomes (never raises)."""
    from .probes.nvml import read_nvml
    from .reconcile import snapshot
    from .units import format_bytes

    checks: list[Check] = []

    def add(name: str, ok: Optional[bool], detail: str) -> None:
        checks.append(Check(name, "SKIP" if ok is None else ("PASS" if ok else "FAIL"), detail))
        log(f"{checks[-1].status:4}  {name}: {detail}")

    nv = read_nvml()
    names = ["no context on read", "NVML vs nvidia-smi", "cuda:i is torch's cuda:i", "1 GiB allocation",
             "layers sum to total", "NVML free vs mem_get_info", "estimate vs max_memory_allocated"]
    if nv.reason or not nv.devices:
        for n in names:
            add(n, None, f"skipped: {nv.reason or 'no NVIDIA device'}")
        return checks
    try:
        import torch
    except Exception as e:
        torch = None
        torch_reason = f"torch cannot be imported: {e}"
    cuda_ok = torch is not None and torch.cuda.is_available()

    # 1. no context on read
    if torch is None:
        add(names[0], None, torch_reason)
    else:
        was = torch.cuda.is_initialized()
        snap = snapshot()
        mine = [d.process_used for d in snap.devices if d.process_used]
        ok = (not was and not torch.cuda.is_initialized() and not mine)
        add(names[0], ok if not was else None,
            f"is_initialized before={was} after={torch.cuda.is_initialized()}, NVML process-used={mine or 0}")

    # 2. NVML vs nvidia-smi
    try:
        smi = _nvidia_smi()
    except Exception as e:
        smi = None
        log(f"nvidia-smi failed: {e}")
    if smi is None:
        add(names[1], None, "nvidia-smi not found or failed")
    else:
        nv2 = read_nvml()
        whole = {d.uuid: d for d in nv2.devices if d.mig_index is None}
        bad = []
        for row in smi:
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
        add(names[1], not bad, "; ".join(bad) or f"{len(smi)} device(s) agree (total within 2 MiB, used within 64 MiB)")

    if not cuda_ok:
        for n in names[2:]:
            add(n, None, "torch.cuda is not available")
        return checks

    # 3. mapping
    dev = torch.device("cuda:0")
    torch.empty(1, device=dev)  # create the context now, so later deltas are the allocation alone
    torch.cuda.synchronize()
    snap = snapshot()
    bad = []
    for i in range(torch.cuda.device_count()):
        u = str(torch.cuda.get_device_properties(i).uuid)
        try:
            d = snap.device(f"cuda:{i}")
        except KeyError:
            bad.append(f"cuda:{i} missing")
            continue
        if d.uuid is None or u.lower() not in d.uuid.lower():
            bad.append(f"cuda:{i}: vramlab {d.uuid} vs torch {u}")
    add(names[2], not bad, "; ".join(bad) or f"{torch.cuda.device_count()} device(s), UUIDs match")

    # 4. 1 GiB allocation
    time.sleep(0.2)
    before = snapshot().device("cuda:0")
    x = torch.empty(GiB, dtype=torch.uint8, device=dev)
    torch.cuda.synchronize()
    time.sleep(0.5)  # NVML's per-process figure is sampled by the driver
    after = snapshot().device("cuda:0")
    da = (after.torch_allocated or 0) - (before.torch_allocated or 0)
    dr = (after.torch_reserved or 0) - (before.torch_reserved or 0)
    dp = None if after.process_used is None or before.process_used is None else after.process_used - before.process_used
    ok = da == GiB and GiB <= dr <= GiB + 20 * MiB and (dp is None or abs(dp - dr) <= 32 * MiB)
    add(names[3], ok, f"allocated +{format_bytes(da)}, reserved +{format_bytes(dr)}, NVML process "
        + ("n/a (PID not listed)" if dp is None else f"+{format_bytes(dp)}"))

    # 5. layers
    snap = snapshot()
    bad = [f"{d.id}: sum {sum(n for _, n in d.layers)} != total {d.total}" for d in snap.devices
           if d.total is not None and d.layers and sum(n for _, n in d.layers) != d.total]
    add(names[4], not bad, "; ".join(bad) or "exact for every device")

    # 6. mem_get_info
    free, total = torch.cuda.mem_get_info(0)
    d = snapshot().device("cuda:0")
    diff = abs((d.free or 0) - free)
    add(names[5], diff <= 64 * MiB and total == (d.mem_info_total or total),
        f"NVML free {format_bytes(d.free)} vs mem_get_info {format_bytes(free)} (diff {format_bytes(diff)})")
    del x
    torch.cuda.empty_cache()

    # 7. the estimator against the real allocator
    try:
        add(names[6], *_estimate_check(torch))
    except Exception as e:
        add(names[6], False, f"{type(e).__name__}: {e}")
    return checks


def _estimate_check(torch: object) -> tuple[bool, str]:
    """Estimated peak vs measured peak on cuda:0 for three models; within 5% each."""
    import torch as t

    from .lessons.models import make_cnn, make_gpt, make_mlp
    from .sim.estimate import estimate

    out = []
    ok = True
    for label, (build, batch, loss_fn), b in (("MLP", make_mlp(), 256), ("CNN", make_cnn(), 64),
                                              ("GPT small", make_gpt("small", seq=256), 4)):
        est = estimate(build, batch, batch_size=b, optimizer="adam", loss_fn=loss_fn, device="H100-80GB")
        t.cuda.synchronize()
        t.cuda.empty_cache()
        t.cuda.reset_peak_memory_stats()
        base = t.cuda.memory_allocated()  # the estimate counts the model's parameters too
        model = build().cuda()
        opt = t.optim.Adam(model.parameters(), foreach=True)
        for _ in range(est.steps):
            inputs, *targets = (v.cuda() for v in batch(b))
            l = loss_fn(model(inputs), *targets)
            opt.zero_grad(set_to_none=True)
            l.backward()
            opt.step()
            del inputs, targets, l
        t.cuda.synchronize()
        real = t.cuda.max_memory_allocated() - base
        err = (est.peak - real) / real
        ok = ok and abs(err) <= 0.05
        out.append(f"{label} {err:+.1%}")
        del model, opt
        t.cuda.empty_cache()
    return ok, "estimate vs measured: " + ", ".join(out)


def main(argv: Optional[list[str]] = None) -> int:
    """Print the PASS/FAIL table; exit 1 when a check failed."""
    print(f"vramlab self-check · python {sys.version.split()[0]} · pid {os.getpid()}")
    checks = run_checks(log=lambda s: None)
    w = max(len(c.name) for c in checks)
    print()
    for c in checks:
        print(f"{c.status:4}  {c.name:<{w}}  {c.detail}")
    failed = [c for c in checks if c.status == "FAIL"]
    passed = [c for c in checks if c.status == "PASS"]
    skipped = [c for c in checks if c.status == "SKIP"]
    print(f"\n{len(passed)} passed, {len(failed)} failed, {len(skipped)} skipped")
    return 1 if failed else 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
