"""``%vram free`` in a real kernel: after an out-of-memory error during backward, the graph that
``loss`` keeps is found, named with its bytes, and released (the loss's value stays); a cached
output that holds a tensor is released too; the model and optimizer state are named and kept."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[2]

SETUP = """\
%load_ext vramlab
import torch
from vramlab.sim import VirtualGPU
gpu = VirtualGPU("128MiB")
gpu.__enter__()
torch.manual_seed(0)
model = torch.nn.Sequential(*[torch.nn.Linear(1024, 1024) for _ in range(4)])
opt = torch.optim.Adam(model.parameters())
x = torch.randn(4096, 1024)
"""

STEP = """\
loss = model(x).relu().sum()
"""

SHOW = "torch.ones(1024, 1024)  # an output only IPython's cache keeps"

OOM = """\
value = loss.item()
before_oom = gpu.allocated
loss.backward()  # the gradients and the backward's buffers do not fit beside the graph
"""

FREE = """\
assert loss.grad_fn is not None, "the failed backward left the graph to loss"
before = gpu.allocated
%vram free
"""

CHECK = """\
after = gpu.allocated
print(f"FREED {before - after}")
assert loss.grad_fn is None and loss.item() == value, "the graph is gone, the value is kept"
assert after < before
"""


def _run(tmp_path, sources):
    import nbclient
    import nbformat

    env = {k: v for k, v in os.environ.items() if k != "MPLBACKEND" and not k.startswith("VRAMLAB_")}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(s) for s in sources])
    client = nbclient.NotebookClient(nb, timeout=180, kernel_name="python3", allow_errors=True,
                                     resources={"metadata": {"path": str(tmp_path)}})
    client.execute(env=env)
    return nb.cells


def _text(cell) -> str:
    out = []
    for o in cell.outputs:
        if o.output_type == "stream":
            out.append(o.text)
        elif o.output_type == "error":
            out.append(f"{o.ename}: {o.evalue}")
        elif "data" in o:
            out.append(o.data.get("text/plain", ""))
    return "".join(out)


def _errors(cell) -> list:
    return [o for o in cell.outputs if o.output_type == "error"]


@pytest.mark.slow
def test_vram_free_releases_the_graph_that_loss_holds_after_an_oom_in_backward(tmp_path):
    cells = _run(tmp_path, [SETUP, STEP, SHOW, OOM, FREE, CHECK])
    assert "OutOfMemoryError" in _text(cells[3]), _text(cells[3])
    report = _text(cells[4])
    assert not _errors(cells[4]), report
    lines = report.splitlines()
    released = lines.index(next(ln for ln in lines if ln.strip().startswith("released")))
    kept = lines.index(next(ln for ln in lines if ln.strip().startswith("still held")))
    graph = [ln.split() for ln in lines[released + 1:kept] if ln.split()[:3] == ["loss", "autograd", "graph"]]
    assert graph, report
    out = [ln.split() for ln in lines[released + 1:kept] if ln.split() and ln.split()[0].startswith("Out[")]
    assert out and out[0][1:3] == ["output", "cache"] and out[0][3:5] == ["4.00", "MiB"], report
    named_kept = {ln.split()[0] for ln in lines[kept + 1:]}
    assert {"model", "x"} <= named_kept, report
    check = _text(cells[5])
    assert not _errors(cells[5]), check
    freed = int(check.split("FREED ")[1].split()[0])
    from vramlab.units import parse_size

    graph_bytes = parse_size(" ".join(graph[0][3:5]))
    # what the device gave back is at least the graph's saved activations (4 x 16 MiB of x's
    # activations through four layers) and the cached output
    assert freed >= graph_bytes + 4 * 2**20, (freed, graph_bytes, report)


@pytest.mark.slow
def test_the_batch_finder_shows_a_progress_bar_in_a_notebook(tmp_path):
    cells = _run(tmp_path, ["import vramlab\n"
                            "def step(b):\n"
                            "    import torch\n"
                            "    torch.empty(b, 1024, 1024)\n"
                            "r = vramlab.find_max_batch_size(step, device='64MiB', limit=256)\n"
                            "print(r.max_batch_size)"])
    assert not _errors(cells[0]), _text(cells[0])
    kinds = [o.output_type for o in cells[0].outputs]
    views = [o for o in cells[0].outputs if "application/vnd.jupyter.widget-view+json" in o.get("data", {})]
    assert views, kinds
    assert _text(cells[0]).strip().endswith("16")  # 4 MiB a sample on a 64 MiB card
