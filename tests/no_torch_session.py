"""A new user's first session in an environment with no torch and no matplotlib.

Run by ``tests/test_packaging.py`` with the Python of a fresh virtual environment into
which only the built wheel of vramlab was installed (its core dependencies: IPython,
ipywidgets, psutil, nvidia-ml-py). It drives a real IPython shell through the documented
surface and prints one JSON line of findings, which the test asserts on.
"""

from __future__ import annotations

import contextlib
import io
import json
import sys

from IPython.core.interactiveshell import InteractiveShell

found: dict = {}
ip = InteractiveShell.instance(colors="NoColor")


def run(cell: str) -> tuple[str, object]:
    """Run ``cell`` as a user would; return what it printed and the error it raised, if any."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        r = ip.run_cell(cell, store_history=True)
    err = r.error_in_exec or r.error_before_exec
    return out.getvalue(), (f"{type(err).__name__}: {err}" if err is not None else None)


found["load_ext"] = run("%load_ext vramlab")
found["show"] = run("%vram")
text, err = run("_j = %vram --json")
found["json_error"] = err
out, err = run("%vram --json")
try:
    found["json_keys"] = sorted(json.loads(out))
except ValueError as e:
    found["json_keys"] = f"not JSON: {e}: {out[:200]!r}"
found["watch"] = run("_m = %vram watch")
found["monitor_type"] = run("print(type(__import__('vramlab').api.monitors()[0]).__name__)")
found["stop"] = run("%vram stop")
found["cell"] = run("%%vram\n_x = bytearray(8 << 20)\n")
found["auto_on"] = run("%vram auto on")
found["auto_cell"] = run("_y = bytearray(4 << 20)")
found["auto_off"] = run("%vram auto off")
found["last"] = run("print(__import__('vramlab').last().text())")
found["plot_magic"] = run("%vram plot")
found["plot_api"] = run("import vramlab; vramlab.plot()")
found["virtual_gpu"] = run("vramlab.VirtualGPU('T4')")
found["estimate"] = run("vramlab.estimate")
found["find_max_batch_size"] = run("vramlab.find_max_batch_size")
found["sim_import"] = run("from vramlab.sim import VirtualGPU")
found["presets"] = run("from vramlab.sim import get_preset; print(get_preset('T4').name)")
found["modules"] = sorted(m for m in ("torch", "matplotlib", "numpy") if m in sys.modules)
print("FOUND " + json.dumps(found))
