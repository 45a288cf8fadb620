# %% [markdown]
# # 03 · Transfer and swapping: when data has to move
#
# Terms are explained in the [glossary](../docs/glossary.md); the claim ids (A1, B6, …) are those of
# [`docs/claims.md`](../docs/claims.md).
#
# **Claims (curriculum A4, A5, B2).** Article 000 says that when the GPU's memory is not enough,
# data moves between host RAM and the GPU, and that this path is much slower than the GPU's own
# memory (A4); and that compression and smarter batching mean fewer bytes to move (A5). Article
# 004 says that swap on an SSD complements RAM but is slower still, and that a fixed size helps
# (B2).
#
# **Correction (A4).** PyTorch does not swap. When a tensor does not fit on the card, PyTorch
# raises `torch.OutOfMemoryError` (lesson 01 hits that wall; section 1 shows it again; what to try
# then, in order: `docs/oom-checklist.md`), and nothing moves to host RAM. Data crosses between host and GPU only when code asks for it:
#
# - **explicit offload**: `torch.autograd.graph.save_on_cpu` keeps the activations saved for
#   backward in host memory (section 3); DeepSpeed's ZeRO-Offload keeps the optimizer state in
#   host memory and updates it there;
# - **CUDA Unified Memory**: memory from `cudaMallocManaged` may be larger than the card
#   ("oversubscription", on Linux), and the driver migrates its pages on demand. PyTorch's
#   allocator uses `cudaMalloc`, not managed memory, so plain PyTorch code never gets this;
# - **the Windows driver's system-memory fallback**: on Windows (WDDM drivers, since 536.40), a
#   full card can be backed by shared system memory. The NVIDIA Control Panel's "CUDA - Sysmem
#   Fallback Policy" turns it on or off. Linux drivers have no such fallback.
#
# What the article gets right is the price: when data does cross, the host link is the slow path
# (section 2). Without a CUDA GPU, the device here is a virtual card of 1 GiB on the CPU. It
# counts every tensor's bytes and enforces its capacity, but its "device memory" *is* host RAM, so
# it cannot show the link's speed. This machine's RAM and disk stand in for the speeds, and each
# section says what it measures. (Not yet run on a real card: vramlab's GPU runs are reported in
# `docs/gpu-runs/`.)

# %%
import contextlib
import os
import sys
import tempfile
import time

import matplotlib.pyplot as plt
import numpy as np
import torch

import vramlab
from vramlab import format_bytes
from vramlab.lessons.predict import guess
from vramlab.lessons.transfer import (bucketed_batches, dequantize_int8, measure_copy, padding_stats,
                                      page_cache_fraction, quantize_int8, random_batches, read_swaps,
                                      save_on_host)
from vramlab.sim.presets import get_preset

torch.manual_seed(0)
dev = vramlab.pick_device(virtual="1GiB")
LARGE = dev.large  # the one size switch: larger tensors on a big GPU
MiB = 2**20
print(dev)

# %% [markdown]
# ## 1. A tensor that does not fit
#
# The card holds one tensor of 60% of the memory tensors may use. We ask for a second one of the
# same size, while host RAM has plenty of room.
#
# **Predict.** What happens: an error, or a tensor that lives partly in host RAM?

# %%
prediction_spill = None  # your guess: "error" or "host RAM"

# %%
chunk = int(0.6 * dev.budget)
host_available = vramlab.snapshot().host.available
oom = second = None
with dev.measure():
    hold = torch.empty(chunk, dtype=torch.uint8, device=dev.device)
    before = dev.allocated()
    try:
        second = torch.empty(chunk, dtype=torch.uint8, device=dev.device)
    except torch.OutOfMemoryError as e:
        oom = e.with_traceback(None)  # keep the error, not the frames of its traceback
    after = dev.allocated()
    del hold, second
dev.cleanup()
print(f"held {format_bytes(chunk)} of {format_bytes(dev.budget)}; asked for {format_bytes(chunk)} more, "
      f"with {format_bytes(host_available)} of host RAM available")
if oom is not None:
    print(f"result: torch.OutOfMemoryError ({guess(prediction_spill)}): {'. '.join(str(oom).split('. ')[:2])}.")
else:
    print(f"result: the second tensor was allocated ({guess(prediction_spill)}): this driver backs the card "
          "with system memory (Windows' Sysmem Fallback?)")
print(f"allocated on the card before the request {format_bytes(before)}, after it {format_bytes(after)}")

# %% [markdown]
# The request failed at once. Nothing of it was placed anywhere: the card's allocated bytes are
# the same before and after, and there is no tensor, in host RAM or elsewhere. Host RAM had room
# for it, and PyTorch did not use it. A training step that does not fit stops with this error; it
# does not run slowly out of host memory. To use host RAM, code has to ask for it, as in section
# 3. (On Windows with the fallback on, the second tensor would be allocated, and every kernel
# touching it would run at the link's speed of section 2. The cell prints that case rather than
# failing.)

# %%
assert oom is not None or (dev.is_cuda and sys.platform == "win32"), "the card took more than it holds"
assert after == before, (before, after)  # nothing of the failed request is counted on the card

# %% [markdown]
# ## 2. The link to the host is the slow path
#
# When data does cross, it crosses the host link. A GPU reads its own memory at hundreds of GB/s
# to several TB/s; it reaches host RAM over PCIe (or NVLink-C2C on Grace-Hopper). These are
# **datasheet figures** from vramlab's presets, not measurements:

# %%
names = ["T4", "L4", "RTX 4090", "A100-80GB", "H100-80GB", "H200-141GB", "GH200-96GB"]
print(f"{'GPU':<12}{'memory GB/s':>12}{'host link':>16}{'link GB/s':>10}{'ratio':>7}   source")
ratios = {}
for n in names:
    p = get_preset(n)
    ratios[p.name] = p.bandwidth / p.host_link_bandwidth
    print(f"{p.name:<12}{p.bandwidth / 1e9:>12,.0f}{p.host_link:>16}{p.host_link_bandwidth / 1e9:>10,.0f}"
          f"{ratios[p.name]:>6.0f}x   {p.source}")
least, most = min(ratios, key=ratios.get), max(ratios, key=ratios.get)
print(f"by the datasheets, a byte crossing the link costs {ratios[least]:.0f}x ({least}) to {ratios[most]:.0f}x "
      f"({most}) what it costs in the card's own memory")

# %% [markdown]
# The ratios are arithmetic on datasheet figures, so there is nothing to assert about them. What
# can be measured is a copy. On a CUDA GPU the cell below times host→device copies from ordinary
# (*pageable*) and *pinned* (page-locked) host memory, a device→device copy of the same size, and a
# copy overlapped with compute. Without one it times a host→host copy of the same size, for scale:
# on the virtual card, host and "device" are the same RAM, so no link is measured.
#
# **Predict.** How much faster is a copy from a pinned source than from a pageable one? (The GPU's
# DMA engine reads pinned memory directly. Pageable memory is first copied by the driver into a
# pinned staging buffer.)

# %%
prediction_pinned_speedup = None  # your guess: pinned is how many times faster than pageable

# %%
nbytes = (1024 if LARGE else 256) * MiB
pageable = measure_copy(dev, nbytes)
print(f"{pageable.kind}: {pageable.bandwidth / 1e9:.1f} GB/s for {format_bytes(pageable.nbytes)}")
if dev.is_cuda:
    pinned = measure_copy(dev, nbytes, pinned=True)
    d2d = measure_copy(dev, nbytes, device_to_device=True)
    print(f"{pinned.kind}: {pinned.bandwidth / 1e9:.1f} GB/s "
          f"({pinned.bandwidth / pageable.bandwidth:.2f}x pageable; {guess(prediction_pinned_speedup, '{}x')})")
    print(f"{d2d.kind}: {d2d.bandwidth / 1e9:.1f} GB/s, {d2d.bandwidth / pinned.bandwidth:.0f}x the pinned "
          "host→device copy")
    # overlap: a non_blocking copy from pinned memory runs on a side stream while the GPU computes
    a = torch.randn(4096, 4096, device=dev.device)
    src = torch.empty(nbytes // 4, pin_memory=True)
    dst = torch.empty(nbytes // 4, device=dev.device)
    stream = torch.cuda.Stream()

    def compute():
        for _ in range(8):
            a @ a

    def timed(fn):
        times = []
        for _ in range(4):  # the first run warms up; the best of the other three
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            fn()
            torch.cuda.synchronize()
            times.append(time.perf_counter() - t0)
        return min(times[1:])

    def both_sequential():
        dst.copy_(src)
        compute()

    def both_overlapped():
        with torch.cuda.stream(stream):
            dst.copy_(src, non_blocking=True)
        compute()

    t_seq, t_ovl = timed(both_sequential), timed(both_overlapped)
    print(f"copy then compute {t_seq * 1e3:.1f} ms; copy overlapped with compute {t_ovl * 1e3:.1f} ms")
    del a, src, dst
else:
    print(f"no CUDA device: pinned memory, the link and copy/compute overlap are not measured here "
          f"({guess(prediction_pinned_speedup, '{}x')})")

# %% [markdown]
# On a real card the cell below checks what the datasheets and the copy engine's design lead one
# to expect: the card's own memory is many times faster than the link, a pinned source is faster
# than a pageable one, and a copy overlapped with compute takes less time than the two one after
# the other. The checks run only where these are measured, on CUDA (where this lesson has not yet
# been run).

# %%
if dev.is_cuda:
    assert pinned.bandwidth > pageable.bandwidth, (pinned, pageable)
    assert d2d.bandwidth > 2 * pinned.bandwidth, (d2d, pinned)  # the link is the slow path
    assert t_ovl < t_seq, (t_ovl, t_seq)

# %% [markdown]
# ## 3. Offloading activations on purpose: memory for time
#
# Here is the first way across that code asks for. The activations saved for backward are often
# the largest part of a training step's peak (lesson 02's per-sample cost). PyTorch's
# `torch.autograd.graph.save_on_cpu` keeps them in host memory as they are saved and brings each
# back when backward needs it. vramlab's `save_on_host(dev)` *is* `save_on_cpu(pin_memory=True)`
# on CUDA. On the virtual card it keeps the saved tensors in NumPy buffers, which the card does not
# count.
#
# Why not `save_on_cpu` itself on the virtual card? Because the virtual card counts every tensor
# created on the CPU while it is active, and its tensors *are* CPU tensors. `save_on_cpu()` calls
# `.cpu()`, which returns a CPU tensor itself, so nothing moves. With `pin_memory=True` it makes
# real copies, and the card counts those as its own memory. The cell measures all of them.
#
# **Predict.** With activations offloaded, which changes more: the peak, or the time of a step?

# %%
prediction_offload = None  # your guess: "peak" (falls more) or "time" (rises more)

# %%
width, depth, batch = (2048, 12, 8192) if LARGE else (512, 8, 4096)
net = torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.Tanh()) for _ in range(depth)])
dev.put(net)
x = dev.put(torch.randn(batch, width))
acts = depth * batch * width * 4 + x.nbytes  # saved: each tanh's output (the next layer saves the same storage), and x
modes = {"activations on the device": contextlib.nullcontext, "save_on_host(dev)": lambda: save_on_host(dev)}
if not dev.is_cuda:
    modes["torch save_on_cpu()"] = lambda: torch.autograd.graph.save_on_cpu()
    modes["torch save_on_cpu(pin_memory=True)"] = lambda: torch.autograd.graph.save_on_cpu(pin_memory=True)
runs = {}
for _ in range(2):  # twice each: the first runs warm up (on CUDA they create cuBLAS's workspaces)
    for name, offload in modes.items():
        net.zero_grad(set_to_none=True)
        with dev.measure() as m:
            with offload():
                loss = net(x).square().mean()
            loss.backward()
            del loss
        runs[name] = (m.peak_delta, m.wall_s, [p.grad.clone() for p in net.parameters()])
peak_on, t_on, g_on = runs["activations on the device"]
peak_off, t_off, g_off = runs["save_on_host(dev)"]
print(f"saved for backward: {format_bytes(acts)}")
for name, (peak, t, _) in runs.items():
    print(f"{name:<36} peak +{format_bytes(peak):>11} ({(peak - peak_on) / MiB:+7.1f} MiB)  {t * 1e3:5.0f} ms")
print(f"offloading: the peak falls by {1 - peak_off / peak_on:.0%} ({(peak_on - peak_off) / acts:.0%} of the saved "
      f"bytes), the step takes {t_off / t_on - 1:+.0%} time ({guess(prediction_offload)})")

# %% [markdown]
# Offloading lowers the peak by most of the saved activations, and the gradients are unchanged.
# It costs a copy out and a copy back of every saved tensor. Here that is a host-memory copy (the
# time printed above, on this CPU). On a real card it crosses the link of section 2, and the step
# slows by more unless the copies overlap with compute. On the virtual card, `save_on_cpu` does not
# lower the peak, and with pinned copies raises it: its copies are CPU tensors, counted like the
# card's own. (They are one per saved tensor, so a tanh output that two layers save is copied
# twice.) It is not a bug of `save_on_cpu`: on CUDA its copies are host memory the card does not
# hold.

# %%
assert peak_on - peak_off > 0.5 * acts, (peak_on, peak_off, acts)  # most of the saved bytes left the card
assert all(torch.allclose(a, b) for a, b in zip(g_on, g_off))  # the same gradients
if not dev.is_cuda:  # the virtual card counts save_on_cpu's host copies as its own memory
    assert runs["torch save_on_cpu()"][0] >= peak_on - 0.05 * acts, runs["torch save_on_cpu()"][0]
    assert runs["torch save_on_cpu(pin_memory=True)"][0] > peak_on, runs["torch save_on_cpu(pin_memory=True)"][0]

# %% [markdown]
# ## 4. RAM against disk: the cliff that swap gives
#
# Swap moves memory pages to disk when RAM runs out. We can see the same cliff without exhausting
# RAM. A tensor backed by a file (memory-mapped) is read from disk the first time its pages are
# touched, and from RAM afterwards. Before the first read, the file is dropped from the page cache,
# and `page_cache_fraction` (the kernel's `mincore`) checks that it was.
#
# **Predict.** How much slower is the first read of a disk-backed tensor than a read of one in RAM?

# %%
prediction_slowdown = None  # your guess: the cold read is how many times slower than RAM


# %%
def read_time(t: torch.Tensor, repeats: int = 1) -> float:
    """Seconds to read every element of ``t`` once (the fastest of ``repeats`` reads)."""
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        t.sum()
        best = min(best, time.perf_counter() - t0)
    return best


n = (1024 if LARGE else 256) * MiB // 4
ram = torch.randn(n)
ram.sum()  # the first read pays page faults
t_ram = read_time(ram, 3)
with tempfile.TemporaryDirectory(dir=os.getcwd()) as tmp:
    path = os.path.join(tmp, "tensor.bin")
    ram.numpy().tofile(path)
    fd = os.open(path, os.O_RDONLY)
    os.fsync(fd)
    if hasattr(os, "posix_fadvise"):
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)  # ask the kernel to drop the file from the page cache
    os.close(fd)
    cached_before = page_cache_fraction(path)
    disk = torch.from_file(path, shared=False, size=n, dtype=torch.float32)
    t_cold = read_time(disk)
    cached_after = page_cache_fraction(path)
    t_warm = read_time(disk, 3)
    del disk
evicted = cached_before is not None and cached_before < 0.1
size = n * 4
print(f"in the page cache before the first read: "
      f"{'unknown' if cached_before is None else f'{cached_before:.0%}'} of the file; after it: "
      f"{'unknown' if cached_after is None else f'{cached_after:.0%}'}")
print(f"RAM          {size / t_ram / 1e9:6.1f} GB/s")
print(f"disk, cold   {size / t_cold / 1e9:6.1f} GB/s   ({t_cold / t_ram:.0f}x slower than RAM; "
      f"{guess(prediction_slowdown, '{}x')})")
print(f"disk, warm   {size / t_warm / 1e9:6.1f} GB/s   (its pages are in RAM now)")
if not evicted:
    print("the file could not be dropped from the page cache here (tmpfs?): the 'cold' read was not cold")

# %% [markdown]
# A cold read waits for the disk. Once the pages are in RAM, the same tensor reads at RAM speed.
# Swapping a training set behaves like the cold read on every pass, because each epoch touches the
# data again after other pages have pushed it out. The monitor (`%vram watch`) shows swap use and
# the page-in/out rate live, which is how to tell that this is happening.

# %%
if evicted:
    assert t_cold > 2 * t_ram, (t_cold, t_ram)
    assert t_warm < t_cold, (t_warm, t_cold)
    assert cached_after is not None and cached_after > 0.9, cached_after  # the read brought the file into RAM

# %% [markdown]
# ### The swap file: Linux and Windows
#
# **Correction (B2, in part).** Article 004 advises a fixed size of virtual memory, rather than one
# the system adjusts by itself, to avoid fragmenting the disk. On Linux there is nothing to fix: a
# swap file never grows. It is allocated in full when it is made, and `/proc/swaps` lists it at
# that size. These are the commands that make one (shown, not run here: they need root):
#
# ```
# sudo fallocate -l 8G /swapfile      # or: sudo dd if=/dev/zero of=/swapfile bs=1M count=8192
# sudo chmod 600 /swapfile
# sudo mkswap /swapfile
# sudo swapon /swapfile
# ```
#
# (`swapon` refuses a file with holes, which is why it is written or `fallocate`d in full.) To
# change the size, one runs `swapoff`, resizes the file and runs `mkswap` and `swapon` again. A
# swap partition is fixed too. A size that grows is the Windows *pagefile* (`pagefile.sys`). Its
# default, "System managed size", grows as the memory committed nears its limit. "Custom size" with
# the initial size equal to the maximum fixes it. The article's advice is about that setting: a
# fixed pagefile never has to grow during a run. Whether its fragmentation on disk costs
# anything on an SSD, this lesson does not measure; we cannot run Windows here. What is measured
# above holds on both systems: swap is far slower than RAM.
#
# This machine's swap, read from `/proc/swaps` and `/proc/sys/vm/swappiness` (read only):

# %%
areas = read_swaps()
for a in areas:
    print(f"{a.filename}: a {a.kind}, {format_bytes(a.size)}, {format_bytes(a.used)} used, priority {a.priority}")
if not areas:
    print("/proc/swaps lists no swap area: this machine has no swap (many cloud machines and "
          "Kubernetes nodes run without one)")
with contextlib.suppress(OSError):
    with open("/proc/sys/vm/swappiness") as f:
        print(f"vm.swappiness = {f.read().strip()} (how readily the kernel swaps anonymous memory "
              "rather than drop page cache; 0 to 200 on current kernels)")
host = vramlab.snapshot().host
print(f"swap on this machine: {format_bytes(host.swap_used)} used of {format_bytes(host.swap_total)}, "
      f"{format_bytes(host.swap_in)} paged in and {format_bytes(host.swap_out)} out since boot")

# %% [markdown]
# ## 5. Fewer bytes: transfer in half or quarter precision
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
print(f"{'format':<14}{'bytes':>12}{'of fp32':>9}{'max rel. error':>16}{'copy ms':>9}")
for name, data, back in rows:
    copy_ms[name] = measure_copy(dev, data.nbytes, repeats=7, fastest=True).seconds * 1e3  # the fastest of 7
    errors[name] = ((back - t).abs().max() / t.abs().max()).item()
    print(f"{name:<14}{format_bytes(data.nbytes):>12}{data.nbytes / t.nbytes:>9.2f}{errors[name]:>16.2e}"
          f"{copy_ms[name]:>9.2f}")
torch.set_num_threads(threads)
print(f"int8 moves in {copy_ms['int8 + scale'] / copy_ms['float32']:.2f} of the time of float32, "
      f"float16 in {copy_ms['float16'] / copy_ms['float32']:.2f}")

# %% [markdown]
# The copy time falls with the bytes. The error is the price. bf16 keeps fp32's range but only 8
# significant bits, so it rounds more coarsely than fp16, which has 11. int8's error is at most
# half a step of its scale.

# %%
assert copy_ms["int8 + scale"] < 0.75 * copy_ms["float32"], copy_ms  # a quarter of the bytes moves faster
assert errors["float16"] < errors["bfloat16"], errors
assert ((dequantize_int8(q, scale) - t).abs().max() <= scale / 2 + 1e-6).item()

# %% [markdown]
# ## 6. Smart batching: length buckets waste less padding
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
print(f"random batches:   {rand.wasted:.1%} of tokens are padding ({guess(prediction_wasted, '{:.0%}')})")
print(f"bucketed batches: {buck.wasted:.1%} of tokens are padding")
print(f"tokens to compute and move per epoch: {rand.padded:,} random, {buck.padded:,} bucketed "
      f"({rand.padded / buck.padded:.1f}x fewer)")

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
    print(f"{k:<9} worst batch {'{} x {}'.format(*padded_shape(worst[k])):>9} tokens: peak "
          f"{'+' + format_bytes(peaks[k]['worst']):>12};  median batch "
          f"{'{} x {}'.format(*padded_shape(median[k])):>9}: {'+' + format_bytes(peaks[k]['median']):>12}")
peak_ratio = peaks["bucketed"]["worst"] / peaks["random"]["worst"]
median_ratio = peaks["bucketed"]["median"] / peaks["random"]["median"]
print(f"the worst bucketed step's peak is {peak_ratio:.2f} of the worst random one's "
      f"({guess(prediction_peak_ratio, '{}')}); the median step's is {median_ratio:.2f}")
print(f"the longest sequence has {max(lengths)} tokens; "
      + ("both worst batches are padded to it, with the same number of sequences"
         if padded_shape(worst["random"]) == padded_shape(worst["bucketed"]) else "the worst batches differ in shape"))
fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(8, 3))
ax1.bar(list(stats), [s.wasted * 100 for s in stats.values()])
ax1.set_ylabel("% of tokens that are padding")
for i, part in enumerate(("worst", "median")):
    ax2.bar(np.arange(2) + 0.4 * i, [peaks[k][part] / MiB for k in schemes], width=0.4, label=f"{part} batch")
ax2.set_xticks(np.arange(2) + 0.2, list(schemes))
ax2.set_ylabel("peak MiB added by a step")
ax2.legend(fontsize=8)
fig.tight_layout()

# %% [markdown]
# Bucketing cuts the padding, and with it the bytes computed and moved per epoch, by the factor
# printed above, and the typical step needs far less memory. The peak does not fall: it is set by
# the longest sequence. In either order, the batch that holds it is padded to its length, and with
# equal batch sizes that batch is the same size, so the worst step's peak is the same. Sizing the
# card for bucketed training means sizing it for that batch. To lower the peak as well, batches
# must be cut by a token budget (fewer sequences when they are long), which bucketing makes
# efficient; see exercise 3.

# %%
assert buck.wasted < 0.5 * rand.wasted, (buck.wasted, rand.wasted)
assert rand.real == buck.real == sum(lengths)
assert padded_shape(worst["random"]) == padded_shape(worst["bucketed"]) == (batch, max(lengths))
assert abs(peak_ratio - 1) < 0.01, peaks  # the same worst batch: the same peak
assert median_ratio < 0.5, peaks  # ... while the typical step needs far less

# %% [markdown]
# ## Summary
#
# The article is right about the price of moving data: the host link is many times slower than
# the card's own memory (section 2's datasheet ratios), and disk-backed swap is slower again. It
# is wrong about when it happens. PyTorch does not swap: a tensor that does not fit is an error,
# and data crosses only when code offloads it (at a cost in time that was measured), or on managed
# memory, or through Windows' fallback. Fewer bytes (half precision, int8, less padding) move faster.
# Bucketing cuts the average cost, not the peak. A Linux swap file has a fixed size by
# construction; a growing one is Windows' pagefile.
#
# ## Exercises
#
# 1. In section 3, offload only the first half of the layers. How do the peak and the time change?
# 2. In section 6, make the pools smaller (`bucketed_batches(..., bucket_batches=5)`), then 1.
#    What happens to the padding?
# 3. In section 6, cut bucketed batches by a token budget instead of 32 sequences: as many
#    sequences as fit in `budget = 32 * median length` padded tokens. What is the largest batch now,
#    and what does its step's peak become?
#
# <details><summary>Solutions</summary>
#
# 1. Wrap only the first half of the forward in `save_on_host(dev)`. The peak should lie between
#    the two measured in section 3, since about half the activations stay on the card, and so
#    should the time, since about half make the round trip (CPU timings vary from run to run). The
#    code below measures both.
# 2. Smaller pools sort over fewer sequences, so lengths in a batch vary more and padding rises.
#    With pools of one batch, sorting changes nothing: the padding is the random figure. Larger
#    pools waste less but make the batch order less random. The code below computes all three.
# 3. The code below cuts sorted pools into batches of at most `budget` padded tokens. The longest
#    sequences then go in small batches, and the largest step's peak falls well below section 6's.
#
# </details>

# %% tags=["solution"]
# solution 1: the first half of the layers offloaded
half_depth = depth // 2
for _ in range(2):  # the first run warms up
    net.zero_grad(set_to_none=True)
    with dev.measure() as m:
        with save_on_host(dev):
            h = net[:half_depth](x)
        loss = net[half_depth:](h).square().mean()
        loss.backward()
        del loss, h
print(f"half offloaded: peak +{format_bytes(m.peak_delta)}, {m.wall_s * 1e3:.0f} ms "
      f"(none offloaded +{format_bytes(peak_on)}, {t_on * 1e3:.0f} ms; all +{format_bytes(peak_off)}, "
      f"{t_off * 1e3:.0f} ms)")

# solution 2: the padding against the pool size
for pool in (50, 5, 1):
    s = padding_stats(lengths, bucketed_batches(lengths, batch, bucket_batches=pool))
    print(f"pools of {pool:>2} batch{'es' if pool > 1 else '  '}: {s.wasted:.1%} of tokens are padding "
          f"(random: {rand.wasted:.1%})")

# solution 3: bucketed batches cut by a token budget
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
print(f"token budget {budget:,}: {len(token_batches)} batches, {tb.wasted:.1%} padding; the most tokens "
      f"{'{} x {}'.format(*padded_shape(largest))}, the longest {'{} x {}'.format(*padded_shape(longest))}; "
      f"the larger of their peaks +{format_bytes(peak_tb)} ({peak_tb / peaks['bucketed']['worst']:.2f} of "
      "section 6's worst)")
