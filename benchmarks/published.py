"""Published GPU memory measurements that vramlab can re-run on fake tensors, with their setups.

Each :class:`Row` is one REAL measurement someone published (the page, the quote, the
counter it read, the card), and :meth:`Row.setup` builds what ``vramlab.estimate`` needs to
run the same training step: ``build_model``, ``make_batch``, ``loss_fn``, the optimizer and
the checkpointing, with the models built from their published configs typed in here (no
weights are downloaded; nothing touches the network). :func:`run_row` runs the estimate and
returns the figure to compare with the published one:

- ``counter="nvml_used_after"`` (HF "GPU memory occupied", read with NVML after
  ``trainer.train()`` returned, nothing having called ``empty_cache``): vramlab's
  ``peak_reserved`` plus the CUDA context the same page measured (1343 MiB);
- ``counter="max_allocated"`` (litgpt's ``torch.cuda.max_memory_allocated() / 1e9``) and
  ``counter="memory_summary_peak"`` (Lightning's ``torch.cuda.memory_summary()``, whose row the
  docs do not name; read as the allocated peak): vramlab's ``peak``.

The rows (ids as in the research notes these were compiled from):

- B1-B7: BERT-large, HF Trainer, one V100-16GB. Source: Hugging Face Transformers docs,
  "Efficient Training on a Single GPU" (v4.20.0), file docs/source/en/perf_train_gpu_one.mdx.
- L1-L3: phi-1.5 LoRA (r=8 on the query and value projections), litgpt ``finetune/lora.py`` at
  commit 8641822, bf16-true, one A100-40GB. Source: litgpt tutorials/resource-tables.md.
- F1, F3, F4: the Lightning demo Transformer (~1.0 B parameters), 2x A100-40GB, DDP and FSDP.
  Source: Lightning Fabric docs, "Training models with billions of parameters (FSDP)".

What each setup copies from its source, and where it had to differ, is in the row's ``notes``.
LoRA: ``peft`` is not installed here, so LoRA is this file's own small wrapper,
:class:`LitgptLoRAQKV`, written after litgpt's ``LoRAQKVLinear`` at 8641822 (the implementation
that was measured: one dropout, a grouped conv1d and a zero-padded index_copy), not PEFT's.

All sizes are in bytes.
"""

from __future__ import annotations

import math
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

from vramlab.sim.optimizers import BnbLayout  # noqa: E402

MiB = 2**20
GiB = 2**30

#: The CUDA context the HF page measured on its V100 (CUDA 11.2, driver 460.91.03):
#: ``torch.ones((1, 1)).to("cuda")`` then NVML "GPU memory occupied: 1343 MB" (MB = MiB: the
#: page prints ``info.used // 1024**2``).
HF_V100_CONTEXT = 1343 * MiB

HF_PAGE = "https://huggingface.co/docs/transformers/v4.20.0/en/perf_train_gpu_one"
LITGPT_TABLE = "https://github.com/Lightning-AI/litgpt/blob/8641822/tutorials/resource-tables.md"
LITGPT_TABLE_NOTE = ("litgpt tutorials/resource-tables.md: 'Last updated: 10/20/2023 - LitGPT version: commit 8641822 - "
                     "Hardware: NVIDIA A100-SXM4-40GB - PyTorch 2.1.0+cu121'; 'All experiments were run using 16-bit "
                     "brain floating point precision (--precision bf16-true)'; 'phi1.5: 1044 tokens'")
FABRIC_FSDP = "https://lightning.ai/docs/fabric/stable/advanced/model_parallel/fsdp.html"


# --------------------------------------------------------------------------- rows


@dataclass
class Setup:
    """What ``vramlab.estimate`` gets for a row (its other arguments come from the :class:`Row`)."""

    build_model: Callable[[], nn.Module]
    make_batch: Callable[[int], Any]
    loss_fn: Optional[Callable[..., Any]]
    optimizer: Any
    checkpoint: Any = None
    strategy: Any = None
    #: accelerate's ``estimate-memory`` loads ``AutoModel.from_config`` (the base model, no task
    #: head): the module whose parameters and buffers its formula takes.
    accelerate_model: Optional[Callable[[], nn.Module]] = None


@dataclass
class Row:
    """One published measurement."""

    id: str
    model: str
    source: str  # URL
    quote: str  # the published words the measured figure comes from
    batch: int  # micro-batch per device (what is live at once)
    seq: int
    precision: str  # vramlab's (Lightning's) name
    optimizer: str  # as the source ran it
    checkpointing: str  # "no" or what was checkpointed
    strategy: str  # "single" or the data-parallel strategy
    world_size: int
    card: str  # vramlab preset
    measured: int  # bytes, converted from the published figure
    measured_text: str  # the figure as published
    counter: str  # "nvml_used_after" | "max_allocated" | "memory_summary_peak"
    setup: Callable[[], Setup]
    notes: str = ""
    grad_accum: int = 1
    estimate_kwargs: dict[str, Any] = field(default_factory=dict)

    @property
    def compared_as(self) -> str:
        """What vramlab figure is compared with the measured one."""
        if self.counter == "nvml_used_after":
            return "peak_reserved + 1343 MiB context"
        return "peak (allocated)"


# --------------------------------------------------------------------------- HF Trainer (B rows)


def bert_large_config(**kw: Any) -> Any:
    """bert-large-uncased's config.json, typed in (https://huggingface.co/bert-large-uncased/blob/main/config.json):
    hidden_size 1024, num_hidden_layers 24, num_attention_heads 16, intermediate_size 4096,
    vocab_size 30522, max_position_embeddings 512, type_vocab_size 2, hidden_act gelu,
    hidden_dropout_prob 0.1, attention_probs_dropout_prob 0.1, layer_norm_eps 1e-12; 2 labels
    (the page's ``AutoModelForSequenceClassification``, num_labels default 2): 335,143,938
    parameters, as the page's model has.

    Attention is the ``eager`` one: transformers 4.20 (the page's) had no SDPA path for BERT; it
    computed ``softmax(QK^T/sqrt(d) + mask)``, dropout, ``@ V``, which is what ``eager`` does."""
    from transformers import BertConfig

    cfg = BertConfig(vocab_size=30522, hidden_size=1024, num_hidden_layers=24, num_attention_heads=16,
                     intermediate_size=4096, hidden_act="gelu", hidden_dropout_prob=0.1,
                     attention_probs_dropout_prob=0.1, max_position_embeddings=512, type_vocab_size=2,
                     layer_norm_eps=1e-12, num_labels=2, **kw)
    cfg._attn_implementation = "eager"
    return cfg


class TrainerOptimizerMixin:
    """What the HF Trainer of 4.20 does around ``optimizer.step()`` that holds memory, folded into
    the optimizer that vramlab's step loop calls:

    - ``nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm=1.0)`` before the step, as
      torch 1.12 wrote it (one norm per gradient, stacked, one in-place multiply per gradient);
    - ``model.zero_grad()`` after it, which in torch 1.x (``set_to_none=False`` by default until
      torch 2.0) zeroes the gradients in place and KEEPS them: the next step's forward runs with
      every gradient allocated. vramlab's loop calls ``zero_grad(set_to_none=True)``; here it is
      taken as the Trainer's.
    """

    max_grad_norm = 1.0

    def zero_grad(self, set_to_none: bool = True) -> None:  # set_to_none ignored: the Trainer's semantics
        super().zero_grad(set_to_none=False)  # type: ignore[misc]

    def clipped(self) -> Any:
        """Clip the gradients as the Trainer does before the step, then yield ``(group, p)`` for each
        parameter with a gradient: the loop both optimizers' ``step`` run."""
        self.clip()
        for group in self.param_groups:  # type: ignore[attr-defined]
            for p in group["params"]:
                if p.grad is not None:
                    yield group, p

    @torch.no_grad()
    def clip(self) -> None:
        grads = [p.grad for g in self.param_groups for p in g["params"] if p.grad is not None]  # type: ignore[attr-defined]
        if not grads:
            return
        total = torch.norm(torch.stack([torch.norm(g.detach(), 2.0) for g in grads]), 2.0)
        coef = torch.clamp(self.max_grad_norm / (total + 1e-6), max=1.0)
        for g in grads:
            g.detach().mul_(coef)


class HFAdamW(TrainerOptimizerMixin, torch.optim.Optimizer):
    """``transformers.AdamW`` as of 4.20 (the Trainer's default ``optim="adamw_hf"`` then): a
    per-parameter Python loop, fp32 ``exp_avg``/``exp_avg_sq`` created at the first step, one
    temporary ``denom = exp_avg_sq.sqrt().add_(eps)`` per parameter. Copied from
    transformers/optimization.py (v4.20.0); transformers 5 no longer ships it."""

    def __init__(self, params: Any, lr: float = 5e-5, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0.0, correct_bias: bool = True) -> None:
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                                      correct_bias=correct_bias))

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        for group, p in self.clipped():
            grad = p.grad
            state = self.state[p]
            if len(state) == 0:
                state["step"] = 0
                state["exp_avg"] = torch.zeros_like(p)
                state["exp_avg_sq"] = torch.zeros_like(p)
            exp_avg, exp_avg_sq = state["exp_avg"], state["exp_avg_sq"]
            beta1, beta2 = group["betas"]
            state["step"] += 1
            exp_avg.mul_(beta1).add_(grad, alpha=1.0 - beta1)
            exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1.0 - beta2)
            denom = exp_avg_sq.sqrt().add_(group["eps"])
            step_size = group["lr"]
            if group["correct_bias"]:
                bias_correction1 = 1.0 - beta1 ** state["step"]
                bias_correction2 = 1.0 - beta2 ** state["step"]
                step_size = step_size * math.sqrt(bias_correction2) / bias_correction1
            p.addcdiv_(exp_avg, denom, value=-step_size)
            if group["weight_decay"] > 0.0:
                p.add_(p, alpha=-group["lr"] * group["weight_decay"])
        return None


class HFAdafactor(TrainerOptimizerMixin, torch.optim.Optimizer):
    """``optim="adafactor"`` in the Trainer of 4.20: ``transformers.Adafactor(params,
    scale_parameter=False, relative_step=False, lr=5e-5)``, copied from transformers/optimization.py
    (v4.20.0; the same class ships in transformers 5): per parameter, no first moment
    (``beta1=None``), a factored second moment (a row and a column vector) per matrix and a full
    one per vector, created at the first step; per parameter, ``update = grad**2 + eps`` and the
    ``_approx_sq_grad`` product (full size), then ``p.add_(-update)``.

    Not ``torch.optim.Adafactor``: vramlab cannot estimate that one (its step reads
    ``step_t.item()``; ``estimate`` raises ``StepNeedsValuesError`` with any ``foreach``), and it is
    not what the Trainer ran."""

    def __init__(self, params: Any, lr: float = 5e-5, eps: tuple[float, float] = (1e-30, 1e-3),
                 clip_threshold: float = 1.0, decay_rate: float = -0.8, beta1: Optional[float] = None,
                 weight_decay: float = 0.0) -> None:
        super().__init__(params, dict(lr=lr, eps=eps, clip_threshold=clip_threshold, decay_rate=decay_rate,
                                      beta1=beta1, weight_decay=weight_decay))

    @staticmethod
    def _rms(tensor: torch.Tensor) -> torch.Tensor:
        return tensor.norm(2) / (tensor.numel() ** 0.5)

    @staticmethod
    def _approx_sq_grad(row: torch.Tensor, col: torch.Tensor) -> torch.Tensor:
        r_factor = (row / row.mean(dim=-1, keepdim=True)).rsqrt_().unsqueeze(-1)
        c_factor = col.unsqueeze(-2).rsqrt()
        return torch.mul(r_factor, c_factor)

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        for group, p in self.clipped():
            grad = p.grad
            if grad.dtype in {torch.float16, torch.bfloat16}:
                grad = grad.float()
            state = self.state[p]
            shape = grad.shape
            factored = len(shape) >= 2
            if len(state) == 0:
                state["step"] = 0
                if group["beta1"] is not None:
                    state["exp_avg"] = torch.zeros_like(grad)
                if factored:
                    state["exp_avg_sq_row"] = torch.zeros(shape[:-1]).to(grad)
                    state["exp_avg_sq_col"] = torch.zeros(shape[:-2] + shape[-1:]).to(grad)
                else:
                    state["exp_avg_sq"] = torch.zeros_like(grad)
                state["RMS"] = 0
            p_fp32 = p.float() if p.dtype in {torch.float16, torch.bfloat16} else p
            state["step"] += 1
            state["RMS"] = self._rms(p_fp32)
            lr = group["lr"]  # relative_step=False, scale_parameter=False
            beta2t = 1.0 - math.pow(state["step"], group["decay_rate"])
            update = (grad**2) + group["eps"][0]
            if factored:
                row, col = state["exp_avg_sq_row"], state["exp_avg_sq_col"]
                row.mul_(beta2t).add_(update.mean(dim=-1), alpha=1.0 - beta2t)
                col.mul_(beta2t).add_(update.mean(dim=-2), alpha=1.0 - beta2t)
                update = self._approx_sq_grad(row, col)
                update.mul_(grad)
            else:
                exp_avg_sq = state["exp_avg_sq"]
                exp_avg_sq.mul_(beta2t).add_(update, alpha=1.0 - beta2t)
                update = exp_avg_sq.rsqrt().mul_(grad)
            update.div_((self._rms(update) / group["clip_threshold"]).clamp_(min=1.0))
            update.mul_(lr)
            if group["beta1"] is not None:
                exp_avg = state["exp_avg"]
                exp_avg.mul_(group["beta1"]).add_(update, alpha=1 - group["beta1"])
                update = exp_avg
            if group["weight_decay"] != 0:
                p_fp32.add_(p_fp32, alpha=-group["weight_decay"] * lr)
            p_fp32.add_(-update)
            if p.dtype in {torch.float16, torch.bfloat16}:
                p.copy_(p_fp32)
        return None


def _bert_setup(optimizer: Callable[[Any], torch.optim.Optimizer], checkpoint: bool) -> Callable[[], Setup]:
    def make() -> Setup:
        from transformers import BertForSequenceClassification, BertModel

        cfg = bert_large_config()

        def batch(b: int) -> dict[str, torch.Tensor]:
            # the page's dummy data: input_ids randint(100, 30000, (512, 512)), labels randint(0, 1): all 0;
            # no attention_mask (BERT builds one of ones)
            return {"input_ids": torch.randint(100, 30000, (b, 512)), "labels": torch.zeros(b, dtype=torch.long)}

        return Setup(build_model=lambda: BertForSequenceClassification(cfg), make_batch=batch, loss_fn=None,
                     optimizer=optimizer, checkpoint="layers" if checkpoint else None,
                     accelerate_model=lambda: BertModel(bert_large_config()))

    return make


def _hf_row(id: str, batch: int, ga: int, precision: str, opt_name: str, opt: Callable[[Any], Any], ckpt: bool,
            measured_mb: int, quote: str) -> Row:
    return Row(
        id=id, model="bert-large-uncased + 2-label head (BertForSequenceClassification), HF Trainer 4.20",
        source=HF_PAGE, quote=quote, batch=batch, seq=512, precision=precision, optimizer=opt_name,
        checkpointing="every BertLayer (gradient_checkpointing=True)" if ckpt else "no",
        strategy="single", world_size=1, card="V100-16GB", measured=measured_mb * MiB, measured_text=f"{measured_mb} MB",
        counter="nvml_used_after", setup=_bert_setup(opt, ckpt), grad_accum=ga,
        notes=("Trainer semantics modelled: model.zero_grad() keeps zeroed gradients (torch 1.x), clip_grad_norm_ "
               "before the step; GA: only the micro-batch is live at once, and the gradients persist across "
               "micro-steps (as they do across steps). Context 1343 MiB measured on the same page."))


def _adamw(params: Any) -> torch.optim.Optimizer:
    return HFAdamW(params)


def _adafactor(params: Any) -> torch.optim.Optimizer:
    return HFAdafactor(params)


class HFAdam8bit(TrainerOptimizerMixin, BnbLayout):
    """The page's ``bnb.optim.Adam8bit(optimizer_grouped_parameters, betas=..., eps=..., lr=...)``,
    passed to the Trainer as ``optimizers=(adam_bnb_optim, None)``: bitsandbytes' 8-bit two-state
    layout (vramlab.sim.optimizers.BnbLayout) under the Trainer's clip and ``zero_grad``. The page's
    weight-decay groups change no byte. bitsandbytes of 2022 used blocks of 2048 elements per
    ``absmax`` where 0.50 uses 256: under 0.2% of the state's bytes."""

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        self.clip()
        return BnbLayout.step(self, closure)


def _adam8bit(params: Any) -> torch.optim.Optimizer:
    return HFAdam8bit(params)


HF_ROWS = [
    _hf_row("B1", 4, 1, "32-true", "AdamW (adamw_hf: transformers.AdamW)", _adamw, False, 14949,
            "TrainingArguments(per_device_train_batch_size=4, **default_args) -> 'GPU memory occupied: 14949 MB.'"),
    _hf_row("B2", 1, 4, "32-true", "AdamW (adamw_hf)", _adamw, False, 8681,
            "per_device_train_batch_size=1, gradient_accumulation_steps=4 -> 'GPU memory occupied: 8681 MB.'"),
    _hf_row("B3", 1, 4, "32-true", "AdamW (adamw_hf)", _adamw, True, 6775,
            "per_device_train_batch_size=1, gradient_accumulation_steps=4, gradient_checkpointing=True -> "
            "'GPU memory occupied: 6775 MB.'"),
    _hf_row("B4", 4, 1, "16-mixed", "AdamW (adamw_hf)", _adamw, False, 13939,
            "TrainingArguments(per_device_train_batch_size=4, fp16=True, **default_args) -> "
            "'GPU memory occupied: 13939 MB.'"),
    _hf_row("B5", 1, 4, "16-mixed", "AdamW (adamw_hf)", _adamw, True, 7275,
            "per_device_train_batch_size=1, gradient_accumulation_steps=4, gradient_checkpointing=True, fp16=True -> "
            "'GPU memory occupied: 7275 MB.'"),
    _hf_row("B6", 4, 1, "32-true", "Adafactor (optim='adafactor': transformers.Adafactor)", _adafactor,
            False, 12295, "TrainingArguments(per_device_train_batch_size=4, optim='adafactor', **default_args) -> "
            "'GPU memory occupied: 12295 MB.'"),
    _hf_row("B7", 1, 4, "16-mixed", "Adafactor (transformers.Adafactor)", _adafactor, True, 4847,
            "per_device_train_batch_size=1, gradient_accumulation_steps=4, gradient_checkpointing=True, fp16=True, "
            "optim='adafactor' -> 'GPU memory occupied: 4847 MB.'"),
    _hf_row("B8", 4, 1, "32-true", "bitsandbytes Adam8bit (bnb.optim.Adam8bit, passed to the Trainer)", _adam8bit,
            False, 13085, "TrainingArguments(per_device_train_batch_size=4, **default_args) with "
            "optimizers=(adam_bnb_optim, None), adam_bnb_optim = bnb.optim.Adam8bit(...) -> "
            "'GPU memory occupied: 13085 MB.'"),
    _hf_row("B9", 1, 4, "16-mixed", "bitsandbytes Adam8bit (bnb.optim.Adam8bit)", _adam8bit, True, 5363,
            "per_device_train_batch_size=1, gradient_accumulation_steps=4, gradient_checkpointing=True, fp16=True, "
            "with the same adam_bnb_optim -> 'GPU memory occupied: 5363 MB.'"),
]


# --------------------------------------------------------------------------- litgpt LoRA (L rows)


def phi15_config() -> Any:
    """microsoft/phi-1_5's config.json, typed in (https://huggingface.co/microsoft/phi-1_5/blob/main/config.json;
    the same values as litgpt's own phi-1_5 entry in lit_gpt/config.py at 8641822, which cites that file):
    hidden_size 2048, num_hidden_layers 24, num_attention_heads 32 (head size 64),
    intermediate_size 8192, vocab_size 51200 (litgpt: vocab_size 50257, padded_vocab_size 51200),
    partial_rotary_factor 0.5 (litgpt: rotary_percentage 0.5), layer_norm_eps 1e-5, rope_theta
    10000, max_position_embeddings 2048 (litgpt block_size 2048), no dropout (resid_pdrop,
    embd_pdrop, attention_dropout 0), untied lm_head with bias (litgpt lm_head_bias=True),
    parallel attention/MLP sharing one LayerNorm (litgpt shared_attention_norm=True); 1,418,270,720
    parameters.

    One deliberate difference: config.json's ``hidden_act`` is ``gelu_new``, which transformers
    implements as a Python expression (``0.5*x*(1+tanh(...x**3...))``) whose autograd keeps four
    full-size tensors per MLP; litgpt, which was measured, calls ``F.gelu(x, approximate="tanh")``
    (``gelu_approximate="tanh"``: the same function, one saved tensor). ``gelu_pytorch_tanh`` is
    that call."""
    from transformers import PhiConfig

    cfg = PhiConfig(vocab_size=51200, hidden_size=2048, intermediate_size=8192, num_hidden_layers=24,
                    num_attention_heads=32, num_key_value_heads=32, resid_pdrop=0.0, embd_pdrop=0.0,
                    attention_dropout=0.0, hidden_act="gelu_pytorch_tanh", max_position_embeddings=2048,
                    layer_norm_eps=1e-5, tie_word_embeddings=False, qk_layernorm=False,
                    rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5})
    cfg._attn_implementation = "sdpa"  # litgpt: F.scaled_dot_product_attention(q, k, v, is_causal=True)
    return cfg


class LitgptLoRAQKV(nn.Module):
    """The LoRA branch of litgpt's ``LoRAQKVLinear`` (lit_gpt/lora.py at 8641822) for
    ``enable_lora=(True, False, True)`` (query and value, not key) on a multi-head attention of
    width ``n_embd``, computed as litgpt computes it on its fused q/k/v projection::

        after_A = F.linear(lora_dropout(x), lora_A)                     # lora_A: (2r, n_embd)
        after_B = conv1d(after_A.T, lora_B.unsqueeze(-1), groups=2).T  # lora_B: (2 n_embd, r)
        lora = zero_pad(after_B) * alpha / r                            # (B, T, 3 n_embd), zeros for k

    ``zero_pad`` as litgpt writes it: ``new_zeros`` of the fused width, then
    ``index_copy(1, lora_ind, x.reshape(...))`` (whose backward keeps that reshaped source, a
    (B*T, 2 n_embd) copy, for ``expand_as``). Transformers' Phi has separate q/k/v projections:
    the query's projection computes ``lora`` once and adds its first third, the value's (the last
    of the three calls) adds its last third and drops it. ``lora_A`` kaiming-uniform, ``lora_B``
    zeros, as litgpt initialises them; 65,536 trainable parameters per layer for phi-1.5."""

    def __init__(self, n_embd: int, r: int, alpha: float, dropout: float, device: Any = None) -> None:
        super().__init__()
        self.n_embd = n_embd
        self.lora_A = nn.Parameter(torch.empty(2 * r, n_embd, device=device))
        self.lora_B = nn.Parameter(torch.empty(2 * n_embd, r, device=device))
        self.scaling = alpha / r
        self.lora_dropout = nn.Dropout(p=dropout)
        self.lora_ind = [*range(0, n_embd), *range(2 * n_embd, 3 * n_embd)]
        self._held: Optional[tuple[torch.Tensor, torch.Tensor]] = None

    def reset_parameters(self) -> None:
        nn.init.kaiming_uniform_(self.lora_A, a=math.sqrt(5))
        nn.init.zeros_(self.lora_B)

    def zero_pad(self, x: torch.Tensor) -> torch.Tensor:
        x = x.transpose(0, 1)
        result = x.new_zeros((*x.shape[:-1], 3 * self.n_embd))
        result = result.view(-1, 3 * self.n_embd)
        result = result.index_copy(1, torch.tensor(self.lora_ind, device=result.device),
                                   x.reshape(-1, 2 * self.n_embd))
        return result.view((*x.shape[:-1], 3 * self.n_embd)).transpose(0, 1)

    def lora(self, x: torch.Tensor) -> torch.Tensor:
        after_A = F.linear(self.lora_dropout(x), self.lora_A)
        after_B = F.conv1d(after_A.transpose(-2, -1), self.lora_B.unsqueeze(-1), groups=2).transpose(-2, -1)
        return self.zero_pad(after_B) * self.scaling

    def take(self, x: torch.Tensor, part: int, last: bool) -> torch.Tensor:
        held = self._held
        if held is None or held[0] is not x:
            held = (x, self.lora(x))
        self._held = None if last else held
        return held[1][..., part * self.n_embd:(part + 1) * self.n_embd]


class LoRAPart(nn.Module):
    """A frozen q or v projection plus its third of :class:`LitgptLoRAQKV`'s output
    (litgpt: ``pretrained + lora`` on the fused projection)."""

    def __init__(self, linear: nn.Linear, qkv: LitgptLoRAQKV, part: int, last: bool) -> None:
        super().__init__()
        self.linear = linear
        self.qkv = [qkv]  # not a child: the attention owns it (its parameters counted once)
        self.part = part
        self.last = last

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x) + self.qkv[0].take(x, self.part, self.last)


def add_lora(model: nn.Module, r: int = 8, alpha: float = 16, dropout: float = 0.05) -> nn.Module:
    """litgpt's defaults in finetune/lora.py at 8641822 (``lora_r = 8, lora_alpha = 16, lora_dropout = 0.05,
    lora_query = True, lora_key = False, lora_value = True``, the rest off): LoRA on every attention
    layer's q and v projections (:class:`LitgptLoRAQKV`), then ``mark_only_lora_as_trainable``
    (every other parameter frozen). Phi-1.5: 1,572,864 trainable parameters, as litgpt printed."""
    for p in model.parameters():
        p.requires_grad_(False)
    for m in list(model.modules()):
        if hasattr(m, "q_proj") and hasattr(m, "v_proj") and isinstance(m.q_proj, nn.Linear):
            qkv = LitgptLoRAQKV(m.q_proj.in_features, r, alpha, dropout, device=m.q_proj.weight.device)
            m.lora_qkv = qkv
            m.q_proj = LoRAPart(m.q_proj, qkv, 0, last=False)
            m.v_proj = LoRAPart(m.v_proj, qkv, 2, last=True)
    return model


class LitgptChunkedLoss:
    """litgpt's loss at 8641822: ``model(input_ids, lm_head_chunk_size=128)`` gives the logits in
    chunks of 128 positions, ``logits[-1] = logits[-1][..., :-1, :]``, and
    ``chunked_cross_entropy(logits, targets[..., 1:])``: one ``cross_entropy(reduction="none",
    ignore_index=-1)`` per chunk in the model's dtype, concatenated, averaged.

    Two things around it hold memory and are copied here:

    - Lightning 2.1's ``_FabricModule.forward`` passes the model's output through
      ``HalfPrecision.convert_output`` (src/lightning/fabric/plugins/precision/half.py at tag 2.1.0:
      ``apply_to_collection(data, ..., dst_type=torch.get_default_dtype())``): under ``bf16-true``
      every logits chunk comes back as float32, and the cross-entropy runs on float32 chunks;
    - the training loop keeps ``logits`` in a local variable through ``fabric.backward(loss)`` and
      until the next iteration's forward returns; so does this object (it drops the previous
      step's logits when the next ones arrive).

    ``fabric_output_fp32=False`` leaves the logits in the model's dtype (for comparison)."""

    def __init__(self, chunk: int = 128, fabric_output_fp32: bool = True) -> None:
        self.chunk = chunk
        self.fabric_output_fp32 = fabric_output_fp32
        self.logits: Any = None

    def __call__(self, out: Any, targets: torch.Tensor) -> torch.Tensor:
        logits = out.logits if hasattr(out, "logits") else out
        chunks = list(logits.split(self.chunk, dim=1))
        del out, logits
        if self.fabric_output_fp32:
            chunks = [c.to(torch.float32) for c in chunks]
        self.logits = chunks
        chunks[-1] = chunks[-1][..., :-1, :]
        targets = targets[..., 1:]
        flat = [c.reshape(-1, c.size(-1)) for c in chunks]
        tflat = [t.reshape(-1) for t in targets.split(self.chunk, dim=1)]
        losses = [F.cross_entropy(c, t, ignore_index=-1, reduction="none") for c, t in zip(flat, tflat)]
        return torch.cat(losses).mean()


def _phi_setup(seq: int) -> Callable[[], Setup]:
    def make() -> Setup:
        from transformers import PhiForCausalLM, PhiModel

        cfg = phi15_config()

        def build() -> nn.Module:
            return add_lora(PhiForCausalLM(cfg))

        def batch(b: int) -> tuple[torch.Tensor, torch.Tensor]:
            # get_batch: the first iteration forces the longest sample (1044 tokens) into the batch and
            # pads the others to it (input pad 0, target pad -1)
            return torch.randint(0, 50257, (b, seq)), torch.randint(0, 50257, (b, seq))

        def adamw(params: Any) -> torch.optim.Optimizer:
            # torch.optim.AdamW(trainable_params, lr=3e-4, weight_decay=0.01); foreach left unset (CUDA's default:
            # foreach, which vramlab's CUDA kernels take)
            return torch.optim.AdamW(params, lr=3e-4, weight_decay=0.01)

        return Setup(build_model=build, make_batch=batch, loss_fn=LitgptChunkedLoss(), optimizer=adamw,
                     accelerate_model=lambda: PhiModel(phi15_config()))

    return make


def _litgpt_row(id: str, mbs: int, measured_gb: str, quote: str) -> Row:
    return Row(
        id=id, model="microsoft/phi-1_5 (1.42 B) + LoRA r=8 on q,v (litgpt finetune/lora.py @8641822)",
        source=LITGPT_TABLE, quote=f"{quote} ({LITGPT_TABLE_NOTE})", batch=mbs, seq=1044, precision="bf16-true",
        optimizer="torch.optim.AdamW(lr=3e-4, weight_decay=0.01) on the LoRA parameters", checkpointing="no",
        strategy="single", world_size=1, card="A100-40GB", measured=round(float(measured_gb) * 1e9),
        measured_text=f"{measured_gb} GB", counter="max_allocated", setup=_phi_setup(1044),
        notes=("Counter: fabric.print(f'Memory used: {torch.cuda.max_memory_allocated() / 1e9:.02f} GB') after "
               "training (decimal GB, rounded to 0.01). Peak batch: (micro-batch, 1044), forced at iteration 0. "
               "Model: transformers' PhiForCausalLM (not litgpt's GPT class) with this file's copy of litgpt's "
               "LoRAQKVLinear branch (LitgptLoRAQKV); gelu as litgpt's F.gelu(approximate='tanh'). Loss as "
               "litgpt's (LitgptChunkedLoss): 128-position chunks, converted to float32 by Lightning 2.1's "
               "HalfPrecision.convert_output, kept alive by the loop's `logits` variable. Not modelled: "
               "litgpt's own attention (fused qkv view/permute/reshape) and the validation and generation that "
               "ran before the first step (smaller: inference-mode)."))


def _litgpt_fsdp_row(id: str, mbs: int, measured_gb: str, quote: str) -> Row:
    from vramlab.sim.strategies import FSDP

    base = _litgpt_row(id, mbs, measured_gb, quote)
    setup = base.setup

    def make() -> Setup:
        s = setup()
        s.checkpoint, s.strategy = "layers", FSDP()  # units and checkpointing: every decoder layer (litgpt's Block)
        return s

    return Row(**{**base.__dict__, "setup": make, "checkpointing": "every Block (activation_checkpointing_policy={Block})",
                  "strategy": "fsdp FULL_SHARD, auto_wrap_policy={Block} (2 GPUs)", "world_size": 2,
                  "quote": f"{quote} (section 'Finetuning with LoRA on Multiple GPUs', 2 x A100; {LITGPT_TABLE_NOTE})",
                  "notes": ("litgpt finetune/lora.py @8641822 with devices=2: FSDPStrategy(auto_wrap_policy={Block}, "
                            "activation_checkpointing_policy={Block}, state_dict_type='full', limit_all_gathers=True, "
                            "cpu_offload=False), Lightning 2.1's FSDP1 (use_orig_params). vramlab runs FSDP2 "
                            "fully_shard on the same units, each checkpointed. Counter on rank 0, as L1-L3. "
                            + base.notes)})


LITGPT_ROWS = [
    _litgpt_row("L1", 1, "4.82", "| 1.3 B | phi-1.5 | None | 1 | 1,572,864 | 4.82 GB | 1.62 min |"),
    _litgpt_row("L2", 2, "6.76", "| 1.3 B | phi-1.5 | None | 2 | 1,572,864 | 6.76 GB | 1.65 min |"),
    _litgpt_row("L3", 4, "10.68", "| 1.3 B | phi-1.5 | None | 4 | 1,572,864 | 10.68 GB | 1.70 min |"),
    _litgpt_fsdp_row("L4", 1, "4.86", "| 1.3 B | phi-1.5 | None | 1 | 1,572,864 | 2 x A100 | 4.86 GB |"),
    _litgpt_fsdp_row("L5", 2, "5.05", "| 1.3 B | phi-1.5 | None | 2 | 1,572,864 | 2 x A100 | 5.05 GB |"),
    _litgpt_fsdp_row("L6", 4, "5.88", "| 1.3 B | phi-1.5 | None | 4 | 1,572,864 | 2 x A100 | 5.88 GB |"),
]


# --------------------------------------------------------------------------- Lightning demo Transformer (F rows)


class PositionalEncoding(nn.Module):
    """lightning.pytorch.demos.transformer.PositionalEncoding (Lightning 2.1), as written, its
    discarded ``x + self.pe[...]`` included; ``pe`` (5000 x 1 x ninp, float32) is made on the
    device at the first forward and kept as a plain attribute."""

    def __init__(self, dim: int, dropout: float = 0.1, max_len: int = 5000) -> None:
        super().__init__()
        self.dropout = nn.Dropout(p=dropout)
        self.dim = dim
        self.max_len = max_len
        self.pe: Optional[torch.Tensor] = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.pe is None:
            self.pe = self._init_pos_encoding(device=x.device)
        x + self.pe[: x.size(0), :]  # noqa: B018 - the demo's own (result unused) line
        return self.dropout(x)

    def _init_pos_encoding(self, device: torch.device) -> torch.Tensor:
        pe = torch.zeros(self.max_len, self.dim, device=device)
        position = torch.arange(0, self.max_len, dtype=torch.float, device=device).unsqueeze(1)
        div_term = torch.exp(torch.arange(0, self.dim, 2, device=device).float() * (-math.log(10000.0) / self.dim))
        pe[:, 0::2] = torch.sin(position * div_term)
        pe[:, 1::2] = torch.cos(position * div_term)
        return pe.unsqueeze(0).transpose(0, 1)


class DemoTransformer(nn.Module):
    """lightning.pytorch.demos.Transformer (Lightning 2.1, src/lightning/pytorch/demos/transformer.py),
    copied: an ``nn.Transformer`` (batch_first, dropout 0.2) between an embedding and a Linear to
    the vocabulary, log_softmax output (one change: ``tgt_is_causal=True`` passed, see forward). The docs build it with ``vocab_size=dataset.vocab_size``
    (WikiText2: 33,278), ``nlayers=32, nhid=4096, ninp=1024, nhead=64``: 1,008,763,390 parameters."""

    def __init__(self, vocab_size: int = 33278, ninp: int = 1024, nhead: int = 64, nhid: int = 4096,
                 nlayers: int = 32, dropout: float = 0.2) -> None:
        super().__init__()
        self.pos_encoder = PositionalEncoding(ninp, dropout)
        self.embedding = nn.Embedding(vocab_size, ninp)
        self.transformer = nn.Transformer(d_model=ninp, nhead=nhead, num_encoder_layers=nlayers,
                                          num_decoder_layers=nlayers, dim_feedforward=nhid, dropout=dropout,
                                          batch_first=True)
        self.decoder = nn.Linear(ninp, vocab_size)
        self.ninp = ninp
        self.vocab_size = vocab_size

    def forward(self, inputs: torch.Tensor, target: torch.Tensor, mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        _, t = inputs.shape
        if mask is None:
            mask = torch.tril(torch.ones(t, t, device=inputs.device)) == 1
            mask = mask.float().masked_fill(mask == 0, float("-inf")).masked_fill(mask == 1, 0.0)
        src = self.pos_encoder(self.embedding(inputs) * math.sqrt(self.ninp))
        target = self.pos_encoder(self.embedding(target) * math.sqrt(self.ninp))
        # The demo passes tgt_mask alone; torch's TransformerDecoder then compares it with a causal mask
        # (_detect_is_causal_mask reads its values: True for this mask). Fake tensors have no values, so the
        # answer the real run gets is given here.
        output = self.transformer(src, target, tgt_mask=mask, tgt_is_causal=True)
        output = self.decoder(output)
        output = F.log_softmax(output, dim=-1)
        return output.view(-1, self.vocab_size)


def _fabric_setup(strategy: Any) -> Callable[[], Setup]:
    def make() -> Setup:
        def batch(b: int) -> tuple[tuple[torch.Tensor, torch.Tensor], torch.Tensor]:
            # dataset[i]: 35-token input and target (WikiText2 block_size=35), .unsqueeze(0): batch 1
            inp, tgt = torch.randint(0, 33278, (b, 35)), torch.randint(0, 33278, (b, 35))
            return (inp, tgt), tgt

        def loss(out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
            return F.nll_loss(out, target.view(-1))

        return Setup(build_model=DemoTransformer, make_batch=batch, loss_fn=loss, optimizer=torch.optim.Adam,
                     strategy=strategy, accelerate_model=DemoTransformer)

    return make


def _fabric_row(id: str, strategy_name: str, strategy: Any, measured_mb: int, quote: str) -> Row:
    return Row(
        id=id, model="Lightning demo Transformer (nn.Transformer 32+32 layers, d 1024, ffn 4096, 1.009 B)",
        source=FABRIC_FSDP, quote=quote, batch=1, seq=35, precision="32-true",
        optimizer="torch.optim.Adam(lr=0.1) (foreach: CUDA's default)", checkpointing="no",
        strategy=strategy_name, world_size=2, card="A100-40GB", measured=measured_mb * MiB,
        measured_text=f"{measured_mb:,} MB", counter="memory_summary_peak", setup=_fabric_setup(strategy),
        notes=("'Numbers were produced with A100 40GB GPUs, Lightning 2.1 and PyTorch 2.1.' The script prints "
               "torch.cuda.memory_summary() after 10 steps; which row of it ('Allocated memory' peak assumed) the "
               "table took is not said. Units MB = MiB (memory_summary prints MiB). Lightning 2.1 runs FSDP1 "
               "(FlatParameter, auto_wrap_policy={TransformerEncoderLayer, TransformerDecoderLayer}); vramlab runs "
               "FSDP2 fully_shard on the same units (every encoder and decoder layer, then the root)."))


def _fsdp(reshard_after_forward: bool) -> Any:
    from vramlab.sim.strategies import FSDP

    return FSDP(reshard_after_forward=reshard_after_forward)


FABRIC_ROWS = [
    _fabric_row("F1", "ddp", "ddp", 26953, "list-table 'Memory (MB)': '26’953' under 'DDP'"),
    _fabric_row("F3", "fsdp SHARD_GRAD_OP (reshard_after_forward=False)", _fsdp(False), 11815,
                "list-table 'Memory (MB)': '11’815' under 'SHARD_GRAD_OP'"),
    _fabric_row("F4", "fsdp FULL_SHARD", _fsdp(True), 11578,
                "list-table 'Memory (MB)': '11’578' under 'FULL_SHARD' (and under 'FSDP' in the first table)"),
]

# --------------------------------------------------------------------------- bitsandbytes' optimizer table (Q rows)

BNB_PR = "https://github.com/bitsandbytes-foundation/bitsandbytes/pull/1908"
BNB_PR_NOTE = ("bitsandbytes PR #1908 (head 0b93027, 2026-04, not merged), benchmarking/README.md '8-bit "
               "Optimizers': 'Model: Qwen/Qwen3-0.6B (full-parameter fine-tuning, fp32)', A100 80GB; its script "
               "optimizer_benchmark_comprehensive.py: --seq_len 128 --batch_size 2 --warmup_steps 3 --train_steps "
               "10 --dtype fp32, AutoModelForCausalLM.from_config, labels = input_ids, reset_peak_memory_stats() "
               "before the model is built, peak = max_memory_allocated() (MiB)")


def qwen3_06b_config() -> Any:
    """Qwen/Qwen3-0.6B's config.json, typed in (https://huggingface.co/Qwen/Qwen3-0.6B/blob/main/config.json):
    hidden_size 1024, intermediate_size 3072, num_hidden_layers 28, num_attention_heads 16,
    num_key_value_heads 8, head_dim 128, vocab_size 151936, tie_word_embeddings true, hidden_act
    silu, rms_norm_eps 1e-6, rope_theta 1e6, attention_bias false, max_position_embeddings 40960:
    596,049,920 parameters (the table's 'Model Memory 2274.3 MB' is their float32 bytes). Attention:
    transformers' default (sdpa)."""
    from transformers import Qwen3Config

    return Qwen3Config(hidden_size=1024, intermediate_size=3072, num_hidden_layers=28, num_attention_heads=16,
                       num_key_value_heads=8, head_dim=128, vocab_size=151936, tie_word_embeddings=True,
                       hidden_act="silu", rms_norm_eps=1e-6, rope_theta=1_000_000.0, attention_bias=False,
                       max_position_embeddings=40960)


def _qwen_setup(optimizer: Any) -> Callable[[], Setup]:
    def make() -> Setup:
        from transformers import Qwen3ForCausalLM, Qwen3Model

        cfg = qwen3_06b_config()

        def batch(b: int) -> dict[str, torch.Tensor]:
            ids = torch.randint(0, cfg.vocab_size, (b, 128))
            return {"input_ids": ids, "labels": ids.clone()}

        return Setup(build_model=lambda: Qwen3ForCausalLM(cfg), make_batch=batch, loss_fn=None, optimizer=optimizer,
                     accelerate_model=lambda: Qwen3Model(qwen3_06b_config()))

    return make


def _bnb_row(id: str, name: str, optimizer: Any, measured_mib: str) -> Row:
    return Row(
        id=id, model="Qwen/Qwen3-0.6B (0.596 B), full fine-tuning in float32",
        source=BNB_PR, quote=f"| Peak GPU Memory | ... {name}: {measured_mib} MB ({BNB_PR_NOTE})", batch=2, seq=128,
        precision="32-true", optimizer=f"{name} (lr=2e-4), zero_grad() (set_to_none)", checkpointing="no",
        strategy="single", world_size=1, card="A100-80GB", measured=round(float(measured_mib) * MiB),
        measured_text=f"{measured_mib} MB", counter="max_allocated", setup=_qwen_setup(optimizer),
        notes=("Counter: torch.cuda.max_memory_allocated() over 13 steps, in MiB. Paged state is CUDA unified "
               "memory, outside the allocator: in neither the measured peak nor vramlab's (vramlab reports it as "
               "Estimate.paged). torch, transformers and bitsandbytes versions are not given."))


#: The same table's "Optimizer State on CPU" row (MB = MiB): the paged state, which bitsandbytes allocates
#: as unified memory and labels as CPU memory; vramlab's ``Estimate.paged`` is compared with it.
BNB_PAGED_STATE: dict[str, str] = {"Q3": "4547.0", "Q4": "1136.8"}

BNB_ROWS = [
    _bnb_row("Q1", "PyTorch AdamW", "adamw", "11609.8"),
    _bnb_row("Q2", "AdamW8bit", "adamw8bit", "7135.6"),
    _bnb_row("Q3", "PagedAdamW", "paged_adamw", "5975.0"),
    _bnb_row("Q4", "PagedAdamW8bit", "paged_adamw8bit", "5983.6"),
]


ROWS: list[Row] = [*HF_ROWS, *LITGPT_ROWS, *FABRIC_ROWS, *BNB_ROWS]
BY_ID: dict[str, Row] = {r.id: r for r in ROWS}


# --------------------------------------------------------------------------- running a row


@dataclass
class Result:
    row: Row
    estimate: Any  # vramlab.sim.Estimate
    compared: int  # the vramlab figure compared with row.measured (see Row.compared_as)
    seconds: float

    @property
    def ratio(self) -> float:
        return self.compared / self.row.measured


def run_row(row: Row, **overrides: Any) -> Result:
    """``vramlab.estimate`` of the row's training step; ``overrides`` go to ``estimate``."""
    import vramlab

    s = row.setup()
    kw: dict[str, Any] = dict(batch_size=row.batch, optimizer=s.optimizer, loss_fn=s.loss_fn, device=row.card,
                              precision=row.precision, checkpoint=s.checkpoint, allocator="caching")
    if row.world_size > 1:
        kw.update(world_size=row.world_size, strategy=s.strategy)
    kw.update(row.estimate_kwargs)
    kw.update(overrides)
    t0 = time.perf_counter()
    est = vramlab.estimate(s.build_model, s.make_batch, **kw)
    seconds = time.perf_counter() - t0
    if row.counter == "nvml_used_after":
        assert est.peak_reserved is not None
        compared = est.peak_reserved + HF_V100_CONTEXT
    else:
        compared = est.peak
    return Result(row, est, compared, seconds)


# --------------------------------------------------------------------------- the other estimators


def _meta(build: Callable[[], nn.Module]) -> nn.Module:
    with torch.device("meta"):
        return build()


def accelerate_training_bytes(model: nn.Module, mixed: bool) -> int:
    """``accelerate estimate-memory``'s "Training using Adam" (src/accelerate/commands/estimate.py,
    ``estimate_training_usage``): S = the model's parameters and buffers in float32
    (``calculate_maximum_sizes``: every named tensor, shared ones once, at its dtype's size);
    the float32 row is ``max(S, S, 2S, 4S) = 4S``, the float16/bfloat16 row ``max(S, 1.5S, 2S, 2S) = 2S``."""
    seen: set[int] = set()
    size = 0
    for t in [*model.parameters(), *model.buffers()]:
        if id(t) in seen:
            continue
        seen.add(id(t))
        dtype = torch.float32 if t.is_floating_point() else t.dtype
        size += t.numel() * torch.empty((), dtype=dtype).element_size()
    return 2 * size if mixed else 4 * size


def deepspeed_model_states(model: nn.Module, n_gpus: int) -> tuple[int, int]:
    """DeepSpeed's per-GPU model-states estimates, without offload (``cpu_offload=False``):
    ``estimate_zero2_model_states_mem_needs`` (deepspeed/runtime/zero/stage_1_and_2.py,
    commit 38327e07): ``2*P + int(18*P/N)``; ``estimate_zero3_model_states_mem_needs``
    (stage3.py): ``4*L + int(18*P/N)``, where P counts every parameter once (``model_to_params``:
    trainable or not) and L is the largest module's own parameters."""
    seen: dict[int, int] = {}
    for p in model.parameters():
        seen[id(p)] = p.numel()
    total = sum(seen.values())
    largest = max(sum(p.numel() for p in m.parameters(recurse=False)) for m in model.modules())
    return 2 * total + int(18 * total / n_gpus), 4 * largest + int(18 * total / n_gpus)


@dataclass
class Others:
    accelerate: int
    accelerate_seconds: float
    zero2: int
    zero3: int
    deepspeed_seconds: float


def other_estimates(row: Row) -> Others:
    """accelerate's and DeepSpeed's figures for the row (timed, model built on meta included)."""
    s = row.setup()
    mixed = row.precision != "32-true"
    t0 = time.perf_counter()
    acc = accelerate_training_bytes(_meta(s.accelerate_model or s.build_model), mixed)
    t1 = time.perf_counter()
    z2, z3 = deepspeed_model_states(_meta(s.build_model), row.world_size)
    t2 = time.perf_counter()
    return Others(acc, t1 - t0, z2, z3, t2 - t1)


# --------------------------------------------------------------------------- what-if variants (not the benchmark)


class InputDtypeDropout(nn.Module):
    """Dropout as torch's non-fused ``_dropout_impl`` writes it (aten/src/ATen/native/Dropout.cpp;
    what runs on the CPU): ``noise = bernoulli(1 - p) / (1 - p)`` in the input's dtype, ``x * noise``,
    whose backward keeps ``noise`` (4 bytes per element in float32) instead of CUDA's 1-byte mask."""

    def __init__(self, p: float) -> None:
        super().__init__()
        self.p = p

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.p == 0:
            return x
        return x * torch.empty_like(x).bernoulli_(1 - self.p).div_(1 - self.p)


def _eager_attention_input_dtype_dropout(module: nn.Module, query: torch.Tensor, key: torch.Tensor,
                                         value: torch.Tensor, attention_mask: Optional[torch.Tensor],
                                         scaling: Optional[float] = None, dropout: float = 0.0,
                                         **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """transformers' ``eager_attention_forward`` (modeling_bert) with :class:`InputDtypeDropout`'s
    dropout on the attention probabilities."""
    scaling = query.size(-1) ** -0.5 if scaling is None else scaling
    attn = torch.matmul(query, key.transpose(2, 3)) * scaling
    if attention_mask is not None:
        attn = attn + attention_mask
    attn = F.softmax(attn, dim=-1)
    if module.training and dropout > 0:
        attn = attn * torch.empty_like(attn).bernoulli_(1 - dropout).div_(1 - dropout)
    return torch.matmul(attn, value).transpose(1, 2).contiguous(), attn


def what_if_input_dtype_dropout(row: Row) -> Row:
    """A BERT row (B1-B7) whose every dropout keeps an input-dtype mask (:class:`InputDtypeDropout`):
    the what-if behind ``DIAGNOSES["B1"]`` (``bench_published.py --what-if-dropout``)."""
    from transformers import AttentionInterface

    AttentionInterface.register("eager_input_dtype_dropout", _eager_attention_input_dtype_dropout)
    base = row.setup

    def setup() -> Setup:
        s = base()
        build = s.build_model

        def build_model() -> nn.Module:
            m = build()
            m.config._attn_implementation = "eager_input_dtype_dropout"
            for mod in list(m.modules()):
                for name, child in list(mod.named_children()):
                    if isinstance(child, nn.Dropout):
                        setattr(mod, name, InputDtypeDropout(child.p))
            return m

        s.build_model = build_model
        return s

    return Row(**{**row.__dict__, "id": row.id + "*", "setup": setup,
                  "notes": "what-if: every dropout keeps an input-dtype mask. " + row.notes})


# --------------------------------------------------------------------------- what was found for the misses

#: Why a row's estimate is outside 10% of the measurement, as far as it was traced (the ratios
#: themselves are in the benchmark's output and in tests/sim/test_published.py). "What-if" runs
#: changed the model in the way named and are not part of the benchmark.
DIAGNOSES: dict[str, str] = {
    "B1": (
        "an activation shortfall that grows with the micro-batch and vanishes under checkpointing: measured minus "
        "vramlab is ~404 MiB at batch 1 (B2), ~1572 MiB at batch 4 (B1), 10-20 MiB in the checkpointed B3/B5, so "
        "~389 MiB per sample, ~16 MiB per layer per sample: the size of one float32 (16 x 512 x 512) attention "
        "tensor per layer. The model states are right (B1 minus B6, AdamW minus Adafactor: 2654 MiB measured, "
        "2594 estimated). What-if: with every dropout keeping its mask in the input's dtype (torch's non-fused "
        "_dropout_impl, the CPU's) instead of CUDA's 1-byte bool mask, B1/B2/B6 come to 0.992/0.997/1.001. "
        "That is not "
        "the 2022 stack's: torch 1.11 and 1.12's CUDA dropout (native_dropout_cuda, read from their wheels) keeps "
        "a bool mask, so the what-if is not what that stack did. Not identified; a candidate of that size is "
        "fragmentation of the 64 MiB score blocks in NVML's reserved figure (vramlab's allocator model, of torch "
        "2.13's allocator, has 220 MiB above allocated)."),
    "B4": (
        "the per-sample shortfall of B1 and more under fp16 AMP: ~2000 MiB at batch 4 (~21 MiB per layer per "
        "sample). B1's dropout what-if brings it to 0.947; the remaining ~8 MiB per layer per sample (one fp16 "
        "16 x 512 x 512 tensor) was not identified. vramlab applies torch 2.13's CUDA autocast lists (the "
        "uncommitted kernels.py work at the time of this run); torch 1.11/1.12's lists may differ."),
    "B6": (
        "the same per-sample activation shortfall as B1 (~1512 MiB at batch 4); the optimizer part agrees "
        "(see B1). B1's dropout what-if gives 1.001."),
    "B8": (
        "the B1 activation shortfall, with bitsandbytes' 8-bit Adam in place of AdamW: measured B1 minus B8 is "
        "1864 MiB, vramlab's 1818 MiB (the optimizer part agrees); the rest is B1's per-sample gap."),
    "L4": (
        "vramlab's step is 2.70 GB per rank at micro-batch 1 (L5 3.13, L6 4.02) where 4.86 GB was measured. Found: "
        "the measured run was Lightning 2.1's FSDP1, whose FlatParameter per Block holds the frozen base weights and "
        "the trainable LoRA ones together; with use_orig_params torch keeps a gradient for every element of a "
        "FlatParameter that has one trainable parameter (torch's FSDP docstring: mixing frozen and non-frozen "
        "parameters gives 'higher than expected gradient memory usage'). vramlab runs FSDP2, which keeps gradients "
        "for the adapters only. Those FSDP1 gradients are 1,208,500,224 frozen elements in the 24 Blocks, bf16: "
        "1.21 GB per rank sharded plus 0.10 GB for the Block being reduced; with them the ratios would be 0.825, "
        "0.878 and 0.906 (computed, not modelled: vramlab has no FSDP1). The remaining gap is fixed (~0.9 GB at "
        "micro-batch 1, ~0.55 GB at 4) and not identified: litgpt's counter is never reset, so it also covers the "
        "full-state-dict checkpoint loading, the validation and the generation that run before training. "
        "Per sample, vramlab's step adds 0.44 GB and the measured peak 0.34 GB (HF's Phi attention here, "
        "litgpt's own there)."),
    "L5": "as L4 (ratio with FSDP1's gradients of the frozen weights: 0.878).",
    "L6": "as L4 (ratio with FSDP1's gradients of the frozen weights: 0.906).",
    "F1": (
        "short by 3836 MiB, one float32 copy of the parameters (3848 MiB): vramlab's DDP step holds parameters, "
        "gradients, DDP's bucket copy of them, Adam's two states and one foreach intermediate (torch 2.13's "
        "exp_avg_sq_sqrt); the measured run (torch 2.1.0, Lightning 2.1) held one more parameter-sized buffer. "
        "The same one-copy gap is in F3 and F4 (per rank: one shard). Ruled out: torch 2.1.0's foreach Adam, "
        "read from its wheel (torch/optim/adam.py, _multi_tensor_adam), adds eps in place "
        "(torch._foreach_add_(exp_avg_sq_sqrt, eps)) and copies no gradient at weight_decay=0, one intermediate "
        "list as in 2.13; the second intermediate (denom = torch._foreach_add(...)) was torch 2.0's, removed by "
        "pytorch#104780 (July 2023). Not identified; the docs also do not say which memory_summary row the table "
        "took."),
    "F3": (
        "short by 1762 MiB, about one float32 shard of the parameters (1924 MiB; with it the ratio is 1.014): "
        "see F1. Lightning 2.1 ran FSDP1 (FlatParameter, SHARD_GRAD_OP); vramlab runs FSDP2 with "
        "reshard_after_forward=False."),
    "F4": (
        "short by 1929 MiB, one float32 shard of the parameters (1924 MiB; with it the ratio is 1.000): see F1. "
        "Lightning 2.1 ran FSDP1 (FlatParameter, FULL_SHARD); vramlab runs FSDP2 fully_shard."),
}
