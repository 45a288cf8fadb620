"""Cost of one reading: vramlab against the raw reads underneath and against psutil.

    python benchmarks/bench_snapshot.py [--rounds N] [--write-doc]

Every contender runs interleaved in the same process, round after round, so machine
noise hits all of them alike; the table gives medians and the ratio to the floor.

- floor: the raw reads (os.read, no parsing) of exactly the files read_host() reads here;
  no row may beat it, and the script says so if one does (then the floor is not the floor);
- vramlab read_host(): the host probe (RSS, peak, RAM, swap, cgroup limit);
- vramlab snapshot(): the whole reconciled snapshot (host-only on a machine without GPU);
- psutil: memory_info() + virtual_memory() + swap_memory(), the same readings.

On a GPU machine it also times vramlab's NVML and torch parts against the same raw calls
made directly. Last, it times ``%load_ext vramlab`` in fresh interpreters.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from typing import Callable


_FLOOR_FILES: list[str] = []


def floor_files() -> list[str]:
    """The files read_host() reads on this machine: /proc/self/status and /proc/meminfo, plus
    /proc/vmstat when swap exists and the limiting cgroup's usage and memory.stat when a limit applies."""
    from vramlab.probes.cgroup import CGROUP
    from vramlab.probes.host import read_host

    r = read_host()
    files = ["/proc/self/status", "/proc/meminfo"]
    if r.swap_total:
        files.append("/proc/vmstat")
    if r.cgroup_usage is not None:
        files += [f for f in (CGROUP.usage_file, CGROUP.stat_file) if f]
    return files


_LIMIT_FILES: list[str] = []


def _raw(paths: list[str]) -> None:
    for path in paths:
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:
            continue  # a file the probe looks for and does not find costs the open too
        try:
            os.read(fd, 65536)
        finally:
            os.close(fd)


def floor() -> None:
    """The fastest way to read the same numbers: one os.open/os.read/os.close per file, no
    parsing; with this process's children, as read_host() reads them (the task list, then
    each task's children file)."""
    _raw(_FLOOR_FILES)
    task = f"/proc/{os.getpid()}/task"
    _raw([f"{task}/{tid}/children" for tid in os.listdir(task)])


def limit_files() -> list[str]:
    """The files the cgroup limit refresh reads (every CGROUP_LIMIT_TTL seconds): each
    candidate cgroup's limit and usage file, up its chain."""
    from vramlab.probes import cgroup

    c = cgroup.CGROUP
    c.resolve()
    if c._texts is None:
        return []
    out = []
    for version, chain, _ in cgroup._cgroup_dirs(*c._texts, c._exists):
        names = ("memory.max", "memory.current", "memory.stat") if version == 2 else \
            ("memory.limit_in_bytes", "memory.usage_in_bytes", "memory.stat")
        out += [os.path.join(d, n) for d in chain for n in names]
    return out


def floor_with_refresh() -> None:
    """The floor, plus the raw reads of the cgroup limit refresh."""
    floor()
    _raw(_LIMIT_FILES)


def read_host_with_refresh() -> object:
    """read_host() with the cgroup limit refreshed on this call (as every 2 s of the sampler)."""
    from vramlab.probes import cgroup
    from vramlab.probes.host import read_host

    cgroup.CGROUP._limit_time = -float("inf")
    return read_host()


def psutil_equivalent() -> None:
    import psutil

    _P.memory_info()
    psutil.virtual_memory()
    psutil.swap_memory()


def bench(fns: dict[str, Callable[[], object]], rounds: int, inner: int) -> dict[str, float]:
    samples: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            t0 = time.perf_counter_ns()
            for _ in range(inner):
                fn()
            samples[name].append((time.perf_counter_ns() - t0) / inner / 1000)
    return {k: statistics.median(v) for k, v in samples.items()}


def load_ext_ms(runs: int, cached: bool = True) -> list[float]:
    code = ("import time\n"
            "from IPython.testing.globalipapp import start_ipython\n"
            "ip = start_ipython()\n"
            "t0 = time.perf_counter()\n"
            "ip.run_line_magic('load_ext', 'vramlab')\n"
            "t1 = time.perf_counter()\n"
            "import sys; print((t1 - t0) * 1000, 'torch' in sys.modules)\n")
    import tempfile

    out = []
    with tempfile.TemporaryDirectory() as prefix:
        # cached: bytecode written once (a discarded first run) and read after, as an installed
        # package has it; uncached: every module compiled, as with PYTHONDONTWRITEBYTECODE and no cache
        env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
        env["PYTHONPYCACHEPREFIX"] = prefix
        if cached:
            subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env)
        else:
            env["PYTHONDONTWRITEBYTECODE"] = "1"
        out = _load_ext_runs(code, runs, env)
    return out


def _load_ext_runs(code: str, runs: int, env: dict[str, str]) -> list[float]:
    out = []
    for _ in range(runs):
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env)
        ms, torch_loaded = r.stdout.split()
        assert torch_loaded == "False"
        out.append(float(ms))
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=200)
    ap.add_argument("--inner", type=int, default=20)
    args = ap.parse_args()

    import psutil

    global _P
    _P = psutil.Process()
    import vramlab
    from vramlab.probes.host import read_host
    from vramlab.probes.nvml import read_nvml

    _FLOOR_FILES[:] = floor_files()
    _LIMIT_FILES[:] = limit_files()
    fns: dict[str, Callable[[], object]] = {
        "floor (/proc reads)": floor,
        "vramlab read_host()": read_host,
        "vramlab snapshot()": vramlab.snapshot,
        "psutil equivalent": psutil_equivalent,
        "floor + limit refresh": floor_with_refresh,
        "read_host() + refresh": read_host_with_refresh,
    }
    for fn in fns.values():  # warm up (NVML lookup, cgroup resolution)
        fn()
    res = bench(fns, args.rounds, args.inner)
    f = res["floor (/proc reads)"]
    devices = [d.id for d in vramlab.snapshot().devices]
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} cpus, devices: {devices or 'none'}")
    print(f"medians of {args.rounds} rounds x {args.inner} calls, interleaved\n")
    print(f"{'reading':<26}{'median us':>11}{'x floor':>9}")
    for k, v in res.items():
        print(f"{k:<26}{v:>11.1f}{v / f:>9.2f}")
    print(f"floor files: {', '.join(_FLOOR_FILES)}, and the children files of each task")
    print(f"limit refresh (every 2 s of the sampler; the last two rows force it on every call, "
          f"'read_host() + refresh' against 'floor + limit refresh'): {len(_LIMIT_FILES)} more files")
    if "read_host() + refresh" in res:
        print(f"read_host() + refresh: x{res['read_host() + refresh'] / res['floor + limit refresh']:.2f} "
              "its own floor")
    below = [k for k, v in res.items() if v < f and k != "floor + limit refresh"]
    if below:
        print(f"WARNING: {', '.join(below)} beat the floor: the floor is not the fastest read")
    print("peers: psutil (the real one)")

    nv = read_nvml()
    if nv.devices:
        import pynvml

        handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]

        # the raw calls read_nvml() makes, each kept only if the driver answers it here (a sandbox
        # may refuse the process lists): the floor calls what vramlab can call, no more
        candidates = {
            "memory info v2": lambda h: pynvml.nvmlDeviceGetMemoryInfo(h, version=pynvml.nvmlMemory_v2),
            "utilization": pynvml.nvmlDeviceGetUtilizationRates,
            "compute processes": pynvml.nvmlDeviceGetComputeRunningProcesses,
            "graphics processes": pynvml.nvmlDeviceGetGraphicsRunningProcesses,
        }
        calls = []
        for name, call in candidates.items():
            try:
                for h in handles:
                    call(h)
                calls.append(call)
            except Exception as e:
                print(f"raw NVML: {name} refused here ({type(e).__name__}: {e}); left out of the floor")

        def raw_nvml() -> None:
            for h in handles:
                for call in calls:
                    call(h)

        gpu = {"raw NVML calls": raw_nvml, "vramlab read_nvml()": read_nvml}
        try:
            import torch

            if torch.cuda.is_available():
                torch.empty(1, device="cuda")
                from vramlab.probes.torch_alloc import read_torch

                def raw_torch() -> None:
                    for i in range(torch.cuda.device_count()):
                        torch.cuda.memory_stats(i)
                        torch.cuda.mem_get_info(i)

                gpu.update({"raw torch.cuda calls": raw_torch, "vramlab read_torch()": read_torch})
        except Exception as e:
            print(f"torch part skipped: {e}")
        res = bench(gpu, max(args.rounds // 4, 10), args.inner)
        print(f"\n{'GPU part':<26}{'median us':>11}{'x raw':>9}")
        keys = list(res)
        for i in range(0, len(keys), 2):
            raw, ours = keys[i], keys[i + 1]
            print(f"{raw:<26}{res[raw]:>11.1f}{1.0:>9.2f}")
            print(f"{ours:<26}{res[ours]:>11.1f}{res[ours] / res[raw]:>9.2f}")
            if res[ours] < res[raw]:
                print(f"WARNING: {ours} beat its floor ({raw})")
    else:
        from vramlab.display.words import note_text

        print(f"\nGPU part: not run ({note_text(nv.reason)})")

    print()
    for cached in (True, False):
        ms = load_ext_ms(7, cached)
        how = "bytecode cached" if cached else "no bytecode cache (every module compiled)"
        print(f"%load_ext vramlab in a fresh interpreter, {how}: median {statistics.median(ms):.1f} ms "
              f"(min {min(ms):.1f}, max {max(ms):.1f}, 7 runs; torch not imported)")


if __name__ == "__main__":
    from _doc import recording, write_flag

    with recording("bench_snapshot", write_flag()):  # --write-doc: the output goes into docs/benchmarks.md
        main()
