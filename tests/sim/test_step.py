"""sim/step.py: activation checkpointing as an option of the step, and the units it names."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from torch import nn  # noqa: E402

from vramlab.lessons import models  # noqa: E402
from vramlab.sim.estimate import estimate  # noqa: E402
from vramlab.sim.measure import measure  # noqa: E402
from vramlab.sim.step import build_on_meta, checkpoint_modules, default_units  # noqa: E402


def test_layers_are_the_blocks_of_module_lists() -> None:
    build, _, _ = models.make_gpt("tiny", seq=64)
    m = build_on_meta(build, None)
    units = checkpoint_modules(m, "layers")
    assert units and all(type(u).__name__.endswith("Block") for u in units)
    assert units == [u for u in default_units(m) if type(u).__name__.endswith("Block")]


def test_a_predicate_picks_the_outermost_matches() -> None:
    m = nn.Sequential(nn.Sequential(nn.Linear(2, 2), nn.ReLU()), nn.Linear(2, 2))
    picked = checkpoint_modules(m, lambda mod: isinstance(mod, (nn.Sequential, nn.Linear)))
    assert picked == [m[0], m[1]]  # the inner Linear is inside a checkpointed block


@pytest.mark.parametrize("bad", ["blocks", 3])
def test_a_bad_checkpoint_gets_one_clear_message(bad) -> None:
    build, make_batch, loss_fn = models.make_gpt("tiny", seq=64)
    with pytest.raises(ValueError, match="checkpoint must be"):
        estimate(build, make_batch, batch_size=2, optimizer="adam", loss_fn=loss_fn, checkpoint=bad)


@pytest.mark.slow
def test_checkpointing_the_layers_drops_their_saved_activations() -> None:
    """Each block saves only its input; the estimate equals the VirtualGPU's measurement of the
    same checkpointed step."""
    build, make_batch, loss_fn = models.make_gpt("tiny", seq=64)
    plain = estimate(build, make_batch, batch_size=8, optimizer="adam", loss_fn=loss_fn)
    ck = estimate(build, make_batch, batch_size=8, optimizer="adam", loss_fn=loss_fn, checkpoint="layers")
    real = measure(build, make_batch, batch_size=8, optimizer="adam", loss_fn=loss_fn, checkpoint="layers")
    assert ck.checkpoint == 4 and plain.checkpoint == 0
    assert ck.breakdown["activations"] < plain.breakdown["activations"] / 2
    assert ck.peak < plain.peak
    assert (ck.peak, ck.breakdown) == (real.peak, real.breakdown)
    assert "checkpointing on 4 modules" in ck.text()


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
@pytest.mark.slow
def test_checkpointing_combines_with_a_strategy(strategy) -> None:
    build, make_batch, loss_fn = models.make_gpt("tiny", seq=64)
    kw = dict(batch_size=8, optimizer="adam", loss_fn=loss_fn, world_size=2, strategy=strategy)
    plain = estimate(build, make_batch, **kw)
    ck = estimate(build, make_batch, checkpoint="layers", **kw)
    assert ck.breakdown["activations"] < plain.breakdown["activations"]


def test_a_step_spec_is_the_same_step_as_its_fields() -> None:
    """estimate() and measure() take one Step value, passed whole, as well as its fields."""
    from vramlab.sim.step import Step

    build, make_batch, loss_fn = models.make_gpt("micro", seq=32)
    spec = Step(build, make_batch, batch_size=4, optimizer="adamw", loss_fn=loss_fn, precision="bf16-mixed")
    by_fields = estimate(build, make_batch, batch_size=4, optimizer="adamw", loss_fn=loss_fn, precision="bf16-mixed",
                         device="T4")
    by_spec = estimate(spec, device="T4")
    assert (by_spec.peak, by_spec.peak_reserved, by_spec.breakdown) == \
        (by_fields.peak, by_fields.peak_reserved, by_fields.breakdown)
    real = measure(spec, device="T4")
    assert (real.peak, real.breakdown) == (by_spec.peak, by_spec.breakdown)
    bigger = estimate(spec.with_batch(8), device="T4")
    assert bigger.batch_size == 8 and bigger.peak > by_spec.peak
    with pytest.raises(ValueError, match="either a Step or the step's arguments"):
        estimate(spec, batch_size=8)
    with pytest.raises(TypeError, match="make_batch is missing"):
        estimate(build, batch_size=8)
