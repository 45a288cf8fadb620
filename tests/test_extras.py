"""The optional dependencies: one line saying what to install, and torch checked by feature."""

import os
import signal
import subprocess
import sys
import types

import pytest

from vramlab._extras import MIN_TORCH, TORCH_FEATURES, MissingExtra, require_matplotlib, require_torch, torch_gaps


def test_this_torch_has_every_feature_the_simulator_uses():
    import torch

    assert torch_gaps(torch) == []
    assert require_torch("x") is torch
    assert require_matplotlib("y").__name__ == "matplotlib"


def test_an_old_torch_is_named_with_what_it_lacks(monkeypatch):
    import torch

    old = types.ModuleType("torch")
    old.__version__ = "2.3.1"
    for attr in ("UntypedStorage",):
        setattr(old, attr, getattr(torch, attr))
    monkeypatch.setitem(sys.modules, "torch", old)
    gaps = torch_gaps(old)
    assert "torch.OutOfMemoryError" in gaps
    with pytest.raises(MissingExtra) as e:
        require_torch("VirtualGPU")
    msg = str(e.value)
    assert f"torch >= {MIN_TORCH}" in msg and "2.3.1" in msg and "torch.OutOfMemoryError" in msg
    assert "\n" not in msg


def test_no_torch_is_one_line_with_the_extra_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)  # import torch raises ImportError
    with pytest.raises(MissingExtra, match=r"pip install 'vramlab\[sim\]'") as e:
        require_torch("VirtualGPU")
    assert isinstance(e.value, ImportError) and e.value.name == "torch"
    assert e.value._render_traceback_() == [f"MissingExtra: {e.value}"]


def test_the_feature_list_names_real_modules():
    for mod, attr in TORCH_FEATURES:
        assert mod == "torch" or mod.startswith("torch."), mod
        assert attr.isidentifier()


@pytest.mark.slow
def test_in_ipython_a_missing_torch_prints_one_line_and_no_traceback():
    """In a fresh process where torch cannot be imported, asking for the virtual GPU prints
    the one line and nothing else (IPython's ``_render_traceback_`` hook)."""
    code = (
        "import sys, io, contextlib\n"
        "sys.modules['torch'] = None\n"
        "from IPython.core.interactiveshell import InteractiveShell\n"
        "ip = InteractiveShell.instance(colors='NoColor')\n"
        "out = io.StringIO()\n"
        "with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):\n"
        "    ip.run_cell('import vramlab\\nvramlab.VirtualGPU(\"T4\")')\n"
        "    ip.run_cell('from vramlab.sim.estimate import estimate')\n"
        "    ip.run_cell('vramlab.find_max_batch_size')\n"
        "print(repr(out.getvalue()))\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("VRAMLAB_")}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env,
                       preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    printed = eval(r.stdout.strip().splitlines()[-1])
    lines = printed.splitlines()
    assert len(lines) == 3, printed
    assert lines[0].startswith("MissingExtra: vramlab.VirtualGPU needs PyTorch")
    assert lines[1].startswith("MissingExtra: estimate() needs PyTorch")
    assert lines[2].startswith("MissingExtra: vramlab.find_max_batch_size needs PyTorch")
    assert all("pip install 'vramlab[sim]'" in line for line in lines)
