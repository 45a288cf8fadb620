"""The cgroup parser, on copies of real ``/proc`` and cgroup files (``fixtures/cgroup``)."""

from pathlib import Path

import pytest

from vramlab.probes.cgroup import CgroupFiles, find_cgroup_limit, parse_cgroup_limit, parse_inactive_file, working_set

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
    # the usage set against the limit is the limiting ancestor's, not the leaf's own charge
    assert lim.usage == 1073741824


def test_no_memory_controller_gives_none():
    cg = "0::/\n"
    mi = "31 26 0:26 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n"
    assert find_cgroup_limit(cg, mi, read=lambda p: None, exists=lambda p: True) is None


def _fixture_file(case, path):
    return int((FIX / case / "fs" / path.lstrip("/")).read_text())


def _fixture_stat(case, path, key):
    for line in (FIX / case / "fs" / path.lstrip("/")).read_text().splitlines():
        k, _, v = line.partition(" ")
        if k == key:
            return int(v)
    raise KeyError(key)


def _v1_dirs():
    leaf = (FIX / "v1_ancestor_sibling" / "proc_self_cgroup").read_text().split("memory:")[1].splitlines()[0]
    parent = leaf.rsplit("/", 1)[0]
    return "/sys/fs/cgroup/memory" + parent, "/sys/fs/cgroup/memory" + leaf


def test_parse_inactive_file_v1_takes_the_hierarchical_count_v2_the_plain_one():
    v1 = "cache 10\ninactive_file 0\nactive_file 7\ntotal_inactive_file 4096\n"
    assert parse_inactive_file(v1, 1) == 4096
    assert parse_inactive_file("inactive_file 512\n", 1) == 512
    assert parse_inactive_file(b"anon 1\ninactive_file 2048\nactive_file 3\n", 2) == 2048
    assert parse_inactive_file("anon 1\n", 2) is None
    assert working_set(1000, 300) == 700 and working_set(100, 300) == 0
    assert working_set(1000, None) == 1000 and working_set(None, 5) is None


def test_v1_limit_on_an_ancestor_counts_the_siblings_and_not_their_inactive_cache():
    """Real files: the limit is on the parent; a sibling holds 300 MiB and 200 MiB of page cache."""
    case = "v1_ancestor_sibling"
    parent, leaf = _v1_dirs()
    lim = find_cgroup_limit(*_fixture_reader(case))
    assert lim.version == 1 and lim.limit == _fixture_file(case, parent + "/memory.limit_in_bytes")
    assert lim.usage == _fixture_file(case, parent + "/memory.usage_in_bytes")
    leaf_usage = _fixture_file(case, leaf + "/memory.usage_in_bytes")
    assert lim.usage > leaf_usage + (300 << 20)  # the sibling's charge is in it
    inactive = _fixture_stat(case, parent + "/memory.stat", "total_inactive_file")
    assert inactive > 150 << 20  # the sibling's file, still in the page cache
    assert lim.inactive_file == inactive
    assert lim.working_set == lim.usage - inactive


def test_v2_limit_on_a_slice_counts_the_other_kernel_and_not_the_inactive_cache():
    case = "v2_slice_sibling"
    slice_ = "/sys/fs/cgroup/jupyter.slice/jupyter-alice.slice"
    lim = find_cgroup_limit(*_fixture_reader(case))
    assert lim.version == 2 and lim.limit == _fixture_file(case, slice_ + "/memory.max")
    assert lim.source == "cgroup v2 memory.max (/jupyter.slice/jupyter-alice.slice)"
    assert lim.usage == _fixture_file(case, slice_ + "/memory.current")
    assert lim.inactive_file == _fixture_stat(case, slice_ + "/memory.stat", "inactive_file")
    assert lim.working_set == lim.usage - lim.inactive_file


@pytest.mark.parametrize("case", ["v1_ancestor_sibling", "v2_slice_sibling"])
def test_the_live_reader_gives_the_limiting_cgroups_working_set(case):
    cg, mi, read, exists = _fixture_reader(case)
    found = find_cgroup_limit(cg, mi, read, exists)

    def read_bytes(path):
        text = read(path)
        return None if text is None else text.encode()

    files = CgroupFiles(texts=(cg, mi), read_text=read, read_bytes=read_bytes, exists=exists)
    limit, usage, source = files.read()
    assert (limit, source) == (found.limit, found.source)
    assert usage == found.working_set < found.usage


def test_without_a_stat_file_the_working_set_is_the_charge():
    cg, mi, read, exists = _fixture_reader("v2_nested")
    lim = find_cgroup_limit(cg, mi, read, exists)
    assert lim.inactive_file is None and lim.stat_file is None
    assert lim.working_set == lim.usage
