"""PyTorch's own CUDA caching-allocator tests, ported to vramlab's VirtualGPU.

Each test below is a port of one PyTorch test (``@ports(...)`` names the file, class, test and
the commit it was read from). Each is as close to the original as a CPU virtual card allows. A
``# ADAPTED:`` comment marks every place where the port departs from it, and says why.

Sources, read through the code index:

* ``test/test_cuda.py`` at pytorch/pytorch@000e43cdff99f30291164c1f2e90133f19fa83fb
  (``TestCuda``, ``TestCudaMallocAsync``, ``TestBlockStateAbsorption``, ``TestMemPool``).
* ``test/test_cuda_multigpu.py`` at pytorch/pytorch@042452378619d10f8ba1986cd78086f4018c179c
  (``TestCudaMultiGPU``).
* ``test/test_cuda_expandable_segments.py`` at pytorch/pytorch@079f90097f3a95c53dee49374203a895885478f4.
  This file reruns the test_cuda classes with ``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True``.
  It imports ``TestCuda``, ``TestCudaAllocator``, ``TestBlockStateAbsorption`` and ``TestMemPool``.
  At 000e43cd the allocator tests live in ``TestCudaMallocAsync``; there is no class named
  ``TestCudaAllocator``. The expandable runner of a matching revision imports the allocator class,
  whatever it is called there. So the tests of both classes run here in both modes
  (``[fixed]`` / ``[expandable]``). An exception is a test that sets ``expandable_segments``
  itself; see each test's comment.

A CPU virtual card has no streams, no CUDA graphs, no mempools, no second device, no C++ stacks
and no raw-pointer API. ``NOT_PORTED`` at the end of this file lists the allocator tests that
need one of these, each with its reason. ``test_not_ported_names_are_really_absent`` checks that
no test listed there is also ported here.

How this file talks to the card. While ``with gpu:`` is active, creating a CPU tensor allocates
it on the card. So ``torch.empty(n, dtype=torch.uint8)`` stands for
``torch.empty(n, dtype=torch.uint8, device="cuda")``. ``gpu.<name>()`` stands for
``torch.cuda.<name>()``: ``memory_allocated``, ``memory_stats``, ``memory_snapshot``,
``empty_cache``, ``set_per_process_memory_fraction``, and the rest. ``gpu.memory_dump()`` stands for
``torch.cuda.memory._snapshot()``, and ``gpu.record_memory_history(...)`` for
``torch.cuda.memory._record_memory_history(...)``.
"""

from __future__ import annotations

import collections
import json
import random
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

torch = pytest.importorskip("torch")

from torch.cuda import _memory_viz  # noqa: E402

from vramlab.sim.virtual_gpu import VirtualGPU  # noqa: E402

MiB = 1 << 20
GiB = 1 << 30

TEST_CUDA = ("test/test_cuda.py", "pytorch/pytorch@000e43cdff99f30291164c1f2e90133f19fa83fb")
TEST_MULTIGPU = ("test/test_cuda_multigpu.py", "pytorch/pytorch@042452378619d10f8ba1986cd78086f4018c179c")
THIS_FILE = Path(__file__).name  # stands for "test_cuda.py" / "test_cuda" in the frame checks


# --------------------------------------------------------------------------- bookkeeping


@dataclass(frozen=True)
class Source:
    file: str
    cls: str
    test: str
    commit: str


#: Every PyTorch test ported here, filled by ``@ports``.
PORTED: list[Source] = []


def ports(where: tuple[str, str], cls: str, test: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Mark a test as the port of ``cls.test`` of ``where`` = (file, commit)."""
    src = Source(where[0], cls, test, where[1])

    def mark(fn: Callable[..., Any]) -> Callable[..., Any]:
        PORTED.append(src)
        fn.torch_source = src  # type: ignore[attr-defined]
        return fn

    return mark


#: test_cuda_expandable_segments.py reruns the test_cuda classes under expandable_segments:True.
MODES = pytest.mark.parametrize("expandable", [False, True], ids=["fixed", "expandable"])


def _conf(expandable: bool, *extra: str) -> str:
    return ",".join([*extra, *(["expandable_segments:True"] if expandable else [])])


def _bytes(n: int) -> torch.Tensor:
    """``torch.empty(n, dtype=torch.uint8, device="cuda")`` (the helper of test_virtual_gpu_caching.py)."""
    return torch.empty(n, dtype=torch.uint8)


def _no_flamegraph(text: str) -> str:
    # ADAPTED: _memory_viz's default format_flamegraph downloads flamegraph.pl; this machine is offline.
    return text


# =========================================================================== test/test_cuda.py TestCuda


@ports(TEST_CUDA, "TestCuda", "test_memory_allocation")
@MODES
def test_memory_allocation(expandable: bool) -> None:
    gpu = VirtualGPU("1GiB", alloc_conf=_conf(expandable))
    with gpu:
        gpu.empty_cache()
        mem = None
        size = 1
        prev = 0
        try:
            prev = gpu.memory_allocated()
            # ADAPTED: there is no torch.cuda.caching_allocator_alloc(size). The raw allocation of
            # 1 byte is a tensor with a 1-byte storage.
            mem = torch.empty(size, dtype=torch.uint8)
            assert gpu.memory_allocated() > prev
        finally:
            if mem is not None:
                del mem  # caching_allocator_delete
                assert gpu.memory_allocated() == prev


@ports(TEST_CUDA, "TestCuda", "test_memory_stats")
@MODES
def test_memory_stats(expandable: bool) -> None:
    # ADAPTED: there is no reset_accumulated_memory_stats(). A fresh card has nothing accumulated.
    gpu = VirtualGPU("1GiB", alloc_conf=_conf(expandable))
    with gpu:
        gpu.empty_cache()
        gpu.reset_peak_memory_stats()
        prev_allocated = gpu.memory_allocated()
        prev_reserved = gpu.memory_reserved()
        prev_max_allocated = gpu.max_memory_allocated()
        prev_max_reserved = gpu.max_memory_reserved()
        assert prev_allocated == prev_max_allocated
        assert prev_reserved == prev_max_reserved
        # Activate 1kB memory
        prev_active_current = gpu.memory_stats()["active_bytes.all.current"]
        tmp = torch.randn(256)
        # Detect if the current active memory is 1kB
        assert gpu.memory_stats()["active_bytes.all.current"] == 1024 + prev_active_current
        assert gpu.memory_stats()["active_bytes.all.freed"] == 0
        del tmp
        gpu.empty_cache()
        assert gpu.memory_stats()["active_bytes.all.current"] == prev_active_current
        assert gpu.memory_stats()["active_bytes.all.freed"] == 1024
        gpu.reset_peak_memory_stats()
        assert gpu.max_memory_allocated() == prev_max_allocated
        assert gpu.max_memory_reserved() == prev_max_reserved


@ports(TEST_CUDA, "TestCuda", "test_out_of_memory")
@MODES
def test_out_of_memory(expandable: bool) -> None:
    gpu = VirtualGPU("16GiB", alloc_conf=_conf(expandable))
    with gpu:
        tensor = torch.zeros(1024)

        oom_regex = "Tried to allocate 800000000.00 GiB. GPU 0 has a total capacity of"
        with pytest.raises(RuntimeError, match=oom_regex):
            torch.empty(1024 * 1024 * 1024 * 800000000, dtype=torch.int8)

        with pytest.raises(RuntimeError, match="Tried to allocate more than 1EB memory"):
            torch.empty(1024 * 1024 * 1024 * 8000000000, dtype=torch.int8)

        # ensure out of memory error doesn't disturb subsequent kernel
        tensor.fill_(1)
        assert (tensor == 1).all()


@ports(TEST_CUDA, "TestCuda", "test_out_of_memory_retry")
@MODES
def test_out_of_memory_retry(expandable: bool) -> None:
    # ADAPTED: the card is 256 MiB, not a real card's size, to keep the host's memory low. A
    # 32 MiB CUDA context is added: torch's total_memory includes the context, which is why two
    # halves of it can never both fit.
    gpu = VirtualGPU("256MiB", context_overhead=32 * MiB, alloc_conf=_conf(expandable))
    with gpu:
        gpu.empty_cache()
        total_memory = gpu.capacity  # get_device_properties(0).total_memory
        oom_regex = "Tried to allocate"
        size = int(total_memory * 0.5)
        a = torch.empty(size, dtype=torch.int8)
        with pytest.raises(RuntimeError, match=oom_regex):
            b = torch.empty(size, dtype=torch.int8)
        del a
        b = torch.empty(size, dtype=torch.int8)
        del b
        # We used a lot of memory here, clean up so we don't affect other tests too much
        gpu.empty_cache()
        gpu.reset_peak_memory_stats()


@ports(TEST_CUDA, "TestCuda", "test_set_per_process_memory_fraction")
@MODES
def test_set_per_process_memory_fraction(expandable: bool) -> None:
    # ADAPTED: a 16 GiB card with no context. With 0.499 the margin below the cap is 0.1% of
    # the card, 16 MiB; on a much smaller card it would be less than one expandable page. The
    # 0.499 tensor is only created empty; no value of it is written.
    gpu = VirtualGPU("16GiB", alloc_conf=_conf(expandable))
    with gpu:
        orig = gpu.get_per_process_memory_fraction()
        gpu.reset_peak_memory_stats()
        try:
            # test invalid fraction value.
            with pytest.raises(TypeError, match="Invalid type"):
                gpu.set_per_process_memory_fraction(1)
            with pytest.raises(ValueError, match="Invalid fraction value"):
                gpu.set_per_process_memory_fraction(-0.1)
            with pytest.raises(ValueError, match="Invalid fraction value"):
                gpu.set_per_process_memory_fraction(2.0)

            tensor = torch.zeros(1024)
            gpu.empty_cache()
            total_memory = gpu.capacity
            gpu.set_per_process_memory_fraction(0.5)

            # test 0.499 allocation is ok.
            application = int(total_memory * 0.499) - gpu.max_memory_reserved()
            tmp_tensor = torch.empty(application, dtype=torch.int8)
            del tmp_tensor
            gpu.empty_cache()

            application = int(total_memory * 0.5)
            # it will get OOM when try to allocate more than half memory.
            with pytest.raises(RuntimeError, match="out of memory"):
                torch.empty(application, dtype=torch.int8)

            # ensure out of memory error doesn't disturb subsequent kernel
            tensor.fill_(1)
            assert (tensor == 1).all()
        finally:
            gpu.set_per_process_memory_fraction(orig)


@ports(TEST_CUDA, "TestCuda", "test_get_per_process_memory_fraction")
@MODES
def test_get_per_process_memory_fraction(expandable: bool) -> None:
    # ADAPTED: torch.rand(3) in torch's test is a CPU tensor; here CPU tensors made inside the
    # card are device memory, and under a fraction of 0.0 it could not be allocated. So it is
    # drawn before entering.
    vals = [float(v) for v in torch.rand(3)]
    gpu = VirtualGPU("1GiB", alloc_conf=_conf(expandable))
    with gpu:
        # get the initial memory fraction
        init_fraction = gpu.get_per_process_memory_fraction()

        # set and get the limiting cases
        gpu.set_per_process_memory_fraction(1.0)
        assert gpu.get_per_process_memory_fraction() == 1.0
        gpu.set_per_process_memory_fraction(0.0)
        assert gpu.get_per_process_memory_fraction() == 0.0

        # test a few random cases
        for val in vals:
            gpu.set_per_process_memory_fraction(float(val))
            assert gpu.get_per_process_memory_fraction() == float(val)

        # restore the initial memory fraction
        gpu.set_per_process_memory_fraction(init_fraction)


@ports(TEST_CUDA, "TestCuda", "test_cublas_workspace_explicit_allocation")
@MODES
@pytest.mark.parametrize("card", ["T4", "H100"])
def test_cublas_workspace_explicit_allocation(card: str, expandable: bool, monkeypatch) -> None:
    # ADAPTED: the test runs on a T4 (compute capability 7.5) and an H100 (9.0), so both branches
    # of the default are exercised. torch._C._cuda_clearCublasWorkspaces() is a fresh card for
    # each measurement: the workspace lives as long as the card's kernels.
    default_workspace_size = 4096 * 2 * 1024 + 16 * 8 * 1024  # :4096:2:16:8  8MiB
    # different size (32 MiB) expected on Hopper GPU
    if card == "H100":
        default_workspace_size = 4096 * 8 * 1024

    def check_workspace_size() -> int:
        gpu = VirtualGPU(card, alloc_conf=_conf(expandable))
        with gpu:
            inp = torch.randn(7, 7, requires_grad=False)
            start = gpu.memory_stats()["active_bytes.all.allocated"]
            with torch.no_grad():
                torch.matmul(inp, inp)
            finish = gpu.memory_stats()["active_bytes.all.allocated"]
            return finish - start

    # check default
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", "")
    assert check_workspace_size() - default_workspace_size < 524288
    assert abs(check_workspace_size() - default_workspace_size) < 524288

    # check default with bad user config
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", "-1")
    assert check_workspace_size() - default_workspace_size < 524288
    assert abs(check_workspace_size() - default_workspace_size) < 524288

    # check valid config
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":128:8:64:16:32:32")
    assert check_workspace_size() - (3072 * 1024) < 524288
    assert abs(check_workspace_size() - (3072 * 1024)) < 524288


@ports(TEST_CUDA, "TestCuda", "test_matmul_memory_use")
@MODES
def test_matmul_memory_use(expandable: bool) -> None:
    # ADAPTED: the card is a preset (A100-80GB), so its matrix products use the CUDA kernels'
    # model (vramlab.sim.kernels). A bare size runs the CPU's kernels, with the CPU's
    # temporaries; the documentation says so, and a CUDA test does not apply to it.
    gpu = VirtualGPU("A100-80GB", alloc_conf=_conf(expandable))
    with gpu:

        def get_max_used() -> int:
            val = gpu.max_memory_allocated()
            gpu.reset_peak_memory_stats()
            return val

        # ADAPTED: one matmul first. In torch's CI process the cuBLAS workspace already exists
        # when this test runs. On a fresh card with CUDA kernels it would be allocated by the
        # first matmul measured.
        torch.matmul(torch.rand(2, 2), torch.rand(2, 2))

        a = torch.rand(1, 32, 32)
        b = torch.rand(24, 32, 1)

        get_max_used()

        torch.matmul(a, b)

        matmul_mem = get_max_used()

        a = a.expand(24, 32, 32)
        torch.matmul(a, b)

        matmul_expand_mem = get_max_used()

        torch.bmm(a, b)

        bmm_mem = get_max_used()

        assert matmul_expand_mem == matmul_mem
        assert bmm_mem == matmul_mem


# =========================================================================== test/test_cuda.py TestCudaMallocAsync


@ports(TEST_CUDA, "TestCudaMallocAsync", "test_memory_snapshot")
@MODES
def test_memory_snapshot(expandable: bool) -> None:
    gpu = VirtualGPU("1GiB", alloc_conf=_conf(expandable))
    rng = random.Random(0)  # ADAPTED: randint seeded, so a failure can be reproduced
    with gpu:
        try:
            gpu.empty_cache()
            gpu.record_memory_history("state", stacks="python")
            # make x the second block in a segment
            torch.rand(2 * 311, 411)
            unused = torch.rand(310, 410)
            x = torch.rand(311, 411)

            # create a bunch of tensors that all will tile into the
            # same segment to  exercise the history merging code
            # 512B is the minimum block size,
            # so we allocate all the tensors to this size to make sure
            # they tile evenly
            tensors = [torch.rand(128) for _ in range(1000)]
            while tensors:
                del tensors[rng.randint(0, len(tensors) - 1)]

            # exercise the history trimming code
            torch.rand(128 * 5)

            ss = gpu.memory_dump()
            found_it = False
            for seg in ss["segments"]:
                assert "frames" in seg
                for b in seg["blocks"]:
                    if b["requested_size"] == 311 * 411 * 4:
                        assert THIS_FILE in b["frames"][0]["filename"]
                        found_it = True
                        # ADAPTED: torch also checks x.untyped_storage().data_ptr() == b["address"].
                        # A CPU pointer cannot be the virtual card's address, so that check is left out.
            assert found_it

            # torch.cuda.memory._save_segment_usage(f.name) writes _memory_viz.segments(snapshot)
            assert THIS_FILE in _memory_viz.segments(ss, format_flamegraph=_no_flamegraph)
            del unused
            del x
            gpu.empty_cache()
            ss = gpu.memory_dump()
            assert ss["device_traces"][0][-1]["action"] in ("segment_free", "segment_unmap")

        finally:
            gpu.record_memory_history(None)


@ports(TEST_CUDA, "TestCudaMallocAsync", "test_memory_plots")
@MODES
@pytest.mark.parametrize("context, stacks", [("all", "python"), (None, "python")])
def test_memory_plots(context: Any, stacks: str, expandable: bool) -> None:
    # ADAPTED: torch loops over three (context, stacks) pairs. Two are the parameters here. The
    # third, ("all", "all"), asserts C++ frames ("::rand"), which a CPU virtual card cannot record;
    # it is left out. The assertion cpp == ("::rand" in text) is kept, with cpp False.
    gpu = VirtualGPU("1GiB", alloc_conf=_conf(expandable))
    with gpu:
        try:
            gpu.empty_cache()
            gpu.record_memory_history("all", context=context, stacks=stacks)

            def run() -> None:
                x = torch.rand(128, 128)
                x * x + x * x

            run()
            cpp = stacks == "all"
            record_context = context is not None
            ss = gpu.memory_dump()

            _memory_viz.trace_plot(ss)
            _memory_viz.trace_plot(ss, filter_freed=True)
            _memory_viz.segment_plot(ss)
            text = json.dumps(ss)

            assert record_context == ("test_memory_plots" in text)
            assert cpp == ("::rand" in text)
            assert str(128 * 128 * 4) in text

        finally:
            gpu.record_memory_history(None)


@ports(TEST_CUDA, "TestCudaMallocAsync", "test_memory_plots_free_stack")
@MODES
def test_memory_plots_free_stack(expandable: bool) -> None:
    gpu = VirtualGPU("1GiB", alloc_conf=_conf(expandable))
    with gpu:
        for context in ["alloc", "all", "state"]:
            try:
                gpu.empty_cache()
                gpu.record_memory_history(context=context)
                x = None

                def thealloc() -> None:
                    nonlocal x
                    x = torch.rand(3, 4)

                def thefree() -> None:
                    nonlocal x
                    del x

                thealloc()
                thefree()
                ss = json.dumps(gpu.memory_dump())
                assert ("thefree" in ss) == (context == "all"), context
                assert ("thealloc" in ss) == (context != "state"), context
            finally:
                gpu.record_memory_history(None)


@ports(TEST_CUDA, "TestCudaMallocAsync", "test_memory_plots_history_context")
@MODES
def test_memory_plots_history_context(expandable: bool) -> None:
    gpu = VirtualGPU("1GiB", alloc_conf=_conf(expandable))
    with gpu:
        try:
            gpu.empty_cache()
            x = None

            def should_capture1() -> None:
                nonlocal x
                x = torch.rand(4, 4)

            def should_not_capture() -> None:
                nonlocal x
                x = torch.rand(3, 4)

            def should_capture2() -> None:
                nonlocal x
                x = torch.rand(4, 4)

            # Recording with context and python call stacks should capture the call stack.
            gpu.record_memory_history(context="all", stacks="python")
            should_capture1()
            # Recording with context=None should not capture the call stack.
            gpu.record_memory_history(context=None)
            should_not_capture()
            # Recording with context and python call stacks should capture the call stack.
            gpu.record_memory_history(context="all", stacks="python")
            should_capture2()

            ss = json.dumps(gpu.memory_dump())
            assert "should_capture1" in ss
            assert "should_not_capture" not in ss
            assert "should_capture2" in ss
        finally:
            gpu.record_memory_history(None)


@ports(TEST_CUDA, "TestCudaMallocAsync", "test_memory_plots_free_segment_stack")
@MODES
def test_memory_plots_free_segment_stack(expandable: bool) -> None:
    # torch's frame for the release is torch.cuda.memory.empty_cache. Here it is the Python
    # method gpu.empty_cache, which the user calls in its place.
    gpu = VirtualGPU("1GiB", alloc_conf=_conf(expandable))
    with gpu:
        for context in ["alloc", "all", "state"]:
            try:
                # ADAPTED: torch first calls torch._C._cuda_clearCublasWorkspaces(). No matmul runs
                # on this card, so it has no workspace to clear.
                gpu.empty_cache()
                gpu.record_memory_history(context=context)
                x = torch.rand(3, 4)
                del x
                gpu.empty_cache()

                ss = json.dumps(gpu.memory_dump())
                assert ("empty_cache" in ss) == (context == "all"), context
            finally:
                gpu.record_memory_history(None)


@ports(TEST_CUDA, "TestCudaMallocAsync", "test_memory_snapshot_skip_actions")
@MODES
@pytest.mark.parametrize("skip_actions, description", [
    (["free_requested"], "single action"),
    (["free_requested", "free_completed"], "multiple actions"),
    (["alloc"], "alloc action"),
    (["segment_alloc", "segment_free"], "segment actions"),
    ([], "empty list"),
    (None, "None default"),
])
def test_memory_snapshot_skip_actions(skip_actions: Any, description: str, expandable: bool) -> None:
    """Test that skip_actions parameter correctly filters out specified action types."""
    # ADAPTED: torch loops over the cases in subTests; here they are parameters.
    gpu = VirtualGPU("1GiB", alloc_conf=_conf(expandable))
    with gpu:
        try:
            gpu.empty_cache()
            gpu.record_memory_history(context="all", stacks="python", skip_actions=skip_actions)

            # Perform allocations and frees to generate various actions
            x = torch.rand(128, 128)
            del x

            # Take snapshot to potentially generate snapshot event
            ss = gpu.memory_dump()
            device_idx = 0
            while len(ss["device_traces"][device_idx]) == 0:
                device_idx = device_idx + 1
            device_trace = ss["device_traces"][device_idx]

            # Verify traces are not empty (other actions are still recorded)
            assert len(device_trace) > 0, f"Trace should not be empty for skip_actions={skip_actions}"

            if skip_actions:
                all_actions = {event["action"] for event in device_trace}

                # Verify skipped actions are not in traces
                for sa in skip_actions:
                    assert sa not in all_actions, f"Action {sa} should be skipped with skip_actions={skip_actions}"
                # Check that we have actions that are NOT in the skip list
                non_skipped_actions = all_actions - set(skip_actions)
                assert len(non_skipped_actions) > 0, \
                    f"Should have non-skipped actions for skip_actions={skip_actions}"
        finally:
            gpu.record_memory_history(None)


def _fraction_card(conf: str) -> tuple[VirtualGPU, float]:
    """The setup of test_max_split_expandable and test_garbage_collect_expandable. The card allows
    120 MiB plus what is reserved before, as a fraction of mem_get_info's total."""
    gpu = VirtualGPU("1GiB", alloc_conf=conf)
    all_memory = gpu.capacity  # torch.cuda.memory.mem_get_info()[1]
    pre_reserved = gpu.memory_reserved()
    total_allowed = 120 * MiB + pre_reserved
    fraction_allowed = total_allowed / all_memory
    assert int(round(fraction_allowed * all_memory)) == total_allowed
    assert (fraction_allowed * all_memory) == total_allowed
    return gpu, fraction_allowed


@ports(TEST_CUDA, "TestCudaMallocAsync", "test_max_split_expandable")
@MODES
def test_max_split_expandable(expandable: bool) -> None:
    # ADAPTED: torch switches expandable_segments at run time between a, b and c
    # (fixed, expandable, fixed). A VirtualGPU's options are fixed when it is made. So the program
    # runs once with all segments fixed and once with all expandable.
    gpu, fraction_allowed = _fraction_card(_conf(expandable, "max_split_size_mb:40"))
    with gpu:
        orig = gpu.get_per_process_memory_fraction()
        try:
            gpu.empty_cache()
            gpu.set_per_process_memory_fraction(fraction_allowed)

            def alloc(n: int) -> torch.Tensor:
                return torch.ones(n * MiB, dtype=torch.int8)

            a = alloc(40)
            b = alloc(40)
            c = alloc(40)
            with pytest.raises(torch.OutOfMemoryError):
                alloc(40)
            del a, b, c
            # force release_cached_blocks to run with some expandable segments in the free list
            alloc(120)
        finally:
            gpu.set_per_process_memory_fraction(orig)


@ports(TEST_CUDA, "TestCudaMallocAsync", "test_garbage_collect_expandable")
@MODES
def test_garbage_collect_expandable(expandable: bool) -> None:
    # ADAPTED: as in test_max_split_expandable, the run-time switch of expandable_segments
    # (a fixed, b expandable) becomes one run with all fixed and one with all expandable.
    gpu, fraction_allowed = _fraction_card(_conf(expandable, "garbage_collection_threshold:0.5"))
    with gpu:
        orig = gpu.get_per_process_memory_fraction()
        try:
            gpu.empty_cache()
            gpu.set_per_process_memory_fraction(fraction_allowed)

            def alloc(n: int) -> torch.Tensor:
                return torch.ones(n * MiB, dtype=torch.int8)

            a = alloc(40)
            b = alloc(40)
            del a, b
            # causes GC to run. The expandable segment block will be split
            # so GC would not attempt to free it anyway, but this at least makes sure
            # expandable_segment blocks can be in the free list when this is called.
            alloc(80)
        finally:
            gpu.set_per_process_memory_fraction(orig)


def _power2_div(size: int, div_factor: int) -> float:
    pow2 = 1
    while pow2 < size:
        pow2 = pow2 * 2
    if pow2 == size:
        return pow2
    step = pow2 / 2 / div_factor
    ret = pow2 / 2
    while ret < size:
        ret = ret + step
    return ret


@ports(TEST_CUDA, "TestCudaMallocAsync", "test_allocator_settings")
@MODES
def test_allocator_settings(expandable: bool) -> None:
    # ADAPTED: torch changes the settings of the one allocator with
    # torch.cuda.memory._set_allocator_settings(...). A VirtualGPU takes its settings when it is
    # made, so each setting gets a fresh card; the measured deltas are the same. The tensors
    # are created with torch.empty, not torch.rand: only their size matters.
    key_allocated = "active_bytes.all.allocated"
    key_requested = "requested_bytes.all.allocated"

    nelems = 21 * 1024 * 1024
    nbytes = 4 * nelems  # floats are 4 bytes

    nelems_big = 100 * 1024 * 1024
    nbytes_big = 4 * nelems_big  # floats are 4 bytes

    def card(settings: str) -> VirtualGPU:
        return VirtualGPU("1GiB", alloc_conf=_conf(expandable, *([settings] if settings else [])))

    gpu = card("")
    with gpu:
        start_mem = gpu.memory_stats()[key_allocated]
        x = torch.empty(nelems)
        reg_mem = gpu.memory_stats()[key_allocated]
    assert reg_mem - start_mem == nbytes

    # test roundup_power2_divisions single value syntax
    gpu = card("roundup_power2_divisions:4")
    with gpu:
        reg_mem = gpu.memory_stats()[key_allocated]
        start_requested = gpu.memory_stats()[key_requested]
        y = torch.empty(nelems)
        pow2_div4_mem = gpu.memory_stats()[key_allocated]
        current_requested = gpu.memory_stats()[key_requested]
    assert pow2_div4_mem - reg_mem == _power2_div(nbytes, 4)
    assert current_requested - start_requested == nbytes

    card("garbage_collection_threshold:0.5")

    # should have reset the power2 divisions now
    gpu = card("garbage_collection_threshold:0.5,max_split_size_mb:40")
    with gpu:
        gpu.empty_cache()
        start_mem = gpu.memory_stats()[key_allocated]
        z = torch.empty(nelems)
        reg_mem = gpu.memory_stats()[key_allocated]
    assert reg_mem - start_mem == nbytes

    # roundup_power2_divisions knob array syntax
    gpu = card("garbage_collection_threshold:0.5,roundup_power2_divisions:[64:8,128:2,256:2,512:2,1024:1,>:1]")
    with gpu:
        gpu.empty_cache()
        start_mem = gpu.memory_stats()[key_allocated]
        w = torch.empty(nelems)
        pow2_div8_mem = gpu.memory_stats()[key_allocated]
        assert pow2_div8_mem - start_mem == _power2_div(nbytes, 8)

        gpu.empty_cache()
        start_mem = gpu.memory_stats()[key_allocated]
        v = torch.empty(nelems_big)
        pow2_div2_mem = gpu.memory_stats()[key_allocated]
        assert pow2_div2_mem - start_mem == _power2_div(nbytes_big, 2)
        del w, v

    gpu = card("release_lock_on_cudamalloc:True")
    with gpu:
        gpu.empty_cache()
        start_mem = gpu.memory_stats()[key_allocated]
        w = torch.empty(nelems)
        reg_mem = gpu.memory_stats()[key_allocated]
    assert reg_mem - start_mem == nbytes
    del x, y, z, w

    # torch._C._accelerator_setAllocatorSettings(...) raises ValueError; here the card refuses them
    for bad in ("foo:1,bar:2", "garbage_collection_threshold:1.2", "max_split_size_mb:2",
                "release_lock_on_cudamalloc:none", "pinned_use_cuda_host_register:none",
                "pinned_num_register_threads:none", "pinned_num_register_threads:1024"):
        with pytest.raises(ValueError):
            VirtualGPU("1GiB", alloc_conf=bad)


@ports(TEST_CUDA, "TestCudaMallocAsync", "test_allocator_memory_fraction_setting")
def test_allocator_memory_fraction_setting() -> None:
    # ADAPTED: torch starts a Python subprocess with PYTORCH_CUDA_ALLOC_CONF set and prints
    # get_per_process_memory_fraction(). Here the same setting goes to the card's alloc_conf.
    # An invalid value fails the subprocess with this message; here it is a ValueError with it.
    def run_test(value: float) -> str:
        gpu = VirtualGPU("1GiB", alloc_conf=f"per_process_memory_fraction:{value}")
        with gpu:
            return str(gpu.get_per_process_memory_fraction())

    assert run_test(0.0) == "0.0"
    assert run_test(0.5) == "0.5"
    assert run_test(1.0) == "1.0"

    with pytest.raises(ValueError, match="per_process_memory_fraction is invalid"):
        run_test(-0.1)

    with pytest.raises(ValueError, match="per_process_memory_fraction is invalid"):
        run_test(1.1)


@ports(TEST_CUDA, "TestCudaMallocAsync", "test_raises_oom")
@MODES
@pytest.mark.parametrize("max_split_size_mb_setting", [False, True])
def test_raises_oom(max_split_size_mb_setting: bool, expandable: bool) -> None:
    # ADAPTED: torch sets max_split_size_mb:1024 at run time, then calls empty_cache(). Here the
    # card is made with it.
    conf = _conf(expandable, *(["max_split_size_mb:1024"] if max_split_size_mb_setting else []))
    gpu = VirtualGPU("16GiB", alloc_conf=conf)
    with gpu:
        gpu.empty_cache()
        with pytest.raises(torch.OutOfMemoryError):
            torch.empty(1024 * 1024 * 1024 * 1024)


@ports(TEST_CUDA, "TestCudaMallocAsync", "test_allocator_fuzz")
@MODES
@pytest.mark.slow
def test_allocator_fuzz(expandable: bool) -> None:
    # ADAPTED: N 10000 -> 1000 for time (2 shared cores). After every 50 steps the snapshot is
    # also checked against memory_stats (_check_memory_stat_consistency from test_cuda_multigpu.py).
    # A real card has GiBs spare; this card is 2 GiB. The test keeps at most about 107 MB live,
    # plus what the cache holds.
    gpu = VirtualGPU("2GiB", alloc_conf=_conf(expandable))
    state = random.getstate()
    random.seed(123)
    N = 1000
    try:
        with gpu:
            mem: list[tuple[int, torch.Tensor]] = []
            total = 0
            c = 0

            def alloc() -> None:
                nonlocal total, c
                b = random.randrange(2 * 1024 * 1024 // 4, 20 * 1024 * 1024 // 4)
                mem.append((c, torch.full((b,), c, dtype=torch.int32)))
                c += 1
                total += b

            def free() -> None:
                nonlocal total
                idx = random.randrange(0, len(mem))
                v, x = mem.pop(idx)
                assert torch.all(v == x)
                total -= x.numel()

            choices = [alloc, free, gpu.empty_cache]
            for step in range(N):
                while total >= 1024 * 1024 * 1024 / (4 * 10):
                    free()
                (action,) = random.choices(choices, weights=[1, 1 if mem else 0, 0.1])
                action()
                if step % 50 == 0:
                    _check_memory_stat_consistency(gpu)
            _check_memory_stat_consistency(gpu)
            mem.clear()
    finally:
        random.setstate(state)


# =========================================================================== test/test_cuda_multigpu.py


def _check_memory_stat_consistency(gpu: VirtualGPU) -> None:
    """TestCudaMultiGPU._check_memory_stat_consistency, for the one virtual device."""
    snapshot = gpu.memory_snapshot()

    expected_each_device: dict[int, dict[str, int]] = collections.defaultdict(lambda: collections.defaultdict(int))

    for segment in snapshot:
        expandable = segment["is_expandable"]
        expected = expected_each_device[segment["device"]]
        pool_str = segment["segment_type"] + "_pool"

        if not expandable:
            expected["segment.all.current"] += 1
            expected["segment." + pool_str + ".current"] += 1

        expected["allocated_bytes.all.current"] += segment["allocated_size"]
        expected["allocated_bytes." + pool_str + ".current"] += segment["allocated_size"]

        expected["reserved_bytes.all.current"] += segment["total_size"]
        expected["reserved_bytes." + pool_str + ".current"] += segment["total_size"]

        expected["active_bytes.all.current"] += segment["active_size"]
        expected["active_bytes." + pool_str + ".current"] += segment["active_size"]

        expected["requested_bytes.all.current"] += segment["requested_size"]
        expected["requested_bytes." + pool_str + ".current"] += segment["requested_size"]

        sum_requested = 0
        is_split = len(segment["blocks"]) > 1
        for block in segment["blocks"]:
            if block["state"] == "active_allocated":
                expected["allocation.all.current"] += 1
                expected["allocation." + pool_str + ".current"] += 1

            if block["state"].startswith("active_"):
                sum_requested += block["requested_size"]
                expected["active.all.current"] += 1
                expected["active." + pool_str + ".current"] += 1

            if block["state"] == "inactive" and is_split and not expandable:
                expected["inactive_split.all.current"] += 1
                expected["inactive_split." + pool_str + ".current"] += 1
                expected["inactive_split_bytes.all.current"] += block["size"]
                expected["inactive_split_bytes." + pool_str + ".current"] += block["size"]

        assert sum_requested == segment["requested_size"]

    for _device, expected in expected_each_device.items():
        stats = gpu.memory_stats()
        for k, v in expected.items():
            assert v == stats[k], k


def _test_memory_stats_generator(gpu: VirtualGPU, perm: list[int], N: int = 35) -> Iterator[Any]:
    """TestCudaMultiGPU._test_memory_stats_generator. ``perm`` is the ``torch.randperm`` of the
    original, drawn before the card was entered (see test_memory_stats_multigpu_file)."""
    m0 = gpu.memory_allocated()
    last_m_arr = [gpu.memory_allocated()]
    max_m_arr = [gpu.max_memory_allocated()]
    last_r_arr = [gpu.memory_reserved()]
    max_r_arr = [gpu.max_memory_reserved()]

    def alloc(*size: int) -> torch.Tensor:
        # NOTE: do **not** use methods that can have additional
        #       memory overhead, e.g., inplace random sampling methods.
        #       they can leave some memory occupied even after being
        #       deallocated, e.g., initialized RNG state, causing some
        #       memory checks below to fail.
        return torch.empty(*size, dtype=torch.float32)  # torch.cuda.FloatTensor(*size)

    def assert_change(comp: int = 1, empty_cache: bool = False, reset_peak: bool = False) -> None:
        # comp > 0: increased
        # comp = 0: equal
        # comp < 0: decreased
        new_m = gpu.memory_allocated()
        new_max_m = gpu.max_memory_allocated()
        if comp > 0:
            assert new_m > last_m_arr[0]
        elif comp < 0:
            assert new_m < last_m_arr[0]
        else:
            assert new_m == last_m_arr[0]
        assert new_m <= new_max_m
        assert new_max_m >= max_m_arr[0]
        last_m_arr[0] = new_m
        max_m_arr[0] = new_max_m

        new_r = gpu.memory_reserved()
        new_max_r = gpu.max_memory_reserved()
        # emptying cache may happen (due to allocation or empty_cache), so
        # we can't assert new_c >= last_c
        assert new_r <= new_max_r
        assert new_max_r >= max_r_arr[0]
        last_r_arr[0] = new_r
        max_r_arr[0] = new_max_r

        stat_key_n_sync = "num_sync_all_streams"
        stat_key_n_alloc = "num_device_alloc"
        stat_key_n_free = "num_device_free"
        if empty_cache:
            num_sync_1 = gpu.memory_stats().get(stat_key_n_sync, -1)
            assert num_sync_1 >= 0
            num_alloc_1 = gpu.memory_stats().get(stat_key_n_alloc, -1)
            # if current memory usage is greater than zero we must have
            # allocated something
            assert num_alloc_1 >= (0 if new_m == 0 else 1)
            num_free_1 = gpu.memory_stats().get(stat_key_n_free, -1)
            assert num_free_1 >= 0
            # empty_cache will enforce the call of release_cached_blocks
            gpu.empty_cache()
            num_sync_2 = gpu.memory_stats().get(stat_key_n_sync, -1)
            assert num_sync_1 + 1 == num_sync_2
            num_alloc_2 = gpu.memory_stats().get(stat_key_n_alloc, -1)
            assert num_alloc_2 >= num_alloc_1
            num_free_2 = gpu.memory_stats().get(stat_key_n_free, -1)
            assert num_free_2 >= num_free_1

            new_r = gpu.memory_reserved()
            new_max_r = gpu.max_memory_reserved()
            assert new_r <= last_r_arr[0]
            assert new_r <= new_max_r
            assert new_max_r == max_r_arr[0]
            last_r_arr[0] = new_r

        if reset_peak:
            gpu.reset_peak_memory_stats()
            assert gpu.memory_allocated() == last_m_arr[0]
            assert gpu.max_memory_allocated() == last_m_arr[0]
            max_m_arr[0] = last_m_arr[0]
            assert gpu.memory_reserved() == last_r_arr[0]
            assert gpu.max_memory_reserved() == last_r_arr[0]
            max_r_arr[0] = last_r_arr[0]

    assert_change(0)
    assert_change(0, reset_peak=True)
    assert_change(0, empty_cache=True)
    assert_change(0, reset_peak=True)
    assert_change(0)
    yield

    tensors1 = [alloc(1), alloc(10, 20), alloc(200, 300, 2000)]
    m1 = gpu.memory_allocated()
    assert_change(1)
    yield

    tensors2 = []

    for i in range(1, int(N / 2) + 1):
        # small ones
        tensors2.append(alloc(i, i * 4))
        assert_change(1)
        yield

    for i in range(5, int(N / 2) + 5):
        # large ones
        tensors2.append(alloc(i, i * 7, i * 9, i * 11))
        assert_change(1, reset_peak=(i % 2 == 0))
        yield

    tensors2.append(alloc(0, 0, 0))
    assert_change(0)
    yield

    permute = []
    assert len(perm) == len(tensors2)
    for i in perm:
        permute.append(tensors2[i])
        assert_change(0)
        yield

    del tensors2
    assert_change(0)
    yield
    tensors2 = permute
    assert_change(0)
    yield
    del permute
    assert_change(0, reset_peak=True)
    yield

    for i in range(int(N / 2)):
        x = tensors2[i].numel()
        del tensors2[i]
        assert_change(-x)  # in case that tensors2[i] is empty
        yield

    for i in range(2, int(2 * N / 3) + 2):
        tensors2.append(alloc(i, i * 3, i * 8))
        assert_change(1)
        yield

    del tensors2
    assert_change(-1, reset_peak=True)
    assert_change(0)
    assert gpu.memory_allocated() == m1
    yield True

    del tensors1
    assert_change(-1, reset_peak=True)
    assert gpu.memory_allocated() == m0

    # test empty_cache and reset_peak
    assert_change(0, empty_cache=True)
    assert_change(0, reset_peak=True)


@ports(TEST_MULTIGPU, "TestCudaMultiGPU", "test_memory_stats")
@pytest.mark.parametrize("expandable", [False, True], ids=["fixed", "expandable"])
def test_memory_stats_multigpu_file(expandable: bool) -> None:
    # Named *_multigpu_file so as not to clash with test_cuda.py's test_memory_stats above.
    # test_cuda_expandable_segments.py does not rerun test_cuda_multigpu.py. This test runs in
    # both modes anyway, because _check_memory_stat_consistency handles is_expandable.
    # ADAPTED: on a virtual card every CPU tensor made inside the card counts as device memory.
    # So the torch.randperm(len(tensors2)) that the generator iterates (35 = 17 + 17 + 1
    # tensors) is drawn before entering. Drawn inside, it would add 512 bytes to the
    # assert_change(0) steps. The card is 8 GiB: the large tensors add up to about 2.7 GB.
    # They are created with torch.empty and never written.
    N = 35
    perm = [int(i) for i in torch.randperm(int(N / 2) + int(N / 2) + 1)]
    gpu = VirtualGPU("8GiB", alloc_conf=_conf(expandable))
    with gpu:
        gpu.empty_cache()
        for _ in _test_memory_stats_generator(gpu, perm, N=N):
            _check_memory_stat_consistency(gpu)


@ports(TEST_MULTIGPU, "TestCudaMultiGPU", "test_mem_get_info")
def test_mem_get_info() -> None:
    # ADAPTED: torch.cuda.mem_get_info(device) is (gpu.free, gpu.capacity). The five device
    # spellings of the original (0, "cuda", "cuda:0", ...) all name the one virtual card. There is
    # no second device.
    gpu = VirtualGPU("1GiB")
    with gpu:
        for _device in (0, torch.device("cuda"), torch.device("cuda:0"), "cuda", "cuda:0"):
            # Prevent PyTorch from reusing the allocated memory
            gpu.empty_cache()
            before_free_bytes, before_available_bytes = gpu.free, gpu.capacity
            # increasing to 8MB to force acquiring a new block and overcome blocksize differences across platforms
            t = torch.randn(1024 * 1024 * 8)  # noqa: F841
            after_free_bytes, after_available_bytes = gpu.free, gpu.capacity

            assert after_free_bytes < before_free_bytes
            assert before_available_bytes == after_available_bytes
            del t


# =========================================================================== not ported

#: PyTorch allocator tests that a CPU virtual card cannot run, with the reason. Each is
#: (test name, reason). Unlisted tests of these files do not test the device allocator
#: (kernels, RNG, autocast, serialization, ...).
NOT_PORTED: list[tuple[str, str]] = [
    # test/test_cuda.py TestCuda
    ("test_caching_allocator_record_stream_oom", "streams and Tensor.record_stream are not modelled"),
    ("test_record_stream", "streams, events and data_ptr reuse across streams are not modelled"),
    ("test_record_stream_on_shifted_view", "streams are not modelled"),
    ("test_caching_pinned_memory", "the pinned host allocator is not the device allocator"),
    ("test_host_memory_stats", "the pinned host allocator's stats (host_memory_stats) are not modelled"),
    ("test_pinned_memory_empty_cache", "the pinned host allocator is not the device allocator"),
    ("test_pinned_memory_with_cudaregister", "the pinned host allocator and cudaHostRegister are not modelled"),
    ("test_memory_stats_of_multiple_generators_and_graphs", "CUDA graphs and graph-safe generator state"),
    ("test_graph_memory_stats_and_use_result_after_destroy_graph", "CUDA graphs and their private pools"),
    ("test_graph_two_successive", "CUDA graphs sharing a private pool"),
    ("test_graph_capture_oom", "CUDA graph capture"),
    ("test_repeat_graph_capture_cublas_workspace_memory", "CUDA graph capture and cudaMemGetInfo of a real process"),
    ("test_cuda_graph_allocator_propagates_stream", "CUDA graphs and streams"),
    ("test_device_memory_used", "NVML's device_memory_used of a real process"),
    # test/test_cuda.py TestCudaMallocAsync
    ("test_memory_snapshot_with_cpp", "C++ stack frames (stacks='all' unwinding) cannot be recorded on a CPU virtual card"),
    ("test_direct_traceback", "C++ traceback gathering (torch._C._profiler.gather_traceback) is not the allocator"),
    ("test_memory_profiler_viz", "the profiler's own memory timeline (profile_plot) does not see the virtual card"),
    ("test_cycles", "reference-cycle observer with C++ frames"),
    ("test_memory_compile_regions", "torch.compile regions (compile_context) need Triton/CUDA"),
    ("test_memory_plots_metadata", "torch.cuda.memory._set_memory_metadata (user_metadata) is not in the VirtualGPU API"),
    ("test_memory_snapshot_script", "TorchScript frames (frames[0]['name'] == 'foo') come from the TorchScript "
                                    "interpreter's call stack, which Python-side recording cannot see"),
    ("test_allocator_backend", "backend:cudaMallocAsync is a different allocator, not modelled"),
    ("test_cachingAllocator_raw_alloc", "raw_alloc/raw_delete and caching_allocator_enable are not in the VirtualGPU API"),
    ("test_notifies_oom", "no OOM-observer API (torch._C._cuda_attach_out_of_memory_observer)"),
    ("test_cpp_memory_snapshot_pickle", "C++ extension API (_memory_snapshot_pickled) and C++/TorchScript frames"),
    # test/test_cuda.py TestBlockStateAbsorption (CUDA graph checkpointing of private pools)
    ("TestBlockStateAbsorption.test_simple", "CUDA graphs and checkpointed private pools"),
    ("TestBlockStateAbsorption.test_allocated_in_middle_of_segment", "CUDA graphs and checkpointed private pools"),
    ("TestBlockStateAbsorption.test_multiple_middle_allocations", "CUDA graphs and checkpointed private pools"),
    ("TestBlockStateAbsorption.test_middle_allocations_contiguous", "CUDA graphs and checkpointed private pools"),
    ("TestBlockStateAbsorption.test_additional_free_following_checkpoint", "CUDA graphs and checkpointed private pools"),
    ("TestBlockStateAbsorption.test_tensor_dies_after_checkpoint", "CUDA graphs and raw_delete"),
    ("TestBlockStateAbsorption.test_assigning_back_deleter_fns_to_tensor", "CUDA graphs and storages rebuilt from data pointers"),
    ("TestBlockStateAbsorption.test_resnet", "CUDA graphs (and torchvision)"),
    ("TestBlockStateAbsorption.test_check_pool_live_allocations", "CUDA graph pools"),
    ("TestBlockStateAbsorption.test_allocate_in_thread_to_pool", "CUDA graph pools and streams"),
    # test/test_cuda.py TestMemPool
    ("test_mempool_id", "MemPool / graph_pool_handle are not modelled"),
    ("test_mempool_empty_cache", "MemPool and use_mem_pool are not modelled"),
    ("test_mempool_empty_cache_inactive", "pluggable allocators (a C++ extension) and MemPool"),
    ("test_mempool_with_allocator", "pluggable allocators and MemPool"),
    ("test_tensor_delete_after_allocator_delete", "pluggable allocators and MemPool"),
    ("test_mempool_limited_memory_with_allocator", "pluggable allocators and use_on_oom MemPools"),
    ("test_mempool_no_split", "MemPool(no_split=True) is not modelled"),
    ("test_deleted_mempool_not_used_on_oom", "use_on_oom MemPools"),
    ("test_mempool_multithread", "MemPool ids"),
    ("test_mempool_emptycache_multithread", "MemPool and threads' pools"),
    ("test_nested_mempool", "nested MemPools"),
    ("test_graph_capture_reclaim_2_streams", "CUDA graph capture across streams"),
    ("test_graph_capture_reclaim_4_streams", "CUDA graph capture across streams"),
    ("test_mempool_expandable", "a pluggable-allocator MemPool beside expandable segments"),
    ("test_mempool_ctx_multithread", "MemPool contexts per thread"),
    # test/test_cuda_multigpu.py TestCudaMultiGPU
    ("test_memory_stats_multigpu", "two devices; one VirtualGPU is active at a time"),
    ("test_cuda_memory_leak_detection", "wrap_with_cuda_memory_check asks the CUDA driver API"),
    ("test_caching_pinned_memory_multi_gpu", "pinned memory, events and two devices"),
]


def test_not_ported_names_are_really_absent() -> None:
    """Keep NOT_PORTED honest. Each name in it appears once, and none is the source of a ported
    test. Every ported test cites a file, class, test and commit, and no source is ported twice."""
    names = [n for n, _ in NOT_PORTED]
    assert len(names) == len(set(names)), [n for n in names if names.count(n) > 1]
    assert all(reason.strip() for _, reason in NOT_PORTED)

    ported_names = {s.test for s in PORTED} | {f"{s.cls}.{s.test}" for s in PORTED}
    assert not ported_names & set(names), sorted(ported_names & set(names))

    assert len(PORTED) == len(set(PORTED)), "a PyTorch test is ported twice"
    for s in PORTED:
        assert s.file in ("test/test_cuda.py", "test/test_cuda_multigpu.py") and s.cls and s.test.startswith("test_")
        assert s.commit.startswith("pytorch/pytorch@") and len(s.commit.split("@")[1]) == 40

    # every test function of this module that carries a source is registered, and the other way round
    module = sys.modules[__name__]
    carried = {fn.torch_source for name, fn in vars(module).items()
               if name.startswith("test_") and hasattr(fn, "torch_source")}
    assert carried == set(PORTED)
