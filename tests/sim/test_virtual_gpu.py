"""VirtualGPU: exact storage accounting, capacity and OOMs, breakdown, nesting, threads, snapshot."""

from __future__ import annotations

import gc
import threading

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

import vramlab  # noqa: E402
from vramlab.units import parse_size  # noqa: E402
from vramlab.sim.presets import CUDA_CONTEXT_OVERHEAD, get_preset  # noqa: E402
from vramlab.sim.virtual_gpu import CATEGORIES, VirtualGPU, active_virtual_gpu  # noqa: E402


def ExactGPU(*args, **kw) -> VirtualGPU:
    """This module tests the exact accounting (each storage's bytes, nothing cached); the
    caching allocator, the default, has its own module (test_virtual_gpu_caching.py)."""
    return VirtualGPU(*args, allocator="exact", **kw)

MiB = 2**20


@pytest.fixture(autouse=True)
def _no_leftover_gpu():
    yield
    gpu = active_virtual_gpu()
    if gpu is not None:  # a failed test must not leave one active for the next
        gpu.__exit__(None, None, None)
    assert active_virtual_gpu() is None


# ------------------------------------------------------------------ exact bytes


def test_new_tensors_count_their_exact_nbytes():
    with ExactGPU("1GiB") as gpu:
        a = torch.empty(1000)
        assert gpu.allocated == 4000
        b = torch.zeros(10, 10, dtype=torch.float16)
        assert gpu.allocated == 4000 + 200
        c = torch.ones(3, dtype=torch.int64)
        assert gpu.allocated == 4000 + 200 + 24
        d = torch.tensor([1.0, 2.0, 3.0])  # built outside the dispatcher, then lift_fresh
        assert gpu.allocated == 4000 + 200 + 24 + 12
    del a, b, c, d


def test_views_share_one_storage_and_count_once():
    with ExactGPU("1GiB") as gpu:
        a = torch.empty(100, 10)
        views = [a[10:], a.view(1000), a.t(), a[:, ::2], a.expand(2, 100, 10), a.reshape(10, 100),
                 a.unsqueeze(0), a.as_strided((5,), (1,)), a.detach(), *a.split(10)]
        assert gpu.allocated == 4000
        del a
        assert gpu.allocated == 4000, "views keep the storage alive"
        del views
        gc.collect()
        assert gpu.allocated == 0


def test_in_place_operations_allocate_nothing():
    with ExactGPU("1GiB") as gpu:
        a = torch.zeros(256)
        a.add_(1).mul_(2).clamp_(max=1.5)
        a[3:7] = 9.0
        a.copy_(torch.ones(256))  # the ones() is a temporary, freed at once
        assert gpu.allocated == 1024
        assert gpu.peak == 2048


def test_out_of_place_results_and_temporaries():
    with ExactGPU("1GiB") as gpu:
        a = torch.ones(1024)
        b = (a * 2 + 1).sum()  # two 4 KiB temporaries, freed as soon as used
        assert gpu.allocated == 4096 + 4
        assert gpu.peak == 4096 * 3
        del b


def test_tensor_resize_grows_the_storage_in_place():
    with ExactGPU("1GiB") as gpu:
        t = torch.empty(0)
        assert gpu.allocated == 0
        t.resize_(250)
        assert gpu.allocated == 1000
        t.resize_(10)  # resize_ never shrinks a storage
        assert gpu.allocated == 1000
        t.resize_(1000)
        assert gpu.allocated == 4000


def test_untyped_storage_resize_updates_the_books():
    with ExactGPU("1GiB") as gpu:
        t = torch.empty(10)
        t.untyped_storage().resize_(400)
        assert gpu.allocated == 400
        t.untyped_storage().resize_(0)  # as FSDP frees a flat parameter
        assert gpu.allocated == 0
    assert torch.UntypedStorage.resize_ is not None and "vramlab" not in repr(torch.UntypedStorage.resize_)


def test_out_argument_that_grows_is_counted():
    with ExactGPU("1GiB") as gpu:
        out = torch.empty(0)
        torch.add(torch.ones(100), 1, out=out)
        assert gpu.allocated == 400


def test_frees_inside_and_outside_the_context():
    with ExactGPU("1GiB") as gpu:
        a = torch.empty(1000)
        b = torch.empty(500)
        del a
        assert gpu.allocated == 2000
    assert gpu.allocated == 2000
    c = torch.empty(10_000)  # created after exit: not counted
    assert gpu.allocated == 2000
    del b
    assert gpu.allocated == 0, "a tensor freed after exit still leaves the books"
    assert gpu.peak == 6000
    del c


def test_tensors_from_before_are_not_counted_unless_adopted():
    before = torch.empty(1000)
    with ExactGPU("1GiB") as gpu:
        v = before[1:]
        before.add_(1)
        assert gpu.allocated == 0
        assert gpu.adopt(before) == 4000
        assert gpu.adopt(v) == 0, "same storage"
        assert gpu.allocated == 4000
    del before, v
    assert gpu.allocated == 0


def test_adopt_module_optimizer_and_iterables():
    model = nn.Sequential(nn.Linear(10, 20), nn.BatchNorm1d(20), nn.Linear(20, 2))
    opt = torch.optim.Adam(model.parameters())
    model(torch.randn(4, 10)).sum().backward()
    opt.step()
    params = sum(p.nbytes for p in model.parameters())
    buffers = sum(b.untyped_storage().nbytes() for b in model.buffers())
    grads = sum(p.grad.nbytes for p in model.parameters())
    state = sum(v.untyped_storage().nbytes() for s in opt.state.values() for v in s.values())
    x = torch.empty(7)
    with ExactGPU("1GiB") as gpu:
        added = gpu.adopt([model, opt, {"x": x}])
        bd = gpu.breakdown()
    assert added == params + buffers + grads + state + 28
    assert bd["parameters"] == params
    assert bd["buffers"] == buffers
    assert bd["gradients"] == grads
    assert bd["optimizer_state"] == state
    assert bd["other"] == 28


def test_tied_weights_count_once():
    emb = nn.Embedding(100, 8)
    head = nn.Linear(8, 100, bias=False)
    head.weight = emb.weight
    with ExactGPU("1GiB") as gpu:
        gpu.adopt(nn.ModuleList([emb, head]))
    assert gpu.allocated == 100 * 8 * 4


def test_adopt_rejects_what_it_cannot_count():
    with ExactGPU("1GiB") as gpu:
        with pytest.raises(TypeError):
            gpu.adopt(3.5)
        with pytest.raises(TypeError):
            gpu.adopt("weights")


def test_block_rounding_models_the_cuda_allocator():
    with ExactGPU("1GiB", round_blocks=True) as gpu:
        a = torch.empty(1, dtype=torch.uint8)
        assert gpu.allocated == 512
        b = torch.empty(513, dtype=torch.uint8)
        assert gpu.allocated == 512 + 1024
        c = torch.empty(0)
        assert gpu.allocated == 512 + 1024, "an empty tensor allocates nothing"
        d = torch.empty(256)  # exactly 1024 bytes
        assert gpu.allocated == 512 + 1024 + 1024
        c.resize_(1)
        assert gpu.allocated == 512 + 1024 + 1024 + 512
    del a, b, c, d
    assert gpu.allocated == 0


# ------------------------------------------------------------------ capacity and OOM


def test_allocation_up_to_capacity_fits_and_one_byte_more_raises():
    with ExactGPU(MiB) as gpu:
        a = torch.empty(MiB, dtype=torch.uint8)
        assert gpu.allocated == MiB and gpu.free == 0
        with pytest.raises(torch.OutOfMemoryError):
            torch.empty(1, dtype=torch.uint8)
        assert gpu.allocated == MiB
        assert gpu.num_ooms == 1
    del a


@pytest.mark.slow
def test_oom_leaves_nothing_counted():
    with ExactGPU(10 * MiB) as gpu:
        keep = torch.empty(MiB // 4)  # 1 MiB
        for _ in range(3):
            with pytest.raises(torch.OutOfMemoryError):
                torch.empty(10 * MiB // 4)
        assert gpu.allocated == MiB
        assert gpu.peak == MiB, "a refused allocation is not a peak"
        x = torch.empty(5 * MiB // 4)  # what is left is usable
        assert gpu.allocated == 6 * MiB
    gc.collect()
    del keep, x
    assert gpu.allocated == 0
    assert gpu.num_ooms == 3


def test_multi_output_op_that_overflows_counts_none_of_its_outputs():
    x = torch.randn(1000)
    with ExactGPU(4000 + 4000 + 100) as gpu:  # room for the values, not the int64 indices
        gpu.adopt(x)
        with pytest.raises(torch.OutOfMemoryError) as ei:
            torch.sort(x)
        assert gpu.allocated == 4000
    msg = str(ei.value)
    assert "Tried to allocate 7.81 KiB" in msg  # the int64 indices: 8000 bytes
    assert "of which 100 bytes is free" in msg, "the values were allocated when the indices failed"


def test_resize_that_overflows_leaves_the_tensor_as_it_was():
    with ExactGPU(1000) as gpu:
        t = torch.empty(10)
        with pytest.raises(torch.OutOfMemoryError):
            t.resize_(1000)
        assert t.shape == (10,) and t.untyped_storage().nbytes() == 40
        with pytest.raises(torch.OutOfMemoryError):
            t.untyped_storage().resize_(2000)
        assert gpu.allocated == 40 and t.untyped_storage().nbytes() == 40


def test_adopt_is_all_or_nothing():
    big = [torch.empty(100) for _ in range(5)]  # 5 x 400 bytes
    with ExactGPU(1000) as gpu:
        with pytest.raises(torch.OutOfMemoryError):
            gpu.adopt(big)
        assert gpu.allocated == 0
        gpu.adopt(big[:2])
        assert gpu.allocated == 800


def test_oom_message_has_cuda_shape_and_real_figures():
    with ExactGPU("16MiB", name="tiny"):
        keep = torch.empty(MiB)  # 4 MiB
        with pytest.raises(torch.OutOfMemoryError) as ei:
            torch.empty(4 * MiB)  # 16 MiB
    e = ei.value
    msg = str(e)
    assert isinstance(e, RuntimeError) and len(e.args) == 1
    assert msg.startswith("CUDA out of memory. Tried to allocate 16.00 MiB. ")
    assert "GPU 0 has a total capacity of 16.00 MiB of which 12.00 MiB is free." in msg
    assert "4.00 MiB is allocated by PyTorch" in msg
    assert "virtual GPU 'tiny'" in msg
    del keep


def test_accelerate_and_lightning_detectors_see_a_real_oom():
    with ExactGPU(1000):
        with pytest.raises(torch.OutOfMemoryError) as ei:
            torch.empty(1000)
    e = ei.value
    # Lightning (lightning.pytorch.utilities.memory.is_cuda_out_of_memory), its documented test:
    assert isinstance(e, RuntimeError) and len(e.args) == 1 and "CUDA" in e.args[0] and "out of memory" in e.args[0]
    try:
        from accelerate.utils.memory import should_reduce_batch_size
    except Exception:  # accelerate is optional; its documented test, the same statement:
        assert " out of memory." in e.args[0]
    else:
        assert should_reduce_batch_size(e)


def test_oom_explainer_reads_the_figures():
    oom = pytest.importorskip("vramlab.runtime.oom")
    with ExactGPU("8MiB") as gpu:
        keep = torch.empty(MiB // 2)
        with pytest.raises(torch.OutOfMemoryError) as ei:
            torch.empty(2 * MiB)
    assert oom.is_oom(ei.value)
    f = oom.parse_oom_message(str(ei.value))
    assert f["requested"] == 8 * MiB
    assert f["total"] == 8 * MiB
    assert f["free"] == 8 * MiB - 2 * MiB
    assert gpu.allocated == 2 * MiB
    del keep


@pytest.mark.parametrize("bad", [0, -1, "0GiB", "-5MiB", "lots", "", True, 1.5, None, "H900"])
def test_bad_capacity_is_a_value_error(bad):
    with pytest.raises(ValueError):
        ExactGPU(bad)


def test_capacity_forms_and_presets():
    assert ExactGPU(1234).capacity == 1234
    assert ExactGPU("16GiB").capacity == 16 * 2**30
    assert ExactGPU("1.5 GB").capacity == 1_500_000_000
    t4 = ExactGPU("t4")
    assert t4.capacity == get_preset("T4").memory and t4.name == "T4" and t4.preset == "T4"
    assert t4.context_overhead == CUDA_CONTEXT_OVERHEAD
    assert t4.budget == t4.capacity - CUDA_CONTEXT_OVERHEAD
    assert ExactGPU("a100_80gb").name == "A100-80GB"
    assert ExactGPU("16GiB").context_overhead == 0
    assert ExactGPU("T4", context_overhead=0).budget == parse_size("15360MiB")  # the total a T4 reports
    assert t4.budget == get_preset("T4").usable


def test_preset_context_overhead_is_not_available_to_tensors():
    with ExactGPU(10 * MiB, context_overhead=4 * MiB) as gpu:
        with pytest.raises(torch.OutOfMemoryError) as ei:
            torch.empty(7 * MiB // 4)
        ok = torch.empty(6 * MiB // 4)
        assert gpu.free == 0
    assert "this process has 4.00 MiB memory in use" in str(ei.value)
    del ok


# ------------------------------------------------------------------ breakdown


class _Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(64, 256)
        self.bn = nn.BatchNorm1d(256)
        self.fc2 = nn.Linear(256, 10)

    def forward(self, x):
        return self.fc2(torch.relu(self.bn(self.fc1(x))))


def test_breakdown_categories_on_a_training_step():
    torch.manual_seed(0)
    with ExactGPU("1GiB") as gpu:
        model = _Net()
        opt = torch.optim.Adam(model.parameters())
        # a batch large enough that activations, not the optimizer step, make the peak
        x, y = torch.randn(512, 64), torch.randint(0, 10, (512,))
        for _ in range(2):
            loss = nn.functional.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad()
        now, peak = gpu.breakdown(), gpu.breakdown("peak")
    params = sum(p.nbytes for p in model.parameters())
    buffers = sum(b.untyped_storage().nbytes() for b in model.buffers())
    state = sum(v.untyped_storage().nbytes() for s in opt.state.values() for v in s.values())
    assert list(now) == list(CATEGORIES)
    assert sum(now.values()) == gpu.allocated and sum(peak.values()) == gpu.peak
    assert now["parameters"] == params
    assert now["buffers"] == buffers
    assert now["optimizer_state"] == state
    assert state >= 2 * params, "Adam keeps two moments per parameter"
    assert now["gradients"] == 0, "zero_grad() sets them to None"
    assert now["activations"] == 0, "backward released everything it saved"
    assert now["other"] == x.nbytes + y.nbytes + loss.nbytes  # the last loss is still referenced
    assert peak["activations"] > 0
    assert peak["parameters"] == params


def test_gradients_and_activations_while_they_live():
    with ExactGPU("1GiB") as gpu:
        model = _Net()
        x = torch.randn(32, 64)
        out = model(x)
        mid = gpu.breakdown()
        # fc1 saves x, bn saves its input, relu saves its output, fc2 saves the relu output
        assert mid["activations"] >= x.nbytes + 2 * 32 * 256 * 4
        out.sum().backward()
        after = gpu.breakdown()
    assert after["gradients"] == sum(p.nbytes for p in model.parameters())
    assert after["activations"] == 0


def test_reset_peak():
    with ExactGPU("1GiB") as gpu:
        a = torch.empty(1000)
        del a
        assert gpu.peak == 4000
        gpu.reset_peak()
        assert gpu.peak == 0 and gpu.breakdown("peak") == dict.fromkeys(CATEGORIES, 0)
        b = torch.empty(10)
        assert gpu.peak == 40
    del b
    with pytest.raises(ValueError):
        gpu.breakdown("max")


def test_peak_agrees_with_memtracker_on_a_training_step():
    from torch.distributed._tools.mem_tracker import MemTracker

    def run(model, opt, x, y, between=lambda: None):
        for _ in range(2):
            nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
            opt.zero_grad()
            between()

    torch.manual_seed(0)
    model, x, y = _Net(), torch.randn(16, 64), torch.randint(0, 10, (16,))
    opt = torch.optim.Adam(model.parameters())
    with ExactGPU("1GiB") as gpu:
        gpu.adopt([model, opt, x, y])
        run(model, opt, x, y)
    torch.manual_seed(0)
    model, x, y = _Net(), torch.randn(16, 64), torch.randint(0, 10, (16,))
    opt = torch.optim.Adam(model.parameters())
    mt = MemTracker()
    mt.track_external(model, opt, x, y)
    with mt:
        run(model, opt, x, y, mt.reset_mod_stats)
    mt_peak = mt.get_tracker_snapshot("peak")[torch.device("cpu")]["Total"]
    assert gpu.peak == mt_peak, "both count every storage's nbytes after each operator"


# ------------------------------------------------------------------ nesting, threads, lifecycle


def test_nesting_raises_and_leaves_the_outer_one_working():
    with ExactGPU("1GiB") as outer:
        with pytest.raises(ValueError, match="do not nest"):
            with ExactGPU("2GiB"):
                pass
        with pytest.raises(ValueError, match="already active"):
            outer.__enter__()
        assert active_virtual_gpu() is outer
        a = torch.empty(10)
        assert outer.allocated == 40
    assert active_virtual_gpu() is None
    del a


def test_reentering_after_exit_resumes_the_books():
    gpu = ExactGPU("1GiB")
    with gpu:
        a = torch.empty(10)
    with gpu:
        b = torch.empty(20)
        assert gpu.allocated == 120
    del a, b
    assert gpu.allocated == 0


def test_exit_on_error_restores_everything():
    orig = torch.UntypedStorage.resize_
    with pytest.raises(KeyError):
        with ExactGPU("1GiB"):
            raise KeyError("x")
    assert active_virtual_gpu() is None
    assert torch.UntypedStorage.resize_ is orig
    from torch.utils._python_dispatch import _get_current_dispatch_mode

    assert _get_current_dispatch_mode() is None


def test_other_threads_are_not_counted_but_their_frees_are():
    made: list = []
    with ExactGPU("1GiB") as gpu:
        mine = torch.empty(100)
        t = threading.Thread(target=lambda: made.append(torch.empty(1000)))
        t.start()
        t.join()
        assert gpu.allocated == 400, "another thread's tensors are its own"
        box = [mine]
        del mine
        t = threading.Thread(target=box.clear)
        t.start()
        t.join()
        assert gpu.allocated == 0, "a counted tensor freed by another thread leaves the books"


def test_active_virtual_gpu():
    assert active_virtual_gpu() is None
    with ExactGPU("1GiB") as gpu:
        assert active_virtual_gpu() is gpu and gpu.active
    assert active_virtual_gpu() is None and not gpu.active


# ------------------------------------------------------------------ snapshot


def test_snapshot_shows_virtual_0_while_active_and_not_after():
    with ExactGPU("T4") as gpu:
        keep = torch.empty(MiB)
        snap = vramlab.snapshot()
        d = snap.device("virtual:0")
        assert d.kind == "virtual" and d.name == "T4" and d.source == "virtual"
        assert d.total == get_preset("T4").memory
        assert d.torch_allocated == gpu.allocated == 4 * MiB
        assert d.used == 4 * MiB + CUDA_CONTEXT_OVERHEAD
        assert d.layer("tensors") == 4 * MiB
        assert d.layer("context") == CUDA_CONTEXT_OVERHEAD
        assert sum(n for _, n in d.layers) == d.total
        assert d.torch_peak_allocated == gpu.peak
        assert d.num_ooms == 0
    snap = vramlab.snapshot()
    assert all(x.id != "virtual:0" for x in snap.devices)
    del keep


def test_snapshot_counts_ooms():
    with ExactGPU(1000):
        with pytest.raises(torch.OutOfMemoryError):
            torch.empty(1000)
        assert vramlab.snapshot().device("virtual:0").num_ooms == 1


# ------------------------------------------------------------------ absurd capacities


@pytest.mark.parametrize("bad, says", [
    ("-1GiB", "negative capacity"),
    ("-5MiB", "negative capacity"),
    (-1, "negative capacity"),
    ("0", "must be positive"),
    (0, "must be positive"),
    ("1e-400GiB", "must be positive"),
    ("1e400GiB", "not finite"),
    ("nan", "not finite"),
    ("inf", "not finite"),
    (float("nan"), "not finite"),
    (float("inf"), "not finite"),
    ("8EiB", "too large"),
    (10**30, "too large"),
    ("16GiBs", "unknown unit"),
])
def test_an_absurd_capacity_says_what_is_wrong_not_unknown_preset(bad, says):
    """Before: "-1GiB" and "nan" were reported as unknown GPU presets, "1e400GiB" made a card of
    10**279 bytes."""
    with pytest.raises(ValueError) as e:
        ExactGPU(bad)
    msg = str(e.value)
    assert says in msg and "capacity" in msg and repr(bad) in msg
    assert "preset" not in msg.split(";")[0]  # the reason first; no list of presets
    assert "known:" not in msg


def test_a_name_that_is_not_a_size_still_lists_the_presets():
    with pytest.raises(ValueError, match="neither a size .* nor a GPU preset.*known: T4"):
        ExactGPU("H900")
    assert ExactGPU("4060 Laptop").preset == "RTX 4060 Laptop"  # a preset that starts with a digit


def test_pick_device_refuses_an_absurd_virtual_capacity_as_the_virtual_gpu_does():
    from vramlab.lessons.device import pick_device

    for bad, says in (("-1GiB", "negative capacity"), ("1e400GiB", "not finite"), ("nan", "not finite")):
        with pytest.raises(ValueError, match=says):
            pick_device(bad, force_virtual=True)
