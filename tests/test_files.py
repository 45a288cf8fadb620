"""vramlab.files: the one atomic writer (the history export and the Prometheus text file use it)."""

from __future__ import annotations

import errno
import os
import subprocess
import sys

import pytest

from vramlab.files import write_atomically


def _dead_pid() -> int:
    """The id of a process that has exited (waited for, so it is not reused in this instant)."""
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_a_write_replaces_the_file_whole_and_leaves_no_temporary(tmp_path):
    path = tmp_path / "out.json"
    path.write_text("old")
    write_atomically(str(path), b"new")
    assert path.read_bytes() == b"new" and os.listdir(tmp_path) == ["out.json"]


def test_a_temporary_left_by_a_killed_writer_is_removed_at_the_next_write(tmp_path):
    path = tmp_path / "vramlab.prom"
    stale = tmp_path / f".vramlab.prom.{_dead_pid()}.abc123.tmp"
    stale.write_text("half a fil")
    running = tmp_path / f".vramlab.prom.{os.getppid()}.def456.tmp"  # a writer that still runs
    running.write_text("in progress")
    other = tmp_path / f".other.prom.{_dead_pid()}.ghi789.tmp"  # another file's: not ours to judge
    other.write_text("x")
    write_atomically(str(path), b"metric 1\n")
    assert sorted(os.listdir(tmp_path)) == sorted(["vramlab.prom", running.name, other.name])


def test_a_failed_write_names_the_path_keeps_the_errno_and_leaves_the_old_file(tmp_path, monkeypatch):
    path = tmp_path / "out.csv"
    path.write_text("old")

    def full(fd, data):  # type: ignore[no-untyped-def]
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "write", full)
    with pytest.raises(OSError) as e:
        write_atomically(str(path), b"new")
    assert e.value.errno == errno.ENOSPC and "out.csv" in str(e.value)
    monkeypatch.undo()
    assert path.read_text() == "old" and os.listdir(tmp_path) == ["out.csv"]


def test_an_interrupt_leaves_no_temporary(tmp_path, monkeypatch):
    path = tmp_path / "out.json"

    def interrupted(fd):  # type: ignore[no-untyped-def]
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "fsync", interrupted)
    with pytest.raises(KeyboardInterrupt):
        write_atomically(str(path), b"{}")
    monkeypatch.undo()
    assert os.listdir(tmp_path) == []
