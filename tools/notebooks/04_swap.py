# %% [markdown]
# # 04 · Swap: RAM against disk
#
# Terms are explained in the [glossary](../docs/glossary.md); the claim ids (A1, B6, …) are those of
# [`docs/claims.md`](../docs/claims.md).
#
# **Claim (curriculum B2).** Article 004 says that virtual memory (swap) complements RAM but is
# slower, and that a fixed size, rather than one the system adjusts, helps. Lesson 03 showed that
# PyTorch never swaps the card's memory into host RAM. The host does swap its own RAM to disk, and
# that is what this lesson measures: how much slower a read from disk is than a read from RAM
# (section 1), and what a fixed size means on Linux and on Windows (section 2). It reads this
# machine's swap; it makes none (that needs root).

# %%
import contextlib
import os
import tempfile
import time

import torch

import vramlab
from vramlab import format_bytes
from vramlab.i18n import tr
from vramlab.lessons.predict import guess
from vramlab.lessons.transfer import page_cache_fraction, read_swaps

torch.manual_seed(0)
dev = vramlab.pick_device(virtual="1GiB")
LARGE = dev.large  # the one size switch: larger tensors on a big GPU machine
MiB = 2**20
print(dev)

# %% [markdown]
# ## 1. RAM against disk: the cliff that swap gives
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


def write_cold(t: torch.Tensor, path: str) -> None:
    """Write ``t`` to ``path``, then ask the kernel to drop the file from the page cache."""
    t.numpy().tofile(path)
    fd = os.open(path, os.O_RDONLY)
    os.fsync(fd)
    if hasattr(os, "posix_fadvise"):
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    os.close(fd)


n = (1024 if LARGE else 256) * MiB // 4
ram = torch.randn(n)
ram.sum()  # the first read pays page faults
t_ram = read_time(ram, 3)
with tempfile.TemporaryDirectory(dir=os.getcwd()) as tmp:
    path = os.path.join(tmp, "tensor.bin")
    write_cold(ram, path)
    cached_before = page_cache_fraction(path)
    disk = torch.from_file(path, shared=False, size=n, dtype=torch.float32)
    t_cold = read_time(disk)
    cached_after = page_cache_fraction(path)
    t_warm = read_time(disk, 3)
    del disk
evicted = cached_before is not None and cached_before < 0.1
size = n * 4
share = (lambda c: tr("unknown") if c is None else f"{c:.0%}")
print(tr("in the page cache before the first read: {before} of the file; after it: {after}",
         before=share(cached_before), after=share(cached_after)))
print(f"{'RAM':<13}{size / t_ram / 1e9:6.1f} GB/s")
print(f"{tr('disk, cold'):<13}{size / t_cold / 1e9:6.1f} GB/s   "
      + tr("({slower:.0f}x slower than RAM; {guess})", slower=t_cold / t_ram, guess=guess(prediction_slowdown, "{}x")))
print(f"{tr('disk, warm'):<13}{size / t_warm / 1e9:6.1f} GB/s   " + tr("(its pages are in RAM now)"))
if not evicted:
    print(tr("the file could not be dropped from the page cache here (tmpfs?): the 'cold' read was not cold"))

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
# ## 2. The swap file: Linux and Windows
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
kinds = {"file": tr("a file"), "partition": tr("a partition")}  # the Type column of /proc/swaps
for a in areas:
    print(tr("{filename}: {kind}, {size}, {used} used, priority {priority}", filename=a.filename,
             kind=kinds.get(a.kind, a.kind), size=format_bytes(a.size), used=format_bytes(a.used), priority=a.priority))
if not areas:
    print(tr("/proc/swaps lists no swap area: this machine has no swap (many cloud machines and "
             "Kubernetes nodes run without one)"))
with contextlib.suppress(OSError):
    with open("/proc/sys/vm/swappiness") as f:
        print(tr("vm.swappiness = {value} (how readily the kernel swaps anonymous memory "
                 "rather than drop page cache; 0 to 200 on current kernels)", value=f.read().strip()))
host = vramlab.snapshot().host
print(tr("swap on this machine: {used} used of {total}, ", used=format_bytes(host.swap_used),
         total=format_bytes(host.swap_total))
      + tr("{swap_in} paged in and {swap_out} out since boot", swap_in=format_bytes(host.swap_in),
           swap_out=format_bytes(host.swap_out)))

# %% [markdown]
# ## Summary
#
# Swap is disk standing in for RAM, and a read from disk is many times slower than a read from RAM
# (the cold read of section 1). Once the pages are back in RAM they read at RAM speed, so a job
# that swaps pays the disk again on every pass over data that was pushed out. A Linux swap file
# has a fixed size by construction; the size that grows is Windows' pagefile, which is what the
# article's advice is about.
#
# ## Exercises
#
# 1. The disk moves whole pages (4 KiB here), not elements. Drop the file from the page cache again
#    and read only every 1024th float32 of it (`disk[::1024].sum()`): one element per page. Does
#    the cold read take a thousandth of the time of the full one, or about the same? Predict, then
#    measure.
#
# <details><summary>Solutions</summary>
#
# 1. About the same, give or take the disk's own variation: one float32 in every 4 KiB is one
#    element per page, and a page is read whole, so the strided read brings in every page of the
#    file, as the full read does (readahead may bring in more than is touched). The code below
#    makes the file cold twice and times both reads.
#
# </details>

# %% tags=["solution"]
# solution 1: a strided cold read against a full cold read
def cold_read(step: int) -> tuple[float, float | None]:
    """Seconds for a cold read of every ``step``-th float32 of a fresh file, and the share of the file then cached."""
    with tempfile.TemporaryDirectory(dir=os.getcwd()) as tmp:
        path = os.path.join(tmp, "tensor.bin")
        write_cold(ram, path)
        disk = torch.from_file(path, shared=False, size=n, dtype=torch.float32)
        t0 = time.perf_counter()
        disk[::step].sum()
        seconds = time.perf_counter() - t0
        cached = page_cache_fraction(path)
        del disk
    return seconds, cached


(t_all, c_all), (t_strided, c_strided) = cold_read(1), cold_read(1024)
share = (lambda c: tr("unknown") if c is None else f"{c:.0%}")
print(tr("cold read of every element: {ms:.0f} ms, {cached} of the file cached after it; ",
         ms=t_all * 1e3, cached=share(c_all))
      + tr("of every 1024th: {ms:.0f} ms, {cached} cached after it ({ratio:.2f} of the time)",
           ms=t_strided * 1e3, cached=share(c_strided), ratio=t_strided / t_all))
