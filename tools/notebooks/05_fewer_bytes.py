# %% [markdown]
# # 05 · Fewer bytes: precision and smarter batching
#
# Terms are explained in the [glossary](../docs/glossary.md); the claim ids (A1, B6, …) are those of
# [`docs/claims.md`](../docs/claims.md).
#
# **Claim (curriculum A5).** Article 000 says that compression and smarter batching mean fewer
# bytes to move, and so fewer swaps. Lesson 03 showed when bytes cross the host link; this lesson
# measures how many fewer cross in half and quarter precision, and at what rounding error
# (section 1), and what batching sequences by length saves, in padding and in memory (section 2).
# Without a CUDA GPU, the device is a virtual card of 1 GiB on the CPU, and the copies are
# host→host, for scale.

# %%
import matplotlib.pyplot as plt
import numpy as np
import torch

import vramlab
from vramlab import format_bytes
from vramlab.i18n import tr
from vramlab.lessons.predict import guess
from vramlab.lessons.transfer import (bucketed_batches, dequantize_int8, measure_copy, padding_stats,
                                      quantize_int8, random_batches)

torch.manual_seed(0)
dev = vramlab.pick_device(virtual="1GiB")
LARGE = dev.large  # the one size switch: larger tensors on a big GPU
MiB = 2**20
n = (1024 if LARGE else 256) * MiB // 4  # float32 elements: 256 MiB (1 GiB on a big GPU)
print(dev)

# %% [markdown]
# ## 1. Transfer in half or quarter precision
#
# Half precision (fp16, bf16) halves the bytes of a tensor; int8 with a scale quarters them. The
# bytes column below is arithmetic (elements of 4, 2, 2 and 1 bytes), so it is not checked. The
# rounding error and the copy time are measured. The copy moves that many bytes host→device on
# CUDA, and host→host without it (on one CPU thread, the fastest of seven runs).

# %%
t = torch.randn(n // 4)
half = t.to(torch.float16)
brain = t.to(torch.bfloat16)
q, scale = quantize_int8(t)
rows = [("float32", t, t), ("float16", half, half.float()), ("bfloat16", brain, brain.float()),
        ("int8 + scale", q, dequantize_int8(q, scale))]
copy_ms, errors = {}, {}
threads = torch.get_num_threads()
if not dev.is_cuda:
    torch.set_num_threads(1)  # one thread: on a busy CPU a parallel copy waits for its descheduled threads
print(f"{tr('format'):<14}{tr('bytes'):>12}{tr('of fp32'):>9}{tr('max rel. error'):>16}{tr('copy ms'):>9}")
shown = {"int8 + scale": tr("int8 + scale")}  # the one format name with a word in it
for name, data, back in rows:
    copy_ms[name] = measure_copy(dev, data.nbytes, repeats=7, fastest=True).seconds * 1e3  # the fastest of 7
    errors[name] = ((back - t).abs().max() / t.abs().max()).item()
    print(f"{shown.get(name, name):<14}{format_bytes(data.nbytes):>12}{data.nbytes / t.nbytes:>9.2f}"
          f"{errors[name]:>16.2e}{copy_ms[name]:>9.2f}")
torch.set_num_threads(threads)
print(tr("int8 moves in {int8:.2f} of the time of float32, float16 in {fp16:.2f}",
         int8=copy_ms["int8 + scale"] / copy_ms["float32"], fp16=copy_ms["float16"] / copy_ms["float32"]))

# %% [markdown]
# The copy time falls with the bytes. The error is the price. bf16 keeps fp32's range but only 8
# significant bits, so it rounds more coarsely than fp16, which has 11. int8's error is at most
# half a step of its scale.

# %%
assert copy_ms["int8 + scale"] < 0.75 * copy_ms["float32"], copy_ms  # a quarter of the bytes moves faster
assert errors["float16"] < errors["bfloat16"], errors
assert ((dequantize_int8(q, scale) - t).abs().max() <= scale / 2 + 1e-6).item()

# %% [markdown]
# ## 2. Smart batching: length buckets waste less padding
#
# Sequences of different lengths are padded to the longest one in their batch. Drawn at random, a
# batch almost always contains one long sequence, and every other sequence is padded up to it.
# Bucketing (sorting by length within large pools, then shuffling the batches) keeps lengths in a
# batch alike.
#
# **Predict.** What fraction of the tokens in random batches is padding? And the largest
# bucketed batch's peak memory, as a fraction of the largest random batch's?

# %%
prediction_wasted = None  # your guess: the fraction of padding tokens in random batches, e.g. 0.3
prediction_peak_ratio = None  # your guess: worst bucketed peak / worst random peak, e.g. 0.5

# %%
rng = np.random.default_rng(0)
lengths = np.clip(rng.lognormal(4.0, 0.7, 20_000).astype(int), 4, 512).tolist()
batch = 32
schemes = {"random": random_batches(lengths, batch), "bucketed": bucketed_batches(lengths, batch)}
stats = {k: padding_stats(lengths, b) for k, b in schemes.items()}
rand, buck = stats["random"], stats["bucketed"]
scheme_name = {"random": tr("random"), "bucketed": tr("bucketed")}  # for the printed lines and the plot
print(f"{tr('random batches:'):<17} " + tr("{wasted:.1%} of tokens are padding ({guess})",
                                             wasted=rand.wasted, guess=guess(prediction_wasted, "{:.0%}")))
print(f"{tr('bucketed batches:'):<17} " + tr("{wasted:.1%} of tokens are padding", wasted=buck.wasted))
print(tr("tokens to compute and move per epoch: {random:,} random, {bucketed:,} bucketed ({fewer:.1f}x fewer)",
         random=rand.padded, bucketed=buck.padded, fewer=rand.padded / buck.padded))

# %% [markdown]
# Does bucketing lower the peak memory too? We run one training step of a small transformer layer
# on the largest batch of each scheme, and on its median batch (the typical step), and measure
# the peak each adds.

# %%
layer = torch.nn.TransformerEncoderLayer(d_model=64, nhead=4, dim_feedforward=128, batch_first=True)
emb = torch.nn.Embedding(1000, 64)
dev.put(layer)
dev.put(emb)


def padded_shape(b: list[int]) -> tuple[int, int]:
    """(sequences, padded length) of a batch."""
    return len(b), max(lengths[i] for i in b)


def step_peak(b: list[int]) -> int:
    """Bytes one training step on batch ``b``, padded to its longest sequence, adds at its peak."""
    tokens = torch.randint(0, 1000, padded_shape(b), device=dev.device)
    with dev.measure() as m:
        layer(emb(tokens)).square().mean().backward()
    layer.zero_grad(set_to_none=True)
    emb.zero_grad(set_to_none=True)
    return m.peak_delta


step_peak(schemes["random"][0])  # unmeasured: on CUDA the first step creates workspaces that stay
worst, median, peaks = {}, {}, {}
for k, bs in schemes.items():
    by_size = sorted(bs, key=lambda b: padded_shape(b)[0] * padded_shape(b)[1])
    worst[k], median[k] = by_size[-1], by_size[len(by_size) // 2]
    peaks[k] = {"worst": step_peak(worst[k]), "median": step_peak(median[k])}
    print(f"{scheme_name[k]:<9} " + tr("worst batch {worst:>9} tokens: peak {worst_peak:>12};  "
                                       "median batch {median:>9}: {median_peak:>12}",
                                       worst="{} x {}".format(*padded_shape(worst[k])),
                                       worst_peak="+" + format_bytes(peaks[k]["worst"]),
                                       median="{} x {}".format(*padded_shape(median[k])),
                                       median_peak="+" + format_bytes(peaks[k]["median"])))
peak_ratio = peaks["bucketed"]["worst"] / peaks["random"]["worst"]
median_ratio = peaks["bucketed"]["median"] / peaks["random"]["median"]
print(tr("the worst bucketed step's peak is {ratio:.2f} of the worst random one's ({guess}); "
         "the median step's is {median:.2f}",
         ratio=peak_ratio, guess=guess(prediction_peak_ratio, "{}"), median=median_ratio))
print(tr("the longest sequence has {n} tokens; ", n=max(lengths))
      + (tr("both worst batches are padded to it, with the same number of sequences")
         if padded_shape(worst["random"]) == padded_shape(worst["bucketed"]) else tr("the worst batches differ in shape")))
fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(8, 3))
ax1.bar([scheme_name[k] for k in stats], [s.wasted * 100 for s in stats.values()])
ax1.set_ylabel(tr("% of tokens that are padding"))
ax1.set_title(tr("padding, by batching scheme"))
for i, (part, label) in enumerate((("worst", tr("worst batch")), ("median", tr("median batch")))):
    ax2.bar(np.arange(2) + 0.4 * i, [peaks[k][part] / MiB for k in schemes], width=0.4, label=label)
ax2.set_xticks(np.arange(2) + 0.2, [scheme_name[k] for k in schemes])
ax2.set_ylabel(tr("peak MiB added by a step"))
ax2.set_title(tr("one step's peak, by batching scheme"))
ax2.legend(fontsize=8)
fig.tight_layout()

# %% [markdown]
# Bucketing cuts the padding, and with it the bytes computed and moved per epoch, by the factor
# printed above, and the typical step needs far less memory. The peak does not fall: it is set by
# the longest sequence. In either order, the batch that holds it is padded to its length, and with
# equal batch sizes that batch is the same size, so the worst step's peak is the same. Sizing the
# card for bucketed training means sizing it for that batch. To lower the peak as well, batches
# must be cut by a token budget (fewer sequences when they are long), which bucketing makes
# efficient; see exercise 2.

# %%
assert buck.wasted < 0.5 * rand.wasted, (buck.wasted, rand.wasted)
assert rand.real == buck.real == sum(lengths)
assert padded_shape(worst["random"]) == padded_shape(worst["bucketed"]) == (batch, max(lengths))
assert abs(peak_ratio - 1) < 0.01, peaks  # the same worst batch: the same peak
assert median_ratio < 0.5, peaks  # ... while the typical step needs far less

# %% [markdown]
# ## Summary
#
# Fewer bytes move faster: half precision halves a copy's bytes and int8 with a scale quarters
# them, at a rounding error that was measured. Bucketing by length cuts the padding, and with it
# the bytes computed and moved per epoch and the typical step's memory. The peak stays where the
# longest sequence puts it, unless batches are cut by a token budget.
#
# ## Exercises
#
# 1. In section 2, make the pools smaller (`bucketed_batches(..., bucket_batches=5)`), then 1.
#    What happens to the padding?
# 2. In section 2, cut bucketed batches by a token budget instead of 32 sequences: as many
#    sequences as fit in `budget = 32 * median length` padded tokens. What is the largest batch now,
#    and what does its step's peak become?
#
# <details><summary>Solutions</summary>
#
# 1. Smaller pools sort over fewer sequences, so lengths in a batch vary more and padding rises.
#    With pools of one batch, sorting changes nothing: the padding is the random figure. Larger
#    pools waste less but make the batch order less random. The code below computes all three.
# 2. The code below cuts sorted pools into batches of at most `budget` padded tokens. The longest
#    sequences then go in small batches, and the largest step's peak falls well below section 2's.
#
# </details>

# %% tags=["solution"]
# solution 1: the padding against the pool size
for pool in (50, 5, 1):
    s = padding_stats(lengths, bucketed_batches(lengths, batch, bucket_batches=pool))
    pools = (tr("pools of {pool:>2} batches:", pool=pool) if pool > 1
             else tr("pools of {pool:>2} batch  :", pool=pool))
    print(pools + " " + tr("{wasted:.1%} of tokens are padding (random: {random:.1%})",
                           wasted=s.wasted, random=rand.wasted))

# solution 2: bucketed batches cut by a token budget
budget = batch * int(np.median(lengths))
token_batches = []
order = sorted(range(len(lengths)), key=lambda i: lengths[i])  # one pool, for brevity
current: list[int] = []
for i in order:
    if current and (len(current) + 1) * lengths[i] > budget:
        token_batches.append(current)
        current = []
    current.append(i)
token_batches.append(current)
tb = padding_stats(lengths, token_batches)
largest = max(token_batches, key=lambda b: padded_shape(b)[0] * padded_shape(b)[1])
longest = token_batches[-1]  # the longest sequences: attention costs L² per sequence, so measure it too
peak_tb = max(step_peak(largest), step_peak(longest))
print(tr("token budget {budget:,}: {n} batches, {wasted:.1%} padding; the most tokens {most}, the longest {longest}; ",
         budget=budget, n=len(token_batches), wasted=tb.wasted,
         most="{} x {}".format(*padded_shape(largest)), longest="{} x {}".format(*padded_shape(longest)))
      + tr("the larger of their peaks +{peak} ({ratio:.2f} of section 2's worst)",
           peak=format_bytes(peak_tb), ratio=peak_tb / peaks["bucketed"]["worst"]))
