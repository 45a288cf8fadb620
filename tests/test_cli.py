import json
import os
import signal
import subprocess
import sys
import time


def cli(*args, lang="en", **kw):
    """``python -m vramlab ARGS`` in a child whose language is set, not inherited."""
    env = kw.pop("env", None) or dict(os.environ)
    env["VRAMLAB_LANG"] = lang
    return subprocess.run([sys.executable, "-m", "vramlab", *args], capture_output=True, text=True, timeout=60,
                          env=env, **kw)


def test_prints_text_table():
    r = cli()
    assert r.returncode == 0
    assert "host" in r.stdout and "this process" in r.stdout and "iB" in r.stdout
    # in a terminal "this process" is the command itself: it says so (hardening, small lies)
    assert "this process is the vramlab command itself" in r.stdout


def test_the_human_text_speaks_vramlab_lang_and_the_json_stays_english():
    table = cli(lang="pt-BR")
    assert table.returncode == 0
    assert "este processo" in table.stdout and "this process" not in table.stdout
    helped = cli("--help", lang="pt-BR")
    assert "imprime a leitura em JSON" in helped.stdout and "print the snapshot as JSON" not in helped.stdout
    bad = cli("--watch", "x", lang="pt-BR")
    assert bad.returncode == 2 and "aceita um número de segundos" in bad.stderr and "Traceback" not in bad.stderr
    pt, en = json.loads(cli("--json", lang="pt-BR").stdout), json.loads(cli("--json").stdout)
    assert pt.keys() == en.keys() and pt["host"].keys() == en["host"].keys()  # what programs read stays English
    assert "process_rss" in pt["host"]


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


# --------------------------------------------------------------------------- --prometheus

def _prom(text):
    """{(metric, layer or device): value} and the label sets, parsed by prometheus_client's own parser."""
    from prometheus_client.parser import text_string_to_metric_families

    return [s for fam in text_string_to_metric_families(text) for s in fam.samples]


def _sim_env():
    """The simulated NVIDIA driver (two 80 GiB GPUs) as the child's pynvml."""
    import driver_scenarios as sc

    env = {k: v for k, v in os.environ.items() if k not in ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER")}
    env["PYTHONPATH"] = os.pathsep.join([str(sc.SIM_DIR), str(sc.ROOT)])
    env["VRAMLAB_NVML_SIM"] = json.dumps(sc.two_gpus())
    return env


def test_prometheus_to_stdout_parses_and_the_layers_add_up():
    p = subprocess.Popen([sys.executable, "-m", "vramlab", "--prometheus"], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, env=_sim_env(),
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    out, err = p.communicate(timeout=60)
    assert p.returncode == 0 and err == "", err
    samples = _prom(out)
    assert {s.labels["pid"] for s in samples} == {str(p.pid)}  # the process whose snapshot it is
    totals = {s.labels["device"]: s.value for s in samples if s.name == "vramlab_device_total_bytes"}
    assert totals == {"cuda:0": 80 * (1 << 30), "cuda:1": 80 * (1 << 30)}  # the simulated cards
    for dev, total in totals.items():
        assert sum(s.value for s in samples if s.name == "vramlab_device_layer_bytes"
                   and s.labels["device"] == dev) == total
    [limit] = [s.value for s in samples if s.name == "vramlab_host_limit_bytes"]
    assert sum(s.value for s in samples if s.name == "vramlab_host_layer_bytes") == limit > 0


def test_prometheus_file_is_written_with_nothing_printed(tmp_path):
    path = tmp_path / "vramlab.prom"
    r = cli("--prometheus", str(path), "--prometheus-label", "slurm_job_id=42")
    assert r.returncode == 0 and r.stdout == "" and r.stderr == "", r.stderr
    samples = _prom(path.read_text())
    assert any(s.name == "vramlab_host_layer_bytes" for s in samples)
    assert all(s.labels["slurm_job_id"] == "42" for s in samples)
    assert os.listdir(tmp_path) == ["vramlab.prom"]


def test_prometheus_bad_usage_is_one_message_and_status_2():
    for args, says in ((["--prometheus", "--json"], "not allowed with"),
                       (["--prometheus-label", "a=b"], "only with --prometheus"),
                       (["--prometheus", "--prometheus-label", "novalue"], "expected KEY=VALUE"),
                       (["--prometheus", "--prometheus-label", "pid=1"], "set by vramlab itself")):
        r = cli(*args)
        assert r.returncode == 2, args
        assert says in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_prometheus_unwritable_file_is_one_line_and_status_1(tmp_path):
    r = cli("--prometheus", str(tmp_path / "no" / "such" / "dir.prom"))
    assert r.returncode == 1
    assert r.stderr.strip().splitlines() == [r.stderr.strip()] and "cannot write" in r.stderr
    assert "Traceback" not in r.stderr


def test_prometheus_file_not_named_prom_gets_a_note(tmp_path):
    r = cli("--prometheus", str(tmp_path / "vramlab.txt"))
    assert r.returncode == 0 and "*.prom" in r.stderr
    assert _prom((tmp_path / "vramlab.txt").read_text())


def test_without_prometheus_client_one_line_says_what_to_install_and_status_2(tmp_path):
    path = tmp_path / "vramlab.prom"
    code = ("import runpy, sys\n"
            "sys.modules['prometheus_client'] = None\n"  # import prometheus_client raises ImportError
            f"sys.argv = ['vramlab', '--prometheus', {str(path)!r}]\n"
            "runpy.run_module('vramlab', run_name='__main__', alter_sys=True)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                       preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert "needs prometheus_client" in lines[0] and "pip install 'vramlab[prometheus]'" in lines[0]
    assert r.stdout == "" and not path.exists()


def test_watch_rewrites_the_prometheus_file_and_stops_cleanly_on_sigterm(tmp_path):
    from waiting import wait_for

    path = tmp_path / "vramlab.prom"

    def stamp():
        try:
            text = path.read_text()
        except FileNotFoundError:
            return None
        return [s.value for s in _prom(text) if s.name == "vramlab_snapshot_timestamp_seconds"][0]

    # in the background of a non-interactive shell: SIGINT ignored, SIGTERM is how it stops
    p = subprocess.Popen([sys.executable, "-m", "vramlab", "--prometheus", str(path), "--watch", "0.2"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    try:
        assert wait_for(lambda: stamp() is not None, timeout=60), p.stderr.read() if p.poll() is not None else ""
        first = stamp()
        assert wait_for(lambda: stamp() != first, timeout=60)  # rewritten: a later snapshot
        p.send_signal(signal.SIGTERM)
        out, err = p.communicate(timeout=30)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 0, err
    assert "Traceback" not in err and out == ""
    assert os.listdir(tmp_path) == ["vramlab.prom"]  # no temporary file left behind
    assert stamp() >= first


def test_sigterm_inside_a_probes_except_exception_still_stops_the_watch():
    """The start-up race: SIGTERM lands while a probe is inside ``try: ... except Exception``
    (its fallback for an unreadable source). The watch must stop with status 0, not take the
    signal for a failed reading and go on."""
    code = (
        "import os, signal, sys, time\n"
        "from vramlab import cli\n"
        "calls = []\n"
        "def reading():\n"
        "    calls.append(1)\n"
        "    if len(calls) > 3:\n"
        "        print('KEPT RUNNING'); sys.exit(3)\n"
        "    try:\n"
        "        os.kill(os.getpid(), signal.SIGTERM)\n"
        "        time.sleep(10)  # the handler runs here, inside the probe's try\n"
        "    except Exception:\n"
        "        pass  # the probe's fallback\n"
        "    return 'a reading'\n"
        "args = cli.build_parser().parse_args(['--watch', '0.01'])\n"
        "status = cli._run(reading, args)\n"
        "print('STATUS', status, 'READINGS', len(calls))\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                       preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    assert "KEPT RUNNING" not in r.stdout, r.stdout
    assert r.returncode == 0 and "STATUS 0 READINGS 1" in r.stdout, (r.returncode, r.stdout, r.stderr)


class _Render:
    """A stand-in for the CLI's output: runs ``steps`` in turn (a callable, or an OSError to
    raise), then stops the watch as a SIGTERM handler would."""

    def __init__(self, path, steps):
        self.path, self.steps, self.calls = path, list(steps), 0

    def __call__(self):
        from vramlab import cli

        self.calls += 1
        step = self.steps.pop(0) if self.steps else None
        if step is None:
            cli._TERMINATED.set()
            return None
        if isinstance(step, BaseException):
            raise step
        return step()


def _args(**kw):
    import argparse

    return argparse.Namespace(**{"watch": 0.01, "json": False, **kw})


def test_a_sigterm_whose_exception_was_lost_still_stops_the_watch():
    """CPython drops an exception that a signal handler raises while it compiles a lazily
    imported module (hardening, finding 2): the handler's flag stops the loop anyway."""
    from vramlab import cli

    def handler_whose_exception_vanished():
        cli._TERMINATED.set()  # what _terminated does before it raises
        return None

    render = _Render(None, [handler_whose_exception_vanished, lambda: None, lambda: None])
    assert cli._run(render, _args()) == 0
    assert render.calls == 1, "no reading after the signal"


def test_a_full_disk_keeps_the_exporter_running_says_so_once_and_recovers(tmp_path, capsys):
    """--prometheus FILE --watch on a momentarily full disk (hardening, finding 4): the old file
    stays, one line says so, the exporter tries again and says when it writes again."""
    import errno

    from vramlab import cli

    full = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    path = str(tmp_path / "vram.prom")
    render = _Render(path, [full, full, full, lambda: None])
    assert cli._run(render, _args()) == 0
    err = capsys.readouterr().err
    assert err.count("No space left on device") == 1 and "kept" in err
    assert err.count("is written again") == 1
    assert render.calls == 5
