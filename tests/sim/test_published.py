"""vramlab's estimates against published GPU measurements (benchmarks/published.py).

The only constants here are the published measured figures (in benchmarks/published.py, each with
its source and quote); every estimate is computed by the test, never stored. A row passes when
vramlab's figure for the row's counter (``peak_reserved`` + the page's 1343 MiB CUDA context for
NVML rows, ``peak`` for allocator rows) is within 10% of the measured one.

By default only the smallest rows run (about a minute on a 2-core CPU): four within 10% and one
known miss. ``VRAMLAB_PUBLISHED_ALL=1`` runs every row (about 8 minutes; the three 1-billion-
parameter Lightning rows take about two minutes each). Rows outside 10% are not asserted as
passing: they are listed in :data:`KNOWN_MISSES` with the ratio measured when this file was written
and what was found, and run as ``xfail(strict=True)``: a change to vramlab that brings one within
10% fails here, so that it is noticed and the row moves to :data:`WITHIN`.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers")

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import published  # noqa: E402

TOLERANCE = 0.10
ALL = os.environ.get("VRAMLAB_PUBLISHED_ALL", "").strip().lower() in ("1", "true", "yes", "on")
_ONLY_ALL = pytest.mark.skipif(not ALL, reason="a large row: set VRAMLAB_PUBLISHED_ALL=1 to run it")

#: Rows within 10% when this file was written (vramlab/measured, 2-core CPU run): B2 0.953, B3 0.997,
#: B5 0.999, B7 0.949, B9 0.999, L1 0.970, L2 0.957, L3 0.947, Q1 0.981, Q2 0.968, Q3 0.963, Q4 0.964. Each estimate takes 7-25 s on a 2-core CPU
#: (more under load), hence ``slow``; the default run (B2, B3, L1, Q4 and the miss B1) took about a minute.
WITHIN: dict[str, tuple] = {
    "B2": (pytest.mark.slow,),
    "B3": (pytest.mark.slow,),
    "L1": (pytest.mark.slow,),
    "B5": (pytest.mark.slow, _ONLY_ALL),
    "B7": (pytest.mark.slow, _ONLY_ALL),
    "L2": (pytest.mark.slow, _ONLY_ALL),
    "L3": (pytest.mark.slow, _ONLY_ALL),
    "B9": (pytest.mark.slow, _ONLY_ALL),
    "Q1": (pytest.mark.slow, _ONLY_ALL),
    "Q2": (pytest.mark.slow, _ONLY_ALL),
    "Q3": (pytest.mark.slow, _ONLY_ALL),
    "Q4": (pytest.mark.slow,),
}

#: Rows outside 10%: (vramlab/measured when this file was written, what was found). The longer
#: account is published.DIAGNOSES (also in docs/published-measurements.md); the what-if runs are
#: ``python benchmarks/bench_published.py --what-if-dropout``.
KNOWN_MISSES: dict[str, tuple[float, str]] = {
    "B1": (0.895, "activations short by ~389 MiB per sample (~16 MiB per layer per sample; ~404 MiB at batch 1 in "
                  "B2, 10-20 MiB in the checkpointed B3/B5); model states agree (B1-B6 2654 vs 2594 MiB). Dropout "
                  "keeping an input-dtype mask instead of CUDA's 1-byte mask would account for it (what-if 0.992), "
                  "but torch 1.11/1.12's CUDA dropout kept a bool mask; not identified (allocator fragmentation in "
                  "NVML's reserved figure is a candidate)"),
    "B4": (0.857, "the B1 shortfall plus ~8 MiB per layer per sample more under fp16 AMP (what-if with B1's "
                  "dropout: 0.947); the rest not identified (torch 1.11/1.12's CUDA autocast lists may differ from "
                  "torch 2.13's, which vramlab applies)"),
    "B8": (0.883, "the B1 activation shortfall; the 8-bit optimizer part agrees (B1 minus B8: 1864 MiB measured, "
                  "1818 estimated)"),
    "B6": (0.877, "the B1 activation shortfall (~1512 MiB at batch 4); the Adafactor state agrees; B1's dropout "
                  "what-if gives 1.001"),
    "L4": (0.555, "2 x A100 FSDP LoRA: Lightning 2.1's FSDP1 keeps gradients for the frozen weights that share a "
                  "FlatParameter with the adapters (1.31 GB per rank; with them 0.825), vramlab's FSDP2 does not; the "
                  "rest fixed and not identified (the counter also covers loading, validation and generation)"),
    "L5": (0.619, "as L4 (0.878 with FSDP1's frozen-weight gradients)"),
    "L6": (0.683, "as L4 (0.906 with FSDP1's frozen-weight gradients)"),
    "F1": (0.858, "one float32 copy of the parameters missing at the optimizer step (3836 of 3848 MiB; with it "
                  "1.000): the measured torch 2.1/Lightning 2.1 step held one more parameter-sized buffer; not "
                  "torch 2.1.0's foreach Adam (one intermediate, as 2.13's: read from its source); not identified"),
    "F3": (0.851, "as F1, per rank: about one float32 parameter shard missing (1762 of 1924 MiB; with it 1.014); "
                  "measured on FSDP1 SHARD_GRAD_OP, estimated on FSDP2 reshard_after_forward=False"),
    "F4": (0.833, "as F1, per rank: one float32 parameter shard missing (1929 of 1924 MiB; with it 1.000); "
                  "measured on FSDP1 FULL_SHARD, estimated on FSDP2 fully_shard"),
}
_MISS_MARKS: dict[str, tuple] = {
    "B1": (pytest.mark.slow,),
    "B8": (pytest.mark.slow, _ONLY_ALL),
    "B4": (pytest.mark.slow, _ONLY_ALL),
    "B6": (pytest.mark.slow, _ONLY_ALL),
    "L4": (pytest.mark.slow, _ONLY_ALL),
    "L5": (pytest.mark.slow, _ONLY_ALL),
    "L6": (pytest.mark.slow, _ONLY_ALL),
    "F1": (pytest.mark.slow, _ONLY_ALL),
    "F3": (pytest.mark.slow, _ONLY_ALL),
    "F4": (pytest.mark.slow, _ONLY_ALL),
}


def _check(row_id: str) -> None:
    row = published.BY_ID[row_id]
    res = published.run_row(row)
    assert abs(res.ratio - 1) <= TOLERANCE, (
        f"{row_id}: vramlab {res.compared / 2**20:.0f} MiB ({row.compared_as}) vs measured {row.measured_text} "
        f"({row.measured / 2**20:.0f} MiB, {row.counter}): ratio {res.ratio:.3f}, outside {TOLERANCE:.0%}")


def test_every_row_is_classified() -> None:
    """Each published row is either expected within 10% or a listed known miss, not both."""
    assert set(WITHIN) | set(KNOWN_MISSES) == set(published.BY_ID)
    assert not set(WITHIN) & set(KNOWN_MISSES)
    assert set(_MISS_MARKS) == set(KNOWN_MISSES)
    assert set(published.DIAGNOSES) == set(KNOWN_MISSES)


@pytest.mark.parametrize("row_id", [pytest.param(r, marks=list(m), id=r) for r, m in WITHIN.items()])
def test_within_ten_percent(row_id: str) -> None:
    _check(row_id)


@pytest.mark.parametrize("row_id", [
    pytest.param(r, id=r, marks=[*_MISS_MARKS[r],
                                 pytest.mark.xfail(strict=True, reason=f"known miss, ratio {ratio:.3f}: {why}")])
    for r, (ratio, why) in KNOWN_MISSES.items()])
def test_known_miss(row_id: str) -> None:
    _check(row_id)


@pytest.mark.slow
def test_published_models_match_their_sources() -> None:
    """The hand-typed configs build the models the sources name: their parameter counts (on the
    meta device; no estimate runs)."""
    import torch
    from transformers import BertForSequenceClassification, PhiForCausalLM

    with torch.device("meta"):
        bert = BertForSequenceClassification(published.bert_large_config())
        phi = published.add_lora(PhiForCausalLM(published.phi15_config()))
        demo = published.DemoTransformer()
    # bert-large-uncased with a 2-label head: 335,143,938 (the HF page's model)
    assert sum(p.numel() for p in bert.parameters()) == 335_143_938
    # litgpt printed "Number of trainable parameters: 1,572,864" for phi-1.5 (resource-tables.md)
    assert sum(p.numel() for p in phi.parameters() if p.requires_grad) == 1_572_864
    assert sum(p.numel() for p in phi.parameters() if not p.requires_grad) == 1_418_270_720
    # the Lightning docs' "1B parameters" demo Transformer
    assert sum(p.numel() for p in demo.parameters()) == 1_008_763_390


def test_other_estimators_reproduce_their_published_outputs() -> None:
    """The accelerate and DeepSpeed formulas re-implemented in published.py give the figures those
    tools' own docs print (so the comparison columns are theirs, not a paraphrase)."""
    import torch
    from transformers import BertConfig, BertModel, T5Config, T5Model

    # accelerate docs (docs/source/usage_guides/model_size_estimator.md), bert-base-cased:
    # "| float32 | 84.95 MB | 413.18 MB | 1.61 GB |" (binary units)
    with torch.device("meta"):
        bert_base = BertModel(BertConfig(vocab_size=28996))
    assert round(published.accelerate_training_bytes(bert_base, mixed=False) / 2**30, 2) == 1.61
    # HF docs (docs/source/en/deepspeed.md), AutoModel of bigscience/T0_3B (t5-v1_1-xl's shape):
    # "SW: Model with 2783M total params, 65M largest layer params ... 0.37GB | 46.91GB |
    # offload_param=none, offload_optimizer=none, zero_init=1"
    cfg = T5Config(vocab_size=32128, d_model=2048, d_kv=64, d_ff=5120, num_layers=24, num_heads=32,
                   feed_forward_proj="gated-gelu", tie_word_embeddings=False)
    with torch.device("meta"):
        t0 = T5Model(cfg)
    _, zero3 = published.deepspeed_model_states(t0, 1)
    assert round(zero3 / 2**30, 2) == 46.91


@pytest.mark.slow
@pytest.mark.parametrize("row_id", sorted(published.BNB_PAGED_STATE))
def test_paged_state_equals_what_bitsandbytes_kept_in_unified_memory(row_id: str) -> None:
    """The bitsandbytes table's "Optimizer State on CPU" (its paged buffers, in unified memory)
    against ``Estimate.paged`` for the same step, within 1%."""
    if row_id != "Q4" and not ALL:
        pytest.skip("a large row: set VRAMLAB_PUBLISHED_ALL=1 to run it")
    res = published.run_row(published.BY_ID[row_id])
    published_mib = float(published.BNB_PAGED_STATE[row_id])
    assert res.estimate.paged / 2**20 == pytest.approx(published_mib, rel=0.01)
