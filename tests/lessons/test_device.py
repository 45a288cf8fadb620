"""vramlab.lessons.device: pick_device's attach()/detach() on the virtual GPU."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import vramlab  # noqa: E402

MiB = 2**20


def test_attach_keeps_the_virtual_card_active_between_measurements_and_detach_ends_it(monkeypatch):
    monkeypatch.setenv("VRAMLAB_DEVICE", "virtual")
    dev = vramlab.pick_device(virtual="64MiB")
    assert not dev.virtual.active
    assert not [d for d in vramlab.snapshot().devices if d.id.startswith("virtual")]
    dev.attach()
    try:
        t = torch.empty(4 * MiB, dtype=torch.uint8)  # outside measure(): the card's, as on a card
        assert dev.allocated() >= 4 * MiB
        assert [d for d in vramlab.snapshot().devices if d.id.startswith("virtual")]  # records see it
        with dev.measure() as m:  # measure() leaves an attached card active
            u = torch.empty(2 * MiB, dtype=torch.uint8)
        assert m.peak_delta >= 2 * MiB and dev.virtual.active
        del t, u
    finally:
        dev.detach()
    assert not dev.virtual.active
    dev.detach()  # twice: nothing more to undo
    assert not dev.virtual.active
