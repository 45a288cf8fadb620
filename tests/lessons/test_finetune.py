"""vramlab.lessons.finetune: the 8-bit AdamW, LoRA adapters, the bytes-per-parameter formula."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

from vramlab.lessons.finetune import BLOCK, Int8StateAdamW, LoRALinear, add_lora, training_bytes_per_parameter  # noqa: E402


def test_bytes_per_parameter_formula():
    assert training_bytes_per_parameter("adamw", "fp32")["total"] == 16
    assert training_bytes_per_parameter("adamw", "amp")["total"] == 18
    assert training_bytes_per_parameter("adamw", "bf16")["total"] == 8
    assert training_bytes_per_parameter("adamw-8bit", "bf16")["total"] == pytest.approx(6 + 8 / BLOCK)
    assert training_bytes_per_parameter("sgd", "fp32")["total"] == 8
    assert training_bytes_per_parameter("sgd-momentum", "fp32")["total"] == 12
    assert training_bytes_per_parameter("adamw", "bf16", trainable=False)["total"] == 2
    with pytest.raises(ValueError):
        training_bytes_per_parameter("lion")
    with pytest.raises(ValueError):
        training_bytes_per_parameter("adamw", "fp8")


def _fit(opt_cls, steps=300):
    torch.manual_seed(0)
    x = torch.randn(512, 16)
    w_true = torch.randn(16, 1)
    y = x @ w_true
    model = nn.Linear(16, 1)
    opt = opt_cls(model.parameters(), lr=0.05, weight_decay=0.0)
    for _ in range(steps):
        loss = nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return float(loss.detach()), opt, model


def test_adamw8bit_optimizes_like_adamw():
    loss8, opt, model = _fit(Int8StateAdamW)
    loss32, _, _ = _fit(torch.optim.AdamW)
    assert loss8 < 1e-2 and loss32 < 1e-2
    st = opt.state[model.weight]
    assert st["m"].dtype == torch.int8 and st["v"].dtype == torch.uint8
    assert st["m_scale"].dtype == torch.float32 and st["step"] == 300


def test_adamw8bit_state_is_two_bytes_per_parameter():
    p = nn.Parameter(torch.randn(4 * BLOCK))
    opt = Int8StateAdamW([p])
    p.grad = torch.randn_like(p)
    opt.step()
    st = opt.state[p]
    nbytes = sum(v.numel() * v.element_size() for v in st.values() if isinstance(v, torch.Tensor))
    assert nbytes == 2 * p.numel() + 2 * 4 * 4
    with pytest.raises(ValueError):
        Int8StateAdamW([p], lr=-1)


def test_adamw8bit_under_fake_tensors():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        p = nn.Parameter(torch.randn(3000, dtype=torch.bfloat16))
        p.grad = torch.randn_like(p)
        opt = Int8StateAdamW([p])
        opt.step()
        assert opt.state[p]["m"].numel() == 2 * BLOCK  # padded to whole blocks


def test_lora_starts_as_the_base_and_trains_only_adapters():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 32))
    model.head = nn.Linear(32, 4)
    x = torch.randn(5, 32)
    ref = model[2](torch.relu(model[0](x)))
    add_lora(model, rank=4)
    assert isinstance(model[0], LoRALinear) and isinstance(model[2], LoRALinear)
    assert isinstance(model.head, nn.Linear)  # skipped by name
    assert torch.allclose(model[2](torch.relu(model[0](x))), ref)
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    assert sum(p.numel() for p in model.parameters() if p.requires_grad) == 4 * (32 + 64) + 4 * (64 + 32)
    with pytest.raises(ValueError):
        LoRALinear(nn.Linear(2, 2), rank=0)


def test_lora_builds_on_meta():
    with torch.device("meta"):
        m = add_lora(nn.Sequential(nn.Linear(8, 8)), rank=2)
    assert m[0].lora_a.device.type == "meta"
