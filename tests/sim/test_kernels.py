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
def test_a_fused_kernel_keeps_34_sbh_per_layer(gpu, p):
    s, b, h, a = 512, 2, 512, 8
    got, backend = layer_activations(gpu, s=s, b=b, h=h, a=a, p=p)
    assert backend == ("flash" if gpu.startswith("A100") else "cudnn")
    assert got / (34 * s * b * h) == pytest.approx(1, rel=0.02)


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


def test_the_math_path_upcasts_half_precision_by_default():
    s, b, h, a = 1024, 1, 256, 16
    got, backend = layer_activations("T4", s=s, b=b, h=h, a=a)  # bf16 on a T4: math (module docs)
    assert backend == "math"
    # from attention.cpp: fp32 copies of q*sf, k^T*sf and v (12 sbh) instead of the qkv output (6 sbh);
    # fp32 softmax and dropout outputs and the one-byte mask (9 a s^2 b)
    assert got / (40 * s * b * h + 9 * a * s * s * b) == pytest.approx(1, rel=0.005)
