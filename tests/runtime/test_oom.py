import sys

import pytest

from vramlab.display.words import advice_text
from vramlab.facts import Advice, AdviceKind
from vramlab.runtime.oom import drop_traceback, explain_oom, free_last_error, is_oom, parse_oom_message

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
    assert ex.suggestions[0].kind is AdviceKind.FRAGMENTED and ex.suggestions[0].cached == int(2.5 * GiB)
    assert "empty_cache() does not help" in advice_text(ex.suggestions[0])  # it cannot: the lesson says so too
    assert "not usable for this request" in ex.text() and "fragmentation is the cause" in ex.text()


def test_fragmentation_is_not_the_cause_when_free_and_cache_fall_short():
    import torch

    msg = CUDA_MSG.replace("1.75 GiB is reserved", "256.00 MiB is reserved")
    ex = explain_oom(torch.OutOfMemoryError(msg))
    assert not ex.fragmentation_is_cause and ex.shortfall == 512 * MiB
    assert AdviceKind.FRAGMENTED not in [a.kind for a in ex.suggestions]


def _record(peak_delta: int, held: int | None = None, error: str | None = "OutOfMemoryError", key: str | None = None,
            batch: int | None = None):
    """A cell record on cuda:0 from an allocation of 0 at the cell's start: its peak, and what it
    still held at its end (by default the peak: the traceback keeps the failed step's tensors)."""
    from vramlab.model import CellRecord, DeviceDelta, HostDelta

    host = HostDelta(rss_start=0, rss_end=0, rss_delta=0, peak=None, peak_delta=None, swap_delta=None, peak_exact=False)
    dev = DeviceDelta(id="cuda:0", allocated_start=0, allocated_delta=peak_delta if held is None else held,
                      peak_allocated=peak_delta, peak_allocated_delta=peak_delta, reserved_delta=0, nvml_delta=None)
    return CellRecord(execution_count=1, started=0.0, wall_s=0.1, error=error, host=host, devices=(dev,),
                      cell_key=key, batch_size=batch)


def test_batch_size_suggestion_uses_the_cells_measured_growth():
    """With the cell's record: it wanted at least what it allocated plus the request, and had at
    most that plus what was free; bs * budget / need is an upper bound, and said to be one."""
    import torch

    ns = {"batch_size": 64}
    ex = explain_oom(torch.OutOfMemoryError(CUDA_MSG), ns, _record(2 * GiB))
    # wanted >= 2 GiB + 2 GiB (the request); 2 GiB + 1.5 GiB free (the fragmented cache is not usable): 64 * 3.5 / 4
    assert ex.batch_size == 64 and ex.batch_upper_bound == 56 and ex.batch_basis == "this cell"
    assert ex.fitting_batch_size is None, "no batch is known to fit from a failed run alone"
    assert ex.suggestions[1] == Advice(AdviceKind.BATCH_THIS_CELL, batch=64, upper=56, need=4 * GiB,
                                       budget=int(3.5 * GiB))
    assert "batch size 64 -> at most 56, an upper bound from this cell alone" in advice_text(ex.suggestions[1])
    assert "%vram free" in ex.text()


def test_without_the_cells_record_only_halving_is_advised():
    """The failed request alone says nothing of the rest of the step: no batch is derived."""
    import torch

    msg = CUDA_MSG.replace("1.50 GiB is free", "256.00 MiB is free").replace("1.75 GiB is reserved", "0 bytes is reserved")
    ex = explain_oom(torch.OutOfMemoryError(msg), {"bs": 64})
    assert ex.batch_size == 64 and ex.fitting_batch_size is None and ex.batch_basis == "halving"
    assert ex.suggestions[0] == Advice(AdviceKind.BATCH_HALVING, batch=64, to=32)
    text = advice_text(ex.suggestions[0])
    assert text.startswith("batch size 64 -> try 32") and "only halving" in text and "not checked" in text


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
        assert ex.fitting_batch_size is None and ex.batch_upper_bound is not None
        assert limit <= ex.batch_upper_bound < b


def _oom_message(request: int, held: int, budget: int) -> str:
    """CUDA's message for a card with ``budget`` bytes, nothing cached, ``held`` allocated."""
    return (f"CUDA out of memory. Tried to allocate {request} bytes. GPU 0 has a total capacity of {budget} bytes of "
            f"which {budget - held} bytes is free. Of the allocated memory {held} bytes is allocated by PyTorch, "
            "and 0 bytes is reserved by PyTorch but unallocated.")


@pytest.mark.parametrize("fixed_opt,fixed_fwd,per_sample,layers", [
    (120 * MiB, 60 * MiB, 128 * 1024, 4),  # the optimizer step makes a small batch's peak
    (8 * MiB, 8 * MiB, 200 * 1024, 8),  # activations make every peak
    (0, 0, 256 * 1024, 2),  # nothing fixed: the whole peak grows with the batch
    (300 * MiB, 290 * MiB, 96 * 1024, 3),  # weights and optimizer state take most of the card
])
def test_two_runs_suggest_a_batch_that_fits_for_steps_with_a_fixed_part(fixed_opt, fixed_fwd, per_sample, layers):
    """A step that holds ``max(fixed_opt, fixed_fwd + per_sample * b)`` bytes at its peak (the
    optimizer step, or the backward pass with the activations allocated layer by layer), on a
    512 MiB card: from a run that fits and one that fails, the suggested batch never passes the
    true limit, and the upper bound never falls below it."""
    import torch

    budget, seen, bs = 512 * MiB, 512, 4096

    def peak(b: int) -> int:
        return max(fixed_opt, fixed_fwd + per_sample * b)

    assert peak(seen) <= budget < peak(bs)
    limit = max(b for b in range(1, bs) if peak(b) <= budget)
    chunk = per_sample * bs // layers
    held = fixed_fwd + chunk * ((budget - fixed_fwd) // chunk)  # the layers that fitted; the next one failed
    key = "same-cell"
    ok = _record(peak(seen), held=0, error=None, key=key, batch=seen)
    failed = _record(held, key=key, batch=bs)
    ex = explain_oom(torch.OutOfMemoryError(_oom_message(chunk, held, budget)), {"batch_size": bs}, failed,
                     history=[ok, failed])
    assert ex.batch_basis == "two runs" and ex.batch_seen == seen
    assert ex.fitting_batch_size is not None and ex.batch_upper_bound is not None
    assert ex.fitting_batch_size == seen <= limit <= ex.batch_upper_bound < bs, "the batch advised is the one that ran"
    assert ex.batch_estimate is not None and seen <= ex.batch_estimate <= ex.batch_upper_bound
    advice = ex.suggestions[0]
    assert advice.kind is AdviceKind.BATCH_TWO_RUNS and (advice.batch, advice.to, advice.upper) == \
        (bs, seen, ex.batch_upper_bound)
    assert advice_text(advice).startswith(f"batch size {bs} -> {seen} fits: this cell ran at batch {seen}")


def test_runs_of_another_cell_or_that_failed_are_not_used():
    import torch

    budget, held, request = 512 * MiB, 500 * MiB, 64 * MiB
    msg = _oom_message(request, held, budget)
    failed = _record(held, key="this", batch=4096)
    for other in (_record(60 * MiB, held=0, error=None, key="another", batch=512),  # another cell
                  _record(60 * MiB, held=0, error="ValueError", key="this", batch=512),  # it raised
                  _record(60 * MiB, held=0, error=None, key="this", batch=8192),  # a larger batch
                  _record(60 * MiB, held=0, error=None, key=None, batch=512)):  # not identified
        ex = explain_oom(torch.OutOfMemoryError(msg), {"batch_size": 4096}, failed, history=[other, failed])
        assert ex.batch_basis == "this cell" and ex.suggestions[0].kind is AdviceKind.BATCH_THIS_CELL


def test_no_batch_is_derived_when_the_device_has_less_room_than_the_run_that_fitted():
    """The run at 512 peaked above what the device now gives the cell: a smaller batch would need
    a lower bound of the slope below 512, which the two runs do not give; the advice falls back."""
    import torch

    budget, held = 512 * MiB, 100 * MiB
    ok = _record(450 * MiB, held=0, error=None, key="k", batch=512)
    failed = _record(held, key="k", batch=4096)
    msg = _oom_message(64 * MiB, held, budget).replace(f"of which {budget - held} bytes", f"of which {200 * MiB} bytes")
    ex = explain_oom(torch.OutOfMemoryError(msg), {"batch_size": 4096}, failed, history=[ok, failed])
    assert ex.batch_basis == "this cell"


# ---------------------------------------------------------------- on the virtual GPU


@pytest.fixture
def free_heap_after():
    """After the test, give the C heap's free pages back: the steps' freed tensors would otherwise
    serve the next tests' new pages, and those tests read new pages in the RSS."""
    yield
    from vramlab.lessons.ramplan import release_free_heap

    release_free_heap()


def _embedding_step(vocab: int, seq: int):
    """A training step: a token embedding and a linear head (the fixed part: weights, their dense
    gradients and Adam's two moments, made in the step) and per-sample activations (``seq`` tokens
    of 256 floats each)."""
    import torch
    from torch import nn

    def step(batch: int) -> None:
        torch.manual_seed(0)
        emb, head = nn.Embedding(vocab, 256), nn.Linear(256, 10)
        opt = torch.optim.Adam([*emb.parameters(), *head.parameters()])
        tokens, labels = torch.randint(0, vocab, (batch, seq)), torch.randint(0, 10, (batch * seq,))
        logits = head(torch.relu(emb(tokens))).flatten(0, 1)
        nn.functional.cross_entropy(logits, labels).backward()
        opt.step()

    return step


@pytest.mark.parametrize("allocator,vocab,capacity", [
    ("caching", 20000, "512MiB"),  # 120 MiB fixed: at batch 512 the optimizer step makes the peak
    ("exact", 2000, "384MiB"),  # a small fixed part: activations make the peaks
])
@pytest.mark.slow
def test_on_the_virtual_gpu_the_advised_batch_runs_and_the_bound_holds(allocator, vocab, capacity, free_heap_after):
    """Batch 512 fits, 4096 raises torch.OutOfMemoryError; from their records the explainer
    advises a batch that runs on the same card (the one that ran), and its upper bound is at
    least the largest batch that fits (find_max_batch_size on a fresh card)."""
    import gc

    import torch

    from vramlab.runtime.cells import cell_key
    from vramlab.runtime.records import Recorder
    from vramlab.sim import VirtualGPU, find_max_batch_size

    step = _embedding_step(vocab, seq=64)
    key = cell_key("batch_size = 512\nstep(batch_size)\n")
    assert key == cell_key("batch_size = 4096  # again\nstep(batch_size)\n")
    rec = Recorder()
    gpu = VirtualGPU(capacity, allocator=allocator)
    error = None
    with gpu:
        token = rec.begin(1)
        step(512)
        ok = rec.end(token, None, cell_key=key, batch_size=512)
        token = rec.begin(2)
        try:
            step(4096)
        except torch.OutOfMemoryError as e:
            error = e
        assert error is not None, "4096 fitted: the card is too large for this test"
        failed = rec.end(token, error, cell_key=key, batch_size=4096)
        ex = explain_oom(error, {"batch_size": 4096}, failed, history=tuple(rec.history))
        alone = explain_oom(error, {"batch_size": 4096}, failed, history=())
        unmeasured = explain_oom(error, {"batch_size": 4096})
        # what %vram free does on a CUDA card: drop the traceback, collect, give the cache back
        drop_traceback(error)
        del error
        gc.collect()
        gpu.empty_cache()
        fit = ex.fitting_batch_size
        assert ex.batch_basis == "two runs" and fit is not None and ok.devices[0].peak_allocated_delta
        assert "this cell ran at batch 512" in ex.text()
        step(fit)  # no OutOfMemoryError: it fits on the same card
    largest = find_max_batch_size(step, start=fit,
                                  device=capacity if allocator == "caching" else VirtualGPU(capacity, allocator="exact"))
    assert fit == 512 <= largest.max_batch_size <= ex.batch_upper_bound < 4096
    assert alone.batch_basis == "this cell" and "an upper bound from this cell alone" in alone.text()
    assert alone.fitting_batch_size is None and alone.batch_upper_bound >= largest.max_batch_size
    assert unmeasured.batch_basis == "halving" and "batch size 4096 -> try 2048" in unmeasured.text()
    assert "only halving can be advised" in unmeasured.text()


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


@pytest.mark.slow
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


@pytest.mark.slow
def test_free_last_error_gives_an_active_virtual_gpus_cache_back():
    """%vram free on the virtual card does what it does on a card: the cached blocks go back."""
    torch = pytest.importorskip("torch")
    from vramlab.sim import VirtualGPU

    with VirtualGPU("64MiB") as gpu:
        t = torch.empty(8 * MiB, dtype=torch.uint8)
        del t
        assert gpu.reserved > 0 and gpu.allocated == 0  # freed, still cached
        free_last_error()
        assert gpu.reserved == 0
    outside = VirtualGPU("64MiB")  # not active: not registered, so untouched
    with outside:
        kept = torch.empty(8 * MiB, dtype=torch.uint8)
    del kept
    reserved = outside.reserved
    free_last_error()
    assert outside.reserved == reserved


@pytest.fixture
def speak():
    """``speak("pt-BR")`` or ``speak("en")``; the language is detected again after the test."""
    from vramlab.i18n import set_lang

    yield set_lang
    set_lang(None)


def test_the_explanation_speaks_english_or_portuguese_in_text_and_html(speak):
    from vramlab.display.html import oom_html

    def explain() -> tuple[str, str]:  # the advice is written when the error is explained, in that language
        ex = explain_oom(RuntimeError(CUDA_MSG), {"batch_size": 64}, history=[])
        assert ex._repr_mimebundle_()["text/html"] == oom_html(ex)
        return ex.text(), oom_html(ex)

    speak("en")
    en_text, en_html = explain()
    speak("pt-BR")
    pt_text, pt_html = explain()
    pairs = [("[vramlab] out of memory", "[vramlab] falta de memória"), ("requested", "pedido"),
             ("free on the device", "livre no dispositivo"), ("fragmentation is the cause", "a causa é a fragmentação"),
             ("what to try, most effective first", "o que tentar, do mais eficaz para o menos"),
             ("try 32, a first guess that vramlab has not checked", "tente 32, um primeiro palpite que o vramlab não verificou"), ("mixed precision", "precisão mista"),
             ("then run %vram free", "depois rode %vram free")]
    for english, portuguese in pairs:
        for en, pt in ((en_text, pt_text), (en_html, pt_html)):
            assert english in en and portuguese in pt, (english, portuguese)
            assert english not in pt, english
    # figures, units and identifiers are not translated
    for kept in ("2.00 GiB", "expandable_segments:True", "torch.cuda.empty_cache()", "%vram free"):
        assert kept in pt_text and kept in pt_html
    assert pt_html.startswith('<pre class="vramlab-oom"')


def test_what_free_dropped_is_named_in_the_notebooks_language(speak):
    def fail():
        raise KeyError("x")

    for code, word in (("en", "frames of KeyError"), ("pt-BR", "frames de KeyError")):
        speak(code)
        try:
            fail()
        except KeyError as e:
            assert drop_traceback(e) == [word]
