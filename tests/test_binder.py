"""The Binder files: what repo2docker needs to build the workbook's image (it cannot be built here)."""

import os
import re
import stat
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BINDER = ROOT / "binder"


def reqs():
    lines = [line.split("#")[0].strip() for line in (BINDER / "requirements.txt").read_text().splitlines()]
    return [line for line in lines if line]


def test_runtime_names_a_supported_python():
    text = (BINDER / "runtime.txt").read_text().strip()
    m = re.fullmatch(r"python-3\.(\d+)", text)
    assert m, f"repo2docker wants 'python-X.Y', got {text!r}"
    requires = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["requires-python"]
    assert int(m.group(1)) >= int(requires.split(".")[1])


def test_requirements_use_the_cpu_torch_wheel():
    r = reqs()
    assert any(line.startswith("--extra-index-url") and line.rstrip("/").endswith("/whl/cpu") for line in r)
    torch = [line for line in r if re.match(r"torch\b", line)]
    assert len(torch) == 1 and "+cpu" in torch[0]
    version = re.search(r"==(\d+)\.(\d+)", torch[0])
    from vramlab._extras import MIN_TORCH

    low = tuple(int(x) for x in MIN_TORCH.split("."))
    assert version and (int(version.group(1)), int(version.group(2))) >= low
    # the torch CI tests (.ci/run), so Binder runs what CI ran
    ci = re.search(r'torch==([\d.]+)', (ROOT / ".ci" / "run").read_text())
    assert ci and f"torch=={ci.group(1)}+cpu" == torch[0]


def test_requirements_cover_the_package_dependencies_and_jupyterlab():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    deps = project["dependencies"] + project["optional-dependencies"]["workbook"]
    names = {re.split(r"[<>=!~\[ ]", line, maxsplit=1)[0].lower() for line in reqs() if not line.startswith("-")}
    for dep in deps:
        name = re.split(r"[<>=!~\[ ]", dep, maxsplit=1)[0].lower()
        assert name in names, f"{name} missing from binder/requirements.txt"
    assert "jupyterlab" in names and "ipywidgets" in names


def test_postbuild_is_strict_executable_and_installs_the_package():
    p = BINDER / "postBuild"
    text = p.read_text()
    assert text.startswith("#!/bin/bash")
    assert "set -euo pipefail" in text
    assert os.stat(p).st_mode & stat.S_IXUSR
    assert re.search(r"pip install .*-e \.", text)


def test_readme_badge_opens_the_first_notebook():
    readme = (ROOT / "README.md").read_text()
    m = re.search(r"\(https://mybinder\.org/v2/gh/[^)]+\)", readme)
    assert m and "labpath=notebooks%2F00_start_here.ipynb" in m.group(0)
    assert (ROOT / "notebooks" / "00_start_here.ipynb").exists()


def test_the_portuguese_readme_badge_opens_the_portuguese_first_notebook():
    readme = (ROOT / "README.pt-BR.md").read_text()
    m = re.search(r"\(https://mybinder\.org/v2/gh/[^)]+\)", readme)
    assert m and "labpath=notebooks%2Fpt-BR%2F00_start_here.ipynb" in m.group(0)
    assert (ROOT / "notebooks" / "pt-BR" / "00_start_here.ipynb").exists()
    assert "README.pt-BR.md" in (ROOT / "README.md").read_text()  # linked from the top of the English one
