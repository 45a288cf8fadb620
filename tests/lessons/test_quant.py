"""vramlab.lessons.quant: bytes per parameter, weight-only int8/int4, torch's dynamic int8."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

from vramlab.lessons.quant import (  # noqa: E402
    QuantLinear, bytes_per_parameter, dynamic_int8, dynamic_int8_available, model_bytes, quantize_weights,
    serialized_bytes,
)
from vramlab.sim.virtual_gpu import VirtualGPU  # noqa: E402


def test_bytes_per_parameter_table_and_scales():
    assert bytes_per_parameter("fp32") == 4
    assert bytes_per_parameter("bfloat16") == 2
    assert bytes_per_parameter("int8") == 1
    assert bytes_per_parameter("int4") == 0.5
    assert bytes_per_parameter("int4", group_size=64) == pytest.approx(0.5 + 4 / 64)
    assert bytes_per_parameter("fp16", group_size=64) == 2  # no scales for float formats
    with pytest.raises(ValueError):
        bytes_per_parameter("int3")


@pytest.mark.parametrize("bits,group", [(8, None), (8, 16), (4, 64), (4, 16)])
def test_quantlinear_is_close_to_the_float_layer(bits, group):
    torch.manual_seed(0)
    lin = nn.Linear(128, 32)
    q = QuantLinear(lin, bits=bits, group_size=group)
    x = torch.randn(5, 128)
    ref = lin(x)
    err = (q(x) - ref).abs().max() / ref.abs().max()
    assert err < (0.02 if bits == 8 else 0.2), err
    w = q.dequantize()
    assert w.shape == lin.weight.shape and w.dtype == lin.weight.dtype


def test_int4_packs_two_weights_per_byte():
    lin = nn.Linear(128, 32, bias=False)
    q = QuantLinear(lin, bits=4, group_size=64)
    assert q.qweight.dtype == torch.uint8 and q.qweight.shape == (32, 64)
    assert q.scale.shape == (32, 2)
    assert model_bytes(q) == 32 * 64 + 32 * 2 * 4


def test_int4_roundtrip_is_exact_on_representable_values():
    lin = nn.Linear(4, 1, bias=False)
    with torch.no_grad():
        lin.weight.copy_(torch.tensor([[-8.0, 7.0, 0.0, 3.0]]) / 7)
    q = QuantLinear(lin, bits=4)
    # scale = 8/7/7; -8/7 is -7 steps of it... values representable: check roundtrip error small
    assert torch.allclose(q.dequantize(), lin.weight, atol=1e-6 + float(q.scale.max()) / 2)


def test_quantize_weights_shrinks_model_bytes_and_counts_on_virtual_gpu():
    model = nn.Sequential(nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10))
    fp32 = model_bytes(model)
    q8 = quantize_weights(model, bits=8)
    q4 = quantize_weights(model, bits=4)
    assert isinstance(q8[0], QuantLinear) and isinstance(model[0], nn.Linear)  # a copy by default
    assert model_bytes(q8) <= 0.30 * fp32
    assert model_bytes(q4) <= 0.17 * fp32
    gpu = VirtualGPU("1GiB", allocator="exact")
    with gpu:
        pass
    added = gpu.adopt(q8)
    assert added == model_bytes(q8)
    cached = VirtualGPU("1GiB")  # the caching allocator: each storage in 512-byte blocks
    blocks = sum(-(-t.untyped_storage().nbytes() // 512) * 512 for t in [*q8.parameters(), *q8.buffers()])
    assert cached.adopt(q8) == blocks > added
    with gpu:
        y = q8(torch.randn(3, 256))
    assert y.shape == (3, 10)


def test_quantize_weights_inplace_and_bad_bits():
    model = nn.Sequential(nn.Linear(8, 8))
    out = quantize_weights(model, bits=8, inplace=True)
    assert out is model and isinstance(model[0], QuantLinear)
    with pytest.raises(ValueError):
        QuantLinear(nn.Linear(8, 8), bits=3)
    with pytest.raises(ValueError):
        QuantLinear(nn.Linear(10, 8), bits=8, group_size=3)


def test_dynamic_int8_on_cpu():
    if not dynamic_int8_available():
        pytest.skip("torch.ao quantize_dynamic does not run in this torch build")
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10))
    q = dynamic_int8(model)
    x = torch.randn(4, 256)
    assert (q(x) - model(x)).abs().max() < 0.1
    assert serialized_bytes(q) < 0.4 * serialized_bytes(model)
    assert isinstance(model[0], nn.Linear)  # the original is untouched
