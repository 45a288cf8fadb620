# %% [markdown]
# # 03 · Transfer and swapping: when data has to move
#
# **Claims (curriculum A4, A5, B2).** When the GPU's memory is not enough, data moves between host
# RAM and the GPU, and that path is much slower than the GPU's own memory (A4). Compression and
# smarter batching mean fewer bytes to move (A5). Swap on an SSD complements RAM but is slower
# still (B2). We measure each, on a CUDA GPU when there is one; without one, the virtual T4 and the
# host's own memory and disk stand in, and each section says what that measures.

# %%
import contextlib
import os
import tempfile
import time

import matplotlib.pyplot as plt
import numpy as np
import torch

import vramlab
from vramlab import format_bytes
from vramlab.sim.presets import get_preset
from vramlab.lessons.transfer import (bucketed_batches, dequantize_int8, measure_copy, padding_stats, quantize_int8,
                                  random_batches, save_on_host)

torch.manual_seed(0)
dev = vramlab.pick_device(virtual="T4")
LARGE = dev.large
MiB = 2**20
print(dev)

# %% [markdown]
# ## 1. The link to the host is the slow path
#
# A GPU reads its own memory at hundreds of GB/s to several TB/s; it reaches host RAM over PCIe
# (or NVLink-C2C on Grace-Hopper), one to two orders of magnitude slower. The datasheet figures of
# the presets:

# %%
names = ["T4", "L4", "RTX 4090", "A100-80GB", "H100-80GB", "H200-141GB", "GH200-96GB"]
print(f"{'GPU':<12}{'memory GB/s':>12}{'host link':>16}{'link GB/s':>10}{'ratio':>7}")
ratios = []
for n in names:
    p = get_preset(n)
    ratios.append(p.bandwidth / p.host_link_bandwidth)
    print(f"{p.name:<12}{p.bandwidth / 1e9:>12,.0f}{p.host_link:>16}{p.host_link_bandwidth / 1e9:>10,.0f}{ratios[-1]:>7.0f}x")

# %% [markdown]
# **Predict.** Copying from host memory to the device: how much faster is a *pinned*
# (page-locked) source than an ordinary *pageable* one? (Pinned memory can be read by the GPU's DMA
# engine directly; pageable memory is first copied by the driver into a pinned staging buffer.)

# %%
prediction_pinned_speedup = 2.0  # edit me

# %%
nbytes = (1024 if LARGE else 256) * MiB
pageable = measure_copy(dev, nbytes)
print(f"{pageable.kind}: {pageable.bandwidth / 1e9:.1f} GB/s for {format_bytes(pageable.nbytes)}")
if dev.is_cuda:
    pinned = measure_copy(dev, nbytes, pinned=True)
    print(f"{pinned.kind}: {pinned.bandwidth / 1e9:.1f} GB/s "
          f"({pinned.bandwidth / pageable.bandwidth:.2f}x pageable; predicted {prediction_pinned_speedup}x)")
    # overlap: a non_blocking copy from pinned memory runs while the GPU computes
    a = torch.randn(4096, 4096, device=dev.device)
    src = torch.empty(nbytes // 4, pin_memory=True)
    dst = torch.empty(nbytes // 4, device=dev.device)
    stream = torch.cuda.Stream()

    def compute():
        for _ in range(8):
            a @ a

    def timed(fn):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        return time.perf_counter() - t0

    def both_sequential():
        dst.copy_(src)
        compute()

    def both_overlapped():
        with torch.cuda.stream(stream):
            dst.copy_(src, non_blocking=True)
        compute()

    timed(both_sequential)
    t_seq, t_ovl = timed(both_sequential), timed(both_overlapped)
    print(f"copy then compute {t_seq * 1e3:.1f} ms; copy overlapped with compute {t_ovl * 1e3:.1f} ms")
else:
    print("no CUDA device: pinned memory and copy/compute overlap need one, so they are not measured here;"
          " the figure above is this machine's host→host copy of the same size, for scale")

# %% [markdown]
# A PCIe 4.0 x16 link carries at most about 32 GB/s, while the card's memory runs at 300–4,800
# GB/s: every byte that has to cross the link costs 9–75× what it costs on the card. Even
# NVLink-C2C, the fastest host link here, is 9× slower than the HBM next to the GPU. That is the
# price of "swapping" between RAM and VRAM.

# %%
assert min(ratios) >= 8, ratios  # the link is about an order of magnitude slower than device memory, or worse
assert pageable.bandwidth > 0
if dev.is_cuda:
    assert pinned.bandwidth > pageable.bandwidth
    assert t_ovl < t_seq

# %% [markdown]
# ## 2. Offloading activations: memory for time
#
# Activations saved for backward are often the largest part of a training step's peak (lesson 02's
# per-sample cost). They can wait in host memory instead: `save_on_host(dev)` moves them there as
# they are saved and brings them back when backward needs them (on CUDA this is PyTorch's
# `torch.autograd.graph.save_on_cpu`).
#
# **Predict.** Which falls more: the peak, or the speed?

# %%
width, depth, batch = (2048, 12, 8192) if LARGE else (512, 8, 4096)
net = torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.Tanh()) for _ in range(depth)])
dev.put(net)
x = dev.put(torch.randn(batch, width))
runs = {}
for offload in (False, True, False, True):  # twice each: the first runs warm up
    net.zero_grad(set_to_none=True)
    with dev.measure() as m:
        with save_on_host(dev) if offload else contextlib.nullcontext():
            loss = net(x).square().mean()
        loss.backward()
        del loss
    runs[offload] = (m.peak_delta, m.wall_s, [p.grad.clone() for p in net.parameters()])
(peak_on, t_on, g_on), (peak_off, t_off, g_off) = runs[False], runs[True]
print(f"activations on the device: peak +{format_bytes(peak_on)}, {t_on * 1e3:.0f} ms")
print(f"offloaded to host memory:  peak +{format_bytes(peak_off)}, {t_off * 1e3:.0f} ms")

# %% [markdown]
# The peak falls by most of the activations' bytes, the gradients are unchanged, and the step
# takes longer: every activation now makes a round trip. Here the trip is a host-memory copy; on a
# real card it crosses the link of section 1, and the slowdown is larger unless the copies overlap
# with compute.

# %%
assert peak_off < 0.6 * peak_on
assert all(torch.allclose(a, b) for a, b in zip(g_on, g_off))

# %% [markdown]
# ## 3. RAM against disk: the cliff that swap gives
#
# Swap moves memory pages to disk when RAM runs out. We can see the same cliff without exhausting
# RAM: a tensor backed by a file (memory-mapped) is read from disk the first time its pages are
# touched, and from RAM afterwards.
#
# **Predict.** How much slower is the first read of a disk-backed tensor than a read of one in RAM?

# %%
prediction_slowdown = 10  # edit me

# %%
n = (1024 if LARGE else 256) * MiB // 4
ram = torch.randn(n)
ram.sum()
t0 = time.perf_counter()
ram.sum()
t_ram = time.perf_counter() - t0
with tempfile.TemporaryDirectory(dir=os.getcwd()) as tmp:
    path = os.path.join(tmp, "tensor.bin")
    ram.numpy().tofile(path)
    fd = os.open(path, os.O_RDONLY)
    os.fsync(fd)
    dropped = hasattr(os, "posix_fadvise")
    if dropped:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)  # evict the file from the page cache
    os.close(fd)
    disk = torch.from_file(path, shared=False, size=n, dtype=torch.float32)
    t0 = time.perf_counter()
    disk.sum()
    t_cold = time.perf_counter() - t0
    t0 = time.perf_counter()
    disk.sum()
    t_warm = time.perf_counter() - t0
    del disk
size = n * 4
print(f"RAM          {size / t_ram / 1e9:6.1f} GB/s")
print(f"disk, cold   {size / t_cold / 1e9:6.1f} GB/s   ({t_cold / t_ram:.0f}x slower; predicted {prediction_slowdown}x)")
print(f"disk, warm   {size / t_warm / 1e9:6.1f} GB/s   (its pages are in RAM now)")
swap = vramlab.snapshot().host
print(f"swap on this machine: {format_bytes(swap.swap_used)} used of {format_bytes(swap.swap_total)}, "
      f"{format_bytes(swap.swap_in)} paged in and {format_bytes(swap.swap_out)} out since boot")

# %% [markdown]
# A cold read waits for the disk; once the pages are in RAM the same tensor reads at RAM speed.
# Swapping a training set behaves like the cold read on every pass, because each epoch touches the
# data again after other pages have pushed it out. The monitor (`%vram watch`) shows swap use and
# the page-in/out rate live, which is how to tell that this is happening.
#
# A claim often repeated, and in the article, is that a *fixed-size* swap file avoids
# fragmentation and so helps. On current Linux it makes little difference: swap is managed in
# page-sized slots, and a swap file is allocated up front by `mkswap`/`swapon` whether or not it
# may grow; what matters is that swapping happens at all, as measured above.

# %%
if dropped:
    assert t_cold > 2 * t_ram, (t_cold, t_ram)
assert t_warm < t_cold

# %% [markdown]
# ## 4. Fewer bytes: transfer in half or quarter precision
#
# Half precision (fp16, bf16) halves the bytes of a tensor; int8 with a scale quarters them. Fewer
# bytes cross the link in proportion.

# %%
t = torch.randn(n // 4)
half = t.to(torch.float16)
brain = t.to(torch.bfloat16)
q, scale = quantize_int8(t)
rows = [("float32", t, t), ("float16", half, half.float()), ("bfloat16", brain, brain.float()),
        ("int8 + scale", q, dequantize_int8(q, scale))]
print(f"{'format':<14}{'bytes':>12}{'of fp32':>9}{'max rel. error':>16}{'copy ms':>9}")
for name, data, back in rows:
    dst = torch.empty_like(data, device=dev.device)
    dst.copy_(data)
    t0 = time.perf_counter()
    for _ in range(3):
        dst.copy_(data)
    if dev.is_cuda:
        torch.cuda.synchronize()
    ms = (time.perf_counter() - t0) / 3 * 1e3
    err = ((back - t).abs().max() / t.abs().max()).item()
    print(f"{name:<14}{format_bytes(data.nbytes):>12}{data.nbytes / t.nbytes:>9.2f}{err:>16.2e}{ms:>9.2f}")

# %%
assert half.nbytes * 2 == t.nbytes and brain.nbytes * 2 == t.nbytes and q.nbytes * 4 == t.nbytes
assert ((dequantize_int8(q, scale) - t).abs().max() <= scale / 2 + 1e-6).item()

# %% [markdown]
# ## 5. Smart batching: length buckets waste less padding
#
# Sequences of different lengths are padded to the longest one in their batch. Drawn at random, a
# batch almost always contains one long sequence, and every other sequence is padded up to it.
# Bucketing (sorting by length within large pools, then shuffling the batches) keeps lengths in a
# batch alike.
#
# **Predict.** What fraction of the tokens in random batches is padding?

# %%
prediction_wasted = 0.3  # edit me

# %%
rng = np.random.default_rng(0)
lengths = np.clip(rng.lognormal(4.0, 0.7, 20_000).astype(int), 4, 512).tolist()
batch = 32
rand = padding_stats(lengths, random_batches(lengths, batch))
buck = padding_stats(lengths, bucketed_batches(lengths, batch))
print(f"random batches:   {rand.wasted:.1%} of tokens are padding; largest batch {rand.max_batch_tokens:,} tokens")
print(f"bucketed batches: {buck.wasted:.1%} of tokens are padding; largest batch {buck.max_batch_tokens:,} tokens")
print(f"tokens to compute and move per epoch: {rand.padded:,} random, {buck.padded:,} bucketed "
      f"({rand.padded / buck.padded:.1f}x fewer)")

# %% [markdown]
# The largest padded batch sets the peak memory. We run one training step of a small transformer
# layer on the largest batch of each scheme and measure its peak.

# %%
layer = torch.nn.TransformerEncoderLayer(d_model=64, nhead=4, dim_feedforward=128, batch_first=True)
emb = torch.nn.Embedding(1000, 64)
dev.put(layer)
dev.put(emb)


def step_peak(batches):
    worst = max(batches, key=lambda b: max(lengths[i] for i in b) * len(b))
    L = max(lengths[i] for i in worst)
    tokens = torch.randint(0, 1000, (len(worst), L), device=dev.device)
    with dev.measure() as m:
        layer(emb(tokens)).square().mean().backward()
    layer.zero_grad(set_to_none=True)
    emb.zero_grad(set_to_none=True)
    return m.peak_delta, L


peak_rand, l_rand = step_peak(random_batches(lengths, batch))
peak_buck, l_buck = step_peak(bucketed_batches(lengths, batch))
print(f"worst random batch: 32 × {l_rand} tokens, peak +{format_bytes(peak_rand)}")
print(f"worst bucketed batch: 32 × {l_buck} tokens, peak +{format_bytes(peak_buck)}")
fig, ax = plt.subplots(figsize=(5, 3))
ax.bar(["random", "bucketed"], [rand.wasted * 100, buck.wasted * 100])
ax.set_ylabel("% of tokens that are padding")
fig.tight_layout()

# %% [markdown]
# Bucketing cuts the padding, and with it the bytes computed on and moved, by a large factor. Its
# worst batch can still be long (the longest sequences must go somewhere), so the peak falls less
# than the average waste, and only when the longest batch is shorter too.

# %%
assert buck.wasted < 0.5 * rand.wasted
assert rand.real == buck.real == sum(lengths)
assert peak_buck <= peak_rand

# %% [markdown]
# ## Exercises
#
# 1. In section 2, offload only the first half of the layers. How do the peak and the time change?
# 2. In section 5, make the pools smaller (`bucket_batches=5`). What happens to the padding?
#
# <details><summary>Solutions</summary>
#
# 1. Wrap only the first half of the forward in `save_on_host(dev)`: the peak lies between the two
#    measured above (roughly half the activations stay on the device), and so does the time.
# 2. Smaller pools sort over fewer sequences, so lengths in a batch vary more and padding rises
#    toward the random figure; larger pools waste less but make batch order less random.
#
# </details>
