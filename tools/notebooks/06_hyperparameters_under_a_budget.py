# %% [markdown]
# # 06 · Hyper-parameters under a memory budget
#
# Terms are explained in the [glossary](../docs/glossary.md); the claim ids (A1, B6, …) are those of
# [`docs/claims.md`](../docs/claims.md).
#
# **Claim (curriculum A6).** "With more VRAM you can try larger models and more complex
# hyper-parameters, such as higher resolution in image processing or more sophisticated
# regularisation techniques; limited memory restricts the search." We measure how memory grows
# with each knob (width, depth, image resolution, sequence length, three regularisers), then draw
# the region of a hyper-parameter grid that fits a budget, see how far mixed precision and
# gradient checkpointing push its border, and find how finely to checkpoint.
#
# Lesson 02 showed that memory is linear in the batch size; here the batch is fixed and the model
# changes. Without a CUDA GPU the device is a virtual card of 256 MiB, small enough that the CPU
# reaches its border within seconds; it counts each tensor's bytes (`allocator="exact"`), since this
# lesson is about how the tensors grow, and leaves the caching allocator's segments to lesson 09.
# On a real card every peak also holds the cuBLAS and cuDNN workspaces and the allocator's
# rounding. So the checks compare **increments**, the difference between two measured peaks, in
# which a fixed workspace cancels, rather than ratios of absolute peaks. (Not yet run on a real card: vramlab's GPU runs are reported in `docs/gpu-runs/`.)

# %%
import matplotlib.pyplot as plt
import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

import vramlab
from vramlab import format_bytes
from vramlab.i18n import tr
from vramlab.lessons.hparams import ConvNet, checkpoint_segments, feasible_grid, naive_attention, polyfit
from vramlab.lessons.predict import guess

torch.manual_seed(0)
dev = vramlab.pick_device(virtual="256MiB", allocator="exact")  # tensors' bytes (see above)
LARGE = dev.large  # the one size switch: larger knobs and a larger budget on a big GPU
MiB = 2**20
BUDGET = 4096 * MiB if LARGE else 256 * MiB   # the budget of section 5 (on CUDA, a nominal one)
device_type = "cuda" if dev.is_cuda else "cpu"
print(dev)
print(tr("budget for the grid of section 5: {budget}", budget=format_bytes(BUDGET)))


def train_peak(build, make_batch, amp: bool = False) -> int:
    """The peak bytes of building a model and running one training step (forward, backward) on it,
    from an empty allocator cache, as in a fresh process (what one point left cached would otherwise
    change the next point's segments)."""
    dev.cleanup()
    with dev.measure() as m:
        model = dev.put(build())
        x, y = make_batch()
        with torch.autocast(device_type, dtype=torch.bfloat16, enabled=amp):
            loss = F.cross_entropy(model(x), y)
        loss.backward()
    return m.peak


# one unmeasured step first: on CUDA it creates cuBLAS's workspaces (for the forward and the backward
# thread), which stay allocated, so that every measured peak below holds them alike
train_peak(lambda: nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 2)),
           lambda: (torch.randn(4, 8, device=dev.device), torch.randint(0, 2, (4,), device=dev.device)))

# %% [markdown]
# ## 1. Width and depth
#
# A multi-layer perceptron with `depth` hidden layers of `width` units, batch 64. A hidden layer
# has `width x width` weights but only `batch x width` activations.
#
# **Predict.** Doubling the depth from 4 to 8 multiplies the peak by about what? Doubling the width?

# %%
prediction_depth_x2 = None  # your guess: the peak multiplied by what, depth 4 -> 8
prediction_width_x2 = None  # your guess: the peak multiplied by what, width doubled

# %%
B = 64


def mlp(width: int, depth: int, dropout: float = 0.0) -> nn.Module:
    layers, d = [], 784
    for _ in range(depth):
        layers += [nn.Linear(d, width), nn.ReLU()] + ([nn.Dropout(dropout)] if dropout else [])
        d = width
    return nn.Sequential(*layers, nn.Linear(d, 10))


def mlp_batch(b: int = B):
    return torch.randn(b, 784, device=dev.device), torch.randint(0, 10, (b,), device=dev.device)


depths = [1, 2, 3, 4, 6, 8]
widths = [256, 512, 768, 1024, 1536, 2048] if LARGE else [128, 256, 384, 512, 768, 1024]
peak_depth = [train_peak(lambda: mlp(512, d), mlp_batch) for d in depths]
peak_width = [train_peak(lambda: mlp(w, 4), mlp_batch) for w in widths]
fit_depth = polyfit(depths, peak_depth, 1)
fit_width = polyfit(widths, peak_width, 2)
a, b, c = fit_width.coeffs
layer_state = 2 * 4 * (512 * 512 + 512)  # one hidden layer's fp32 weights and their gradients
# increments: what each doubling adds (a fixed part, weights or workspaces, cancels)
d2, d4, d8 = (peak_depth[depths.index(d)] for d in (2, 4, 8))
inc_depth = (d8 - d4) / (d4 - d2)                       # 4 more layers against 2 more: 2 if linear
w1, w2, w4 = (peak_width[widths.index(w)] for w in (widths[1], widths[3], widths[5]))
inc_width = (w4 - w2) / (w2 - w1)                       # 2 if linear in w, 4 if quadratic
w2_share = a * widths[-1] ** 2 / (a * widths[-1] ** 2 + b * widths[-1])
print(tr("depth: peak = {fixed:.3f} MiB + {per_layer:.3f} MiB x depth (R² {r2:.5f}); ",
         fixed=fit_depth.coeffs[1] / MiB, per_layer=fit_depth.coeffs[0] / MiB, r2=fit_depth.r2)
      + tr("a hidden layer's weights and gradients: {layer:.3f} MiB", layer=layer_state / MiB))
print(tr("width: peak = {fixed:.2f} MiB + {b:.1f} KiB x w + {a:.1f} B x w²  (R² {r2:.5f}); ",
         fixed=c / MiB, b=b / 1024, a=a, r2=fit_width.r2)
      + tr("the w² term is {share:.0f}% of the width-dependent part at w = {w}", share=100 * w2_share, w=widths[-1]))
print(tr("doubling depth 4 -> 8: peak x{depth:.2f} ({guess}); ", depth=d8 / d4, guess=guess(prediction_depth_x2, "x{}"))
      + tr("doubling width {w2} -> {w4}: peak x{width:.2f} ({guess})",
           w2=widths[3], w4=widths[5], width=w4 / w2, guess=guess(prediction_width_x2, "x{}")))
print(tr("increments: depth 4 -> 8 adds x{depth:.2f} what 2 -> 4 adds (2 if linear); ", depth=inc_depth)
      + tr("width {w2} -> {w4} adds x{width:.2f} what {w1} -> {w2} adds (2 if linear, 4 if quadratic)",
           w1=widths[1], w2=widths[3], w4=widths[5], width=inc_width))

# %%
fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(9, 3))
ax1.plot(depths, np.array(peak_depth) / MiB, "o", label=tr("measured"))
ax1.plot(depths, fit_depth(depths) / MiB, "-", label=tr("linear fit, R² {r2:.4f}", r2=fit_depth.r2))
ax1.set_xlabel(tr("depth (hidden layers of 512)"))
ax1.set_ylabel(tr("peak MiB"))
ax1.legend(fontsize=8)
ax2.plot(widths, np.array(peak_width) / MiB, "o", label=tr("measured"))
ws = np.linspace(widths[0], widths[-1], 50)
ax2.plot(ws, fit_width(ws) / MiB, "-", label=tr("quadratic fit, R² {r2:.4f}", r2=fit_width.r2))
ax2.set_xlabel(tr("width (4 hidden layers)"))
ax2.set_ylabel(tr("peak MiB"))
ax2.legend(fontsize=8)
fig.tight_layout()

# %% [markdown]
# Depth adds the same cost per layer, so the peak is a straight line, and its slope is one hidden
# layer's weights and gradients (printed beside it). The activations do not show in it: at this
# batch the peak comes at the end of backward, when every gradient exists and the activations
# have been freed. Width enters
# squared through the weights and linearly through the activations. At this small batch the
# weights win (the w² share printed above), so each doubling of the width adds several times
# what the previous doubling added: the ratio printed above, which would be 4 if the weights alone
# counted. (With a large batch or long sequences the activations dominate
# instead, and width costs closer to linearly.)

# %%
assert fit_depth.r2 > 0.99, fit_depth
assert 1.9 < inc_depth < 2.1, inc_depth  # every layer costs the same
assert abs(fit_depth.coeffs[0] / layer_state - 1) < 0.05, fit_depth  # ... its weights and gradients
assert fit_width.r2 > 0.99 and a > 0, fit_width
assert w2_share > 0.5, w2_share  # at the largest width the w² term dominates
assert inc_width > 2.5, inc_width  # width doubled: the memory it adds more than doubles

# %% [markdown]
# ## 2. Image resolution
#
# A small CNN (`ConvNet`: three conv-BatchNorm-ReLU-pool blocks) at batch 8, on square images of
# side `S`. Each conv layer's output has `channels x S x S` values per image.
#
# **Predict.** Doubling the side: the activation memory is multiplied by?

# %%
prediction_side_x2 = None  # your guess: the activation memory multiplied by what, side doubled

# %%
sides = [64, 96, 128, 160, 192, 256] if LARGE else [32, 64, 96, 128, 160]


def image_batch(side: int, b: int = 8):
    return (torch.randn(b, 3, side, side, device=dev.device), torch.randint(0, 10, (b,), device=dev.device))


peak_side = [train_peak(lambda: ConvNet(1), lambda: image_batch(s)) for s in sides]
fit_side = polyfit(np.square(sides), peak_side, 1)
fixed = fit_side.coeffs[1]
s1, s2, s4 = sides[0], 2 * sides[0], 4 * sides[0]
p1, p2, p4 = (peak_side[sides.index(s)] for s in (s1, s2, s4))
ratio_side = (p4 - p2) / (p2 - p1)  # a(4s) - a(2s) = 3·a(2s), a(2s) - a(s) = 3·a(s): their ratio is a(2s) / a(s)
print(tr("peak = {fixed:.2f} MiB + {b:.0f} B x side²  (R² {r2:.5f})", fixed=fixed / MiB, b=fit_side.coeffs[0],
         r2=fit_side.r2))
print(tr("side doubled: activations x{ratio:.2f} ({guess}), from the increments "
         "{s1} -> {s2} (+{inc1}) and {s2} -> {s4} (+{inc2})",
         ratio=ratio_side, guess=guess(prediction_side_x2, "x{}"), s1=s1, s2=s2, s4=s4,
         inc1=format_bytes(p2 - p1), inc2=format_bytes(p4 - p2)))

fig, ax = plt.subplots(figsize=(5, 3))
ax.plot(sides, np.array(peak_side) / MiB, "o", label=tr("measured"))
ss = np.linspace(sides[0], sides[-1], 50)
ax.plot(ss, fit_side(ss ** 2) / MiB, "-", label=tr("a + b·side², R² {r2:.4f}", r2=fit_side.r2))
ax.set_xlabel(tr("image side (pixels)"))
ax.set_ylabel(tr("peak MiB"))
ax.legend(fontsize=8)
fig.tight_layout()

# %%
assert fit_side.r2 > 0.99, fit_side
assert 3.5 < ratio_side < 4.5, ratio_side  # twice the side, four times the pixels

# %% [markdown]
# ## 3. Sequence length: attention, written out and fused
#
# A transformer's attention compares every token with every other (here one sequence, two heads of
# 64): for a sequence of `T` tokens the score matrix has `T x T` entries per head. Written out
# (`softmax(q kᵀ) v`), that matrix and its softmax are stored for backward. Fused kernels
# (`F.scaled_dot_product_attention`: memory-efficient attention on CUDA for fp32, a flash-style
# kernel on CPU) compute it in tiles and never store it.
#
# **Predict.** When T doubles, by what factor does the memory grow, written out and fused?

# %%
prediction_naive_x2 = None  # your guess: written out, the memory multiplied by what
prediction_fused_x2 = None  # your guess: fused, the memory multiplied by what

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
# the last doubling's increment against the one before: 4 for T², 2 for T (a fixed part cancels)
x2_naive = (peak_naive[-1] - peak_naive[-2]) / (peak_naive[-2] - peak_naive[-3])
x2_fused = (peak_fused[-1] - peak_fused[-2]) / (peak_fused[-2] - peak_fused[-3])
for T, pn, pf in zip(lengths, peak_naive, peak_fused):
    print(tr("T = {T:>5}: written out {naive:>11}   fused {fused:>11}", T=T, naive=format_bytes(pn),
             fused=format_bytes(pf)))
print(tr("doubling T: written out x{naive:.2f} ({guess_naive}), fused x{fused:.2f} ({guess_fused}), "
         "from the increments",
         naive=x2_naive, guess_naive=guess(prediction_naive_x2, "x{}"),
         fused=x2_fused, guess_fused=guess(prediction_fused_x2, "x{}")))

fig, ax = plt.subplots(figsize=(5, 3))
ax.plot(lengths, np.array(peak_naive) / MiB, "o-", label=tr("written out: T² scores stored"))
ax.plot(lengths, np.array(peak_fused) / MiB, "s-", label="scaled_dot_product_attention")
ax.set_xlabel(tr("sequence length T"))
ax.set_ylabel(tr("peak MiB"))
ax.legend(fontsize=8)
fig.tight_layout()

# %% [markdown]
# Written out, attention is quadratic: each doubling of the context adds nearly four times what the
# previous one added. With a fused kernel the same computation grows linearly: the claim that
# "attention is quadratic in memory" is true of the textbook formula, not of the kernels that
# current frameworks use by default. (Its *compute* is still quadratic.)

# %%
assert fit_naive.r2 > 0.99 and fit_naive.coeffs[0] > 0
assert x2_naive > 3.0, x2_naive
assert x2_fused < 2.5, x2_fused

# %% [markdown]
# ## 4. Regularisation: which kinds cost memory
#
# The article also names "more sophisticated regularisation techniques" among what more VRAM
# allows. Regularisers work in different ways, so we measure three common ones on section 1's MLP
# (four hidden layers of 512), a full training step with AdamW, at two batch sizes:
#
# - **weight decay** (AdamW's, decoupled): the weights are shrunk in place at each step;
# - **dropout** (p = 0.1) after every hidden layer: a random mask on the activations;
# - **a moving average of the weights** (EMA, as in Polyak or SWA averaging): a second set of weights.
#
# **Predict.** Which of the three add memory, and in proportion to what: the weights or the batch?

# %%
prediction_regularisers = None  # your guess, in words: which cost memory, and in proportion to what

# %%
reg_batches = [4096, 8192] if LARGE else [1024, 2048]
hidden, n_hidden = 512, 4


def reg_peak(batch: int, dropout: float = 0.0, weight_decay: float = 0.0, ema: bool = False) -> int:
    """The peak of two training steps (the second has AdamW's state), with the model built inside."""
    torch.manual_seed(0)
    with dev.measure() as m:
        model = dev.put(mlp(hidden, n_hidden, dropout))
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=weight_decay)
        params = [p.detach() for p in model.parameters()]
        average = [p.clone() for p in params] if ema else None
        for _ in range(2):
            x, y = mlp_batch(batch)
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            if ema:
                torch._foreach_lerp_(average, params, 0.01)  # average += 0.01 (weights - average), in place
    return m.peak


regs = {"weight decay 0.1": dict(weight_decay=0.1), "dropout 0.1": dict(dropout=0.1), "EMA of the weights": dict(ema=True)}
base = {bt: reg_peak(bt) for bt in reg_batches}
extra = {name: {bt: reg_peak(bt, **kw) - base[bt] for bt in reg_batches} for name, kw in regs.items()}
param_bytes = 4 * sum(p.numel() for p in mlp(hidden, n_hidden).parameters())


def at_each_batch(sizes: dict[int, int]) -> str:
    """"<bytes> at batch <b>" for each batch size, joined by commas."""
    return ", ".join(tr("{size} at batch {b}", size=format_bytes(sizes[bt]), b=bt) for bt in reg_batches)


shown = {"EMA of the weights": tr("EMA of the weights")}  # weight decay and dropout keep their English names
print(tr("AdamW step without a regulariser: peak {peaks}; the weights are {weights}",
         peaks=at_each_batch(base), weights=format_bytes(param_bytes)))
for name, e in extra.items():
    print(f"{shown.get(name, name):<20} " + tr("adds {sizes}", sizes=at_each_batch(e)))
print(tr("dropout: {dropout} bytes per hidden activation; EMA: {ema} x the weights, at batch {b1} and {b2} ({guess})",
         dropout=", ".join(f"{extra['dropout 0.1'][bt] / (bt * hidden * n_hidden):.2f}" for bt in reg_batches),
         ema=", ".join(f"{extra['EMA of the weights'][bt] / param_bytes:.2f}" for bt in reg_batches),
         b1=reg_batches[0], b2=reg_batches[1], guess=guess(prediction_regularisers)))

# %% [markdown]
# The three differ as their mechanisms say. Weight decay rewrites the weights in place: nothing
# more is allocated, at any batch. Dropout keeps, for backward, its mask and its output for every
# hidden activation, so its cost doubles with the batch, as the activations do (on CPU the mask is
# kept as floats; CUDA's fused dropout keeps it as one byte per value, so a GPU prints fewer bytes
# per activation). The moving average costs one copy of the weights, whatever the batch.
#
# So the article's point holds for some regularisers and not others. Those that keep something
# per activation (dropout here) or per weight (averaged weights) cost memory, on the same two
# scales as sections 1 and 2; those that act on the weights in place, such as weight decay, cost
# none. Neither kind is a new sort of cost: a regulariser is another term in the activations or
# the weights.

# %%
bt1, bt2 = reg_batches
wd, drop, ema = (extra[k] for k in regs)
assert abs(wd[bt1]) < 0.01 * base[bt1] and abs(wd[bt2]) < 0.01 * base[bt2], wd  # weight decay: nothing
assert drop[bt1] > bt1 * hidden * n_hidden, drop  # dropout: at least a byte per hidden activation
assert 1.8 < drop[bt2] / drop[bt1] < 2.2, drop  # ... and in proportion to the batch
assert all(0.95 < ema[bt] / param_bytes < 1.05 for bt in reg_batches), ema  # EMA: one copy of the weights

# %% [markdown]
# ## 5. The feasible region of a grid, and what widens it
#
# A hyper-parameter search over two knobs of the CNN: image side and width multiplier (1 to 4: 16
# to 64 channels in the first block), batch 16. Each point of the grid is one measured training
# step; a point is feasible when its peak fits the budget (on the virtual card the budget *is* the
# card, so the step that does not fit raises `torch.OutOfMemoryError`, caught by `feasible_grid`;
# what to try when a real run meets it, in order: `docs/oom-checklist.md`).
# Then the same grid with mixed precision (`torch.autocast` with bf16) and with gradient
# checkpointing of each block (`ConvNet(checkpoint=True)`).
#
# **Predict.** Of the 32 points, how many fit in fp32? With mixed precision? With checkpointing?

# %%
prediction_fp32 = None  # your guess: how many of the 32 points fit in fp32
prediction_bf16 = None  # your guess: with bf16 autocast
prediction_ckpt = None  # your guess: with checkpointing

# %%
grid_sides = [64, 128, 192, 256, 320, 384, 448, 512] if LARGE else [32, 64, 96, 128, 160, 192, 224, 256]
grid_widths = [1, 2, 3, 4]
variants = {"fp32": dict(amp=False, ckpt=False), "bf16 autocast": dict(amp=True, ckpt=False),
            "checkpointing": dict(amp=False, ckpt=True)}
predicted = dict(zip(variants, (prediction_fp32, prediction_bf16, prediction_ckpt)))
grids = {}
for name, v in variants.items():
    grids[name] = feasible_grid(
        lambda side, width: train_peak(lambda: ConvNet(width, checkpoint=v["ckpt"]),
                                       lambda: image_batch(side, 16), amp=v["amp"]),
        grid_sides, grid_widths, BUDGET)
    dev.cleanup()
for name, g in grids.items():
    print(f"{name:<14} " + tr("{n:>2} of {total} points fit ({guess}); largest side per width {frontier}",
                              n=g.count, total=len(grid_sides) * len(grid_widths), guess=guess(predicted[name]),
                              frontier=g.frontier()))


def border_ratios(name: str) -> list[float]:
    """Per width: the variant's peak over fp32's at the largest side both ran (the grid's border)."""
    out = []
    for j in range(len(grid_widths)):
        both = [i for i in range(len(grid_sides)) if grids["fp32"].peak[i][j] and grids[name].peak[i][j]]
        out.append(grids[name].peak[both[-1]][j] / grids["fp32"].peak[both[-1]][j])
    return out


ratio_amp, ratio_ckpt = border_ratios("bf16 autocast"), border_ratios("checkpointing")
print(tr("peak against fp32's at the border, per width: bf16 {bf16}; checkpointing {ckpt}",
         bf16=", ".join(f"{r:.2f}" for r in ratio_amp), ckpt=", ".join(f"{r:.2f}" for r in ratio_ckpt)))

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
    ax.set_title(tr("{name}: {n} fit", name=name, n=g.count), fontsize=9)
    ax.set_xlabel(tr("width multiplier"))
axes[0].set_yticks(range(len(grid_sides)), grid_sides)
axes[0].set_ylabel(tr("image side"))
fig.suptitle(tr("green: fits {budget} (numbers: peak MiB; blank: not run or out of memory)",
                budget=format_bytes(BUDGET)), fontsize=9)
fig.tight_layout()

# %% [markdown]
# Both techniques widen the region, by different amounts and for different reasons (the ratios
# printed above):
#
# - **Mixed precision** stores the activations in bf16, half the bytes. The fp32 weights stay, and
#   autocast adds bf16 copies of them (lesson 10), so the peak falls by somewhat less than half.
# - **Gradient checkpointing** keeps only each block's input and recomputes the block during
#   backward, so the other blocks' activations are not stored. But the first block, at full
#   resolution, holds most of the activations, and it is materialised again while it is
#   recomputed: the saving is smaller. How finely to checkpoint is the next section's question.

# %%
n_fp32, n_amp, n_ckpt = (grids[k].count for k in variants)
assert 0 < n_fp32 < len(grid_sides) * len(grid_widths)  # the budget cuts the grid
assert n_amp > n_fp32, (n_amp, n_fp32)
assert n_ckpt > n_fp32, (n_ckpt, n_fp32)
assert max(ratio_amp) < 1 and max(ratio_ckpt) < 1, (ratio_amp, ratio_ckpt)  # both lower the peak at the border

# %% [markdown]
# ## 6. How finely to checkpoint
#
# Take a stack of `n` equal layers (here `n = 16` blocks of `Linear` + `ReLU`) and split it into
# `k` segments; every segment but the last runs under checkpointing (`checkpoint_segments`, which
# is `torch.utils.checkpoint.checkpoint_sequential` with the segments kept even). Backward then
# holds the `k - 1` segment inputs, plus the activations of one segment of `n / k` layers, the one
# being recomputed (or the last, which is not checkpointed). If a segment input costs what one
# layer stores, that is about `k + n / k` layers' worth, smallest at `k = √n`. That is arithmetic;
# the measurement below tests it. Checkpointing every layer (`k = n`) still stores every layer's
# input, which is most of what an unchecked layer stores.
#
# **Predict.** For `n = 16`, which `k` gives the lowest peak? How does `k = 16` compare with no
# checkpointing (`k = 1`)?

# %%
prediction_best_k = None  # your guess: the k with the lowest peak

# %%
n_layers = 16
seg_width, seg_batch = (512, 8192) if LARGE else (128, 2048)
torch.manual_seed(0)
stack = dev.put(nn.Sequential(*[nn.Sequential(nn.Linear(seg_width, seg_width), nn.ReLU()) for _ in range(n_layers)]))
x_seg = torch.randn(seg_batch, seg_width, device=dev.device)
forwards = []
for layer in stack:  # counts every layer forward, recomputations included
    layer.register_forward_pre_hook(lambda *_: forwards.append(1))


def segments_peak(k: int) -> tuple[int, int]:
    """The peak added by one forward and backward in ``k`` segments, and the layer forwards it ran."""
    stack.zero_grad(set_to_none=True)
    forwards.clear()
    with dev.measure() as m:
        checkpoint_segments(stack, k, x_seg).sum().backward()
    return m.peak_delta, len(forwards)


segments_peak(2)  # unmeasured: the first backward through a checkpoint allocates what later ones reuse
ks = list(range(1, n_layers + 1))
seg_peak, seg_forwards = zip(*(segments_peak(k) for k in ks))
act = seg_batch * seg_width * 4  # one layer's output, fp32
k_best = ks[int(np.argmin(seg_peak))]
for k, p, f in zip(ks, seg_peak, seg_forwards):
    print(tr("k = {k:>2}: peak +{peak:>11} = {outputs:5.1f} layer outputs, {forwards:>2} layer forwards",
             k=k, peak=format_bytes(p), outputs=p / act, forwards=f)
          + (tr("   <- lowest") if k == k_best else ""))
print(tr("lowest at k = {k} (√n = {root:.1f}; {guess}); ",
         k=k_best, root=n_layers ** 0.5, guess=guess(prediction_best_k, "k = {}"))
      + tr("per layer (k = {n}) saves {per_layer} against none, k = {k} saves {best}",
           n=n_layers, per_layer=format_bytes(seg_peak[0] - seg_peak[-1]), k=k_best,
           best=format_bytes(seg_peak[0] - min(seg_peak))))
del stack, x_seg  # off the card: the solutions below measure absolute peaks
dev.cleanup()

fig, ax = plt.subplots(figsize=(5, 3))
ax.plot(ks, np.array(seg_peak) / MiB, "o-", label=tr("measured"))
ax.axvline(n_layers ** 0.5, color="grey", ls="--", label="√n")
ax.set_xlabel(tr("segments k ({n} layers)", n=n_layers))
ax.set_ylabel(tr("peak MiB (added by the step)"))
ax.legend(fontsize=8)
fig.tight_layout()

# %% [markdown]
# The curve has its minimum inside, near `√n`, as the arithmetic said: too few segments, and one
# long segment is recomputed whole; too many, and the segment inputs pile up. Per-layer
# checkpointing is close to no checkpointing at all, and costs the most recomputation: nearly a
# second forward pass, as the forward counts show. So "checkpoint finer to save more" is wrong: the
# saving is largest at about `√n` segments of equal cost. (Real layers are not equal. Section 5's
# network had three blocks of falling size, where what counts is the largest block recomputed.)

# %%
assert 1 < k_best < n_layers, k_best  # the best segment count is interior
assert abs(k_best - n_layers ** 0.5) <= n_layers ** 0.5 / 2, k_best  # near √n
assert seg_peak[-1] > min(seg_peak), seg_peak  # per layer is worse than the best
assert seg_peak[0] - seg_peak[-1] < 0.5 * (seg_peak[0] - min(seg_peak)), seg_peak  # ... by more than half the saving
assert seg_forwards[-1] > seg_forwards[k_best - 1] > seg_forwards[0] == n_layers, seg_forwards  # paid in recompute

# %% [markdown]
# ## Summary
#
# The article is right that memory restricts the search, and it matters *which* knob you turn:
# width costs quadratically in weights, resolution quadratically in activations, context length
# quadratically only in written-out attention, and a regulariser costs what it keeps per
# activation or per weight, or nothing. And "more VRAM" is not the only way to enlarge the search:
# the same card holds a larger grid with bf16 or checkpointing, paid for in precision or in
# compute, and checkpointing pays best at about √n segments.
#
# ## Exercises
#
# 1. From the fit of section 2, estimate the largest image side that fits the budget of section 5
#    for `ConvNet(1)` at batch 8. Check it with one measured step.
# 2. In section 3, the written-out attention at the largest T stores how many bytes of scores and
#    softmax? Compare with the measured peak.
# 3. Combine bf16 autocast *and* checkpointing at one point of the grid. Do the gains add up?
#
# <details><summary>Solutions</summary>
#
# 1. Solve `fixed + b·S² = budget` for `S` with `fixed, b = fit_side.coeffs[1], fit_side.coeffs[0]`:
#    `S = ((BUDGET - fixed) / b) ** 0.5`. The code below computes it and measures a step at that
#    side.
# 2. Scores and softmax are each `1 (batch) x 2 (heads) x T² x 4 bytes`; backward adds their
#    gradients. The code below prints them beside the measured peak: the T² terms are most of it.
# 3. Checkpointing removes the stored activations of the later blocks, autocast halves what is
#    stored. The code below measures one point of the grid four ways.
#
# </details>

# %% tags=["solution"]
# solution 1, computed from the fit of section 2
b_side = fit_side.coeffs[0]
S_max = int(((BUDGET - fixed) / b_side) ** 0.5)
try:
    peak_S = train_peak(lambda: ConvNet(1), lambda: image_batch(S_max))
    print(tr("the fit gives S = {S} pixels for {budget}; ", S=S_max, budget=format_bytes(BUDGET))
          + tr("a step at {S}: {peak} ({off:+.2f}% from the fit), ",
               S=S_max, peak=format_bytes(peak_S), off=100 * (peak_S / fit_side(S_max ** 2) - 1))
          + (tr("fits") if peak_S <= BUDGET else tr("does not fit")))
except torch.OutOfMemoryError:
    print(tr("the fit gives S = {S} pixels for {budget}; ", S=S_max, budget=format_bytes(BUDGET))
          + tr("a step at {S} ran out of memory", S=S_max))
dev.cleanup()

# solution 2: the scores and their softmax at the largest T, against the measured peak
T = lengths[-1]
scores = 1 * heads * T * T * 4
print(tr("T = {T}: scores {scores} + softmax {softmax} = {both}; measured peak {peak} ({share:.0%} of it)",
         T=T, scores=format_bytes(scores), softmax=format_bytes(scores), both=format_bytes(2 * scores),
         peak=format_bytes(peak_naive[-1]), share=2 * scores / peak_naive[-1]))

# solution 3: one point, at width 2 and the largest side that fp32 fits there
side3 = grids["fp32"].frontier()[1]
peaks3 = {(amp, ck): train_peak(lambda: ConvNet(2, checkpoint=ck), lambda: image_batch(side3, 16), amp=amp)
          for amp in (False, True) for ck in (False, True)}
print(tr("side {side}, width 2: fp32 {fp32}, bf16 {bf16}, checkpointing {ckpt}, both {both}; ",
         side=side3, fp32=format_bytes(peaks3[False, False]), bf16=format_bytes(peaks3[True, False]),
         ckpt=format_bytes(peaks3[False, True]), both=format_bytes(peaks3[True, True]))
      + tr("savings {bf16} + {ckpt} alone, {both} together",
           bf16=format_bytes(peaks3[False, False] - peaks3[True, False]),
           ckpt=format_bytes(peaks3[False, False] - peaks3[False, True]),
           both=format_bytes(peaks3[False, False] - peaks3[True, True])))
