"""The English strings vramlab passes to ``vramlab.i18n.tr`` (string literals, concatenated),
for the runtime catalog ``vramlab/locale/<lang>/LC_MESSAGES/vramlab.po``.

    python tools/extract_runtime_strings.py            # list them
    python tools/extract_runtime_strings.py --update   # add missing ones to each catalog (empty)
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import polib

ROOT = Path(__file__).resolve().parent.parent
PKG = ROOT / "vramlab"

#: Notes the probes write in English that the display translates (``vramlab.i18n.tr_note``):
#: the detail of "NVML unavailable: ..." and the other notes a learner must understand.
NOTES = (
    "NVML unavailable: {detail}",
    "no NVML library (no NVIDIA driver installed)",
    "the NVIDIA driver is not loaded",
    "no permission to talk to the NVIDIA driver",
    "torch is not imported: allocator figures are not read",
)


def tr_strings() -> dict[str, list[str]]:
    """Every literal first argument of a call to ``tr`` in the package, with where it is."""
    found: dict[str, list[str]] = {}
    for path in sorted(PKG.rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "tr"
                    and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
                found.setdefault(node.args[0].value, []).append(f"{path.relative_to(ROOT)}:{node.lineno}")
    for n in NOTES:
        found.setdefault(n, []).append("notes (vramlab.i18n.tr_note)")
    sys.path.insert(0, str(ROOT))
    from vramlab.model import DEVICE_LAYERS, HOST_LAYERS

    for label in (*HOST_LAYERS.values(), *DEVICE_LAYERS.values()):  # shown through tr() by the displays
        found.setdefault(label, []).append("layer labels (vramlab.model)")
    return found


def main(argv: list[str]) -> int:
    strings = tr_strings()
    if "--update" not in argv:
        for s, where in strings.items():
            print(f"{where[0]}: {s}")
        return 0
    for po_path in sorted((PKG / "locale").glob("*/LC_MESSAGES/vramlab.po")):
        po = polib.pofile(str(po_path), wrapwidth=0)
        have = {e.msgid for e in po}
        for s, where in strings.items():
            if s not in have:
                po.append(polib.POEntry(msgid=s, msgstr="", occurrences=[(w, "") for w in where]))
        po.save(str(po_path))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
