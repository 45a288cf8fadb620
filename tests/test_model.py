"""vramlab.model: frozen data that renders through the renderers the display registers."""

from __future__ import annotations

import dataclasses
import json

import pytest

from vramlab import model
from vramlab.display.html import record_html, snapshot_html
from vramlab.display.text import history_text, record_line, record_text, snapshot_text
from vramlab.reconcile import snapshot
from vramlab.runtime.records import Recorder


def test_objects_render_through_the_registered_display():
    s = snapshot()
    bundle = s._repr_mimebundle_()
    assert bundle["text/plain"] == snapshot_text(s)
    assert bundle["text/html"] == snapshot_html(s)
    r = Recorder()
    rec = r.end(r.begin(3))
    assert rec.text() == record_text(rec) and rec.line() == record_line(rec)
    assert rec._repr_mimebundle_()["text/html"] == record_html(rec)
    h = model.History(cells=(rec,), samples=(), markers=())
    assert h.text(last=5) == history_text(h, last=5)


def test_a_registered_renderer_replaces_the_earlier_one():
    s = snapshot()
    old = model._RENDERERS["snapshot.text"]
    try:
        model.register_renderer("snapshot.text", lambda snap: f"{len(snap.devices)} devices")
        assert s._repr_mimebundle_()["text/plain"] == f"{len(s.devices)} devices"
    finally:
        model.register_renderer("snapshot.text", old)
    assert s._repr_mimebundle_()["text/plain"] == snapshot_text(s)


def test_snapshots_are_frozen_and_json_safe():
    s = snapshot()
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.time = 0  # type: ignore[misc]
    json.dumps(s.to_dict())
    with pytest.raises(KeyError, match="no device 'cuda:9'"):
        s.device("cuda:9")


def test_layer_labels_cover_every_layer_key():
    s = snapshot()
    assert {k for k, _ in s.host.layers} <= set(model.HOST_LAYERS)
    for d in s.devices:
        assert {k for k, _ in d.layers} <= set(model.DEVICE_LAYERS)


def test_a_sample_names_its_device_figures_and_still_unpacks_as_a_tuple():
    s = model.Sample(time=1.0, rss=1, peak=None, host_used=2, available=3, limit=4, swap_used=None, swap_in=None,
                     swap_out=None, devices=(model.DeviceSample("cuda:0", 10, 20, 30, 40),))
    (d,) = s.devices
    assert (d.id, d.allocated, d.reserved, d.used, d.total) == ("cuda:0", 10, 20, 30, 40)
    id_, alloc, reserved, used, total = d
    assert (id_, used, total) == ("cuda:0", 30, 40) and d[3] == 30
    # a plain 5-tuple, as older code built them, becomes a DeviceSample
    old = dataclasses.replace(s, devices=(("virtual:0", None, None, 5, 6),))
    assert type(old.devices[0]) is model.DeviceSample and old.devices[0].total == 6
    assert model.History(cells=(), samples=(s,), markers=()).sample_rows()[0]["cuda:0_used"] == 30
