"""``python -m vramlab.gpu_report OUTDIR``: the whole GPU check in one command, as one report.

It runs, in one go, and writes ``OUTDIR/report.md`` (a PASS/FAIL table with the figures)
and the executed notebooks under ``OUTDIR/notebooks/``:

1. the self-check (:mod:`vramlab.selftest`), the estimator's steps included;
2. every notebook of ``notebooks/`` executed on CUDA at its large sizes (``VRAMLAB_SIZE=large``),
   each within its own time limit and all within the report's budget;
3. the GPU part of ``benchmarks/bench_snapshot.py`` (what vramlab's NVML and torch reads
   cost beside the raw calls), when the script is there;
4. the sampler while CUDA is busy: matrix products per second with and without the
   sampler at 0.1 s, its CPU time, and CUDA graphs captured while it samples every 10 ms
   (a runtime call from its thread would invalidate the capture).

On a machine without CUDA every GPU row is SKIP, the exit status is 0, and it takes
seconds: CI runs it so. The exit status is 1 when a row FAILs. The whole run is sized to
finish in under 8 minutes on one GPU (``--budget`` seconds, 420 by default): a notebook
that would start past the budget is SKIP, with the reason.

Usage on a GPU machine, from a checkout (the notebooks and benchmarks are read from the
current folder)::

    python -m vramlab.gpu_report gpu-report/
"""

from __future__ import annotations

import argparse
import datetime as _dt
import os
import platform
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

from . import selftest
from ._version import __version__

__all__ = ["Row", "run_report", "main"]


@dataclass
class Row:
    """One line of the report: ``status`` is PASS, FAIL, SKIP or INFO."""

    section: str
    name: str
    status: str
    detail: str


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


def _environment() -> list[Row]:
    from .probes.nvml import read_nvml

    rows = [Row("machine", "python", "INFO", f"{platform.python_version()} on {platform.machine()}"),
            Row("machine", "vramlab", "INFO", __version__)]
    try:
        import torch

        cuda = getattr(torch.version, "cuda", None)
        rows.append(Row("machine", "torch", "INFO", f"{torch.__version__} (CUDA {cuda})"))
    except Exception as e:
        rows.append(Row("machine", "torch", "INFO", f"not importable: {type(e).__name__}"))
    nv = read_nvml()
    if nv.reason:
        rows.append(Row("machine", "NVML", "INFO", nv.reason))
    else:
        names = ", ".join(f"{d.index}: {d.name}" for d in nv.devices if d.mig_index is None)
        rows.append(Row("machine", "NVML", "INFO", f"driver {nv.driver_version}; {names}"))
    return rows


def _selfcheck(log: list[str]) -> list[Row]:
    checks = selftest.run_checks(log=log.append)
    return [Row("self-check", c.name, c.status, c.detail) for c in checks]


def _notebooks(src: Path, out: Path, deadline: float, per_notebook_s: int, torch: Any,
               why: Optional[str]) -> list[Row]:
    paths = sorted(src.glob("*.ipynb")) if src.is_dir() else []
    if not paths:
        return [Row("notebooks", str(src), "SKIP", "no notebooks found there")]
    if torch is None:
        return [Row("notebooks", p.stem, "SKIP", f"{why}: CI runs them on the virtual GPU") for p in paths]
    import nbformat
    from nbclient import NotebookClient

    out.mkdir(parents=True, exist_ok=True)
    rows = []
    env_before = os.environ.get("VRAMLAB_SIZE")
    os.environ["VRAMLAB_SIZE"] = "large"  # the kernels inherit it
    try:
        for p in paths:
            left = deadline - time.monotonic()
            if left < 20:
                rows.append(Row("notebooks", p.stem, "SKIP", "the report's time budget is spent"))
                continue
            nb = nbformat.read(p, as_version=4)
            t0 = time.perf_counter()
            try:
                NotebookClient(nb, timeout=int(min(per_notebook_s, left)), kernel_name="python3",
                               resources={"metadata": {"path": str(src)}}).execute()
                status, detail = "PASS", ""
            except Exception as e:
                last = str(e).strip().splitlines()[-1:] or [type(e).__name__]
                status, detail = "FAIL", f"{type(e).__name__}: {last[0][:300]}"
            dt = time.perf_counter() - t0
            nbformat.write(nb, out / p.name)
            rows.append(Row("notebooks", p.stem, status, f"{dt:.1f} s on CUDA, large sizes" + (f"; {detail}" if detail else "")))
    finally:
        if env_before is None:
            os.environ.pop("VRAMLAB_SIZE", None)
        else:
            os.environ["VRAMLAB_SIZE"] = env_before
    return rows


def _benchmark(script: Path, torch: Any, why: Optional[str], log: list[str]) -> list[Row]:
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


def _sampler(torch: Any, why: Optional[str]) -> list[Row]:
    if torch is None:
        return [Row("sampler", n, "SKIP", why or "no CUDA") for n in ("cost while CUDA is busy",
                                                                      "CUDA graph capture while sampling")]
    from .runtime.sampler import Sampler

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


def run_report(outdir: Path, *, notebooks: Path = Path("notebooks"),
               benchmark: Path = Path("benchmarks/bench_snapshot.py"), budget_s: float = 420.0,
               per_notebook_s: int = 120, echo: Callable[[str], None] = lambda s: None) -> list[Row]:
    """Run every section and write ``outdir/report.md``; returns the rows."""
    t0 = time.monotonic()
    deadline = t0 + budget_s
    outdir.mkdir(parents=True, exist_ok=True)
    log: list[str] = []
    rows: list[Row] = []

    def section(title: str, fn: Callable[[], list[Row]]) -> None:
        s0 = time.perf_counter()
        try:
            got = fn()
        except Exception as e:  # a section that crashes has failed, the others still run
            got = [Row(title, "(section)", "FAIL", f"{type(e).__name__}: {e}")]
        rows.extend(got)
        echo(f"{title}: {time.perf_counter() - s0:.1f} s, " + ", ".join(f"{r.name} {r.status}" for r in got))

    section("machine", _environment)
    section("self-check", lambda: _selfcheck(log))
    torch, why = _cuda()
    section("sampler", lambda: _sampler(torch, why))
    section("benchmark", lambda: _benchmark(benchmark, torch, why, log))
    section("notebooks", lambda: _notebooks(notebooks, outdir / "notebooks", deadline, per_notebook_s, torch, why))
    elapsed = time.monotonic() - t0
    _write(outdir / "report.md", rows, log, elapsed)
    return rows


def _write(path: Path, rows: Sequence[Row], log: Sequence[str], elapsed: float) -> None:
    counts = {s: sum(r.status == s for r in rows) for s in ("PASS", "FAIL", "SKIP", "INFO")}
    when = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    lines = [f"# vramlab GPU report, {when}", "",
             f"`python -m vramlab.gpu_report`: {counts['PASS']} passed, {counts['FAIL']} failed, "
             f"{counts['SKIP']} skipped, in {elapsed:.0f} s.", "",
             "| section | check | status | detail |", "|---|---|---|---|"]
    for r in rows:
        detail = r.detail.replace("|", "\\|").replace("\n", " ")
        lines.append(f"| {r.section} | {r.name} | {r.status} | {detail} |")
    if any(entry.strip() for entry in log):
        lines += ["", "## Output", "", "```"]
        lines += [entry.rstrip() for entry in log if entry.strip()]
        lines += ["```"]
    path.write_text("\n".join(lines) + "\n")


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run the report; exit 1 when a row failed, 2 on bad arguments."""
    p = argparse.ArgumentParser(prog="python -m vramlab.gpu_report",
                                description="Run vramlab's GPU checks, notebooks and measurements; write OUTDIR/report.md.")
    p.add_argument("outdir", type=Path, help="where report.md and the executed notebooks go")
    p.add_argument("--notebooks", type=Path, default=Path("notebooks"), help="the notebooks to run (default notebooks/)")
    p.add_argument("--benchmark", type=Path, default=Path("benchmarks/bench_snapshot.py"),
                   help="the snapshot benchmark script (default benchmarks/bench_snapshot.py)")
    p.add_argument("--budget", type=float, default=420.0, metavar="SECONDS",
                   help="no notebook starts after this many seconds (default 420)")
    args = p.parse_args(argv)
    rows = run_report(args.outdir, notebooks=args.notebooks, benchmark=args.benchmark, budget_s=args.budget,
                      echo=lambda s: print(s, flush=True))
    print(f"wrote {args.outdir / 'report.md'}")
    return 1 if any(r.status == "FAIL" for r in rows) else 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
