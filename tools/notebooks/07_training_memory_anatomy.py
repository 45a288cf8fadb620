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
prediction_peak_phase = "backward"  # edit me: "forward", "backward", "optimizer step" or "zero_grad"

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
print(f"predicted the peak in '{prediction_peak_phase}'; measured: '{peak_phase.name}', "
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
prediction_autocast_copy_bytes = 2.0  # edit me

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
      f"(predicted {prediction_autocast_copy_bytes}); {kept:.2f} still held for backward after it")
print(f"fp32 Adam: measured {bpp['total']:.2f}, formula {formula['fp32']:g};  "
      f"autocast Adam: measured 16 + {copies:.2f} = {amp_total:.2f}, formula {formula['amp']:g};  "
      f"pure bf16 Adam: formula {formula['bf16']:g}")
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
prediction_napkin_shortfall_pct = 20  # edit me

# %%
est = vramlab.estimate(build_model, lambda b: make_batch(b, device="cpu"), batch_size=batch_size,
                       optimizer=adamw, loss_fn=lm_loss, steps=2, round_blocks=True)
measured = an.peak
napkin = 16 * an.parameters
print(est.text())
print(f"\nmeasured peak {format_bytes(measured)}; estimate {format_bytes(est.peak)} "
      f"({100 * (est.peak - measured) / measured:+.1f}%); napkin 16 x N = {format_bytes(napkin)} "
      f"({100 * (napkin - measured) / measured:+.0f}%, predicted -{prediction_napkin_shortfall_pct}%)")

# %% [markdown]
# The estimate matches because it counts the same allocations; on a CUDA GPU it differs by what
# CUDA adds (cuBLAS workspaces, kernels that allocate differently). The napkin formula misses the
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
# 2. **full, bf16, AdamW**: weights, gradients and moments in bf16 (8 bytes per parameter);
# 3. **full, bf16, 8-bit AdamW state**: the moments in 1 byte each. bitsandbytes (the usual
#    library for this) is not installed here, so the state is modelled with
#    `finetune.Int8StateAdamW`, a plain-PyTorch 8-bit AdamW that stores exactly the same bytes:
#    2 per parameter plus one float32 scale per 2048 values;
# 4. **frozen bf16 base + LoRA adapters** (rank 16 on every linear layer of the blocks): only the
#    adapters (0.6% of the parameters) have gradients and optimizer state.
#
# Each peak is then set against three presets: T4 (16 GB), A100 (80 GB), H100 (80 GB), less the
# 0.5 GiB assumed for the CUDA context. (The A100 and H100 have the same memory, so they get the
# same verdicts; the H100 is faster, which the estimate does not model. The T4 has no bf16
# arithmetic: fp16 would be used there, with the same bytes.)
#
# **Predict.** Which of the four fit on an 80 GB card? Which on a T4?

# %%
prediction_fits_80gb = ["bf16 + 8-bit state", "frozen base + LoRA"]  # edit me
prediction_fits_t4 = []  # edit me

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
presets = [get_preset(p) for p in ("T4", "A100-80GB", "H100-80GB")]
results = {}
for name, (build, dtype, optim) in configs.items():
    results[name] = vramlab.estimate(build, big_batch, batch_size=1, optimizer=optim, dtype=dtype,
                                     loss_fn=lm_loss_fp32, device="A100-80GB")
n7 = results["full fp32, AdamW"].parameters
print(f"{n7 / 1e9:.2f} B parameters\n")
print("at the peak:")
print(f"{'':<22}{'peak':>11}{'weights':>10}{'grads':>10}{'opt state':>11}{'activ.':>9}   "
      + "".join(f"{p.name:>11}" for p in presets))
fits = {}
for name, e in results.items():
    b = e.breakdown
    fits[name] = {p.name: e.peak <= p.memory - p.context_overhead for p in presets}
    print(f"{name:<22}{e.peak / GiB:>8.1f} GiB{b['parameters'] / GiB:>7.1f} G{b['gradients'] / GiB:>7.1f} G"
          f"{b['optimizer_state'] / GiB:>8.1f} G{(b['activations'] + b['other']) / GiB:>6.1f} G   "
          + "".join(f"{'fits' if fits[name][p.name] else '—':>11}" for p in presets))

# %%
fig, ax = plt.subplots(figsize=(6.5, 2.8))
names = list(results)
ax.barh(names, [results[k].peak / GiB for k in names], color="#4e79a7")
for p, c in zip(presets[:2], ("#e15759", "#59a14f")):
    ax.axvline((p.memory - p.context_overhead) / GiB, color=c, ls="--",
               label=f"{p.name}" + (" / H100-80GB" if p.name.startswith("A100") else ""))
ax.invert_yaxis()
ax.set_xlabel("estimated peak (GiB)")
ax.legend(fontsize=8)
fig.tight_layout()

# %% [markdown]
# A full fp32 fine-tune of a 7B model does not fit even an 80 GB card: 16 bytes per parameter
# alone is 98 GiB, and the foreach AdamW step adds a parameter-sized temporary (the "opt state"
# column is read at the peak, inside the optimizer step, so it includes the step's temporaries).
# Halving every byte (bf16) fits the 80 GB cards; 8-bit optimizer state halves the moments again
# (4 bytes per parameter to 2) and cuts the peak by a third, while the dequantised float32
# temporaries of its step (one parameter at a time, here up to the 131 M-entry embedding) eat part
# of the saving. Only freezing the base brings the step within a
# 16 GB T4, and only just: the frozen bf16 weights alone are 12.3 GiB. Longer sequences or larger
# batches add activations on top of every row (lesson 04), and gradient checkpointing buys them back.

# %%
full32, full16, eight, lora = (results[k] for k in configs)
assert abs(full32.breakdown["parameters"] - 4 * n7) < 0.01 * 4 * n7
assert not fits["full fp32, AdamW"]["A100-80GB"] and not fits["full fp32, AdamW"]["H100-80GB"]
assert fits["full bf16, AdamW"]["A100-80GB"] and not fits["full bf16, AdamW"]["T4"]
assert eight.peak < 0.8 * full16.peak
assert eight.breakdown["optimizer_state"] < 0.5 * full16.breakdown["optimizer_state"]
assert fits["frozen base + LoRA"]["T4"]
assert lora.breakdown["gradients"] < 0.01 * full16.breakdown["gradients"]
print(f"predicted to fit 80 GB: {prediction_fits_80gb}; measured: "
      f"{[k for k in fits if fits[k]['A100-80GB']]}")
print(f"predicted to fit a T4: {prediction_fits_t4}; measured: {[k for k in fits if fits[k]['T4']]}")

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
# 1. 12 bytes per parameter (4 + 4 + 4): `6.6e9 * 12 / 2**30` = 74 GiB, under the 79.5 GiB
#    usable on an 80 GB card, but with no room for activations or temporaries beyond 5 GiB.
# 2. The peak falls from about 223 MiB to about 97 MiB, reached both at the end of backward and
#    in the optimizer step: weights, gradients and state (16 bytes per parameter, 81 MiB) plus a
#    16 MiB temporary. The activations (about 3 MiB) no longer matter: the napkin formula is now
#    close.
# 3. No: the activations grow with the batch (about 2 GiB per sequence of 512 tokens here), and
#    the estimate for 4 sequences is 21.2 GiB, 5.7 GiB more than the T4's 15.5 usable. Gradient
#    checkpointing, or computing the loss in chunks, brings it back.
#
# </details>
