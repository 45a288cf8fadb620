"""vramlab.sim.kernels: CUDA's dropout, attention kernels, foreach optimizers and cuBLAS workspace
on the virtual GPU, each against the torch rule it encodes (module docs name the sources)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402
from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: E402

from vramlab.sim.kernels import AttentionCall, cublas_workspace_size, sdpa_backend  # noqa: E402
from vramlab.sim.presets import get_preset  # noqa: E402
from vramlab.sim.virtual_gpu import VirtualGPU  # noqa: E402

MiB = 2**20
bf16, fp16, fp32 = torch.bfloat16, torch.float16, torch.float32


def cc(name: str) -> tuple[int, int]:
    return get_preset(name).compute_capability


def call(dtype, d=64, **kw) -> AttentionCall:
    return AttentionCall(b=2, h=8, sq=512, sk=512, d=d, dv=d, dtype=dtype, **kw)


# --------------------------------------------------------------------------- which kernel


@pytest.mark.parametrize("gpu,c,want", [
    ("T4", call(fp16), "efficient"),  # flash needs sm80; mem-efficient runs from sm50
    ("T4", call(bf16), "math"),  # mem-efficient takes bf16 only from sm80
    ("T4", call(fp32), "efficient"),
    ("V100-16GB", call(bf16), "math"),
    ("A100-80GB", call(bf16), "flash"),
    ("A100-80GB", call(fp32), "efficient"),  # flash is half precision only
    ("A100-80GB", call(bf16, has_mask=True), "efficient"),  # flash takes no mask
    ("A100-80GB", call(bf16, d=20), "flash"),  # flash takes any head dim up to 256 (padded to 8)
    ("H100-80GB", call(bf16), "cudnn"),  # cuDNN first on 9.x with the wheels' cuDNN > 9.15
    ("H100-80GB", call(bf16, dropout_p=0.1), "flash"),  # cuDNN wants dropout in sixteenths
    ("H100-80GB", call(bf16, dropout_p=0.125), "cudnn"),
    ("H100-80GB", call(bf16, d=256), "flash"),  # cuDNN up to 128 with these cuDNN versions
    ("RTX 4090", call(bf16, d=256, requires_grad=True, dropout_p=0.1), "efficient"),  # sm89: d>224 without dropout only
    ("RTX 4090", call(bf16, d=256, requires_grad=True), "flash"),
    ("RTX 4090", call(bf16, d=200, requires_grad=True), "efficient"),  # sm89 training: d <= 192 or > 224
])
def test_the_attention_kernel_is_the_one_torch_picks(gpu, c, want):
    assert sdpa_backend(cc(gpu), c) == want


def test_cudnn_can_be_deprioritised_and_kernels_switched_off(monkeypatch):
    monkeypatch.setenv("TORCH_CUDNN_SDPA_DEPRIORITIZED", "1")
    assert sdpa_backend(cc("H100-80GB"), call(bf16)) == "flash"
    with sdpa_kernel(SDPBackend.MATH):
        assert sdpa_backend(cc("A100-80GB"), call(bf16)) == "math"
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        with pytest.raises(RuntimeError, match="No available kernel"):
            sdpa_backend(cc("T4"), call(fp16))


def test_cublas_workspace_follows_the_compute_capability(monkeypatch):
    assert cublas_workspace_size(cc("A100-80GB")) == 4096 * 1024 * 2 + 16 * 1024 * 8 == 8519680
    assert cublas_workspace_size(cc("H100-80GB")) == cublas_workspace_size(cc("B200-180GB")) == 32 * MiB
    assert cublas_workspace_size(cc("RTX 5090")) == 32 * MiB
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":16:8")
    assert cublas_workspace_size(cc("H100-80GB")) == 16 * 1024 * 8


# --------------------------------------------------------------------------- dropout, workspace, foreach


def test_dropout_on_a_cuda_preset_keeps_a_one_byte_mask_and_the_cpu_a_noise_tensor():
    for kernels, per_element in (("cuda", 1), ("cpu", 4)):
        gpu = VirtualGPU("A100-80GB", kernels=kernels)
        with gpu:
            x = torch.randn(256, 1024, requires_grad=True)
            y = F.dropout(x, 0.1)
            saved = gpu.breakdown()["activations"]
            y.sum().backward()
        assert saved == 256 * 1024 * per_element, kernels
        assert x.grad is not None and torch.equal(x.grad == 0, y == 0)  # the mask, applied in backward
        del x, y


def test_in_place_and_eval_dropout_are_left_as_torch_runs_them():
    gpu = VirtualGPU("A100-80GB")
    with gpu:
        x = torch.randn(64, 64, requires_grad=True)
        assert type(F.dropout(x.clone(), 0.5, inplace=True).grad_fn).__name__ == "MulBackward0"
        assert F.dropout(x, 0.5, training=False) is x


def test_the_first_matrix_product_allocates_the_cublas_workspace_once():
    gpu = VirtualGPU("H100-80GB")
    with gpu:
        a = torch.randn(64, 64)
        before = gpu.allocated
        b = a @ a
        c = torch.mm(a, b)
        assert gpu.allocated - before == 32 * MiB + 2 * 64 * 64 * 4
        assert gpu.kernels is not None and gpu.kernels.workspace is not None
    del a, b, c


def test_optimizers_take_the_foreach_path_on_a_cuda_preset():
    """foreach Adam builds exp_avg_sq_sqrt for every parameter at once (adam.py _multi_tensor_adam);
    the single-tensor path one parameter at a time (``denom = (exp_avg_sq.sqrt() / bc2).add_(eps)``:
    while the next parameter's square root and quotient are made, the previous ``denom`` is still
    bound, so three parameter-sized temporaries at most)."""
    extra = {}
    for kernels in ("cuda", "cpu"):
        torch.manual_seed(0)
        gpu = VirtualGPU("A100-80GB", kernels=kernels, allocator="exact")
        with gpu:
            model = nn.Sequential(*(nn.Linear(256, 256, bias=False) for _ in range(4)))
            opt = torch.optim.Adam(model.parameters())
            for _ in range(2):
                model(torch.randn(4, 256)).sum().backward()
                before = gpu.allocated
                gpu.reset_peak()
                opt.step()
                opt.zero_grad()
            extra[kernels] = gpu.peak - before
        assert opt.param_groups[0]["foreach"] is None  # the user's setting is given back
    layer = 256 * 256 * 4
    assert extra["cuda"] == 4 * layer  # the list of square roots
    assert extra["cpu"] == 3 * layer


# --------------------------------------------------------------------------- attention: values, grads, bytes


def _qkv(dtype, b=2, h=4, s=128, d=64, seed=0):
    g = torch.Generator().manual_seed(seed)
    qkv = torch.randn(b, s, 3, h, d, generator=g).to(dtype)
    return [qkv[:, :, i].transpose(1, 2).detach().requires_grad_(True) for i in range(3)]


@pytest.mark.parametrize("gpu,dtype,p", [("A100-80GB", bf16, 0.0), ("A100-80GB", bf16, 0.2), ("A100-80GB", fp32, 0.2),
                                         ("H100-80GB", bf16, 0.125), ("T4", bf16, 0.0), ("T4", fp32, 0.2)])
def test_rerouted_attention_computes_what_the_cpu_computes(gpu, dtype, p):
    q, k, v = _qkv(dtype)
    torch.manual_seed(7)
    ref = F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True)
    ref.float().square().sum().backward()
    want = [t.grad.clone() for t in (q, k, v)]
    for t in (q, k, v):
        t.grad = None
    dev = VirtualGPU(gpu)
    with dev:
        torch.manual_seed(7)
        out = F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True)
        out.float().square().sum().backward()
    tol = dict(atol=2e-2, rtol=2e-2) if dtype == bf16 else dict(atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(out, ref, **tol)
    for t, g in zip((q, k, v), want):
        torch.testing.assert_close(t.grad, g, **tol)


def test_flash_keeps_no_s_by_s_matrix_and_math_does():
    s = 1024
    flash, math_ = VirtualGPU("A100-80GB"), VirtualGPU("A100-80GB")
    for dev, ctx in ((flash, None), (math_, SDPBackend.MATH)):
        q, k, v = _qkv(bf16, b=1, h=4, s=s, d=64)
        with dev:
            before = dev.breakdown()["activations"]
            if ctx is None:
                out = F.scaled_dot_product_attention(q, k, v, dropout_p=0.1, is_causal=True)
            else:
                with sdpa_kernel(ctx):
                    out = F.scaled_dot_product_attention(q, k, v, dropout_p=0.1, is_causal=True)
            dev.saved = dev.breakdown()["activations"] - before
        del out
    assert flash.kernels.last_backend == "flash" and math_.kernels.last_backend == "math"
    # flash: its output (b, s, h, d) bf16, log-sum-exp (b, h, s) fp32, two 512-byte RNG blocks
    assert flash.saved == 1 * s * 4 * 64 * 2 + 4 * 4 * s + 2 * 512
    # math, upcast to fp32: softmax 4, mask 1, dropout output 4 bytes per element of (h, s, s), and more
    assert math_.saved > 9 * 4 * s * s


# --------------------------------------------------------------------------- Korthikanti et al. (2022)


class MegatronLayer(nn.Module):
    """A GPT layer as in Korthikanti et al., "Reducing Activation Recomputation in Large
    Transformer Models" (2022), section 4.1: pre-LN attention and MLP blocks, dropout after
    attention (inside the kernel), after the projection and after the MLP."""

    def __init__(self, h: int, a: int, p: float = 0.1) -> None:
        super().__init__()
        self.a, self.p = a, p
        self.ln1, self.ln2 = nn.LayerNorm(h), nn.LayerNorm(h)
        self.qkv, self.proj = nn.Linear(h, 3 * h), nn.Linear(h, h)
        self.fc1, self.fc2 = nn.Linear(h, 4 * h), nn.Linear(4 * h, h)
        self.drop1, self.drop2 = nn.Dropout(p), nn.Dropout(p)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, h = x.shape
        q, k, v = (t.view(b, s, self.a, h // self.a).transpose(1, 2) for t in self.qkv(self.ln1(x)).split(h, dim=2))
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=self.p, is_causal=True)
        x = x + self.drop1(self.proj(y.transpose(1, 2).reshape(b, s, h)))
        return x + self.drop2(self.fc2(F.gelu(self.fc1(self.ln2(x)))))


def layer_activations(gpu_name: str, *, s: int, b: int, h: int, a: int, p: float = 0.1) -> tuple[int, str]:
    """Bytes one layer keeps for backward, bf16: two layers' saved tensors minus one layer's,
    counted exactly (the paper counts tensors; the caching allocator's blocks may hold more)."""
    saved = []
    for layers in (1, 2):
        torch.manual_seed(0)
        gpu = VirtualGPU(gpu_name, allocator="exact")
        with gpu:
            model = nn.Sequential(*(MegatronLayer(h, a, p) for _ in range(layers))).to(bf16)
            x = torch.randn(b, s, h, dtype=bf16, requires_grad=True)
            y = model(x)
            saved.append(gpu.breakdown()["activations"])
            del y, x, model
    return saved[1] - saved[0], gpu.kernels.last_backend


@pytest.mark.parametrize("gpu,p", [("A100-80GB", 0.1), ("H100-80GB", 0.125)])
@pytest.mark.slow
def test_a_fused_kernel_keeps_34_sbh_per_layer(gpu, p):
    s, b, h, a = 512, 2, 512, 8
    got, backend = layer_activations(gpu, s=s, b=b, h=h, a=a, p=p)
    assert backend == ("flash" if gpu.startswith("A100") else "cudnn")
    assert got / (34 * s * b * h) == pytest.approx(1, rel=0.02)


@pytest.mark.slow
def test_the_math_path_adds_5_as2b_per_layer():
    s, b, h, a = 1024, 1, 256, 16
    with sdpa_kernel(SDPBackend.MATH):
        torch.backends.cuda.allow_fp16_bf16_reduction_math_sdp(True)  # 16-bit throughout, as the paper counts
        try:
            got, backend = layer_activations("A100-80GB", s=s, b=b, h=h, a=a)
        finally:
            torch.backends.cuda.allow_fp16_bf16_reduction_math_sdp(False)
    assert backend == "math"
    paper = 34 * s * b * h + 5 * a * s * s * b
    assert got / paper == pytest.approx(1, rel=0.02)
    # torch's math path scales q and k into new tensors and keeps v's whole qkv storage: +4 sbh
    assert got / (38 * s * b * h + 5 * a * s * s * b) == pytest.approx(1, rel=0.005)


@pytest.mark.slow
def test_the_math_path_upcasts_half_precision_by_default():
    s, b, h, a = 1024, 1, 256, 16
    got, backend = layer_activations("T4", s=s, b=b, h=h, a=a)  # bf16 on a T4: math (module docs)
    assert backend == "math"
    # from attention.cpp: fp32 copies of q*sf, k^T*sf and v (12 sbh) instead of the qkv output (6 sbh);
    # fp32 softmax and dropout outputs and the one-byte mask (9 a s^2 b)
    assert got / (40 * s * b * h + 9 * a * s * s * b) == pytest.approx(1, rel=0.005)


# --------------------------------------------------------------------------- every path to the attention kernels
# nn.MultiheadAttention and nn.TransformerEncoderLayer reach CUDA's attention kernels through
# F.multi_head_attention_forward (training, or need_weights=True/masks), or through their fast
# paths torch._native_multi_head_attention / torch._transformer_encoder_layer_fwd (eval, no grad);
# Hugging Face's sdpa_attention_forward calls F.scaled_dot_product_attention with enable_gqa=True.
# Each is measured against the same attention built from the layer's own weights with
# F.scaled_dot_product_attention called directly.


def _measure(gpu_name, fn, *, train, allocator="caching", fresh=()):
    """Peak over the call (and its backward when training) above what was allocated before, the
    activations it keeps for backward, and the attention kernel picked. The gradients of the
    modules and tensors in ``fresh`` are dropped first, so that each run allocates its own."""
    for t in fresh:
        if isinstance(t, nn.Module):
            t.zero_grad(set_to_none=True)
        else:
            t.grad = None
    gpu = VirtualGPU(gpu_name, allocator=allocator)
    with gpu:
        with torch.enable_grad() if train else torch.no_grad():
            base, saved0 = gpu.allocated, gpu.breakdown()["activations"]
            gpu.reset_peak()
            out = fn()
            saved = gpu.breakdown()["activations"] - saved0
            if train:
                out.float().square().sum().backward()
            peak = gpu.peak - base
        del out
    return peak, saved, gpu.kernels.last_backend


def _mha_slow_path_direct(m, x):
    """F.multi_head_attention_forward's own operators for batch-first self-attention without
    weights or masks (torch/nn/functional.py), with scaled_dot_product_attention called here."""
    b, s, e = x.shape
    h, hd = m.num_heads, e // m.num_heads
    xt = x.transpose(1, 0)
    proj = F.linear(xt, m.in_proj_weight, m.in_proj_bias)
    proj = proj.unflatten(-1, (3, e)).unsqueeze(0).transpose(0, -2).squeeze(-2).contiguous()
    q, k, v = (t.view(s, b * h, hd).transpose(0, 1).view(b, h, s, hd) for t in (proj[0], proj[1], proj[2]))
    del proj
    y = F.scaled_dot_product_attention(q, k, v, None, m.dropout if m.training else 0.0, False)
    del q, k, v
    y = F.linear(y.permute(2, 0, 1, 3).reshape(b * s, e), m.out_proj.weight, m.out_proj.bias).view(s, b, e)
    return y.transpose(1, 0)


def _mha_fast_path_direct(m, x):
    """native_multi_head_attention_cuda's fused branch (attention.cu): linear, chunk,
    scaled_dot_product_attention, linear, with x and y alive to the end as there."""
    b, s, e = x.shape
    h, hd = m.num_heads, e // m.num_heads
    qkv = F.linear(x, m.in_proj_weight, m.in_proj_bias)
    q, k, v = (t.view(b, -1, h, hd).transpose(1, 2) for t in qkv.chunk(3, -1))
    y = F.scaled_dot_product_attention(q, k, v)
    return F.linear(y.transpose(1, 2).reshape(b, -1, e), m.out_proj.weight, m.out_proj.bias)


def _mha(dtype, p=0.0, e=256, h=4):
    torch.manual_seed(0)
    return nn.MultiheadAttention(e, h, dropout=p, batch_first=True).to(dtype)


@pytest.mark.parametrize("gpu,dtype", [("T4", fp32), ("T4", fp16), ("H100-80GB", bf16), ("A100-80GB", bf16)])
@pytest.mark.parametrize("train", [True, False])
@pytest.mark.slow
def test_multihead_attention_runs_the_kernel_of_the_direct_call(gpu, dtype, train):
    m = _mha(dtype, p=0.125 if train else 0.0)
    m.train(train)
    x = torch.randn(2, 512, 256, dtype=dtype, requires_grad=train)
    torch.manual_seed(1)
    layer = _measure(gpu, lambda: m(x, x, x, need_weights=False)[0], train=train, fresh=(m, x))
    direct_fn = _mha_slow_path_direct if train else _mha_fast_path_direct
    torch.manual_seed(1)
    direct = _measure(gpu, lambda: direct_fn(m, x), train=train, fresh=(m, x))
    assert layer[2] == direct[2] != "math" or dtype == bf16 and gpu == "T4"
    assert layer == direct
    with torch.no_grad():  # and the same values as the CPU's, dropout drawn alike
        torch.manual_seed(2)
        ref = m(x, x, x, need_weights=False)[0]
        with VirtualGPU(gpu):
            torch.manual_seed(2)
            out = m(x, x, x, need_weights=False)[0]
    torch.testing.assert_close(out, ref, atol=2e-2, rtol=2e-2)


@pytest.mark.slow
def test_the_issues_t4_reproduction_need_weights_false():
    """The issue: on a T4 the layer's attention was the CPU's (math with dropout: an s x s matrix
    per head), some 10x the direct call's peak."""
    m = _mha(fp32, p=0.1, e=256, h=8)
    x = torch.randn(4, 1024, 256, requires_grad=True)
    layer = _measure("T4", lambda: m(x, x, x, need_weights=False)[0], train=True, fresh=(m, x))
    direct = _measure("T4", lambda: _mha_slow_path_direct(m, x), train=True, fresh=(m, x))
    assert layer == direct and layer[2] == "efficient"
    assert layer[0] < 4 * 8 * 1024 * 1024 * 4  # less than one fp32 (b, h, s, s) score matrix


@pytest.mark.parametrize("gpu", ["T4", "H100-80GB"])
def test_the_fast_path_is_taken_where_cuda_takes_it(gpu, monkeypatch):
    from vramlab.sim.kernels import CudaKernels

    seen = []
    native = CudaKernels._native_mha
    monkeypatch.setattr(CudaKernels, "_native_mha", lambda self, a, k: seen.append(1) or native(self, a, k))
    m = _mha(fp16).eval()
    x = torch.randn(2, 128, 256, dtype=fp16)
    with VirtualGPU(gpu):
        with torch.no_grad():
            m(x, x, x, need_weights=False)
        assert seen == [1]
        m(x, x, x, need_weights=False)  # grad enabled and weights that need it: the slow path, as on CUDA
        m.train()
        with torch.no_grad():
            m(x, x, x, need_weights=False)  # training: the slow path
    assert seen == [1]
    assert torch.overrides.has_torch_function((x,)) is False  # put back on exit


def test_native_mha_without_a_fused_kernel_takes_the_older_kernels():
    """bf16 on a T4 has no fused kernel: native_multi_head_attention_cuda falls back to its own
    gemms and a (b, h, t, t) score matrix in bf16 (not the math path's fp32 upcast)."""
    m = _mha(bf16).eval()
    b, s, h = 2, 512, 4
    x = torch.randn(b, s, 256, dtype=bf16)
    peak, _, _ = _measure("T4", lambda: m(x, x, x, need_weights=False)[0], train=False, allocator="exact")
    math_peak, _, backend = _measure("T4", lambda: _mha_fast_path_direct(m, x), train=False, allocator="exact")
    assert backend == "math"
    scores = b * h * s * s * 2
    assert scores < peak < math_peak  # the score matrix in bf16; the math path keeps fp32 copies
    with torch.no_grad():
        ref = m(x, x, x, need_weights=False)[0]
        with VirtualGPU("T4"):
            got = m(x, x, x, need_weights=False)[0]
    torch.testing.assert_close(got, ref)


def _encoder_layer(dtype, norm_first=False):
    torch.manual_seed(0)
    return nn.TransformerEncoderLayer(256, 4, dim_feedforward=512, dropout=0.125, batch_first=True,
                                      norm_first=norm_first).to(dtype)


def _encoder_layer_slow_direct(layer, x):
    """TransformerEncoderLayer.forward's slow path (norm_first=False) with the attention direct."""
    x = layer.norm1(x + layer.dropout1(_mha_slow_path_direct(layer.self_attn, x)))
    ff = layer.linear2(layer.dropout(layer.activation(layer.linear1(x))))
    return layer.norm2(x + layer.dropout2(ff))


def _encoder_layer_fast_direct(layer, src):
    """transformer_encoder_layer_forward (transformer.cpp) with the attention direct."""
    d, eps = layer.self_attn.embed_dim, layer.norm1.eps
    x = F.layer_norm(src, (d,), layer.norm1.weight, layer.norm1.bias, eps) if layer.norm_first else src
    x = _mha_fast_path_direct(layer.self_attn, x)
    x.add_(src)
    if not layer.norm_first:
        x = F.layer_norm(x, (d,), layer.norm1.weight, layer.norm1.bias, eps)
    pre = x
    if layer.norm_first:
        x = F.layer_norm(x, (d,), layer.norm2.weight, layer.norm2.bias, eps)
    b, t = x.shape[:2]
    hid = torch._addmm_activation(layer.linear1.bias, x.reshape(b * t, d), layer.linear1.weight.t())
    x = torch.addmm(layer.linear2.bias, hid, layer.linear2.weight.t()).view(b, t, -1)
    del hid
    x.add_(pre)
    del pre
    if not layer.norm_first:
        x = F.layer_norm(x, (d,), layer.norm2.weight, layer.norm2.bias, eps)
    return x


@pytest.mark.parametrize("gpu,dtype", [("T4", fp32), ("H100-80GB", bf16)])
@pytest.mark.parametrize("train", [True, False])
@pytest.mark.slow
def test_transformer_encoder_layer_runs_the_kernel_of_the_direct_call(gpu, dtype, train):
    layer = _encoder_layer(dtype)
    layer.train(train)
    x = torch.randn(2, 512, 256, dtype=dtype, requires_grad=train)
    direct_fn = _encoder_layer_slow_direct if train else _encoder_layer_fast_direct
    torch.manual_seed(1)
    got = _measure(gpu, lambda: layer(x), train=train, fresh=(layer, x))
    torch.manual_seed(1)
    want = _measure(gpu, lambda: direct_fn(layer, x), train=train, fresh=(layer, x))
    assert got == want and got[2] != "math"
    if not train:
        with torch.no_grad():
            ref = layer(x)  # the CPU's fast path
            with VirtualGPU(gpu):
                out = layer(x)
        torch.testing.assert_close(out, ref, atol=2e-2, rtol=2e-2)


def test_transformer_encoder_layer_norm_first_fast_path():
    layer = _encoder_layer(fp16, norm_first=True).eval()
    x = torch.randn(2, 256, 256, dtype=fp16)
    assert _measure("T4", lambda: layer(x), train=False) == \
        _measure("T4", lambda: _encoder_layer_fast_direct(layer, x), train=False)


@pytest.mark.parametrize("gpu,dtype", [("T4", fp16), ("H100-80GB", bf16)])
@pytest.mark.parametrize("train", [True, False])
@pytest.mark.slow
def test_hugging_face_sdpa_attention_runs_the_kernel_of_the_direct_call(gpu, dtype, train):
    """transformers' sdpa_attention_forward passes enable_gqa=True whenever there is no mask (and
    the module has num_key_value_groups); with as many key/value heads as query heads that is a
    plain call on CUDA."""
    sdpa = pytest.importorskip("transformers.integrations.sdpa_attention",
                               reason="transformers is not installed").sdpa_attention_forward
    module = nn.Module()
    module.num_key_value_groups, module.is_causal = 1, True
    q, k, v = (t.requires_grad_(train) for t in _qkv(dtype, b=2, h=8, s=512, d=64))
    got = _measure(gpu, lambda: sdpa(module, q, k, v, None, dropout=0.0)[0], train=train, fresh=(q, k, v))
    want = _measure(gpu, lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).contiguous(),
                    train=train, fresh=(q, k, v))
    assert got == want and got[2] in ("efficient", "cudnn")


def test_grouped_query_attention_still_runs_as_on_the_cpu():
    q = torch.randn(1, 8, 64, 64, dtype=bf16)
    k = v = torch.randn(1, 2, 64, 64, dtype=bf16)
    with VirtualGPU("A100-80GB") as gpu:
        out = F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
    assert gpu.kernels.last_backend is None
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v, enable_gqa=True))
