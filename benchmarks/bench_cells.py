"""Per-cell cost of memory tracking, and CPU burned during an idle cell, side by side.

    pip install --no-deps ipython_memory_usage memory_profiler ipyexperiments   # the tools compared
    python benchmarks/bench_cells.py [--cells N] [--write-doc]

Each contender runs in a fresh interpreter with a real IPython shell, so one tool's hooks
never touch another's:

- no extension (the floor);
- vramlab ``%vram auto on`` (a record after every cell, exact peaks);
- ipython_memory_usage ``%imu_start``;
- ipyexperiments' ``CellLogger`` (what ``IPyExperimentsCPU()`` starts in a kernel), CPU backend.

It times N trivial cells, each with code of its own (``_c17 = 17``: a tool that keys cells by
their code pays for every cell, as in a notebook where cells are new), and reports the added
milliseconds per cell, then runs one ``time.sleep(2)`` cell and reports the process CPU seconds
it burned. Output the tools print goes to a file, the same way for all. The contenders run
interleaved: ``--rounds`` rounds, each running every contender once (the order rotates), and
each figure is the median of its rounds, so that a slow minute of a shared machine does not
land on one tool.

Then the same cells in a real Jupyter kernel (ipykernel through jupyter_client, as a notebook
runs them): the kernel process's CPU time per cell (``psutil``), which is what a tool costs a
user, with the messages and the display hook of a real kernel. Last, it measures vramlab's
sampler thread at 0.5 s and 0.1 s intervals, alone and with a live monitor attached.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import textwrap

SETUPS = {
    "no extension": [],
    "vramlab auto": ["%load_ext vramlab", "%vram auto on"],
    "ipython_memory_usage": ["%load_ext ipython_memory_usage", "%imu_start"],
    # IPyExperimentsCPU() needs a Jupyter kernel; its CellLogger runs in any IPython shell
    "ipyexperiments CellLogger": ["import types; from ipyexperiments.cell_logger import CellLogger",
                                  "cl = CellLogger(exp=types.SimpleNamespace(backend='cpu')).start()"],
}

CHILD = textwrap.dedent('''
    import json, os, sys, time
    setup, n = json.loads(sys.argv[1]), int(sys.argv[2])
    from IPython.testing.globalipapp import start_ipython
    ip = start_ipython()
    sink = open(os.devnull, "w")
    real = sys.stdout
    sys.stdout = sink
    try:
        for line in setup:
            r = ip.run_cell(line)
            if not r.success:
                raise SystemExit(f"setup failed: {line}")
        for i in range(20):
            ip.run_cell(f"_w{i} = {i}")
        t0 = time.perf_counter()
        for i in range(n):
            ip.run_cell(f"_c{i} = {i}")
        per_cell = (time.perf_counter() - t0) / n
        c0, w0 = time.process_time(), time.perf_counter()
        ip.run_cell("import time; time.sleep(2)")
        cpu, wall = time.process_time() - c0, time.perf_counter() - w0
    finally:
        sys.stdout = real
    print(json.dumps({"per_cell_s": per_cell, "sleep_cpu_s": cpu, "sleep_wall_s": wall}))
''')

SAMPLER = textwrap.dedent('''
    import json, sys, time
    interval, with_monitor, seconds = float(sys.argv[1]), sys.argv[2] == "1", float(sys.argv[3])
    import vramlab
    from vramlab.runtime.sampler import get_sampler
    s = get_sampler()
    if with_monitor:
        m = vramlab.watch(interval)
    else:
        s.start(interval)
    time.sleep(seconds)
    s.stop()
    print(json.dumps({"cpu_s": s.cpu_seconds, "wall_s": seconds, "samples": len(s.samples)}))
''')


KERNEL = textwrap.dedent('''
    import json, sys, time
    import psutil
    from jupyter_client.manager import start_new_kernel
    setup, n = json.loads(sys.argv[1]), int(sys.argv[2])
    km, kc = start_new_kernel(kernel_name="python3")
    try:
        def run(code):
            r = kc.execute_interactive(code, timeout=120, output_hook=lambda msg: None)
            if r["content"]["status"] != "ok":
                raise SystemExit(f"failed: {code}")
        for line in setup:
            run(line)
        for i in range(20):
            run(f"_w{i} = {i}")
        proc = psutil.Process(km.provisioner.pid)
        c0 = sum(proc.cpu_times()[:2])
        t0 = time.perf_counter()
        for i in range(n):
            run(f"_c{i} = {i}")
        wall = (time.perf_counter() - t0) / n
        cpu = (sum(proc.cpu_times()[:2]) - c0) / n
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)
    print(json.dumps({"cpu_per_cell_s": cpu, "wall_per_cell_s": wall}))
''')


def median(xs: list[float]) -> float:
    xs = sorted(xs)
    return xs[len(xs) // 2] if len(xs) % 2 else (xs[len(xs) // 2 - 1] + xs[len(xs) // 2]) / 2


def run_kernel(setup: list[str], n: int) -> dict:
    r = subprocess.run([sys.executable, "-c", KERNEL, json.dumps(setup), str(n)], capture_output=True, text=True,
                       timeout=1800)
    if r.returncode != 0:
        return {"error": (r.stderr or r.stdout).strip().splitlines()[-1][:120]}
    return json.loads(r.stdout.strip().splitlines()[-1])


def interleaved(runner, contenders: dict[str, list[str]], n_of, rounds: int) -> dict[str, dict]:
    """Each contender's figures, the median of ``rounds`` rounds; in each round every contender
    runs once, in a fresh process, the order rotated by one from the round before."""
    names = list(contenders)
    got: dict[str, list[dict]] = {k: [] for k in names}
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            got[name].append(runner(contenders[name], n_of(name)))
    out: dict[str, dict] = {}
    for name, rs in got.items():
        ok = [x for x in rs if "error" not in x]
        out[name] = {k: median([x[k] for x in ok]) for k in ok[0]} if ok else rs[0]
    return out


def print_table(res: dict[str, dict], key: str, heads: tuple[str, str], last) -> None:  # type: ignore[no-untyped-def]
    """One row per contender: ``key`` (seconds per cell) in ms, what it adds to the floor (the
    first contender), the ratio, and ``last(row)``."""
    base = next(iter(res.values()))[key]
    print(f"{'per cell':<28}{heads[0]:>10}{'added ms':>10}{'x floor':>9}{heads[1]:>18}")
    for name, r in res.items():
        if "error" in r:
            print(f"{name:<28}  not run: {r['error']}")
            continue
        print(f"{name:<28}{r[key] * 1000:>10.3f}{(r[key] - base) * 1000:>10.3f}{r[key] / base:>9.2f}{last(r):>18}")


def run_child(setup: list[str], n: int) -> dict:
    r = subprocess.run([sys.executable, "-c", CHILD, json.dumps(setup), str(n)], capture_output=True, text=True,
                       timeout=1800)
    if r.returncode != 0:
        return {"error": (r.stderr or r.stdout).strip().splitlines()[-1][:120]}
    return json.loads(r.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cells", type=int, default=300, help="trivial cells per contender")
    ap.add_argument("--sampler-seconds", type=float, default=20.0)
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds; each figure is their median")
    args = ap.parse_args()

    def n_of(name: str) -> int:
        return args.cells if name != "ipython_memory_usage" else max(args.cells // 10, 20)

    res = interleaved(run_child, SETUPS, n_of, args.rounds)
    print(f"IPython shell, {args.cells} cells of their own code per contender, median of {args.rounds} interleaved "
          "rounds")
    print_table(res, "per_cell_s", ("ms/cell", "CPU in 2 s sleep"),
                lambda r: f"{r['sleep_cpu_s']:>16.3f} s")
    print()
    kernel_setups = {k: SETUPS[k] for k in ("no extension", "vramlab auto")}
    kres = interleaved(run_kernel, kernel_setups, lambda name: args.cells, args.rounds)
    print(f"a real kernel (ipykernel), {args.cells} cells per contender, median of {args.rounds} interleaved rounds: "
          "the kernel process's CPU per cell")
    print_table(kres, "cpu_per_cell_s", ("CPU ms", "wall ms"), lambda r: f"{r['wall_per_cell_s'] * 1000:>10.3f}")
    print()
    from importlib.metadata import PackageNotFoundError, version

    peers = []
    for dist in ("ipython_memory_usage", "ipyexperiments"):
        try:
            peers.append(f"{dist} {version(dist)} (the real one)")
        except PackageNotFoundError:
            peers.append(f"{dist} not installed (pip install 'vramlab[bench]')")
    print("peers: " + "; ".join(peers))
    print()
    print(f"sampler: {args.sampler_seconds:g} s per row; no frontend (a plain interpreter: the monitor renders "
          "its values, but no browser receives them)")
    print(f"{'vramlab sampler':<28}{'interval':>10}{'CPU s':>9}{'wall s':>9}{'% of a core':>13}")
    for interval in (0.5, 0.1):
        for mon in (False, True):
            r = subprocess.run([sys.executable, "-c", SAMPLER, str(interval), "1" if mon else "0",
                                str(args.sampler_seconds)], capture_output=True, text=True, timeout=600)
            d = json.loads(r.stdout.strip().splitlines()[-1])
            label = "with live monitor" if mon else "sampler alone"
            print(f"{label:<28}{interval:>10.1f}{d['cpu_s']:>9.3f}{d['wall_s']:>9.1f}"
                  f"{100 * d['cpu_s'] / d['wall_s']:>12.2f}%")


if __name__ == "__main__":
    from _doc import recording, write_flag

    with recording("bench_cells", write_flag()):  # --write-doc: the output goes into docs/benchmarks.md
        main()
