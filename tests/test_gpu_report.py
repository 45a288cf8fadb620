"""python -m vramlab.gpu_report: end to end on this machine (every GPU row SKIP), and its
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

from vramlab import gpu_report

ROOT = Path(__file__).resolve().parent.parent


def _run(args, env=None):
    e = dict(os.environ, **(env or {}))
    return subprocess.run([sys.executable, "-m", "vramlab.gpu_report", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=300, env=e, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


def _rows(report: str) -> list[list[str]]:
    return [[c.strip() for c in line.strip("|").split(" | ")] for line in report.splitlines()
            if line.startswith("| ") and not line.startswith("| section")]


def test_on_a_machine_without_cuda_every_gpu_row_is_skip(tmp_path):
    r = _run([str(tmp_path / "out")])
    assert r.returncode == 0, r.stderr
    report = (tmp_path / "out" / "report.md").read_text()
    rows = _rows(report)
    sections = {row[0] for row in rows}
    assert {"machine", "self-check", "sampler", "benchmark", "notebooks"} <= sections
    assert all(row[2] in ("SKIP", "INFO") for row in rows), report
    assert len([row for row in rows if row[0] == "self-check"]) == 7
    assert {row[1] for row in rows if row[0] == "notebooks"} == {p.stem for p in (ROOT / "notebooks").glob("*.ipynb")}
    assert "0 failed" in report


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
