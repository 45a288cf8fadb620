"""The virtual card decides before the host pays.

- every allocation is sized on the meta device and asked of the card before the CPU allocates:
  a refused one leaves the host's RSS as it was (measured around it);
- a request larger than this machine is a CUDA out-of-memory error, not a CPU one;
- ``values=False``: a card larger than the host runs a whole step, shapes and memory only,
  with the peak ``estimate()`` gives; a read of a value says plainly that none was computed;
- ``values=True`` on a card larger than the host: what the host cannot pay is refused
  (``HostMemoryError``) instead of the operating system killing the process;
- a resize holds old and new memory at once, as CUDA's does, and the peak shows it.
"""

from __future__ import annotations

import gc
import os

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

from vramlab.sim.virtual_gpu import (  # noqa: E402
    HostMemoryError,
    ValuesNotComputedError,
    VirtualGPU,
    host_margin,
)

MiB = 2**20
GiB = 2**30
_PAGE = os.sysconf("SC_PAGE_SIZE")
#: what a refused request may still cost the host: Python objects, the exception and its
#: message, the meta stand-ins; the requests refused below are 256 MiB or more
RSS_BOUND = 8 * MiB


pytestmark = pytest.mark.usefixtures("no_leftover_gpu")


def rss() -> int:
    """This process's resident set, in bytes (``/proc/self/statm``)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * _PAGE


def peak_rss_since(fn) -> int:
    """How far the process's resident set rose above where it was while ``fn`` ran, in bytes:
    the peak (``VmHWM``, reset first through ``/proc/self/clear_refs``), so that memory the CPU
    allocated and gave back before the error counts too. Skips where the peak cannot be reset."""
    from vramlab.probes.host import read_host, reset_peak_rss

    gc.collect()
    if not reset_peak_rss():
        pytest.skip("the peak RSS cannot be reset here (no /proc/self/clear_refs)")
    r0 = read_host(children=False).process_rss
    fn()
    return read_host(children=False).process_peak - r0


def refused(fn, gpu: VirtualGPU) -> tuple[int, str]:
    """Run ``fn`` on ``gpu`` expecting the card's OOM; (the peak RSS's rise in bytes, the message).
    The same refusal runs once before it is measured: the first meta run of an operator loads
    torch's meta registrations (tens of MiB, once per process), which is not the allocation."""
    with pytest.raises(torch.OutOfMemoryError):
        fn()
    before_ooms = gpu.num_ooms
    msg = []

    def attempt() -> None:
        with pytest.raises(torch.OutOfMemoryError) as ei:
            fn()
        msg.append(str(ei.value))

    grew = peak_rss_since(attempt)
    assert gpu.num_ooms == before_ooms + 1
    return grew, msg[0]


# Each case: (name, prepare inputs (fits), the allocation that does not fit). Inputs are made
# before RSS is read, so that only the refused allocation is measured.
CASES = [
    ("empty", lambda: None, lambda _: torch.empty(512 * MiB, dtype=torch.uint8)),
    ("ones", lambda: None, lambda _: torch.ones(128 * MiB)),
    ("randn", lambda: None, lambda _: torch.randn(128 * MiB)),
    ("zeros with device=", lambda: None, lambda _: torch.zeros(128 * MiB, device="cpu")),
    ("full", lambda: None, lambda _: torch.full((128 * MiB,), 2.0)),
    ("arange", lambda: None, lambda _: torch.arange(64 * MiB, dtype=torch.float64)),
    ("empty_like", lambda: torch.empty(16 * MiB), lambda x: torch.empty_like(x.expand(32, 16 * MiB))),
    (".to()", lambda: torch.ones(32 * MiB), lambda x: x.to(torch.float64).to(torch.complex128)),
    ("resize_", lambda: torch.ones(10), lambda x: x.resize_(128 * MiB)),
    ("storage resize_", lambda: torch.ones(10), lambda x: x.untyped_storage().resize_(512 * MiB)),
    ("view then contiguous", lambda: torch.ones(16 * MiB), lambda x: x.expand(16, 16 * MiB).contiguous()),
    ("matmul output", lambda: (torch.ones(16384, 1), torch.ones(1, 16384)), lambda xy: xy[0] @ xy[1]),
    ("cat output", lambda: torch.ones(16 * MiB), lambda x: torch.cat([x] * 16)),
    ("out= that grows", lambda: (torch.ones(128 * MiB // 4), torch.empty(0)),
     lambda xy: torch.mul(xy[0].expand(4, 128 * MiB // 4), 2, out=xy[1])),
]


@pytest.mark.parametrize("allocator", ["caching", "exact"])
@pytest.mark.parametrize("name,prepare,alloc", CASES, ids=[c[0] for c in CASES])
@pytest.mark.slow
def test_a_refused_allocation_leaves_the_host_as_it_was(allocator, name, prepare, alloc):
    with VirtualGPU("256MiB", allocator=allocator) as gpu:
        inputs = prepare()
        alloc_before = gpu.allocated
        grew, msg = refused(lambda: alloc(inputs), gpu)
        assert "CUDA out of memory. Tried to allocate" in msg
        assert grew < RSS_BOUND, f"{name}: the host grew by {grew / MiB:.1f} MiB for a refused allocation"
        assert gpu.allocated == alloc_before, "nothing of the refused operator is counted"


@pytest.mark.slow
def test_a_request_larger_than_the_host_is_a_cuda_oom_counted_by_the_card():
    # test_cuda.py TestCuda.test_out_of_memory asks for 800000000 GiB: the card refuses it
    with VirtualGPU("A100-80GB") as gpu:
        grew, msg = refused(lambda: torch.empty(1024 * 1024 * 1024 * 800000000, dtype=torch.int8), gpu)
        assert "Tried to allocate 800000000.00 GiB" in msg
        assert gpu.num_ooms == 2
        assert gpu.memory_stats()["num_ooms"] == 2
        assert grew < RSS_BOUND


def test_a_request_of_an_exabyte_or_more_is_refused_as_torch_refuses_it():
    # NativeCachingAllocator::allocate: TORCH_CHECK_WITH(OutOfMemoryError, size < one_exa_bytes, ...),
    # before the allocator: no OOM is counted
    for allocator in ("caching", "exact"):
        with VirtualGPU("A100-80GB", allocator=allocator) as gpu:
            with pytest.raises(torch.OutOfMemoryError, match="more than 1EB"):
                torch.empty(2**60, dtype=torch.int8)
            assert gpu.num_ooms == 0


def test_an_operator_the_meta_device_cannot_size_is_counted_after_it_runs():
    with VirtualGPU("1GiB") as gpu:
        x = torch.tensor([0, 1, 1, 0, 1])
        nz = torch.nonzero(x)  # data-dependent shape: no meta kernel
        assert gpu.is_tracked(nz)
        assert any("nonzero" in op for op in gpu.ledger.checked_after)


def test_the_same_step_gives_the_same_books_as_before_deciding_first():
    """Deciding first takes the same blocks in the same order: a model's step on the caching
    allocator gives identical allocator statistics whether or not the meta run happens."""
    def step():
        torch.manual_seed(0)
        m = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.Flatten(), nn.Linear(8 * 30 * 30, 10))
        opt = torch.optim.AdamW(m.parameters())
        for _ in range(2):
            loss = nn.functional.cross_entropy(m(torch.randn(16, 3, 32, 32)), torch.randint(0, 10, (16,)))
            loss.backward()
            opt.step()
            opt.zero_grad()

    stats = []
    for first in (True, False):
        gpu = VirtualGPU("T4")
        if not first:  # the books alone, as they were kept before: allocate after the operator runs
            gpu.ledger.host_guard = None
            gpu.ledger.budget = None
            gpu.ledger._decide_first = lambda *a, **k: None  # type: ignore[method-assign]
        with gpu:
            step()
        st = gpu.memory_stats()
        stats.append({k: v for k, v in st.items() if "bytes" in k or k.startswith("num_")})
        stats[-1]["peak"] = gpu.peak
    assert stats[0] == stats[1]


# ------------------------------------------------------------------ resize: old and new at once


@pytest.mark.parametrize("allocator", ["caching", "exact"])
def test_a_storage_resize_holds_old_and_new_at_its_peak(allocator):
    with VirtualGPU("1GiB", allocator=allocator) as gpu:
        t = torch.empty(12 * MiB, dtype=torch.uint8)
        gpu.reset_peak()
        t.untyped_storage().resize_(30 * MiB)
        assert gpu.peak == 42 * MiB  # torch's resize_bytes_cuda: allocate 30, copy, free 12
        assert gpu.allocated == 30 * MiB
        if allocator == "caching":
            assert gpu.memory_stats()["allocated_bytes.all.peak"] == gpu.peak
        u = torch.empty(12 * MiB, dtype=torch.uint8)
        gpu.reset_peak()
        u.resize_(120 * MiB)
        assert gpu.peak == 30 * MiB + 12 * MiB + 120 * MiB
        assert gpu.allocated == 30 * MiB + 120 * MiB
        if allocator == "caching":
            assert gpu.memory_stats()["allocated_bytes.all.peak"] == gpu.peak
        del t, u


# ------------------------------------------------------------------ values=False: bigger than the host


def _mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(4096, 16384), nn.GELU(), nn.Linear(16384, 4096))


def _batch(bs: int) -> torch.Tensor:
    return torch.randn(bs, 4096)


@pytest.mark.slow
def test_a_40GB_step_runs_on_a_virtual_A100_with_the_peak_estimate_gives():
    from vramlab import estimate

    bs = 200_000
    gpu = VirtualGPU("A100-80GB", values=False)

    def step() -> None:
        with gpu:
            m = _mlp()
            opt = torch.optim.AdamW(m.parameters())
            for _ in range(2):
                loss = m(_batch(bs)).sum()
                loss.backward()
                opt.step()
                opt.zero_grad()
                del loss

    grew = peak_rss_since(step)
    assert gpu.peak > 40 * 10**9, "the step's tensors total more than 40 GB at its peak"
    e = estimate(_mlp, _batch, batch_size=bs, optimizer="adamw", device="A100-80GB")
    assert gpu.peak == e.peak
    assert gpu.max_reserved == e.peak_reserved
    assert grew < 256 * MiB, f"the host grew by {grew / MiB:.0f} MiB for a {gpu.peak / GiB:.1f} GiB step"


def test_reading_a_value_that_was_never_computed_says_so():
    with VirtualGPU("A100-80GB", values=False) as gpu:
        x = torch.randn(10)
        with pytest.raises(ValuesNotComputedError, match="values=False"):
            x.sum().item()
        with pytest.raises(ValuesNotComputedError):
            float(x.max())
        with pytest.raises(ValuesNotComputedError):
            torch.nonzero(x > 0)
        assert gpu.is_tracked(x)


def test_values_false_counts_an_adopted_real_model():
    m = nn.Linear(1024, 1024)
    with VirtualGPU("T4", values=False) as gpu:
        added = gpu.adopt(m)
        assert added >= 1024 * 1024 * 4
        assert gpu.breakdown()["parameters"] == added


def test_values_must_be_a_bool():
    with pytest.raises(ValueError, match="values must be True"):
        VirtualGPU("T4", values="no")  # type: ignore[arg-type]


# ------------------------------------------------------------------ values=True: the host guard


def test_what_the_card_holds_but_the_host_cannot_pay_is_refused_before_it_is_allocated():
    gpu = VirtualGPU("A100-80GB")
    gpu.ledger.host_guard.read = lambda: (3 * GiB, 16 * GiB)  # 3 GiB available, 1 GiB of it kept free
    with gpu:
        with pytest.raises(HostMemoryError) as ei:
            torch.empty(3 * GiB, dtype=torch.uint8)
        assert gpu.num_ooms == 0, "the card had room: not a device OOM"
        assert gpu.allocated == 0, "the card's block went back (to its cache, as any freed block)"
        assert ei.value.margin == host_margin(16 * GiB)
        assert "values=False" in str(ei.value)
        small = torch.empty(64 * MiB, dtype=torch.uint8)  # what the host can pay still runs
        assert gpu.allocated == 64 * MiB
        del small


@pytest.mark.slow
def test_the_real_host_guard_refuses_more_than_this_machine_has():
    from vramlab.probes.host import read_host

    h = read_host(children=False)
    ask = h.available + 2 * GiB
    if ask > 70 * GiB:
        pytest.skip("this machine has more RAM than a virtual A100 can show the guard with")
    with VirtualGPU("A100-80GB") as gpu:
        def attempt() -> None:
            with pytest.raises(HostMemoryError):
                torch.empty(ask, dtype=torch.uint8)

        assert peak_rss_since(attempt) < RSS_BOUND
        assert gpu.num_ooms == 0


# ------------------------------------------------------------------ memory fraction


@pytest.mark.parametrize("allocator", ["caching", "exact"])
def test_a_memory_fraction_limits_the_card_as_torch_does(allocator):
    with VirtualGPU("1GiB", allocator=allocator) as gpu:
        assert gpu.get_per_process_memory_fraction() == 1.0
        t = torch.empty(600 * MiB, dtype=torch.uint8)
        del t
        gpu.empty_cache()
        gpu.set_per_process_memory_fraction(0.5)
        assert gpu.get_per_process_memory_fraction() == 0.5
        with pytest.raises(torch.OutOfMemoryError, match="512.00 MiB allowed;"):
            torch.empty(600 * MiB, dtype=torch.uint8)
        gpu.set_per_process_memory_fraction(1.0)
        t = torch.empty(600 * MiB, dtype=torch.uint8)
        del t


def test_a_memory_fraction_is_validated_as_torch_validates_it():
    gpu = VirtualGPU("1GiB")
    with pytest.raises(TypeError, match="must be `float`"):
        gpu.set_per_process_memory_fraction(1)  # type: ignore[arg-type]
    for bad in (-0.1, 1.1):
        with pytest.raises(ValueError, match="Allowed range"):
            gpu.set_per_process_memory_fraction(bad)


def test_torch_cuda_names_read_the_card():
    with VirtualGPU("1GiB") as gpu:
        t = torch.empty(3 * MiB, dtype=torch.uint8)
        assert gpu.memory_allocated() == gpu.allocated == 3 * MiB
        assert gpu.memory_reserved() == gpu.reserved == 20 * MiB
        del t
        assert gpu.max_memory_allocated() == 3 * MiB
        gpu.reset_peak_memory_stats()
        assert gpu.max_memory_allocated() == 0
        assert gpu.max_memory_reserved() == 20 * MiB


# ------------------------------------------------------------------ find_max_batch_size on a card larger than the host


def _mlp_step(bs: int) -> None:
    m = _mlp()
    opt = torch.optim.AdamW(m.parameters())
    for _ in range(2):
        loss = m(_batch(bs)).sum()
        loss.backward()
        opt.step()
        opt.zero_grad()


@pytest.mark.slow
def test_find_max_batch_size_on_a_virtual_A100_gives_the_batch_estimate_gives():
    from vramlab import estimate, find_max_batch_size

    search = find_max_batch_size(_mlp_step, device="A100-80GB", values=False)
    b = search.max_batch_size
    assert any(t.batch == b + 1 and not t.fits for t in search.trials), "the boundary was tried on both sides"
    fits = estimate(_mlp, _batch, batch_size=b, optimizer="adamw", device="A100-80GB")
    over = estimate(_mlp, _batch, batch_size=b + 1, optimizer="adamw", device="A100-80GB")
    assert fits.fits is True and over.fits is False
    assert max(t.peak for t in search.trials if t.batch == b) == fits.peak
    assert b * 4096 * 4 > 5 * GiB, "the batch alone is larger than a laptop's spare RAM"


@pytest.mark.slow
def test_find_max_batch_size_chooses_values_false_for_a_card_larger_than_the_host():
    from vramlab import find_max_batch_size
    from vramlab.probes.host import read_host

    h = read_host(children=False)
    card = VirtualGPU("A100-80GB")
    if card.budget <= h.available - host_margin(h.limit):
        pytest.skip("this machine holds a whole A100-80GB: real values would be chosen")
    search = find_max_batch_size(lambda bs: torch.empty(bs * GiB, dtype=torch.uint8), device="A100-80GB")
    # 79.5 GiB of budget: 79 one-GiB blocks (a segment each) fit, 80 do not
    assert search.max_batch_size == card.budget // GiB
    assert any("values=False" in n for n in search.notes)

    def reads(bs: int) -> None:
        torch.ones(bs).sum().item()

    with pytest.raises(ValuesNotComputedError):
        find_max_batch_size(reads, device="A100-80GB")
