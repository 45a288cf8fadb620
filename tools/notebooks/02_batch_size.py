# %% [markdown]
# # 02 · Batch size: memory, iterations per epoch, and gradient noise
#
# Terms are explained in the [glossary](../docs/glossary.md); the claim ids (A1, B6, …) are those of
# [`docs/claims.md`](../docs/claims.md).
#
# **Claims (curriculum A2, A3).** More GPU memory allows larger batches, and larger batches mean
# fewer iterations per epoch (A2). Larger batches give more stable gradient estimates and, the
# article says, faster convergence (A3). We measure each part, and say where the picture is more
# subtle than the claim.
#
# Lesson 01 found the memory wall by doubling the batch. Here we look at the line that leads to
# it. The device is a CUDA GPU when there is one, else a virtual T4 (a 16 GB card that reports 15 GiB) on the CPU.

# %%
import math

import matplotlib.pyplot as plt
import numpy as np
import torch

import vramlab
from vramlab.i18n import N_, tr
from vramlab.lessons.predict import guess
from vramlab import format_bytes

torch.manual_seed(0)
dev = vramlab.pick_device(virtual="T4")
LARGE = dev.large
print(dev)

# %% [markdown]
# ## 1. Peak memory is a straight line in the batch size
#
# A small convolutional network on 28×28 images. One training step (forward, backward, Adam
# step) is measured at several batch sizes.
#
# **Predict.** Is the peak proportional to the batch, or is there a fixed part? What is it made of?

# %%
prediction = None  # your guess, in words: proportional, or a fixed part plus a per-sample part?


def build_model() -> torch.nn.Module:
    return torch.nn.Sequential(
        torch.nn.Conv2d(1, 16, 3, padding=1), torch.nn.ReLU(),
        torch.nn.Conv2d(16, 32, 3, padding=1), torch.nn.ReLU(),
        torch.nn.MaxPool2d(2), torch.nn.Flatten(),
        torch.nn.Linear(32 * 14 * 14, 128), torch.nn.ReLU(),
        torch.nn.Linear(128, 10),
    )


def make_batch(b: int, device=dev.device):
    return torch.randn(b, 1, 28, 28, device=device), torch.randint(0, 10, (b,), device=device)


model = dev.put(build_model())
opt = torch.optim.Adam(model.parameters(), lr=1e-3)


def train_step(b: int) -> None:
    x, y = make_batch(b)
    loss = torch.nn.functional.cross_entropy(model(x), y)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()


with dev.measure():
    train_step(2)  # the first step creates Adam's state on the device: part of the fixed cost from now on
sizes = [32, 64, 96, 128, 192, 256] if not LARGE else [256, 512, 768, 1024, 1536, 2048]
peaks = []
for b in sizes:
    with dev.measure() as m:
        train_step(b)
    peaks.append(m.peak)
slope, fixed = np.polyfit(sizes, peaks, 1)
pred = fixed + slope * np.array(sizes)
r2 = 1 - ((np.array(peaks) - pred) ** 2).sum() / ((np.array(peaks) - np.mean(peaks)) ** 2).sum()
param_bytes = sum(p.numel() * 4 for p in model.parameters())
print(tr("peak ≈ {fixed} + {slope} × batch   (R² = {r2:.5f})",
         fixed=format_bytes(fixed), slope=format_bytes(slope), r2=r2))
print(tr("parameters {params}; with gradients and Adam's two moments: {total}",
         params=format_bytes(param_bytes), total=format_bytes(4 * param_bytes)))

# %%
fig, ax = plt.subplots(figsize=(5, 3))
ax.plot(sizes, np.array(peaks) / 2**20, "o", label=tr("measured peak"))
ax.plot(sizes, pred / 2**20, "-",
        label=tr("fit: {fixed:.1f} MiB + {slope:.0f} KiB × B", fixed=fixed / 2**20, slope=slope / 2**10))
ax.set_xlabel(tr("batch size"))
ax.set_ylabel("MiB")
ax.legend()
fig.tight_layout()

# %% [markdown]
# The fixed part is the model's state: parameters, their gradients and Adam's two moment tensors,
# four copies of the parameters, plus the optimizer step's temporaries. The per-sample part is
# what one sample adds: its input, the activations kept for backward, and their gradients.

# %%
assert r2 > 0.99, r2
assert fixed > 0.9 * 4 * param_bytes  # the fixed part holds the four copies of the parameters
assert slope > 0

# %% [markdown]
# ## 2. The largest batch on several GPUs, and iterations per epoch
#
# If the line holds, the largest batch on a card is `(usable memory − fixed) / per-sample`. We
# check the line against an exact search on a small virtual card first, then extrapolate to real
# GPUs and check the extrapolation with `vramlab.estimate`, which runs the same step under
# PyTorch's `FakeTensorMode`: shapes and bytes, no real memory and no arithmetic.
#
# Here the search and the estimate count exact bytes (`allocator="exact"`): tensors only, with no
# caching allocator and its segments. To compare like with like, the line they are checked against
# is measured the same way, on a virtual card, whatever device this lesson runs on. A real card
# hands out memory in the caching allocator's segments, so its largest batch is a little smaller:
# the virtual GPU models that allocator by default, and the last line of the output shows what it
# costs on the small card. On a real GPU the line of section 1 is also higher by cuBLAS's and
# cuDNN's workspaces.

# %%
# NBVAL_IGNORE_OUTPUT
card = "256MiB"


def fresh_step(b: int) -> None:
    m = build_model()
    o = torch.optim.Adam(m.parameters(), lr=1e-3)
    for _ in range(2):  # two steps: the second has Adam's state
        x, y = make_batch(b, device="cpu")
        loss = torch.nn.functional.cross_entropy(m(x), y)
        o.zero_grad(set_to_none=True)
        loss.backward()
        o.step()


virtual_peaks = []
for b in sizes:
    with vramlab.VirtualGPU("64GiB", round_blocks=True, allocator="exact") as g:
        fresh_step(b)
        virtual_peaks.append(g.peak)
v_slope, v_fixed = np.polyfit(sizes, virtual_peaks, 1)
search = vramlab.find_max_batch_size(fresh_step, device=vramlab.VirtualGPU(card, round_blocks=True,
                                                                          allocator="exact"))
cached = vramlab.find_max_batch_size(fresh_step, device=card)  # the default: PyTorch's caching allocator
budget = vramlab.parse_size(card)
predicted = math.floor((budget - v_fixed) / v_slope)
print(search.text())
print("\n" + tr("the line on the virtual card: {fixed} + {slope} × batch ", fixed=format_bytes(v_fixed),
                 slope=format_bytes(v_slope))
      + tr("(section 1's, on {kind}: {fixed} + {slope} × batch)", kind=dev.kind, fixed=format_bytes(fixed),
           slope=format_bytes(slope)))
print(tr("it predicts {predicted}; the exact search found {found} in {trials} trials",
         predicted=predicted, found=search.max_batch_size, trials=search.num_trials))
print(tr("with the caching allocator's segments, as on a card: {n}", n=cached.max_batch_size))

# %%
assert abs(predicted - search.max_batch_size) <= 0.03 * search.max_batch_size
assert search.num_trials <= 2 * math.log2(search.max_batch_size) + 2
assert cached.max_batch_size <= search.max_batch_size  # segments never hold less than their tensors

# %%
from vramlab.sim.presets import get_preset

dataset = 1_281_167  # samples per epoch: the size of ImageNet-1k's training set
rows = []
for name in ["RTX 4060 Laptop", "T4", "L4", "A100-80GB", "H200"]:
    p = get_preset(name)
    b_max = math.floor((p.usable - v_fixed) / v_slope)  # the virtual line: the estimate's accounting
    est_in = vramlab.estimate(build_model, lambda b: make_batch(b, device="cpu"), batch_size=int(b_max * 0.99),
                              optimizer="adam", device=name, allocator="exact")
    est_out = vramlab.estimate(build_model, lambda b: make_batch(b, device="cpu"), batch_size=int(b_max * 1.01),
                               optimizer="adam", device=name, allocator="exact")
    rows.append((p.name, p.datasheet_memory, p.usable, b_max, math.ceil(dataset / b_max), est_in.fits, est_out.fits))
print(f"{'GPU':<18}{tr('datasheet'):>11}{tr('usable'):>12}{tr('largest batch'):>15}{tr('iterations/epoch'):>18}  "
      + tr("estimate fits at 0.99 B, at 1.01 B"))
for name, sheet, usable, b, it, fit_in, fit_out in rows:
    sheet_gb = f"{sheet // 2**30} GB"  # the datasheet's "GB", which is GiB of DRAM
    print(f"{name:<18}{sheet_gb:>11}{format_bytes(usable):>12}{b:>15,}{it:>18,}  {fit_in}, {fit_out}")
print(tr("usable: the total the card reports (nvidia-smi, cited in vramlab.sim.presets) minus the modelled "
         "CUDA context ({contexts}: a figure published under torch 2.x where one was found, else assumed); not "
         "yet read on a card by vramlab",
         contexts=", ".join(f"{p.name} {format_bytes(p.context_overhead)}"
                            for p in map(get_preset, ["T4", "A100-80GB", "H200"]))))

# %% [markdown]
# A card with 10× the memory runs a 10× larger batch of this model, and so needs a tenth of the
# iterations per epoch. That last step is arithmetic (iterations = ⌈samples / batch⌉), not a
# measurement. Whether the larger batch trains *better* is the question of sections 3 and 4. The
# measured part is the largest batch. The estimate agrees with the line on every card, to within
# 1% of the batch, even hundreds of times beyond the batches we measured. One detail shows in the
# exact search's table: below about 20 samples the peak stops falling. There the highest moment of
# the step is Adam's update (its temporaries), not the backward pass, and the line holds only above
# that plateau.

# %%
assert all(r[5] and not r[6] for r in rows)  # the estimate fits at 0.99 of the line's batch, not at 1.01

# %% [markdown]
# ## 3. Gradient noise against the batch
#
# A mini-batch gradient is an average of per-sample gradients. How far does it stray from the
# full-data gradient, and how does that depend on the batch? We measure its variance on a linear
# regression, where per-sample gradients are cheap to write down.
#
# **Predict.** Going from batch 16 to batch 256 (16×), how much does the variance fall?

# %%
prediction_ratio = None  # your guess: how many times smaller

# %%
g = torch.Generator().manual_seed(1)
N, d = 20_000, 32
X = torch.randn(N, d, generator=g)
y = X @ torch.randn(d, generator=g) + 0.5 * torch.randn(N, generator=g)
w = torch.zeros(d)
per_sample = 2 * (X @ w - y)[:, None] * X  # ∂/∂w of (x·w − y)² for every sample
full = per_sample.mean(0)
batch_sizes = [4, 16, 64, 256, 1024]
variances = []
for b in batch_sizes:
    idx = torch.randint(0, N, (500, b), generator=g)
    mini = per_sample[idx].mean(1)
    variances.append(((mini - full) ** 2).sum(1).mean().item())
slope_var = np.polyfit(np.log(batch_sizes), np.log(variances), 1)[0]
print(tr("variance falls {ratio:.1f}x from B=16 to B=256 ({guess}); log-log slope {slope:.3f}",
         ratio=variances[1] / variances[3], guess=guess(prediction_ratio, "{}x"), slope=slope_var))
fig, ax = plt.subplots(figsize=(5, 3))
ax.loglog(batch_sizes, variances, "o-", label=tr("measured"))
ax.loglog(batch_sizes, variances[0] * batch_sizes[0] / np.array(batch_sizes), "--", label="1/B")
ax.set_xlabel(tr("batch size"))
ax.set_ylabel("E‖g_B − g‖²")
ax.legend()
fig.tight_layout()

# %% [markdown]
# The variance falls as 1/B: an average of B independent per-sample gradients has 1/B of one
# sample's variance, a slope of −1 on the log-log plot (the dashed line). Sixteen times the batch
# gives about sixteen times less noise. Less noise per step is not the same as faster training,
# which is the next section's question.

# %%
assert -1.15 < slope_var < -0.85, slope_var

# %% [markdown]
# ## 4. Loss per step and per epoch
#
# Now the same small network trained with batch 16 and with batch 256, same learning rate, same
# data, two epochs, on a synthetic task (two overlapping classes in 20 dimensions).
#
# **Predict.** Which reaches the lower loss after the same number of *epochs*? After the same
# number of *steps*?

# %%
prediction_per_epoch, prediction_per_step = None, None  # your guesses: "B=16", "B=256" or "the same"

# %%
g = torch.Generator().manual_seed(2)
n, dim = 8192, 20
Xc = torch.randn(n, dim, generator=g)
yc = (Xc[:, :5].sum(1) + 0.8 * torch.randn(n, generator=g) > 0).long()


def train(batch: int, epochs: int = 2, lr: float = 0.05):
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(dim, 64), torch.nn.ReLU(), torch.nn.Linear(64, 2))
    o = torch.optim.SGD(net.parameters(), lr=lr)
    step_losses, epoch_losses = [], []
    for _ in range(epochs):
        perm = torch.randperm(n, generator=torch.Generator().manual_seed(len(epoch_losses)))
        for i in range(0, n, batch):
            j = perm[i:i + batch]
            loss = torch.nn.functional.cross_entropy(net(Xc[j]), yc[j])
            o.zero_grad()
            loss.backward()
            o.step()
            step_losses.append(loss.item())
        with torch.no_grad():
            epoch_losses.append(torch.nn.functional.cross_entropy(net(Xc), yc).item())
    return step_losses, epoch_losses


small_steps, small_epochs = train(16)
large_steps, large_epochs = train(256)
fig, (a1, a2) = plt.subplots(1, 2, figsize=(9, 3))
a1.plot(small_steps, lw=0.5, label="B=16")
a1.plot(np.arange(len(large_steps)), large_steps, lw=1.5, label="B=256")
a1.set_xlabel(tr("step"))
a1.set_ylabel(tr("batch loss"))
a1.legend()
a2.plot([1, 2], small_epochs, "o-", label="B=16")
a2.plot([1, 2], large_epochs, "o-", label="B=256")
a2.set_xlabel(tr("epoch"))
a2.set_ylabel(tr("full-data loss"))
a2.legend()
fig.tight_layout()
k = len(large_steps)
noise_small = np.std(np.diff(small_steps[k // 2:k]))
noise_large = np.std(np.diff(large_steps[k // 2:]))
at_k_small, at_k_large = np.mean(small_steps[k - 8:k]), np.mean(large_steps[-8:])
print(tr("after 2 epochs: B=16 loss {small:.3f} ({small_steps} steps), B=256 loss {large:.3f} ({large_steps} steps)",
         small=small_epochs[-1], small_steps=len(small_steps), large=large_epochs[-1], large_steps=len(large_steps)))
print(tr("at step {k}: B=16 batch loss ≈ {small:.3f}, B=256 ≈ {large:.3f}",
         k=k, small=at_k_small, large=at_k_large))
print(tr("step-to-step noise of the loss: B=16 {small:.3f}, B=256 {large:.3f}", small=noise_small, large=noise_large))


def lower(small: float, large: float) -> str:
    """Which batch size ended with the lower loss: "B=16", "B=256", or "the same" (within 10%)."""
    if abs(small - large) < 0.1 * max(small, large):
        return N_("the same")
    return "B=16" if small < large else "B=256"


print(tr("lower after the same epochs: {epochs}; lower after the same steps: {steps}",
         epochs=guess(prediction_per_epoch, answer=lower(small_epochs[-1], large_epochs[-1])),
         steps=guess(prediction_per_step, answer=lower(at_k_small, at_k_large))))

# %% [markdown]
# Per **step**, the two runs fall at about the same rate here: early in training the gradient's
# signal dwarfs its noise, so a 16× cleaner estimate buys little. What the large batch does buy is
# a far smoother curve (section 3's variance, seen as loss noise), and, on a GPU with memory to
# spare, steps that cost hardly more time than small ones: that is where "larger batches converge
# faster" is true, in wall-clock time per update. Per **epoch** the claim is wrong at a fixed
# learning rate: batch 16 makes 16× more updates from the same data and ends clearly lower. In
# practice large batches are paired with larger learning rates to catch up (exercise 2).

# %%
assert noise_large < 0.5 * noise_small  # larger batches: a more stable estimate
assert small_epochs[-1] < large_epochs[-1]  # same number of epochs: the small batch is lower

# %% [markdown]
# ## 5. Gradient accumulation: a large batch in a small budget
#
# When batch 256 does not fit, run 8 micro-batches of 32, add up their gradients (each loss
# scaled by 1/8), and step once. The update is the same; the peak is the micro-batch's.
#
# **Predict.** How does the accumulated gradient compare with the full batch's?

# %%
model.zero_grad(set_to_none=True)
xb, yb = make_batch(256)
with dev.measure() as full_m:
    torch.nn.functional.cross_entropy(model(xb), yb).backward()
full_grads = [p.grad.clone() for p in model.parameters()]
model.zero_grad(set_to_none=True)
with dev.measure() as acc_m:
    for i in range(0, 256, 32):
        (torch.nn.functional.cross_entropy(model(xb[i:i + 32]), yb[i:i + 32]) / 8).backward()
acc_grads = [p.grad.clone() for p in model.parameters()]
max_diff = max((a - b).abs().max().item() for a, b in zip(full_grads, acc_grads))
print(tr("peak: full batch {full}, 8 × 32 accumulated {accumulated}",
         full=format_bytes(full_m.peak_delta), accumulated=format_bytes(acc_m.peak_delta)))
print(tr("largest difference between the two gradients: {diff:.2e}", diff=max_diff))

# %%
assert acc_m.peak_delta < 0.5 * full_m.peak_delta
assert all(torch.allclose(a, b, rtol=1e-4, atol=1e-6) for a, b in zip(full_grads, acc_grads))

# %% [markdown]
# The gradients agree to rounding (the sums are taken in a different order), and the peak is a
# fraction of the full batch's. The price is time: 8 small steps cost more than one large one on a
# GPU, which is exactly lesson 01's throughput curve.
#
# ## Exercises
#
# 1. Switch the optimizer in section 1 to SGD without momentum. How does the fixed part change?
# 2. In section 4, train batch 256 with a learning rate 16× larger. Does it catch up per epoch?
#
# <details><summary>Solutions</summary>
#
# 1. Adam's two moment tensors go away: the fixed part drops by about twice the parameters' bytes
#    (`2 × param_bytes`), and the largest batch on every card grows accordingly.
# 2. Often much of the way (the "linear scaling rule"), until the learning rate is so large that
#    training becomes unstable; try it and plot both curves.
#
# </details>
