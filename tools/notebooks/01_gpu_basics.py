# %% [markdown]
# # 01 · GPU basics: parallel work is bounded by memory
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
import time

import matplotlib.pyplot as plt
import torch

import vramlab
from vramlab import format_bytes

torch.manual_seed(0)
dev = vramlab.pick_device(virtual="64MiB")
LARGE = dev.large  # the one size switch: bigger models on a big GPU
print(dev)

# %% [markdown]
# ## 1. Throughput against batch size, up to the wall
#
# A small multi-layer perceptron (MLP) is trained one step at a time on random data. For batch
# sizes 1, 2, 4, … we first run one step inside `dev.measure()` to see whether it fits, and
# then time a few steps. The doubling stops at the first out-of-memory error.
#
# **Predict.** By how much does throughput (samples per second) grow from batch 1 to the largest
# batch that fits? Where does the wall come?

# %%
prediction_speedup = 10.0  # edit me: throughput at the best batch / throughput at batch 1

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


def samples_per_second(batch_size: int, min_time: float = 0.25) -> float:
    train_step(batch_size)  # warm-up
    steps, t0 = 0, time.perf_counter()
    while steps < 3 or time.perf_counter() - t0 < min_time:
        train_step(batch_size)
        steps += 1
    if dev.is_cuda:
        torch.cuda.synchronize()
    return steps * batch_size / (time.perf_counter() - t0)


results = []  # (batch, peak bytes, samples/s)
oom = None
batch = 1
while batch <= 2**24:
    try:
        with dev.measure() as m:
            train_step(batch)
    except torch.OutOfMemoryError as e:
        # keep the error, not its traceback: the traceback's frames hold the failed step's tensors
        oom = (batch, e.with_traceback(None))
        break
    results.append((batch, m.peak, samples_per_second(batch)))
    batch *= 2
dev.cleanup()
for b, peak, thr in results:
    print(f"batch {b:>6}: peak {format_bytes(peak):>11}  {thr:>10,.0f} samples/s")
print(f"batch {oom[0]} does not fit: {str(oom[1]).split('. ')[1]}")

# %% [markdown]
# The out-of-memory error is an ordinary exception: it was caught, the step's tensors were
# released, and the loop went on. vramlab reads such an error and says what to do about it:

# %%
explanation = vramlab.explain_oom(oom[1], {"batch_size": oom[0]})
print(explanation.text())

# %%
batches = [r[0] for r in results]
throughput = [r[2] for r in results]
fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(9, 3.2))
ax1.plot(batches, throughput, "o-")
ax1.set_xscale("log", base=2)
ax1.set_xlabel("batch size")
ax1.set_ylabel("samples / s")
ax1.axvline(oom[0], color="#e15759", ls="--", label="out of memory")
ax1.legend()
ax2.plot(batches, [r[1] / 2**20 for r in results], "o-")
ax2.axhline(dev.capacity / 2**20, color="#e15759", ls="--", label="capacity")
ax2.set_xscale("log", base=2)
ax2.set_xlabel("batch size")
ax2.set_ylabel("peak MiB")
ax2.legend()
fig.tight_layout()

# %%
speedup = max(throughput) / throughput[0]
last_gain = throughput[-1] / throughput[-2]
print(f"predicted {prediction_speedup:.1f}x; measured {speedup:.1f}x from batch 1 to the best batch; "
      f"the last doubling that fit changed throughput by {last_gain:.2f}x")

# %% [markdown]
# Throughput rises with the batch because one step's fixed costs (launching each layer, Python,
# the optimizer) are shared by more samples, and because wide matrix products use the hardware
# better. It then flattens: the hardware is busy, and doubling the batch doubles the step time.
# On this CPU the rise is modest; on a GPU, with thousands of cores to fill, it is much larger.
# Memory, meanwhile, grows linearly with the batch (lesson 02 fits that line) until it meets the
# capacity: that, not compute, is where the batch stops growing.

# %%
assert oom is not None and oom[1].__class__ is torch.OutOfMemoryError  # the wall was hit
assert results[-1][1] <= dev.capacity  # every batch that ran fitted
assert speedup > 1.5, speedup  # batching pays
assert last_gain < 1.5, last_gain  # ... and then flattens
train_step(batches[-1])  # recovered: the largest batch that fits still trains

# %% [markdown]
# ## 2. Moving a model to the device
#
# **Claim (B6).** GPUs have their own memory and relieve the host. A model moved to the GPU
# takes the GPU's memory: its parameters' bytes, rounded up by the allocator to 512-byte blocks.
#
# **Predict.** A model with 8 M float32 parameters: how many bytes does it add to the device?

# %%
prediction_bytes = 32_000_000  # edit me

# %%
del model, opt  # section 1's model leaves the device
dev.cleanup()
print(f"on the device before: {format_bytes(dev.allocated())}")
big = torch.nn.Sequential(torch.nn.Linear(2000, 2000), torch.nn.Linear(2000, 2000))
param_bytes = sum(p.numel() * p.element_size() for p in big.parameters())
rounded = sum(-(-p.numel() * p.element_size() // 512) * 512 for p in big.parameters())
if dev.is_cuda:
    torch.zeros(1, device=dev.device)  # start CUDA first: its libraries cost host RAM of their own
host_before = vramlab.snapshot().host.process_rss
device_before = dev.allocated()
big = dev.put(big)
device_delta = dev.allocated() - device_before
host_delta = vramlab.snapshot().host.process_rss - host_before
print(f"parameters: {big[0].weight.numel() * 2 + 4000:,} ({format_bytes(param_bytes)}); predicted "
      f"{format_bytes(prediction_bytes)}")
print(f"device memory   {format_bytes(device_delta, signed=True)}")
print(f"host RSS        {format_bytes(host_delta, signed=True)}")

# %% [markdown]
# On a CUDA device the parameters are copied to the card and their host copies are freed, so the
# device grows by the parameters' bytes while the host does not (whether the host's RSS visibly
# *falls* depends on whether its allocator returns the freed pages to the kernel). On the virtual
# GPU the tensors stay in host memory and are counted as the card's, so the host does not change.
# The first CUDA tensor of a process is the exception to "the host is relieved": starting CUDA
# loads its libraries and costs hundreds of MiB of host RAM. That is why the cell starts CUDA
# before measuring.

# %%
assert device_delta == rounded, (device_delta, rounded)
assert rounded - param_bytes < 512 * len(list(big.parameters()))

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
