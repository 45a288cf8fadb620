"""``pick_device()``: one device switch for lessons that run on CUDA and on CPU alike.

A lesson's first cell::

    import vramlab
    dev = vramlab.pick_device(virtual="T4")
    dev                      # says which device, and what that means for the figures

Then the same code runs on both:

- ``dev.put(x)`` moves a tensor or module onto the device (``.to("cuda")`` on CUDA;
  on the CPU it stays in host memory and is counted by the virtual GPU, ``adopt``);
- ``with dev.measure() as m: ...`` measures a block: ``m.peak`` is the peak of
  allocated bytes during it, ``m.peak_delta`` that peak minus the bytes allocated at its
  start, ``m.wall_s`` its time. On CUDA it resets ``torch.cuda``'s peak counter (global)
  and synchronises; on the CPU the virtual GPU is active inside the block, so every
  storage created there is counted and its capacity enforced (``torch.OutOfMemoryError``).
  On the virtual GPU, only what is created inside a ``measure()`` block or ``put()`` there
  is on the card: run the step that creates an optimizer's state inside ``measure()`` too;
- ``dev.allocated()``, ``dev.reserved()`` (allocated plus the caching allocator's cache),
  ``dev.capacity``, ``dev.cleanup()``, ``dev.large``; ``m.peak_reserved`` is the block's
  highest reserved. ``dev.attach()`` keeps the virtual GPU active between blocks, as a card
  is, so that per-cell records (``%%vram``) see it; ``dev.detach()`` ends that.

The virtual GPU models PyTorch's CUDA caching allocator (``allocator="caching"``, the
default: :mod:`vramlab.sim.allocator`), so reserved memory, the cache and fragmentation behave
as on a card; ``allocator="exact"`` counts each storage's bytes instead.

Set ``VRAMLAB_DEVICE=virtual`` to use the virtual GPU even where CUDA exists, and
``VRAMLAB_SIZE=small|large`` to force a lesson's size switch. All sizes in bytes.
"""

from __future__ import annotations

import gc
import os
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Iterator

from ..i18n import tr

__all__ = ["LessonDevice", "Measurement", "pick_device"]

# bytes: a card at least this big runs lessons at their large size. An A100-40GB reports
# about 39.4 GiB in total (its 40 GiB less what the driver keeps), so the line sits below it.
LARGE_GPU = 36 * 2**30


@dataclass
class Measurement:
    """A measured block. Sizes in bytes; filled in when the block ends."""

    start: int = 0
    peak: int = 0
    end: int = 0
    wall_s: float = 0.0
    peak_reserved: int = 0

    @property
    def peak_delta(self) -> int:
        """Peak allocated during the block minus allocated at its start."""
        return self.peak - self.start


class LessonDevice:
    """The device a lesson runs on: a CUDA GPU, or a virtual GPU on the CPU (see module docs)."""

    def __init__(self, virtual: str | int = "T4", *, force_virtual: bool = False, round_blocks: bool = True,
                 allocator: str = "caching") -> None:
        from .._extras import require_torch

        torch = require_torch("pick_device()")
        self._torch = torch
        use_cuda = torch.cuda.is_available() and not force_virtual and os.environ.get("VRAMLAB_DEVICE") != "virtual"
        self.virtual: Any = None
        if use_cuda:
            self.kind = "cuda"
            self.device = torch.device("cuda", torch.cuda.current_device())
            props = torch.cuda.get_device_properties(self.device)
            self.name = props.name
            self.capacity = int(props.total_memory)
        else:
            from ..sim.virtual_gpu import VirtualGPU

            self.kind = "virtual"
            self.device = torch.device("cpu")
            self.virtual = VirtualGPU(virtual, round_blocks=round_blocks, allocator=allocator)
            self.name = self.virtual.name
            self.capacity = self.virtual.capacity
        size = os.environ.get("VRAMLAB_SIZE")
        self.large = size == "large" if size in ("small", "large") else (self.is_cuda and self.capacity >= LARGE_GPU)

    @property
    def is_cuda(self) -> bool:
        """Whether this is a real CUDA device."""
        return self.kind == "cuda"

    @property
    def budget(self) -> int:
        """Bytes tensors may use: on CUDA the card's free memory plus what torch's caching
        allocator already reserved (live tensors and its cache, which tensors reuse); the
        virtual budget on the CPU."""
        if self.is_cuda:
            free, _total = self._torch.cuda.mem_get_info(self.device)
            return int(free) + int(self._torch.cuda.memory_reserved(self.device))
        return int(self.virtual.budget)

    def allocated(self) -> int:
        """Bytes in live tensors on the device now."""
        if self.is_cuda:
            return int(self._torch.cuda.memory_allocated(self.device))
        return int(self.virtual.allocated)

    def reserved(self) -> int:
        """Bytes the caching allocator holds now: live tensors plus its cache
        (``torch.cuda.memory_reserved``; the virtual GPU's model of it)."""
        if self.is_cuda:
            return int(self._torch.cuda.memory_reserved(self.device))
        return int(self.virtual.reserved)

    def put(self, obj: Any) -> Any:
        """Move a tensor or module onto the device; returns it (modules in place, like ``.to``)."""
        if self.is_cuda:
            return obj.to(self.device)
        self.virtual.adopt(obj)
        return obj

    @contextmanager
    def measure(self) -> Iterator[Measurement]:
        """Measure the block's peak allocated bytes (see module docs)."""
        m = Measurement()
        torch = self._torch
        if self.is_cuda:
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            m.start = self.allocated()
            t0 = time.perf_counter()
            try:
                yield m
            finally:
                torch.cuda.synchronize(self.device)
                m.wall_s = time.perf_counter() - t0
                m.peak = int(torch.cuda.max_memory_allocated(self.device))
                m.peak_reserved = int(torch.cuda.max_memory_reserved(self.device))
                m.end = self.allocated()
            return
        gpu = self.virtual
        entered = not gpu.active
        if entered:
            gpu.__enter__()
        gpu.reset_peak()
        m.start = gpu.allocated
        t0 = time.perf_counter()
        try:
            yield m
        finally:
            m.wall_s = time.perf_counter() - t0
            m.peak = gpu.peak
            m.peak_reserved = gpu.max_reserved
            m.end = gpu.allocated
            if entered:
                gpu.__exit__(None, None, None)

    def attach(self) -> None:
        """Keep the virtual GPU active between ``measure()`` blocks, as a real card always is: every
        storage created from now on is the card's, and ``%%vram`` / ``%vram auto`` records show the
        card. Undone by :meth:`detach`. On CUDA, nothing to do."""
        if not self.is_cuda and not self.virtual.active:
            self.virtual.__enter__()
            self._attached = True

    def detach(self) -> None:
        """End :meth:`attach`: the virtual GPU is active only inside ``measure()`` again."""
        if getattr(self, "_attached", False):
            self._attached = False
            self.virtual.__exit__(None, None, None)

    def cleanup(self) -> None:
        """Collect garbage and return cached blocks to the driver (``empty_cache``, on CUDA and
        on the virtual GPU alike)."""
        gc.collect()
        if self.is_cuda:
            self._torch.cuda.empty_cache()
        else:
            self.virtual.empty_cache()

    def describe(self) -> str:
        """What this device is, and what that means for the figures."""
        from ..units import format_bytes

        if self.is_cuda:
            return tr("CUDA device {device}: {name}, {capacity}. Figures are the real allocator's "
                      "(torch.cuda.memory_allocated / max_memory_allocated){size}",
                      device=self.device, name=self.name, capacity=format_bytes(self.capacity),
                      size=tr(", lessons use their large sizes.") if self.large else ".")
        ctx = self.virtual.context_overhead
        ctx_text = (tr("{context} of it is set aside as a modelled CUDA context; ", context=format_bytes(ctx)) if ctx
                    else tr("no CUDA context is modelled; "))
        what = (tr("a virtual {name} ({capacity})", name=self.name, capacity=format_bytes(self.capacity))
                if self.virtual.preset else tr("a virtual GPU of {capacity}", capacity=format_bytes(self.capacity)))
        if self.virtual.allocator_kind == "caching":
            return tr("No CUDA GPU here: {what} on the CPU. "
                      "Every tensor storage gets a block from a model of PyTorch's CUDA caching allocator "
                      "(512-byte blocks in 2 MiB and 20 MiB segments, a cache that empty_cache() gives back), "
                      "and torch.OutOfMemoryError is raised where that allocator would raise it, so allocated "
                      "and reserved figures are what a card would show for these tensors; {context}"
                      "timings are the CPU's, not a GPU's.", what=what, context=ctx_text)
        return tr("No CUDA GPU here: {what} on the CPU. "
                  "It counts every tensor storage exactly and raises torch.OutOfMemoryError at its capacity, "
                  "so memory figures are what a card would allocate for these tensors (rounded to 512-byte "
                  "blocks like CUDA's allocator); {context}the allocator's cache and cuBLAS workspaces are "
                  "not modelled, and timings are the CPU's, not a GPU's.", what=what, context=ctx_text)

    def __repr__(self) -> str:
        return self.describe()


def pick_device(virtual: str | int = "T4", *, force_virtual: bool = False, round_blocks: bool = True,
                allocator: str = "caching") -> LessonDevice:
    """The lesson's device: CUDA when present, else a virtual GPU on the CPU.

    Args:
        virtual: the virtual GPU to use without CUDA: a preset name (``"T4"``) or a
            capacity (``"256MiB"``, bytes). Ignored on CUDA.
        force_virtual: use the virtual GPU even where CUDA exists (also ``VRAMLAB_DEVICE=virtual``).
        round_blocks: with ``allocator="exact"``, round virtual allocations to 512-byte blocks, as
            CUDA's allocator does (the caching model always does).
        allocator: the virtual GPU's: ``"caching"`` (PyTorch's CUDA caching allocator, modelled)
            or ``"exact"`` (each storage's bytes, nothing cached).
    """
    return LessonDevice(virtual, force_virtual=force_virtual, round_blocks=round_blocks, allocator=allocator)
