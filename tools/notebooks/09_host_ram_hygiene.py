# %% [markdown]
# # 09 · Host-RAM hygiene: getting memory back
#
# Terms are explained in the [glossary](../docs/glossary.md); the claim ids (A1, B6, …) are those of
# [`docs/claims.md`](../docs/claims.md).
#
# **Claims (curriculum B4, B5).** The second source article advises freeing what you no longer
# need with `del` and the garbage collector, and relying on frameworks, such as PyTorch, that
# manage memory for you. We measure what each of these gives back, and when:
#
# 1. `del` alone against `del` plus `gc.collect()`, on reference cycles;
# 2. the traceback that keeps an out-of-memory error's tensors alive, and `%vram free`;
# 3. the caching allocator: memory that is freed but not given back.
#
# Lesson 08 sized what a job holds. This one uses the device. Without a CUDA GPU it is a small
# virtual card of 1 GiB: the virtual GPU allocates each tensor in host memory before it checks its
# capacity, so a small card keeps section 2's deliberately oversized request cheap. **Without a
# GPU, the virtual card's tensors live in this process's RAM**, so on a CPU-only machine host RSS
# includes them; on a CUDA machine it does not.

# %%
import gc
import sys

import matplotlib.pyplot as plt
import torch

import vramlab
from vramlab import format_bytes
from vramlab.i18n import N_, tr
from vramlab.lessons import ramplan
from vramlab.lessons.predict import guess

torch.manual_seed(0)
dev = vramlab.pick_device(virtual="1GiB")
MiB, GiB = 2**20, 2**30
print(dev)

# %%
%load_ext vramlab

# %% [markdown]
# ## 1. `del`, and the garbage collector
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
    readings = {N_("start"): dev.allocated()}
    with dev.measure():
        plain = Holder(torch.ones(n, device=dev.device), cycle=False)
        cyclic = Holder(torch.ones(n, device=dev.device), cycle=True)
    readings[N_("two tensors")] = dev.allocated()
    del plain
    readings[N_("del plain")] = dev.allocated()
    del cyclic
    readings[N_("del cyclic")] = dev.allocated()
    found = gc.collect()
    readings["gc.collect()"] = dev.allocated()
finally:
    gc.enable()
steps = list(readings)
freed = {s: (readings[p] - readings[s]) / MiB for p, s in zip(steps, steps[1:]) if s != "two tensors"}
for s in steps:  # the steps' names are the English keys: tr() shows them in the notebook's language
    print(f"{tr(s):<14} " + tr("{size:>10} on the device", size=format_bytes(readings[s] - readings["start"])))
print(tr("gc.collect() found {n} unreachable objects", n=found))
print(tr("MiB freed by del plain, del cyclic, gc.collect(): ")
      + ", ".join(f"{freed[k]:.0f} ({guess(p)})" for k, p in zip(freed, (prediction_del_plain_mib, prediction_del_cycle_mib,
                                                                        prediction_collect_mib))))

fig, ax = plt.subplots(figsize=(5.5, 2.6))
ax.step(range(len(steps)), [(readings[s] - readings["start"]) / MiB for s in steps], where="mid", marker="o")
ax.set_xticks(range(len(steps)), [tr(s) for s in steps], fontsize=8)
ax.set_ylabel(tr("device MiB"))
ax.set_title(tr("device memory after each step"))
fig.tight_layout()

# %%
assert abs(freed["del plain"] - 64) < 1, freed
assert abs(freed["del cyclic"]) < 1, freed  # del alone frees nothing in a cycle
assert abs(freed["gc.collect()"] - 64) < 1, freed

# %% [markdown]
# ## 2. The traceback that keeps an out-of-memory error's tensors alive
#
# An exception carries its traceback, and the traceback holds every frame it passed through, with
# their local variables. After an out-of-memory error, those locals are the tensors of the step
# that failed. IPython keeps the last uncaught exception in `sys.last_value` and
# `sys.last_traceback` (for `%debug`), so after an OOM in a notebook **the failed step's memory
# stays allocated** until something clears them. `%vram free` does that: it drops the last
# exception and its frames, collects, and empties the allocator's cache (a card's, or the virtual
# card's).
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
print(tr("after the OOM: {held} still allocated ({guess})", held=format_bytes(held),
         guess=guess(prediction_held_mib, "{} MiB")))
print("\n".join(vramlab.explain_oom(sys.last_value).text().splitlines()[:5]))

# %%
# NBVAL_IGNORE_OUTPUT
%vram free

# %%
after_free = dev.allocated() - start
print(tr("after %vram free: {size} allocated ({guess})", size=format_bytes(after_free),
         guess=guess(prediction_after_free_mib, "{} MiB")))
assert held >= 192 * MiB, held
assert after_free < 1 * MiB, after_free

# %% [markdown]
# The same happens with `except torch.OutOfMemoryError as e:` when `e` is kept (stored in a list,
# or returned): keep `e.with_traceback(None)` or a message instead, as lesson 01's loop did, or
# call `traceback.clear_frames(e.__traceback__)`. `vramlab.find_max_batch_size` (lesson 02) does
# this between its trials.
#
# ## 3. Freed is not returned: the caching allocator
#
# When a PyTorch tensor on a CUDA GPU is freed, its memory goes back to PyTorch's **caching
# allocator**, not to the driver: `torch.cuda.memory_allocated()` falls, `memory_reserved()` does
# not, and `nvidia-smi` still shows the process using it. The next tensor of a similar size reuses
# the block without a slow `cudaMalloc`. `torch.cuda.empty_cache()` hands the unused blocks back to
# the driver. That does not make room for this process's PyTorch tensors (the allocator empties its
# cache by itself before it reports an OOM); it makes room for other processes, and for what this
# process takes outside PyTorch (NCCL's buffers, a library's own `cudaMalloc`). That is what
# "frameworks with built-in memory management" do.
#
# **The virtual GPU models this cache** (a port of PyTorch's caching allocator, see
# `docs/virtual-gpu.md`), so the cell below runs on both: on a CUDA card it reads `torch.cuda`, on
# the virtual one the same figures from the model. One level down, the host does the same: small
# tensors are carved out of the C library's heap (glibc `malloc`), which keeps freed chunks for
# reuse instead of returning them to the kernel, until `malloc_trim` is called
# (`ramplan.release_free_heap()`), the host's `empty_cache()`.
#
# **Predict.** 200,000 tensors of 1 KiB each (about 200 MiB of host heap), then `del` of all but
# one in a thousand. How much does this process's RSS fall? And after `release_free_heap()`?

# %%
prediction_rss_drop_after_del_mib, prediction_rss_drop_after_trim_mib = None, None  # your guesses, MiB

# %%
dev.cleanup()  # gc, then empty_cache(): on CUDA and on the virtual GPU alike
with dev.measure():  # the virtual GPU counts what is made inside
    a0, r0 = dev.allocated(), dev.reserved()
    blocks = [torch.empty(8 * MiB, dtype=torch.uint8, device=dev.device) for _ in range(32)]
    a1, r1 = dev.allocated(), dev.reserved()
    del blocks
    a2, r2 = dev.allocated(), dev.reserved()
    dev.cleanup()
    a3, r3 = dev.allocated(), dev.reserved()
for label, a, r in ((tr("start"), a0, r0), ("32 x 8 MiB", a1, r1), ("del", a2, r2), ("empty_cache()", a3, r3)):
    print(f"{label:<14} " + tr("allocated {allocated:>10}  reserved {reserved:>10}",
                               allocated=format_bytes(a - a0), reserved=format_bytes(r - r0)))
assert a1 - a0 >= 256 * MiB and a2 - a0 < MiB  # allocated falls at del...
assert r2 - r0 >= 256 * MiB  # ...reserved does not: freed, but still PyTorch's
assert r3 - r0 < 8 * MiB  # returned to the driver

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
labels = [tr("200,000 small tensors:"), tr("after del:"), tr("after malloc_trim:")]
w = max(23, *(len(label) + 1 for label in labels))  # the labels' column, wide enough for the words
print(f"{labels[0]:<{w}}RSS +{(r1 - r0) / MiB:.0f} MiB")
print(f"{labels[1]:<{w}}RSS +{(r2 - r0) / MiB:.0f} MiB  "
      + tr("(fell by {mib:.0f} MiB; {guess})", mib=max(r1 - r2, 0) / MiB, guess=guess(prediction_rss_drop_after_del_mib)))
print(f"{labels[2]:<{w}}RSS +{(r3 - r0) / MiB:.0f} MiB  "
      + tr("(fell by {mib:.0f} MiB more; {guess})", mib=max(r2 - r3, 0) / MiB,
           guess=guess(prediction_rss_drop_after_trim_mib)))
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

# %% [markdown]
# ### Cached, yet out of memory: fragmentation
#
# The cache holds whole **segments** that the allocator got from the driver (2 MiB ones for small
# tensors, 20 MiB ones for tensors under 10 MiB, larger ones rounded up to 2 MiB). A segment goes
# back to the driver only when none of its blocks is in use. On a small virtual card of 60 MiB, three
# pairs of tensors, 2 MiB and 18 MiB, share three 20 MiB segments; then the 18 MiB ones are deleted.
# The allocator does the same on a real card; the virtual one lets it happen in a second, on any
# machine.
#
# **Predict.** 54 MiB are now cached and unused. Does a 30 MiB tensor fit? Does `empty_cache()` help?

# %%
prediction_30mib_fits, prediction_empty_cache_helps = None, None  # your guesses: True or False

# %%
card = vramlab.VirtualGPU("60MiB")  # the caching allocator's model, on a CUDA machine too
frag_error = None
with card:
    keep, drop = [], []
    for _ in range(3):  # each pair fills one 20 MiB segment
        keep.append(torch.empty(2 * MiB, dtype=torch.uint8))
        drop.append(torch.empty(18 * MiB, dtype=torch.uint8))
    del drop
    cached = card.reserved - card.allocated
    card.empty_cache()
    after_empty = card.reserved
    try:
        big = torch.empty(30 * MiB, dtype=torch.uint8)
    except torch.OutOfMemoryError as e:
        frag_error = e.with_traceback(None)
    del keep
print(tr("allocated 6.00 MiB, reserved {reserved} after empty_cache(): ", reserved=format_bytes(after_empty))
      + tr("{cached} cached, in pieces of 18 MiB", cached=format_bytes(cached)))
print(tr("30 MiB fits: {fits} ({guess}); ", fits=frag_error is None, guess=guess(prediction_30mib_fits))
      + tr("empty_cache() released {released} ({guess})", released=format_bytes(card.max_reserved - after_empty),
           guess=guess(prediction_empty_cache_helps)))
if frag_error:  # vramlab's reading of the error's message: its figures and the first thing to try
    print("\n".join(vramlab.explain_oom(frag_error).text().splitlines()[:8]))


def fifty_then_forty_then_56(conf: str) -> bool:
    """A 50 MiB tensor freed, 40 MiB in its place, then 56 MiB, on a 100 MiB card: does it fit?"""
    with vramlab.VirtualGPU("100MiB", alloc_conf=conf):
        x = torch.empty(50 * MiB, dtype=torch.uint8)
        del x
        y = torch.empty(40 * MiB, dtype=torch.uint8)  # reuses the 50 MiB segment: 10 MiB stranded
        try:
            z = torch.empty(56 * MiB, dtype=torch.uint8)
            del z
            return True
        except torch.OutOfMemoryError:
            return False
        finally:
            del y


fixed_fits = fifty_then_forty_then_56("")
expandable_fits = fifty_then_forty_then_56("expandable_segments:True")
print(tr("fixed segments: 56 MiB fits {fixed}; PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True: {expandable}",
         fixed=fixed_fits, expandable=expandable_fits))

# %% [markdown]
# The error's message says it (vramlab's explanation above reads it from there): most of the
# memory is "reserved by PyTorch but unallocated", and it suggests `expandable_segments:True`.
# `empty_cache()` cannot help, because every segment still holds a live 2 MiB tensor; before it
# reports the OOM the allocator already released every segment it could. With **expandable segments** (`PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`,
# set before torch starts) a segment grows by pages instead, so memory stranded at a segment's end
# can be mapped again: the second program fits with it and not without. On a real card
# `nvidia-smi` shows the reserved figure plus the CUDA context, whatever `memory_allocated()` says.
# The remedies for an out-of-memory error, in the order to try them: `docs/oom-checklist.md`.

# %%
assert frag_error is not None and cached >= 30 * MiB  # more cached than asked, and still out of memory
assert "reserved by PyTorch but unallocated" in str(frag_error)
assert after_empty == 60 * MiB  # empty_cache() released nothing: each segment holds a live tensor
assert not fixed_fits and expandable_fits  # expandable segments let the same program through

# %% [markdown]
# ## Exercises
#
# 1. In section 1, replace `self.me = self` by a `weakref.ref(self)`. What does `del cyclic` free now?
#
# <details><summary>Solutions</summary>
#
# 1. A weak reference does not keep its target alive: the object has no cycle, `del` frees it and
#    its 64 MiB at once, and `gc.collect()` finds nothing more.
#
# </details>
