"""The README says what is true: its transcript is what vramlab prints, and its commands are CI's."""

import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))

import readme_transcript  # noqa: E402


def _mask(text: str) -> list[str]:
    """Figures, times and column padding vary from run to run; words and layout do not."""
    text = re.sub(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d", "<time>", text)
    text = re.sub(r"\d+(\.\d+)?", "<n>", text)
    text = re.sub(r"<n> (B|KiB|MiB|GiB|TiB)\b", "<size>", text)  # the unit follows the figure
    text = re.sub(r"\[[#%.]+\]", "[<bar>]", text)  # the text bar's proportions follow the figures
    return [" ".join(line.split()) for line in text.splitlines()]


@pytest.mark.slow
def test_the_readme_transcript_is_what_a_fresh_session_prints():
    real = readme_transcript.transcript()
    shown = readme_transcript.readme_block((ROOT / "README.md").read_text())
    assert _mask(shown) == _mask(real), "run: python3 tools/readme_transcript.py --write\n" + real
    # the usage error lists every subcommand and the whole usage line, verbatim
    error = [line for line in real.splitlines() if line.startswith(("UsageError", "usage:"))]
    assert len(error) == 2 and all(line in shown.splitlines() for line in error)


@pytest.mark.parametrize("name", ["README.md", "README.pt-BR.md"])
def test_the_readme_commands_are_the_ones_ci_runs(name):
    readme = (ROOT / name).read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    blocks = re.findall(r"```bash\n(.*?)```", readme, flags=re.S)
    install = [b.strip() for b in blocks if "pip install" in b][0]
    test = [b.strip() for b in blocks if "pytest" in b][0]
    assert install in ci.splitlines() and test in ci.splitlines()
    assert ci.strip().splitlines()[-1] == test
    workbook = [b.strip() for b in blocks if b.startswith("jupyter lab")]
    assert workbook == ["jupyter lab notebooks/"]  # the one command that runs the workbook, in both
