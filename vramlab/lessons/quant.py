"""Quantisation for lessons: bytes per parameter, weight-only int8/int4 layers, and torch's
dynamic int8 path where it still runs.

Two paths, because they run in different places:

- :func:`quantize_weights` replaces every ``nn.Linear`` by a :class:`QuantLinear` that
  stores its weight as int8 (``bits=8``) or as two 4-bit values per byte (``bits=4``),
  with one float32 scale per output row (int8) or per group of ``group_size`` weights
  (int4). It is plain PyTorch, so it runs on the CPU and on CUDA alike, and the virtual
  GPU counts its bytes exactly. Its forward dequantizes the weight to the input's dtype
  for each call: a temporary of the full-precision weight's size, one layer at a time
  (fused kernels, as in torchao or bitsandbytes, avoid even that). It shows the memory; it
  is not a fast kernel.
- :func:`dynamic_int8` is ``torch.ao.quantization.quantize_dynamic``: int8 weights and
  activations quantized on the fly, with fbgemm/qnnpack kernels. It runs **on the CPU
  only** (there are no CUDA kernels for these modules). In torch 2.10+ it still runs but is
  deprecated in favour of torchao's ``quantize_`` API (torchao is not a dependency of
  vramlab); :func:`dynamic_int8_available` says whether it runs here, and the deprecation
  warnings are silenced while it runs.

Sizes are in bytes. ``model_bytes`` counts tensor storages (what a device would hold);
``serialized_bytes`` counts what ``torch.save`` writes (the only figure that sees inside
the packed weights of ``quantize_dynamic``'s modules).
"""

from __future__ import annotations

import copy
import io
import warnings
from typing import Any, Iterable, Optional

import torch
import torch.nn.functional as F
from torch import nn

__all__ = [
    "BYTES_PER_PARAMETER",
    "bytes_per_parameter",
    "model_bytes",
    "serialized_bytes",
    "QuantLinear",
    "quantize_weights",
    "dynamic_int8",
    "dynamic_int8_available",
]

#: Storage bytes per parameter of each number format, without scales.
BYTES_PER_PARAMETER: dict[str, float] = {
    "fp32": 4.0,
    "fp16": 2.0,
    "bf16": 2.0,
    "int8": 1.0,
    "int4": 0.5,
}

_ALIASES = {"float32": "fp32", "float": "fp32", "float16": "fp16", "half": "fp16", "bfloat16": "bf16"}


def bytes_per_parameter(fmt: str, group_size: Optional[int] = None, scale_bytes: int = 4) -> float:
    """Bytes per parameter of ``fmt`` (``"fp32"``, ``"bf16"``, ``"fp16"``, ``"int8"``, ``"int4"``),
    plus the scales: one of ``scale_bytes`` bytes per ``group_size`` weights (integer
    formats only; ``None``: no scale counted)."""
    key = _ALIASES.get(fmt.lower(), fmt.lower()) if isinstance(fmt, str) else fmt
    if key not in BYTES_PER_PARAMETER:
        raise ValueError(f"unknown format {fmt!r}; known: {', '.join(BYTES_PER_PARAMETER)}")
    b = BYTES_PER_PARAMETER[key]
    if group_size is not None and key.startswith("int"):
        if group_size < 1:
            raise ValueError(f"group_size must be >= 1; got {group_size}")
        b += scale_bytes / group_size
    return b


def _storages(tensors: Iterable[Any]) -> dict[int, int]:
    out: dict[int, int] = {}
    for t in tensors:
        if isinstance(t, torch.Tensor):
            try:
                st = t.untyped_storage()
            except Exception:
                continue
            out[st.data_ptr() or id(st)] = st.nbytes()
    return out


def model_bytes(model: nn.Module) -> int:
    """Bytes in the unique storages of the model's parameters and buffers (shared ones once).

    ``quantize_dynamic``'s modules keep their weights in packed objects that are neither:
    use :func:`serialized_bytes` for them."""
    return sum(_storages(list(model.parameters()) + list(model.buffers())).values())


def serialized_bytes(model: nn.Module) -> int:
    """Bytes ``torch.save(model.state_dict())`` writes (weights, scales, and a little framing)."""
    buf = io.BytesIO()
    torch.save(model.state_dict(), buf)
    return buf.getbuffer().nbytes


class QuantLinear(nn.Module):
    """A linear layer whose weight is stored as int8 or packed int4, with float32 scales.

    Symmetric quantisation: ``w ~= q * scale`` with ``q`` in [-127, 127] (8 bits) or
    [-8, 7] (4 bits, stored offset by 8, two per ``uint8``). Scales are per output row for
    ``group_size=None``, else per group of ``group_size`` consecutive input weights.
    The bias stays in its original dtype. Buffers: ``qweight`` (int8 or uint8),
    ``scale`` (float32), ``bias`` (or ``None``).
    """

    qweight: torch.Tensor  #: the quantised weight: int8, or two int4 values packed per byte
    scale: torch.Tensor  #: one scale per group of ``group_size`` weights of a row
    bias: Optional[torch.Tensor]

    def __init__(self, linear: nn.Linear, bits: int = 8, group_size: Optional[int] = None) -> None:
        super().__init__()
        if bits not in (4, 8):
            raise ValueError(f"bits must be 4 or 8; got {bits}")
        out_f, in_f = linear.weight.shape
        g = in_f if group_size is None else int(group_size)
        if g < 1 or in_f % g:
            raise ValueError(f"group_size {group_size} must divide in_features={in_f}")
        if bits == 4 and (in_f % 2):
            raise ValueError(f"4-bit packing needs an even in_features; got {in_f}")
        self.in_features, self.out_features = in_f, out_f
        self.bits, self.group_size = bits, g
        self.weight_dtype = linear.weight.dtype
        w = linear.weight.detach().float().reshape(out_f, in_f // g, g)
        qmax = 127 if bits == 8 else 7
        scale = w.abs().amax(dim=-1, keepdim=True).clamp_min(1e-12) / qmax
        q = torch.round(w / scale).clamp_(-qmax - (0 if bits == 8 else 1), qmax).reshape(out_f, in_f)
        if bits == 8:
            qweight = q.to(torch.int8)
        else:
            u = (q + 8).to(torch.uint8)
            qweight = u[:, 0::2] | (u[:, 1::2] << 4)
        self.register_buffer("qweight", qweight.contiguous())
        self.register_buffer("scale", scale.reshape(out_f, in_f // g).contiguous())
        bias = linear.bias.detach().clone() if linear.bias is not None else None
        self.register_buffer("bias", bias)

    def dequantize(self, dtype: Optional[torch.dtype] = None) -> torch.Tensor:
        """The weight in ``dtype`` (default: the original weight's dtype), as a new tensor."""
        if self.bits == 8:
            q = self.qweight.float()
        else:
            lo = (self.qweight & 0x0F).to(torch.int16) - 8
            hi = (self.qweight >> 4).to(torch.int16) - 8
            q = torch.stack((lo, hi), dim=-1).reshape(self.out_features, self.in_features).float()
        g = self.group_size
        w = (q.reshape(self.out_features, self.in_features // g, g) * self.scale.unsqueeze(-1))
        return w.reshape(self.out_features, self.in_features).to(dtype or self.weight_dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = self.dequantize(x.dtype)
        b = self.bias.to(x.dtype) if self.bias is not None else None
        return F.linear(x, w, b)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, bits={self.bits}, "
                f"group_size={self.group_size}")


def quantize_weights(model: nn.Module, bits: int = 8, group_size: Optional[int] = None,
                     inplace: bool = False) -> nn.Module:
    """Replace every ``nn.Linear`` in ``model`` by a :class:`QuantLinear` (see module docs).

    Args:
        bits: 8 or 4.
        group_size: weights per scale along the input dimension; default: a whole row for
            8 bits, 64 for 4 bits (the smallest common divisor is used when 64 does not divide).
        inplace: change ``model`` itself; default: a deep copy is quantised and returned.

    Returns the quantised model, in eval mode. Other layers (embeddings, norms) are kept.
    """
    m = model if inplace else copy.deepcopy(model)

    def swap(parent: nn.Module) -> None:
        for name, child in parent.named_children():
            if isinstance(child, nn.Linear):
                g = group_size
                if g is None and bits == 4:
                    g = 64 if child.in_features % 64 == 0 else _divisor(child.in_features)
                setattr(parent, name, QuantLinear(child, bits=bits, group_size=g))
            else:
                swap(child)

    swap(m)
    return m.eval()


def _divisor(n: int) -> int:
    for g in (32, 16, 8, 4, 2):
        if n % g == 0:
            return g
    return n


def dynamic_int8_available() -> bool:
    """Whether ``torch.ao.quantization.quantize_dynamic`` runs here (CPU kernels present)."""
    try:
        lin = nn.Sequential(nn.Linear(8, 4))
        q = dynamic_int8(lin)
        q(torch.randn(2, 8))
        return True
    except Exception:
        return False


def dynamic_int8(model: nn.Module) -> nn.Module:
    """A copy of ``model`` with its ``nn.Linear`` layers dynamically quantized to int8 by
    ``torch.ao.quantization.quantize_dynamic`` (CPU only; see module docs). The model must
    be on the CPU; the copy is in eval mode.

    Raises:
        RuntimeError: when the path is not available in this torch build.
    """
    try:
        from torch.ao.quantization import quantize_dynamic
    except Exception as e:  # removed in some future torch
        raise RuntimeError(f"torch.ao.quantization.quantize_dynamic is not available: {e}") from None
    for p in model.parameters():
        if p.device.type != "cpu":
            raise RuntimeError("quantize_dynamic runs on the CPU only: move the model to the CPU first")
        break
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return quantize_dynamic(copy.deepcopy(model).eval(), {nn.Linear}, dtype=torch.qint8)
