"""The fit verdict is the caching allocator's own at the card's limit (issue: verdicts that hold).

``estimate()`` runs the allocator with the card's memory, less the modelled context, and its
release-and-retry chain, as a VirtualGPU of that card runs the real step: "does not fit" means
the allocator would raise. For each model and card of the grid, the largest batch that really
runs in a VirtualGPU of the card (``measure()``, real tensors) is found by bisection; there and
one batch above it, the estimate's verdict equals the real outcome, and where it fits its peaks
equal the real ones.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from vramlab import estimate  # noqa: E402
from vramlab.lessons import models  # noqa: E402
from vramlab.sim.measure import measure  # noqa: E402

pytestmark = pytest.mark.usefixtures("no_leftover_gpu")

GRID = [
    ("cnn", models.make_cnn, {}, "48MiB"),
    ("cnn", models.make_cnn, {}, "96MiB"),
    ("mlp", models.make_mlp, {}, "160MiB"),
    ("gpt", models.make_gpt, {"size": "tiny", "seq": 128}, "256MiB"),
]


def _kw(triple, b: int, card: str, **extra) -> dict:
    build, make_batch, loss_fn = triple
    return dict(build_model=build, make_batch=make_batch, batch_size=b, optimizer="adam", loss_fn=loss_fn,
                device=card, allocator="caching", **extra)


def _real(triple, b: int, card: str):
    """The step run for real in a VirtualGPU of the card: its Estimate, or None on its OOM."""
    try:
        return measure(**_kw(triple, b, card))
    except torch.OutOfMemoryError:
        return None


def _largest_real(triple, card: str) -> int:
    lo, hi = 0, 1
    while _real(triple, hi, card) is not None:
        lo, hi = hi, hi * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if _real(triple, mid, card) is not None:
            lo = mid
        else:
            hi = mid
    return lo


@pytest.mark.parametrize("name,factory,kw,card", GRID, ids=[f"{g[0]}-{g[3]}" for g in GRID])
@pytest.mark.slow
def test_the_verdict_equals_the_real_run_on_the_card(name, factory, kw, card):
    triple = factory(**kw)
    b = _largest_real(triple, card)
    assert b >= 1, f"{name} fits no batch on {card}: the grid point tests nothing"
    for batch in (b, b + 1):
        e = estimate(**_kw(triple, batch, card))
        m = _real(triple, batch, card)
        assert e.fits is (m is not None), f"{name} on {card}, batch {batch}"
        if m is not None:
            assert (e.peak, e.peak_reserved, e.breakdown) == (m.peak, m.peak_reserved, m.breakdown)
            assert e.num_alloc_retries == m.num_alloc_retries
        else:
            assert e.num_alloc_retries is None
            assert e.needed > e.budget, "what the step needs, from a run without the card's limit"
            assert any("refused a request" in n for n in e.notes)


@pytest.mark.slow
def test_a_step_that_fits_only_by_emptying_the_cache_is_said_to_fit_and_why():
    """At the card's limit the allocator frees its cached segments and retries; an unbounded
    allocator's reserved peak passes the card, and the old verdict said "does not fit"."""
    triple = models.make_cnn()
    found = None
    for b in (64, 256, 1000):
        unbounded = estimate(**_kw(triple, b, None))
        # cards between the allocated peak and the cache's unbounded reserved peak, 8 MiB apart
        lo, hi = -(-unbounded.peak // 2**23), unbounded.peak_reserved // 2**23
        for card_mib in range(8 * lo, 8 * hi, 8):
            card = f"{card_mib}MiB"
            e = estimate(**_kw(triple, b, card))
            if e.fits and e.num_alloc_retries:
                found = (card, b, e)
                break
        if found:
            break
    assert found is not None, "no grid point where the step fits only by emptying the cache"
    card, b, e = found
    m = measure(**_kw(triple, b, card))  # really runs on the card
    assert m.num_alloc_retries == e.num_alloc_retries > 0
    unbounded = estimate(**_kw(triple, b, None))
    assert unbounded.peak_reserved > e.budget, "without the card's limit the cache would have grown past it"
    assert any("emptied its cache" in n for n in e.notes)
    html = e._repr_html_()
    assert "reserved by the caching allocator" in html and "emptied its cache" in html


@pytest.mark.slow
def test_each_rank_of_a_data_parallel_step_is_judged_at_the_card_s_limit():
    """Under a strategy, each rank's caching allocator runs bounded at the card, as one device's
    does: a card between a rank's allocated peak and its unbounded reserved peak is not "does
    not fit" because of a cache the allocator would have emptied; below the allocated peak it
    refuses, and says what it refused."""
    build, make_batch, loss_fn = models.make_cnn()
    kw = dict(build_model=build, make_batch=make_batch, batch_size=256, optimizer="adam", loss_fn=loss_fn,
              allocator="caching", world_size=2, strategy="ddp")
    unbounded = estimate(**kw)
    assert unbounded.peak_reserved > unbounded.peak
    below = estimate(**kw, device=f"{unbounded.peak // 2**20 - 2}MiB")
    assert below.fits is False and below.num_alloc_retries is None
    assert any("refused a request" in n for n in below.notes)
    assert below.peak == unbounded.peak, "the figures are what the rank needs, from a run without the limit"
    verdicts = []
    for mib in range(-(-unbounded.peak // 2**20) + 2, unbounded.peak_reserved // 2**20, 2):
        e = estimate(**kw, device=f"{mib}MiB")
        verdicts.append(e.fits)
        if e.fits:
            assert e.peak_reserved <= e.budget
            break
    assert True in verdicts, "no card below the unbounded reserved peak holds the step: the cache is never emptied"


def _masked_loss(out, y):
    keep = (y != 0).nonzero().squeeze(1)  # a shape that depends on the labels' values
    return torch.nn.functional.cross_entropy(out[keep], y[keep])


def test_a_step_that_needs_values_gets_one_clear_error_and_the_way_through_runs():
    from vramlab.sim.estimate import StepNeedsValuesError

    kw = dict(build_model=lambda: torch.nn.Linear(64, 4), make_batch=lambda b: (torch.randn(b, 64),
                                                                                  torch.randint(0, 4, (b,))),
              batch_size=32, optimizer="adam", loss_fn=_masked_loss, device="T4")
    with pytest.raises(StepNeedsValuesError, match="nonzero") as info:
        estimate(**kw)
    assert info.value.__cause__ is None and info.value.__suppress_context__, "one message, no chained traceback"
    assert "vramlab.sim.measure" in str(info.value)
    m = measure(**kw)  # the way the message names: real values on a virtual T4
    assert m.fits and m.peak > 0
