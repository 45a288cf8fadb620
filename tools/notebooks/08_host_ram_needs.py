# %% [markdown]
# # 08 · Host RAM: how much a job needs
#
# Terms are explained in the [glossary](../docs/glossary.md); the claim ids (A1, B6, …) are those of
# [`docs/claims.md`](../docs/claims.md).
#
# **Claims (curriculum B1, B3).** The second source article gives RAM tiers by task (16 GB for
# simple models, 32 GB for CNNs and RNNs, 64 GB or more for deep learning on big data), and
# advises loading data in mini-batches rather than all at once. We turn both into measurements of
# this process's RAM:
#
# 1. a RAM-needs calculation, checked against the measured peak, and set against the tiers;
# 2. the whole dataset in memory against streaming mini-batches, and a memory-mapped scan.
#
# Lesson 04 measured what happens when data does not fit in RAM (disk and swap); this one is
# about what a job keeps in RAM in the first place, and lesson 09 about getting memory back. The
# training step runs on the lesson's device: without a CUDA GPU, a virtual card of 1 GiB whose
# tensors live in this process's RAM. **On a CPU-only machine host RSS therefore includes the
# device's tensors**; on a CUDA machine it does not. Here they are a linear model and one batch.

# %%
import os
import tempfile

import matplotlib.pyplot as plt
import numpy as np
import torch

import vramlab
from vramlab.i18n import tr
from vramlab.lessons.predict import guess
from vramlab import format_bytes
from vramlab.lessons import ramplan

torch.manual_seed(0)
dev = vramlab.pick_device(virtual="1GiB")
LARGE = dev.large  # the one size switch: a 1 GiB dataset instead of 256 MiB on a big GPU machine
MiB, GiB = 2**20, 2**30
print(dev)

# %% [markdown]
# ## 1. How much RAM does a job need?
#
# First, what this process may use. In a container, on Binder or under a job scheduler, the limit
# is the **cgroup's**, not the machine's RAM: the kernel kills the process at the cgroup limit
# even when `free` shows plenty. vramlab reads the effective one (lesson 00 showed the layers):

# %%
host = vramlab.snapshot().host
# where the limit comes from: physical RAM, or the cgroup file that sets it (a file's name, as it is)
source = tr("physical RAM") if host.limit_source == "physical RAM" else host.limit_source
print(tr("physical RAM {total}; effective limit {limit} (from {source}); available now {available}",
         total=format_bytes(host.total), limit=format_bytes(host.limit), source=source,
         available=format_bytes(host.available)))

# %% [markdown]
# A limit below the machine's RAM, at work. Making a cgroup needs root, so the next cell uses a
# limit any user can set: it starts two child Pythons that each ask for 512 MiB and write to every
# page, one as it is and one under an address-space limit of its own size plus 256 MiB
# (`RLIMIT_AS`, what `prlimit --as` and `ulimit -v` set). RLIMIT_AS caps virtual memory, not RSS,
# so it is a relative of a container's limit, not the same thing; the lesson is the same: the
# limit refuses what the machine's RAM could give. A cgroup's limit is harsher: the allocation
# succeeds, and the kernel kills the process when its pages are touched past the limit.

# %%
import resource
import subprocess
import sys

CHILD = """
import resource, sys
ask, headroom = int(sys.argv[1]), int(sys.argv[2])
size = int(open("/proc/self/statm").read().split()[0]) * resource.getpagesize()
if headroom:
    resource.setrlimit(resource.RLIMIT_AS, (size + headroom, size + headroom))
try:
    block = bytearray(ask)
    block[::4096] = bytes(len(range(0, ask, 4096)))  # write to every page
    print("allocated")
except MemoryError:
    print("MemoryError")
"""


def child_allocates(ask: int, headroom: int) -> str:
    """What a fresh Python says when it asks for ``ask`` bytes under RLIMIT_AS = its size + ``headroom`` (0: none)."""
    env = {"PATH": os.environ.get("PATH", ""), "LC_ALL": "C.UTF-8"}  # set explicitly, as for any child
    run = subprocess.run([sys.executable, "-c", CHILD, str(ask), str(headroom)], capture_output=True, text=True,
                         env=env, timeout=120)
    return run.stdout.strip() or run.stderr.strip()[-200:]


def said(answer: str) -> str:
    """A child's answer for the learner: "allocated" in words, an exception's name as it is."""
    return tr("allocated") if answer == "allocated" else answer


ask = 512 * MiB
unlimited, limited = child_allocates(ask, 0), child_allocates(ask, 256 * MiB)
print(tr("{ask} asked, {available} available: without a limit {unlimited}; ",
         ask=format_bytes(ask), available=format_bytes(host.available), unlimited=said(unlimited))
      + tr("under RLIMIT_AS = its size + {headroom}: {limited}",
           headroom=format_bytes(256 * MiB), limited=said(limited)))
print(tr("this kernel's own limit: {limit}, from {source}", limit=format_bytes(host.limit), source=source))

# %%
assert limited == "MemoryError", limited  # the limit refused it...
if host.available > 2 * ask:
    assert unlimited == "allocated", unlimited  # ...though RAM had room

# %% [markdown]
# A job's RAM is a sum of parts that we can name before running it (`ramplan.ram_needs`): the
# interpreter and its libraries, the dataset if it is loaded whole, the batches in flight, pinned
# staging copies, model copies on the host, and data-loader worker processes.
#
# The job here: a dataset of float32 rows written to a `.npy` file, read whole with `np.load`, and
# a linear classifier trained on it in batches of 4096 rows, on the lesson's device.
#
# **Predict.** The dataset is 256 MiB on disk. By how much does this process's peak RSS exceed
# its RSS before the job?

# %%
prediction_peak_growth_mib = None  # your guess, in MiB

# %%
features, batch_rows = 256, 4096
rows = (1024 if LARGE else 256) * MiB // (features * 4)
workdir = tempfile.TemporaryDirectory(dir=os.getcwd())
path = os.path.join(workdir.name, "dataset.npy")
rng = np.random.default_rng(0)
with open(path, "wb") as f:  # written in chunks, so that writing it does not hold it all in RAM
    np.lib.format.write_array_header_1_0(f, {"descr": "<f4", "fortran_order": False, "shape": (rows, features)})
    for start in range(0, rows, 16384):
        f.write(rng.standard_normal((min(16384, rows - start), features), dtype=np.float32).tobytes())
dataset_bytes = rows * features * 4

model = dev.put(torch.nn.Linear(features, 10))
opt = torch.optim.SGD(model.parameters(), lr=0.1)


def train_on(batches) -> float:
    """One pass: the same step for every batch, however the batches are read."""
    total = 0.0
    for block in batches:
        x = dev.put(torch.from_numpy(block))
        y = x[:, :10].argmax(1)                     # labels that a linear model can learn
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        total += float(loss.detach())
    return total


def whole_job() -> float:
    data = np.load(path)                            # the whole file in RAM
    return train_on(data[i:i + batch_rows] for i in range(0, len(data), batch_rows))


plan = ramplan.ram_needs(dataset_bytes=dataset_bytes, load="whole", batch_bytes=batch_rows * features * 4,
                         model_parameters=sum(p.numel() for p in model.parameters()),
                         bytes_per_parameter=4 if dev.is_cuda else 16)
# one step before measuring: the first step loads lazily what the step needs (on CUDA, cuBLAS and its
# kernels: hundreds of MiB of host RAM), which is the process's baseline, not the job's
train_on([np.zeros((batch_rows, features), np.float32)])
_, whole = ramplan.peak_rss_during(whole_job)
print(plan.text())
if whole.exact:
    print("\n" + tr("measured: RSS before {before}, peak {peak} (+{growth:.0f} MiB; {guess}); ",
                    before=format_bytes(whole.before), peak=format_bytes(whole.peak), growth=whole.delta / MiB,
                    guess=guess(prediction_peak_growth_mib, "+{} MiB"))
          + tr("plan {plan}, off by {off:+.1f}%", plan=format_bytes(plan.total),
               off=100 * (whole.peak - plan.total) / plan.total))
else:
    print("\n" + tr(ramplan.NO_PEAK_RESET))

# %% [markdown]
# The plan is right to within a few percent because every large part of it is a buffer whose size
# we know. Now the same sum for jobs larger than this machine's, against the article's tiers
# (the "interpreter and libraries" line is a typical 2 GiB for torch with the CUDA runtime
# loaded; measure yours with `%vram`):

# %%
examples = {
    tr("tabular, 20 GB table read whole"): ramplan.ram_needs(
        dataset_bytes=20 * GiB, batch_bytes=64 * MiB, baseline=2 * GiB, limit=None),
    tr("CNN on ImageNet, streamed, 8 workers"): ramplan.ram_needs(
        dataset_bytes=140 * GiB, load="stream", batch_bytes=256 * 3 * 224 * 224 * 4, workers=8,
        pin_memory=True, model_parameters=25_600_000, baseline=2 * GiB, limit=None),
    tr("7B LLM: checkpoint loaded on the host (bf16)"): ramplan.ram_needs(
        load="stream", batch_bytes=8 * 4096 * 8, model_parameters=7_000_000_000, bytes_per_parameter=2,
        baseline=2 * GiB, limit=None),
    tr("the same, checkpoint and model both on the host"): ramplan.ram_needs(
        load="stream", batch_bytes=8 * 4096 * 8, model_parameters=7_000_000_000, bytes_per_parameter=2,
        model_copies=2, baseline=2 * GiB, limit=None),
}
for name, p in examples.items():
    tier = f"{p.tier_gb} GB" if p.tier_gb else "> 64 GB"
    print(f"{name:<48} {format_bytes(p.total):>11}  -> {tier}")

# %% [markdown]
# The tier follows from *what is held in RAM at once*, not from the kind of model. The article puts
# CNNs at 32 GB, but a CNN trained on ImageNet with streamed data needs well under 16 GB of host
# RAM: the 140 GB of images never sit in memory together. A "simple" tabular model over a table
# read whole needs 32 GB. And one detail, loading a checkpoint next to the model instead of into
# it, moves a 7B model's host side from the 32 GB tier to the 64 GB one. (These tiers are the plan's
# arithmetic on stated sizes, not measurements, so no assert checks them. What was measured is the
# plan against the real peak, above.) Monitoring, as the article advises
# (`%vram watch`, lesson 00), tells you which line dominates; the plan tells you before you run.

# %%
if whole.exact:  # (without a resettable high-water mark, the cell above said so)
    assert abs(whole.peak - plan.total) <= 0.15 * plan.total, (whole.peak, plan.total)
    assert whole.delta >= 0.9 * dataset_bytes  # the whole dataset was resident at the peak

# %% [markdown]
# ## 2. The whole dataset against streaming mini-batches
#
# **Predict.** The same pass over the same file, read 4096 rows at a time
# (`ramplan.iter_npy_batches`, plain file reads). What is the peak RSS growth now? And when the
# file is memory-mapped (`np.load(path, mmap_mode="r")`) and scanned batch by batch?

# %%
prediction_stream_growth_mib = None  # your guess, in MiB
prediction_mmap_growth_mib = None  # your guess, in MiB

# %%
plan_stream = ramplan.ram_needs(dataset_bytes=dataset_bytes, load="stream", batch_bytes=batch_rows * features * 4,
                                model_parameters=sum(p.numel() for p in model.parameters()),
                                bytes_per_parameter=4 if dev.is_cuda else 16)
_, stream = ramplan.peak_rss_during(lambda: train_on(ramplan.iter_npy_batches(path, batch_rows)))


def mmap_job() -> float:
    data = np.load(path, mmap_mode="r")             # no read yet: pages come in when touched
    return train_on(np.array(data[i:i + batch_rows]) for i in range(0, len(data), batch_rows))


_, mapped = ramplan.peak_rss_during(mmap_job)
growth = {tr("whole (np.load)"): whole.delta, tr("memory-mapped scan"): mapped.delta,
          tr("streamed reads"): stream.delta}
for k, v in growth.items():
    print(f"{k:<20} " + tr("peak RSS +{growth:7.1f} MiB", growth=v / MiB))
print(tr("streamed: {guess_stream}; memory-mapped: {guess_mmap}; ",
         guess_stream=guess(prediction_stream_growth_mib, "+{} MiB"),
         guess_mmap=guess(prediction_mmap_growth_mib, "+{} MiB"))
      + tr("plan for streaming: {size} above the baseline",
           size=format_bytes(plan_stream.total - plan_stream.item("interpreter and libraries"))))
print(tr("whole over streamed: x{ratio:.0f}, where rows / batch_rows = {n}",
         ratio=whole.delta / stream.delta, n=rows // batch_rows))

fig, ax = plt.subplots(figsize=(5.5, 2.6))
ax.barh(list(growth), [v / MiB for v in growth.values()], color=["#e15759", "#f28e2b", "#59a14f"])
ax.axvline(dataset_bytes / MiB, color="#888", ls="--", label=tr("dataset size"))
ax.set_xlabel(tr("peak RSS growth (MiB)"))
ax.set_title(tr("the same job, three ways to read the data"))
ax.legend(fontsize=8)
fig.tight_layout()

# %% [markdown]
# Streaming keeps one batch resident instead of the dataset: the article's advice holds, by the
# factor printed above. It is less than `rows / batch_rows`, because each batch's Python objects
# and the reader's own buffers come on top of the batch's bytes. The memory-mapped scan is the trap: it reads in batches
# too, but every page it touches stays *mapped into this process* and counts in its RSS, up to the
# whole file. Those pages are file-backed and clean, so the kernel can drop them under pressure
# (they are not anonymous memory that would need swap), but monitors and cgroup accounting see
# them, and they evict other data from the page cache.

# %%
if not (whole.exact and stream.exact and mapped.exact):
    print(tr(ramplan.NO_PEAK_RESET))
else:
    assert stream.delta < 0.1 * dataset_bytes, stream
    assert whole.delta > 5 * stream.delta, (whole.delta, stream.delta)
    assert mapped.delta > stream.delta  # the mapped pages of the scan are resident

# %%
workdir.cleanup()  # the dataset file

# %% [markdown]
# ## Exercises
#
# 1. Plan a job: a 6 GB dataset of images decoded to float32, read whole, 4 workers, batches of
#    128 images of 3 x 224 x 224, pinned memory, a ResNet-50 (25.6 M parameters) built on the host
#    and moved to the GPU. Which tier?
# 2. In section 2, why did the memory-mapped scan's RSS grow, although it copied each batch
#    (`np.array(...)`) and dropped it?
#
# <details><summary>Solutions</summary>
#
# 1. The code below makes the plan and prints it. One batch of 128 images of 3 × 224 × 224
#    float32 is 128 × 3 × 224 × 224 × 4 bytes (it prints the figure), and the plan holds several
#    in flight: the loader's prefetch per worker, the pinned copy, the one on the device. The tier
#    is the smallest of 16, 32 and 64 GB that holds the total. Note that the workers share the NumPy
#    array copy-on-write. A Python list of images would be copied into each worker as the workers
#    touch the objects' reference counts.
# 2. The copy is dropped, but the pages of the *file* that were read through the mapping stay
#    mapped into the process, and resident, until the mapping is closed or the kernel reclaims them.
#
# </details>

# %% tags=["solution"]
# solution 1, computed: the plan for the exercise's job
exercise = ramplan.ram_needs(dataset_bytes=6 * GiB, batch_bytes=128 * 3 * 224 * 224 * 4, workers=4,
                             pin_memory=True, model_parameters=25_600_000, baseline=2 * GiB, limit=None)
print(tr("one batch: {size} ({mb:.1f} MB)", size=format_bytes(128 * 3 * 224 * 224 * 4),
         mb=128 * 3 * 224 * 224 * 4 / 1e6))
print(exercise.text())
print(tr("tier: {gb} GB", gb=exercise.tier_gb) if exercise.tier_gb else tr("tier: more than 64 GB"))
