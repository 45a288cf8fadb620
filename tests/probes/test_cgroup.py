"""The cgroup parser, on copies of real ``/proc`` and cgroup files (``fixtures/cgroup``)."""

import shutil
import sys
from pathlib import Path

import pytest

from vramlab.facts import Note, NoteCode
from vramlab.probes import cgroup, host
from vramlab.probes.cgroup import CgroupFiles, find_cgroup_limit, parse_cgroup_limit, parse_inactive_file, working_set
from vramlab.probes.host import read_host

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
    for bad in ("", "-1", str(2**63), str(2**70), "9" * 100_000, "\u0662", "1e9", "max"):  # "max" is v2's only
        with pytest.raises(ValueError):
            parse_cgroup_limit(bad, 1)


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
    r = files.read()
    assert (r.limit, r.source) == (found.limit, found.source)
    assert r.usage == found.working_set < found.usage
    assert (r.limit_errors, r.usage_error, r.stat_error) == ((), None, None)


def test_without_a_stat_file_the_working_set_is_the_charge():
    cg, mi, read, exists = _fixture_reader("v2_nested")
    lim = find_cgroup_limit(cg, mi, read, exists)
    assert lim.inactive_file is None and lim.stat_file is None
    assert lim.working_set == lim.usage


# --------------------------------------------------------------------------- unreadable files

GiB = 1 << 30
V2_LIMIT = 2 * GiB  # the v2_container fixture's memory.max
CG = "sys/fs/cgroup"  # where the v2_container fixture's files lie, below fs/


def _v2_copy(tmp_path, **files):
    """A copy of the v2_container fixture with ``files`` (name with ``.`` as ``_``) replaced:
    bytes or text as the file's content, ``None`` to remove it."""
    root = tmp_path / "fs"
    shutil.copytree(FIX / "v2_container" / "fs", root)
    for name, content in files.items():
        p = root / CG / name.replace("_", ".")
        if content is None:
            p.unlink()
        elif isinstance(content, bytes):
            p.write_bytes(content)
        else:
            p.write_text(content)
    return root


def _files(root):
    """This cgroup as CgroupFiles reads it, with the module's own file readers over ``root``."""

    def under(path):
        return str(root / path.lstrip("/"))

    texts = ((FIX / "v2_container" / "proc_self_cgroup").read_text(),
             (FIX / "v2_container" / "proc_self_mountinfo").read_text())
    return CgroupFiles(texts=texts, read_text=lambda p: cgroup._read_text(under(p)),
                       read_bytes=lambda p: cgroup.os_read(under(p)), exists=lambda p: Path(under(p)).is_dir())


def _find(root):
    files = _files(root)
    return find_cgroup_limit(*files._texts, files._read_text, files._exists)


def _host_reading(monkeypatch, root):
    """read_host with this process's cgroup replaced by ``root``: (reading, notes)."""
    monkeypatch.setattr(host, "CGROUP", _files(root))
    h = read_host()
    return h, list(h.notes)


linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux /proc")

BAD_LIMITS = [
    ("garbage", "garbage\n", "'garbage'"),
    ("empty", "", "empty"),
    ("negative", "-2147483648\n", "'-2147483648'"),
    ("2**70", f"{2**70}\n", repr(str(2**70))),
    ("100 KB of digits", "9" * 100_000, "'" + "9" * 32 + "'... (100000 characters)"),
    ("missing", None, "missing"),
    ("not UTF-8", b"\xff\xfe21474\n", "not UTF-8 text"),
]


@pytest.mark.parametrize("state,content,shown", BAD_LIMITS, ids=[b[0] for b in BAD_LIMITS])
def test_an_unreadable_limit_file_is_named_not_taken_for_no_limit(tmp_path, state, content, shown):
    lim = _find(_v2_copy(tmp_path, memory_max=content))
    assert lim.limit is None and lim.version == 2
    assert lim.limit_errors == (f"memory.max of /: {shown}",)
    assert lim.usage == 734003200  # the rest is still read


@linux
@pytest.mark.parametrize("state,content,shown", BAD_LIMITS, ids=[b[0] for b in BAD_LIMITS])
def test_an_unreadable_limit_shows_physical_ram_with_a_note(tmp_path, monkeypatch, state, content, shown):
    h, notes = _host_reading(monkeypatch, _v2_copy(tmp_path, memory_max=content))
    assert h.limit_source == "physical RAM" and h.limit == h.total and h.cgroup_usage is None
    assert notes == [Note(NoteCode.CGROUP_LIMIT_UNREADABLE, detail=f"memory.max of /: {shown}")]


@linux
def test_max_means_no_limit_and_no_note(tmp_path, monkeypatch):
    root = _v2_copy(tmp_path, memory_max="max\n")
    assert _find(root).limit_errors == ()
    h, notes = _host_reading(monkeypatch, root)
    assert h.limit_source == "physical RAM" and notes == []


def test_the_hierarchys_root_has_no_limit_file_and_that_is_no_error():
    """v2_nested: the mount point (the real root cgroup) has no memory.max, as the kernel writes it."""
    lim = find_cgroup_limit(*_fixture_reader("v2_nested"))
    assert lim.limit == 8589934592 and lim.limit_errors == () and lim.usage_error is None


def test_an_unreadable_level_leaves_the_others_limit_and_is_named(tmp_path):
    case = tmp_path / "v2_nested"
    shutil.copytree(FIX / "v2_nested", case)
    root = case / "fs"
    leaf = (case / "proc_self_cgroup").read_text().split("::")[1].strip().lstrip("/")
    (root / CG / leaf / "memory.max").write_bytes(b"\xc3(")
    cg, mi = (case / "proc_self_cgroup").read_text(), (case / "proc_self_mountinfo").read_text()
    lim = find_cgroup_limit(cg, mi, lambda p: cgroup._read_text(str(root / p.lstrip("/"))),
                            lambda p: (root / p.lstrip("/")).is_dir())
    assert lim.limit == 8589934592  # the ancestor's, still
    assert lim.limit_errors == (f"memory.max of /{leaf}: not UTF-8 text",)


BAD_USAGE = [
    ("missing", None, "missing"),
    ("garbage", "garbage\n", "'garbage'"),
    ("empty", "", "empty"),
    ("negative", "-5\n", "'-5'"),
    ("not UTF-8", b"73400\xff3200\n", "not UTF-8 text"),
]


@linux
@pytest.mark.parametrize("state,content,shown", BAD_USAGE, ids=[b[0] for b in BAD_USAGE])
def test_an_unreadable_usage_keeps_the_limit_and_caps_available_at_it(tmp_path, monkeypatch, state, content, shown):
    root = _v2_copy(tmp_path, memory_current=content)
    r = _files(root).read()
    assert (r.limit, r.usage) == (V2_LIMIT, None) and r.usage_error == f"memory.current of /: {shown}"
    h, notes = _host_reading(monkeypatch, root)
    if h.total <= V2_LIMIT:
        pytest.skip("this machine has no more RAM than the fixture's limit")
    assert h.limit == V2_LIMIT and h.limit_source == "cgroup v2 memory.max (/)" and h.cgroup_usage is None
    assert 0 <= h.available <= h.limit
    assert notes == [Note(NoteCode.CGROUP_USAGE_UNREADABLE, detail=f"memory.current of /: {shown}")]


@linux
def test_an_undecodable_memory_stat_is_a_note_and_the_usage_is_the_charge(tmp_path, monkeypatch):
    root = _v2_copy(tmp_path, memory_stat=b"anon 1\ninactive_file 104857600\nfile \xff\n")
    lim = _find(root)
    assert lim.stat_error == "memory.stat of /: not UTF-8 text" and lim.inactive_file is None
    r = _files(root).read()
    assert r.usage == 734003200 and r.stat_error == "memory.stat of /: not UTF-8 text"
    h, notes = _host_reading(monkeypatch, root)
    if h.total <= V2_LIMIT:
        pytest.skip("this machine has no more RAM than the fixture's limit")
    assert h.limit == V2_LIMIT and h.cgroup_usage == 734003200
    assert 0 <= h.available <= V2_LIMIT - 734003200
    assert notes == [Note(NoteCode.CGROUP_STAT_UNREADABLE, detail="memory.stat of /: not UTF-8 text")]


@linux
def test_a_readable_cgroup_gives_no_note(tmp_path, monkeypatch):
    root = _v2_copy(tmp_path, memory_stat="anon 1\ninactive_file 104857600\n")
    h, notes = _host_reading(monkeypatch, root)
    if h.total <= V2_LIMIT:
        pytest.skip("this machine has no more RAM than the fixture's limit")
    assert notes == [] and h.cgroup_usage == 734003200 - 104857600


def test_an_interrupt_while_resolving_leaves_it_to_the_next_reading(monkeypatch):
    monkeypatch.setattr(cgroup, "_LINUX", True)
    texts = {"/proc/self/cgroup": (FIX / "v2_container" / "proc_self_cgroup").read_text(),
             "/proc/self/mountinfo": (FIX / "v2_container" / "proc_self_mountinfo").read_text()}
    calls = []

    def read(path):
        calls.append(path)
        if len(calls) == 1:
            raise KeyboardInterrupt
        return texts[path]

    monkeypatch.setattr(cgroup, "_read_proc_text", read)
    files = CgroupFiles(exists=lambda p: p == "/sys/fs/cgroup",
                        read_text=lambda p: (FIX / "v2_container" / "fs" / p.lstrip("/")).read_text()
                        if (FIX / "v2_container" / "fs" / p.lstrip("/")).is_file() else None)
    with pytest.raises(KeyboardInterrupt):
        files.read()
    assert not files.resolved
    assert files.read().limit == V2_LIMIT


def test_proc_files_with_paths_that_are_not_utf8_are_read(tmp_path):
    p = tmp_path / "mountinfo"
    p.write_bytes(b"31 26 0:26 / /mnt/caf\xe9 rw - ext4 /dev/sda1 rw\n")
    text = cgroup._read_proc_text(str(p))
    assert text is not None and "/mnt/caf" in text


@linux
def test_the_snapshot_and_its_text_carry_the_cgroup_note(tmp_path, monkeypatch):
    """What %vram shows: the note reaches the snapshot's notes, and available stays under the limit."""
    from vramlab.display.text import snapshot_text
    from vramlab.reconcile import snapshot

    root = _v2_copy(tmp_path, memory_max="garbage\n")
    monkeypatch.setattr(host, "CGROUP", _files(root))
    snap = snapshot()
    assert Note(NoteCode.CGROUP_LIMIT_UNREADABLE, detail="memory.max of /: 'garbage'") in snap.notes
    # the wording, pinned once: what %vram prints
    assert "cgroup memory limit unreadable (memory.max of /: 'garbage'): showing physical RAM" in snapshot_text(snap)
    assert snap.host.available <= snap.host.limit
