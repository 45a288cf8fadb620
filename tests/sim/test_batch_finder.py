"""find_max_batch_size: exact boundary on a step with closed-form memory, trial bound, cleanup, errors."""

from __future__ import annotations

import gc
import math
import weakref

import pytest

torch = pytest.importorskip("torch")

from vramlab.runtime.oom import is_oom  # noqa: E402
from vramlab.sim.batch_finder import BatchSearch, find_max_batch_size  # noqa: E402
from vramlab.sim.virtual_gpu import VirtualGPU, active_virtual_gpu  # noqa: E402

MiB = 2**20


def closed_form_step(b: int) -> None:
    """Holds a fixed 10 MiB and 1 MiB per sample at once: fits 256 MiB iff 10 + b <= 256."""
    fixed = torch.empty(10 * MiB, dtype=torch.uint8)
    per_sample = torch.empty(b * MiB, dtype=torch.uint8)
    del fixed, per_sample


@pytest.mark.slow
def test_closed_form_step_on_256mib_gives_exactly_246():
    r = find_max_batch_size(closed_form_step, device="256MiB")
    assert isinstance(r, BatchSearch)
    assert r.max_batch_size == 246
    assert r.num_trials <= 2 * math.log2(246) + 2
    fits = {t.batch for t in r.trials if t.fits}
    ooms = {t.batch for t in r.trials if not t.fits}
    assert 246 in fits and 247 in ooms, "the boundary itself was tried on both sides"
    for t in r.trials:
        if t.fits:
            assert t.peak == (10 + t.batch) * MiB
    assert not r.capped and r.notes == ()


@pytest.mark.parametrize("capacity_mib,fixed_mib", [(64, 10), (100, 3), (1024, 1), (12, 10)])
@pytest.mark.slow
def test_exact_for_other_sizes_within_the_trial_bound(capacity_mib, fixed_mib):
    def step(b):
        a = torch.empty(fixed_mib * MiB, dtype=torch.uint8)
        c = torch.empty(b * MiB, dtype=torch.uint8)
        del a, c

    r = find_max_batch_size(step, device=VirtualGPU(capacity_mib * MiB, allocator="exact"))
    best = capacity_mib - fixed_mib
    assert r.max_batch_size == best
    assert r.num_trials <= 2 * math.log2(best) + 2


@pytest.mark.parametrize("capacity_mib,fixed_mib,best", [
    (100, 3, 80),  # 3 MiB takes a 20 MiB segment; b > 17 MiB needs its own: 20 + b <= 100
    (1024, 1, 1022),  # 1 MiB sits in a 2 MiB small-pool segment; b MiB >= 10 MiB: 2 + b <= 1024
    (12, 10, 1),  # 10 MiB takes a 10 MiB segment; 1 MiB a 2 MiB small one; 2 MiB would ask 20 MiB
])
@pytest.mark.slow
def test_the_caching_allocators_segments_set_the_limit(capacity_mib, fixed_mib, best):
    """The default virtual GPU has PyTorch's caching allocator: the largest batch is the one
    whose segments (CUDACachingAllocator's get_allocation_size) fit, derived here by hand."""
    def step(b):
        a = torch.empty(fixed_mib * MiB, dtype=torch.uint8)
        c = torch.empty(b * MiB, dtype=torch.uint8)
        del a, c

    r = find_max_batch_size(step, device=capacity_mib * MiB)
    assert r.max_batch_size == best


@pytest.mark.slow
def test_runs_inside_the_active_virtual_gpu_with_what_is_already_there():
    with VirtualGPU("256MiB") as gpu:
        fixed = torch.empty(10 * MiB, dtype=torch.uint8)  # a model that stays between trials
        r = find_max_batch_size(lambda b: torch.empty(b * MiB, dtype=torch.uint8))
        assert active_virtual_gpu() is gpu, "the finder leaves the user's device active"
        assert gpu.allocated == 10 * MiB
    assert r.max_batch_size == 246
    assert r.device.startswith("virtual:0")
    del fixed


@pytest.mark.slow
def test_a_virtual_gpu_instance_is_entered_for_each_trial():
    gpu = VirtualGPU("256MiB")
    r = find_max_batch_size(closed_form_step, device=gpu)
    assert r.max_batch_size == 246
    assert not gpu.active and gpu.allocated == 0
    assert gpu.num_ooms == sum(1 for t in r.trials if not t.fits)


@pytest.mark.slow
def test_start_above_the_maximum_searches_down():
    r = find_max_batch_size(closed_form_step, start=1000, device="256MiB")
    assert r.max_batch_size == 246
    assert r.trials[0].batch == 1000 and not r.trials[0].fits


@pytest.mark.slow
def test_limit_caps_the_search():
    r = find_max_batch_size(closed_form_step, limit=100, device="256MiB")
    assert r.max_batch_size == 100 and r.capped
    assert max(t.batch for t in r.trials) == 100
    r = find_max_batch_size(closed_form_step, limit=247, device="256MiB")
    assert r.max_batch_size == 246 and not r.capped


@pytest.mark.slow
def test_nothing_fits():
    r = find_max_batch_size(closed_form_step, device="8MiB")
    assert r.max_batch_size == 0
    assert r.num_trials == 1 and r.notes


@pytest.mark.slow
def test_a_failed_trials_tensors_are_freed_before_the_next_trial():
    refs: list = []
    seen_alive: list = []

    def step(b):
        seen_alive.append(sum(1 for r in refs if r() is not None))
        fixed = torch.empty(10 * MiB, dtype=torch.uint8)
        refs.append(weakref.ref(fixed))
        per = torch.empty(b * MiB, dtype=torch.uint8)  # the OOM is raised here, with fixed alive
        del per

    r = find_max_batch_size(step, device="256MiB")
    assert r.max_batch_size == 246
    assert seen_alive == [0] * len(seen_alive), "the traceback of an OOM kept a tensor alive"


def test_other_exceptions_are_reraised_unchanged_at_once():
    calls: list[int] = []
    err = KeyError("not memory")

    def step(b):
        calls.append(b)
        if b >= 8:
            raise err

    with pytest.raises(KeyError) as ei:
        find_max_batch_size(step, device="256MiB")
    assert ei.value is err
    assert calls == [1, 2, 4, 8], "no retry after a non-OOM error"
    assert ei.traceback[-1].name == "step", "the traceback reaches the user's code"
    assert active_virtual_gpu() is None
    assert gc.get_freeze_count() == 0, "the collector is unfrozen whatever happens"


@pytest.mark.slow
def test_a_runtime_error_that_says_out_of_memory_is_an_oom():
    def step(b):
        if b > 5:
            raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB.")

    r = find_max_batch_size(step, device="1GiB")
    assert r.max_batch_size == 5
    assert is_oom(torch.OutOfMemoryError("x"))
    assert not is_oom(ValueError("out of memory"))


def test_bad_arguments():
    for bad in (0, -3, 1.5, True):
        with pytest.raises(ValueError):
            find_max_batch_size(closed_form_step, start=bad, device="1GiB")
    with pytest.raises(ValueError):
        find_max_batch_size(closed_form_step, limit=0, device="1GiB")
    with pytest.raises(ValueError):
        find_max_batch_size(closed_form_step, device="lots")
    with pytest.raises(ValueError):
        find_max_batch_size(closed_form_step, device="cpu")


@pytest.mark.skipif(torch.cuda.is_available(), reason="with CUDA, device=None searches on it")
def test_no_device_without_cuda_or_an_active_virtual_gpu():
    with pytest.raises(ValueError, match="no device"):
        find_max_batch_size(closed_form_step)


@pytest.mark.slow
def test_table_text_and_html():
    r = find_max_batch_size(closed_form_step, device="T4", limit=4)
    rows = r.table()
    assert rows[0] == {"batch": 1, "fits": True, "peak": 11 * MiB}
    assert [x["batch"] for x in rows] == [1, 2, 4]
    assert "max batch size 4" in r.text() and "T4" in r.device
    assert "<table>" in r._repr_html_()
    assert r._repr_mimebundle_()["text/plain"] == r.text()


@pytest.mark.slow
def test_a_reused_virtual_card_gives_its_cache_back_between_trials_as_cuda_does():
    """One card for every trial finds what a fresh card per trial finds: a failed trial's cached
    blocks are given back before the next (the finder calls torch.cuda.empty_cache() on CUDA)."""
    from torch import nn

    def step(batch: int) -> None:
        torch.manual_seed(0)
        emb, head = nn.Embedding(20000, 256), nn.Linear(256, 10)  # 120 MiB fixed with Adam's moments
        opt = torch.optim.Adam([*emb.parameters(), *head.parameters()])
        tokens, labels = torch.randint(0, 20000, (batch, 64)), torch.randint(0, 10, (batch * 64,))
        nn.functional.cross_entropy(head(torch.relu(emb(tokens))).flatten(0, 1), labels).backward()
        opt.step()

    fresh = find_max_batch_size(step, start=512, device="512MiB")
    card = VirtualGPU("512MiB")
    reused = find_max_batch_size(step, start=512, device=card)
    assert reused.max_batch_size == fresh.max_batch_size, (reused.max_batch_size, fresh.max_batch_size)
    assert card.reserved == 0  # nothing left cached after the search


def test_the_table_speaks_english_or_portuguese():
    from vramlab.i18n import set_lang
    from vramlab.sim.batch_finder import BatchSearch, Trial

    r = BatchSearch(8, (Trial(1, True, 100), Trial(16, False, None), Trial(8, True, 2**20)), "cpu", limit=8,
                    capped=True, notes=("batch size 1 did not fit",))
    try:
        set_lang("en")
        en, en_html = r.text(), r._repr_html_()
        set_lang("pt-BR")
        pt, pt_html = r.text(), r._repr_html_()
    finally:
        set_lang(None)
    assert en.splitlines()[:2] == ["max batch size 8 (stopped at the limit) on cpu, 3 trials",
                                   "    #    batch  fits          peak"]
    assert pt.splitlines()[:2] == ["tamanho máximo do batch 8 (parou no limite) em cpu, 3 tentativas",
                                   "    #    batch  cabe          pico"]
    assert "  2       16  OOM            n/a" in en and "  2       16  OOM            n/d" in pt
    assert " yes " in en and " sim " in pt and " yes " not in pt
    assert "note:" in en and "nota:" in pt
    assert "max batch size <b>8</b>" in en_html and "tamanho máximo do batch <b>8</b>" in pt_html
    assert "<th>fits</th>" in en_html and "<th>cabe</th>" in pt_html and "trials" not in pt_html


# --------------------------------------------------------------------------- absurd inputs


@pytest.mark.slow
def test_a_step_that_never_runs_out_of_memory_stops_at_the_default_limit_and_says_so():
    """Before: with limit=None it doubled for ever (10,888 trials in 15 s, memory growing)."""
    from vramlab.sim.batch_finder import DEFAULT_LIMIT

    seen: list[int] = []
    r = find_max_batch_size(seen.append, device="1GiB")  # allocates nothing, whatever the batch
    assert DEFAULT_LIMIT == 2**20
    assert r.max_batch_size == DEFAULT_LIMIT == r.limit and r.capped
    assert r.num_trials == 21 and seen == [2**k for k in range(21)]
    assert all(t.fits for t in r.trials)
    assert len(r.notes) == 1 and "default limit" in r.notes[0] and "limit=" in r.notes[0]
    assert str(DEFAULT_LIMIT) in r.notes[0]
    assert "default limit" in r.text() and "(stopped at the limit)" in r.text()


@pytest.mark.slow
def test_the_default_limit_is_not_a_note_when_the_step_runs_out_of_memory_or_a_limit_is_given():
    r = find_max_batch_size(closed_form_step, device="256MiB")
    assert r.max_batch_size == 246 and not r.capped and r.notes == () and r.limit == 2**20
    r = find_max_batch_size(lambda b: None, device="1GiB", limit=100)
    assert r.capped and r.max_batch_size == 100 and r.limit == 100 and r.notes == ()


@pytest.mark.slow
def test_a_start_above_the_default_limit_is_tried_and_is_the_limit():
    r = find_max_batch_size(lambda b: None, device="1GiB", start=3 * 2**20)
    assert [t.batch for t in r.trials] == [3 * 2**20] and r.capped and r.limit == 3 * 2**20
    assert "default limit of 3145728" in r.notes[0]


@pytest.mark.parametrize("kw, names", [
    (dict(start=0), "start"), (dict(start=-1), "start"), (dict(start=2**63), "start"),
    (dict(limit=0), "limit"), (dict(limit=-5), "limit"), (dict(limit=2**63), "limit"), (dict(limit=1.5), "limit"),
])
def test_absurd_start_and_limit_name_the_argument_and_the_range(kw, names):
    with pytest.raises(ValueError) as e:
        find_max_batch_size(closed_form_step, device="1GiB", **kw)
    msg = str(e.value)
    assert msg.startswith(f"{names} must be an integer from 1 to 2**63 - 1") and repr(kw[names]) in msg


@pytest.mark.parametrize("bad, says", [("-1GiB", "negative capacity"), ("1e400GiB", "not finite"),
                                       ("nan", "not finite"), (0, "must be positive")])
def test_an_absurd_device_size_is_refused_before_any_trial(bad, says):
    calls: list[int] = []
    with pytest.raises(ValueError, match=says):
        find_max_batch_size(calls.append, device=bad)
    assert calls == [] and gc.get_freeze_count() == 0


@pytest.mark.slow
def test_the_default_limit_note_speaks_portuguese():
    from vramlab.i18n import set_lang

    try:
        set_lang("pt-BR")
        r = find_max_batch_size(lambda b: None, device="1GiB", start=2**20)
    finally:
        set_lang(None)
    assert r.notes == ("parou no limite padrão de 1048576: todo batch tentado coube, então talvez o passo não "
                       "cresça com o tamanho do batch; passe limit= para buscar além dele (por exemplo, "
                       "limit=16777216)",)


@pytest.mark.slow
def test_the_table_renders_in_a_notebook_and_stays_a_list_of_rows():
    r = find_max_batch_size(closed_form_step, device="T4", limit=4)
    rows = r.table()
    assert isinstance(rows, list) and rows == [{"batch": b, "fits": True, "peak": rows[i]["peak"]}
                                               for i, b in enumerate((1, 2, 4))]
    html_table = rows._repr_html_()
    assert html_table.count("<tr>") == 4 and "<th>batch</th>" in html_table
    assert str(rows).splitlines()[1].split()[:3] == ["1", "1", "yes"]


@pytest.mark.slow
def test_progress_is_a_line_per_trial_on_stderr_when_asked(capsys):
    r = find_max_batch_size(closed_form_step, device="T4", limit=8, progress=True)
    err = capsys.readouterr().err.splitlines()
    assert len(err) == r.num_trials + 1
    assert err[0].startswith("[vramlab] trial 1: batch 1 fits")
    assert err[-1] == f"[vramlab] max batch size {r.max_batch_size} after {r.num_trials} trials"


@pytest.mark.slow
def test_no_progress_when_not_asked_and_not_on_a_terminal(capsys):
    find_max_batch_size(closed_form_step, device="T4", limit=8)
    assert capsys.readouterr().err == ""
    find_max_batch_size(closed_form_step, device="T4", limit=8, progress=False)
    assert capsys.readouterr().err == ""
