"""CUDA's kernels on the CPU: what they allocate and save for backward, where the CPU's differ.

A virtual device that stands for a CUDA card runs its operators on the CPU, and some CPU
kernels keep other tensors than their CUDA counterparts. :class:`CudaKernels`, a
``TorchFunctionMode``, reroutes those operators so that the books hold what a CUDA card of a
given compute capability would hold; the values stay the CPU's (the same maths). It is entered
by :class:`~vramlab.sim.virtual_gpu.VirtualGPU` for a GPU preset and by
:func:`~vramlab.sim.estimate.estimate` for a preset target. What it models, with the torch
sources each rule comes from (torch 2.13's own Python, YAML and headers; the C++ from
pytorch's main branch of the same months; ``docs/virtual-gpu.md`` has the list):

- **Dropout** keeps a one-byte mask. ``at::dropout`` takes the fused ``native_dropout`` on a
  CUDA input with ``0 < p < 1`` and elements (``is_fused_kernel_acceptable``,
  aten/src/ATen/native/Dropout.cpp); it returns a ``bool`` mask, the only tensor autograd
  saves (derivatives.yaml, ``native_dropout``: ``result1``). On the CPU, ``_dropout_impl``
  saves a noise tensor in the input's dtype. In-place ``dropout_`` takes ``_dropout_impl`` on
  both devices, so it is left alone.
- **scaled_dot_product_attention** runs the kernel that torch's CUDA dispatcher would pick
  (:func:`sdpa_backend`: ``select_sdp_backend`` and the ``can_use_*`` checks of
  aten/src/ATen/native/transformers/cuda/sdp_utils.cpp), and allocates and saves what that
  kernel does: flash attention (flash_api.cpp ``mha_fwd``/``mha_bwd``), memory-efficient
  attention (attention.cu, attention_backward.cu), cuDNN attention (preferred on Hopper and
  Blackwell data-centre cards with the cuDNN of the 2.11/2.12 wheels unless
  ``TORCH_CUDNN_SDPA_DEPRIORITIZED=1``), or the math fallback as
  ``_scaled_dot_product_attention_math`` writes it (attention.cpp: half-precision inputs
  upcast to float32 unless ``allow_fp16_bf16_reduction_math_sdp``, q and k each scaled by the
  square root of the scale, ``_safe_softmax``, CUDA's dropout).
- **Optimizers** take torch's CUDA default, the ``foreach`` (multi-tensor) path, where the user
  left ``foreach`` unset (``_default_to_fused_or_foreach``, torch/optim/optimizer.py); the
  lists it builds (``exp_avg_sq_sqrt``...) are counted. ``fused=True`` is honoured as asked.
- **The cuBLAS workspace**: the first matrix product allocates it through the caching
  allocator (``getNewWorkspace`` in aten/src/ATen/cuda/CublasHandlePool.cpp), so it counts in
  ``memory_allocated``: 32 MiB on compute capability 9.x, 10.x and 12.x, 8.125 MiB before
  (``parseChosenWorkspaceSize``, ``CUBLAS_WORKSPACE_CONFIG`` overrides it). cuBLASLt shares it.

Not modelled, and said so in the docs: the cuBLAS workspace of the autograd engine's own
thread (torch keeps one per handle and stream; a backward on CUDA likely adds a second),
cuDNN's and the memory-efficient backward's workspaces (their sizes depend on kernel
constants not resolved here), flash attention's split-KV buffers in inference, deterministic
mode's buffers, nested tensors and GQA (those calls run as on the CPU).

Sizes in bytes. This module imports torch; it never imports IPython.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Any, Callable, Optional

from .._extras import require_torch

require_torch("vramlab.sim.kernels")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.overrides import TorchFunctionMode  # noqa: E402

from .ledger import Ledger  # noqa: E402

__all__ = ["CudaKernels", "sdpa_backend", "cublas_workspace_size", "cudnn_attention_preferred", "SDPA_BACKENDS"]

#: The attention kernels :func:`sdpa_backend` names.
SDPA_BACKENDS: tuple[str, ...] = ("cudnn", "flash", "efficient", "math")

_HALF = (torch.float16, torch.bfloat16)
_SDPA = F.scaled_dot_product_attention
_DROPOUTS = (F.dropout, torch.dropout)
_MATMUL_NAMES = frozenset({"matmul", "mm", "bmm", "addmm", "baddbmm", "addbmm", "addmv", "mv", "linear", "einsum",
                           "__matmul__", "__rmatmul__", "tensordot", "chain_matmul", "inner", "outer", "dot"})


def _env_true(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ("1", "true", "on", "yes", "y")


def cublas_workspace_size(cc: tuple[int, int]) -> int:
    """Bytes of the cuBLAS workspace torch allocates per handle on a card of compute capability
    ``cc``: ``CUBLAS_WORKSPACE_CONFIG`` (``:SIZE_KiB:COUNT`` pairs, summed) when set, else
    ``:4096:8`` (32 MiB) on 9.x, 10.x and 12.x and ``:4096:2:16:8`` (8.125 MiB) before
    (``parseChosenWorkspaceSize``, aten/src/ATen/cuda/CublasHandlePool.cpp)."""
    conf = os.environ.get("CUBLAS_WORKSPACE_CONFIG", "")
    parts = [p for p in conf.split(":") if p]
    if parts and len(parts) % 2 == 0 and all(p.isdigit() for p in parts):
        return sum(int(parts[i]) * 1024 * int(parts[i + 1]) for i in range(0, len(parts), 2))
    if cc[0] in (9, 10, 12):
        return 4096 * 8 * 1024
    return 4096 * 1024 * 2 + 16 * 1024 * 8


def cudnn_attention_preferred(cc: tuple[int, int]) -> bool:
    """Whether torch puts cuDNN attention first on this card: compute capability 9.x or 10.x
    with a cuDNN newer than 9.15 (the 2.11 and 2.12 wheels ship 9.19 and 9.20, CUDA 13), unless
    ``TORCH_CUDNN_SDPA_DEPRIORITIZED`` is set (``check_prefer_cudnn_attention``, sdp_utils.cpp)."""
    return cc[0] in (9, 10) and not _env_true("TORCH_CUDNN_SDPA_DEPRIORITIZED")


@dataclass(frozen=True)
class AttentionCall:
    """One attention call's shapes: batch, heads, query and key lengths, head dims (q/k and v),
    dtype, and the options that steer the choice of kernel."""

    b: int
    h: int
    sq: int
    sk: int
    d: int
    dv: int
    dtype: torch.dtype
    has_mask: bool = False
    mask_requires_grad: bool = False
    dropout_p: float = 0.0
    is_causal: bool = False
    requires_grad: bool = False


def _flash_ok(cc: tuple[int, int], c: AttentionCall) -> bool:
    """``can_use_flash_attention``: sm80 to sm121, fp16/bf16, no mask, equal head dims up to 256,
    causal only on square shapes, and sm86/89/12x's limit on head dims when training."""
    if not ((8, 0) <= cc <= (12, 1)) or c.dtype not in _HALF or c.has_mask:
        return False
    if c.d != c.dv or c.d > 256 or (c.is_causal and c.sq != c.sk) or min(c.sq, c.sk, c.b, c.h) == 0:
        return False
    if c.requires_grad and cc in ((8, 6), (8, 9), (12, 0), (12, 1)):
        return c.d <= 192 or (c.d > 224 and c.dropout_p == 0)
    return True


def _efficient_ok(cc: tuple[int, int], c: AttentionCall) -> bool:
    """``can_use_mem_efficient_attention``: sm50 to sm121; fp16/fp32 (and bf16 from sm80); head
    dims aligned to ``minimum_gemm_alignment`` (8 for half, 4 for fp32 from sm80, 1 before)."""
    if not ((5, 0) <= cc <= (12, 1)) or min(c.sq, c.sk, c.b, c.h) == 0:
        return False
    allowed = (torch.float16, torch.float32, torch.bfloat16) if cc >= (8, 0) else (torch.float16, torch.float32)
    if c.dtype not in allowed:
        return False
    align = 8 if c.dtype in _HALF else (4 if cc >= (8, 0) else 1)
    if c.d % align or c.dv % align:
        return False
    return not (c.dropout_p > 0 and c.b > 65535)


def _cudnn_ok(cc: tuple[int, int], c: AttentionCall) -> bool:
    """``can_use_cudnn_attention``: sm80 to sm121, fp16/bf16, not in deterministic mode, a mask
    that needs no gradient, dropout in sixteenths, head dims up to 128 and multiples of 8 (192
    for q/k with 128 for v on 9.x/10.x), batch and heads up to 65535, and sequences longer than 1."""
    if not ((8, 0) <= cc <= (12, 1)) or c.dtype not in _HALF or torch.are_deterministic_algorithms_enabled():
        return False
    if c.mask_requires_grad or (c.dropout_p * 16) != int(c.dropout_p * 16):
        return False
    dims_ok = (c.d <= 128 and c.dv <= 128) or (cc[0] in (9, 10) and c.d == 192 and c.dv == 128)
    if not dims_ok or c.d % 8 or c.dv % 8 or c.b > 65535 or c.h > 65535:
        return False
    return c.sk != 1 and not (c.dropout_p > 0 and c.sq == 1) and min(c.sq, c.sk, c.b, c.h) > 0


def sdpa_backend(cc: tuple[int, int], call: AttentionCall) -> str:
    """The kernel torch's CUDA ``scaled_dot_product_attention`` runs for ``call`` on a card of
    compute capability ``cc``: one of :data:`SDPA_BACKENDS`. It tries the backends in torch's
    order (cuDNN first where :func:`cudnn_attention_preferred`, else flash, efficient, math,
    cuDNN) and honours ``torch.nn.attention.sdpa_kernel``'s switches."""
    order = ["cudnn", "flash", "efficient", "math"] if cudnn_attention_preferred(cc) else \
        ["flash", "efficient", "math", "cudnn"]
    checks: dict[str, Callable[[], bool]] = {
        "cudnn": lambda: torch.backends.cuda.cudnn_sdp_enabled() and _cudnn_ok(cc, call),
        "flash": lambda: torch.backends.cuda.flash_sdp_enabled() and _flash_ok(cc, call),
        "efficient": lambda: torch.backends.cuda.mem_efficient_sdp_enabled() and _efficient_ok(cc, call),
        "math": lambda: torch.backends.cuda.math_sdp_enabled(),
    }
    for name in order:
        if checks[name]():
            return name
    raise RuntimeError("No available kernel. Aborting execution.")  # torch's own words


class CudaKernels(TorchFunctionMode):
    """Reroute the operators whose CUDA kernels keep other tensors than the CPU's (module docs),
    for a card of compute capability ``cc``, counted in ``ledger``. Enter it inside the ledger
    (and its hooks); leaving it removes its optimizer hooks. The cuBLAS workspace it allocates
    stays for the life of this object, as it stays for the life of a CUDA process."""

    def __init__(self, ledger: Ledger, cc: tuple[int, int]) -> None:
        super().__init__()
        self.ledger = ledger
        self.cc = (int(cc[0]), int(cc[1]))
        self.workspace: Optional[torch.Tensor] = None
        self.last_backend: Optional[str] = None  # the attention kernel of the last call (for tests and lessons)
        self._handles: list[Any] = []
        self._foreach_set: list[dict[str, Any]] = []

    # ------------------------------------------------------------------ entering

    def __enter__(self) -> "CudaKernels":
        from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

        self._handles = [register_optimizer_step_pre_hook(self._opt_pre),
                         register_optimizer_step_post_hook(self._opt_post)]
        super().__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        super().__exit__(*exc)
        for h in self._handles:
            h.remove()
        self._handles = []

    def _opt_pre(self, opt: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        for g in opt.param_groups:
            if "foreach" in g and g["foreach"] is None and not g.get("fused") and not g.get("differentiable") and \
                    all(type(p) in (torch.Tensor, torch.nn.Parameter) for p in g["params"]):
                g["foreach"] = True  # CUDA's default (_default_to_fused_or_foreach)
                self._foreach_set.append(g)

    def _opt_post(self, opt: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        for g in self._foreach_set:
            g["foreach"] = None
        self._foreach_set = []

    # ------------------------------------------------------------------ routing

    def __torch_function__(self, func: Callable[..., Any], types: Any, args: tuple = (),
                           kwargs: Optional[dict] = None) -> Any:
        kwargs = kwargs or {}
        if func is _SDPA:
            return self._sdpa(args, kwargs)
        if func in _DROPOUTS:
            return self._dropout(func, args, kwargs)
        if self.workspace is None and getattr(func, "__name__", "") in _MATMUL_NAMES:
            self._cublas_workspace()
        return func(*args, **kwargs)

    def _cublas_workspace(self) -> None:
        self.workspace = torch.empty(cublas_workspace_size(self.cc), dtype=torch.uint8)

    def _dropout(self, func: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
        names = ("input", "p", "training", "inplace") if func is F.dropout else ("input", "p", "train")
        a = dict(zip(names, args))
        a.update(kwargs)
        x = a["input"]
        p = float(a.get("p", 0.5))
        train = bool(a.get("training", a.get("train", True)))
        if (a.get("inplace", False) or not train or not 0.0 < p < 1.0 or not isinstance(x, torch.Tensor)
                or x.numel() == 0 or x.is_nested or x.is_complex()):
            return func(*args, **kwargs)
        return torch.native_dropout(x, p, True)[0]

    def _sdpa(self, args: tuple, kwargs: dict) -> Any:
        names = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa")
        a = dict(zip(names, args))
        a.update(kwargs)
        q, k, v, mask = a["query"], a["key"], a["value"], a.get("attn_mask")
        if (a.get("enable_gqa") or not all(isinstance(t, torch.Tensor) for t in (q, k, v)) or q.dim() != 4
                or k.dim() != 4 or v.dim() != 4 or q.is_nested or q.shape[1] != k.shape[1]
                or (mask is not None and not isinstance(mask, torch.Tensor))):
            return _SDPA(*args, **kwargs)
        p, causal, scale = float(a.get("dropout_p", 0.0)), bool(a.get("is_causal", False)), a.get("scale")
        grad = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))
        call = AttentionCall(q.shape[0], q.shape[1], q.shape[2], k.shape[2], q.shape[3], v.shape[3], q.dtype,
                             has_mask=mask is not None, mask_requires_grad=bool(mask is not None and mask.requires_grad),
                             dropout_p=p, is_causal=causal, requires_grad=grad)
        backend = sdpa_backend(self.cc, call)
        self.last_backend = backend
        if self.workspace is None:
            self._cublas_workspace()
        if backend == "math":
            return _math_attention(q, k, v, mask, p, causal, scale)
        if mask is not None and mask.dtype == torch.bool:  # convert_boolean_attn_mask: a new tensor in q's dtype
            mask = torch.where(mask, 0.0, float("-inf")).to(q.dtype)
        return _FusedAttention.apply(q, k, v, mask, p, causal, scale, backend, call, self.ledger)


def _math_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: Optional[torch.Tensor], p: float,
                    causal: bool, scale: Optional[float]) -> torch.Tensor:
    """``_scaled_dot_product_attention_math`` as torch writes it (attention.cpp), operator by
    operator so that autograd and the books see each: half-precision inputs upcast to float32
    unless ``allow_fp16_bf16_reduction_math_sdp``; q and k each scaled by the square root of the
    scale; ``q @ k^T``; the mask added; ``_safe_softmax``; CUDA's dropout (one-byte mask); ``@ v``;
    the output cast back, and the attention weights cast back too (returned, then dropped)."""
    origin = q.dtype
    if mask is not None and mask.dtype == torch.bool:
        mask = torch.where(mask, 0.0, float("-inf")).to(origin)
    if origin in _HALF and not torch.backends.cuda.fp16_bf16_reduction_math_sdp_allowed():
        q, k, v = q.to(torch.float32), k.to(torch.float32), v.to(torch.float32)
    s = scale if scale is not None else 1.0 / math.sqrt(q.shape[-1])
    sf = math.sqrt(abs(s))
    query = q * (-sf if s < 0 else sf)
    if causal:
        keep = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool).tril()
        mask = torch.where(keep, 0.0, float("-inf")).to(origin)
    attn = torch.matmul(query, k.transpose(-2, -1) * sf)
    if mask is not None:
        attn.add_(mask)
    attn = torch._safe_softmax(attn, -1)
    if p > 0:
        attn = torch.native_dropout(attn, p, True)[0]
    out = torch.matmul(attn, v).to(origin)
    weights = attn.to(origin)  # the second output, allocated and dropped by the dispatcher
    del weights
    return out


def _round(n: int, m: int) -> int:
    return -(-n // m) * m


def _empty_in_layout(t: torch.Tensor, last: int) -> torch.Tensor:
    """A new tensor of ``t``'s shape and dtype with the last dimension ``last``, its dimensions in
    ``t``'s memory order (cuDNN's ``alloc_with_matching_layout``): one allocation."""
    strides = t.stride()
    order = sorted(range(t.dim()), key=lambda i: -strides[i])
    shape = [*t.shape[:-1], last]
    return torch.empty([shape[i] for i in order], dtype=t.dtype).permute(*[order.index(i) for i in range(t.dim())])


class _FusedAttention(torch.autograd.Function):
    """Flash, memory-efficient or cuDNN attention, allocating and saving what the CUDA kernel
    does (module docs); the values are computed on the CPU with the ledger paused and copied
    into what the kernel allocates. The dropout mask is never stored: the kernels regenerate it
    from a Philox seed, and this model from the CPU generator's state."""

    @staticmethod
    def forward(ctx: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: Optional[torch.Tensor],
                p: float, causal: bool, scale: Optional[float], backend: str, c: AttentionCall,
                ledger: Ledger) -> torch.Tensor:
        with ledger.paused():
            rng = torch.get_rng_state() if p > 0 else None
            val = _SDPA(q, k, v, attn_mask=mask, dropout_p=p, is_causal=causal, scale=scale)
        qs, ks, vs = q, k, v
        pad = (-c.d) % 8 if backend == "flash" else 0
        if pad:  # pad_last_dim<8>: the kernel gets (and autograd keeps) padded copies
            qs, ks, vs = (F.pad(t, (0, pad)) for t in (q, k, v))
        extra: list[torch.Tensor] = []
        if backend == "flash":  # mha_fwd: out = empty_like(q_t), returned transposed; lse (b, h, sq)
            out = torch.empty_like(qs.transpose(1, 2)).transpose(1, 2)
            lse = torch.empty((c.b, c.h, c.sq), dtype=torch.float32)
            extra = [torch.empty((2,), dtype=torch.uint64), torch.empty((), dtype=torch.uint64)]  # rng_state, unused
        elif backend == "efficient":  # (b, sq, h, dv) contiguous, transposed; lse padded to 32 when needed
            out = torch.empty((c.b, c.sq, c.h, c.dv), dtype=q.dtype).transpose(1, 2)
            lse = torch.empty((c.b, c.h, _round(c.sq, 32) if c.requires_grad else 0), dtype=torch.float32)
            if c.dtype in _HALF and max(c.d, c.dv) > 128:  # output_accum, while the kernel runs
                scratch = torch.empty((c.b, c.sq, c.h, c.dv), dtype=torch.float32)
                del scratch
        else:  # cuDNN: output in q's layout, softmax stats (b, h, sq, 1), seed and offset on the device
            out = _empty_in_layout(qs, c.dv)
            lse = torch.empty((c.b, c.h, c.sq, 1) if c.requires_grad else (0,), dtype=torch.float32)
            extra = [torch.empty((), dtype=torch.int64), torch.empty((), dtype=torch.int64)]
        out[..., : c.dv].copy_(val) if pad else out.copy_(val)
        del val
        ctx.rng, ctx.p, ctx.causal, ctx.scale, ctx.backend, ctx.call, ctx.ledger, ctx.pad = \
            rng, p, causal, scale, backend, c, ledger, pad
        ctx.has_mask = mask is not None
        ctx.save_for_backward(qs, ks, vs, out, lse, *extra, *([mask] if mask is not None else []))
        return out[..., : c.dv] if pad else out

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> Any:
        saved = ctx.saved_tensors
        qs, ks, vs = saved[0], saved[1], saved[2]
        mask = saved[-1] if ctx.has_mask else None
        c: AttentionCall = ctx.call
        pad: int = ctx.pad
        q, k, v = ((t[..., : c.d] for t in (qs, ks, vs)) if pad else (qs, ks, vs))
        ledger: Ledger = ctx.ledger
        with ledger.paused():
            with torch.random.fork_rng(devices=[]):
                if ctx.rng is not None:
                    torch.set_rng_state(ctx.rng)
                with torch.enable_grad():
                    qd, kd, vd = (t.detach().requires_grad_(True) for t in (q, k, v))
                    o = _SDPA(qd, kd, vd, attn_mask=mask, dropout_p=ctx.p, is_causal=ctx.causal, scale=ctx.scale)
                    gq, gk, gv = torch.autograd.grad(o, (qd, kd, vd), grad_out)
        scratch: list[torch.Tensor] = []
        if not grad_out.transpose(1, 2).is_contiguous():  # grad_out.contiguous() in the (b, s, h, d) layout
            scratch.append(grad_out.transpose(1, 2).contiguous())
        if ctx.backend == "flash":  # mha_bwd: dq, dk, dv like q_t, softmax_d and dq_accum in float32
            sq, d = _round(c.sq, 128), _round(c.d + pad, 32 if c.d + pad <= 128 else 64)
            scratch += [torch.empty((c.b, c.h, sq), dtype=torch.float32),
                        torch.empty((c.b, sq, c.h, d), dtype=torch.float32)]
            dq, dk, dv = (torch.empty_like(t.transpose(1, 2)).transpose(1, 2) for t in (qs, ks, vs))
        elif ctx.backend == "efficient":  # grad_q/k/v (b, s, h, d) contiguous; delta in float32
            if c.dtype in _HALF:
                scratch.append(torch.empty((c.b, c.h, c.sq), dtype=torch.float32))
            else:  # (grad_out.float() * out.float()).sum(-1).transpose(-2, -1).contiguous()
                scratch += [torch.empty((c.b, c.sq, c.h, c.dv), dtype=torch.float32),
                            torch.empty((c.b, c.h, c.sq), dtype=torch.float32)]
            dq, dk, dv = (torch.empty((t.shape[0], t.shape[2], t.shape[1], t.shape[3]), dtype=t.dtype).transpose(1, 2)
                          for t in (qs, ks, vs))
        else:  # cuDNN: empty_like(query/key/value)
            dq, dk, dv = torch.empty_like(qs), torch.empty_like(ks), torch.empty_like(vs)
        for dst, src in ((dq, gq), (dk, gk), (dv, gv)):
            (dst[..., : c.d] if pad else dst).copy_(src)
        del scratch, gq, gk, gv
        if pad:
            dq, dk, dv = dq[..., : c.d], dk[..., : c.d], dv[..., : c.d]
        return dq, dk, dv, None, None, None, None, None, None, None
