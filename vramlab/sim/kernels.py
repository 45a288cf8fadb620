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
- **Every path to the attention kernels** is seen. A ``TorchFunctionMode`` is popped while its
  ``__torch_function__`` runs, so a Python function of ``torch.nn.functional`` that dispatched
  itself to the mode (``multi_head_attention_forward``: the path of ``nn.MultiheadAttention`` in
  training or with ``need_weights``, and of ``nn.TransformerEncoderLayer``/``DecoderLayer``) hid
  its inner ``scaled_dot_product_attention``, ``dropout`` and ``linear``: it now runs with the mode
  pushed again (its own ``has_torch_function`` checks off, else it would loop). The fast paths:
  with the mode on, ``has_torch_function`` is true for every tensor, so the checks in
  ``nn.MultiheadAttention.forward`` and ``nn.TransformerEncoderLayer.forward`` would refuse them
  where CUDA takes them (eval, no gradient needed, batch-first self-attention...);
  ``torch.overrides.has_torch_function`` answers ``False`` to those two checks alone while the
  mode is on and no tensor subclass is involved. ``torch._native_multi_head_attention`` then runs
  ``native_multi_head_attention_cuda`` (attention.cu): self-attention, a head dim multiple of 8, no
  weights and no mask, where flash, efficient or cuDNN would be picked: ``linear``, ``chunk``,
  ``scaled_dot_product_attention`` (rerouted as above), ``linear``; otherwise its older kernels
  (one gemm, ``_transform_bias_rescale_qkv``'s (3, b, h, t, d), a (b, h, t, t) score matrix in the
  input's dtype, ``masked_softmax``, ``transform0213_gemm_nt_bias``), counted as empty tensors
  with the CPU's values copied in. ``torch._transformer_encoder_layer_fwd`` runs
  ``transformer_encoder_layer_forward`` (transformer.cpp) operator by operator: in-place residuals,
  ``_addmm_activation`` then ``addmm``. Hugging Face's ``sdpa_attention_forward``
  (transformers/integrations/sdpa_attention.py) calls ``F.scaled_dot_product_attention`` itself,
  with ``enable_gqa=True`` whenever there is no mask; with as many key/value heads as query heads
  that is a plain call on CUDA (``check_batch_size_and_num_heads_dense``) and is rerouted.
- **Optimizers** take torch's CUDA default, the ``foreach`` (multi-tensor) path, where the user
  left ``foreach`` unset (``_default_to_fused_or_foreach``, torch/optim/optimizer.py); the
  lists it builds (``exp_avg_sq_sqrt``...) are counted. ``fused=True`` is honoured as asked.
- **The cuBLAS workspace**: the first matrix product allocates it through the caching
  allocator (``getNewWorkspace`` in aten/src/ATen/cuda/CublasHandlePool.cpp), so it counts in
  ``memory_allocated``: 32 MiB on compute capability 9.x, 10.x and 12.x, 8.125 MiB before
  (``parseChosenWorkspaceSize``, ``CUBLAS_WORKSPACE_CONFIG`` overrides it). cuBLASLt shares it.
- **Backward** runs under the same model: ``loss.backward()``, ``torch.autograd.backward`` and
  ``torch.autograd.grad`` dispatch themselves to the mode, which is popped while it handles them, and
  the autograd engine runs the graph under the caller's thread-local state; they now run with the mode
  pushed again (their own ``has_torch_function`` checks off), so that ``torch.utils.checkpoint``'s
  recomputation takes CUDA's dropout and attention, as the forward did, and saves the same tensors.
- **Autocast** follows CUDA's lists (:data:`CUDA_AUTOCAST_LISTS`, from at::autocast's
  aten/src/ATen/autocast_mode.h and .cpp, and the docs' "CUDA Ops that can autocast to float32"): the
  virtual card's tensors are CPU tensors, so ``torch.autocast("cpu")`` is what runs, and while a
  thread is inside this mode its ``AutocastCPU`` kernels are CUDA's (softmax, log_softmax, layer_norm,
  exp, pow, sum, the losses, ... in float32; matmuls, convolutions and linear in 16 bits;
  ``binary_cross_entropy`` refused). A Python kernel is registered for each operator whose two
  policies differ, for as long as any card is active, and answers with the CPU's policy on other
  threads. ``scaled_dot_product_attention`` casts its inputs before picking the kernel, as CUDA's
  autocast does first. softmax/log_softmax of a float16 input asked for float32 (autocast's
  ``fp32_set_opt_dtype``, or ``dtype=torch.float32``) is CUDA's ``half_to_float`` kernel: a float32
  output and no float32 copy of the input (``softmax`` in aten/src/ATen/native/SoftMax.cpp).

Not modelled, and said so in the docs: the cuBLAS workspace of the autograd engine's own
thread (torch keeps one per handle and stream; a backward on CUDA likely adds a second),
cuDNN's and the memory-efficient backward's workspaces (their sizes depend on kernel
constants not resolved here), flash attention's split-KV buffers in inference, deterministic
mode's buffers, nested tensors (``TransformerEncoder``'s nested fast path with a padding mask
included) and grouped-query attention with fewer key/value heads than query heads (those calls
run as on the CPU), and the exact temporaries of ``masked_softmax`` on the older native
multi-head-attention kernels. Under autocast: the cast cache of the operators that get a Python
kernel is its own (a weight used by ``mm`` and by ``einsum`` is cast once for each), and the
autocast of ``nn.LSTM`` (on CUDA ``_cudnn_rnn``'s own autocast kernel casts its flat weights, outside
these lists) and of the native multi-head attention fast path are not modelled.

Sizes in bytes. This module imports torch; it never imports IPython.
"""

from __future__ import annotations

import math
import os
import sys
import threading
import warnings
import weakref
from types import FunctionType
from dataclasses import dataclass
from typing import Any, Callable, Optional

from .._extras import require_torch

require_torch("vramlab.sim.kernels")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import torch.utils._pytree as pytree  # noqa: E402
from torch.overrides import TorchFunctionMode  # noqa: E402

from .ledger import Ledger  # noqa: E402

__all__ = ["CudaKernels", "sdpa_backend", "cublas_workspace_size", "cudnn_attention_preferred", "SDPA_BACKENDS"]

#: The attention kernels :func:`sdpa_backend` names.
SDPA_BACKENDS: tuple[str, ...] = ("cudnn", "flash", "efficient", "math")

_HALF = (torch.float16, torch.bfloat16)
_SDPA = F.scaled_dot_product_attention
_MHA_FORWARD: Any = F.multi_head_attention_forward
_NATIVE_MHA = torch._native_multi_head_attention
_ENCODER_LAYER = torch._transformer_encoder_layer_fwd
_DROPOUTS = (F.dropout, torch.dropout)
#: The calls that run the autograd engine; they dispatch themselves to a TorchFunctionMode
#: (``has_torch_function``), which pops it while it handles them.
_BACKWARDS = (torch.Tensor.backward, torch.autograd.backward, torch.autograd.grad)
#: softmax and log_softmax as Python calls them (``True``: log_softmax).
_SOFTMAXES: dict[Any, bool] = {F.softmax: False, F.log_softmax: True, torch.softmax: False, torch.log_softmax: True,
                               torch.Tensor.softmax: False, torch.Tensor.log_softmax: True}
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


def _no_torch_function(*args: Any) -> bool:
    return False


_TRANSPARENT: dict[Callable[..., Any], Callable[..., Any]] = {}


def _transparent(func: Any) -> Callable[..., Any]:
    """``func`` without its own ``has_torch_function`` checks: the same code and defaults, its
    module's globals with the three checks answering ``False``. Run with the mode pushed again,
    its body calls the operators through the mode instead of dispatching itself to it once more
    (which would loop)."""
    clone = _TRANSPARENT.get(func)
    if clone is None:
        glob = dict(func.__globals__)
        glob.update(has_torch_function=_no_torch_function, has_torch_function_unary=_no_torch_function,
                    has_torch_function_variadic=_no_torch_function)
        clone = FunctionType(func.__code__, glob, func.__name__, func.__defaults__, func.__closure__)
        clone.__kwdefaults__ = func.__kwdefaults__
        _TRANSPARENT[func] = clone
    return clone


_ORIGINAL_HAS_TORCH_FUNCTION = torch.overrides.has_torch_function


def _fast_path_codes() -> frozenset:
    from torch.nn.modules.activation import MultiheadAttention
    from torch.nn.modules.transformer import TransformerEncoderLayer

    return frozenset({MultiheadAttention.forward.__code__, TransformerEncoderLayer.forward.__code__})


_FAST_PATH_CODES = _fast_path_codes()


def _fast_path_has_torch_function(relevant_args: Any) -> bool:
    """``torch.overrides.has_torch_function`` while :class:`CudaKernels` is on: ``False`` for the
    fast-path checks of ``nn.MultiheadAttention.forward`` and ``nn.TransformerEncoderLayer.forward``
    when only this mode (no tensor subclass, no other mode above it) made it ``True``, so that they
    take the path a CUDA card takes (``_native_multi_head_attention``,
    ``_transformer_encoder_layer_fwd``), which the mode then reroutes. Anything else: torch's answer."""
    found = _ORIGINAL_HAS_TORCH_FUNCTION(relevant_args)
    if found and sys._getframe(1).f_code in _FAST_PATH_CODES and \
            isinstance(torch.overrides._get_current_function_mode(), CudaKernels) and \
            not any(_own_torch_function(t) for t in relevant_args):
        return False
    return found


def _own_torch_function(t: Any) -> bool:
    """Whether ``t`` is a tensor subclass with a ``__torch_function__`` of its own."""
    if not isinstance(t, torch.Tensor):
        return False
    tf = type(t).__torch_function__
    return getattr(tf, "__func__", tf) not in (torch.Tensor.__torch_function__.__func__,  # type: ignore[attr-defined]
                                              torch._C._disabled_torch_function_impl)


# --------------------------------------------------------------------------- CUDA's autocast

LOWER, FP32, FP32_SET_OPT_DTYPE, FP32_APPEND_DTYPE, PROMOTE, BANNED = (
    "lower_precision_fp", "fp32", "fp32_set_opt_dtype", "fp32_append_dtype", "promote", "banned")

#: CUDA's autocast lists, by cast policy, as aten's ``name.overload`` (``name`` for the default
#: overload): at::autocast's AT_FORALL_LOWER_PRECISION_FP, AT_FORALL_FP32, AT_FORALL_FP32_SET_OPT_DTYPE,
#: AT_FORALL_DIFFERENT_REDISPATCH_SIGNATURE and AT_FORALL_PROMOTE (aten/src/ATen/autocast_mode.h),
#: which ``TORCH_LIBRARY_IMPL(aten, Autocast, m)`` in aten/src/ATen/autocast_mode.cpp registers for
#: CUDA with ``cudnn_convolution``/``cudnn_convolution_transpose`` and ``binary_cross_entropy``
#: banned; the same lists as the docs' "CUDA Ops that can autocast to float16" and "CUDA Ops that
#: can autocast to float32" (https://pytorch.org/docs/stable/amp.html#cuda-op-specific-behavior:
#: softmax, log_softmax, layer_norm, exp, pow, sum, the losses, ... in float32; cross_entropy there is
#: log_softmax then nll_loss). :func:`cuda_autocast_policies` keeps those the installed torch
#: registers for ``AutocastCUDA`` (its CPU build registers them too), and a test checks that
#: every one of its registrations has a policy here.
CUDA_AUTOCAST_LISTS: dict[str, tuple[str, ...]] = {
    LOWER: ("_convolution.deprecated", "_convolution", "conv1d", "conv2d", "conv3d", "conv_tbc", "conv_transpose1d",
            "conv_transpose2d.input", "conv_transpose3d.input", "convolution", "prelu", "addmm", "addmv", "addr",
            "matmul", "einsum", "mm", "mv", "linalg_vecdot", "linear", "addbmm", "baddbmm", "bmm", "chain_matmul",
            "linalg_multi_dot", "_thnn_fused_lstm_cell", "_thnn_fused_gru_cell", "lstm_cell", "gru_cell",
            "rnn_tanh_cell", "rnn_relu_cell", "_scaled_dot_product_flash_attention", "scaled_dot_product_attention",
            "cudnn_convolution", "cudnn_convolution_transpose"),
    FP32: ("acos", "asin", "cosh", "erfinv", "exp", "expm1", "log", "log10", "log2", "log1p", "reciprocal", "rsqrt",
           "sinh", "tan", "pow.Tensor_Scalar", "pow.Tensor_Tensor", "pow.Scalar", "softplus", "layer_norm",
           "native_layer_norm", "rms_norm", "group_norm", "frobenius_norm.dim", "nuclear_norm", "nuclear_norm.dim",
           "cosine_similarity", "poisson_nll_loss", "cosine_embedding_loss", "nll_loss", "nll_loss2d",
           "hinge_embedding_loss", "kl_div", "l1_loss", "smooth_l1_loss", "huber_loss", "mse_loss",
           "margin_ranking_loss", "multilabel_margin_loss", "soft_margin_loss", "triplet_margin_loss",
           "multi_margin_loss", "binary_cross_entropy_with_logits", "dist", "pdist", "cdist", "renorm", "logsumexp",
           "upsample_nearest1d", "_upsample_nearest_exact1d", "upsample_nearest2d", "_upsample_nearest_exact2d",
           "upsample_nearest3d", "_upsample_nearest_exact3d", "upsample_linear1d", "upsample_bilinear2d",
           "_upsample_bilinear2d_aa", "upsample_trilinear3d", "upsample_bicubic2d", "_upsample_bicubic2d_aa"),
    FP32_SET_OPT_DTYPE: ("prod", "prod.dim_int", "prod.dim_Dimname", "softmax.int", "softmax.Dimname",
                         "log_softmax.int", "log_softmax.Dimname", "cumprod", "cumprod.dimname", "cumsum",
                         "cumsum.dimname", "linalg_vector_norm", "linalg_matrix_norm", "linalg_matrix_norm.str_ord",
                         "sum", "sum.dim_IntList", "sum.dim_DimnameList"),
    FP32_APPEND_DTYPE: ("norm.Scalar", "norm.ScalarOpt_dim", "norm.names_ScalarOpt_dim"),
    PROMOTE: ("addcdiv", "addcmul", "atan2", "bilinear", "cross", "dot", "vdot", "grid_sampler", "index_put",
              "tensordot", "scatter_add"),
    BANNED: ("binary_cross_entropy",),
}

#: The CPU's autocast lists that are not float32 (``TORCH_LIBRARY_IMPL(aten, AutocastCPU, m)``,
#: autocast_mode.cpp): every other operator it registers is float32.
CPU_AUTOCAST_LOWER: tuple[str, ...] = (
    "conv1d", "conv1d.padding", "conv2d", "conv2d.padding", "conv3d", "conv3d.padding", "bmm", "mm", "linalg_vecdot",
    "baddbmm", "addmm", "_addmm_activation", "addbmm", "linear", "_convolution.deprecated", "matmul", "conv_tbc",
    "mkldnn_rnn_layer", "conv_transpose1d", "conv_transpose2d.input", "conv_transpose3d.input", "prelu",
    "scaled_dot_product_attention", "_native_multi_head_attention")
CPU_AUTOCAST_PROMOTE: tuple[str, ...] = ("stack", "cat", "index_copy", "index_copy.dimname")

_BANNED_MESSAGE = (  # torch's own words (binary_cross_entropy_banned, autocast_mode.cpp)
    "torch.nn.functional.binary_cross_entropy and torch.nn.BCELoss are unsafe to autocast.\n"
    "Many models use a sigmoid layer right before the binary cross entropy layer.\n"
    "In this case, combine the two layers using torch.nn.functional.binary_cross_entropy_with_logits\n"
    "or torch.nn.BCEWithLogitsLoss.  binary_cross_entropy_with_logits and BCEWithLogits are\n"
    "safe to autocast.")


def _registered(key: str) -> set[str]:
    return {n[len("aten::"):] for n in torch._C._dispatch_get_registrations_for_dispatch_key(key)
            if n.startswith("aten::")}


def cuda_autocast_policies() -> dict[str, str]:
    """CUDA's autocast policy of each operator the installed torch registers for ``AutocastCUDA``
    (``name.overload`` -> one of ``lower_precision_fp``, ``fp32``, ``fp32_set_opt_dtype``,
    ``fp32_append_dtype``, ``promote``, ``banned``): :data:`CUDA_AUTOCAST_LISTS`."""
    have = _registered("AutocastCUDA")
    return {op: policy for policy, ops in CUDA_AUTOCAST_LISTS.items() for op in ops if op in have}


def cpu_autocast_policies() -> dict[str, str]:
    """The CPU's autocast policy of each operator the installed torch registers for ``AutocastCPU``."""
    lower, promote = set(CPU_AUTOCAST_LOWER), set(CPU_AUTOCAST_PROMOTE)
    return {op: LOWER if op in lower else PROMOTE if op in promote else FP32 for op in _registered("AutocastCPU")}


_AFTER_AUTOCAST = torch._C._dispatch_keyset_full_after(torch._C.DispatchKey.AutocastCPU)
_STATE = threading.local()  # .active: the CudaKernels this thread is in, innermost last
_LOCK = threading.Lock()
_INSTALLED: dict[str, Any] = {"users": 0, "lib": None, "clear": None}
_CAST_CACHE: dict[int, tuple[Any, torch.Tensor]] = {}


def _active_kernels() -> Optional["CudaKernels"]:
    """The innermost :class:`CudaKernels` this thread is in (it runs on a virtual CUDA card), or ``None``."""
    active = getattr(_STATE, "active", None)
    return active[-1] if active else None


def _eligible(t: Any) -> bool:
    """``is_eligible``: a floating tensor on the device (the CPU here), not float64."""
    return isinstance(t, torch.Tensor) and t.is_floating_point() and t.dtype != torch.float64 and \
        t.device.type == "cpu"


def _cached_cast(to: torch.dtype, t: Any) -> Any:
    """``at::autocast::cached_cast``: ``t`` cast to ``to`` if it is eligible and another dtype; a
    float32 leaf that requires grad (a weight) cast to the lower precision is cast once per
    autocast region (the cache torch empties when the outermost autocast exits)."""
    if not _eligible(t) or t.dtype == to:
        return t
    if to == torch.get_autocast_dtype("cpu") and t.dtype == torch.float32 and t.requires_grad and t.is_leaf \
            and not t._is_view() and torch.is_autocast_cache_enabled():
        hit = _CAST_CACHE.get(id(t))
        if hit is not None and hit[0]() is t:
            return hit[1]
        out = t.to(to)
        _CAST_CACHE[id(t)] = (weakref.ref(t), out)
        return out
    return t.to(to)


def _promote_type(low: torch.dtype, args: Any) -> torch.dtype:
    """``at::autocast::promote_type``: the widest floating type of the arguments, float32 over
    the lower precision, float64 ignored."""
    current = low
    for t in pytree.tree_leaves(args):
        if isinstance(t, torch.Tensor) and t.is_floating_point() and t.device.type == "cpu":
            nxt = t.dtype
            if nxt == torch.float64:
                continue
            if current == torch.float32 or nxt == torch.float32:
                current = torch.float32
            elif not (current == low and nxt == low):
                raise RuntimeError("Unexpected floating ScalarType in at::autocast::prioritize")
    return current


def _first_tensor(args: tuple) -> Any:
    return args[0] if args else None


def _cast_all(to: torch.dtype, tree: Any) -> Any:
    return pytree.tree_map(lambda t: _cached_cast(to, t), tree)


def _with_dtype(op: Any, args: tuple, kwargs: dict, dtype: torch.dtype) -> tuple[tuple, dict]:
    """``args``/``kwargs`` with the operator's ``dtype`` argument set to ``dtype`` unless given."""
    names = [a.name for a in op._schema.arguments]
    i = names.index("dtype")
    if i < len(args) and not op._schema.arguments[i].kwarg_only:
        if args[i] is None:
            args = (*args[:i], dtype, *args[i + 1:])
    elif kwargs.get("dtype") is None:
        kwargs = {**kwargs, "dtype": dtype}
    return args, kwargs


def _run_policy(policy: str, op: Any, args: tuple, kwargs: dict) -> Any:
    """One operator under an autocast cast policy (the ``WrapFunction_`` specialisations of
    autocast_mode.h): the inputs cast, then the operator with autocast off."""
    low = torch.get_autocast_dtype("cpu")
    with torch._C._DisableAutocast():
        if policy == LOWER:
            return op(*_cast_all(low, args), **_cast_all(low, kwargs))
        if policy == FP32:
            return op(*_cast_all(torch.float32, args), **_cast_all(torch.float32, kwargs))
        if policy == FP32_SET_OPT_DTYPE:
            if _eligible(_first_tensor(args)):
                args, kwargs = _with_dtype(op, args, kwargs, torch.float32)
            return op(*args, **kwargs)
        if policy == FP32_APPEND_DTYPE:  # norm.Scalar -> norm.ScalarOpt_dtype, norm.X -> norm.X_dtype
            first = args[0]
            out = torch.float32 if _eligible(first) else first.dtype
            overload = op._overloadname
            target = getattr(torch.ops.aten.norm, "ScalarOpt_dtype" if overload == "Scalar" else overload + "_dtype")
            full = list(args)
            if overload == "Scalar" and len(full) < 2 and "p" not in kwargs:
                full.append(2)  # p's default
            elif overload != "Scalar" and len(full) < 4 and "keepdim" not in kwargs:
                full.append(False)  # keepdim's default
            return target(*full, **kwargs, dtype=out)
        if policy == PROMOTE:
            to = _promote_type(low, (args, kwargs))
            return op(*_cast_all(to, args), **_cast_all(to, kwargs))
        if policy == BANNED:
            raise RuntimeError(_BANNED_MESSAGE)
    raise ValueError(f"unknown autocast policy {policy!r}")


def _autocast_kernel(op: Any, cuda: Optional[str], cpu: Optional[str]) -> Callable[..., Any]:
    """The ``AutocastCPU`` kernel of ``op`` while a virtual CUDA card is in use: CUDA's policy on a
    thread inside a :class:`CudaKernels`, the CPU's own elsewhere; no policy is a fallthrough (the
    operator continues below autocast, and what it calls is autocast again)."""

    softmax = op in (torch.ops.aten.softmax.int, torch.ops.aten.log_softmax.int)

    def kernel(keyset: Any, *args: Any, **kwargs: Any) -> Any:
        here = _active_kernels()
        policy = cuda if here is not None else cpu
        if policy is None:
            return op.redispatch(keyset & _AFTER_AUTOCAST, *args, **kwargs)
        if softmax and here is not None:
            x, dim = args[0], args[1]
            dtype = args[2] if len(args) > 2 else kwargs.get("dtype")
            if isinstance(x, torch.Tensor) and x.dtype == torch.float16 and dtype in (None, torch.float32):
                with torch._C._DisableAutocast():  # fp32_set_opt_dtype: float32, which CUDA's softmax runs as half_to_float
                    return _HalfToFloatSoftmax.apply(x, dim, op is torch.ops.aten.log_softmax.int, here.ledger)
        return _run_policy(policy, op, args, kwargs)

    return kernel


def _resolve(name: str) -> Any:
    base, _, overload = name.partition(".")
    return getattr(getattr(torch.ops.aten, base), overload or "default")


def _clear_autocast_cache() -> None:
    """``torch.clear_autocast_cache`` while CUDA's autocast is modelled: torch's cache and ours."""
    _CAST_CACHE.clear()
    _INSTALLED["clear"]()


def _install_cuda_autocast() -> None:
    """Give CPU autocast CUDA's lists on the threads inside a :class:`CudaKernels` (reference
    counted): an ``AutocastCPU`` kernel for each operator whose CUDA policy differs from the
    CPU's (those alike keep torch's kernels and their cast cache)."""
    with _LOCK:
        _INSTALLED["users"] += 1
        if _INSTALLED["users"] > 1:
            return
        cuda, cpu = cuda_autocast_policies(), cpu_autocast_policies()
        lib = torch.library.Library("aten", "IMPL")
        with warnings.catch_warnings():  # "Overriding a previously registered kernel": that is the point
            warnings.simplefilter("ignore")
            for name in sorted(set(cuda) | set(cpu)):
                c, p = cuda.get(name), cpu.get(name)
                if c == p and c in (LOWER, FP32, PROMOTE):
                    continue
                lib.impl(name, _autocast_kernel(_resolve(name), c, p), "AutocastCPU", with_keyset=True)
        _INSTALLED["lib"] = lib
        _INSTALLED["clear"] = torch.clear_autocast_cache
        torch.clear_autocast_cache = _clear_autocast_cache


def _uninstall_cuda_autocast() -> None:
    with _LOCK:
        _INSTALLED["users"] -= 1
        if _INSTALLED["users"] > 0:
            return
        _INSTALLED["lib"]._destroy()
        torch.clear_autocast_cache = _INSTALLED["clear"]
        _INSTALLED.update(lib=None, clear=None)
        _CAST_CACHE.clear()


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
        self._patched = False

    # ------------------------------------------------------------------ entering

    def __enter__(self) -> "CudaKernels":
        from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

        self._handles = [register_optimizer_step_pre_hook(self._opt_pre),
                         register_optimizer_step_post_hook(self._opt_post)]
        self._patched = torch.overrides.has_torch_function is _ORIGINAL_HAS_TORCH_FUNCTION
        if self._patched:
            torch.overrides.has_torch_function = _fast_path_has_torch_function  # type: ignore[assignment]
        _install_cuda_autocast()
        if not hasattr(_STATE, "active"):
            _STATE.active = []
        _STATE.active.append(self)
        try:
            super().__enter__()
        except BaseException:
            _STATE.active.pop()
            _uninstall_cuda_autocast()
            raise
        return self

    def __exit__(self, *exc: Any) -> None:
        super().__exit__(*exc)
        _STATE.active.remove(self)
        _uninstall_cuda_autocast()
        if self._patched:
            torch.overrides.has_torch_function = _ORIGINAL_HAS_TORCH_FUNCTION
            self._patched = False
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
        if func is _NATIVE_MHA:
            return self._native_mha(args, kwargs)
        if func is _ENCODER_LAYER:
            return self._encoder_layer(args, kwargs)
        if func in _BACKWARDS:
            return self._backward(func, args, kwargs)
        if func in _SOFTMAXES:
            return self._softmax(func, args, kwargs)
        if self.workspace is None and getattr(func, "__name__", "") in _MATMUL_NAMES:
            self._cublas_workspace()
        if func is _MHA_FORWARD:
            # The Python function of torch.nn.functional that reaches CUDA's attention kernels
            # dispatched to this mode through its own handle_torch_function: run its body with the
            # mode on, so that the operators it calls (scaled_dot_product_attention, dropout,
            # linear) are seen. Only this one: a generic re-entry loops through boolean_dispatch
            # wrappers (max_pool2d) and would change nothing else that is modelled.
            torch.overrides._push_mode(self)
            try:
                return _transparent(_MHA_FORWARD)(*args, **kwargs)
            finally:
                torch.overrides._pop_mode()
        return func(*args, **kwargs)

    def _backward(self, func: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
        """``loss.backward()``, ``torch.autograd.backward``/``grad`` with this mode pushed again.

        The autograd engine runs the backward graph under the thread-local state of the call, mode
        stack included, and this mode is popped while its ``__torch_function__`` runs: without
        this, whatever Python runs inside backward ran on the CPU's kernels. Above all the
        recomputation of ``torch.utils.checkpoint``, which then took the CPU's dropout and
        attention, saved other tensors than the forward did, and failed its check
        (``CheckpointError``) on every GPU preset. The function runs without its own
        ``has_torch_function`` checks (:func:`_transparent`), else it would dispatch to the mode
        again; a tensor subclass with a ``__torch_function__`` of its own gets torch's path."""
        if any(_own_torch_function(t) for t in pytree.tree_leaves((args, kwargs))):
            return func(*args, **kwargs)
        torch.overrides._push_mode(self)
        try:
            return _transparent(func)(*args, **kwargs)
        finally:
            torch.overrides._pop_mode()

    def _softmax(self, func: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
        """softmax/log_softmax of a float16 tensor asked for a float32 result (Hugging Face's eager
        attention: ``softmax(w, dim=-1, dtype=torch.float32)``): CUDA's ``half_to_float`` kernel
        (:class:`_HalfToFloatSoftmax`); anything else as on the CPU (under autocast, see
        :func:`_autocast_kernel`)."""
        names = ("input", "dim", "_stacklevel", "dtype") if func in (F.softmax, F.log_softmax) else \
            ("input", "dim", "dtype")
        a = dict(zip(names, args))
        a.update(kwargs)
        x, dim = a.get("input", a.get("self")), a.get("dim")
        if isinstance(x, torch.Tensor) and not x.is_nested and x.dtype == torch.float16 and \
                a.get("dtype") == torch.float32 and isinstance(dim, int) and not _own_torch_function(x):
            return _HalfToFloatSoftmax.apply(x, dim, _SOFTMAXES[func], self.ledger)
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
        # enable_gqa with as many key/value heads as query heads is a plain call on CUDA (every kernel's
        # check_batch_size_and_num_heads_dense passes equal heads; the math path repeats nothing):
        # Hugging Face's sdpa_attention_forward passes it whenever there is no mask.
        if (not all(isinstance(t, torch.Tensor) for t in (q, k, v)) or q.dim() != 4
                or k.dim() != 4 or v.dim() != 4 or q.is_nested or q.shape[1] != k.shape[1] or q.shape[1] != v.shape[1]
                or (mask is not None and not isinstance(mask, torch.Tensor))):
            return _SDPA(*args, **kwargs)
        if torch.is_autocast_enabled("cpu"):
            # CUDA's autocast (scaled_dot_product_attention: lower_precision_fp) casts the inputs,
            # then runs the kernel it picks for their dtype with autocast off.
            low = torch.get_autocast_dtype("cpu")
            q, k, v = (_cached_cast(low, t) for t in (q, k, v))
            mask = _cached_cast(low, mask)
            with torch._C._DisableAutocast():
                return self._attention(q, k, v, mask, a)
        return self._attention(q, k, v, mask, a)

    def _attention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: Optional[torch.Tensor],
                   a: dict) -> Any:
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

    # ------------------------------------------------------------------ the fast paths of nn's attention

    def _native_mha(self, args: tuple, kwargs: dict) -> Any:
        """``native_multi_head_attention_cuda`` (aten/src/ATen/native/transformers/cuda/attention.cu):
        self-attention with a head dim that is a multiple of 8, no weights asked for and no mask,
        where the CUDA dispatcher picks flash, memory-efficient or cuDNN attention, runs
        ``linear`` -> ``chunk`` -> ``scaled_dot_product_attention`` -> ``linear``; anything else takes
        the older kernels (``qkv_projection``, ``_transform_bias_rescale_qkv``, a (b, h, t, t) score
        matrix, ``masked_softmax``, ``bmm_nn`` into q's storage, ``transform0213_gemm_nt_bias``)."""
        names = ("query", "key", "value", "embed_dim", "num_head", "qkv_weight", "qkv_bias", "proj_weight",
                 "proj_bias", "mask", "need_weights", "average_attn_weights", "mask_type")
        a = dict(zip(names, args))
        a.update(kwargs)
        query, key, value = a["query"], a["key"], a["value"]
        if not all(isinstance(t, torch.Tensor) and not t.is_nested and t.dim() == 3 for t in (query, key, value)):
            return _NATIVE_MHA(*args, **kwargs)  # nested tensors: as on the CPU (module docs)
        if self.workspace is None:
            self._cublas_workspace()
        d, nh = int(a["embed_dim"]), int(a["num_head"])
        dh = d // nh
        w, bias, pw, pb = a["qkv_weight"], a["qkv_bias"], a["proj_weight"], a["proj_bias"]
        mask, need_weights = a.get("mask"), bool(a.get("need_weights", True))
        b, t = query.shape[0], query.shape[1]
        if query is key and key is value and dh % 8 == 0 and not need_weights and mask is None:
            grad = torch.is_grad_enabled() and query.requires_grad
            call = AttentionCall(b, nh, t, t, dh, dh, query.dtype, requires_grad=grad)
            try:
                backend = sdpa_backend(self.cc, call)
            except RuntimeError:
                backend = "error"
            if backend in ("flash", "efficient", "cudnn"):
                x = F.linear(query, w, bias)
                q, k, v = (c.view(b, -1, nh, dh).transpose(1, 2) for c in x.chunk(3, -1))
                y = self._sdpa((q, k, v), {})
                past = y.transpose(1, 2).reshape(b, -1, d)
                return F.linear(past, pw, pb), None
        with self.ledger.paused():  # the values; the books get the CUDA kernels' tensors below
            out_val, weights_val = _NATIVE_MHA(*args, **kwargs)
        sk = key.shape[1]
        if query is key and key is value:  # qkv_projection: one gemm, else projections and a cat
            qkv = torch.empty((b, t, 3 * d), dtype=query.dtype)
        else:
            parts = [torch.empty((b, t, d), dtype=query.dtype), torch.empty((b, sk, 2 * d), dtype=query.dtype)]
            qkv = torch.empty((b, t, 3 * d), dtype=query.dtype)
            del parts
        q_k_v = torch.empty((3, b, nh, t, dh), dtype=query.dtype)  # _transform_bias_rescale_qkv
        del qkv
        qkt = torch.empty((b, nh, t, sk), dtype=query.dtype)  # bmm_nt
        if mask is not None:  # masked_softmax: the mask as bool, and a new output
            bool_mask = mask if mask.dtype == torch.bool else torch.empty(mask.shape, dtype=torch.bool)
            qkt = torch.empty_like(qkt)
            del bool_mask
        # bmm_nn writes the context into q's storage
        if not need_weights:
            del qkt
        a_0213 = torch.empty((b, t, nh, dh), dtype=query.dtype)  # transform0213_gemm_nt_bias
        proj = torch.empty((b * t, d), dtype=query.dtype)
        del a_0213, q_k_v
        proj = proj.view(b, t, d)
        proj.copy_(out_val)
        weights = None
        if need_weights:
            weights = torch.empty(weights_val.shape, dtype=weights_val.dtype) if bool(
                a.get("average_attn_weights", True)) else qkt
            weights.copy_(weights_val)
        del out_val, weights_val
        return proj, weights

    def _encoder_layer(self, args: tuple, kwargs: dict) -> Any:
        """``transformer_encoder_layer_forward`` (aten/src/ATen/native/transformers/transformer.cpp),
        operator by operator: the same on every device but for ``native_multi_head_attention``
        (:meth:`_native_mha`); the residuals are added in place and the feed-forward block is
        ``_addmm_activation`` (the activation fused) then ``addmm``."""
        names = ("src", "embed_dim", "num_heads", "qkv_weight", "qkv_bias", "proj_weight", "proj_bias", "use_gelu",
                 "norm_first", "layer_norm_eps", "norm_weight_1", "norm_bias_1", "norm_weight_2", "norm_bias_2",
                 "ffn_weight_1", "ffn_bias_1", "ffn_weight_2", "ffn_bias_2", "mask", "mask_type")
        a = dict(zip(names, args))
        a.update(kwargs)
        src = a["src"]
        if not isinstance(src, torch.Tensor) or src.is_nested or src.numel() == 0 or src.dim() != 3:
            return _ENCODER_LAYER(*args, **kwargs)
        if self.workspace is None:
            self._cublas_workspace()
        d, eps, norm_first = int(a["embed_dim"]), float(a["layer_norm_eps"]), bool(a["norm_first"])

        def norm(x: torch.Tensor, i: int) -> torch.Tensor:
            return F.layer_norm(x, (d,), a[f"norm_weight_{i}"], a[f"norm_bias_{i}"], eps)

        x = norm(src, 1) if norm_first else src
        x = self._native_mha((x, x, x, d, a["num_heads"], a["qkv_weight"], a["qkv_bias"], a["proj_weight"],
                              a["proj_bias"], a.get("mask"), False, True, a.get("mask_type")), {})[0]
        x.add_(src)
        if not norm_first:
            x = norm(x, 1)
        pre_ffn = x
        if norm_first:
            x = norm(x, 2)
        b, t = x.shape[0], x.shape[1]
        h = torch._addmm_activation(a["ffn_bias_1"], x.reshape(b * t, d), a["ffn_weight_1"].t(),
                                    use_gelu=bool(a["use_gelu"]))
        x = torch.addmm(a["ffn_bias_2"], h, a["ffn_weight_2"].t()).view(b, t, -1)
        del h
        x.add_(pre_ffn)
        del pre_ffn
        if not norm_first:
            x = norm(x, 2)
        return x


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


class _HalfToFloatSoftmax(torch.autograd.Function):
    """``at::_softmax``/``at::_log_softmax`` with ``half_to_float``: what CUDA runs for a float16
    input asked for a float32 result (``softmax``/``log_softmax(input, dim, dtype)`` in
    aten/src/ATen/native/SoftMax.cpp: ``input_.is_cuda() && Half && dtype == Float``; autocast's
    ``fp32_set_opt_dtype`` asks exactly that). The float32 output is the only allocation (no float32
    copy of the input, which every other case makes: ``input_.toType(dtype)``), saved for backward,
    whose ``_softmax_backward_data`` with ``input_dtype`` Half returns a float16 gradient. The CPU
    has no such kernel ("softmax with half to float conversion is not supported on CPU"): the values
    come from a float32 softmax with the ledger paused."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, dim: int, log: bool, ledger: Ledger) -> torch.Tensor:
        with ledger.paused(), torch._C.DisableTorchFunction():
            val = (torch.log_softmax if log else torch.softmax)(x.float(), dim)
        if not x.is_contiguous():  # host_softmax: input_.contiguous()
            scratch = torch.empty(x.shape, dtype=x.dtype)
            del scratch
        out = torch.empty(x.shape, dtype=torch.float32)
        out.copy_(val)
        del val
        ctx.dim, ctx.log, ctx.ledger = dim, log, ledger
        ctx.save_for_backward(out)
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Any:
        (out,) = ctx.saved_tensors
        with ctx.ledger.paused(), torch._C.DisableTorchFunction():
            g = grad.float()
            val = g - out.exp() * g.sum(ctx.dim, keepdim=True) if ctx.log else \
                out * (g - (g * out).sum(ctx.dim, keepdim=True))
        if not grad.is_contiguous():  # grad_.contiguous()
            scratch = torch.empty(grad.shape, dtype=grad.dtype)
            del scratch
        gi = torch.empty(out.shape, dtype=torch.float16)
        gi.copy_(val)
        del val
        return gi, None, None, None


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
        # The values, on the CPU's kernel: torch function off, since backward now runs under
        # CudaKernels (CudaKernels._backward), which would reroute this call to this class again.
        with ledger.paused(), torch._C.DisableTorchFunction():
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
