"""Which runs are the same cell (its code with the batch size left out), and the batch a run used."""

from __future__ import annotations

import pytest

from vramlab.runtime.cells import batch_size_in, cell_key
from vramlab.runtime.records import Recorder


@pytest.mark.parametrize("a,b", [
    ("batch_size = 512\nstep(batch_size)", "batch_size = 4096\nstep(batch_size)"),
    ("bs = 512\nstep(bs)", "bs = 2 ** 12  # larger\n\nstep( bs )"),
    ("loader = DataLoader(ds, batch_size=64)\nrun(loader)", "loader = DataLoader(ds, batch_size=256)\nrun(loader)"),
    ("batch: int = 8\nstep(batch)", "batch: int = 16\nstep(batch)"),
    ("step(batch_size)", "# the same code, commented\nstep(batch_size)\n"),
    ("%time x = 1\nbatch_size = 2\n!ls", "%time x = 1\nbatch_size = 3\n!ls"),  # not Python: line by line
])
def test_the_same_code_at_another_batch_is_the_same_cell(a, b):
    assert cell_key(a) is not None and cell_key(a) == cell_key(b)


@pytest.mark.parametrize("a,b", [
    ("batch_size = 512\nstep(batch_size)", "batch_size = 512\nstep(batch_size, lr=1e-3)"),
    ("lr = 1e-3\nstep(batch_size)", "lr = 1e-4\nstep(batch_size)"),  # only the batch is left out
    ("width = 512\nstep(batch_size)", "width = 1024\nstep(batch_size)"),
    ("%time step(512)", "%time step(1024)"),
])
def test_other_code_is_another_cell(a, b):
    assert cell_key(a) != cell_key(b)


def test_empty_code_has_no_key():
    assert cell_key("") is None and cell_key("  \n") is None and cell_key(None) is None


def test_the_batch_size_in_a_namespace():
    assert batch_size_in({"batch_size": 64, "bs": 8}) == 64
    assert batch_size_in({"bs": 8}) == 8
    assert batch_size_in({"batch_size": True, "batch": 3}) == 3  # a bool is not a batch size
    assert batch_size_in({"batch_size": 0, "bs": -1, "batch": 2.0}) is None
    assert batch_size_in(None) is None


def test_a_record_keeps_the_cells_key_and_batch():
    r = Recorder()
    rec = r.end(r.begin(3), cell_key=cell_key("bs = 4\nstep(bs)"), batch_size=4)
    assert rec.cell_key == cell_key("bs = 8\nstep(bs)") and rec.batch_size == 4
    assert {"cell_key", "batch_size"} <= set(rec.to_dict())
    plain = r.end(r.begin(4))
    assert plain.cell_key is None and plain.batch_size is None


def test_the_key_of_a_cell_that_ran_comes_from_ipython_s_history_not_a_second_transform(ip):
    """In a kernel (history stored), the key is made from the code IPython already transformed:
    the same key as transforming the cell again, for a cell with a magic, at no second cost."""
    from vramlab.ipython.events import code_key

    raw = "%time pass\nbs = 4\nx = bs"
    r = ip.run_cell(raw, store_history=True)
    calls = []
    real = ip.transform_cell
    ip.transform_cell = lambda cell: calls.append(cell) or real(cell)
    try:
        from_history = code_key(ip, raw, r.execution_count)
        assert calls == []
        assert from_history == code_key(ip, raw) and calls == [raw]  # without the count: transformed again
        assert from_history == cell_key(real("%time pass\nbs = 8\nx = bs"))  # the batch left out, as before
    finally:
        del ip.transform_cell
