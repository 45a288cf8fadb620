"""The package as pip sees it: the built wheel's metadata, and a new user's environment
with no torch and no matplotlib (``pip install vramlab`` must never install torch)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _child_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV", "VRAMLAB_"))}
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    env["PYTHONUNBUFFERED"] = "1"
    return env


def _run(cmd: list[str], timeout: float, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=_child_env(),
                          preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL), **kw)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    r = _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", str(ROOT),
              "-w", str(out)], timeout=300)
    assert r.returncode == 0, r.stderr
    (whl,) = out.glob("vramlab-*.whl")
    return whl


def _metadata(whl: Path) -> list[tuple[str, str]]:
    with zipfile.ZipFile(whl) as z:
        (name,) = [n for n in z.namelist() if n.endswith(".dist-info/METADATA")]
        text = z.read(name).decode()
    head = text.split("\n\n", 1)[0]
    return [tuple(line.split(": ", 1)) for line in head.splitlines() if ": " in line]  # type: ignore[misc]


def _name(req: str) -> str:
    return re.split(r"[<>=!~;\[ ]", req, maxsplit=1)[0].lower()


@pytest.mark.slow
def test_the_wheel_requires_torch_and_matplotlib_only_under_extras(wheel):
    reqs = [v for k, v in _metadata(wheel) if k == "Requires-Dist"]
    core = sorted(_name(r) for r in reqs if "extra ==" not in r)
    assert core == ["ipython", "ipywidgets", "nvidia-ml-py", "psutil"]
    extras = {}
    for r in reqs:
        m = re.search(r"""extra == ["']([^"']+)["']""", r)  # either quote: backends differ
        if m:
            extras.setdefault(m.group(1), set()).add(_name(r))
    assert "torch" in extras["sim"] and "matplotlib" in extras["plot"]
    assert {"torch", "matplotlib", "jupyterlab", "notebook"} <= extras["workbook"]
    assert "lab" not in extras  # it clashed with the old vramlab.server module
    assert not any("torch" in r and "<" in r for r in reqs), "no upper bound on torch: any newer torch is kept"


@pytest.mark.slow
def test_the_wheel_declares_the_python_it_is_tested_on_and_carries_the_license(wheel):
    meta = dict(_metadata(wheel))
    assert meta["Requires-Python"] == tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["requires-python"]
    low = tuple(int(x) for x in meta["Requires-Python"].removeprefix(">=").split("."))
    assert sys.version_info[:2] >= low
    with zipfile.ZipFile(wheel) as z:
        licence = [n for n in z.namelist() if n.endswith("LICENSE")]
        assert licence and z.read(licence[0]).decode() == (ROOT / "LICENSE").read_text()
    assert "MIT" in (ROOT / "LICENSE").read_text().splitlines()[0]
    assert meta.get("License") == "MIT" or "MIT" in meta.get("License-Expression", "")


@pytest.mark.slow
def test_a_fresh_environment_without_torch_or_matplotlib(wheel, tmp_path):
    """pip install vramlab into a new virtual environment: no torch, no matplotlib; the
    documented surface works, and what needs them says in one line what to install."""
    venv = tmp_path / "venv"
    r = _run([sys.executable, "-m", "venv", str(venv)], timeout=120)
    assert r.returncode == 0, r.stderr
    py = venv / "bin" / "python"
    r = _run([str(py), "-m", "pip", "install", "-q", str(wheel)], timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    r = _run([str(py), "-m", "pip", "list", "--format=json"], timeout=120)
    installed = {p["name"].lower() for p in json.loads(r.stdout)}
    assert "torch" not in installed and "matplotlib" not in installed, sorted(installed)
    assert {"ipython", "ipywidgets", "psutil", "nvidia-ml-py", "vramlab"} <= installed

    r = _run([str(py), str(ROOT / "tests" / "no_torch_session.py")], timeout=300, cwd=str(tmp_path))
    lines = [line for line in r.stdout.splitlines() if line.startswith("FOUND ")]
    assert r.returncode == 0 and lines, r.stdout[-3000:] + r.stderr[-3000:]
    f = json.loads(lines[0][len("FOUND "):])

    for key in ("load_ext", "show", "watch", "stop", "cell", "auto_on", "auto_cell", "auto_off", "last", "presets"):
        assert f[key][1] is None, (key, f[key])
    assert f["load_ext"][0] == ""
    assert "vramlab snapshot" in f["show"][0] and "host" in f["show"][0]
    assert "torch is not imported" in f["show"][0]
    assert f["json_error"] is None and f["json_keys"] == ["devices", "host", "notes", "time", "time_iso"]
    assert f["monitor_type"][0].strip() == "Monitor"
    assert "sampler stopped" in f["stop"][0]
    assert "host RSS" in f["cell"][0] and "peak during cell" in f["cell"][0]
    assert "per-cell records on" in f["auto_on"][0] and "RSS +" in f["auto_cell"][0]
    assert "host RSS" in f["last"][0]
    assert f["presets"][0].strip() == "T4"

    # what needs matplotlib or torch: one line, saying what to install, and no traceback
    for key, extra in (("plot_magic", "plot"), ("plot_api", "plot"), ("virtual_gpu", "sim"),
                       ("estimate", "sim"), ("find_max_batch_size", "sim"), ("sim_import", "sim")):
        printed, err = f[key]
        assert err is not None, key
        assert f"pip install 'vramlab[{extra}]'" in printed, (key, printed)
        assert printed.count("\n") == 1 and "Traceback" not in printed and "File " not in printed, (key, printed)
    assert f["plot_magic"][1].startswith("UsageError")
    assert f["virtual_gpu"][1].startswith("MissingExtra")
    assert f["modules"] == [], "nothing imported torch, matplotlib or numpy"


def test_the_wheel_carries_the_prebuilt_lab_extension_and_enables_the_server_extension(wheel):
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        data = [n for n in names if ".data/data/" in n]
        lab = [n.split(".data/data/", 1)[1] for n in data]
        assert "share/jupyter/labextensions/vramlab/package.json" in lab
        assert "share/jupyter/labextensions/vramlab/install.json" in lab
        assert any(re.fullmatch(r"share/jupyter/labextensions/vramlab/static/remoteEntry\.[0-9a-f]+\.js", n) for n in lab)
        (conf,) = [n for n in data if n.endswith("etc/jupyter/jupyter_server_config.d/vramlab.json")]
        assert json.loads(z.read(conf)) == {"ServerApp": {"jpserver_extensions": {"vramlab.server": True}}}
        (pkg,) = [n for n in data if n.endswith("labextensions/vramlab/package.json")]
        built = json.loads(z.read(pkg))
    source = json.loads((ROOT / "package.json").read_text())
    from vramlab import __version__

    assert built["name"] == source["name"] == "vramlab"
    assert built["version"] == source["version"] == __version__, "package.json follows vramlab/_version.py"
    assert "vramlab/server/handlers.py" in names and not any("node_modules" in n for n in names)
    assert not any(n.startswith("vramlab/labextension/") for n in names), "the extension is in the wheel once"
    # the checkout's QA tools stay in the checkout: the GPU report reads notebooks/ and benchmarks/
    assert "vramlab/selftest.py" in names and not any(n.endswith("gpu_report.py") for n in names)


@pytest.mark.slow
def test_an_sdist_with_the_built_extension_makes_a_wheel_without_node(tmp_path):
    """The sdist carries the built extension, so pip builds its wheel on a machine without
    Node: here a PATH that holds Python and nothing else (no node, no jlpm)."""
    import shutil

    if not (ROOT / "vramlab" / "labextension" / "static" / "style.js").exists():
        pytest.skip("the extension is not built in this checkout (pip install -e . builds it)")
    r = _run([sys.executable, "-m", "hatchling", "build", "-t", "sdist", "-d", str(tmp_path / "sdist")],
             timeout=300, cwd=str(ROOT))
    assert r.returncode == 0, r.stdout + r.stderr
    (sdist,) = (tmp_path / "sdist").glob("vramlab-*.tar.gz")
    bare = tmp_path / "bin"
    bare.mkdir()
    (bare / "python3").symlink_to(sys.executable)
    env = _child_env()
    env["PATH"] = str(bare)
    assert shutil.which("node", path=env["PATH"]) is None and shutil.which("jlpm", path=env["PATH"]) is None
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", str(sdist),
                        "-w", str(tmp_path / "out")], capture_output=True, text=True, timeout=300, env=env,
                       preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    assert r.returncode == 0, r.stdout + r.stderr
    (whl,) = (tmp_path / "out").glob("vramlab-*.whl")
    with zipfile.ZipFile(whl) as z:
        assert any(n.endswith("labextensions/vramlab/static/style.js") for n in z.namelist())
