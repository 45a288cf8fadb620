# %% [markdown]
# # 07 · The anatomy of training memory
#
# Terms are explained in the [glossary](../docs/glossary.md); the claim ids (A1, B6, …) are those of
# [`docs/claims.md`](../docs/claims.md).
#
# This lesson ties the workbook together. One training step holds four kinds of memory:
# the **weights**, the **gradients**, the **optimizer state** (Adam keeps two running moments per
# weight) and the **activations** (what the forward pass saves for backward, plus temporaries).
# We watch them appear and disappear phase by phase, count the bytes per parameter of fp32 Adam
# and of mixed precision, check an estimate made without running the step against the measured
# peak, and then estimate a 7-billion-parameter fine-tune on GPUs this machine does not have.
#
# Lessons 02 and 04 measured how activations grow with the batch and the hyper-parameters; lesson
# 05 how many bytes a weight takes. Here the weights, gradients and optimizer state are the focus.

# %%
import matplotlib.pyplot as plt
import torch
import torch.nn.functional as F
from torch import nn

import vramlab
from vramlab import format_bytes
from vramlab.lessons import anatomy, finetune
from vramlab.lessons.predict import guess
from vramlab.lessons.models import GPT, gpt_config
from vramlab.sim.presets import get_preset

torch.manual_seed(0)
dev = vramlab.pick_device(virtual="T4")
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
ax.set_title(f"GPT, {an.parameters / 1e6:.1f} M parameters, batch {batch_size} x {seq} tokens")
fig.tight_layout()

# %%
second = [p for p in an.phases if p.step == 2]
peak_phase = max(second, key=lambda p: p.peak)
print(f"the peak: {guess(prediction_peak_phase, repr)}; measured: '{peak_phase.name}', "
      f"{format_bytes(peak_phase.peak)}")

# %% [markdown]
# Read the bars left to right:
#
# - **model**: only the weights (4 bytes per parameter in fp32).
# - **forward**: the activations appear: every layer saves its input (or output) for backward.
#   Here the largest single activation is the logits, batch x tokens x vocabulary floats.
# - **backward**: gradients appear, one per weight and of the same size, while autograd frees
#   each saved activation as soon as it is used, so the activations shrink as gradients grow.
# - **optimizer step**: in step 1, AdamW creates its state, two moments per weight (8 bytes per
#   parameter): from then on the device holds 16 bytes per parameter between steps, before any
#   data.
# - **zero_grad** (with `set_to_none=True`): the gradients are freed; what is left is weights and
#   optimizer state: the floor under every later step.
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
assert z2.parts["activations"] <= max(0.02 * an.peak, 64 * MiB if dev.is_cuda else 0)  # (CUDA: cuBLAS workspace)

# %% [markdown]
# ## 2. Bytes per parameter: fp32 Adam and mixed precision
#
# The usual rule of thumb: training with Adam in fp32 costs **16 bytes per parameter** (4 weight,
# 4 gradient, 8 optimizer state), and mixed precision with `torch.autocast` costs **18**: the same
# 16, because autocast keeps fp32 "master" weights, gradients and state, plus a 2-byte bf16/fp16
# copy of each weight that autocast casts once per forward and caches until backward. (Another
# convention, from the ZeRO paper, counts 16 for mixed precision: fp16 weights and gradients plus
# fp32 master weights and moments. That is a different recipe, not a different count.)
#
# **Predict.** How many bytes per parameter do the bf16 weight copies of autocast take during the
# forward pass?

# %%
prediction_autocast_copy_bytes = None  # your guess, bytes per parameter

# %%
bpp = an.bytes_per_parameter()
print("fp32 AdamW, measured on the GPT above: " + ", ".join(f"{k} {v:.2f}" for k, v in bpp.items()))

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
print(f"autocast's weight copies: {copies:.2f} bytes per parameter during the forward "
      f"({guess(prediction_autocast_copy_bytes)}); {kept:.2f} still held for backward after it")
print(f"fp32 Adam: measured {bpp['total']:.2f}, formula {formula['fp32']:g};  "
      f"autocast Adam: measured 16 + {copies:.2f} = {amp_total:.2f}, formula {formula['amp']:g};  "
      f"pure bf16 Adam: formula {formula['bf16']:g} (see below: it loses small updates)")
del mlp, x
dev.cleanup()

# %%
fig, ax = plt.subplots(figsize=(5.5, 2.6))
labels = ["weights", "gradients", "optimizer_state"]
left = 0.0
for k, c in zip(labels, ("#4e79a7", "#f28e2b", "#59a14f")):
    ax.barh(["fp32 Adam", "autocast Adam"], [bpp[k], bpp[k]], left=[left, left], color=c, label=k.replace("_", " "))
    left += bpp[k]
ax.barh(["autocast Adam"], [copies], left=[left], color="#b07aa1", label="bf16 weight copies")
ax.set_xlabel("bytes per parameter")
ax.legend(fontsize=7, loc="lower right")
fig.tight_layout()

# %% [markdown]
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
assert 1.8 < copies < 2.2, copies
assert abs(amp_total - 18) < 0.3

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
print(f"\nmeasured peak {format_bytes(measured)}; estimate {format_bytes(est.peak)} "
      f"({100 * (est.peak - measured) / measured:+.1f}%); napkin 16 x N = {format_bytes(napkin)} "
      f"({100 * (napkin - measured) / measured:+.0f}%; {guess(prediction_napkin_shortfall_pct, '-{}%')})")

# %% [markdown]
# On the virtual GPU the estimate matches because it counts the same allocations in the same way:
# this is a **consistency check** of the estimator, not evidence that it is right about a real
# card. On a CUDA GPU the comparison is with the real allocator, and it differs by what CUDA adds
# (cuBLAS workspaces, kernels that allocate differently). That comparison is untested until a
# GPU run backs it (`docs/gpu-runs/`). The napkin formula misses the
# activations and the optimizer's temporaries, and it misses more the larger the batch. None of
# the three includes what `nvidia-smi` adds on top: the CUDA context (about 0.5 GiB) and the
# allocator's cache (lesson 06).

# %%
assert abs(est.peak - measured) <= 0.10 * measured, (est.peak, measured)
assert napkin < measured  # the napkin is a floor, not the peak

# %% [markdown]
# ## 4. A 7-billion-parameter fine-tune on GPUs you do not have
#
# A GPT of 6.6 B parameters (hidden size 4096, 32 layers, a 32,000-token vocabulary: the shape of
# the 7B open models), one sequence of 512 tokens per step. `vramlab.estimate` runs each step
# under fake tensors in a few seconds and no memory, with CUDA's 512-byte rounding and its
# multi-tensor (`foreach`) optimizer. Four ways to fine-tune it:
#
# 1. **full, fp32, AdamW**: 16 bytes per parameter, plus temporaries;
# 2. **full, bf16, AdamW**: weights, gradients and moments in bf16 (8 bytes per parameter). This
#    fits the bytes, but without fp32 master weights it loses small updates unless Kahan summation
#    or stochastic rounding is added (section 2);
# 3. **full, bf16, 8-bit AdamW state**: the moments in 1 byte each. bitsandbytes (the usual
#    library for this) is not installed here, so the state is modelled with
#    `finetune.Int8StateAdamW`, a plain-PyTorch 8-bit AdamW that stores exactly the same bytes:
#    2 per parameter plus one float32 scale per 2048 values;
# 4. **frozen bf16 base + LoRA adapters** (rank 16 on every linear layer of the blocks): only the
#    adapters (0.6% of the parameters) have gradients and optimizer state.
#
# Each peak is then set against four cards: the T4 (a "16 GB" card), the A100 and H100 (80 GB)
# and the H200 (141 GB). What counts is not the datasheet's size but what tensors can get: the
# total the card reports (`nvidia-smi`: a T4 shows 15360 MiB) less the CUDA context, modelled as
# 0.5 GiB (`GPUPreset.usable`; the sources are cited in `vramlab.sim.presets`). The T4 has no bf16
# arithmetic: fp16 would be used there, with the same bytes.
#
# **Predict.** Which of the four fit on an 80 GB card? Which on a T4? Which on the H200?

# %%
prediction_fits_80gb = None  # your guess: a list of the names above
prediction_fits_t4 = None  # your guess
prediction_fits_h200 = None  # your guess

# %%
big = dict(vocab=32000, d=4096, layers=32, heads=32, context=512)


def lm_loss_fp32(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())


def big_batch(b: int):
    idx = torch.randint(0, big["vocab"], (b, 512))
    return idx, idx


configs = {
    "full fp32, AdamW": (lambda: GPT(**big), None, lambda ps: torch.optim.AdamW(ps, foreach=True)),
    "full bf16, AdamW": (lambda: GPT(**big), torch.bfloat16, lambda ps: torch.optim.AdamW(ps, foreach=True)),
    "bf16 + 8-bit state": (lambda: GPT(**big), torch.bfloat16, lambda ps: finetune.Int8StateAdamW(ps)),
    "frozen base + LoRA": (lambda: finetune.add_lora(GPT(**big), rank=16), torch.bfloat16,
                           lambda ps: torch.optim.AdamW(ps, foreach=True)),
}
presets = [get_preset(p) for p in ("T4", "A100-80GB", "H100-80GB", "H200-141GB")]
results = {}
for name, (build, dtype, optim) in configs.items():
    results[name] = vramlab.estimate(build, big_batch, batch_size=1, optimizer=optim, dtype=dtype,
                                     loss_fn=lm_loss_fp32, device="A100-80GB")
n7 = results["full fp32, AdamW"].parameters
print(f"{n7 / 1e9:.2f} B parameters; usable: "
      + ", ".join(f"{p.name} {format_bytes(p.usable)} (datasheet {p.datasheet_memory // GiB} GB)" for p in presets) + "\n")
print("at the peak:")
print(f"{'':<22}{'peak':>11}{'weights':>10}{'grads':>10}{'opt state':>11}{'activ.':>9}   "
      + "".join(f"{p.name:>11}" for p in presets))
fits = {}
for name, e in results.items():
    b = e.breakdown
    fits[name] = {p.name: e.peak <= p.usable for p in presets}
    print(f"{name:<22}{e.peak / GiB:>8.1f} GiB{b['parameters'] / GiB:>7.1f} G{b['gradients'] / GiB:>7.1f} G"
          f"{b['optimizer_state'] / GiB:>8.1f} G{(b['activations'] + b['other']) / GiB:>6.1f} G   "
          + "".join(f"{'fits' if fits[name][p.name] else '—':>11}" for p in presets))

# %%
fig, ax = plt.subplots(figsize=(6.5, 2.8))
names = list(results)
ax.barh(names, [results[k].peak / GiB for k in names], color="#4e79a7")
for p, c in zip(presets, ("#e15759", "#59a14f", "#76b7b2", "#f28e2b")):
    ax.axvline(p.usable / GiB, color=c, ls="--", label=f"{p.name} usable")
ax.invert_yaxis()
ax.set_xlabel("estimated peak (GiB)")
ax.legend(fontsize=8)
fig.tight_layout()

# %%
full32, full16, eight, lora = (results[k] for k in configs)
t4 = presets[0]
for name, e in results.items():
    on = [p.name for p in presets if fits[name][p.name]]
    print(f"{name:<20} peak {format_bytes(e.peak):>10}: fits {', '.join(on) if on else 'none of the four'}")
margin = t4.usable - lora.peak
low, high = 300 * MiB, 600 * MiB  # the range assumed for a CUDA context (vramlab.sim.presets)
print(f"\nLoRA on the T4: peak {format_bytes(lora.peak)} against {format_bytes(t4.usable)} usable, "
      f"{'room of ' + format_bytes(margin) if margin >= 0 else 'short by ' + format_bytes(-margin)}; "
      f"with a context of {format_bytes(low)} it {'fits' if lora.peak <= t4.memory - low else 'does not fit'}, "
      f"with {format_bytes(high)} it {'fits' if lora.peak <= t4.memory - high else 'does not fit'}")
print(f"predicted to fit 80 GB: {guess(prediction_fits_80gb)}; estimated: {[k for k in fits if fits[k]['A100-80GB']]}")
print(f"predicted to fit a T4: {guess(prediction_fits_t4)}; estimated: {[k for k in fits if fits[k]['T4']]}")
print(f"predicted to fit the H200: {guess(prediction_fits_h200)}; estimated: {[k for k in fits if fits[k]['H200-141GB']]}")

# %% [markdown]
# Read the verdicts above from the numbers, not from the card's name:
#
# - **fp32** needs 16 bytes per parameter before any activation, about 98 GiB for 6.6 B
#   parameters, and the foreach AdamW step adds a parameter-sized temporary (the "opt state"
#   column is read at the peak, inside the optimizer step, so it includes the step's
#   temporaries). No 80 GB card holds that; the H200's usable memory is compared with it above.
# - **bf16** halves every byte; **8-bit state** halves the moments again (4 bytes per parameter
#   to 2) and cuts the peak by a third, while the dequantised float32 temporaries of its step (one
#   parameter at a time, here up to the 131 M-entry embedding) eat part of the saving.
# - **LoRA** leaves the frozen bf16 weights (12.3 GiB here) and adds little else, so its peak sits
#   right at a T4's size. Whether it fits depends on what the card really reports and on the CUDA
#   context, which is why the T4 line above prints the margin and both ends of the assumed
#   context range. A margin smaller than that range is not a "fits": measure on the card, or buy
#   room with a shorter sequence, gradient checkpointing, or a quantised base (QLoRA, lesson 05).
#
# Longer sequences or larger batches add activations on top of every row (lesson 04), and
# gradient checkpointing buys them back.

# %%
assert abs(full32.breakdown["parameters"] - 4 * n7) < 0.01 * 4 * n7  # 4 bytes per fp32 weight
assert full32.peak > 16 * n7  # at least weights, gradients and two moments
assert not any(fits["full fp32, AdamW"][p.name] for p in presets if p.usable < 16 * n7)  # cards below 16 B/param
assert full16.peak < 0.55 * full32.peak  # bf16: about half the bytes
assert eight.peak < 0.8 * full16.peak  # 8-bit state: a third less
assert eight.breakdown["optimizer_state"] < 0.5 * full16.breakdown["optimizer_state"]
assert lora.breakdown["gradients"] < 0.01 * full16.breakdown["gradients"]  # adapters only
assert lora.peak < 0.3 * full16.peak  # the frozen base holds most of it

# %% [markdown]
# ## Exercises
#
# 1. With `finetune.training_bytes_per_parameter`, how many GiB do the weights, gradients and
#    state of a 7B model take with SGD with momentum in fp32? Does it fit an 80 GB card?
# 2. In section 1, set `seq, batch_size = 32, 1`. Where is the peak now, and what sets it?
# 3. Re-run section 4's LoRA row with `batch_size=4`. Does it still fit the T4?
#
# <details><summary>Solutions</summary>
#
# 1. SGD with momentum in fp32 keeps 4 + 4 + 4 bytes per parameter (weights, gradients, one
#    moment). The cell below computes the total and sets it against an 80 GB card's usable memory.
# 2. With so few tokens the activations shrink to almost nothing, and the peak is set by weights,
#    gradients and state plus the optimizer step's temporaries. The cell below re-runs section 1
#    at that size and prints where the peak is and what the napkin formula gives.
# 3. The activations grow with the batch. The cell below estimates the LoRA step at 4 sequences
#    and sets it against the T4.
#
# </details>

# %%
# solution 1: bytes per parameter of fp32 SGD with momentum, for the 7B model
sgd = finetune.training_bytes_per_parameter("sgd-momentum", "fp32")
a100 = presets[1]
print(f"1. fp32 SGD-momentum: {sgd['total']:.0f} bytes per parameter, {format_bytes(sgd['total'] * n7)} for "
      f"{n7 / 1e9:.2f} B parameters; {a100.name} usable {format_bytes(a100.usable)}: "
      f"{'fits, with ' + format_bytes(a100.usable - sgd['total'] * n7) + ' left' if sgd['total'] * n7 <= a100.usable else 'does not fit'} "
      "for activations and temporaries")

# solution 2: section 1 with 32 tokens and one sequence
seq_kept, seq = seq, 32  # make_batch reads the global seq
model = dev.put(build_model())
opt = adamw(model.parameters())
an_short = anatomy.trace_step(dev, model, lambda: make_batch(1), opt, loss_fn=lm_loss, steps=2)
seq = seq_kept
top = max((p for p in an_short.phases if p.step == 2), key=lambda p: p.peak)
state = sum(an_short.phase("optimizer step", 2).parts[k] for k in ("parameters", "gradients", "optimizer_state"))
print(f"2. batch 1 x 32 tokens: peak {format_bytes(an_short.peak)} (was {format_bytes(an.peak)}), in '{top.name}'; "
      f"weights + gradients + state {format_bytes(state)}; napkin 16 x N = {format_bytes(16 * an_short.parameters)}")
del model, opt
dev.cleanup()

# solution 3: the LoRA step with 4 sequences of 512 tokens
build_lora, _, optim_lora = configs["frozen base + LoRA"]
lora4 = vramlab.estimate(build_lora, big_batch, batch_size=4, optimizer=optim_lora, dtype=torch.bfloat16,
                         loss_fn=lm_loss_fp32, device="T4")
print(f"3. LoRA, 4 sequences: peak {format_bytes(lora4.peak)} against the T4's {format_bytes(t4.usable)} usable "
      f"({'fits' if lora4.peak <= t4.usable else 'short by ' + format_bytes(lora4.peak - t4.usable)}); "
      f"activations grow by {format_bytes((lora4.peak - lora.peak) / 3)} per sequence")
