# %% [markdown]
# # 00 · Start here: reading memory with vramlab
#
# Every lesson in this workbook asks a question about memory, lets you predict the answer,
# measures it, and ends with an `assert` that checks the claim. This first notebook shows
# the instrument itself: how to load it, what the table means, and how to read the same
# figures from Python.
#
# Load the extension once per kernel:

# %%
%load_ext vramlab

# %% [markdown]
# `%vram` shows one *reconciled snapshot*: every layer of memory read at one moment.
# The figures are live, so this cell's output differs on your machine.

# %%
# NBVAL_IGNORE_OUTPUT
%vram

# %% [markdown]
# ## Reading the layers
#
# **Host.** The bar is drawn against the *effective limit*: in a container or on Binder
# that is the cgroup's limit, not the machine's RAM, because it is the number at which the
# kernel kills your process. It splits into
# - *this process*: the kernel's resident set (RSS) of this Python kernel;
# - *others*: everything else charged to the same limit (other processes, page cache);
# - *available*: what a new allocation can still get without swapping.
#
# **A GPU** (when there is one) splits its total into
# - *tensors*: bytes in live torch tensors (`torch.cuda.memory_allocated`);
# - *torch cache*: blocks torch's caching allocator keeps for reuse (reserved − allocated);
# - *context & non-torch*: what the driver charges to this process beyond torch's blocks:
#   the CUDA context, cuBLAS workspaces, other libraries;
# - *other processes*, and *free*.
#
# Each byte sits in exactly one layer, and the layers add up to the total. The same reading
# is a Python object:

# %%
import vramlab
from vramlab import format_bytes

snap = vramlab.snapshot()
host = snap.host
print(f"limit           {format_bytes(host.limit)}  ({host.limit_source})")
for key, size in host.layers:
    print(f"{key:<16}{format_bytes(size):>12}")
print("devices:", [d.id for d in snap.devices] or "none")
for note in snap.notes:
    print("note:", note)

# %%
assert sum(size for _, size in host.layers) == host.limit
for d in snap.devices:
    if d.layers:
        assert sum(size for _, size in d.layers) == d.total, d.id

# %% [markdown]
# ## A first measurement
#
# **Question.** You create a 256 MiB NumPy array filled with ones. How much does this
# process's RSS grow? And after `del`?
#
# Write your prediction before running the next cells:

# %%
prediction_mib = 256  # edit me: the RSS growth you expect, in MiB

# %%
import numpy as np

MiB = 2**20
before = vramlab.snapshot().host.process_rss
block = np.ones(256 * MiB // 8)          # 256 MiB of float64, every page written
grown = vramlab.snapshot().host.process_rss - before
del block
after = vramlab.snapshot().host.process_rss - before
print(f"predicted +{prediction_mib} MiB; measured +{grown / MiB:.1f} MiB while the array lives, "
      f"{after / MiB:+.1f} MiB after del")

# %% [markdown]
# The array's pages are written by `np.ones`, so the kernel must back all of them with RAM:
# RSS grows by the array's size. A large NumPy buffer is its own `mmap`, so `del` hands it
# straight back to the kernel. (Small objects go back to Python's allocator instead, and
# RSS may not fall: lesson 06 measures that.)

# %%
assert grown >= 250 * MiB, grown
assert after < 64 * MiB, after

# %% [markdown]
# ## Exercises
#
# 1. Replace `np.ones` with `np.empty`. Predict the RSS growth, then measure it.
# 2. Run `%vram --json` and find `process_peak`. Why is it at least as large as the peak
#    of the array above?
#
# <details><summary>Solutions</summary>
#
# 1. `np.empty` maps the memory but writes none of it: untouched pages are not resident,
#    so RSS barely moves until you write to the array.
# 2. `process_peak` is the kernel's high-water mark (`VmHWM`) of RSS since the process
#    started or since the peak was last reset, so it includes the moment the array lived.
#
# </details>
