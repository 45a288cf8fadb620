# %% [markdown]
# # 11 · A 7-billion-parameter fine-tune on GPUs you do not have
#
# Terms are explained in the [glossary](../docs/glossary.md); the claim ids (A1, B6, …) are those of
# [`docs/claims.md`](../docs/claims.md).
#
# Lesson 10 checked `vramlab.estimate` against a measured step and counted the bytes per
# parameter of each part of training memory. Here the estimate does what no CPU could measure: it
# runs a 7B model's training step on fake tensors, and we ask which fine-tuning recipe fits which
# card. The claim under test is the workbook's own (C1): training memory is weights, gradients,
# optimizer state and activations, about 16 bytes per parameter for fp32 AdamW, and the usual
# recipes cut one term or another.

# %%
import matplotlib.pyplot as plt
import torch
import torch.nn.functional as F

import vramlab
from vramlab import format_bytes
from vramlab.i18n import N_, tr
from vramlab.lessons import finetune
from vramlab.lessons.models import GPT
from vramlab.lessons.predict import guess
from vramlab.sim.presets import get_preset

torch.manual_seed(0)
MiB, GiB = 2**20, 2**30

# %% [markdown]
# ## 1. Five ways to fine-tune, on four cards
#
# A GPT of 6.6 B parameters (hidden size 4096, 32 layers, a 32,000-token vocabulary: the shape of
# the 7B open models), one sequence of 512 tokens per step. `vramlab.estimate` runs each step
# under fake tensors in a few seconds and no memory, with CUDA's 512-byte rounding and its
# multi-tensor (`foreach`) optimizer. Five ways to fine-tune it (`precision=` takes Lightning's
# names):
#
# 1. **full, fp32, AdamW** (`"32-true"`): 16 bytes per parameter, plus temporaries;
# 2. **full, bf16 mixed precision, AdamW** (`"bf16-mixed"`): how most models are trained. The
#    weights, gradients and Adam moments stay fp32 and `torch.autocast` runs the matmuls in bf16;
# 3. **full, bf16, AdamW** (`"bf16-true"`): weights, gradients and moments in bf16 (8 bytes per parameter). This
#    fits the bytes, but without fp32 master weights it loses small updates unless Kahan summation
#    or stochastic rounding is added (lesson 10, section 2);
# 4. **full, bf16, 8-bit AdamW state**: the moments in 1 byte each. bitsandbytes (the usual
#    library for this) is not installed here, so the state is modelled with
#    `finetune.Int8StateAdamW`, a plain-PyTorch 8-bit AdamW that stores exactly the same bytes:
#    2 per parameter plus one float32 scale per 2048 values;
# 5. **frozen bf16 base + LoRA adapters** (rank 16 on every linear layer of the blocks): only the
#    adapters (0.6% of the parameters) have gradients and optimizer state.
#
# Each peak is then set against four cards: the T4 (a "16 GB" card), the A100 and H100 (80 GB)
# and the H200 (141 GB). A card runs out when PyTorch's caching allocator cannot get another
# segment, so the estimate models that allocator and compares what it **reserves** at the peak
# (`Estimate.needed`, a little above the tensors' bytes) with the card. And what counts is not the
# datasheet's size but what tensors can get: the
# total the card reports (`nvidia-smi`: a T4 shows 15360 MiB) less the CUDA context, modelled per
# card at about 0.5 GiB (`GPUPreset.usable`: 481 MiB on the A100 and 534 MiB on the H100 and H200,
# figures published under torch 2.x; 512 MiB assumed on the T4; the sources are cited in
# `vramlab.sim.presets`). The T4 has no bf16
# arithmetic: fp16 would be used there, with the same bytes.
#
# **Predict.** Which of the five fit on an 80 GB card? Which on a T4? Which on the H200?

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


configs = {  # name: (build, precision, optimizer)
    N_("full fp32, AdamW"): (lambda: GPT(**big), "32-true", lambda ps: torch.optim.AdamW(ps, foreach=True)),
    N_("full bf16-mixed, AdamW"): (lambda: GPT(**big), "bf16-mixed", lambda ps: torch.optim.AdamW(ps, foreach=True)),
    N_("full bf16, AdamW"): (lambda: GPT(**big), "bf16-true", lambda ps: torch.optim.AdamW(ps, foreach=True)),
    N_("bf16 + 8-bit state"): (lambda: GPT(**big), "bf16-true", lambda ps: finetune.Int8StateAdamW(ps)),
    N_("frozen base + LoRA"): (lambda: finetune.add_lora(GPT(**big), rank=16), "bf16-true",
                               lambda ps: torch.optim.AdamW(ps, foreach=True)),
}
recipe_names = {k: tr(k) for k in configs}  # the names as printed; the keys stay English
wn = max(24, *(len(v) + 1 for v in recipe_names.values()))  # the width of the names' column
presets = [get_preset(p) for p in ("T4", "A100-80GB", "H100-80GB", "H200-141GB")]
results = {}
for name, (build, precision, optim) in configs.items():
    results[name] = vramlab.estimate(build, big_batch, batch_size=1, optimizer=optim, precision=precision,
                                     loss_fn=lm_loss_fp32, device="A100-80GB")
n7 = results["full fp32, AdamW"].parameters
print(tr("{n:.2f} B parameters; usable: ", n=n7 / 1e9)
      + ", ".join(tr("{card} {usable} (datasheet {gb} GB)", card=p.name, usable=format_bytes(p.usable),
                     gb=p.datasheet_memory // GiB) for p in presets) + "\n")
print(tr("at the peak:"))
print(f"{'':<{wn}}{tr('reserved'):>11}{tr('peak'):>11}{tr('weights'):>10}{tr('grads'):>10}{tr('opt state'):>11}"
      f"{tr('activ.'):>9}   " + "".join(f"{p.name:>11}" for p in presets))
fits = {}
for name, e in results.items():
    b = e.breakdown
    fits[name] = {p.name: e.needed <= p.usable for p in presets}  # a card runs out on reserved memory
    print(f"{recipe_names[name]:<{wn}}{e.needed / GiB:>8.1f} GiB{e.peak / GiB:>7.1f} GiB{b['parameters'] / GiB:>7.1f} G"
          f"{b['gradients'] / GiB:>7.1f} G{b['optimizer_state'] / GiB:>8.1f} G{(b['activations'] + b['other']) / GiB:>6.1f} G   "
          + "".join(f"{tr('fits') if fits[name][p.name] else '—':>11}" for p in presets))

# %%
fig, ax = plt.subplots(figsize=(6.5, 2.8))
names = list(results)
ax.barh([recipe_names[k] for k in names], [results[k].needed / GiB for k in names], color="#4e79a7")
for p, c in zip(presets, ("#e15759", "#59a14f", "#76b7b2", "#f28e2b")):
    ax.axvline(p.usable / GiB, color=c, ls="--", label=tr("{card} usable", card=p.name))
ax.invert_yaxis()
ax.set_xlabel(tr("estimated peak reserved by the caching allocator (GiB)"))
ax.set_title(tr("the 7B fine-tune, by recipe, against each card"))
ax.legend(fontsize=8)
fig.tight_layout()

# %%
full32, mixed, full16, eight, lora = (results[k] for k in configs)
t4 = presets[0]
with torch.device("meta"):
    adapters = sum(p.numel() for p in configs["frozen base + LoRA"][0]().parameters() if p.requires_grad)
per_param = {  # model states by the bytes-per-parameter count (lesson 10): weights + gradients + state
    "full fp32, AdamW": finetune.training_bytes_per_parameter("adamw", "fp32"),
    "full bf16-mixed, AdamW": finetune.training_bytes_per_parameter("adamw", "amp"),
    "full bf16, AdamW": finetune.training_bytes_per_parameter("adamw", "bf16"),
    "bf16 + 8-bit state": finetune.training_bytes_per_parameter("adamw-8bit", "bf16"),
}
counted = {k: (v["total"] - v["autocast_copies"]) * n7 for k, v in per_param.items()}  # copies die in backward
counted["frozen base + LoRA"] = (finetune.training_bytes_per_parameter("adamw", "bf16", trainable=False)["total"]
                                 * n7 + finetune.training_bytes_per_parameter("adamw", "bf16")["total"] * adapters)
print(tr("model states when the optimizer step ends, against the bytes-per-parameter count:"))
for name, e in results.items():
    print(f"{recipe_names[name]:<{wn}}{format_bytes(e.model_states_total):>11}  "
          + tr("count {count:>11}", count=format_bytes(counted[name])) + f"  x{e.model_states_total / counted[name]:.3f}")
print()
for name, e in results.items():
    on = [p.name for p in presets if fits[name][p.name]]
    print(f"{recipe_names[name]:<{wn}} " + tr("reserved {reserved:>10}: fits {cards}", reserved=format_bytes(e.needed),
                                            cards=", ".join(on) if on else tr("none of the four")))


def verdict(ok: bool) -> str:
    return tr("fits") if ok else tr("does not fit")


margin = t4.usable - lora.needed
low, high = 300 * MiB, 600 * MiB  # the range assumed for a CUDA context (vramlab.sim.presets)
room = tr("room of {size}", size=format_bytes(margin)) if margin >= 0 else tr("short by {size}", size=format_bytes(-margin))
print("\n" + tr("LoRA on the T4: reserved at the peak {needed} against {usable} usable, {room}; ",
                needed=format_bytes(lora.needed), usable=format_bytes(t4.usable), room=room)
      + tr("with a context of {low} it {low_verdict}, with {high} it {high_verdict}",
           low=format_bytes(low), low_verdict=verdict(lora.needed <= t4.memory - low),
           high=format_bytes(high), high_verdict=verdict(lora.needed <= t4.memory - high)))
print(tr("predicted to fit 80 GB: {guess}; estimated: {fit}", guess=guess(prediction_fits_80gb),
         fit=[recipe_names[k] for k in fits if fits[k]["A100-80GB"]]))
print(tr("predicted to fit a T4: {guess}; estimated: {fit}", guess=guess(prediction_fits_t4),
         fit=[recipe_names[k] for k in fits if fits[k]["T4"]]))
print(tr("predicted to fit the H200: {guess}; estimated: {fit}", guess=guess(prediction_fits_h200),
         fit=[recipe_names[k] for k in fits if fits[k]["H200-141GB"]]))

# %% [markdown]
# Read the verdicts above from the numbers, not from the card's name:
#
# - **fp32** needs 16 bytes per parameter before any activation,
#   {{ format_bytes(full32.model_states_total) }} for {{ n7 / 1e9 | .2f }} B parameters, and the foreach AdamW step adds a parameter-sized temporary (the "opt state"
#   column is read at the peak, inside the optimizer step, so it includes the step's
#   temporaries). No 80 GB card holds that; the H200's usable memory is compared with it above.
# - **bf16-mixed** keeps those 16 bytes: its model states are fp32's to the byte, and so is its
#   peak, which falls inside the optimizer step, after the activations are gone. Mixed precision
#   buys speed and smaller activations (lesson 10), not smaller model states, on one card; sharding
#   them is lesson 12's subject.
# - **bf16** halves every byte; **8-bit state** halves the moments again (4 bytes per parameter
#   to 2) and cuts the peak by a third, while the dequantised float32 temporaries of its step (one
#   parameter at a time, here up to the 131 M-entry embedding) eat part of the saving.
# - **LoRA** leaves the frozen bf16 weights ({{ lora.breakdown['parameters'] / GiB | .1f }} GiB here) and adds little else, so its peak sits
#   right at a T4's size. Whether it fits depends on what the card really reports and on the CUDA
#   context, which is why the T4 line above prints the margin and both ends of the assumed
#   context range. A margin smaller than that range is not a "fits": measure on the card, or buy
#   room with a shorter sequence, gradient checkpointing, or a quantised base (QLoRA keeps
#   the frozen base in 4 bits; lesson 07 measures what 4-bit weights take and cost).
#
# Longer sequences or larger batches add activations on top of every row (lesson 06), and
# gradient checkpointing buys them back.

# %%
assert abs(full32.breakdown["parameters"] - 4 * n7) < 0.01 * 4 * n7  # 4 bytes per fp32 weight
assert full32.peak > 16 * n7  # at least weights, gradients and two moments
assert full16.peak < 0.55 * full32.peak  # bf16: about half the bytes
assert eight.peak < 0.8 * full16.peak  # 8-bit state: a third less
assert eight.breakdown["optimizer_state"] < 0.5 * full16.breakdown["optimizer_state"]
assert lora.breakdown["gradients"] < 0.01 * full16.breakdown["gradients"]  # adapters only
assert lora.peak < 0.3 * full16.peak  # the frozen base holds most of it
for name, e in results.items():  # the model states are the bytes-per-parameter count (8-bit: its block scales)
    assert abs(e.model_states_total / counted[name] - 1) < 0.01, name
assert mixed.model_states == full32.model_states and mixed.peak >= full32.peak  # mixed keeps fp32's states

# %% [markdown]
# ## Exercises
#
# 1. With `finetune.training_bytes_per_parameter`, how many GiB do the weights, gradients and
#    state of a 7B model take with SGD with momentum in fp32? Does it fit an 80 GB card?
# 2. Re-run the LoRA row with `batch_size=4`. Does it still fit the T4?
#
# <details><summary>Solutions</summary>
#
# 1. SGD with momentum in fp32 keeps 4 + 4 + 4 bytes per parameter (weights, gradients, one
#    moment). The code below computes the total and sets it against an 80 GB card's usable memory.
# 2. The activations grow with the batch. The code below estimates the LoRA step at 4 sequences
#    and sets it against the T4.
#
# </details>

# %% tags=["solution"]
# solution 1: bytes per parameter of fp32 SGD with momentum, for the 7B model
sgd = finetune.training_bytes_per_parameter("sgd-momentum", "fp32")
a100 = presets[1]
sgd_bytes = sgd["total"] * n7
print(tr("1. fp32 SGD-momentum: {bpp:.0f} bytes per parameter, {total} for {n:.2f} B parameters; ",
         bpp=sgd["total"], total=format_bytes(sgd_bytes), n=n7 / 1e9)
      + tr("{card} usable {usable}: {verdict} for activations and temporaries", card=a100.name,
           usable=format_bytes(a100.usable),
           verdict=(tr("fits, with {left} left", left=format_bytes(a100.usable - sgd_bytes))
                    if sgd_bytes <= a100.usable else tr("does not fit"))))

# solution 2: the LoRA step with 4 sequences of 512 tokens
build_lora, _, optim_lora = configs["frozen base + LoRA"]
lora4 = vramlab.estimate(build_lora, big_batch, batch_size=4, optimizer=optim_lora, precision="bf16-true",
                         loss_fn=lm_loss_fp32, device="T4")
print(tr("2. LoRA, 4 sequences: reserved at the peak {needed} against the T4's {usable} usable ({verdict}); ",
         needed=format_bytes(lora4.needed), usable=format_bytes(t4.usable),
         verdict=(tr("fits") if lora4.needed <= t4.usable
                  else tr("short by {size}", size=format_bytes(lora4.needed - t4.usable))))
      + tr("activations grow by {size} per sequence", size=format_bytes((lora4.peak - lora.peak) / 3)))
