# %% [markdown]
# # 00 · Start here: reading memory with vramlab
#
# ## The road map
#
# This workbook starts from two articles, both in Portuguese. The first,
# *"Como a memória da GPU afeta o desempenho do modelo de aprendizado de máquina?"* (000), argues
# that the GPU's memory (VRAM) bounds what a model can do: how much work runs in parallel, how
# large a batch can be, and how big a model and its hyper-parameters can get. It also says that
# when VRAM is short, data is swapped with the host's RAM, and that quantisation and pruning
# shrink models. The second, *"Dicas para Otimizar a Memória do Seu Sistema para Treinamento de
# Modelos de IA em 2024"* (004), is about the host: how much RAM a job needs, swap, loading data
# in mini-batches, freeing memory, and the tools to watch it with.
#
# Each claim has an id (A1 to A7 for the first article, B1 to B7 for the second), and each is
# measured here. Some claims hold, some hold only within limits, and some are wrong as stated:
# the lessons say which, and mark each correction as one. [`docs/claims.md`](../docs/claims.md)
# lists every claim with its verdict. [`docs/glossary.md`](../docs/glossary.md) explains the terms
# (RSS, cgroup, pinned memory, caching allocator, …) in the order you meet them.
#
# | lesson | what it measures | claims | time |
# |---|---|---|---|
# | 00 start here | the instrument: the layers of memory, per-cell peaks, other tools | B7, B1 | 20 min |
# | 01 GPU basics | throughput against batch size, up to the memory wall; a model on the device | A1, B6 | 20 min |
# | 02 batch size | peak memory is a line in the batch; the largest batch per GPU; gradient noise | A2, A3 | 25 min |
# | 03 the host link and offloading | an OOM instead of a swap; the host link's speed; offloading activations | A4 | 20 min |
# | 04 swap | RAM against disk; swap files on Linux and Windows | B2 | 15 min |
# | 05 fewer bytes | half and quarter precision on the link; bucketing by length | A5 | 15 min |
# | 06 hyper-parameters under a budget | width, depth, resolution, sequence length, regularisers; what widens the grid; how finely to checkpoint | A6 | 35 min |
# | 07 quantisation and pruning | bytes per parameter, int8 accuracy, pruning that does and does not shrink | A7 | 20 min |
# | 08 host RAM: how much a job needs | a RAM plan against the measured peak and the tiers; whole, streamed and memory-mapped data | B1, B3 | 20 min |
# | 09 host-RAM hygiene | `del` and the garbage collector; the traceback that keeps an OOM alive; the allocator's cache | B4, B5 | 20 min |
# | 10 the anatomy of training memory | one step phase by phase; bytes per parameter; the estimate against the measurement | C1 | 15 min |
# | 11 a 7B fine-tune on GPUs you do not have | four recipes on four cards, from the estimate | C1 | 15 min |
# | 12 beyond one GPU | memory per rank under DDP, ZeRO and FSDP, measured on real ranks; what each sends per step; a 7B fine-tune on 8 × H100; DataLoader workers | C1 | 25 min |
#
# The times are estimates: the prose at 150 words a minute, the code at 25 lines a minute, and a
# minute for each prediction, rounded up to five minutes.
#
# Every lesson asks a question about memory and lets you predict the answer: the prediction
# cells start empty (`None`), and the measuring cell prints your guess beside the measurement when
# you gave one. It then measures, and ends with an `assert` that checks the claim. This first
# notebook shows the instrument itself: how to load it, what the table means, and how to read the
# same figures from Python.
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
# Each byte sits in exactly one layer, and the layers add up to the total by construction:
# *others* is what the rest leave. So the cell after the reading checks two layers against psutil,
# a reader of its own: this process's RSS, and the total RAM (or the container's limit). The same
# reading is a Python object:

# %%
import vramlab
from vramlab import format_bytes
from vramlab.display.words import note_text
from vramlab.i18n import tr
from vramlab.lessons.predict import guess
from vramlab.lessons.ramplan import NO_PEAK_RESET
from vramlab.model import HOST_LAYERS

snap = vramlab.snapshot()
host = snap.host
source = tr("physical RAM") if host.limit_source == "physical RAM" else host.limit_source
print(f"{tr('limit'):<16}{format_bytes(host.limit)}  ({source})")
for key, size in host.layers:
    print(f"{tr(HOST_LAYERS[key]):<16}{format_bytes(size):>12}")
print(tr("devices:"), [d.id for d in snap.devices] or tr("none"))
for note in snap.notes:
    print(tr("note: {note}", note=note_text(note)))

# %%
import psutil

rss_psutil = psutil.Process().memory_info().rss  # read again, by another library, a moment later
print(tr("this process: vramlab {vramlab}, psutil {psutil}",
         vramlab=format_bytes(dict(host.layers)["process"]), psutil=format_bytes(rss_psutil)))
assert abs(dict(host.layers)["process"] - rss_psutil) < 16 * 2**20, (host.layers, rss_psutil)
if host.limit_source == "physical RAM":
    assert host.limit == psutil.virtual_memory().total
else:  # a container's limit: below the machine's RAM
    assert host.limit < psutil.virtual_memory().total

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
prediction_mib = None  # your guess: the RSS growth you expect, in MiB

# %%
import numpy as np

MiB = 2**20
before = vramlab.snapshot().host.process_rss
block = np.ones(256 * MiB // 8)          # 256 MiB of float64, every page written
grown = vramlab.snapshot().host.process_rss - before
del block
after = vramlab.snapshot().host.process_rss - before
print(tr("measured +{grown:.1f} MiB while the array lives, {after:+.1f} MiB after del ({guess})",
         grown=grown / MiB, after=after / MiB, guess=guess(prediction_mib, "+{} MiB")))

# %% [markdown]
# The array's pages are written by `np.ones`, so the kernel must back all of them with RAM:
# RSS grows by the array's size. A large NumPy buffer is its own `mmap`, so `del` hands it
# straight back to the kernel. (Small objects go back to Python's allocator instead, and
# RSS may not fall: lesson 09 measures that.)

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
if record.host.peak_delta is None:  # no resettable high-water mark on this system
    print(tr(NO_PEAK_RESET))
else:
    print(tr("RSS change over the cell {change}, peak during it +{peak}",
             change=format_bytes(record.host.rss_delta, signed=True), peak=format_bytes(record.host.peak_delta)))
    assert record.host.peak_delta >= 120 * MiB  # the peak saw the array ...
    assert record.host.rss_delta < 32 * MiB      # ... that the before/after difference misses

# %% [markdown]
# ## The same moment, read by other tools (B7)
#
# The article suggests `nvidia-smi`, `htop` and memory_profiler. They read the same kernel and
# driver counters, but not the same layers:
# - `htop` shows each process's RSS in its RES column, and the machine's memory in its header.
#   It is interactive and has no mode that prints once, so the cells below run `ps` and `top -b`
#   (top's batch mode) as stand-ins. They read the same `/proc` fields that htop reads.
# - `free` shows the whole machine: its `available` is the kernel's `MemAvailable`, the figure
#   vramlab starts from, but it knows nothing of a container's limit.
# - memory_profiler reports this process's RSS, like vramlab's *this process*, in MiB (2^20 bytes).
# - `nvidia-smi` shows a GPU's used memory: tensors, torch's cache, the CUDA context and every
#   other process together. `torch.cuda.memory_allocated()` shows the tensors alone, and vramlab's
#   table is the reconciliation of the two. Without an NVIDIA driver the command is missing, or it
#   fails with "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver".
#
# The first cell reads vramlab before and after `ps`, so the tool's reading falls between the two.

# %%
import os
import shutil
import subprocess

import memory_profiler  # in the workbook extra

pid = str(os.getpid())
before_rss = vramlab.snapshot().host.process_rss
ps_rss = int(subprocess.run(["ps", "-o", "rss=", "-p", pid], capture_output=True, text=True).stdout) * 1024
snap = vramlab.snapshot()
after_rss = snap.host.process_rss
source = tr("physical RAM") if snap.host.limit_source == "physical RAM" else snap.host.limit_source
print("vramlab      " + tr("this process {rss}, available {available} (limit {limit}, {source})",
                           rss=format_bytes(after_rss), available=format_bytes(snap.host.available),
                           limit=format_bytes(snap.host.limit), source=source))
print("ps -o rss    " + tr("this process {rss}   (htop's RES column)", rss=format_bytes(ps_rss)))

# %% tags=["quotes-tool-output"]
# the tools' own lines: top's header and this process's line, nvidia-smi's figures
if shutil.which("top"):
    top = subprocess.run(["top", "-b", "-n", "1", "-p", pid], capture_output=True, text=True).stdout.splitlines()
    print("top -b       " + "\n             ".join(line for line in top[-2:] if line.strip()))
if shutil.which("nvidia-smi"):
    out = subprocess.run(["nvidia-smi", "--query-gpu=index,memory.used,memory.total", "--format=csv,noheader"],
                         capture_output=True, text=True).stdout
    print("nvidia-smi   " + out.strip())

# %%
if shutil.which("free"):
    mem = subprocess.run(["free", "-b"], capture_output=True, text=True).stdout.splitlines()[1].split()
    print("free -b      " + tr("used {used}, available {available}",
                               used=format_bytes(int(mem[2])), available=format_bytes(int(mem[6]))))
rss_mp = memory_profiler.memory_usage(-1, interval=0.1, timeout=0.2)[0]
print("memory_profiler  " + tr("this process {rss:.1f} MiB", rss=rss_mp))
if shutil.which("nvidia-smi"):
    for d in snap.devices:
        print("vramlab      " + tr("{device}: used {used}, of which tensors {tensors}", device=d.id,
                                   used=format_bytes(d.used), tensors=format_bytes(d.layer("tensors"))))
else:
    print(tr("nvidia-smi is not on this machine: no NVIDIA driver"))

# %%
# ps read the same RSS as vramlab: between vramlab's readings just before and just after it
# (give or take a page table's worth of pages that the subprocess call itself touched)
lo, hi = min(before_rss, after_rss), max(before_rss, after_rss)
assert lo - 2 * MiB <= ps_rss <= hi + 2 * MiB, (before_rss, ps_rss, after_rss)

# %% [markdown]
# memory_profiler also measures a statement: `%memit` runs it while a helper process samples this
# process's RSS (ten times a second by default) and reports the highest sample, and its increment
# over the RSS before. `%%vram` reads the kernel's high-water mark of RSS instead. The same
# 256 MiB array, freed at once, measured both ways:

# %%
%load_ext memory_profiler

# %% tags=["quotes-tool-output"]
memit = %memit -o big = np.ones(256 * MiB // 8); del big

# %%
%%vram
# NBVAL_IGNORE_OUTPUT
big = np.ones(256 * MiB // 8); del big

# %%
exact = vramlab.last().host.peak_delta
sampled = (max(memit.mem_usage) - memit.baseline) * MiB  # memory_profiler's MiB are 2^20 bytes
if exact is None:
    print(tr(NO_PEAK_RESET))
else:
    print(tr("a 256 MiB array: memory_profiler's increment {sampled} (a sample), "
             "vramlab's peak +{exact} (the high-water mark)", sampled=format_bytes(sampled), exact=format_bytes(exact)))

# %% [markdown]
# A sample can only miss the top: it sees the RSS at its own moments, and the array may be half
# written, or already freed, at each of them. The high-water mark is kept by the kernel at every
# page, so it cannot miss. On a fast machine a short statement can fall between two samples
# altogether; memory_profiler's `-i` option samples more often, at a cost.

# %%
if exact is not None:  # (without a resettable high-water mark, the cell above said so)
    assert exact >= 250 * MiB, exact  # the kernel saw (all but a few of) the array's pages
    assert sampled <= exact + 2 * MiB, (sampled, exact)  # a sample never sees more than the high-water mark

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
