import csv
import json

import pytest

from vramlab.runtime.history import history


def test_export_json_and_csv(tmp_path, recorded_history):
    h = recorded_history
    p = h.export(tmp_path / "h.json")
    d = json.load(open(p))
    assert len(d["cells"]) == 3 and len(d["samples"]) == 4 and d["markers"][0]["label"] == "[7]"
    p = h.export(tmp_path / "cells.csv")
    rows = list(csv.DictReader(open(p)))
    assert len(rows) == 3 and rows[0]["execution_count"] == "7" and "host_peak_delta" in rows[0]
    p = h.export(tmp_path / "samples.csv", which="samples")
    rows = list(csv.DictReader(open(p)))
    assert len(rows) == 4 and int(rows[0]["rss"]) > 0


def test_export_bad_paths(tmp_path, recorded_history):
    h = recorded_history
    with pytest.raises(ValueError, match="suffix"):
        h.export(tmp_path / "h.txt")
    with pytest.raises(OSError, match="does not exist"):
        h.export(tmp_path / "missing" / "h.csv")


def test_text_table_and_pandas(recorded_history):
    h = recorded_history
    t = h.text()
    assert t.splitlines()[0].split()[:2] == ["cell", "wall"]
    assert len(t.splitlines()) == 4
    try:
        import pandas  # noqa: F401
    except ImportError:
        with pytest.raises(ImportError, match="pandas"):
            h.to_pandas()
    else:
        assert len(h.to_pandas()) == 3


def test_history_function_is_a_frozen_copy():
    h = history()
    assert isinstance(h.cells, tuple) and isinstance(h.samples, tuple)
