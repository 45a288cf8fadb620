# %% [markdown]
# # 03 · The host link and offloading: when data has to move
#
# Terms are explained in the [glossary](../docs/glossary.md); the claim ids (A1, B6, …) are those of
# [`docs/claims.md`](../docs/claims.md).
#
# **Claim (curriculum A4).** Article 000 says that when the GPU's memory is not enough, data
# moves between host RAM and the GPU, and that this path is much slower than the GPU's own memory.
# The article's other two points on moving data have lessons of their own: the host's swap (B2)
# is lesson 04, and the fewer bytes that compression and smarter batching move (A5) are lesson 05.
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
# it cannot show the link's speed. This machine's RAM stands in for the speeds, and each section
# says what it measures. (Not yet run on a real card: vramlab's GPU runs are reported in
# `docs/gpu-runs/`.)

# %%
import contextlib
import sys
import time

import torch

import vramlab
from vramlab import format_bytes
from vramlab.i18n import N_, tr
from vramlab.lessons.predict import guess
from vramlab.lessons.transfer import measure_copy, save_on_host
from vramlab.runtime.oom import parse_oom_message
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
print(tr("held {held} of {budget}; asked for {more} more, with {host} of host RAM available",
         held=format_bytes(chunk), budget=format_bytes(dev.budget), more=format_bytes(chunk),
         host=format_bytes(host_available)))
outcome = N_("error") if oom is not None else N_("host RAM")
if oom is not None:
    requested = parse_oom_message(str(oom))["requested"]  # the size in the error's message
    print(tr("result: torch.OutOfMemoryError ({guess}): CUDA out of memory. Tried to allocate {requested}.",
             guess=guess(prediction_spill, answer=outcome), requested=format_bytes(requested)))
else:
    print(tr("result: the second tensor was allocated ({guess}): this driver backs the card "
             "with system memory (Windows' Sysmem Fallback?)", guess=guess(prediction_spill, answer=outcome)))
print(tr("allocated on the card before the request {before}, after it {after}",
         before=format_bytes(before), after=format_bytes(after)))

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
print(f"{'GPU':<12}{tr('memory GB/s'):>12}{tr('host link'):>16}{tr('link GB/s'):>10}{tr('ratio'):>7}   {tr('source')}")
ratios = {}
for n in names:
    p = get_preset(n)
    ratios[p.name] = p.bandwidth / p.host_link_bandwidth
    print(f"{p.name:<12}{p.bandwidth / 1e9:>12,.0f}{p.host_link:>16}{p.host_link_bandwidth / 1e9:>10,.0f}"
          f"{ratios[p.name]:>6.0f}x   {p.source}")
least, most = min(ratios, key=ratios.get), max(ratios, key=ratios.get)
print(tr("by the datasheets, a byte crossing the link costs {least_ratio:.0f}x ({least}) to {most_ratio:.0f}x "
         "({most}) what it costs in the card's own memory",
         least_ratio=ratios[least], least=least, most_ratio=ratios[most], most=most))

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
print(tr("{kind}: {bandwidth:.1f} GB/s for {size}", kind=pageable.kind, bandwidth=pageable.bandwidth / 1e9,
         size=format_bytes(pageable.nbytes)))
if dev.is_cuda:
    pinned = measure_copy(dev, nbytes, pinned=True)
    d2d = measure_copy(dev, nbytes, device_to_device=True)
    print(tr("{kind}: {bandwidth:.1f} GB/s ({ratio:.2f}x pageable; {guess})", kind=pinned.kind,
             bandwidth=pinned.bandwidth / 1e9, ratio=pinned.bandwidth / pageable.bandwidth,
             guess=guess(prediction_pinned_speedup, "{}x")))
    print(tr("{kind}: {bandwidth:.1f} GB/s, {ratio:.0f}x the pinned host→device copy", kind=d2d.kind,
             bandwidth=d2d.bandwidth / 1e9, ratio=d2d.bandwidth / pinned.bandwidth))
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
    print(tr("copy then compute {seq:.1f} ms; copy overlapped with compute {ovl:.1f} ms",
             seq=t_seq * 1e3, ovl=t_ovl * 1e3))
    del a, src, dst
else:
    print(tr("no CUDA device: pinned memory, the link and copy/compute overlap are not measured here ({guess})",
             guess=guess(prediction_pinned_speedup, "{}x")))

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
modes = {N_("activations on the device"): contextlib.nullcontext, "save_on_host(dev)": lambda: save_on_host(dev)}
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
print(tr("saved for backward: {size}", size=format_bytes(acts)))
for name, (peak, t, _) in runs.items():  # tr(name): the one mode named in words, in the notebook's language
    print(f"{tr(name):<36} " + tr("peak +{peak:>11} ({change:+7.1f} MiB)  {ms:5.0f} ms",
                                  peak=format_bytes(peak), change=(peak - peak_on) / MiB, ms=t * 1e3))
fall, slower = 1 - peak_off / peak_on, t_off / t_on - 1
outcome = N_("peak") if fall > slower else N_("time")  # which changed more
print(tr("offloading: the peak falls by {fall:.0%} ({share:.0%} of the saved bytes), ", fall=fall,
         share=(peak_on - peak_off) / acts)
      + tr("the step takes {slower:+.0%} time ({guess})", slower=slower,
           guess=guess(prediction_offload, answer=outcome)))

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
# ## Summary
#
# The article is right about the price of moving data: the host link is many times slower than
# the card's own memory (section 2's datasheet ratios). It is wrong about when it happens. PyTorch
# does not swap: a tensor that does not fit is an error, and data crosses only when code offloads
# it (at a cost in time that was measured), or on managed memory, or through Windows' fallback.
# Lesson 04 measures the host's own swap, and lesson 05 the bytes that fewer bits and less padding
# save.
#
# ## Exercises
#
# 1. In section 3, offload only the first half of the layers. How do the peak and the time change?
#
# <details><summary>Solutions</summary>
#
# 1. Wrap only the first half of the forward in `save_on_host(dev)`. The peak should lie between
#    the two measured in section 3, since about half the activations stay on the card, and so
#    should the time, since about half make the round trip (CPU timings vary from run to run). The
#    code below measures both.
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
print(tr("half offloaded: peak +{peak}, {ms:.0f} ms ", peak=format_bytes(m.peak_delta), ms=m.wall_s * 1e3)
      + tr("(none offloaded +{none_peak}, {none_ms:.0f} ms; all +{all_peak}, {all_ms:.0f} ms)",
           none_peak=format_bytes(peak_on), none_ms=t_on * 1e3, all_peak=format_bytes(peak_off), all_ms=t_off * 1e3))
