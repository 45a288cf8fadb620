"""The cell callbacks: the number IPython gives each cell, interrupts that land in vramlab's
own callbacks, and records that leave a pending ``clear_output(wait=True)`` harmless."""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path

import pytest
from IPython.utils.capture import capture_output

ROOT = Path(__file__).resolve().parents[2]


@contextlib.contextmanager
def auto_mode(ip):
    """``%vram auto on`` for the block, off after it whatever happens."""
    with capture_output():
        ip.run_line_magic("vram", "auto on")
    try:
        yield
    finally:
        with capture_output():
            ip.run_line_magic("vram", "auto off")


# ---------------------------------------------------------------- cell numbers


def test_records_carry_the_number_ipython_gives_the_cell(ip):
    """``In [n]``: the number in ``ExecutionResult.execution_count``, on every IPython
    (9.8 and later count up before ``pre_run_cell``, earlier versions after the cell)."""
    import vramlab
    from vramlab.runtime.history import history

    ip.run_line_magic("load_ext", "vramlab")
    with capture_output() as cap:
        r1 = ip.run_cell("%%vram\nn1 = 1\n", store_history=True)
    assert vramlab.last().execution_count == r1.execution_count
    assert f"vramlab cell {r1.execution_count} " in cap.outputs[0].data["text/plain"]
    with auto_mode(ip), capture_output() as cap:
        r2 = ip.run_cell("n2 = 2", store_history=True)
    assert vramlab.last().execution_count == r2.execution_count
    assert f"[vramlab] cell {r2.execution_count} " in cap.stdout
    counts = [c.execution_count for c in history().cells[-2:]]
    assert counts == [r1.execution_count, r2.execution_count]


def test_the_timeline_marks_a_cell_with_its_own_number(ip):
    from vramlab.runtime.sampler import get_sampler

    ip.run_line_magic("load_ext", "vramlab")
    with capture_output():
        ip.run_line_magic("vram", "watch --interval 5")
    try:
        r = ip.run_cell("marked = 1", store_history=True)
        counts = [m.execution_count for m in get_sampler().markers if m.kind == "cell"]
        assert counts[-1] == r.execution_count
    finally:
        with capture_output():
            ip.run_line_magic("vram", "stop")


def test_a_vram_cells_traceback_names_the_cell_as_ipython_does(ip):
    ip.run_line_magic("load_ext", "vramlab")
    with capture_output() as cap:
        r = ip.run_cell("%%vram\nx = 1\nraise ValueError('in the cell')\n", store_history=True)
    text = (cap.stdout + cap.stderr).replace("In [", "In[")
    # the frame that shows the cell's own line is named after the cell
    assert f"In[{r.execution_count}], line 2" in text, text


# ---------------------------------------------------------------- interrupts in vramlab's callbacks


def _interrupt_once(monkeypatch, obj, name):
    original = getattr(obj, name)
    calls = []

    def interrupted(*a, **k):
        calls.append(1)
        if len(calls) == 1:
            raise KeyboardInterrupt
        return original(*a, **k)

    monkeypatch.setattr(obj, name, interrupted)
    return calls


def test_an_interrupt_in_pre_run_cell_stops_the_cell_with_no_traceback_through_vramlab(ip, monkeypatch):
    from vramlab.runtime.records import Recorder

    ip.run_line_magic("load_ext", "vramlab")
    with auto_mode(ip):
        _interrupt_once(monkeypatch, Recorder, "begin")
        ip.user_ns.pop("ran_after_interrupt", None)
        with capture_output() as cap:
            r = ip.run_cell("ran_after_interrupt = True", store_history=True)
        text = cap.stdout + cap.stderr
        assert isinstance(r.error_in_exec, KeyboardInterrupt)  # the user's interrupt stopped the cell
        assert "ran_after_interrupt" not in ip.user_ns
        assert "Error in callback" not in text and "vramlab" not in text, text
        with capture_output() as cap:
            r = ip.run_cell("ran_after_interrupt = True", store_history=True)
        assert r.success and ip.user_ns["ran_after_interrupt"] is True
        assert "[vramlab] cell" in cap.stdout  # the next cell is recorded as usual


def test_an_interrupt_in_post_run_cell_is_absorbed(ip, monkeypatch):
    from vramlab.runtime.records import Recorder

    ip.run_line_magic("load_ext", "vramlab")
    with auto_mode(ip):
        _interrupt_once(monkeypatch, Recorder, "end")
        with capture_output() as cap:
            r = ip.run_cell("finished = 1", store_history=True)
        text = cap.stdout + cap.stderr
        assert r.success and ip.user_ns["finished"] == 1
        assert "Error in callback" not in text and "Traceback" not in text and "KeyboardInterrupt" not in text
        with capture_output() as cap:
            ip.run_cell("finished = 2", store_history=True)
        assert "[vramlab] cell" in cap.stdout


def test_an_interrupt_before_a_vram_cells_code_stops_it_without_vramlabs_frames(ip, monkeypatch):
    from vramlab.runtime import records

    ip.run_line_magic("load_ext", "vramlab")
    _interrupt_once(monkeypatch, records, "_read")  # lands inside the first reading
    ip.user_ns.pop("ran_in_magic", None)
    with capture_output() as cap:
        r = ip.run_cell("%%vram\nran_in_magic = True\n", store_history=True)
    text = cap.stdout + cap.stderr
    assert isinstance(r.error_in_exec, KeyboardInterrupt) and "ran_in_magic" not in ip.user_ns
    assert "records.py" not in text and "reconcile.py" not in text, text


def test_an_interrupt_after_a_vram_cells_code_keeps_the_cells_value(ip, monkeypatch):
    from vramlab.runtime.records import Recorder

    ip.run_line_magic("load_ext", "vramlab")
    _interrupt_once(monkeypatch, Recorder, "end")
    with capture_output() as cap:
        r = ip.run_cell("%%vram\n6 * 7\n", store_history=True)
    assert r.success and r.result == 42
    assert "Traceback" not in cap.stdout + cap.stderr


# ---------------------------------------------------------------- clear_output(wait=True)

LOOP = ("from IPython.display import clear_output, display, HTML\n"
        "for i in range(3):\n"
        "    print(f'step {i}')\n"
        "    clear_output(wait=True)\n")


def _run_in_a_fresh_kernel(tmp_path, sources):
    """Run ``sources`` as cells in a fresh kernel with nbclient, which applies
    ``clear_output(wait=True)`` as the frontends do (on the next output); return the cells."""
    import nbclient
    import nbformat

    env = {k: v for k, v in os.environ.items() if k != "MPLBACKEND" and not k.startswith("VRAMLAB_")}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(s) for s in sources])
    client = nbclient.NotebookClient(nb, timeout=120, kernel_name="python3",
                                     resources={"metadata": {"path": str(tmp_path)}})
    client.execute(env=env)
    return nb.cells


def _texts(cell):
    out = []
    for o in cell.outputs:
        if o.output_type == "stream":
            out.append(o.text)
        elif "data" in o:
            out.append(o.data.get("text/plain", ""))
    return "".join(out)


@pytest.mark.slow
def test_a_pending_clear_output_does_not_swallow_the_cells_last_output(tmp_path):
    cells = _run_in_a_fresh_kernel(tmp_path, [
        "%load_ext vramlab",
        LOOP,                                             # no vramlab record: the reference
        "%vram auto on",
        LOOP,                                             # auto mode
        "%%vram\n" + LOOP,                                # the cell magic
        LOOP + "display(HTML('<b>done</b>'))\nclear_output(wait=True)\n",  # a display before the clear
        "print('a'); clear_output(wait=True); print('b')",  # the clear already happened: nothing replayed
        "%vram auto off",
    ])
    reference = _texts(cells[1])
    assert reference == "step 2\n"
    auto = _texts(cells[3])
    assert auto.startswith("step 2\n") and "[vramlab] cell" in auto and "step 1" not in auto
    magic = _texts(cells[4])
    assert magic.startswith("step 2\n") and "vramlab cell" in magic
    shown = _texts(cells[5])
    assert "<IPython.core.display.HTML object>" in shown and "[vramlab] cell" in shown and "step" not in shown
    once = _texts(cells[6])
    assert once.startswith("b\n") and once.count("b\n") == 1 and "a\n" not in once and "[vramlab] cell" in once


def test_the_tracker_replays_only_what_a_waiting_clear_would_erase():
    """The tracker against a stand-in publisher, following the frontends' rule."""
    import io
    import sys

    from vramlab.ipython.outputs import LIMIT, DisplayData, OutputTracker, StreamText

    class Pub:
        def __init__(self):
            self.sent = []

        def clear_output(self, wait=False):
            self.sent.append(("clear", wait))

        def publish(self, data, metadata=None, **kwargs):
            self.sent.append(("display", data))

    class Shell:
        display_pub = Pub()

    out = io.StringIO()
    saved = sys.stdout
    sys.stdout = out
    try:
        t = OutputTracker(Shell())
        t.start()
        print("one")
        Shell.display_pub.clear_output(wait=True)
        Shell.display_pub.clear_output(wait=True)  # a second clear before any output: nothing new
        found = t.stop()
        t.start()
        print("x")
        Shell.display_pub.publish({"text/plain": "shown"}, {})
        Shell.display_pub.clear_output(wait=True)
        found2 = t.stop()
        t.start()
        print("a" * (LIMIT + 1))
        Shell.display_pub.clear_output(wait=True)
        too_long = t.stop()
        t.start()
        print("gone")
        Shell.display_pub.clear_output(wait=False)
        Shell.display_pub.clear_output(wait=True)
        nothing = t.stop()
    finally:
        sys.stdout = saved
    assert found.pending and found.outputs == [StreamText("stdout", "one\n")] and found.safe
    assert found2.outputs == [StreamText("stdout", "x\n"), DisplayData({"text/plain": "shown"}, {})]
    assert too_long.pending and not too_long.complete and not too_long.safe
    assert nothing.pending and nothing.outputs == [] and nothing.safe
    assert "write" not in out.__dict__ and "publish" not in Shell.display_pub.__dict__  # wrappers removed
    assert signal.getsignal(signal.SIGINT) is not None
