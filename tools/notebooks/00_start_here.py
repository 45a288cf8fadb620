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
# ## The live monitor
#
# `%vram watch` shows the same layers live, refreshed by one background sampler (every 0.5 s by
# default; `%vram watch --interval 0.25` changes it). Leave it open while you run the lessons: the
# bars move as tensors come and go, and the timeline marks where each cell started. `%vram stop`
# stops the sampler. (In a saved notebook the monitor is replaced by a static copy of its last
# reading.)

# %%
# NBVAL_IGNORE_OUTPUT
%vram watch

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
# ## Per-cell records
#
# `%%vram` at the top of a cell runs it and then reports what it did: wall time, the change of
# each layer, and the **peak** during the cell, which no before/after reading can show. The peak
# is exact: vramlab resets the kernel's high-water mark of RSS (and torch's peak counters) when
# the cell starts. `%vram auto on` does the same for every cell, in one line each.

# %%
%%vram
# NBVAL_IGNORE_OUTPUT
block = np.ones(128 * MiB // 8)  # 128 MiB, freed before the cell ends
del block

# %%
record = vramlab.last()
print(f"RSS change over the cell {format_bytes(record.host.rss_delta, signed=True)}, "
      f"peak during it +{format_bytes(record.host.peak_delta)}")
assert record.host.peak_delta >= 120 * MiB  # the peak saw the array ...
assert record.host.rss_delta < 32 * MiB      # ... that the before/after difference misses

# %% [markdown]
# ## The same moment, read by other tools (B7)
#
# The article suggests `nvidia-smi`, `htop` and memory_profiler. They read the same kernel and
# driver counters, but not the same layers:
# - `free` and `htop` show the whole machine: `available` is the kernel's `MemAvailable`, the same
#   figure vramlab uses, but they know nothing of a container's limit;
# - memory_profiler reports this process's RSS, like vramlab's *this process*, in MiB (2^20 bytes);
# - `nvidia-smi` shows a GPU's used memory: tensors, torch's cache, the CUDA context and every
#   other process together; `torch.cuda.memory_allocated()` shows the tensors alone. vramlab's
#   table is the reconciliation of the two.

# %%
import shutil
import subprocess

snap = vramlab.snapshot()
print(f"vramlab      this process {format_bytes(snap.host.process_rss)}, available {format_bytes(snap.host.available)}"
      f" (limit {format_bytes(snap.host.limit)}, {snap.host.limit_source})")
free_available = None
if shutil.which("free"):
    mem = subprocess.run(["free", "-b"], capture_output=True, text=True).stdout.splitlines()[1].split()
    free_available = int(mem[6])
    print(f"free -b      used {format_bytes(int(mem[2]))}, available {format_bytes(free_available)}")
try:
    import memory_profiler

    print(f"memory_profiler  this process {memory_profiler.memory_usage(-1, interval=0.1, timeout=0.2)[0]:.1f} MiB")
except ImportError:
    print("memory_profiler is not installed here (pip install memory_profiler)")
if shutil.which("nvidia-smi"):
    out = subprocess.run(["nvidia-smi", "--query-gpu=index,memory.used,memory.total", "--format=csv,noheader"],
                         capture_output=True, text=True).stdout
    print("nvidia-smi  ", out.strip())
    for d in snap.devices:
        print(f"vramlab      {d.id}: used {format_bytes(d.used)}, of which tensors {format_bytes(d.layer('tensors'))}")
else:
    print("nvidia-smi is not on this machine: no NVIDIA driver")

# %%
if free_available is not None and snap.host.limit_source == "physical RAM":
    assert abs(free_available - snap.host.available) < 0.02 * snap.host.total  # the same MemAvailable

# %%
%vram stop

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
