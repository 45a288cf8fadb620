import json
import os
import signal
import subprocess
import sys
import time


def cli(*args, **kw):
    return subprocess.run([sys.executable, "-m", "vramlab", *args], capture_output=True, text=True, timeout=60, **kw)


def test_prints_text_table():
    r = cli()
    assert r.returncode == 0
    assert "host" in r.stdout and "this process" in r.stdout and "iB" in r.stdout


def test_json():
    r = cli("--json")
    assert r.returncode == 0
    d = json.loads(r.stdout)
    assert d["host"]["process_rss"] > 0


def test_bad_flag_exits_nonzero_with_message():
    r = cli("--frobnicate")
    assert r.returncode == 2
    assert "unrecognized arguments: --frobnicate" in r.stderr
    assert "Traceback" not in r.stderr


def test_bad_watch_interval():
    for bad in ("x", "0", "-1", "nan"):
        r = cli("--watch", bad)
        assert r.returncode == 2, bad
        assert "--watch" in r.stderr and "Traceback" not in r.stderr


def test_watch_refreshes_until_ctrl_c_and_exits_zero():
    # The child gets SIGINT at its default whatever this run inherited: a background job of a
    # non-interactive shell starts with SIGINT ignored, and the Ctrl-C below would never arrive.
    p = subprocess.Popen([sys.executable, "-m", "vramlab", "--watch", "0.2", "--json"], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True,
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        lines = []
        deadline = time.monotonic() + 30
        while len(lines) < 2 and time.monotonic() < deadline:
            lines.append(p.stdout.readline())
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=30)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 0, err
    assert "Traceback" not in err
    t = [json.loads(line)["time"] for line in lines]
    assert t[1] > t[0]


def test_watch_stops_cleanly_on_sigterm_even_with_sigint_ignored():
    # a watch in the background of a non-interactive shell: SIGINT ignored, SIGTERM is how it stops
    p = subprocess.Popen([sys.executable, "-m", "vramlab", "--watch", "0.2", "--json"], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True,
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    try:
        first = p.stdout.readline()
        assert json.loads(first)["time"] > 0
        p.send_signal(signal.SIGTERM)
        out, err = p.communicate(timeout=30)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 0, err
    assert "Traceback" not in err


def test_console_script_entry_point():
    from vramlab.cli import main

    assert main(["--version"]) == 0
