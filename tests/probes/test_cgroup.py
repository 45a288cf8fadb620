"""The cgroup parser, on copies of real ``/proc`` and cgroup files (``fixtures/cgroup``)."""

from pathlib import Path

import pytest

from vramlab.probes.cgroup import find_cgroup_limit, parse_cgroup_limit

FIX = Path(__file__).parent / "fixtures" / "cgroup"


def _fixture_reader(case):
    root = FIX / case / "fs"

    def read(path):
        p = root / path.lstrip("/")
        return p.read_text() if p.is_file() else None

    def exists(path):
        return (root / path.lstrip("/")).is_dir()

    cg = (FIX / case / "proc_self_cgroup").read_text()
    mi = (FIX / case / "proc_self_mountinfo").read_text()
    return cg, mi, read, exists


def test_parse_limit_values():
    assert parse_cgroup_limit("max\n", 2) is None
    assert parse_cgroup_limit("2147483648\n", 2) == 2147483648
    assert parse_cgroup_limit("9223372036854771712\n", 1) is None  # v1 "unlimited"
    assert parse_cgroup_limit("1610612736\n", 1) == 1610612736
    with pytest.raises(ValueError):
        parse_cgroup_limit("lots\n", 2)


def test_v1_copy_without_limit():
    lim = find_cgroup_limit(*_fixture_reader("v1_container"))
    assert lim is not None and lim.version == 1
    assert lim.limit is None  # 9223372036854771712 everywhere
    assert lim.usage and lim.usage > 0


def test_v1_copy_with_limit_in_child_cgroup():
    lim = find_cgroup_limit(*_fixture_reader("v1_limited"))
    assert lim.version == 1
    assert lim.limit == 1610612736
    assert "memory.limit_in_bytes" in lim.source and lim.source.endswith("vramlab_fixture)")


def test_v2_container_namespace_root():
    lim = find_cgroup_limit(*_fixture_reader("v2_container"))
    assert lim.version == 2
    assert lim.limit == 2147483648
    assert lim.usage == 734003200
    assert lim.source == "cgroup v2 memory.max (/)"


def test_v2_nested_limit_comes_from_ancestor_and_max_means_none():
    lim = find_cgroup_limit(*_fixture_reader("v2_nested"))
    assert lim.limit == 8589934592
    assert lim.source == "cgroup v2 memory.max (/user.slice/user-1000.slice)"
    assert lim.usage == 52428800  # the leaf's own charge


def test_no_memory_controller_gives_none():
    cg = "0::/\n"
    mi = "31 26 0:26 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n"
    assert find_cgroup_limit(cg, mi, read=lambda p: None, exists=lambda p: True) is None
