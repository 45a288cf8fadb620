# %% [markdown]
# # 06 · Host RAM: how much you need, and getting it back
#
# Terms are explained in the [glossary](../docs/glossary.md); the claim ids (A1, B6, …) are those of
# [`docs/claims.md`](../docs/claims.md).
#
# **Claims (curriculum B1, B3, B4, B5).** The second source article gives RAM tiers by task
# (16 GB for simple models, 32 GB for CNNs and RNNs, 64 GB or more for deep learning on big data),
# and three habits: load data in mini-batches rather than all at once; free what you no longer
# need with `del` and the garbage collector; and rely on frameworks, such as PyTorch, that manage
# memory for you. We turn each into a measurement of this process's RAM:
#
# 1. a RAM-needs calculation, checked against the measured peak, and set against the tiers;
# 2. the whole dataset in memory against streaming mini-batches;
# 3. `del` alone against `del` plus `gc.collect()`, on reference cycles;
# 4. the traceback that keeps an out-of-memory error's tensors alive, and `%vram free`;
# 5. the caching allocator: memory that is freed but not given back.
#
# Lesson 03 measured what happens when data does not fit in RAM (disk and swap); this one is
# about what a job keeps in RAM in the first place. Sections 3 to 5 use the device. Without a CUDA
# GPU it is a small virtual card of 1 GiB: the virtual GPU allocates each tensor in host memory
# before it checks its capacity, so a small card keeps section 4's deliberately oversized request
# cheap. **Without a GPU, the virtual card's tensors live in this process's RAM**, so on a CPU-only
# machine host RSS includes them; on a CUDA machine it does not.

# %%
import gc
import os
import sys
import tempfile

import matplotlib.pyplot as plt
import numpy as np
import torch

import vramlab
from vramlab.lessons.predict import guess
from vramlab import format_bytes
from vramlab.lessons import ramplan

torch.manual_seed(0)
dev = vramlab.pick_device(virtual="1GiB")
LARGE = dev.large  # the one size switch: a 1 GiB dataset instead of 256 MiB on a big GPU machine
MiB, GiB = 2**20, 2**30
print(dev)

# %%
%load_ext vramlab

# %% [markdown]
# ## 1. How much RAM does a job need?
#
# First, what this process may use. In a container, on Binder or under a job scheduler, the limit
# is the **cgroup's**, not the machine's RAM: the kernel kills the process at the cgroup limit
# even when `free` shows plenty. vramlab reads the effective one (lesson 00 showed the layers):

# %%
host = vramlab.snapshot().host
print(f"physical RAM {format_bytes(host.total)}; effective limit {format_bytes(host.limit)} "
      f"(from {host.limit_source}); available now {format_bytes(host.available)}")

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
print(f"\nmeasured: RSS before {format_bytes(whole.before)}, peak {format_bytes(whole.peak)} "
      f"(+{whole.delta / MiB:.0f} MiB; {guess(prediction_peak_growth_mib, '+{} MiB')}); "
      f"plan {format_bytes(plan.total)}, off by {100 * (whole.peak - plan.total) / plan.total:+.1f}%")

# %% [markdown]
# The plan is right to within a few percent because every large part of it is a buffer whose size
# we know. Now the same sum for jobs larger than this machine's, against the article's tiers
# (the "interpreter and libraries" line is a typical 2 GiB for torch with the CUDA runtime
# loaded; measure yours with `%vram`):

# %%
examples = {
    "tabular, 20 GB table read whole": ramplan.ram_needs(
        dataset_bytes=20 * GiB, batch_bytes=64 * MiB, baseline=2 * GiB, limit=None),
    "CNN on ImageNet, streamed, 8 workers": ramplan.ram_needs(
        dataset_bytes=140 * GiB, load="stream", batch_bytes=256 * 3 * 224 * 224 * 4, workers=8,
        pin_memory=True, model_parameters=25_600_000, baseline=2 * GiB, limit=None),
    "7B LLM: checkpoint loaded on the host (bf16)": ramplan.ram_needs(
        load="stream", batch_bytes=8 * 4096 * 8, model_parameters=7_000_000_000, bytes_per_parameter=2,
        baseline=2 * GiB, limit=None),
    "the same, checkpoint and model both on the host": ramplan.ram_needs(
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
assert whole.exact, "peak RSS could not be reset on this system"
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
growth = {"whole (np.load)": whole.delta, "memory-mapped scan": mapped.delta, "streamed reads": stream.delta}
for k, v in growth.items():
    print(f"{k:<20} peak RSS +{v / MiB:7.1f} MiB")
print(f"streamed: {guess(prediction_stream_growth_mib, '+{} MiB')}; memory-mapped: "
      f"{guess(prediction_mmap_growth_mib, '+{} MiB')}; "
      f"plan for streaming: {format_bytes(plan_stream.total - plan_stream.item('interpreter and libraries'))} "
      "above the baseline")

fig, ax = plt.subplots(figsize=(5.5, 2.6))
ax.barh(list(growth), [v / MiB for v in growth.values()], color=["#e15759", "#f28e2b", "#59a14f"])
ax.axvline(dataset_bytes / MiB, color="#888", ls="--", label="dataset size")
ax.set_xlabel("peak RSS growth (MiB)")
ax.legend(fontsize=8)
fig.tight_layout()

# %% [markdown]
# Streaming keeps one batch resident instead of the dataset: the article's advice holds, by a
# factor of about `rows / batch_rows`. The memory-mapped scan is the trap: it reads in batches
# too, but every page it touches stays *mapped into this process* and counts in its RSS, up to the
# whole file. Those pages are file-backed and clean, so the kernel can drop them under pressure
# (they are not anonymous memory that would need swap), but monitors and cgroup accounting see
# them, and they evict other data from the page cache.

# %%
assert stream.delta < 0.1 * dataset_bytes, stream
assert whole.delta > 5 * stream.delta, (whole.delta, stream.delta)
assert mapped.delta > stream.delta  # the mapped pages of the scan are resident

# %% [markdown]
# ## 3. `del`, and the garbage collector
#
# Python frees an object as soon as its last reference goes away (reference counting), so `del`
# of the last name frees a tensor at once. Objects that refer to each other (a *reference cycle*:
# a model that keeps a reference to its own trainer, a closure over itself, an exception bound to a
# frame that holds it) keep each other alive after `del`; only the cycle collector, `gc.collect()`,
# finds them. It also runs by itself, when enough objects were allocated; we switch it off for this
# section so that the measurement does not depend on when it happens to run.
#
# **Predict.** Two 64 MiB tensors on the device, one held by a plain object and one by an object
# in a reference cycle. How many MiB does each `del` give back? And `gc.collect()`?

# %%
prediction_del_plain_mib, prediction_del_cycle_mib, prediction_collect_mib = None, None, None  # your guesses, MiB


# %%
class Holder:
    def __init__(self, t: torch.Tensor, cycle: bool) -> None:
        self.t = t
        self.me = self if cycle else None   # a reference cycle: the object refers to itself


gc.collect()
gc.disable()
try:
    n = 64 * MiB // 4
    readings = {"start": dev.allocated()}
    with dev.measure():
        plain = Holder(torch.ones(n, device=dev.device), cycle=False)
        cyclic = Holder(torch.ones(n, device=dev.device), cycle=True)
    readings["two tensors"] = dev.allocated()
    del plain
    readings["del plain"] = dev.allocated()
    del cyclic
    readings["del cyclic"] = dev.allocated()
    found = gc.collect()
    readings["gc.collect()"] = dev.allocated()
finally:
    gc.enable()
steps = list(readings)
freed = {s: (readings[p] - readings[s]) / MiB for p, s in zip(steps, steps[1:]) if s != "two tensors"}
for s in steps:
    print(f"{s:<14} {format_bytes(readings[s] - readings['start']):>10} on the device")
print(f"gc.collect() found {found} unreachable objects")
print("MiB freed by del plain, del cyclic, gc.collect(): "
      + ", ".join(f"{freed[k]:.0f} ({guess(p)})" for k, p in zip(freed, (prediction_del_plain_mib, prediction_del_cycle_mib,
                                                                        prediction_collect_mib))))

fig, ax = plt.subplots(figsize=(5.5, 2.6))
ax.step(range(len(steps)), [(readings[s] - readings["start"]) / MiB for s in steps], where="mid", marker="o")
ax.set_xticks(range(len(steps)), steps, fontsize=8)
ax.set_ylabel("device MiB")
fig.tight_layout()

# %%
assert abs(freed["del plain"] - 64) < 1, freed
assert abs(freed["del cyclic"]) < 1, freed  # del alone frees nothing in a cycle
assert abs(freed["gc.collect()"] - 64) < 1, freed

# %% [markdown]
# ## 4. The traceback that keeps an out-of-memory error's tensors alive
#
# An exception carries its traceback, and the traceback holds every frame it passed through, with
# their local variables. After an out-of-memory error, those locals are the tensors of the step
# that failed. IPython keeps the last uncaught exception in `sys.last_value` and
# `sys.last_traceback` (for `%debug`), so after an OOM in a notebook **the failed step's memory
# stays allocated** until something clears them. `%vram free` does that: it drops the last
# exception and its frames, collects, and (on CUDA) empties the cache.
#
# A cell that fails stops the notebook, so the next cell does by hand what IPython does with an
# uncaught error: it stores the error in `sys.last_*`. In your own notebook, just let the cell fail.
#
# **Predict.** The step below holds 192 MiB of intermediates when it asks for more than the card
# has. How much stays allocated after the error? And after `%vram free`?

# %%
prediction_held_mib, prediction_after_free_mib = None, None  # your guesses, MiB


# %%
def step_that_runs_out() -> None:
    h1 = torch.ones(64 * MiB // 4, device=dev.device)
    h2 = torch.ones(64 * MiB // 4, device=dev.device)
    h3 = torch.ones(64 * MiB // 4, device=dev.device)
    too_big = torch.empty(2 * dev.capacity // 4, device=dev.device)  # twice the card: fails on any GPU
    return h1 + h2 + h3 + too_big


start = dev.allocated()
try:
    with dev.measure():
        step_that_runs_out()
except torch.OutOfMemoryError:
    sys.last_type, sys.last_value, sys.last_traceback = sys.exc_info()   # what IPython does
held = dev.allocated() - start
print(f"after the OOM: {format_bytes(held)} still allocated ({guess(prediction_held_mib, '{} MiB')})")
print("\n".join(vramlab.explain_oom(sys.last_value).text().splitlines()[:5]))

# %%
# NBVAL_IGNORE_OUTPUT
%vram free

# %%
after_free = dev.allocated() - start
print(f"after %vram free: {format_bytes(after_free)} allocated ({guess(prediction_after_free_mib, '{} MiB')})")
assert held >= 192 * MiB, held
assert after_free < 1 * MiB, after_free

# %% [markdown]
# The same happens with `except torch.OutOfMemoryError as e:` when `e` is kept (stored in a list,
# or returned): keep `e.with_traceback(None)` or a message instead, as lesson 01's loop did, or
# call `traceback.clear_frames(e.__traceback__)`. `vramlab.find_max_batch_size` (lesson 02) does
# this between its trials.
#
# ## 5. Freed is not returned: the caching allocator
#
# When a PyTorch tensor on a CUDA GPU is freed, its memory goes back to PyTorch's **caching
# allocator**, not to the driver: `torch.cuda.memory_allocated()` falls, `memory_reserved()` does
# not, and `nvidia-smi` still shows the process using it. The next tensor of a similar size reuses
# the block without a slow `cudaMalloc`. `torch.cuda.empty_cache()` hands the unused blocks back to
# the driver, for *other processes*; it never makes more memory available to this one. That is
# what "frameworks with built-in memory management" do.
#
# **The virtual GPU does not model the cache**: on it, freed bytes leave the books at once. The
# CUDA cell below runs only on a CUDA machine. What *is* real on a CPU is the same behaviour one
# level down: small tensors are carved out of the C library's heap (glibc `malloc`), which keeps
# freed chunks for reuse instead of returning them to the kernel, until `malloc_trim` is called
# (`ramplan.release_free_heap()`), the host's `empty_cache()`.
#
# **Predict.** 200,000 tensors of 1 KiB each (about 200 MiB of host heap), then `del` of all but
# one in a thousand. How much does this process's RSS fall? And after `release_free_heap()`?

# %%
prediction_rss_drop_after_del_mib, prediction_rss_drop_after_trim_mib = None, None  # your guesses, MiB

# %%
if dev.is_cuda:  # CUDA only: the caching allocator itself
    torch.cuda.empty_cache()
    a0, r0 = torch.cuda.memory_allocated(), torch.cuda.memory_reserved()
    blocks = [torch.empty(8 * MiB, dtype=torch.uint8, device=dev.device) for _ in range(32)]
    a1, r1 = torch.cuda.memory_allocated(), torch.cuda.memory_reserved()
    del blocks
    a2, r2 = torch.cuda.memory_allocated(), torch.cuda.memory_reserved()
    torch.cuda.empty_cache()
    a3, r3 = torch.cuda.memory_allocated(), torch.cuda.memory_reserved()
    for label, a, r in (("start", a0, r0), ("32 x 8 MiB", a1, r1), ("del", a2, r2), ("empty_cache()", a3, r3)):
        print(f"{label:<14} allocated {format_bytes(a - a0):>10}  reserved {format_bytes(r - r0):>10}")
    assert a2 - a0 < MiB and r2 - r0 >= 256 * MiB  # freed, but still reserved
    assert r3 - r0 < 8 * MiB  # returned to the driver
else:
    print("no CUDA GPU: the caching allocator is not modelled by the virtual GPU; see the host heap below")

# %%
def rss() -> int:
    return vramlab.snapshot().host.process_rss


ramplan.release_free_heap()
r0 = rss()
small = [torch.ones(256) for _ in range(200_000)]   # 1 KiB each, from the C heap
r1 = rss()
survivors = small[::1000]                          # a few stay alive, scattered through the heap
del small
gc.collect()
r2 = rss()
trimmed = ramplan.release_free_heap()
r3 = rss()
print(f"200,000 small tensors: RSS +{(r1 - r0) / MiB:.0f} MiB")
print(f"after del:             RSS +{(r2 - r0) / MiB:.0f} MiB  (fell by {max(r1 - r2, 0) / MiB:.0f} MiB; "
      f"{guess(prediction_rss_drop_after_del_mib)})")
print(f"after malloc_trim:     RSS +{(r3 - r0) / MiB:.0f} MiB  (fell by {max(r2 - r3, 0) / MiB:.0f} MiB more; "
      f"{guess(prediction_rss_drop_after_trim_mib)})")
del survivors

# %% [markdown]
# `del` freed the tensors, and the allocator kept their memory: RSS hardly moved. Each large
# tensor (the 64 MiB ones above) is its own memory mapping and goes straight back to the kernel;
# small ones share heap pages, and a page with one live object cannot be returned. `malloc_trim`
# walks the heap and returns every page that is entirely free. The lesson is the same as CUDA's:
# "freed" in Python is not "returned to the system"; a monitor shows the allocator's view
# (`allocated`) and the system's view (RSS, or `nvidia-smi`), and both are right.

# %%
if trimmed:  # glibc: the heap kept the memory until it was trimmed
    assert r1 - r0 > 150 * MiB, (r0, r1)
    assert r1 - r2 < 0.5 * (r1 - r0), (r1, r2)  # del alone returned less than half
    assert r2 - r3 > 0.5 * (r1 - r0), (r2, r3)  # the trim returned most of it
workdir.cleanup()

# %% [markdown]
# ## Exercises
#
# 1. Plan a job: a 6 GB dataset of images decoded to float32, read whole, 4 workers, batches of
#    128 images of 3 x 224 x 224, pinned memory, a ResNet-50 (25.6 M parameters) built on the host
#    and moved to the GPU. Which tier?
# 2. In section 2, why did the memory-mapped scan's RSS grow, although it copied each batch
#    (`np.array(...)`) and dropped it?
# 3. In section 3, replace `self.me = self` by a `weakref.ref(self)`. What does `del cyclic` free now?
#
# <details><summary>Solutions</summary>
#
# 1. The cell below makes the plan and prints it. One batch of 128 images of 3 × 224 × 224
#    float32 is 128 × 3 × 224 × 224 × 4 bytes (it prints the figure), and the plan holds several
#    in flight: the loader's prefetch per worker, the pinned copy, the one on the device. The tier
#    is the smallest of 16, 32 and 64 GB that holds the total. Note that the workers share the NumPy
#    array copy-on-write. A Python list of images would be copied into each worker as the workers
#    touch the objects' reference counts.
# 2. The copy is dropped, but the pages of the *file* that were read through the mapping stay
#    mapped into the process, and resident, until the mapping is closed or the kernel reclaims them.
# 3. A weak reference does not keep its target alive: the object has no cycle, `del` frees it and
#    its 64 MiB at once, and `gc.collect()` finds nothing more.
#
# </details>

# %%
# solution 1, computed: the plan for the exercise's job
exercise = ramplan.ram_needs(dataset_bytes=6 * GiB, batch_bytes=128 * 3 * 224 * 224 * 4, workers=4,
                             pin_memory=True, model_parameters=25_600_000, baseline=2 * GiB, limit=None)
print(f"one batch: {format_bytes(128 * 3 * 224 * 224 * 4)} ({128 * 3 * 224 * 224 * 4 / 1e6:.1f} MB)")
print(exercise.text())
print(f"tier: {exercise.tier_gb} GB" if exercise.tier_gb else "tier: more than 64 GB")
