# %% [markdown]
# # 07 · Quantisation and pruning: fewer bytes per weight
#
# Terms are explained in the [glossary](../docs/glossary.md); the claim ids (A1, B6, …) are those of
# [`docs/claims.md`](../docs/claims.md).
#
# **Claim (curriculum A7).** Pruning and quantisation "reduce the memory footprint of ML models
# … without compromising accuracy". This notebook takes the claim apart into three measurable
# pieces:
#
# 1. how many bytes one parameter takes in fp32, bf16, int8 and int4;
# 2. what int8 quantisation of a small model trained here does to its accuracy;
# 3. what pruning does to memory: the surprise is that zeroing weights (unstructured pruning)
#    saves nothing in a dense tensor, while removing whole neurons (structured pruning) does.
#
# Lesson 05 measured what fewer bytes save on the link between host and GPU; here it is the model
# itself, at rest on the device, and what the fewer bytes cost in accuracy. Lesson 11 applies the
# same bytes per parameter to a 7B-parameter model's optimizer state (an 8-bit AdamW).
#
# Nothing here is near the card's capacity, so the device is a T4-sized virtual GPU when there is no
# CUDA GPU (the same card lesson 02 used for its presets); what matters is that every byte is counted.

# %%
import copy

import matplotlib.pyplot as plt
import torch
from torch import nn

import vramlab
from vramlab.i18n import tr
from vramlab.lessons.predict import guess
from vramlab import format_bytes
from vramlab.lessons import quant, prune

torch.manual_seed(0)
dev = vramlab.pick_device(virtual="T4")
LARGE = dev.large  # the one size switch: a wider model on a big GPU
print(dev)

# %% [markdown]
# ## 1. Bytes per parameter
#
# A parameter is one number. Its size depends only on the number format: 32 bits for float32,
# 16 for bfloat16 (bf16) or float16, 8 for int8, 4 for int4. Integer formats also need a *scale*
# to turn the integers back into real values: here one float32 scale per output row for int8,
# and one per group of 64 weights for int4 (`vramlab.lessons.quant.quantize_weights`).
#
# **Predict.** How many bytes per parameter does each format take on the device, scales included?

# %%
prediction_bytes_per_param = {"fp32": None, "bf16": None, "int8": None, "int4": None}  # your guesses, bytes

# %%
width = 4096 if LARGE else 1024


def make_mlp(inputs: int = 1024, width: int = width, depth: int = 4, classes: int = 10) -> nn.Sequential:
    layers: list[nn.Module] = []
    d = inputs
    for _ in range(depth):
        layers += [nn.Linear(d, width), nn.ReLU()]
        d = width
    return nn.Sequential(*layers, nn.Linear(d, classes))


base = make_mlp()
n_params = sum(p.numel() for p in base.parameters())
variants = {
    "fp32": lambda: make_mlp(),
    "bf16": lambda: make_mlp().to(torch.bfloat16),
    "int8": lambda: quant.quantize_weights(make_mlp(), bits=8),
    "int4": lambda: quant.quantize_weights(make_mlp(), bits=4),
}
on_device = {}
for name, build in variants.items():
    model = build()                 # built in host memory, then moved: only the move is counted
    before = dev.allocated()
    model = dev.put(model)
    on_device[name] = dev.allocated() - before
    del model
    dev.cleanup()
print(tr("{n:,} parameters", n=n_params))
for name, nbytes in on_device.items():
    print(tr("{name:>5}: {size:>11} on the device, {per:.3f} bytes/parameter ({guess}, {share:.1f}% of fp32)",
             name=name, size=format_bytes(nbytes), per=nbytes / n_params,
             guess=guess(prediction_bytes_per_param[name]), share=100 * nbytes / on_device["fp32"]))

# %%
fig, ax = plt.subplots(figsize=(5, 2.8))
names = list(on_device)
ax.bar(names, [on_device[n] / n_params for n in names], color="#4e79a7", label=tr("measured"))
guessed = [n for n in names if prediction_bytes_per_param[n] is not None]
if guessed:
    ax.scatter(guessed, [prediction_bytes_per_param[n] for n in guessed], color="#e15759", zorder=3,
               label=tr("your prediction"))
ax.set_ylabel(tr("bytes per parameter"))
ax.set_title(tr("the model on the device, by format"))
ax.legend()
fig.tight_layout()

# %% [markdown]
# The measured figures sit a little above 4, 2, 1 and 0.5: the biases stay in float32, the int
# formats carry their scales (4 bytes per row for int8, 4 bytes per 64 weights for int4, that is
# +0.0625 bytes per parameter), and the allocator rounds each tensor up to 512 bytes. The
# formula `vramlab.lessons.quant.bytes_per_parameter("int4", group_size=64)` gives the same figure.

# %%
ratio = {n: on_device[n] / on_device["fp32"] for n in on_device}  # bf16's half is arithmetic (2 bytes of 4)
assert ratio["int8"] <= 0.30, ratio
assert ratio["int4"] <= 0.17, ratio
assert abs(on_device["int4"] / n_params - quant.bytes_per_parameter("int4", group_size=64)) < 0.02

# %% [markdown]
# ## 2. int8 quantisation and accuracy
#
# A small classifier is trained here, in a few seconds, on a synthetic task: 20,000 points in 64
# dimensions, labelled by a random "teacher" network, so the task is learnable but not trivial.
# Then the trained weights are quantised two ways:
#
# - **dynamic int8** (`torch.ao.quantization.quantize_dynamic`): int8 weights, and activations
#   quantised on the fly, with int8 matrix kernels (fbgemm/qnnpack). This path runs **on the
#   CPU only**: there are no CUDA kernels for its modules, so on a GPU machine this cell moves a
#   copy to the CPU. In this torch version it still runs, but it is deprecated in favour of the
#   torchao library's `quantize_` API (not installed here); `quant.dynamic_int8_available()` says
#   whether it runs.
# - **weight-only int8 and int4** (`quant.quantize_weights`): int8 or packed int4 storage with
#   scales, dequantised per layer at each forward. Plain PyTorch: it runs on CPU and CUDA.
#
# **Predict.** How many accuracy points does int8 cost? And int4?

# %%
prediction_int8_drop_points = None  # your guess, accuracy points lost
prediction_int4_drop_points = None  # your guess

# %%
torch.manual_seed(0)
D, C = 64, 10
teacher = nn.Sequential(nn.Linear(D, 128), nn.Tanh(), nn.Linear(128, C))
with torch.no_grad():
    X = torch.randn(25_000, D)
    Y = teacher(X).argmax(1)
X_train, Y_train, X_test, Y_test = X[:20_000], Y[:20_000], X[20_000:], Y[20_000:]
X_train, Y_train, X_test, Y_test = (dev.put(t) for t in (X_train, Y_train, X_test, Y_test))

student = dev.put(nn.Sequential(nn.Linear(D, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, C)))


def accuracy(model: nn.Module, x: torch.Tensor = X_test, y: torch.Tensor = Y_test) -> float:
    with torch.no_grad():
        return 100.0 * (model(x).argmax(1) == y).float().mean().item()


def train(model: nn.Module, epochs: int, lr: float = 2e-3) -> None:
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    model.train()
    for _ in range(epochs):
        perm = torch.randperm(len(X_train), device=X_train.device)
        for i in range(0, len(perm), 256):
            idx = perm[i:i + 256]
            loss = nn.functional.cross_entropy(model(X_train[idx]), Y_train[idx])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
    model.eval()


train(student, epochs=8)
acc = {"fp32": accuracy(student)}
print(tr("trained: test accuracy {acc:.1f}% (chance is {chance:.0f}%)", acc=acc["fp32"], chance=100 / C))

# %%
sizes = {"fp32": quant.model_bytes(student)}

w8 = quant.quantize_weights(student, bits=8)
w4 = quant.quantize_weights(student, bits=4)
acc["int8 weight-only"], sizes["int8 weight-only"] = accuracy(w8), quant.model_bytes(w8)
acc["int4 weight-only"], sizes["int4 weight-only"] = accuracy(w4), quant.model_bytes(w4)

if quant.dynamic_int8_available():
    d8 = quant.dynamic_int8(copy.deepcopy(student).cpu())   # CPU only: a copy in host memory
    acc["int8 dynamic (CPU)"] = accuracy(d8, X_test.cpu(), Y_test.cpu())
    # its weights live in packed objects that no storage count sees: compare what torch.save writes
    sizes["int8 dynamic (CPU)"] = quant.serialized_bytes(d8) * sizes["fp32"] // quant.serialized_bytes(student)
else:
    print(tr("torch.ao.quantization.quantize_dynamic does not run in this torch build; skipped"))


def in_points(p) -> str:
    """A guess in accuracy points, for guess()."""
    return tr("{p} points", p=p)


method = {"int8 weight-only": tr("int8 weight-only"), "int4 weight-only": tr("int4 weight-only"),
          "int8 dynamic (CPU)": tr("int8 dynamic (CPU)")}  # the names printed and drawn
print(tr("drops: int8 {int8}, int4 {int4}", int8=guess(prediction_int8_drop_points, in_points),
         int4=guess(prediction_int4_drop_points, in_points)))
for k in acc:
    print(f"{method.get(k, k):>20}: " + tr("accuracy {acc:5.1f}%  ({diff:+.1f} points), weights {size:>10} "
                                           "({share:.0f}% of fp32)",
                                           acc=acc[k], diff=acc[k] - acc["fp32"], size=format_bytes(sizes[k]),
                                           share=100 * sizes[k] / sizes["fp32"]))

# %%
fig, ax = plt.subplots(figsize=(5.5, 3))
for k in acc:
    ax.scatter(sizes[k] / 2**10, acc[k], s=40)
    ax.annotate(method.get(k, k), (sizes[k] / 2**10, acc[k]), textcoords="offset points", xytext=(5, -10),
                fontsize=8)
ax.set_xlabel(tr("weight bytes (KiB)"))
ax.set_ylabel(tr("test accuracy (%)"))
ax.set_xlim(0, sizes["fp32"] / 2**10 * 1.15)
ax.set_title(tr("smaller is left; better is up"))
fig.tight_layout()

# %% [markdown]
# For int8 the article's claim holds here: about a quarter of the bytes, and the accuracy moves by
# a fraction of a point (each weight is off by at most half a quantisation step, 1/254 of its row's
# largest weight). int4 has only 16 levels per group: its step is 1/14 of the group's largest
# weight, so each weight's error bound is up to 254/14, about 18 times int8's; on this small, well-conditioned model it still cost little, because the groups of 64
# keep the scales local. That is a measurement on *this* model: "without compromising accuracy" is
# a property of a format, a quantisation method *and* a model, and must be checked as here, on
# held-out data, for each model you quantise.

# %%
drop8 = acc["fp32"] - acc["int8 weight-only"]
assert acc["fp32"] > 80, acc  # the model learned something worth keeping
assert drop8 < 2.0, drop8
assert sizes["int8 weight-only"] <= 0.30 * sizes["fp32"], sizes
if "int8 dynamic (CPU)" in acc:
    assert acc["fp32"] - acc["int8 dynamic (CPU)"] < 2.0, acc
    assert sizes["int8 dynamic (CPU)"] <= 0.30 * sizes["fp32"], sizes
assert acc["int4 weight-only"] > 100 / C + 20  # still far better than chance

# %% [markdown]
# ## 3. Pruning: what zeros cost
#
# *Unstructured* pruning sets the individual weights with the smallest magnitude to zero
# (`torch.nn.utils.prune.l1_unstructured`). *Structured* pruning removes whole hidden units: a row
# of one weight matrix and the matching column of the next.
#
# **Predict.** After pruning 90% of the weights to zero, what fraction of the original bytes does
# the model take on the device?

# %%
prediction_fraction_after_90pct_pruning = None  # your guess: bytes as a fraction of dense

# %%
amounts = [0.5, 0.9]
unstructured = {}
for a in amounts:
    pruned = prune.prune_unstructured(student, a)
    before = dev.allocated()
    dev.put(pruned)
    unstructured[a] = (prune.sparsity(pruned), dev.allocated() - before, accuracy(pruned))
    del pruned
    dev.cleanup()

# the same pruning *while attached* (before prune.remove): weight_orig + weight_mask + weight
attached = prune.attach_unstructured(copy.deepcopy(student).cpu(), 0.9)
before = dev.allocated()
dev.put(attached)            # moves weight_orig (a parameter) and weight_mask (a buffer)
with dev.measure():
    attached(X_test[:1])     # the forward pre-hook rebuilds weight = weight_orig * weight_mask, on the device
attached_bytes = dev.allocated() - before
del attached
dev.cleanup()

dense_bytes = quant.model_bytes(student)
for a, (sp, nbytes, ac) in unstructured.items():
    print(tr("unstructured {amount:.0%}: {zeros:.0%} zeros, {size} on the device ({share:.2f} of dense), "
             "accuracy {acc:.1f}%",
             amount=a, zeros=sp, size=format_bytes(nbytes), share=nbytes / dense_bytes, acc=ac))
print(tr("90% pruning still attached: {size} ({share:.2f} of dense)",
         size=format_bytes(attached_bytes), share=attached_bytes / dense_bytes))
print(tr("after 90% pruning: {guess}; measured {measured:.2f}",
         guess=guess(prediction_fraction_after_90pct_pruning, lambda p: tr("{p:.2f} of dense", p=p)),
         measured=unstructured[0.9][1] / dense_bytes))

# %% [markdown]
# The zeros are still stored: a dense float32 tensor spends 4 bytes on a 0.0 as on any other
# number. (And without a fine-tune, accuracy does suffer: compare the 90% line with the trained
# model's accuracy above.) Worse, *while* pruning is attached, each layer holds the original weight, a mask of the
# same shape and the masked weight: about three times the bytes. The savings come only from a
# format that skips zeros. A sparse layout stores the non-zero values *and their positions*; CSR
# with 64-bit column indices spends 4 + 8 = 12 bytes per non-zero float32, so it is smaller than
# dense only when fewer than a third of the entries are non-zero:

# %%
layer = copy.deepcopy(student[2]).cpu()  # the trained 512 x 512 middle layer
densities = [0.05, 0.1, 0.2, 1 / 3, 0.5, 0.75, 1.0]
csr_ratio = []
for d in densities:
    w = prune.prune_unstructured(nn.Sequential(layer), 1 - d)[0].weight
    csr_ratio.append(prune.sparse_bytes(w) / (w.numel() * w.element_size()))
fig, ax = plt.subplots(figsize=(5, 2.8))
ax.plot(densities, csr_ratio, "o-", label=tr("CSR bytes / dense bytes"))
ax.axhline(1.0, color="#888", ls=":")
ax.axvline(prune.csr_break_even_density(), color="#e15759", ls="--", label=tr("break-even density 1/3"))
ax.set_xlabel(tr("fraction of non-zero weights"))
ax.set_ylabel(tr("relative size"))
ax.legend(fontsize=8)
fig.tight_layout()
for d, r in zip(densities, csr_ratio):
    print(tr("density {d:.2f}: CSR takes {r:.2f} x the dense bytes", d=d, r=r))

# %% [markdown]
# Structured pruning makes the matrices themselves smaller. Removing half of the hidden units of
# the trained student (`prune.prune_neurons`, by the norm of each unit's incoming weights) gives a
# dense model with about a quarter of the middle layer's weights and half of the others'. Its
# accuracy drops at first; a short fine-tune (two epochs) recovers most of it.

# %%
small = dev.put(prune.prune_neurons(student, 0.5))
acc_pruned = accuracy(small)
train(small, epochs=2)
acc_tuned = accuracy(small)
small_bytes = quant.model_bytes(small)
print(tr("structured 50%: {size} ({share:.2f} of dense); ", size=format_bytes(small_bytes),
         share=small_bytes / dense_bytes)
      + tr("accuracy {trained:.1f}% -> {pruned:.1f}% right after pruning -> {tuned:.1f}% after 2 epochs",
           trained=acc["fp32"], pruned=acc_pruned, tuned=acc_tuned))

# %% [markdown]
# So the article's sentence holds only with its fine print: unstructured pruning **by itself**
# does not reduce memory at all (it needs a sparse format, and then only at high sparsity, or
# hardware that exploits a fixed pattern, such as the 2:4 sparsity of recent NVIDIA GPUs);
# structured pruning does, at an accuracy cost that a fine-tune must buy back.

# %%
sp90, bytes90, acc90 = unstructured[0.9]
assert sp90 > 0.85
assert abs(bytes90 - dense_bytes) <= 0.01 * dense_bytes  # 90% zeros, the same dense bytes
assert attached_bytes > 1.9 * dense_bytes  # attached pruning holds more, not less
assert csr_ratio[densities.index(0.5)] > 1.0 and csr_ratio[densities.index(0.1)] < 0.5
assert small_bytes < 0.6 * dense_bytes
assert acc_tuned > acc['fp32'] - 5.0, (acc_tuned, acc['fp32'])

# %% [markdown]
# ## Exercises
#
# 1. A 7-billion-parameter model: how many GiB are its weights in bf16, in int8, in int4 with
#    groups of 128 (float16 scales)? Use `quant.bytes_per_parameter`.
# 2. Quantise the student with `quant.quantize_weights(student, bits=4, group_size=16)`. What
#    happens to its bytes and its accuracy, compared with groups of 64?
# 3. Why does `QuantLinear.forward` still need a full-precision temporary, and how large is it
#    for the largest layer here?
#
# <details><summary>Solutions</summary>
#
# 1. `7e9 * quant.bytes_per_parameter("bf16") / 2**30` = 13.0 GiB; int8 6.5 GiB (plus its row
#    scales, negligible); int4 with groups of 128 and 2-byte scales:
#    `7e9 * quant.bytes_per_parameter("int4", group_size=128, scale_bytes=2) / 2**30` = 3.4 GiB.
# 2. Smaller groups mean more scales (4/16 = 0.25 extra bytes per parameter: 0.75 in all) and a
#    smaller error, so accuracy moves back towards fp32's: memory buys accuracy.
# 3. It dequantises the whole weight (`dequantize()`) before the matrix product: a float32 copy
#    of one layer at a time, 512 x 512 x 4 bytes = 1 MiB here. Fused int8/int4 kernels (torchao,
#    bitsandbytes) read the packed weights directly and never build it.
#
# </details>
