"""The package's public API: every name resolves, lazily, and importing it imports no torch."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import vramlab

import pytest


def _run(code: str) -> str:
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env,
                       check=True, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    return r.stdout.strip()


def test_every_public_name_resolves():
    for name in vramlab.__all__:
        assert getattr(vramlab, name) is not None, name
    assert set(vramlab.__all__) <= set(dir(vramlab))


@pytest.mark.slow
def test_import_and_load_import_neither_torch_nor_ipywidgets():
    out = _run("import sys, vramlab\n"
               "from IPython.testing.globalipapp import start_ipython\n"
               "ip = start_ipython(); ip.run_line_magic('load_ext', 'vramlab')\n"
               "print('torch' in sys.modules, 'ipywidgets' in sys.modules, 'vramlab.sim' in sys.modules)")
    assert out == "False False False"


def test_the_public_names_are_the_layered_modules_objects():
    from vramlab import model, reconcile
    from vramlab.runtime import history, oom
    from vramlab.sim import estimate, virtual_gpu

    assert vramlab.snapshot is reconcile.snapshot and vramlab.Snapshot is model.Snapshot
    assert vramlab.CellRecord is model.CellRecord and vramlab.history is history.history
    assert vramlab.explain_oom is oom.explain_oom
    assert vramlab.VirtualGPU is virtual_gpu.VirtualGPU and vramlab.estimate is estimate.estimate
    assert vramlab.sim.VirtualGPU is virtual_gpu.VirtualGPU


def test_an_unknown_name_is_an_attribute_error():
    try:
        _ = vramlab.lab  # the old name of sim/ and lessons/
    except AttributeError as e:
        assert "'lab'" in str(e)
    else:  # pragma: no cover
        raise AssertionError("vramlab.lab should not exist")


def test_every_dotted_vramlab_name_in_the_docs_and_docstrings_exists():
    """Docs and docstrings name modules and objects that exist (not ``vramlab.snapshot.Snapshot``)."""
    import importlib
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    files = [*root.joinpath("vramlab").rglob("*.py"), *root.joinpath("docs").rglob("*.md"), root / "README.md",
             *root.joinpath("tools", "notebooks").glob("*.py"), *root.joinpath("benchmarks").glob("*.py")]
    missing = []
    for path in files:
        # "<vramlab.X ...>" is a repr's label, not a reference
        for m in re.finditer(r"(?<![\w/.<])(vramlab(?:\.[A-Za-z_]\w*)+)", path.read_text(encoding="utf-8")):
            parts = m.group(1).split(".")
            for i in range(len(parts), 0, -1):
                try:
                    obj = importlib.import_module(".".join(parts[:i]))
                    break
                except ImportError:
                    continue
            try:
                for attr in parts[i:]:
                    obj = getattr(obj, attr)
            except AttributeError:
                missing.append(f"{path.relative_to(root)}: {m.group(1)}")
    assert not missing, "\n".join(sorted(set(missing)))
