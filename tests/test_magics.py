import json

import pytest
from IPython.core.error import UsageError
from IPython.utils.capture import capture_output


def test_load_registers_and_vram_displays_both_mimetypes(ip):
    ip.run_line_magic("load_ext", "vramlab")
    assert "vram" in ip.magics_manager.magics["line"]
    with capture_output() as cap:
        ip.run_line_magic("vram", "")
    assert len(cap.outputs) == 1
    data = cap.outputs[0].data
    assert "text/plain" in data and "text/html" in data
    plain, html = data["text/plain"], data["text/html"]
    assert "host" in plain and "this process" in plain and "available" in plain
    assert "iB" in plain  # figures with units
    assert "vramlab-bar" in html and "this process" in html


def test_json_prints_the_dict(ip):
    ip.run_line_magic("load_ext", "vramlab")
    with capture_output() as cap:
        ip.run_line_magic("vram", "--json")
    d = json.loads(cap.stdout)
    assert d["host"]["total"] > 0 and isinstance(d["devices"], list)


def test_show_subcommand_is_the_default(ip):
    ip.run_line_magic("load_ext", "vramlab")
    with capture_output() as cap:
        ip.run_line_magic("vram", "show --json")
    assert json.loads(cap.stdout)["host"]["limit"] > 0


@pytest.mark.parametrize("line,needle", [
    ("bogus", "unknown subcommand 'bogus'"),
    ("--nope", "unrecognized arguments: --nope"),
    ("show extra", "takes no arguments"),
])
def test_bad_arguments_are_usage_errors_with_usage_line(ip, line, needle):
    ip.run_line_magic("load_ext", "vramlab")
    with pytest.raises(UsageError) as e:
        ip.run_line_magic("vram", line)
    assert needle in str(e.value)
    assert "usage: %vram" in str(e.value)


def test_bad_argument_in_a_cell_shows_one_message_no_traceback(ip):
    ip.run_line_magic("load_ext", "vramlab")
    with capture_output() as cap:
        result = ip.run_cell("%vram bogus")
    assert not result.success
    text = cap.stdout + cap.stderr
    assert "UsageError" in text and "unknown subcommand" in text
    assert "Traceback" not in text


def test_help_is_the_manual(ip):
    ip.run_line_magic("load_ext", "vramlab")
    doc = ip.magics_manager.magics["line"]["vram"].__doc__
    assert "--json" in doc and "SUBCOMMAND" in doc


def test_load_twice_is_harmless_and_unload_removes_everything(ip):
    before_line = set(ip.magics_manager.magics["line"])
    before_cell = set(ip.magics_manager.magics["cell"])
    ip.run_line_magic("load_ext", "vramlab")
    ip.run_line_magic("load_ext", "vramlab")
    with capture_output() as cap:
        ip.run_line_magic("vram", "--json")
    assert cap.stdout.count('"host"') == 1
    ip.run_line_magic("unload_ext", "vramlab")
    assert set(ip.magics_manager.magics["line"]) == before_line
    assert set(ip.magics_manager.magics["cell"]) == before_cell
    ip.run_line_magic("load_ext", "vramlab")
    assert "vram" in ip.magics_manager.magics["line"]
