"""Every module and contract in docs/design.md: its generated sections are what the code says
now (tools/design_map.py), so a module or a contract that is added shows up there or fails here."""

from __future__ import annotations

import tomllib

from tool_modules import load_tool


def test_the_design_map_is_the_code_s():
    design_map = load_tool("design_map")
    text = design_map.DOC.read_text()
    assert design_map.render(text) == text, "docs/design.md is stale: python3 tools/design_map.py"


def test_every_module_and_contract_is_named_in_it():
    design_map = load_tool("design_map")
    text = design_map.DOC.read_text()
    for path in design_map.PKG.rglob("*.py"):
        if "labextension" not in path.parts:
            name = path.parent.name + "/" if path.name == "__init__.py" else path.name
            assert name in text, path
    conf = tomllib.loads((design_map.ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    for c in conf:
        assert f"| {c['id']} |" in text, c["id"]
