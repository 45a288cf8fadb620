import csv
import json

import pytest

from vramlab.runtime.history import history


def test_export_json_and_csv(tmp_path, recorded_history):
    h = recorded_history
    p = h.export(tmp_path / "h.json")
    d = json.load(open(p))
    assert len(d["cells"]) == 3 and len(d["samples"]) == 4 and d["markers"][0] == {"time": d["markers"][0]["time"], "kind": "cell", "execution_count": 7}
    p = h.export(tmp_path / "cells.csv")
    rows = list(csv.DictReader(open(p)))
    assert len(rows) == 3 and rows[0]["execution_count"] == "7" and "host_peak_delta" in rows[0]
    p = h.export(tmp_path / "samples.csv", which="samples")
    rows = list(csv.DictReader(open(p)))
    assert len(rows) == 4 and int(rows[0]["rss"]) > 0


def test_export_bad_paths(tmp_path, recorded_history):
    h = recorded_history
    with pytest.raises(ValueError, match="suffix"):
        h.export(tmp_path / "h.txt")
    with pytest.raises(OSError, match="does not exist"):
        h.export(tmp_path / "missing" / "h.csv")


def test_text_table_and_pandas(recorded_history):
    h = recorded_history
    t = h.text()
    assert t.splitlines()[0].split()[:2] == ["cell", "wall"]
    assert len(t.splitlines()) == 4
    try:
        import pandas  # noqa: F401
    except ImportError:
        with pytest.raises(ImportError, match="pandas"):
            h.to_pandas()
    else:
        assert len(h.to_pandas()) == 3


def test_history_function_is_a_frozen_copy():
    h = history()
    assert isinstance(h.cells, tuple) and isinstance(h.samples, tuple)


def _boom_history(recorded_history, error):
    """``recorded_history`` with a second cell whose execution count cannot be written: ``str()`` of it
    (the CSV writer) raises ``error``, and the JSON encoder cannot encode it."""
    import dataclasses

    class Boom:
        def __str__(self):
            raise error

    bad = dataclasses.replace(recorded_history.cells[0], execution_count=Boom())
    return dataclasses.replace(recorded_history, cells=(recorded_history.cells[0], bad))


def _leftovers(folder, name):
    return sorted(p.name for p in folder.iterdir() if p.name != name)


@pytest.mark.parametrize("name", ["h.csv", "h.json"])
def test_a_failed_export_leaves_the_old_file_and_no_temporary(tmp_path, recorded_history, name):
    import errno

    target = tmp_path / name
    recorded_history.export(target)
    good = target.read_bytes()
    h = _boom_history(recorded_history, OSError(errno.ENOSPC, "No space left on device"))
    with pytest.raises((OSError, TypeError)):
        h.export(target)
    assert target.read_bytes() == good
    assert _leftovers(tmp_path, name) == []


@pytest.mark.skipif(not hasattr(__import__("signal"), "SIGXFSZ"), reason="file-size limits are POSIX")
@pytest.mark.slow
def test_a_full_disk_leaves_the_old_file(tmp_path):
    """A file-size limit (the kernel refuses the write, as on a full disk) in a fresh process."""
    import subprocess
    import sys
    import textwrap

    target = tmp_path / "h.json"
    target.write_text('{"old": true}')
    code = textwrap.dedent(f"""
        import resource, signal, sys
        from vramlab.model import History, Sample
        samples = tuple(Sample(time=float(i), rss=i, peak=None, host_used=i, available=i, limit=i, swap_used=None,
                               swap_in=None, swap_out=None, devices=(("cuda:0", i, i, i, i),))
                        for i in range(20000))
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG
        resource.setrlimit(resource.RLIMIT_FSIZE, (4096, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
        try:
            History(cells=(), samples=samples, markers=()).export({str(target)!r})
        except OSError as e:
            print("failed", e.errno)
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("failed"), r.stdout
    assert target.read_text() == '{"old": true}'
    assert _leftovers(tmp_path, "h.json") == []


def test_export_replaces_a_symlink_and_leaves_what_it_pointed_to(tmp_path, recorded_history):
    elsewhere = tmp_path / "elsewhere.csv"
    elsewhere.write_text("precious\n")
    link = tmp_path / "h.csv"
    link.symlink_to(elsewhere)
    recorded_history.export(link)
    assert not link.is_symlink() and "execution_count" in link.read_text()
    assert elsewhere.read_text() == "precious\n"


@pytest.mark.parametrize("mask, mode", [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)])
def test_the_exported_file_mode_follows_the_umask(tmp_path, recorded_history, mask, mode):
    import os
    import stat

    old = os.umask(mask)
    try:
        p = recorded_history.export(tmp_path / "h.json")
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(p).st_mode) == mode
