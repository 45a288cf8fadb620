"""The server's JSON and the frontend's types are one contract: what ``GET /vramlab/kernels``
answers (:func:`vramlab.server.handlers.reply` over a real reading) has exactly the fields that
``IReading``, ``IKernelRow`` and ``IDevice`` in ``src/wire.ts`` declare, each of the declared
type. A field added on one side only fails here."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.driver_scenarios import GiB, gpu, machine
from vramlab.server.config import VramlabLab
from vramlab.server.handlers import reply
from vramlab.server.readings import KernelMemoryService, KernelRef

ROOT = Path(__file__).resolve().parents[2]


def _interfaces(ts: str) -> dict[str, dict[str, tuple[bool, str]]]:
    """``{interface: {field: (optional, type text)}}`` of the ``export interface`` blocks of ``ts``;
    a nested object type is kept as its ``{ ... }`` text."""
    out: dict[str, dict[str, tuple[bool, str]]] = {}
    for m in re.finditer(r"export interface (\w+) \{", ts):
        i, depth, start = m.end(), 1, m.end()
        while depth:
            depth += {"{": 1, "}": -1}.get(ts[i], 0)
            i += 1
        out[m.group(1)] = _fields(ts[start:i - 1])
    return out


def _fields(body: str) -> dict[str, tuple[bool, str]]:
    body = re.sub(r"/\*\*.*?\*/", "", body, flags=re.S)
    fields, i = {}, 0
    while True:
        m = re.compile(r"\s*(\w+)(\??):\s*").match(body, i)
        if not m:
            break
        j, depth = m.end(), 0
        while j < len(body) and not (body[j] == ";" and depth == 0):
            depth += {"{": 1, "}": -1, "(": 1, ")": -1, "[": 1, "]": -1}.get(body[j], 0)
            j += 1
        fields[m.group(1)] = (m.group(2) == "?", body[m.end():j].strip())
        i = j + 1
    return fields


def _check(value, ts_type: str, types: dict, where: str) -> None:
    """``value`` (JSON) is of ``ts_type`` (TypeScript)."""
    alternatives = [t.strip() for t in _split_top(ts_type, "|")]
    errors = []
    for t in alternatives:
        try:
            _check_one(value, t, types, where)
            return
        except AssertionError as e:
            errors.append(str(e))
    raise AssertionError(f"{where}: {value!r} is none of {ts_type}: {errors}")


def _split_top(text: str, sep: str) -> list[str]:
    parts, depth, cur = [], 0, ""
    for ch in text:
        depth += {"{": 1, "}": -1, "(": 1, ")": -1, "[": 1, "]": -1}.get(ch, 0)
        if ch == sep and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    return [*parts, cur]


def _check_one(value, t: str, types: dict, where: str) -> None:
    if t == "null":
        assert value is None, where
    elif t == "number":
        assert isinstance(value, (int, float)) and not isinstance(value, bool), where
    elif t == "string":
        assert isinstance(value, str), where
    elif t == "boolean":
        assert isinstance(value, bool), where
    elif t.startswith("'"):
        assert value == t.strip("'"), where
    elif t.endswith("[]"):
        inner = t[:-2].strip()
        inner = inner[1:-1] if inner.startswith("(") else inner
        assert isinstance(value, list), where
        for k, v in enumerate(value):
            _check(v, inner, types, f"{where}[{k}]")
    elif t.startswith("[") and t.endswith("]"):
        items = [x.strip() for x in _split_top(t[1:-1], ",")]
        assert isinstance(value, list) and len(value) == len(items), where
        for k, (v, it) in enumerate(zip(value, items)):
            _check(v, it, types, f"{where}[{k}]")
    elif t.startswith("{"):
        _check_object(value, _fields(t[1:-1]), types, where)
    elif t in types:
        _check_object(value, types[t], types, f"{where}<{t}>")
    else:
        raise AssertionError(f"{where}: the test does not know the TypeScript type {t!r}")


def _check_object(value, fields: dict[str, tuple[bool, str]], types: dict, where: str) -> None:
    assert isinstance(value, dict), where
    undeclared = set(value) - set(fields)
    assert not undeclared, f"{where}: the server sends fields the frontend does not declare: {sorted(undeclared)}"
    for name, (optional, t) in fields.items():
        if name not in value:
            assert optional, f"{where}: the frontend expects {name!r}, which the server does not send"
            continue
        _check(value[name], t, types, f"{where}.{name}")


@pytest.mark.parametrize("stale", [False, True])
def test_the_server_s_answer_is_the_frontend_s_ireading(nvml_sim, sleeper, stale):
    types = _interfaces((ROOT / "src" / "wire.ts").read_text())
    assert {"IReading", "IKernelRow", "IDevice"} <= set(types)
    nvml_sim(machine(gpu(0, procs=[{"pid": sleeper, "mem": 1 * GiB}, {"pid": "hidden", "mem": 1 * GiB}]),
                     gpu(1, lost=True)))
    service = KernelMemoryService()
    refs = [KernelRef("k", sleeper, "python3", "a.ipynb"), KernelRef("r", None, "python3")]
    service.read(refs)
    body = reply(service.read(refs, uss=True), VramlabLab(), stale=stale)
    _check_object(body, types["IReading"], types, "reading")
    assert body["kernels"][0]["history"], "a running kernel carries its history"
    assert ("stale" in body) == stale
