"""Cost of the JupyterLab extension's server side: one reading of 10 kernels, its HTTP answer,
and the server's CPU while tabs poll it at the default interval.

    python benchmarks/bench_lab.py [--kernels N] [--window SECONDS] [--write-doc]

A real Jupyter Server runs in a child process (loopback, a random token, its own runtime
folder) with vramlab's server extension at its defaults and N real ipykernels started through
the REST API. Three parts, each measured side by side in this one run:

1. The reading, in this process, for the server's kernels (their PIDs as the extension reports
   them), interleaved round after round:
   - floor: the raw reads underneath (os.read of each kernel's and descendant's
     ``/proc/<pid>/task/<tid>/children`` and ``/proc/<pid>/statm``, and the host's files), no parsing;
   - vramlab ``read_kernels()``: what the handler computes for N kernels;
   - vramlab ``snapshot()``: one reading of this process, as ``%vram`` makes it;
   - psutil: ``Process(pid).children(recursive=True)`` and ``memory_info()`` of each, plus
     ``virtual_memory()``: what one would write with psutil.
2. HTTP round trips (medians): Jupyter's own ``GET /api/kernels`` (the floor of an authenticated
   API call on this server), ``GET /vramlab/kernels`` fresh (more than ``min_interval`` after the
   last reading) and cached, and jupyter-resource-usage's ``GET /api/metrics/v1`` (the real peer,
   when it is installed: ``pip install -e ".[bench]"``).
3. The server process's CPU (user + system, from psutil) over a window: idle, one tab polling
   ``/vramlab/kernels`` at the default refresh interval, ten tabs doing so (the cache makes them
   one reading per ``min_interval``), and one tab polling jupyter-resource-usage at its default
   5 s. The share is of one core; "added" is over the idle window measured just before.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Server:
    """``jupyter server`` in a child process, with a token, stopped with its kernels."""

    def __init__(self, base: Path) -> None:
        self.port = free_port()
        self.token = secrets.token_hex(16)
        self.url = f"http://127.0.0.1:{self.port}"
        env = dict(os.environ, JUPYTER_RUNTIME_DIR=str(base / "runtime"), JUPYTER_CONFIG_DIR=str(base / "config"))
        (base / "root").mkdir()
        self.log = open(base / "server.log", "wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "jupyter", "server", "--no-browser", "--allow-root", "--ServerApp.ip=127.0.0.1",
             f"--ServerApp.port={self.port}", "--ServerApp.port_retries=0", f"--IdentityProvider.token={self.token}",
             f"--ServerApp.root_dir={base / 'root'}"],
            env=env, stdout=self.log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        deadline = time.monotonic() + 90
        while True:
            try:
                self.get("/api/status")
                return
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("jupyter server did not start: " + (base / "server.log").read_text()[-2000:]) from None
                time.sleep(0.25)

    def request(self, path: str, body: Any = None) -> Any:
        req = urllib.request.Request(self.url + path, method="POST" if body is not None else "GET",
                                     data=json.dumps(body).encode() if body is not None else None,
                                     headers={"Authorization": f"token {self.token}", "Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=60) as r:
            return json.loads(r.read() or b"null")

    def get(self, path: str) -> Any:
        return self.request(path)

    def stop(self) -> None:
        import psutil

        try:
            kids = psutil.Process(self.proc.pid).children(recursive=True)
        except psutil.Error:
            kids = []
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        _, alive = psutil.wait_procs(kids, timeout=10)
        for p in alive:
            p.kill()
        self.log.close()


def interleaved(fns: dict[str, Callable[[], object]], rounds: int) -> dict[str, float]:
    """Median microseconds per call of each function, run in turn, round after round."""
    samples: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            t0 = time.perf_counter_ns()
            fn()
            samples[name].append((time.perf_counter_ns() - t0) / 1000)
    return {k: statistics.median(v) for k, v in samples.items()}


def floor_reads(pids: list[int]) -> Callable[[], None]:
    """The raw reads underneath a reading of these kernels: each one's and each descendant's
    children files and statm, and the host's files; os.read only, no parsing."""
    from vramlab.probes.host import descendant_pids

    files = ["/proc/self/status", "/proc/meminfo"]
    for pid in pids:
        for p in (pid,) + (descendant_pids(pid) or ()):
            files += [f"/proc/{p}/task/{t}/children" for t in os.listdir(f"/proc/{p}/task")]
            files.append(f"/proc/{p}/statm")

    def run() -> None:
        for f in files:
            try:
                fd = os.open(f, os.O_RDONLY)
            except OSError:
                continue
            try:
                os.read(fd, 65536)
            finally:
                os.close(fd)

    return run


def psutil_equivalent(pids: list[int]) -> Callable[[], None]:
    import psutil

    def run() -> None:
        for pid in pids:
            try:
                proc = psutil.Process(pid)
                for p in [proc] + proc.children(recursive=True):
                    p.memory_info()
            except psutil.Error:
                pass
        psutil.virtual_memory()

    return run


def cpu_seconds(pid: int) -> float:
    import psutil

    t = psutil.Process(pid).cpu_times()
    return float(t.user + t.system)


def poll(server: Server, path: str, tabs: int, every: float, seconds: float) -> int:
    """``tabs`` clients, each GETting ``path`` every ``every`` seconds (staggered), for ``seconds``."""
    stop = time.monotonic() + seconds
    count = [0]

    def tab(offset: float) -> None:
        time.sleep(offset)
        nxt = time.monotonic()
        while nxt < stop:
            server.get(path)
            count[0] += 1
            nxt += every
            time.sleep(max(0.0, nxt - time.monotonic()))

    threads = [threading.Thread(target=tab, args=(every * i / tabs,)) for i in range(tabs)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return count[0]


def cpu_window(server: Server, seconds: float, load: Callable[[], int] | None) -> tuple[float, int]:
    """The server's CPU share of one core (percent) over ``seconds``, while ``load`` runs."""
    c0, t0 = cpu_seconds(server.proc.pid), time.monotonic()
    n = load() if load is not None else (time.sleep(seconds) or 0)
    c1, t1 = cpu_seconds(server.proc.pid), time.monotonic()
    return 100.0 * (c1 - c0) / (t1 - t0), n


def part1(pids: list[int], rounds: int) -> None:
    """The in-process table, for kernels ``pids`` (run in a process with no children)."""
    from vramlab.server.readings import KernelRef, read_kernels
    from vramlab.reconcile import snapshot

    refs = [KernelRef(id=str(i), pid=p) for i, p in enumerate(pids)]
    fns = {
        "floor (raw /proc reads)": floor_reads(pids),
        f"vramlab read_kernels({len(refs)})": lambda: read_kernels(refs),
        "vramlab snapshot() (one)": lambda: snapshot(),
        f"psutil, {len(refs)} process trees": psutil_equivalent(pids),
    }
    med = interleaved(fns, rounds)
    base = med["floor (raw /proc reads)"]
    print(f"\n1. one reading, in a fresh interpreter: medians of {rounds} interleaved rounds")
    print(f"{'reading':34s} {'median us':>10s} {'x floor':>8s}")
    for name, us in med.items():
        print(f"{name:34s} {us:10.1f} {us / base:8.2f}")
    snap = med["vramlab snapshot() (one)"]
    print(f"read_kernels({len(refs)}) costs {med[f'vramlab read_kernels({len(refs)})'] / snap:.2f} snapshot()s")
    if min(us for name, us in med.items() if "snapshot" not in name) < base:  # snapshot() reads one process
        print("note: a row beat the floor, so the floor is not the floor here")
    print("snapshot() reads this one process (no kernels): the unit the issue measures the handler in, not a contender")


def main() -> None:
    if "--part1" in sys.argv:
        i = sys.argv.index("--part1")
        part1(json.loads(sys.argv[i + 1]), int(sys.argv[sys.argv.index("--rounds") + 1]))
        return
    ap = argparse.ArgumentParser()
    ap.add_argument("--kernels", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=200)
    ap.add_argument("--http-rounds", type=int, default=25)
    ap.add_argument("--window", type=float, default=30.0)
    args = ap.parse_args()

    from vramlab.server.config import VramlabLab

    try:
        import jupyter_resource_usage  # noqa: F401

        peer = True
    except ImportError:
        peer = False
    defaults = VramlabLab()
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} cpus; {args.kernels} ipykernels on a jupyter server "
          f"(refresh_interval {defaults.refresh_interval:g} s, min_interval {defaults.min_interval:g} s)")
    with tempfile.TemporaryDirectory() as tmp:
        server = Server(Path(tmp))
        try:
            for _ in range(args.kernels):
                server.request("/api/kernels", {"name": "python3"})
            deadline = time.monotonic() + 120
            while True:  # until every kernel has a process and has settled (its first reading)
                data = server.get("/vramlab/kernels")
                pids = [k["pid"] for k in data["kernels"] if k["state"] == "running"]
                if len(pids) == args.kernels and all(k["rss"] > 30 << 20 for k in data["kernels"]):
                    break
                if time.monotonic() > deadline:
                    raise RuntimeError(f"kernels did not start: {data['kernels']}")
                time.sleep(0.5)
            time.sleep(3)

            # 1. the reading, in a fresh interpreter that is not the server's parent (this one is:
            # its snapshot() would read the server and every kernel as its children)
            r = subprocess.run([sys.executable, __file__, "--part1", json.dumps(pids), "--rounds", str(args.rounds)],
                               capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL,
                               preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
            if r.returncode != 0:
                raise RuntimeError(r.stderr[-3000:])
            print(r.stdout, end="")

            # 2. HTTP round trips
            paths = {"GET /api/kernels (Jupyter's own)": "/api/kernels",
                     "GET /vramlab/kernels, fresh": "/vramlab/kernels",
                     "GET /vramlab/kernels, cached": "/vramlab/kernels"}
            if peer:
                paths["GET /api/metrics/v1 (jupyter-resource-usage)"] = "/api/metrics/v1"
            lat: dict[str, list[float]] = {k: [] for k in paths}
            for _ in range(args.http_rounds):
                time.sleep(defaults.min_interval + 0.05)  # the next /vramlab/kernels is a fresh reading
                for name, path in paths.items():
                    t0 = time.perf_counter()
                    server.get(path)
                    lat[name].append((time.perf_counter() - t0) * 1000)
            print(f"\n2. HTTP round trips from this process: medians of {args.http_rounds} rounds")
            hbase = statistics.median(lat["GET /api/kernels (Jupyter's own)"])
            print(f"{'request':46s} {'median ms':>9s} {'x floor':>8s}")
            for name, v in lat.items():
                m = statistics.median(v)
                print(f"{name:46s} {m:9.2f} {m / hbase:8.2f}")

            # 3. the server's CPU
            every = defaults.refresh_interval
            w = args.window
            print(f"\n3. the server process's CPU over {w:g} s windows, in % of one core")
            print(f"{'load':50s} {'requests':>8s} {'cpu %':>7s} {'added':>7s}")
            loads: list[tuple[str, Callable[[], int]]] = [
                (f"1 tab polling /vramlab/kernels every {every:g} s", lambda: poll(server, "/vramlab/kernels", 1, every, w)),
                (f"10 tabs polling /vramlab/kernels every {every:g} s",
                 lambda: poll(server, "/vramlab/kernels", 10, every, w)),
            ]
            if peer:
                loads.append(("1 tab polling /api/metrics/v1 every 5 s (peer)",
                              lambda: poll(server, "/api/metrics/v1", 1, 5.0, w)))
            added: dict[str, float] = {}
            for name, load in loads:
                idle, _ = cpu_window(server, w, None)
                busy, n = cpu_window(server, w, load)
                print(f"{'  idle, just before':50s} {0:8d} {idle:7.2f}")
                print(f"{name:50s} {n:8d} {busy:7.2f} {busy - idle:+7.2f}")
                added[name] = busy - idle
            one = added[loads[0][0]]
            print(f"\none browser's status bar (one visible tab: hidden tabs do not poll) adds {one:.2f}% of one core "
                  f"({'under' if one < 1 else 'NOT under'} the 1% budget); ten visible tabs add "
                  f"{added[loads[1][0]]:.2f}% (one reading per min_interval, but ten HTTP requests)")
            if not peer:
                print("peer: jupyter-resource-usage is not installed (pip install -e \".[bench]\"): its rows are left out")
            else:
                print("peer: jupyter-resource-usage (the real one), its server extension on the same server")
        finally:
            server.stop()


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from _doc import recording, write_flag

    with recording("bench_lab", write_flag()):  # --write-doc: the output goes into docs/benchmarks.md
        main()
