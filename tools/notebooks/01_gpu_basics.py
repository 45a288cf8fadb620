# %% [markdown]
# # 01 · GPU basics: parallel work is bounded by memory
#
# Terms are explained in the [glossary](../docs/glossary.md); the claim ids (A1, B6, …) are those of
# [`docs/claims.md`](../docs/claims.md).
#
# **Claims (curriculum A1, B6).** A GPU does many samples at once, but only as many as fit in its
# memory: throughput grows with the batch until memory becomes the wall. And a model moved to the
# GPU lives in the GPU's memory, not the host's.
#
# The first cell picks the device. On a machine with a CUDA GPU the lesson measures it. Without
# one it uses a *virtual GPU*: a card simulated on the CPU that counts every tensor's bytes exactly
# and raises the same `torch.OutOfMemoryError` a real card raises. Here the virtual card is a
# deliberately tiny 64 MiB one, so that the CPU reaches the wall in seconds; the code is the same
# on a real card, where the wall is further away.

# %%
import statistics
import time

import matplotlib.pyplot as plt
import torch

import vramlab
from vramlab import format_bytes
from vramlab.i18n import tr
from vramlab.lessons.predict import guess
from vramlab.runtime.oom import parse_oom_message

torch.manual_seed(0)
dev = vramlab.pick_device(virtual="64MiB")
LARGE = dev.large  # the one size switch: bigger models on a big GPU
print(dev)

# %% [markdown]
# ## 1. Throughput against batch size, up to the wall
#
# A small multi-layer perceptron (MLP) is trained one step at a time on random data. For batch
# sizes 1, 2, 4, … we run one step inside `dev.measure()` to see whether it fits and how much
# memory it needs at its peak, and we time it: two warm-up steps, then five timed rounds, of
# which we keep the median, so that one noisy round does not decide the shape.
#
# On the virtual card the timings are the CPU's, and the card does not slow anything down, so
# we can also time the batches that would *not* fit. That shows where throughput would go if
# memory were no limit.
#
# **Predict.** By how much does throughput (samples per second) grow from batch 1 to the largest
# batch that fits? Does it keep growing up to the wall, or flatten before it?

# %%
prediction_speedup = None  # your guess: throughput at the best batch / throughput at batch 1

# %%
width = 4096 if LARGE else 1024
model = torch.nn.Sequential(
    torch.nn.Linear(784, width), torch.nn.ReLU(),
    torch.nn.Linear(width, width), torch.nn.ReLU(),
    torch.nn.Linear(width, 10),
)
dev.put(model)
opt = torch.optim.SGD(model.parameters(), lr=0.01)


def train_step(batch_size: int) -> None:
    x = torch.randn(batch_size, 784, device=dev.device)
    y = torch.randint(0, 10, (batch_size,), device=dev.device)
    loss = torch.nn.functional.cross_entropy(model(x), y)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()


def samples_per_second(batch_size: int, rounds: int = 5, min_time: float = 0.05) -> float:
    """Median throughput of ``rounds`` timed rounds, after two warm-up steps."""
    for _ in range(2):
        train_step(batch_size)
    rates = []
    for _ in range(rounds):
        if dev.is_cuda:
            torch.cuda.synchronize()
        steps, t0 = 0, time.perf_counter()
        while steps < 1 or time.perf_counter() - t0 < min_time:
            train_step(batch_size)
            steps += 1
        if dev.is_cuda:
            torch.cuda.synchronize()
        rates.append(steps * batch_size / (time.perf_counter() - t0))
    return sorted(rates)[len(rates) // 2]


MAX_TIMED = 2**14 if dev.is_cuda else 2**12  # the largest batch timed
results = []  # (batch, peak bytes or None when it does not fit, samples/s)
oom = None
batch = 1
while batch <= MAX_TIMED:
    peak = None
    try:
        with dev.measure() as m:
            train_step(batch)
        peak = m.peak
    except torch.OutOfMemoryError as e:
        if oom is None:
            # keep the error, not its traceback: the traceback's frames hold the failed step's tensors
            oom = (batch, e.with_traceback(None))
        if dev.is_cuda:
            break  # a real card cannot run it at all
    results.append((batch, peak, samples_per_second(batch)))
    batch *= 2
dev.cleanup()
for b, peak, thr in results:
    fits = format_bytes(peak) if peak is not None else tr("does not fit")
    print(tr("batch {b:>6}: peak {fits:>12}  {thr:>12,.0f} samples/s", b=b, fits=fits, thr=thr))

# %% [markdown]
# On a big GPU the wall is far beyond any batch worth timing: a step at the wall would take
# minutes. There the cell above stops at the largest timed batch without an error. The line
# that memory follows (lesson 02) then says where the wall is, and one step at twice that batch
# shows the error, which comes as soon as the first tensor that does not fit is allocated.

# %%
fitted = [(b, p) for b, p, _ in results if p is not None]
(b1, p1), (b2, p2) = fitted[-2], fitted[-1]
per_sample = (p2 - p1) / (b2 - b1)  # bytes per sample, from the two largest batches that fit
fixed = p2 - per_sample * b2
if oom is None:  # the wall was not reached by timing: predict it, then show it
    predicted_wall = int((dev.budget - fixed) / per_sample)
    try:
        with dev.measure():
            train_step(2 * predicted_wall)
    except torch.OutOfMemoryError as e:
        oom = (2 * predicted_wall, e.with_traceback(None))
    dev.cleanup()
figures = parse_oom_message(str(oom[1]))  # the figures in the error's message
print(tr("memory: {fixed} fixed + {per_sample} per sample; ", fixed=format_bytes(fixed),
         per_sample=format_bytes(per_sample))
      + tr("batch {b:,} does not fit: GPU {gpu} has a total capacity of {total} of which {free} is free",
           b=oom[0], gpu=figures["gpu_index"], total=format_bytes(figures["total"]),
           free=format_bytes(figures["free"])))

# %% [markdown]
# The out-of-memory error is an ordinary exception: it was caught, the step's tensors were
# released, and the loop went on. vramlab reads such an error and says what to do about it (the
# remedies, in the order to try them, are listed in `docs/oom-checklist.md`):

# %%
explanation = vramlab.explain_oom(oom[1], {"batch_size": oom[0]})
print(explanation.text())
advised = oom[0] // 2  # no record of this step was taken, so the advice is to halve: run it
with dev.measure() as m:
    train_step(advised)
print(tr("batch {b:,}, as advised: peak {peak}, it fits", b=advised, peak=format_bytes(m.peak)))
assert explanation.fitting_batch_size is None  # nothing derived without a record of the step...
first = explanation.suggestions[0]  # the advice as data: its kind and its figures
assert (first.kind, first.batch, first.to) == ("batch-halving", oom[0], advised)  # ...halve

# %%
batches = [r[0] for r in results]
throughput = [r[2] for r in results]
fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(9, 3.2))
ax1.plot(batches, throughput, "o-")
ax1.set_xscale("log", base=2)
ax1.set_xlabel(tr("batch size"))
ax1.set_ylabel(tr("samples / s (median of 5)"))
if oom[0] <= batches[-1]:
    ax1.axvline(oom[0], color="#e15759", ls="--", label=tr("out of memory"))
    ax1.legend()
ax2.plot([b for b, _ in fitted], [p / 2**20 for _, p in fitted], "o-")
ax2.axhline(dev.capacity / 2**20, color="#e15759", ls="--", label=tr("capacity"))
ax2.set_xscale("log", base=2)
ax2.set_xlabel(tr("batch size"))
ax2.set_ylabel(tr("peak MiB"))
ax2.legend()
fig.tight_layout()

# %%
best = max(throughput)
fit_thr = [t for (b, p, t) in results if p is not None]
speedup = max(fit_thr) / throughput[0]
saturated_at = next(b for b, _, t in results if t >= 0.9 * best)  # first batch within 10% of the best
gains = [throughput[i + 1] / throughput[i] for i in range(len(throughput) - 1)]
early, late = statistics.median(gains[:4]), statistics.median(gains[-4:])  # medians: robust to one noisy timing
need_at_saturation = fixed + per_sample * saturated_at
print(tr("measured {speedup:.1f}x from batch 1 to the best batch that fits ({guess})",
         speedup=speedup, guess=guess(prediction_speedup, "{}x")))
print(tr("the median gain per doubling was {early:.2f}x over the first four doublings, {late:.2f}x over the last four",
         early=early, late=late))
print(tr("throughput comes within 10% of its best at batch {b:,}, where a step needs {need}: ",
         b=saturated_at, need=format_bytes(need_at_saturation))
      + tr("{share:.1%} of this card's {capacity}; the wall is at batch {wall:,}",
           share=need_at_saturation / dev.capacity, capacity=format_bytes(dev.capacity), wall=oom[0]))
print(tr("throughput was still rising at the wall: memory stopped the batch before the hardware was busy")
      if saturated_at >= oom[0] else
      tr("throughput had flattened before the wall: past that batch, memory buys no more speed"))

# %% [markdown]
# Read the shape from the lines above. Throughput rises with the batch because one step's fixed
# costs (launching each layer, Python, the optimizer) are shared by more samples, and because wide
# matrix products use the hardware better. The gains shrink with every doubling: once the
# hardware is busy, doubling the batch doubles the step time. Memory, meanwhile, grows linearly
# with the batch (lesson 02 fits that line) until it meets the capacity.
#
# Which comes first depends on the card, and the last line above says which it was here. On a
# card whose wall comes first, memory stops the batch while the hardware could still do more. On a
# big GPU it is the other way round: throughput saturates at a batch that needs a small fraction of
# the card, and the wall sits far beyond it. **"More VRAM means more parallelism" is true only up
# to saturation.** Past it, more memory buys a larger batch, not a faster epoch. Whether a larger
# batch is worth having is a training question: see lesson 02.

# %%
assert oom is not None and oom[1].__class__ is torch.OutOfMemoryError  # the wall was hit
assert all(p <= dev.capacity for _, p in fitted)  # every batch that ran fitted
assert speedup > 2, speedup  # batching pays
assert early > late, (early, late)  # ... and pays less with every doubling
train_step(fitted[-1][0])  # recovered: the largest batch that fits still trains

# %% [markdown]
# ## 2. Moving a model to the device
#
# **Claim (B6).** GPUs have their own memory and relieve the host. A model moved to the GPU
# takes the GPU's memory: its parameters' bytes, in the blocks PyTorch's caching allocator hands
# out. Each request is rounded up to 512 bytes; a tensor over 1 MiB gets a segment of its own
# (rounded up to 2 MiB, or 20 MiB under 10 MiB), and when less than 1 MiB of that segment would be
# left over, the whole segment is its block.
#
# **Predict.** A model with 8 M float32 parameters: how many bytes does it add to the device?

# %%
prediction_bytes = None  # your guess, in bytes

# %%
del model, opt  # section 1's model leaves the device
dev.cleanup()
print(tr("on the device before: {size}", size=format_bytes(dev.allocated())))
big = torch.nn.Sequential(torch.nn.Linear(2000, 2000), torch.nn.Linear(2000, 2000))
param_bytes = sum(p.numel() * p.element_size() for p in big.parameters())
rounded = sum(-(-p.numel() * p.element_size() // 512) * 512 for p in big.parameters())


MiB = 2**20


def block_bytes(n: int) -> int:
    """The block a fresh request of n bytes gets (CUDACachingAllocator: round_size, get_allocation_size, should_split)."""
    n = -(-n // 512) * 512
    if n <= MiB:
        return n  # the small pool: carved out of 2 MiB segments
    segment = 20 * MiB if n < 10 * MiB else -(-n // (2 * MiB)) * 2 * MiB
    return n if segment - n > MiB else segment  # split only when more than 1 MiB remains


blocks = sum(block_bytes(p.numel() * p.element_size()) for p in big.parameters())
if dev.is_cuda:
    torch.zeros(1, device=dev.device)  # start CUDA first: its libraries cost host RAM of their own
host_before = vramlab.snapshot().host.process_rss
device_before = dev.allocated()
big = dev.put(big)
device_delta = dev.allocated() - device_before
host_delta = vramlab.snapshot().host.process_rss - host_before
print(tr("parameters: {n:,} ({size}); {guess}", n=big[0].weight.numel() * 2 + 4000, size=format_bytes(param_bytes),
         guess=guess(prediction_bytes, format_bytes)))
print(f"{tr('device memory'):<16}{format_bytes(device_delta, signed=True)}  "
      + tr("(512-byte rounding alone: {rounded}; the allocator's blocks: {blocks})",
           rounded=format_bytes(rounded), blocks=format_bytes(blocks)))
print(f"{tr('host RSS'):<16}{format_bytes(host_delta, signed=True)}")

# 64 MiB written straight on the device: does the host pay for them?
from vramlab.lessons.ramplan import release_free_heap

release_free_heap()  # freed heap pages go back first, so that new bytes need new pages
rss_before_fill = vramlab.snapshot().host.process_rss
filled = torch.ones(64 * MiB, dtype=torch.uint8, device=dev.device)
fill_host_delta = vramlab.snapshot().host.process_rss - rss_before_fill
del filled
dev.cleanup()
print(tr("64 MiB written on {device}: host RSS {change}", device=dev.device,
         change=format_bytes(fill_host_delta, signed=True)))

# %% [markdown]
# On a CUDA device the parameters are copied to the card and their host copies are freed, so the
# device grows by the parameters' bytes while the host does not (whether the host's RSS visibly
# *falls* depends on whether its allocator returns the freed pages to the kernel). On the virtual
# GPU the tensors stay in host memory and are counted as the card's, so the host does not change.
# The first CUDA tensor of a process is the exception to "the host is relieved": starting CUDA
# loads its libraries and costs hundreds of MiB of host RAM. That is why the cell starts CUDA
# before measuring.
#
# The last line is the claim itself: 64 MiB written straight on the device. On a CUDA card the
# host's RSS does not move, so the card's memory relieves the host's (not yet run on a GPU:
# `docs/gpu-runs/`). On the virtual card the bytes are host RAM and the RSS grows by all of
# them: a machine without a GPU has no second memory to relieve the first.

# %%
assert device_delta == blocks, (device_delta, blocks)  # the allocator's blocks, not the bare bytes
if dev.is_cuda:  # B6 on a card (not yet run on a GPU): bytes written there cost the host nothing
    assert fill_host_delta < 8 * MiB, fill_host_delta
else:  # the virtual card's bytes are host RAM: on a CPU-only machine nothing relieves the host
    assert fill_host_delta >= 60 * MiB, fill_host_delta

# %% [markdown]
# ## Exercises
#
# 1. Replace `torch.optim.SGD` with `torch.optim.Adam` and run section 1 again. Where is the wall
#    now, and why?
# 2. Make the network twice as deep. Does the largest batch halve?
#
# <details><summary>Solutions</summary>
#
# 1. Adam keeps two more tensors per parameter (the moving averages), so the fixed part of the
#    memory grows by twice the parameters' bytes and less is left for the batch: the wall comes
#    at the same or a smaller batch, depending on how much of the card the parameters take.
# 2. Roughly: the per-sample part (activations kept for backward) doubles, so the largest batch
#    about halves; the fixed part grows too, so slightly less than half.
#
# </details>
