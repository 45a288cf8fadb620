"""Real models on a virtual CUDA card: activation checkpointing under CUDA's kernels, CUDA's
autocast lists, and an encoder-decoder (T5). Each estimate is checked against the same step run
for real under a VirtualGPU of the same card (``measure``)."""

from __future__ import annotations

import threading

import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402
from torch.utils.checkpoint import checkpoint  # noqa: E402

from vramlab.lessons.models import make_gpt  # noqa: E402
from vramlab.sim.estimate import estimate  # noqa: E402
from vramlab.sim.kernels import (BANNED, FP32, FP32_APPEND_DTYPE, FP32_SET_OPT_DTYPE, LOWER, PROMOTE,  # noqa: E402
                                 cuda_autocast_policies)
from vramlab.sim.measure import measure  # noqa: E402
from vramlab.sim.virtual_gpu import VirtualGPU  # noqa: E402

pytestmark = pytest.mark.usefixtures("no_leftover_gpu")

bf16, fp16, fp32 = torch.bfloat16, torch.float16, torch.float32


# --------------------------------------------------------------------------- 1. checkpointing on a card


@pytest.mark.parametrize("device", ["T4", "H100"])
@pytest.mark.slow
def test_checkpointed_gpt_on_a_gpu_preset_is_estimated_as_measured(device: str) -> None:
    """checkpoint="layers" on a GPU preset raised CheckpointError: backward ran with CUDA's kernel
    model switched off, so the recomputation took the CPU's attention (T4: memory-efficient on the
    card, the CPU's flash kernel here; H100: cuDNN) and saved other tensors than the forward. Now it
    runs, keeps fewer activations than the plain step, and equals the same step run for real.
    Measured on the tiny GPT at batch 4, sequence 128, AdamW: T4 159,393,792 -> 125,904,896 bytes,
    H100 183,511,040 -> 150,939,648; activations at the peak 53.4 MB -> 19.9 MB."""
    build, make_batch, loss_fn = make_gpt(size="tiny", seq=128)
    kw = dict(batch_size=4, optimizer="adamw", loss_fn=loss_fn, device=device)
    plain = estimate(build, make_batch, **kw)
    ck = estimate(build, make_batch, checkpoint="layers", **kw)
    real = measure(build, make_batch, checkpoint="layers", **kw)
    assert ck.checkpoint == real.checkpoint == 4  # the tiny GPT's four blocks
    assert ck.breakdown["activations"] < plain.breakdown["activations"]
    assert ck.peak < plain.peak
    assert ck.peak == real.peak and ck.breakdown == real.breakdown
    assert ck.peak_reserved == real.peak_reserved


class _Attention(nn.Module):
    def __init__(self, d: int = 64, heads: int = 4) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(d, 3 * d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = (z.view(b, t, self.heads, -1).transpose(1, 2) for z in F.dropout(self.qkv(x), 0.1).split(c, 2))
        return F.scaled_dot_product_attention(q, k, v, dropout_p=0.1, is_causal=True).transpose(1, 2).reshape(b, t, c)


@pytest.mark.parametrize("how", ["backward", "grad"])
def test_a_users_own_checkpoint_recomputes_on_cudas_kernels(how: str) -> None:
    """torch.utils.checkpoint called by the model itself, with dropout and attention dropout inside,
    under VirtualGPU("T4"), through ``loss.backward()`` and ``torch.autograd.grad``: the recomputation
    takes CUDA's kernels as the forward did (the memory-efficient kernel, a one-byte dropout mask),
    and the gradients are those of the same block without checkpointing (same seed)."""
    torch.manual_seed(0)
    block = _Attention()
    x0 = torch.randn(2, 64, 64)

    def grads(use_checkpoint: bool) -> list[torch.Tensor]:
        with VirtualGPU("T4") as gpu:
            torch.manual_seed(1)
            x = x0.clone().requires_grad_(True)
            y = checkpoint(block, x, use_reentrant=False) if use_checkpoint else block(x)
            loss = (y * y).sum()
            params = [x, *block.parameters()]
            if how == "backward":
                loss.backward()
                out = [p.grad.clone() for p in params]
                for p in params:
                    p.grad = None
            else:
                out = [g.clone() for g in torch.autograd.grad(loss, params)]
            assert gpu.kernels is not None and gpu.kernels.last_backend == "efficient"
        return out

    for a, b in zip(grads(True), grads(False)):
        torch.testing.assert_close(a, b)


# --------------------------------------------------------------------------- 2. CUDA's autocast


def test_cuda_autocast_lists_are_the_installed_torchs() -> None:
    """Every operator the installed torch registers for AutocastCUDA has its policy from
    autocast_mode.h's lists (kernels.CUDA_AUTOCAST_LISTS), and the docs' examples hold."""
    registered = {n[len("aten::"):] for n in torch._C._dispatch_get_registrations_for_dispatch_key("AutocastCUDA")}
    policies = cuda_autocast_policies()
    assert set(policies) == registered
    for op, policy in [("mm", LOWER), ("linear", LOWER), ("matmul", LOWER), ("scaled_dot_product_attention", LOWER),
                       ("layer_norm", FP32), ("exp", FP32), ("pow.Tensor_Scalar", FP32), ("nll_loss", FP32),
                       ("softmax.int", FP32_SET_OPT_DTYPE), ("log_softmax.int", FP32_SET_OPT_DTYPE),
                       ("sum", FP32_SET_OPT_DTYPE), ("norm.Scalar", FP32_APPEND_DTYPE), ("addcmul", PROMOTE),
                       ("binary_cross_entropy", BANNED)]:
        if op in registered:
            assert policies[op] == policy, op


@pytest.mark.parametrize("dtype", [bf16, fp16])
def test_an_operators_bytes_under_autocast_follow_cudas_lists(dtype: torch.dtype) -> None:
    """Under autocast on a T4 preset, the matrix product is counted at 2 bytes an element and
    softmax, log_softmax, layer_norm and exp at 4 (float32), as CUDA's lists say; on a bare size (the
    CPU's lists) those stay at 2. Peaks: CUDA casts a bfloat16 input to float32 before softmax (8
    bytes an element at the peak) but runs a float16 one as ``_softmax(half_to_float=True)`` (4);
    layer_norm and exp copy their input to float32 first; layer_norm adds its float32 mean and rstd."""
    n, d = 64, 256
    N = n * d

    def run(device: str) -> dict[str, tuple[torch.dtype, int, int]]:
        out: dict[str, tuple[torch.dtype, int, int]] = {}
        with VirtualGPU(device, allocator="exact") as gpu:
            x, w = torch.randn(n, d), torch.randn(d, d)
            with torch.no_grad(), torch.autocast("cpu", dtype=dtype):
                del_me = x @ w  # the first product: the cuBLAS workspace on a preset
                del del_me
                a = gpu.allocated
                gpu.reset_peak()
                h = x @ w
                out["mm"] = (h.dtype, gpu.allocated - a, gpu.peak - a)
                for name, f in [("softmax", lambda: torch.softmax(h, -1)), ("log_softmax", lambda: F.log_softmax(h, -1)),
                                ("layer_norm", lambda: F.layer_norm(h, (d,))), ("exp", lambda: h.exp())]:
                    a = gpu.allocated
                    gpu.reset_peak()
                    o = f()
                    out[name] = (o.dtype, gpu.allocated - a, gpu.peak - a)
                    del o
        return out

    cuda = run("T4")
    assert cuda["mm"] == (dtype, 2 * N, 2 * N + 2 * N + 2 * d * d)  # x and w cast, then the product
    fused = dtype == fp16
    assert cuda["softmax"] == (fp32, 4 * N, 4 * N if fused else 8 * N)
    assert cuda["log_softmax"] == (fp32, 4 * N, 4 * N if fused else 8 * N)
    assert cuda["layer_norm"] == (fp32, 4 * N, 8 * N + 2 * 4 * n)
    assert cuda["exp"] == (fp32, 4 * N, 8 * N)
    cpu = run("1GiB")
    assert cpu["mm"] == cuda["mm"]
    for name in ("softmax", "log_softmax", "layer_norm", "exp"):
        assert cpu[name][:2] == (dtype, 2 * N), name


class _Mixed(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(64, 128)
        self.soft = nn.Softmax(dim=-1)
        self.norm = nn.LayerNorm(128)
        self.fc2 = nn.Linear(128, 64)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.norm(self.soft(self.fc1(x))))


def _recording_model(seen: dict[str, tuple[torch.dtype, float]]) -> nn.Module:
    model = _Mixed()
    for name in ("fc1", "soft", "norm", "fc2"):
        def hook(m: nn.Module, args: tuple, out: torch.Tensor, name: str = name) -> None:
            seen[name] = (out.dtype, out.untyped_storage().nbytes() / out.numel())
        getattr(model, name).register_forward_hook(hook)
    return model


@pytest.mark.parametrize("precision,dtype", [("bf16-mixed", bf16), ("16-mixed", fp16)])
@pytest.mark.parametrize("device", ["T4", "A100-80GB"])
@pytest.mark.slow
def test_a_mixed_precision_estimate_on_a_card_counts_cudas_dtypes(precision: str, dtype: torch.dtype,
                                                                  device: str) -> None:
    """estimate(precision="bf16-mixed"/"16-mixed") on a GPU preset: the linear layers' outputs are
    16-bit (2 bytes an element), the softmax's and the layer norm's float32 (4), as on CUDA; the
    estimate equals the measured step. On a bare size the CPU's lists still rule (softmax 2 bytes)."""
    seen: dict[str, tuple[torch.dtype, float]] = {}

    def make_batch(b: int) -> torch.Tensor:
        return torch.randn(b, 64)

    kw = dict(batch_size=32, optimizer="adam", precision=precision)
    est = estimate(lambda: _recording_model(seen), make_batch, device=device, **kw)
    assert seen == {"fc1": (dtype, 2.0), "soft": (fp32, 4.0), "norm": (fp32, 4.0), "fc2": (dtype, 2.0)}
    seen.clear()
    real = measure(lambda: _recording_model(seen), make_batch, device=device, **kw)
    assert seen["soft"] == (fp32, 4.0) and seen["fc1"] == (dtype, 2.0)
    assert est.peak == real.peak and est.breakdown == real.breakdown
    seen.clear()
    estimate(lambda: _recording_model(seen), make_batch, device="1GiB", **kw)
    assert seen["soft"] == (dtype, 2.0) and seen["norm"] == (dtype, 2.0)


def test_attention_under_autocast_runs_the_kernel_of_the_cast_inputs() -> None:
    """scaled_dot_product_attention is in CUDA's lower-precision list: float32 q, k, v under bf16
    autocast are cast first, so an A100 runs flash attention (a bfloat16 output), not the
    memory-efficient kernel that float32 inputs get (Llama's rotary embeddings leave q and k in float32)."""
    q, k, v = (torch.randn(2, 4, 128, 64) for _ in range(3))
    with VirtualGPU("A100-80GB") as gpu:
        assert gpu.kernels is not None
        assert F.scaled_dot_product_attention(q, k, v).dtype == fp32 and gpu.kernels.last_backend == "efficient"
        with torch.autocast("cpu", dtype=bf16):
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        assert out.dtype == bf16 and gpu.kernels.last_backend == "flash"


def test_binary_cross_entropy_is_refused_under_autocast_as_on_cuda() -> None:
    """CUDA's autocast bans binary_cross_entropy (torch's message says to use the logits version);
    the CPU's runs it in float32. After the card is left, CPU autocast is the CPU's again."""
    p, t = torch.rand(8, 4), torch.rand(8, 4)
    with VirtualGPU("T4"):
        with torch.autocast("cpu", dtype=bf16):
            with pytest.raises(RuntimeError, match="unsafe to autocast"):
                F.binary_cross_entropy(p, t)
            assert F.binary_cross_entropy_with_logits(p, t).dtype == fp32
    with torch.autocast("cpu", dtype=bf16):
        assert F.binary_cross_entropy(p, t).dtype == fp32
        assert torch.softmax(torch.randn(4, 4, dtype=bf16), -1).dtype == bf16  # the CPU's lists again


def test_other_threads_keep_the_cpus_autocast_while_a_card_is_active() -> None:
    """CUDA's lists are registered for the whole process while a card is active, and answer per
    thread: the thread on the card gets CUDA's (softmax in float32), another thread the CPU's."""
    seen: dict[str, torch.dtype] = {}

    def softmax_dtype() -> torch.dtype:
        with torch.autocast("cpu", dtype=bf16):
            return torch.softmax(torch.randn(4, 4, dtype=bf16), -1).dtype

    def other() -> None:
        seen["other"] = softmax_dtype()

    with VirtualGPU("T4"):
        t = threading.Thread(target=other)
        t.start()
        t.join()
        seen["card"] = softmax_dtype()
    assert seen == {"other": bf16, "card": fp32}


# --------------------------------------------------------------------------- 3. an encoder-decoder


# transformers 5's T5Config leaves decoder_start_token_id unset unless given (T5 checkpoints carry it in
# their config.json: 0, the pad token), and T5ForConditionalGeneration._shift_right reads it when labels
# come without decoder_input_ids: without it the model raises AttributeError on the plain CPU as in
# estimate(). The config here gives it, as a checkpoint's does.
_T5 = dict(d_model=128, d_ff=256, num_layers=2, num_heads=4, vocab_size=512, decoder_start_token_id=0)


def _t5() -> nn.Module:
    import transformers

    return transformers.T5ForConditionalGeneration(transformers.T5Config(**_T5))


def _t5_batch(b: int) -> dict[str, torch.Tensor]:
    return {"input_ids": torch.randint(0, 512, (b, 64)), "labels": torch.randint(0, 512, (b, 32))}


@pytest.mark.parametrize("device,checkpoint,precision", [
    (None, None, None), ("T4", None, None), (None, "layers", None), ("T4", "layers", None),
    ("T4", None, "bf16-mixed")])
@pytest.mark.slow
def test_t5_is_estimated_as_measured(device, checkpoint, precision) -> None:
    """A T5 (encoder-decoder, labels shifted into decoder inputs, relative position bias, its own
    RMS norm in float32) on the CPU and on a T4 preset: the estimate equals the step run for real.
    checkpoint="layers" checkpoints its four blocks as Hugging Face's own gradient checkpointing
    does, with the decoder's cache off: wrapping the blocks' forward with it on, the recomputation
    found the cache already written and saved other tensors (CheckpointError, CPU included).
    Measured at batch 8, backward only: 36,251,656 bytes on the CPU and 16,767,496 checkpointed;
    35,171,328 and 23,008,768 on a T4."""
    pytest.importorskip("transformers")
    kw = dict(batch_size=8, device=device, checkpoint=checkpoint, precision=precision)
    est = estimate(_t5, _t5_batch, **kw)
    real = measure(_t5, _t5_batch, **kw)
    assert est.peak == real.peak and est.breakdown == real.breakdown
    if checkpoint:
        assert est.checkpoint == 4  # the T5Blocks of the encoder and the decoder: 2 each
        plain = estimate(_t5, _t5_batch, batch_size=8, device=device, precision=precision)
        assert est.breakdown["activations"] < plain.breakdown["activations"]
