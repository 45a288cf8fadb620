"""The architecture is enforced: import-linter's contracts (``pyproject.toml``) pass, they
fail on an upward import, and torch is never imported at module level outside sim/ and lessons/."""

from __future__ import annotations

import ast
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "vramlab"


def _lint(cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    env["PYTHONPATH"] = str(cwd)  # the package under test, not an installed copy
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    script = "import sys; from importlinter.cli import lint_imports_command; sys.exit(lint_imports_command())"
    return subprocess.run([sys.executable, "-c", script, "--no-cache", "--config", str(cwd / "pyproject.toml")],
                          cwd=cwd, env=env, capture_output=True, text=True, timeout=300,
                          preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


def test_import_contracts_are_kept():
    r = _lint(ROOT)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out
    assert "6 kept, 0 broken" in out, out


def test_an_upward_import_breaks_the_layers(tmp_path):
    shutil.copytree(PACKAGE, tmp_path / "vramlab", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    model = tmp_path / "vramlab" / "model.py"
    model.write_text(model.read_text() + "\n\ndef _bad() -> None:\n    from .runtime import sampler  # noqa: F401\n")
    r = _lint(tmp_path)
    out = r.stdout + r.stderr
    assert r.returncode != 0, out
    assert "vramlab.model is not allowed to import vramlab.runtime" in out, out


def test_the_simulators_rooms_refuse_an_upward_import(tmp_path):
    """sim/step.py runs a step: it may not reach up into the estimate (the cycle StepKit once dodged)."""
    shutil.copytree(PACKAGE, tmp_path / "vramlab", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    step = tmp_path / "vramlab" / "sim" / "step.py"
    step.write_text(step.read_text() + "\n\ndef _bad() -> None:\n    from .estimate import estimate  # noqa: F401\n")
    r = _lint(tmp_path)
    out = r.stdout + r.stderr
    assert r.returncode != 0, out
    assert "vramlab.sim.step is not allowed to import vramlab.sim.estimate" in out, out


def _module_level_imports(tree: ast.Module) -> list[str]:
    """Names imported by statements that run at import time (not inside a function)."""
    names: list[str] = []

    def walk(body: list[ast.stmt]) -> None:
        for node in body:
            if isinstance(node, ast.Import):
                names.extend(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names.append(node.module)
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                continue
            else:
                for field in ("body", "orelse", "finalbody", "handlers"):
                    inner = getattr(node, field, None)
                    if isinstance(inner, list):
                        walk([n for n in inner if isinstance(n, ast.stmt)] +
                             [s for h in inner if isinstance(h, ast.ExceptHandler) for s in h.body])

    walk(tree.body)
    return names


def test_torch_is_never_imported_at_module_level_outside_sim_and_lessons():
    offenders = []
    checked = 0
    for path in PACKAGE.rglob("*.py"):
        rel = path.relative_to(PACKAGE).parts
        if rel[0] in ("sim", "lessons"):
            continue
        checked += 1
        for name in _module_level_imports(ast.parse(path.read_text())):
            if name == "torch" or name.startswith("torch."):
                offenders.append(f"{path.relative_to(ROOT)}: import {name}")
    assert checked > 20
    assert not offenders, offenders


def test_the_module_level_scan_sees_top_level_and_guarded_imports():
    tree = ast.parse("import torch\ntry:\n    from torch import nn\nexcept ImportError:\n    pass\n"
                     "def f():\n    import torch.cuda\n")
    assert _module_level_imports(tree) == ["torch", "torch"]
