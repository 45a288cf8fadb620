import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from vramlab.probes import host
from vramlab.probes.host import descendant_pids, read_children, read_host, read_uss, reset_peak_rss

linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux /proc")


def _kb(path, key):
    for line in Path(path).read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    raise KeyError(key)


def _close(a, b, rel=0.01):
    return abs(a - b) <= rel * max(abs(b), 1)


@linux
def test_system_figures_agree_with_proc_meminfo():
    r = read_host()
    assert r.total == _kb("/proc/meminfo", "MemTotal")
    assert _close(r.used, r.total - _kb("/proc/meminfo", "MemAvailable"))
    assert _close(r.swap_total, _kb("/proc/meminfo", "SwapTotal"))
    assert r.swap_used == r.swap_total - _kb("/proc/meminfo", "SwapFree") or _close(
        r.swap_used, r.swap_total - _kb("/proc/meminfo", "SwapFree"))
    if r.limit_source == "physical RAM":
        assert _close(r.available, _kb("/proc/meminfo", "MemAvailable"))


@linux
def test_process_figures_agree_with_proc_self_status():
    r = read_host()
    assert _close(r.process_rss, _kb("/proc/self/status", "VmRSS"))
    assert r.peak_exact
    assert _close(r.process_peak, _kb("/proc/self/status", "VmHWM"))
    assert r.process_peak >= r.process_rss * 0.99


@linux
def test_swap_counters_agree_with_vmstat():
    r = read_host()
    vm = dict(line.split() for line in Path("/proc/vmstat").read_text().splitlines())
    page = os.sysconf("SC_PAGE_SIZE")
    assert r.swap_in == int(vm["pswpin"]) * page
    assert r.swap_out == int(vm["pswpout"]) * page


def test_agrees_with_psutil():
    import psutil

    r = read_host()
    vm = psutil.virtual_memory()
    assert r.total == vm.total
    assert _close(r.process_rss, psutil.Process().memory_info().rss, rel=0.05)


@linux
def test_uss_is_private_pages():
    import psutil

    uss = read_uss()
    assert uss is not None
    assert _close(uss, psutil.Process().memory_full_info().uss, rel=0.05)
    assert read_host(uss=True).process_uss is not None
    assert read_host().process_uss is None


@linux
def test_peak_rises_and_resets():
    import numpy as np

    if not reset_peak_rss():
        pytest.skip("clear_refs not writable here")
    start = read_host()
    block = np.ones(200 * 2**20 // 8)  # 200 MiB, touched
    del block
    high = read_host()
    assert high.process_peak - start.process_rss >= 190 * 2**20
    assert reset_peak_rss()
    after = read_host()
    assert after.process_peak < high.process_peak - 150 * 2**20
    assert after.process_peak >= after.process_rss


def _cgroup_v1_writable():
    if not sys.platform.startswith("linux") or os.geteuid() != 0:
        return None
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        hid, ctl, path = line.split(":", 2)
        if "memory" in ctl.split(","):
            d = Path("/sys/fs/cgroup/memory") / path.lstrip("/")
            if d.is_dir() and os.access(d, os.W_OK):
                return d
    return None


@pytest.mark.skipif(_cgroup_v1_writable() is None, reason="needs root and a writable cgroup v1 memory hierarchy")
def test_real_cgroup_limit_is_the_effective_limit(tmp_path):
    parent = _cgroup_v1_writable()
    child = parent / f"vramlab_test_{os.getpid()}"
    child.mkdir()
    try:
        (child / "memory.limit_in_bytes").write_text("1610612736")
        code = ("from vramlab.probes.host import read_host; r = read_host(); "
                "print(r.limit, r.limit_source, r.cgroup_usage, r.available)")
        out = subprocess.run(
            ["sh", "-c", f'echo $$ > "{child}/cgroup.procs" && exec "{sys.executable}" -c "{code}"'],
            capture_output=True, text=True, timeout=60, check=True).stdout.split()
        limit, usage, available = int(out[0]), int(out[-2]), int(out[-1])
        assert limit == 1610612736
        assert "cgroup v1 memory.limit_in_bytes" in " ".join(out)
        assert 0 < usage < limit
        assert available <= limit - usage
    finally:
        for _ in range(50):
            try:
                child.rmdir()
                break
            except OSError:
                import time

                time.sleep(0.1)


def _rmdir_retry(d):
    import time

    for _ in range(50):
        try:
            d.rmdir()
            return
        except OSError:
            time.sleep(0.1)


@pytest.mark.skipif(_cgroup_v1_writable() is None, reason="needs root and a writable cgroup v1 memory hierarchy")
@pytest.mark.slow
def test_real_ancestor_limit_counts_a_sibling_but_not_its_inactive_page_cache(tmp_path):
    """A real parent cgroup with a limit and two children: this reader, and a sibling that
    holds 300 MiB and wrote a 200 MiB file. The usage set against the limit is the parent's
    working set: the sibling's 300 MiB are in it, its reclaimable page cache is not."""
    import signal
    import time

    parent = _cgroup_v1_writable() / f"vramlab_test_anc_{os.getpid()}"
    kernel, sibling = parent / "kernel", parent / "sibling"
    parent.mkdir()
    sib = None
    try:
        (parent / "memory.limit_in_bytes").write_text(str(3 << 30))
        kernel.mkdir()
        sibling.mkdir()
        ready = tmp_path / "ready"
        big = tmp_path / "big"
        hold = (f"x = bytearray(300 << 20); x[::4096] = b'1' * len(x[::4096]); "
                f"open({str(big)!r}, 'wb').write(bytes(200 << 20)); open({str(ready)!r}, 'w').close(); "
                "import time; time.sleep(120)")
        env = {k: v for k, v in os.environ.items() if not k.startswith("VRAMLAB_")}
        dfl = lambda: signal.signal(signal.SIGINT, signal.SIG_DFL)  # noqa: E731
        sib = subprocess.Popen(["sh", "-c", f'echo $$ > "{sibling}/cgroup.procs" && exec "{sys.executable}" -c "$0"', hold],
                               env=env, preexec_fn=dfl)
        for _ in range(600):
            if ready.exists():
                break
            time.sleep(0.1)
        assert ready.exists()
        code = ("from vramlab.probes.host import read_host; r = read_host(); "
                "print(r.limit, r.cgroup_usage, r.available, r.process_rss)")
        out = subprocess.run(["sh", "-c", f'echo $$ > "{kernel}/cgroup.procs" && exec "{sys.executable}" -c "{code}"'],
                             capture_output=True, text=True, timeout=60, check=True, env=env, preexec_fn=dfl)
        limit, usage, available, rss = map(int, out.stdout.split())
        charge = int((parent / "memory.usage_in_bytes").read_text())
        stat = dict(line.split() for line in (parent / "memory.stat").read_text().splitlines())
        inactive = int(stat["total_inactive_file"])
        assert limit == 3 << 30
        assert usage >= rss + (300 << 20)  # the sibling's anonymous memory counts against the limit
        if inactive > (100 << 20):  # the kernel kept the sibling's file on the inactive list
            assert usage < charge - (100 << 20) + (64 << 20)  # ... and its cache does not count
        assert available <= limit - usage
    finally:
        if sib is not None:
            sib.kill()
            sib.wait()
        for d in (kernel, sibling, parent):
            if d.exists():
                _rmdir_retry(d)


def test_falls_back_to_psutil(monkeypatch):
    monkeypatch.setattr(host, "_LINUX", False)
    r = read_host()
    assert r.total > 0 and r.process_rss > 0
    assert r.limit_source == "physical RAM"
    assert not r.peak_exact
    assert not reset_peak_rss()


# --------------------------------------------------------------------------- descendants

_GRANDPARENT = """
import os, signal, subprocess, sys, time
g = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], env={"PATH": os.environ.get("PATH", "")},
                     stdin=subprocess.DEVNULL, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
print(g.pid, flush=True)
try:
    sys.stdin.read()  # until the test closes it
finally:
    g.kill()
    g.wait()
"""


@pytest.fixture
def family():
    """A child of this process that has a child of its own: (child pid, grandchild pid)."""
    child = subprocess.Popen([sys.executable, "-c", _GRANDPARENT], env={"PATH": os.environ.get("PATH", "")},
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                             preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        grandchild = int(child.stdout.readline())
        yield child.pid, grandchild
    finally:
        child.stdin.close()
        try:
            child.wait(timeout=20)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()


def _rss(pid):
    import psutil

    return psutil.Process(pid).memory_info().rss


def test_children_are_found_recursively_with_their_rss(family):
    child, grandchild = family
    k = read_children()
    assert child in k.pids and grandchild in k.pids
    assert k.pids.index(child) < k.pids.index(grandchild)  # parents first
    assert k.rss >= _rss(child) // 2 + _rss(grandchild) // 2 and k.uss is None and k.pss is None
    r = read_host()
    assert r.children_count == len(r.children_pids) >= 2 and child in r.children_pids
    assert r.children_uss is None


def test_children_uss_and_pss_only_when_asked(family):
    k = read_children(uss=True)
    assert k.uss is not None and 0 < k.uss < k.rss
    if sys.platform.startswith("linux"):
        assert k.pss is not None and k.uss <= k.pss <= k.rss
    r = read_host(uss=True)
    assert r.children_uss is not None and r.children_count >= 2


def test_children_without_the_proc_children_files_come_from_psutil(family, monkeypatch):
    child, grandchild = family
    monkeypatch.setattr(host, "_PROC_CHILDREN", False)
    k = read_children()
    assert child in k.pids and grandchild in k.pids


def test_no_children_is_zero_not_unknown(monkeypatch):
    monkeypatch.setattr(host, "_list_descendants", lambda: ())
    assert read_children() == host.ChildrenReading()
    k = read_children(uss=True)
    assert (k.pids, k.rss, k.uss, k.pss) == ((), 0, 0, 0)


def test_a_child_that_ended_is_left_out(monkeypatch):
    gone = subprocess.Popen([sys.executable, "-c", "pass"], env={"PATH": os.environ.get("PATH", "")},
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    gone.wait()  # reaped: its PID names no process now
    monkeypatch.setattr(host, "_list_descendants", lambda: (gone.pid,))
    assert read_children(uss=True).pids == ()


def _tree(root, children):
    """A fake /proc: ``children`` maps pid -> {tid: [child pids]}."""
    for pid, threads in children.items():
        for tid, kids in threads.items():
            d = root / str(pid) / "task" / str(tid)
            d.mkdir(parents=True)
            (d / "children").write_text(" ".join(map(str, kids)) + (" " if kids else ""))


def test_descendants_from_the_proc_children_files(tmp_path):
    # 100 has two threads, each with a child; 101 has a child 103; 102 none; 103 none
    _tree(tmp_path, {100: {100: [101], 107: [102]}, 101: {101: [103]}, 102: {102: []}, 103: {103: []}})
    assert descendant_pids(100, proc=str(tmp_path)) == (101, 102, 103)
    # a child that ended between the reads (no /proc entry) is left out of the walk, not an error
    _tree(tmp_path / "b", {1: {1: [2, 9]}, 2: {2: []}})
    assert descendant_pids(1, proc=str(tmp_path / "b")) == (2, 9)


def test_without_the_children_files_the_walk_says_so(tmp_path):
    (tmp_path / "100" / "task" / "100").mkdir(parents=True)  # a task with no children file
    assert descendant_pids(100, proc=str(tmp_path)) is None


# --------------------------------------------------------------------------- another process's tree


def _tree_with_grandchild():
    """A child that starts a grandchild holding 64 MiB; (child, grandchild pid), both asleep."""
    code = ("import subprocess, sys, time\n"
            "g = subprocess.Popen([sys.executable, '-c', 'import time; b = bytearray(b\"x\" * (64 << 20)); "
            "print(1, flush=True); time.sleep(600)'], stdout=subprocess.PIPE)\n"
            "g.stdout.readline(); print(g.pid, flush=True); time.sleep(600)")
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                             preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    return child, int(child.stdout.readline())


def test_a_process_tree_is_read_with_its_descendants():
    from vramlab.probes.host import read_process_tree

    child, grandchild = _tree_with_grandchild()
    try:
        t = read_process_tree(child.pid, uss=True)
        assert t.alive and t.pids == (child.pid, grandchild)
        import psutil

        rss = sum(psutil.Process(p).memory_info().rss for p in t.pids)
        assert _close(t.rss, rss, rel=0.05)
        assert t.rss > 64 << 20 and t.uss is not None and 64 << 20 < t.uss <= t.rss
        assert read_process_tree(child.pid).uss is None
    finally:
        os.kill(grandchild, signal.SIGKILL)
        child.kill()
        child.wait()


def test_a_process_that_ended_reads_as_gone():
    from vramlab.probes.host import read_process_tree

    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    t = read_process_tree(p.pid)
    assert not t.alive and t.pids == () and t.rss == 0
