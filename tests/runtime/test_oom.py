import sys

import pytest

from vramlab.runtime.oom import explain_oom, free_last_error, is_oom, parse_oom_message

GiB, MiB = 2**30, 2**20

# the message torch's CUDA caching allocator writes (c10/cuda/CUDACachingAllocator.cpp)
CUDA_MSG = ("CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 15.57 GiB of which "
            "1.50 GiB is free. Including non-PyTorch memory, this process has 14.06 GiB memory in use. Of the "
            "allocated memory 12.00 GiB is allocated by PyTorch, and 1.75 GiB is reserved by PyTorch but "
            "unallocated. If reserved but unallocated memory is large try setting "
            "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.")


def test_parse_cuda_message():
    f = parse_oom_message(CUDA_MSG)
    assert f["requested"] == 2 * GiB
    assert f["free"] == int(1.5 * GiB)
    assert f["torch_allocated"] == 12 * GiB
    assert f["reserved_unallocated"] == int(1.75 * GiB)
    assert f["gpu_index"] == 0
    assert f["total"] == pytest.approx(15.57 * GiB, rel=1e-6)


def test_is_oom():
    import torch

    assert is_oom(torch.OutOfMemoryError(CUDA_MSG))
    assert not is_oom(ValueError("Tried to allocate"))
    assert not is_oom(None)


def test_fragmentation_first_when_cache_could_hold_the_request():
    import torch

    ex = explain_oom(torch.OutOfMemoryError(CUDA_MSG.replace("1.75 GiB is reserved", "2.50 GiB is reserved")))
    assert ex.shortfall == 512 * MiB  # 2 GiB asked, 1.5 GiB free: the cache is not usable
    assert ex.fragmentation_is_cause  # 1.5 GiB free + 2.5 GiB cached would hold it
    assert "expandable_segments" in ex.suggestions[0]
    assert "not usable for this request" in ex.text() and "fragmentation is the cause" in ex.text()


def test_fragmentation_is_not_the_cause_when_free_and_cache_fall_short():
    import torch

    msg = CUDA_MSG.replace("1.75 GiB is reserved", "256.00 MiB is reserved")
    ex = explain_oom(torch.OutOfMemoryError(msg))
    assert not ex.fragmentation_is_cause and ex.shortfall == 512 * MiB
    assert not any("expandable_segments" in s for s in ex.suggestions)


def _record(peak_delta: int):
    from vramlab.model import CellRecord, DeviceDelta, HostDelta

    host = HostDelta(rss_start=0, rss_end=0, rss_delta=0, peak=None, peak_delta=None, swap_delta=None, peak_exact=False)
    dev = DeviceDelta(id="cuda:0", allocated_start=0, allocated_delta=0, peak_allocated=peak_delta,
                      peak_allocated_delta=peak_delta, reserved_delta=0, nvml_delta=None)
    return CellRecord(execution_count=1, started=0.0, wall_s=0.1, error="OutOfMemoryError", host=host, devices=(dev,))


def test_batch_size_suggestion_uses_the_cells_measured_growth():
    """With the cell's record: it wanted at least what it allocated plus the request, and had at
    most that plus what was free; bs * budget / need is an upper bound, and said to be one."""
    import torch

    ns = {"batch_size": 64}
    ex = explain_oom(torch.OutOfMemoryError(CUDA_MSG), ns, _record(2 * GiB))
    # wanted >= 2 GiB + 2 GiB (the request); 2 GiB + 1.5 GiB free (the fragmented cache is not usable): 64 * 3.5 / 4
    assert ex.batch_size == 64 and ex.fitting_batch_size == 56
    assert "batch size 64 -> at most 56, an upper bound" in ex.suggestions[1]
    assert "%vram free" in ex.text()


def test_without_the_cells_record_only_halving_is_advised():
    """The failed request alone says nothing of the rest of the step: no batch is derived."""
    import torch

    msg = CUDA_MSG.replace("1.50 GiB is free", "256.00 MiB is free").replace("1.75 GiB is reserved", "0 bytes is reserved")
    ex = explain_oom(torch.OutOfMemoryError(msg), {"bs": 64})
    assert ex.batch_size == 64 and ex.fitting_batch_size is None
    assert ex.suggestions[0].startswith("batch size 64 -> try 32") and "only halving" in ex.suggestions[0]


def test_the_upper_bound_holds_for_a_step_with_a_fixed_part():
    """A step of F + k * b bytes on a budget B fails at b: the bound from its record is never
    below the true limit (B - F) / k."""
    import torch

    F, k, B = 300 * MiB, 3 * MiB, 1024 * MiB
    limit = (B - F) // k
    for b in (limit + 1, 2 * limit, 5 * limit):
        cell = F + k * b  # what the step would hold; it fails at B, asking for the part that did not fit
        allocated = B - 64 * MiB  # what it held when the next request failed
        request = min(cell - allocated, 512 * MiB)
        msg = (f"CUDA out of memory. Tried to allocate {request / MiB:.2f} MiB. GPU 0 has a total capacity of "
               f"{B / MiB:.2f} MiB of which 64.00 MiB is free. Of the allocated memory {allocated / MiB:.2f} MiB is "
               "allocated by PyTorch, and 0 bytes is reserved by PyTorch but unallocated.")
        ex = explain_oom(torch.OutOfMemoryError(msg), {"batch_size": b}, _record(allocated))
        assert ex.fitting_batch_size is not None and limit <= ex.fitting_batch_size < b


def test_largest_consumers_from_the_namespace():
    import torch

    w = torch.zeros(1024, 1024)  # 4 MiB
    view = w[:10]
    model = torch.nn.Linear(256, 256)
    ex = explain_oom(torch.OutOfMemoryError(CUDA_MSG), {"w": w, "view": view, "model": model, "_hidden": w})
    names = [c.name for c in ex.consumers]
    assert names[0] in ("w", "view") and "model" in names and "_hidden" not in names
    assert {c.name: c.nbytes for c in ex.consumers}["w"] == 4 * MiB
    assert all(c.devices == "cpu" for c in ex.consumers)


def test_free_last_error_returns_what_the_traceback_kept():
    import numpy as np

    from vramlab.probes.host import read_host

    def work():
        big = np.ones(200 * MiB // 8)  # noqa: F841 - kept alive by the frame
        raise RuntimeError("boom")

    try:
        work()
    except RuntimeError:
        sys.last_type, sys.last_value, sys.last_traceback = sys.exc_info()
    held = read_host().process_rss
    rep = free_last_error()
    assert rep.host >= 190 * MiB, rep.text()
    assert read_host().process_rss < held - 150 * MiB
    assert "sys.last_traceback" in rep.cleared
    assert sys.last_traceback is None
