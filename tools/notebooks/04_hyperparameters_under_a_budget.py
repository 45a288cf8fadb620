# %% [markdown]
# # 04 · Hyper-parameters under a memory budget
#
# **Claim (curriculum A6).** "With more VRAM you can try larger models and more complex
# hyper-parameters, such as higher resolution in image processing; limited memory restricts the
# search." We measure how memory grows with each knob (width, depth, image resolution, sequence
# length), then draw the region of a hyper-parameter grid that fits a budget, and see how far mixed
# precision and gradient checkpointing push its border.
#
# Lesson 02 showed that memory is linear in the batch size; here the batch is fixed and the model
# changes. Without a CUDA GPU the device is a virtual card of 256 MiB, small enough that the CPU
# reaches its border within seconds. On a real card the curves should keep their shape (not yet
# checked on one: vramlab's GPU runs are reported in `docs/gpu-runs/`).

# %%
import matplotlib.pyplot as plt
import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

import vramlab
from vramlab import format_bytes
from vramlab.lessons.hparams import ConvNet, feasible_grid, naive_attention, polyfit

torch.manual_seed(0)
dev = vramlab.pick_device(virtual="256MiB")
LARGE = dev.large  # the one size switch: larger knobs and a larger budget on a big GPU
MiB = 2**20
BUDGET = 4096 * MiB if LARGE else 256 * MiB   # the budget of section 4 (on CUDA, a nominal one)
device_type = "cuda" if dev.is_cuda else "cpu"
print(dev)
print(f"budget for the grid of section 4: {format_bytes(BUDGET)}")


def train_peak(build, make_batch, amp: bool = False) -> int:
    """The peak bytes of building a model and running one training step (forward, backward) on it."""
    with dev.measure() as m:
        model = dev.put(build())
        x, y = make_batch()
        with torch.autocast(device_type, dtype=torch.bfloat16, enabled=amp):
            loss = F.cross_entropy(model(x), y)
        loss.backward()
    return m.peak


# %% [markdown]
# ## 1. Width and depth
#
# A multi-layer perceptron with `depth` hidden layers of `width` units, batch 64. A hidden layer
# has `width x width` weights but only `batch x width` activations.
#
# **Predict.** Doubling the depth multiplies the peak by about what? Doubling the width?

# %%
prediction_depth_x2, prediction_width_x2 = 2.0, 2.0  # edit me

# %%
B = 64


def mlp(width: int, depth: int) -> nn.Module:
    layers, d = [], 784
    for _ in range(depth):
        layers += [nn.Linear(d, width), nn.ReLU()]
        d = width
    return nn.Sequential(*layers, nn.Linear(d, 10))


def mlp_batch():
    return torch.randn(B, 784, device=dev.device), torch.randint(0, 10, (B,), device=dev.device)


depths = [1, 2, 3, 4, 6, 8]
widths = [256, 512, 768, 1024, 1536, 2048] if LARGE else [128, 256, 384, 512, 768, 1024]
peak_depth = [train_peak(lambda: mlp(512, d), mlp_batch) for d in depths]
peak_width = [train_peak(lambda: mlp(w, 4), mlp_batch) for w in widths]
fit_depth = polyfit(depths, peak_depth, 1)
fit_width = polyfit(widths, peak_width, 2)
print(f"depth: peak = {fit_depth.coeffs[1] / MiB:.2f} MiB + {fit_depth.coeffs[0] / MiB:.2f} MiB x depth "
      f"(R² {fit_depth.r2:.5f})")
a, b, c = fit_width.coeffs
print(f"width: peak = {c / MiB:.2f} MiB + {b / 1024:.1f} KiB x w + {a:.1f} B x w²  (R² {fit_width.r2:.5f})")
print(f"doubling depth 4 -> 8: x{peak_depth[-1] / peak_depth[3]:.2f} (predicted x{prediction_depth_x2}); "
      f"doubling width {widths[3]} -> {widths[5]}: "
      f"x{peak_width[5] / peak_width[3]:.2f} (predicted x{prediction_width_x2})")

# %%
fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(9, 3))
ax1.plot(depths, np.array(peak_depth) / MiB, "o", label="measured")
ax1.plot(depths, fit_depth(depths) / MiB, "-", label=f"linear fit, R² {fit_depth.r2:.4f}")
ax1.set_xlabel("depth (hidden layers of 512)")
ax1.set_ylabel("peak MiB")
ax1.legend(fontsize=8)
ax2.plot(widths, np.array(peak_width) / MiB, "o", label="measured")
ws = np.linspace(widths[0], widths[-1], 50)
ax2.plot(ws, fit_width(ws) / MiB, "-", label=f"quadratic fit, R² {fit_width.r2:.4f}")
ax2.set_xlabel("width (4 hidden layers)")
ax2.legend(fontsize=8)
fig.tight_layout()

# %% [markdown]
# Depth adds the same cost per layer: weights, their gradients and the layer's activations, so the
# peak is a straight line. Width enters squared through the weights and linearly through the
# activations; at this batch the weights win, so doubling the width nearly quadruples the
# weight-bound part. (With a large batch or long sequences the activations dominate instead, and
# width costs closer to linearly.)

# %%
assert fit_depth.r2 > 0.99, fit_depth
assert fit_width.r2 > 0.99 and a > 0, fit_width
assert a * widths[-1] ** 2 > b * widths[-1]  # at the largest width the w² term dominates
assert peak_width[5] / peak_width[3] > 2.5  # width doubled: more than double the memory

# %% [markdown]
# ## 2. Image resolution
#
# A small CNN (`ConvNet`: three conv-BatchNorm-ReLU-pool blocks) at batch 8, on square images of
# side `S`. Each conv layer's output has `channels x S x S` values per image.
#
# **Predict.** Doubling the side from 64 to 128: the activation memory is multiplied by?

# %%
prediction_side_x2 = 2.0  # edit me

# %%
sides = [64, 96, 128, 160, 192, 256] if LARGE else [32, 64, 96, 128, 160]


def image_batch(side: int, b: int = 8):
    return (torch.randn(b, 3, side, side, device=dev.device), torch.randint(0, 10, (b,), device=dev.device))


peak_side = [train_peak(lambda: ConvNet(1), lambda: image_batch(s)) for s in sides]
fit_side = polyfit(np.square(sides), peak_side, 1)
fixed = fit_side.coeffs[1]
ratio_side = (peak_side[sides.index(128)] - fixed) / (peak_side[sides.index(64)] - fixed)
print(f"peak = {fixed / MiB:.2f} MiB + {fit_side.coeffs[0]:.0f} B x side²  (R² {fit_side.r2:.5f})")
print(f"side 64 -> 128: activations x{ratio_side:.2f} (predicted x{prediction_side_x2})")

fig, ax = plt.subplots(figsize=(5, 3))
ax.plot(sides, np.array(peak_side) / MiB, "o", label="measured")
ss = np.linspace(sides[0], sides[-1], 50)
ax.plot(ss, fit_side(ss ** 2) / MiB, "-", label=f"a + b·side², R² {fit_side.r2:.4f}")
ax.set_xlabel("image side (pixels)")
ax.set_ylabel("peak MiB")
ax.legend(fontsize=8)
fig.tight_layout()

# %%
assert fit_side.r2 > 0.99, fit_side
assert 3.5 < ratio_side < 4.5, ratio_side  # twice the side, four times the pixels

# %% [markdown]
# ## 3. Sequence length: attention, written out and fused
#
# A transformer's attention compares every token with every other (here one sequence, two heads of 64): for a sequence of `T` tokens
# the score matrix has `T x T` entries per head. Written out (`softmax(q kᵀ) v`), that matrix and
# its softmax are stored for backward. Fused kernels (`F.scaled_dot_product_attention`: flash or
# memory-efficient attention on CUDA, a flash-style kernel on CPU) compute it in tiles and never
# store it.
#
# **Predict.** From T = 1024 to 2048, by what factor does the peak grow, written out and fused?

# %%
prediction_naive_x2, prediction_fused_x2 = 4.0, 4.0  # edit me

# %%
lengths = [512, 1024, 2048, 4096] if LARGE else [256, 512, 1024, 2048]
heads, head_dim = 2, 64


def attention_peak(fn, T: int) -> int:
    with dev.measure() as m:
        q, k, v = (torch.randn(1, heads, T, head_dim, device=dev.device, requires_grad=True) for _ in range(3))
        fn(q, k, v).sum().backward()
    return m.peak


peak_naive = [attention_peak(naive_attention, T) for T in lengths]
peak_fused = [attention_peak(F.scaled_dot_product_attention, T) for T in lengths]
fit_naive = polyfit(lengths, peak_naive, 2)
fit_fused = polyfit(lengths, peak_fused, 1)
x2_naive, x2_fused = peak_naive[-1] / peak_naive[-2], peak_fused[-1] / peak_fused[-2]
for T, pn, pf in zip(lengths, peak_naive, peak_fused):
    print(f"T = {T:>5}: written out {format_bytes(pn):>11}   fused {format_bytes(pf):>11}")
print(f"doubling T: written out x{x2_naive:.2f} (predicted x{prediction_naive_x2}), "
      f"fused x{x2_fused:.2f} (predicted x{prediction_fused_x2})")

fig, ax = plt.subplots(figsize=(5, 3))
ax.plot(lengths, np.array(peak_naive) / MiB, "o-", label="written out: T² scores stored")
ax.plot(lengths, np.array(peak_fused) / MiB, "s-", label="scaled_dot_product_attention")
ax.set_xlabel("sequence length T")
ax.set_ylabel("peak MiB")
ax.legend(fontsize=8)
fig.tight_layout()

# %% [markdown]
# Written out, attention is quadratic: doubling the context nearly quadruples its memory. With a
# fused kernel the same computation grows linearly: the claim that "attention is quadratic in
# memory" is true of the textbook formula, not of the kernels that current frameworks use by
# default. (Its *compute* is still quadratic.)

# %%
assert fit_naive.r2 > 0.99 and fit_naive.coeffs[0] > 0
assert x2_naive > 3.0, x2_naive
assert x2_fused < 2.5, x2_fused

# %% [markdown]
# ## 4. The feasible region of a grid, and what widens it
#
# A hyper-parameter search over two knobs of the CNN: image side (32 to 256 pixels) and width
# multiplier (1 to 4: 16 to 64 channels in the first block), batch 16. Each point of the grid is
# one measured training step; a point is feasible when its peak fits the budget (on the virtual card
# the budget *is* the card, so the step that does not fit raises `torch.OutOfMemoryError`, caught by
# `feasible_grid`). Then the same grid with mixed precision (`torch.autocast` with bf16) and with
# gradient checkpointing of each block (`ConvNet(checkpoint=True)`).
#
# **Predict.** Of the 32 points, how many fit in fp32? With mixed precision? With checkpointing?

# %%
prediction_counts = {"fp32": 16, "bf16 autocast": 24, "checkpointing": 24}  # edit me

# %%
grid_sides = [64, 128, 192, 256, 320, 384, 448, 512] if LARGE else [32, 64, 96, 128, 160, 192, 224, 256]
grid_widths = [1, 2, 3, 4]
variants = {"fp32": dict(amp=False, ckpt=False), "bf16 autocast": dict(amp=True, ckpt=False),
            "checkpointing": dict(amp=False, ckpt=True)}
grids = {}
for name, v in variants.items():
    grids[name] = feasible_grid(
        lambda side, width: train_peak(lambda: ConvNet(width, checkpoint=v["ckpt"]),
                                       lambda: image_batch(side, 16), amp=v["amp"]),
        grid_sides, grid_widths, BUDGET)
    dev.cleanup()
for name, g in grids.items():
    print(f"{name:<14} {g.count:>2} of {len(grid_sides) * len(grid_widths)} points fit "
          f"(predicted {prediction_counts[name]}); largest side per width {g.frontier()}")

# %%
fig, axes = plt.subplots(1, 3, figsize=(9.5, 3.2), sharey=True)
for ax, (name, g) in zip(axes, grids.items()):
    img = np.array([[(p or np.nan) / MiB for p in row] for row in g.peak])
    ax.imshow(np.where(g.feasible, 1.0, 0.0), origin="lower", cmap="RdYlGn", vmin=-0.3, vmax=1.3, aspect="auto")
    for i in range(len(grid_sides)):
        for j in range(len(grid_widths)):
            if not np.isnan(img[i, j]):
                ax.text(j, i, f"{img[i, j]:.0f}", ha="center", va="center", fontsize=6)
    ax.set_xticks(range(len(grid_widths)), [f"x{w}" for w in grid_widths])
    ax.set_title(f"{name}: {g.count} fit", fontsize=9)
    ax.set_xlabel("width multiplier")
axes[0].set_yticks(range(len(grid_sides)), grid_sides)
axes[0].set_ylabel("image side")
fig.suptitle(f"green: fits {format_bytes(BUDGET)} (numbers: peak MiB; blank: not run or out of memory)", fontsize=9)
fig.tight_layout()

# %% [markdown]
# Both techniques widen the region, by different amounts and for different reasons:
#
# - **Mixed precision** stores the activations in bf16, half the bytes, so for activation-bound
#   points nearly twice the pixels fit. The fp32 weights stay, and autocast adds bf16 copies of them
#   (lesson 07), so weight-bound points gain less.
# - **Gradient checkpointing** keeps only each block's input and recomputes the block during
#   backward: the other blocks' activations are not stored. But the most expensive block (the
#   first, at full resolution) is still materialised while it is recomputed, so with three
#   blocks the saving is modest here. Finer checkpoints (per layer) save more, at about one extra
#   forward pass of compute.
#
# So the article is right that memory restricts the search, and it matters *which* knob you turn:
# width costs quadratically in weights, resolution quadratically in activations, context length
# quadratically only in a written-out attention. And "more VRAM" is not the only way to enlarge
# the search: the same card holds a larger grid with bf16 or checkpointing, paid for in precision
# or in compute.

# %%
n_fp32, n_amp, n_ckpt = (grids[k].count for k in variants)
assert 0 < n_fp32 < len(grid_sides) * len(grid_widths)  # the budget cuts the grid
assert n_amp > n_fp32, (n_amp, n_fp32)
assert n_ckpt > n_fp32, (n_ckpt, n_fp32)
assert all(a >= b for a, b in zip(grids["bf16 autocast"].frontier(), grids["fp32"].frontier()) if b)

# %% [markdown]
# ## Exercises
#
# 1. From the fit of section 2, estimate the largest image side that fits the 256 MiB card for
#    `ConvNet(1)` at batch 8. Check it with one measured step.
# 2. In section 3, the written-out attention at T = 2048 stores how many bytes of scores and
#    softmax? Compare with the measured peak.
# 3. Combine bf16 autocast *and* checkpointing in the grid. Do the gains add up?
#
# <details><summary>Solutions</summary>
#
# 1. Solve `fixed + b·S² = 256 MiB` for `S` with `fixed, b = fit_side.coeffs[1], fit_side.coeffs[0]`:
#    `S = ((256 * MiB - fixed) / b) ** 0.5`, about 290 pixels; `train_peak(lambda: ConvNet(1),
#    lambda: image_batch(288))` confirms it within a few percent.
# 2. Scores and softmax: 1 (batch) x 2 (heads) x 2048² x 4 bytes = 32 MiB each, 64 MiB in all,
#    plus their gradients during backward: the measured peak is of that order, which is why the
#    T² term dominates the fit.
# 3. Roughly: checkpointing removes the stored activations of the later blocks, autocast halves
#    what is left. Run `feasible_grid` with both `amp=True` and `checkpoint=True` and compare the
#    counts.
#
# </details>
