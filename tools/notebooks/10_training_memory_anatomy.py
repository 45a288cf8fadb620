# %% [markdown]
# # 10 · The anatomy of training memory
#
# Terms are explained in the [glossary](../docs/glossary.md); the claim ids (A1, B6, …) are those of
# [`docs/claims.md`](../docs/claims.md).
#
# This lesson ties the workbook together. One training step holds four kinds of memory:
# the **weights**, the **gradients**, the **optimizer state** (Adam keeps two running moments per
# weight) and the **activations** (what the forward pass saves for backward, plus temporaries).
# We watch them appear and disappear phase by phase, count the bytes per parameter of fp32 Adam
# and of mixed precision, check an estimate made without running the step against the measured
# peak. Lesson 11 then uses the estimate on a 7-billion-parameter fine-tune.
#
# Lessons 02 and 06 measured how activations grow with the batch and the hyper-parameters; lesson
# 07 how many bytes a weight takes. Here the weights, gradients and optimizer state are the focus.

# %%
import matplotlib.pyplot as plt
import torch
import torch.nn.functional as F
from torch import nn

import vramlab
from vramlab import format_bytes
from vramlab.i18n import tr
from vramlab.lessons import anatomy, finetune
from vramlab.lessons.predict import guess
from vramlab.lessons.models import GPT, gpt_config
from vramlab.sim.presets import get_preset

torch.manual_seed(0)
# exact bytes per tensor: the anatomy is about what tensors hold (lesson 09 shows what the caching
# allocator's segments add on top)
dev = vramlab.pick_device(virtual="T4", allocator="exact")
LARGE = dev.large  # the one size switch: a 30M-parameter GPT instead of a 5M one on a big GPU
MiB, GiB = 2**20, 2**30
print(dev)

# %% [markdown]
# ## 1. One step, phase by phase
#
# A small GPT-style language model (`vramlab.lessons.models.GPT`) is trained with AdamW for two steps.
# `anatomy.trace_step` runs each phase (forward, backward, optimizer step, `zero_grad`) inside
# `dev.measure()`, and after each one splits what the device holds into the four parts: the
# weights, gradients and optimizer state are counted from the objects themselves, and the rest
# (the batch, saved activations, outputs, temporaries) is what remains of `dev.allocated()`.
#
# **Predict.** In which phase of the *second* step is the peak, and what is the largest part there?

# %%
prediction_peak_phase = None  # your guess: "forward", "backward", "optimizer step" or "zero_grad"

# %%
cfg = gpt_config("small" if LARGE else "tiny")
seq, batch_size = (512, 8) if LARGE else (128, 8)


def build_model() -> nn.Module:
    return GPT(**cfg)


def make_batch(b: int = batch_size, device: torch.device | str = dev.device):
    idx = torch.randint(0, cfg["vocab"], (b, seq), device=device)
    return idx, torch.roll(idx, -1, dims=1)   # next-token targets


def lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten())


def adamw(params):
    # foreach (the multi-tensor path) is CUDA's default and not the CPU's: say it, so that the
    # estimate in section 3 runs the same optimizer code as the measured step
    return torch.optim.AdamW(params, lr=1e-3, foreach=dev.is_cuda)


model = dev.put(build_model())
opt = adamw(model.parameters())
an = anatomy.trace_step(dev, model, make_batch, opt, loss_fn=lm_loss, steps=2)
print(an.text())

# %%
fig, ax = plt.subplots(figsize=(8, 3.2))
an.plot(ax)
ax.set_title(tr("GPT, {m:.1f} M parameters, batch {b} x {seq} tokens", m=an.parameters / 1e6, b=batch_size, seq=seq))
fig.tight_layout()

# %%
second = [p for p in an.phases if p.step == 2]
peak_phase = max(second, key=lambda p: p.peak)
# the phase's English name is the answer; a guess in either language is judged against it
print(tr("the peak: {guess}; measured: '{phase}', {peak}", guess=guess(prediction_peak_phase, repr, answer=peak_phase.name),
         phase=tr(peak_phase.name), peak=format_bytes(peak_phase.peak)))

# %% [markdown]
# Read the bars left to right:
#
# - **model**: only the weights (4 bytes per parameter in fp32).
# - **forward**: the activations appear: every layer saves its input (or output) for backward.
#   Here the largest single activation is the logits, batch x tokens x vocabulary floats.
# - **backward**: gradients appear, one per weight and of the same size, while autograd frees
#   each saved activation as soon as it is used, so the activations shrink as gradients grow.
# - **optimizer step**: in step 1, AdamW creates its state, two moments per weight (8 bytes per
#   parameter): right after each optimizer step the device holds 16 bytes per parameter (weights,
#   gradients, state), before any data.
# - **zero_grad** (with `set_to_none=True`): the gradients are freed; what is left is weights and
#   optimizer state, 12 bytes per parameter: the floor under every later step.
#
# Which phase peaks depends on the ratio of activations to weights: with long sequences or large
# batches the forward/backward boundary dominates; with a big model and a small batch the optimizer
# step does (its temporaries come on top of weights, gradients and state). Everything that is not
# weights, gradients or state is gone after `zero_grad`.

# %%
n = an.parameters
f2, b2, o1, z2 = (an.phase("forward", 2), an.phase("backward", 2), an.phase("optimizer step", 1),
                  an.phase("zero_grad", 2))
assert an.phase("forward", 1).parts["optimizer_state"] == 0 and o1.parts["optimizer_state"] > 0  # created in step 1
assert f2.parts["activations"] > 0 and f2.parts["gradients"] == 0
assert abs(b2.parts["gradients"] - b2.parts["parameters"]) <= 0.01 * b2.parts["parameters"]  # one gradient per weight
assert abs(o1.parts["optimizer_state"] - 2 * o1.parts["parameters"]) <= 0.01 * o1.parts["parameters"]
assert z2.parts["gradients"] == 0
assert z2.parts["activations"] <= max(0.02 * an.peak, 64 * MiB)  # what stays: cuBLAS's workspace (8 MiB on a T4)

# %% [markdown]
# ## 2. Bytes per parameter: fp32 Adam and mixed precision
#
# The usual rule of thumb: training with Adam in fp32 costs **16 bytes per parameter** (4 weight,
# 4 gradient, 8 optimizer state). Mixed precision with `torch.autocast` keeps those fp32 "master"
# weights, gradients and state, and computes the forward in bf16 or fp16.
#
# **Predict.** During the forward pass, how many bytes per parameter does autocast add on top of
# the 16?

# %%
prediction_autocast_copy_bytes = None  # your guess, bytes per parameter

# %%
bpp = an.bytes_per_parameter()
part_names = {"weights": tr("weights"), "gradients": tr("gradients"), "optimizer_state": tr("optimizer_state"),
              "total": tr("total")}
print(tr("fp32 AdamW, measured on the GPT above: ") + ", ".join(f"{part_names[k]} {v:.2f}" for k, v in bpp.items()))

# the autocast copies: the same forward with and without autocast, on a model where the weights
# dwarf the activations (a batch of 2), so that the difference is the weight copies
mlp = dev.put(nn.Sequential(*[nn.Linear(1024, 1024) for _ in range(4)]))
n_mlp = sum(p.numel() for p in mlp.parameters())
x = torch.randn(2, 1024, device=dev.device)
fwd = {}
for label, dtype in (("fp32", None), ("autocast bf16", torch.bfloat16)):
    a = anatomy.trace_step(dev, mlp, lambda: x, None, steps=1, autocast_dtype=dtype)
    fwd[label] = (a.phase("forward").peak - a.phase("model").allocated,   # during the forward
                  a.phase("forward").parts["activations"])                    # after it
copies = (fwd["autocast bf16"][0] - fwd["fp32"][0]) / n_mlp
kept = (fwd["autocast bf16"][1] - fwd["fp32"][1]) / n_mlp
amp_total = 16 + copies
formula = {p: finetune.training_bytes_per_parameter("adamw", p)["total"] for p in ("fp32", "amp", "bf16")}
print(tr("autocast's weight copies: {copies:.2f} bytes per parameter during the forward ({guess}); ",
         copies=copies, guess=guess(prediction_autocast_copy_bytes))
      + tr("{kept:.2f} still held for backward after it", kept=kept))
print(tr("fp32 Adam: measured {measured:.2f}, formula {formula:g};  ", measured=bpp["total"], formula=formula["fp32"])
      + tr("autocast Adam: 16 + the measured copies {copies:.2f} = {total:.2f}, formula {formula:g};  ",
           copies=copies, total=amp_total, formula=formula["amp"])
      + tr("pure bf16 Adam: formula {formula:g} (see below: it loses small updates)", formula=formula["bf16"]))
del mlp, x
dev.cleanup()

# %%
fig, ax = plt.subplots(figsize=(5.5, 2.6))
labels = {"weights": tr("weights"), "gradients": tr("gradients"), "optimizer_state": tr("optimizer state")}
left = 0.0
for k, c in zip(labels, ("#4e79a7", "#f28e2b", "#59a14f")):
    ax.barh(["fp32 Adam", "autocast Adam"], [bpp[k], bpp[k]], left=[left, left], color=c, label=labels[k])
    left += bpp[k]
ax.barh(["autocast Adam"], [copies], left=[left], color="#b07aa1", label=tr("bf16 weight copies"))
ax.set_xlabel(tr("bytes per parameter"))
ax.set_title(tr("bytes per parameter, fp32 and autocast"))
ax.legend(fontsize=7, loc="lower right")
fig.tight_layout()

# %% [markdown]
# **Mixed precision costs about 18.** autocast casts each weight once per forward into a 2-byte
# bf16/fp16 copy and caches it until backward: 16 + 2. (Another convention, from the ZeRO paper,
# counts 16 for mixed precision: fp16 weights and gradients plus fp32 master weights and moments.
# That is a different recipe, not a different count.)
#
# **Pure bf16 is cheaper, and it is not free.** Keeping the weights themselves in bf16, with no
# fp32 master copy, costs 8 bytes per parameter with AdamW (2 weight, 2 gradient, 4 state): half
# of fp32. But bf16 keeps 8 significant bits, so an update smaller than about 1/256 of a weight is
# rounded away, and late in training most updates are that small: the model stops learning.
# Recipes that train in pure bf16 add Kahan summation (a bf16 compensation buffer, 2 bytes more)
# or stochastic rounding. That is why the mixed-precision recipe keeps fp32 masters at 18 bytes.
#
# The copies live in autocast's cache while the `autocast` block runs; when it ends, only those
# that autograd saved for backward stay. Here that is three layers of four: the first layer's
# input needs no gradient, so its backward needs its input, not its weight, and its copy is freed.

# %%
assert abs(bpp["total"] - 16) < 0.2, bpp
assert kept < copies
assert 1.8 < copies < 2.2, copies  # so 16 + copies is about 18: a sum, not a second measurement

# %% [markdown]
# ## 3. The estimate against the measured peak
#
# `vramlab.estimate` runs the same step on *fake tensors* (`FakeTensorMode`): tensors with shapes
# and dtypes but no data. It counts what each operation would allocate, so it needs neither the
# memory nor the time of the real step. Here it estimates the GPT step of section 1, and we check
# it against the measured peak. The napkin formula, 16 bytes per parameter, is shown beside them.
#
# **Predict.** How far is the napkin formula (16 x parameters) below the measured peak, in %?

# %%
prediction_napkin_shortfall_pct = None  # your guess, in %

# %%
est = vramlab.estimate(build_model, lambda b: make_batch(b, device="cpu"), batch_size=batch_size,
                       optimizer=adamw, loss_fn=lm_loss, steps=2, round_blocks=True)
measured = an.peak
napkin = 16 * an.parameters
print(est.text())
print("\n" + tr("measured peak {measured}; estimate {estimate} ({off:+.1f}%); ", measured=format_bytes(measured),
                estimate=format_bytes(est.peak), off=100 * (est.peak - measured) / measured)
      + tr("napkin 16 x N = {napkin} ({off:+.0f}%; {guess})", napkin=format_bytes(napkin),
           off=100 * (napkin - measured) / measured, guess=guess(prediction_napkin_shortfall_pct, "-{}%")))

# %% [markdown]
# On the virtual GPU the estimate matches because it counts the same allocations in the same way:
# this is a **consistency check** of the estimator, not evidence that it is right about a real
# card. On a CUDA GPU the comparison is with the real allocator, and it differs by what CUDA adds
# (cuBLAS workspaces, kernels that allocate differently). That comparison is untested until a
# GPU run backs it (`docs/gpu-runs/`). The napkin formula misses the
# activations and the optimizer's temporaries, and it misses more the larger the batch. None of
# the three includes what `nvidia-smi` adds on top: the CUDA context (about 0.5 GiB) and the
# allocator's cache (lesson 09).

# %%
assert abs(est.peak - measured) <= 0.10 * measured, (est.peak, measured)
assert napkin < measured  # the napkin is a floor, not the peak

# %% [markdown]
# ## Exercises
#
# 1. In section 1, set `seq, batch_size = 32, 1`. Where is the peak now, and what sets it?
#
# <details><summary>Solutions</summary>
#
# 1. With so few tokens the activations shrink to almost nothing, and the peak is set by weights,
#    gradients and state plus the optimizer step's temporaries. The code below re-runs section 1
#    at that size and prints where the peak is and what the napkin formula gives.
#
# </details>

# %% tags=["solution"]
# solution 1: section 1 with 32 tokens and one sequence
seq_kept, seq = seq, 32  # make_batch reads the global seq
model = dev.put(build_model())
opt = adamw(model.parameters())
an_short = anatomy.trace_step(dev, model, lambda: make_batch(1), opt, loss_fn=lm_loss, steps=2)
seq = seq_kept
top = max((p for p in an_short.phases if p.step == 2), key=lambda p: p.peak)
state = sum(an_short.phase("optimizer step", 2).parts[k] for k in ("parameters", "gradients", "optimizer_state"))
print(tr("1. batch 1 x 32 tokens: peak {peak} (was {was}), in '{phase}'; ", peak=format_bytes(an_short.peak),
         was=format_bytes(an.peak), phase=tr(top.name))
      + tr("weights + gradients + state {state}; napkin 16 x N = {napkin}", state=format_bytes(state),
           napkin=format_bytes(16 * an_short.parameters)))
del model, opt
dev.cleanup()

