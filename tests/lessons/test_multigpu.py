"""lessons.multigpu: the collectives of one training step, counted on real gloo ranks."""

from __future__ import annotations

import functools

import pytest

torch = pytest.importorskip("torch")

from vramlab.lessons.models import make_mlp  # noqa: E402
from vramlab.lessons.multigpu import (  # noqa: E402
    STRATEGIES, CommCount, communication_per_step, communication_per_step_many, fsdp_units, ring_bytes_sent)

# every weight's first dimension is even, so FSDP2 shards 2 ways without padding
SMALL = functools.partial(make_mlp, inputs=64, width=128, depth=2)


@pytest.fixture(scope="module")
def two_ranks():
    return communication_per_step_many(SMALL, world_size=2, batch_size=4)


@pytest.mark.slow
def test_every_rank_reports_and_the_ranks_agree(two_ranks):
    assert set(two_ranks) == set(STRATEGIES)
    for strategy, counts in two_ranks.items():
        assert [c.rank for c in counts] == [0, 1]
        if strategy == "zero1":  # each rank is the root of its own partition's broadcast
            for c in counts:
                assert c.payload["all_reduce"] == counts[0].payload["all_reduce"]
                assert c.payload["broadcast_root"] + c.payload["broadcast_last"] == c.parameter_bytes
        else:
            assert counts[0].payload == counts[1].payload, strategy  # data parallel: the same collectives


@pytest.mark.slow
def test_ddp_all_reduces_every_gradient_once(two_ranks):
    c = two_ranks["ddp"][0]
    p = c.parameter_bytes
    assert p == 4 * sum(q.numel() for q in SMALL()[0]().parameters())
    assert c.payload == {"all_reduce": p}  # the buckets hold every gradient, once


@pytest.mark.slow
def test_zero1_adds_a_broadcast_of_the_updated_parameters(two_ranks):
    """ZeroRedundancyOptimizer broadcasts each partition from its owner: at 2 ranks a rank sends
    its own partition and, as the last receiver of the other's, nothing more."""
    c0, c1 = two_ranks["zero1"]
    p = c0.parameter_bytes
    for c in (c0, c1):
        assert set(c.payload) == {"all_reduce", "broadcast_root", "broadcast_last"}
        assert c.payload["all_reduce"] == p and c.payload["broadcast_root"] + c.payload["broadcast_last"] == p
    assert c0.payload["broadcast_root"] == c1.payload["broadcast_last"]
    ddp = ring_bytes_sent(two_ranks["ddp"][0].payload, 2)
    assert ring_bytes_sent(c0.payload, 2) + ring_bytes_sent(c1.payload, 2) == 2 * ddp + p  # one copy of the weights


@pytest.mark.slow
def test_fsdp_gathers_the_parameters_twice_and_reduce_scatters_the_gradients(two_ranks):
    c = two_ranks["fsdp"][0]
    p = c.parameter_bytes
    assert c.payload == {"all_gather": 2 * p, "reduce_scatter": p}  # forward and backward gathers
    assert c.calls["all_gather"] == 2 * c.calls["reduce_scatter"]
    # under the ring algorithm FSDP sends 1.5 times what DDP sends, for two ranks
    assert ring_bytes_sent(c.payload, 2) == 3 * ring_bytes_sent(two_ranks["ddp"][0].payload, 2) // 2


def test_ring_bytes_sent_is_the_ring_algorithms_arithmetic():
    assert ring_bytes_sent({"all_reduce": 800}, 4) == 1200  # 2 (N-1)/N
    assert ring_bytes_sent({"all_gather": 800, "reduce_scatter": 400}, 4) == 900  # (N-1)/N
    assert ring_bytes_sent({"broadcast_root": 100, "broadcast_forward": 50, "broadcast_last": 70}, 8) == 150
    assert CommCount(rank=0, payload={"all_reduce": 5, "broadcast": 2}).total == 7


def test_fsdp_units_are_the_layers_then_the_root():
    model = SMALL()[0]()
    units = fsdp_units(model)
    assert units[-1] is model
    assert all(any(True for _ in u.parameters()) for u in units)
    assert len(units) == 1 + sum(1 for m in model.modules() if isinstance(m, torch.nn.Linear))


def test_bad_arguments_say_what_is_wrong():
    with pytest.raises(ValueError, match="strategy must be one of"):
        communication_per_step(SMALL, strategy="zero3", world_size=2, batch_size=4)
    with pytest.raises(ValueError, match="world_size"):
        communication_per_step(SMALL, strategy="ddp", world_size=1, batch_size=4)


@pytest.mark.slow
def test_a_failing_rank_is_reported_with_its_traceback():
    with pytest.raises(RuntimeError, match="a rank failed"):
        communication_per_step(functools.partial(make_mlp, inputs=-1), strategy="ddp", world_size=2, batch_size=4,
                               timeout=60)
