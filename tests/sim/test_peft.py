"""A LoRA through PEFT on a 16-bit base: the adapters stay fp32, as PEFT keeps them by default
(``autocast_adapter_dtype=True``), and the estimate counts their gradients and Adam state in fp32."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from vramlab import estimate  # noqa: E402
from vramlab.sim.step import build_on_meta  # noqa: E402

CFG = dict(hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4,
           vocab_size=1000)


def _peft():  # type: ignore[no-untyped-def]
    """PEFT, imported when a test first needs it (about 10 s here: not at collection)."""
    return pytest.importorskip("peft")


def _build():
    peft = _peft()
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**CFG))
    return peft.get_peft_model(model, peft.LoraConfig(r=8, target_modules=["q_proj", "v_proj"]))


def _batch(b):
    ids = torch.randint(0, CFG["vocab_size"], (b, 64))
    return {"input_ids": ids, "labels": ids}


@pytest.mark.slow
def test_bf16_true_keeps_peft_s_adapters_in_fp32_as_peft_does():
    model = build_on_meta(_build, torch.bfloat16)
    lora = {p.dtype for n, p in model.named_parameters() if "lora_" in n}
    base = {p.dtype for n, p in model.named_parameters() if "lora_" not in n}
    assert lora == {torch.float32} and base == {torch.bfloat16}
    # what PEFT itself does on a base that was bf16 before the adapters were added
    peft = _peft()
    with torch.device("meta"):
        direct = peft.get_peft_model(transformers.LlamaForCausalLM(transformers.LlamaConfig(**CFG)).to(torch.bfloat16),
                                     peft.LoraConfig(r=8, target_modules=["q_proj", "v_proj"]))
    assert {p.dtype for n, p in direct.named_parameters() if "lora_" in n} == lora


@pytest.mark.slow
def test_the_estimate_counts_fp32_adapter_gradients_and_state():
    e = estimate(_build, _batch, batch_size=2, optimizer="adamw", precision="bf16-true", loss_fn=None)
    with torch.device("meta"):
        lora = [p for n, p in _build().named_parameters() if "lora_" in n]
    n_lora = sum(p.numel() for p in lora)
    states = e.model_states
    assert states["gradients"] == 4 * n_lora, "fp32 gradients of the adapters only"
    # AdamW's two fp32 moments, and its fp32 step count per parameter (a scalar tensor each)
    assert states["optimizer_state"] == 2 * 4 * n_lora + 4 * len(lora)


def _lora_llama():
    """The factory real ranks call (module level: picklable for the spawned processes)."""
    return _build, _batch, None


@pytest.mark.slow
@pytest.mark.parametrize("precision", ["32-true", "bf16-mixed"])
def test_fsdp_with_lora_is_estimated_as_two_real_gloo_ranks_measure_it(precision):
    """FSDP2 over a LoRA model (frozen base, trainable adapters in the same units), estimated on a
    fake process group and run for real on two gloo ranks: each rank's peak within 3%."""
    dist = pytest.importorskip("torch.distributed")
    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("torch.distributed with gloo is not available")
    from vramlab.sim.measure import measure_distributed

    readings = measure_distributed(_lora_llama, world_size=2, strategy="fsdp", batch_size=2, optimizer="adamw",
                                   precision=precision, timeout=300)
    e = estimate(_build, _batch, batch_size=2, optimizer="adamw", world_size=2, strategy="fsdp",
                 precision=precision, rank="all")
    for r in readings:
        assert e.rank_peaks[r.rank] == pytest.approx(r.peak, rel=0.03), r.rank
    # only the adapters have gradients and optimizer state: a few per cent of the parameters' bytes
    assert e.model_states["gradients"] < 0.05 * e.model_states["parameters"]
