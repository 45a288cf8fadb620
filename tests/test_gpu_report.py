"""python3 tools/gpu_report.py: end to end on this machine (every GPU row SKIP), and its
notebook runner on real notebooks with a stand-in for CUDA."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import driver_scenarios as sc
import nbformat

import pytest

from tool_modules import load_tool

from vramlab import selftest

gpu_report = load_tool("gpu_report")

ROOT = Path(__file__).resolve().parent.parent


def _run(args, env=None):
    e = dict(os.environ, **(env or {}))
    return subprocess.run([sys.executable, str(ROOT / "tools" / "gpu_report.py"), *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=300, env=e, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


def _rows(report: str) -> list[list[str]]:
    return [[c.strip() for c in line.strip("|").split(" | ")] for line in report.splitlines()
            if line.startswith("| ") and not line.startswith("| section")]


@pytest.mark.slow
def test_on_a_machine_without_cuda_every_gpu_row_is_skip(tmp_path):
    r = _run([str(tmp_path / "out")])
    assert r.returncode == 0, r.stderr
    report = (tmp_path / "out" / "report.md").read_text()
    rows = _rows(report)
    sections = {row[0] for row in rows}
    assert {"machine", "self-check", "attribution", "sampler", "allocator", "in a kernel", "monitor",
            "benchmark", "notebooks"} <= sections
    assert all(row[2] in ("SKIP", "INFO") for row in rows), report
    assert len([row for row in rows if row[0] == "self-check"]) == len(selftest.CHECKS) == 8
    assert {row[1] for row in rows if row[0] == "notebooks"} == {p.stem for p in (ROOT / "notebooks").glob("*.ipynb")}
    assert "0 failed" in report


@pytest.mark.slow
def test_the_machine_rows_name_the_simulated_gpus(tmp_path):
    env = {"PYTHONPATH": os.pathsep.join([str(sc.SIM_DIR), str(ROOT)]), "VRAMLAB_NVML_SIM": __import__("json").dumps(sc.mixed())}
    r = _run([str(tmp_path / "out"), "--notebooks", str(tmp_path / "none")], env=env)
    assert r.returncode == 0, r.stderr
    report = (tmp_path / "out" / "report.md").read_text()
    assert "driver 575.57.08; 0: NVIDIA T4, 1: NVIDIA H100 80GB HBM3" in report


def _notebook(path: Path, code: str) -> None:
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.cells = [nbformat.v4.new_code_cell(code)]
    nbformat.write(nb, path)


@pytest.mark.slow
def test_the_notebook_runner_passes_fails_and_keeps_its_budget(tmp_path):
    src, out = tmp_path / "nbs", tmp_path / "out"
    src.mkdir()
    _notebook(src / "a_passes.ipynb", "import os\nassert os.environ['VRAMLAB_SIZE'] == 'large'\nprint('large')")
    _notebook(src / "b_fails.ipynb", "raise ValueError('the claim does not hold')")
    stand_in = object()  # the runner only needs to know CUDA is there
    rows = gpu_report._notebooks(src, out, time.monotonic() + 300, 120, stand_in, None)
    assert [(r.name, r.status) for r in rows] == [("a_passes", "PASS"), ("b_fails", "FAIL")]
    assert "the claim does not hold" in rows[1].detail
    executed = nbformat.read(out / "a_passes.ipynb", as_version=4)
    assert executed.cells[0].outputs[0]["text"].strip() == "large"
    assert "VRAMLAB_SIZE" not in os.environ or os.environ["VRAMLAB_SIZE"] != "large"
    late = gpu_report._notebooks(src, out, time.monotonic(), 120, stand_in, None)
    assert [r.status for r in late] == ["SKIP", "SKIP"] and "budget" in late[0].detail


@pytest.mark.slow
def test_a_notebook_stops_at_its_deadline_and_names_the_cell(tmp_path):
    src, out = tmp_path / "nbs", tmp_path / "out"
    src.mkdir()
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.cells = [nbformat.v4.new_code_cell("print('first')"), nbformat.v4.new_code_cell("import time\ntime.sleep(600)")]
    nbformat.write(nb, src / "slow.ipynb")
    t0 = time.monotonic()
    (row,) = gpu_report._notebooks(src, out, time.monotonic() + 300, 15, object(), None)
    assert time.monotonic() - t0 < 15 + 20  # its limit, plus a kernel's start and shutdown
    assert row.status == "FAIL" and "cell 1 (`import time`)" in row.detail, row.detail
    assert "\x1b" not in row.detail and "----" not in row.detail
    saved = nbformat.read(out / "slow.ipynb", as_version=4)
    assert saved.cells[0].outputs[0]["text"].strip() == "first"  # what ran before the deadline is kept


@pytest.mark.slow
def test_a_failure_loses_its_colour_codes_and_names_its_cell(tmp_path):
    src, out = tmp_path / "nbs", tmp_path / "out"
    src.mkdir()
    _notebook(src / "f.ipynb", "# a comment first\nx = 1\nassert x == 2, 'the claim does not hold'")
    (row,) = gpu_report._notebooks(src, out, time.monotonic() + 300, 120, object(), None)
    assert row.status == "FAIL"
    assert row.detail.split("; ", 1)[1].startswith("cell 0 (`x = 1`): CellExecutionError: AssertionError: the claim does not hold")
    assert "\x1b" not in row.detail


@pytest.mark.slow
def test_kernels_draw_inline_even_when_the_report_runs_under_agg(tmp_path, monkeypatch):
    monkeypatch.setenv("MPLBACKEND", "Agg")
    src, out = tmp_path / "nbs", tmp_path / "out"
    src.mkdir()
    _notebook(src / "fig.ipynb", "import matplotlib.pyplot as plt\nplt.plot([1, 2, 3])\nplt.show()")
    (row,) = gpu_report._notebooks(src, out, time.monotonic() + 300, 120, object(), None)
    assert row.status == "PASS", row.detail
    outputs = nbformat.read(out / "fig.ipynb", as_version=4).cells[0].outputs
    assert any("image/png" in o.get("data", {}) for o in outputs), outputs


def test_the_report_is_rewritten_after_every_section(tmp_path):
    seen = {}

    def echo(line):
        title = line.split(":", 1)[0]
        seen[title] = (tmp_path / "out" / "report.md").read_text()

    gpu_report.run_report(tmp_path / "out", notebooks=tmp_path / "none", echo=echo)
    assert list(seen) == ["machine", "self-check", "attribution", "sampler", "allocator", "in a kernel", "monitor",
                          "benchmark", "notebooks"]
    assert "| machine |" in seen["machine"] and "| self-check |" not in seen["machine"]
    assert "still going, or was stopped" in seen["machine"]
    assert "| sampler |" in seen["sampler"] and "| notebooks |" not in seen["sampler"]
    final = (tmp_path / "out" / "report.md").read_text()
    assert "still going" not in final and "| notebooks |" in final


def test_the_sandbox_row_gives_its_evidence():
    text = gpu_report.sandbox()
    assert text.split(":", 1)[0] in ("gVisor", "a Firecracker-style microVM (virtio-mmio devices)",
                                     "neither gVisor nor Firecracker, as far as these signs tell")
    for word in ("kernel", "VmHWM", "clear_refs", "task children files"):
        assert word in text, text


def test_the_in_kernel_cells_are_valid_ipython():
    from IPython.core.inputtransformer2 import TransformerManager

    t = TransformerManager()
    for source, _ in gpu_report.IN_KERNEL_CELLS:
        compile(t.transform_cell(source), "<cell>", "exec")
    assert any("raises-exception" in tags for _, tags in gpu_report.IN_KERNEL_CELLS)  # the OOM cell does not stop the run


def test_monitor_gaps_remove_the_driver_offset_and_tell_timing_from_error():
    MiB = 1 << 20
    smi = [(float(t), (1000 + 10 * t) * MiB + 512 * MiB) for t in range(10)]  # +512 MiB: the driver's reservation
    samples = [(t + 0.1, (1000 + 10 * t) * MiB) for t in range(10)]
    assert gpu_report.monitor_gaps(samples, smi) == (512 * MiB, 0, 0.1, 10 * MiB)
    # memory jumps by 2 GiB between two nvidia-smi readings; the sampler read it nearer the one before
    smi = [(0.0, 512 * MiB), (1.0, 512 * MiB), (2.0, 2560 * MiB), (3.0, 2560 * MiB)]
    samples = [(0.0, 0), (0.9, 0), (1.4, 2048 * MiB), (3.0, 2048 * MiB)]
    offset, gap, when, moved = gpu_report.monitor_gaps(samples, smi)
    assert (offset, gap, when) == (512 * MiB, 2048 * MiB, 1.4) and moved == 2048 * MiB  # a matter of timing
