"""vramlab.distributed: every rank's figures gathered to rank 0 (gloo on CPU, 2 and 4 real
processes, each under its own VirtualGPU), the table, and the errors before any gather."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from vramlab.distributed import DistributedReport, RankReport
from vramlab.units import format_bytes

ROOT = Path(__file__).resolve().parent.parent
MiB = 2**20

# The ranks of torchrun-like jobs. One launcher imports torch and vramlab once, then forks each
# rank (importing torch once per rank would cost seconds each on a small CI machine); every rank
# sets torchrun's variables (RANK / LOCAL_RANK / WORLD_SIZE) in its own environment and meets the
# others at a rendezvous file, so no port has to be free. Rank r allocates (r + 1) MiB under a
# VirtualGPU, frees it and keeps 1 KiB: its peak is (r + 1) MiB exactly, its allocated 1 KiB.
LAUNCHER = textwrap.dedent("""
    import json, os, signal, sys, time, traceback
    from datetime import timedelta
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    import torch
    import torch.distributed as dist
    import vramlab
    import vramlab.distributed as vd
    from vramlab.sim.virtual_gpu import VirtualGPU

    def _no_pickle(*args, **kwargs):
        raise AssertionError("report() must not pickle: an object collective was called")

    for _name in ("all_gather_object", "gather_object", "broadcast_object_list", "scatter_object_list"):
        setattr(dist, _name, _no_pickle)  # every rank: report() sends numbers only

    with VirtualGPU("1GiB"):  # the first tensor under a VirtualGPU imports much of torch: once, here
        torch.empty(1)
    print("threads before forking:", __import__("threading").active_count(), flush=True)

    def rank_main(rank, world, job_dir):
        dist.init_process_group("gloo", init_method="file://" + os.path.join(job_dir, "rendezvous"),
                                rank=rank, world_size=world, timeout=timedelta(seconds=60))
        found = {"pid": os.getpid()}
        try:
            with VirtualGPU("1GiB") as gpu:
                found["name"] = gpu.name
                x = torch.empty((rank + 1) * 2**20, dtype=torch.uint8)
                del x
                keep = torch.empty(1024, dtype=torch.uint8)
                first = vd.report()  # rank 0 prints the table
                found["first"] = first.to_dict() if first is not None else None
                found["everywhere"] = vd.report(all_ranks=True, print_table=False).to_dict()
                vd.reset_peaks()
                found["after_reset"] = vd.report(all_ranks=True, print_table=False).to_dict()
            found["cpu"] = vd.report(all_ranks=True, print_table=False).to_dict()
        finally:
            dist.destroy_process_group()
        with open(os.path.join(job_dir, f"rank{rank}.json"), "w") as f:
            json.dump(found, f)

    out_dir, deadline = sys.argv[1], time.monotonic() + float(sys.argv[2])
    jobs = {}
    for world in map(int, sys.argv[3:]):
        job_dir = os.path.join(out_dir, f"world{world}")
        os.mkdir(job_dir)
        pids = []
        for rank in range(world):
            pid = os.fork()
            if pid == 0:  # the rank: its own stdout, torchrun's variables
                code = 1
                try:
                    fd = os.open(os.path.join(job_dir, f"rank{rank}.out"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
                    os.dup2(fd, 1)
                    os.dup2(fd, 2)
                    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world),
                                      LOCAL_WORLD_SIZE=str(world))
                    rank_main(rank, world, job_dir)
                    code = 0
                except BaseException:
                    traceback.print_exc()
                finally:
                    sys.stdout.flush()
                    sys.stderr.flush()
                    os._exit(code)
            pids.append(pid)
        codes = {}
        while len(codes) < world and time.monotonic() < deadline:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid:
                codes[pid] = os.waitstatus_to_exitcode(status)
            else:
                time.sleep(0.02)
        for pid in pids:
            if pid not in codes:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                codes[pid] = "hung"
        jobs[world] = [{"pid": pid, "exit": codes[pid]} for pid in pids]
    with open(os.path.join(out_dir, "jobs.json"), "w") as f:
        json.dump(jobs, f)
""")
WORLDS = (2, 4)


def _launcher_env() -> dict[str, str]:
    """An explicit environment: what Python needs, CPU only, gloo on the loopback interface."""
    env = {k: os.environ[k] for k in ("PATH", "HOME", "TMPDIR", "LANG", "LC_ALL") if k in os.environ}
    env.update(PYTHONPATH=str(ROOT), PYTHONDONTWRITEBYTECODE="1", PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1",
               CUDA_VISIBLE_DEVICES="")
    if sys.platform.startswith("linux"):
        env["GLOO_SOCKET_IFNAME"] = "lo"
    elif sys.platform == "darwin":
        env["GLOO_SOCKET_IFNAME"] = "lo0"
    return env


@pytest.fixture(scope="module")
def jobs(tmp_path_factory):
    """``{world: (each rank's findings, each rank's stdout, each rank's pid)}`` for 2 and 4 ranks.

    A rank that fails or hangs past the deadline fails the tests; no process outlives the fixture.
    """
    pytest.importorskip("torch")
    if not hasattr(os, "fork"):
        pytest.skip("the launcher forks its ranks (POSIX)")
    out = tmp_path_factory.mktemp("jobs")
    script = out / "launcher.py"
    script.write_text(LAUNCHER)
    deadline = 120
    p = subprocess.Popen([sys.executable, str(script), str(out), str(deadline), *map(str, WORLDS)], cwd=out,
                         env=_launcher_env(), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True, start_new_session=True,
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        log, _ = p.communicate(timeout=deadline + 60)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        p.communicate()
        pytest.fail("the launcher of the ranks did not finish")
    assert p.returncode == 0, log
    launched = json.loads((out / "jobs.json").read_text())
    result = {}
    for world in WORLDS:
        d = out / f"world{world}"
        ranks = launched[str(world)]
        stdout = [(d / f"rank{r}.out").read_text() for r in range(world)]
        for r, rank in enumerate(ranks):
            assert rank["exit"] == 0, f"rank {r} of {world}: {rank['exit']}\n{stdout[r]}"
        found = [json.loads((d / f"rank{r}.json").read_text()) for r in range(world)]
        result[world] = (found, stdout, [rank["pid"] for rank in ranks])
    return result


def _report(d: dict) -> DistributedReport:
    return DistributedReport(ranks=tuple(RankReport(**r) for r in d["ranks"]), backend=d["backend"])


@pytest.mark.slow
@pytest.mark.parametrize("world", WORLDS)
def test_rank_zero_gets_every_ranks_own_figures(jobs, world):
    found, stdout, pids = jobs[world]
    first = found[0]["first"]
    assert first["world_size"] == world and first["backend"] == "gloo"
    ranks = first["ranks"]
    assert [r["rank"] for r in ranks] == list(range(world))
    assert [r["local_rank"] for r in ranks] == list(range(world))  # from LOCAL_RANK, as torchrun sets it
    for r, row in enumerate(ranks):
        assert row["device"] == "virtual"
        assert row["device_name"] == found[r]["name"]
        assert row["uuid"] is None
        assert row["peak"] == (r + 1) * MiB  # its own allocation, not rank 0's
        assert row["allocated"] == 1024
        assert row["reserved"] is None
        assert row["host_rss"] > 0
        assert row["host_peak"] is None or row["host_peak"] >= row["host_rss"]
        assert row["hostname"] == socket.gethostname()
    assert [row["pid"] for row in ranks] == pids == [f["pid"] for f in found]
    assert len(set(pids)) == world

    # rank 0 printed the table, the others printed nothing and got None
    table = _report(first).text()
    assert table in stdout[0]
    assert f"{world} ranks (backend gloo)" in table
    assert f"highest device peak: rank {world - 1} (virtual), {format_bytes(world * MiB)}" in table
    for r in range(1, world):
        assert found[r]["first"] is None
        assert stdout[r] == ""

    # all_ranks=True: every rank holds the same report
    assert all(f["everywhere"] == found[0]["everywhere"] for f in found)
    assert [row["peak"] for row in found[0]["everywhere"]["ranks"]] == [(r + 1) * MiB for r in range(world)]


@pytest.mark.slow
def test_reset_peaks_and_cpu_only_ranks(jobs):
    found, _, _ = jobs[2]
    after = found[0]["after_reset"]["ranks"]
    for row in after:  # the peak restarted from what each rank held at the reset
        assert row["device"] == "virtual"
        assert row["peak"] == row["allocated"] < MiB
    cpu = found[0]["cpu"]["ranks"]  # after the VirtualGPU's context: no device in use
    for row in cpu:
        assert row["device"] == "cpu"
        assert (row["device_name"], row["uuid"], row["peak"], row["allocated"], row["reserved"]) == (None,) * 5
        assert row["host_rss"] > 0
    assert "no rank knows a device peak" in _report(found[0]["cpu"]).text()


def test_without_a_process_group_one_clear_error():
    pytest.importorskip("torch")
    import torch.distributed as dist

    import vramlab.distributed as vd

    if dist.is_initialized():
        pytest.skip("a process group is initialised in this test process")
    with pytest.raises(RuntimeError) as e:
        vd.report()
    msg = str(e.value)
    assert "\n" not in msg
    assert "init_process_group()" in msg and "vramlab.distributed.report()" in msg
    vd.reset_peaks()  # local: needs no process group


def test_without_torch_missing_extra(monkeypatch):
    from vramlab._extras import MissingExtra
    import vramlab.distributed as vd

    monkeypatch.setitem(sys.modules, "torch", None)  # `import torch` now fails as if not installed
    with pytest.raises(MissingExtra) as e:
        vd.report()
    assert "vramlab.distributed.report() needs PyTorch" in str(e.value)
    assert "\n" not in str(e.value)


def test_importing_costs_nothing():
    code = ("import json, sys, vramlab, vramlab.distributed; "
            "print(json.dumps(sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.'))))")
    env = {k: os.environ[k] for k in ("PATH", "HOME", "LANG") if k in os.environ}
    env.update(PYTHONPATH=str(ROOT), PYTHONDONTWRITEBYTECODE="1")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env,
                       cwd=ROOT, stdin=subprocess.DEVNULL,
                       preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == []  # neither torch nor torch.distributed


def _rank(rank: int, **kw) -> RankReport:
    base = dict(rank=rank, local_rank=rank, hostname="node<1>", pid=100 + rank, device="cpu", device_name=None,
                uuid=None, peak=None, allocated=None, reserved=None, host_rss=300 * MiB, host_peak=310 * MiB,
                time=1.0)
    base.update(kw)
    return RankReport(**base)


def test_the_table_is_fixed_width_and_leaves_out_unknown_uuids():
    rep = DistributedReport(ranks=(
        _rank(0, device="cuda:0", uuid="GPU-0a1b2c3d-1111-2222-3333-444455556666", peak=3 * MiB,
              allocated=2 * MiB, reserved=4 * MiB),
        _rank(1, local_rank=None, host_peak=None),
    ), backend="nccl")
    lines = rep.text().splitlines()
    assert lines[0] == "vramlab.distributed.report: 2 ranks (backend nccl)"
    header, rows = lines[1], lines[2:4]
    assert header.split() == ["rank", "local", "host", "pid", "device", "uuid", "peak", "allocated", "reserved",
                              "RSS", "peak", "RSS"]
    assert {len(header)} == {len(r) for r in rows}  # one width for every line of the table
    assert "GPU-0a1b2c3d-1111-2222-3333-444455556666" in rows[0]
    assert format_bytes(3 * MiB) in rows[0] and format_bytes(4 * MiB) in rows[0]
    assert rows[1].split()[1] == "n/a" and rows[1].count("n/a") == 6  # local, uuid, 3 device figures, peak RSS
    assert lines[-1] == f"highest device peak: rank 0 (cuda:0), {format_bytes(3 * MiB)}"
    assert rep.max_peak() is rep.ranks[0]

    no_uuid = DistributedReport(ranks=(_rank(0),), backend="gloo")
    assert "uuid" not in no_uuid.text().splitlines()[1].split()
    assert "1 rank (backend gloo)" in no_uuid.text()


def test_to_dict_and_mimebundle():
    rep = DistributedReport(ranks=(_rank(0, device="virtual", device_name="T4", peak=5, allocated=1),), backend="gloo")
    d = rep.to_dict()
    assert json.loads(json.dumps(d)) == d
    assert d["world_size"] == 1 and d["ranks"][0]["peak"] == 5
    assert _report(d) == rep
    bundle = rep._repr_mimebundle_()
    assert bundle["text/plain"] == rep.text() == str(rep)
    assert "node&lt;1&gt;" in bundle["text/html"] and "node<1>" not in bundle["text/html"]
    assert repr(rep) == "<vramlab.DistributedReport 1 rank, backend gloo>"


class _FakeCuda:
    """torch.cuda as far as the device choice reads it (no GPU here: the logic only)."""

    def __init__(self, n: int, current: int = 0, initialised: bool = True) -> None:
        self.n, self.current, self.initialised, self.entered = n, current, initialised, []

    def is_initialized(self) -> bool:
        return self.initialised

    def is_available(self) -> bool:
        return self.n > 0

    def device_count(self) -> int:
        return self.n

    def current_device(self) -> int:
        assert self.initialised, "current_device() would initialise CUDA"
        return self.current

    def device(self, i: int):
        import contextlib

        @contextlib.contextmanager
        def guard():
            before, self.current = self.current, i
            self.entered.append(i)
            try:
                yield
            finally:
                self.current = before
        return guard()


class _FakeTorch:
    def __init__(self, cuda: _FakeCuda) -> None:
        self.cuda = cuda


@pytest.mark.parametrize("n, current, local_rank, initialised, initialise, expected", [
    (4, 0, 2, True, False, 2),      # never called set_device: the rank's GPU is cuda:LOCAL_RANK
    (4, 3, 1, True, False, 3),      # set_device chose another GPU: respected
    (4, 0, 0, True, False, 0),
    (1, 0, 3, True, False, 0),      # one GPU per process (CUDA_VISIBLE_DEVICES): it is cuda:0
    (4, 0, None, True, False, 0),   # not under torchrun
    (4, 0, 2, False, False, None),  # CUDA not in use: not initialised for a reading
    (4, 0, 2, False, True, 2),      # an NCCL gather will initialise it: on the rank's own GPU
    (1, 0, 2, False, True, 0),
])
def test_the_ranks_cuda_device(n, current, local_rank, initialised, initialise, expected):
    from vramlab.distributed import _cuda_index

    torch = _FakeTorch(_FakeCuda(n, current, initialised))
    assert _cuda_index(torch, local_rank, initialise=initialise) == expected


@pytest.mark.parametrize("backend, on_cuda", [
    ("nccl", True), ("cuda:nccl", True), ("gloo", False), ("cpu:gloo,cuda:nccl", False), ("mpi", False)])
def test_nccl_gathers_on_the_ranks_own_gpu(monkeypatch, backend, on_cuda):
    torch = pytest.importorskip("torch")
    from vramlab.distributed import _gather

    cuda = _FakeCuda(4, current=0)
    seen, moved = [], []

    class Torch(_FakeTorch):  # real tensors, a fake torch.cuda; "moving to cuda:i" is recorded
        tensor, int64, zeros_like = staticmethod(torch.tensor), torch.int64, staticmethod(torch.zeros_like)

        @staticmethod
        def device(kind, i):
            moved.append((kind, i))
            return torch.device("cpu")

    class Dist:
        def get_backend(self, group=None):
            return backend

        def all_gather(self, out, t, group=None):
            seen.append(cuda.current)
            for o in out:
                o.copy_(t)

    monkeypatch.setenv("LOCAL_RANK", "2")
    rep = _rank(0)
    assert _gather(Torch(cuda), Dist(), None, rep, 1) == [rep]
    assert seen == ([2] if on_cuda else [0])
    assert cuda.entered == ([2] if on_cuda else [])
    assert moved == ([("cuda", 2)] if on_cuda else [])
    assert cuda.current == 0  # the script's current device is left as it was


# --------------------------------------------------------------------------- the wire format


def test_a_report_travels_as_numbers_and_comes_back_whole():
    from vramlab.distributed import _WORDS, _decode, _encode

    rep = _rank(3, device="cuda:1", device_name="NVIDIA H200 <x>", uuid="GPU-0a1b2c3d-1111-2222-3333-444455556666",
                peak=2**40 + 3, allocated=0, reserved=None, local_rank=None, time=1733240000.25)
    words = _encode(rep)
    assert len(words) == _WORDS and all(isinstance(w, int) and -2**63 <= w < 2**63 for w in words)
    assert _decode(words, 3, "f") == rep
    long = _rank(0, hostname="é" * 200)  # 400 bytes of UTF-8: cut on a character boundary
    back = _decode(_encode(long), 0, "f")
    assert back.hostname == "é" * 128


def _bad_words():
    from vramlab.distributed import _encode

    good = _encode(_rank(1))
    cases = {"garbage": [7] * len(good), "zeros": [0] * len(good), "short": good[:-1]}
    for i, why in ((1, "fields"), (2, "says it is rank")):  # field count; a rank that says it is another
        w = list(good)
        w[i] += 1
        cases[why] = w
    w = list(good)
    w[2 + 3] = -5  # peak
    cases["negative peak"] = w
    w = list(good)
    w[-1] = 1  # a byte after the end of the last text field
    cases["trailing bytes"] = w
    return cases


@pytest.mark.parametrize("case", list(_bad_words()))
def test_what_is_not_a_report_is_one_clear_error(case):
    from vramlab.distributed import RanksOutOfStep, _decode

    with pytest.raises(RanksOutOfStep) as e:
        _decode(_bad_words()[case], 1, "vramlab.distributed.report()")
    msg = str(e.value)
    assert isinstance(e.value, RuntimeError)
    assert "\n" not in msg
    assert msg.startswith("vramlab.distributed.report(): what rank 1 sent is not a report")
    assert "the ranks are out of step" in msg


# A rank out of step: rank 0 is in report() while rank 1 is in another all_gather of the same
# shape (int64 words of garbage, then of zeros). Started by run_ranks (spawned gloo ranks).
def _out_of_step_rank(job):
    import torch
    import torch.distributed as dist

    import vramlab.distributed as vd

    found = []
    for fill in job:
        if dist.get_rank() == 0:
            try:
                vd.report(print_table=False)
                found.append(None)
            except Exception as e:  # noqa: BLE001 (the test reads which)
                found.append((type(e).__name__, isinstance(e, RuntimeError), str(e)))
        else:
            out = [torch.zeros(vd._WORDS, dtype=torch.int64) for _ in range(dist.get_world_size())]
            dist.all_gather(out, torch.full((vd._WORDS,), fill, dtype=torch.int64))
            found.append(None)
    return found


@pytest.mark.slow
def test_a_rank_out_of_step_makes_rank_zero_raise_one_clear_error():
    pytest.importorskip("torch")
    from vramlab.sim.ranks import run_ranks

    zero, one = run_ranks(_out_of_step_rank, [0x0123456789ABCDEF, 0], world_size=2, timeout=120)
    assert one == [None, None]
    for name, is_runtime_error, msg in zero:
        assert (name, is_runtime_error) == ("RanksOutOfStep", True)
        assert "what rank 1 sent is not a report" in msg and "the ranks are out of step" in msg
        assert "\n" not in msg


def test_a_peer_s_strings_are_shown_never_obeyed():
    """A host name with a newline forged a row, and ANSI escapes reached the terminal
    (hardening, finding 5): the table shows them escaped, in text and in HTML."""
    from vramlab.distributed import DistributedReport, RankReport

    def rank(r, host, device="cpu"):
        return RankReport(rank=r, local_rank=r, hostname=host, pid=100 + r, device=device, device_name=None, uuid=None,
                          peak=2**20, allocated=2**20, reserved=None, host_rss=2**30, host_peak=2**30, time=0.0)

    evil = "node\n| 9 | 9 | forged | 1 | cpu |\x1b[2J\x1b[31m\u202e"
    rep = DistributedReport(ranks=(rank(0, "node-0"), rank(1, evil, device="cuda:0\x1b[0m")), backend="gloo")
    text = rep.text()
    assert "\x1b" not in text and "\u202e" not in text
    assert len(text.splitlines()) == len(DistributedReport(ranks=(rank(0, "a"), rank(1, "b")), backend="gloo")
                                         .text().splitlines()), "no forged row"
    assert "node\\n| 9 |" in text and "\\x1b[2J" in text and "\\u202e" in text  # what was sent, visible
    html = rep.html()
    assert "\x1b" not in html and "\n| 9 |" not in html
    assert rep.ranks[1].hostname == evil  # the data keeps what the peer sent
