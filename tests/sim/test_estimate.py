"""estimate(): peak and breakdown under FakeTensorMode against the measured peak (VirtualGPU,
MemTracker), the verdict against a device, and no real memory used."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

from vramlab.facts import Method  # noqa: E402
from vramlab.lessons import models  # noqa: E402
from vramlab.sim.estimate import Estimate, estimate  # noqa: E402
from vramlab.sim.measure import measure  # noqa: E402
from vramlab.sim.presets import CUDA_CONTEXT_OVERHEAD, get_preset  # noqa: E402
from vramlab.probes.host import read_host  # noqa: E402
from vramlab.sim.virtual_gpu import CATEGORIES  # noqa: E402

CASES = {
    "mlp": (models.make_mlp(), 64),
    "cnn": (models.make_cnn(), 32),
    "transformer": (models.make_gpt("tiny", seq=128), 4),
}


def memtracker_peak(triple, batch_size: int, optimizer: str, steps: int = 2) -> int:
    """The same steps run for real under torch's MemTracker."""
    from torch.distributed._tools.mem_tracker import MemTracker

    build, make_batch, loss_fn = triple
    torch.manual_seed(0)
    model = build()
    opt = torch.optim.Adam(model.parameters()) if optimizer == "adam" else None
    mt = MemTracker()
    mt.track_external(model, *( [opt] if opt else []))
    with mt:
        for _ in range(steps):
            x, *targets = make_batch(batch_size)
            loss_fn(model(x), *targets).backward()
            if opt is not None:
                opt.step()
                opt.zero_grad()
            del x, targets
            mt.reset_mod_stats()
    return mt.get_tracker_snapshot("peak")[torch.device("cpu")]["Total"]


@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.parametrize("optimizer", [None, "adam"])
@pytest.mark.slow
def test_estimate_equals_the_virtual_gpu_measured_peak_within_1_percent(name, optimizer):
    (build, make_batch, loss_fn), bs = CASES[name]
    est = estimate(build, make_batch, batch_size=bs, optimizer=optimizer, loss_fn=loss_fn)
    real = measure(build, make_batch, batch_size=bs, optimizer=optimizer, loss_fn=loss_fn)
    assert isinstance(est, Estimate)
    assert abs(est.peak - real.peak) <= 0.01 * real.peak
    assert sum(est.breakdown.values()) == est.peak
    assert list(est.breakdown) == list(CATEGORIES)
    for k in CATEGORIES:
        assert abs(est.breakdown[k] - real.breakdown[k]) <= 0.01 * real.peak, k
    assert est.method is Method.ESTIMATED and real.method is Method.MEASURED


@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.slow
def test_estimate_agrees_with_memtracker_within_3_percent(name):
    triple, bs = CASES[name]
    build, make_batch, loss_fn = triple
    est = estimate(build, make_batch, batch_size=bs, optimizer="adam", loss_fn=loss_fn)
    mt = memtracker_peak(triple, bs, "adam")
    assert abs(est.peak - mt) <= 0.03 * mt


def test_training_breakdown_has_every_category_where_expected():
    (build, make_batch, loss_fn), bs = CASES["cnn"]
    est = estimate(build, make_batch, batch_size=256, optimizer="adam", loss_fn=loss_fn)
    params = sum(p.numel() * 4 for p in build().parameters())
    assert est.breakdown["parameters"] == params
    assert est.breakdown["buffers"] > 0, "BatchNorm running statistics"
    assert est.breakdown["activations"] > est.breakdown["parameters"], "a large batch: activations dominate"
    assert est.after >= 3 * params, "parameters and Adam's two moments stay after the step"
    assert est.parameters == params // 4


@pytest.mark.slow
def test_inference_saves_no_activations_and_makes_no_gradients():
    (build, make_batch, loss_fn), bs = CASES["transformer"]
    est = estimate(build, make_batch, batch_size=bs, step="inference")
    real = measure(build, make_batch, batch_size=bs, step="inference")
    assert est.breakdown["activations"] == 0 and est.breakdown["gradients"] == 0
    assert est.peak == real.peak
    train = estimate(build, make_batch, batch_size=bs, loss_fn=loss_fn)
    assert train.peak > est.peak


def test_no_real_memory_is_used_for_a_huge_step():
    # ~1.1B parameters in float32, a step that needs well over 16 GiB
    build = lambda: models.MLP(inputs=4096, width=16384, depth=4)  # noqa: E731
    make_batch = lambda b: (torch.randn(b, 4096), torch.randint(0, 10, (b,)))  # noqa: E731
    before = read_host().process_rss
    est = estimate(build, make_batch, batch_size=512, optimizer="adamw", loss_fn=nn.functional.cross_entropy,
                   device="A100-80GB")
    grown = read_host().process_rss - before
    assert est.peak > 16 * 2**30
    assert grown < 512 * 2**20, "fake tensors hold no data"
    assert est.fits is True and est.device == "A100-80GB"
    small = estimate(build, make_batch, batch_size=512, optimizer="adamw", loss_fn=nn.functional.cross_entropy,
                     device="T4")
    assert small.fits is False and small.headroom < 0
    assert "does NOT fit on T4" in small.text()


def test_verdict_against_sizes_presets_and_the_context():
    (build, make_batch, loss_fn), bs = CASES["mlp"]
    est = estimate(build, make_batch, batch_size=bs, loss_fn=loss_fn)
    assert est.fits is None and est.device is None and est.budget is None
    at = estimate(build, make_batch, batch_size=bs, loss_fn=loss_fn, device=est.peak)
    assert at.fits is True and at.headroom == 0
    below = estimate(build, make_batch, batch_size=bs, loss_fn=loss_fn, device=est.peak - 1)
    assert below.fits is False
    t4 = estimate(build, make_batch, batch_size=bs, loss_fn=loss_fn, device="t4")
    assert t4.device == "T4" and t4.capacity == get_preset("T4").memory
    assert t4.budget == t4.capacity - CUDA_CONTEXT_OVERHEAD
    assert t4.round_blocks and t4.peak % 512 == 0, "CUDA presets count 512-byte blocks"
    assert t4.peak >= est.peak


def test_preset_estimate_matches_the_virtual_gpu_of_that_preset():
    (build, make_batch, loss_fn), bs = CASES["cnn"]
    est = estimate(build, make_batch, batch_size=bs, optimizer="adam", loss_fn=loss_fn, device="T4")
    real = measure(build, make_batch, batch_size=bs, optimizer="adam", loss_fn=loss_fn, device="T4")
    assert abs(est.peak - real.peak) <= 0.01 * real.peak
    assert real.round_blocks and est.fits == real.fits is True


def test_dtype_halves_parameter_bytes():
    (build, make_batch, loss_fn), bs = CASES["mlp"]
    f32 = estimate(build, make_batch, batch_size=bs, loss_fn=loss_fn, step="inference")
    bf16 = estimate(build, make_batch, batch_size=bs, loss_fn=loss_fn, step="inference", dtype=torch.bfloat16)
    assert bf16.breakdown["parameters"] * 2 == f32.breakdown["parameters"]
    assert bf16.dtype == "bfloat16"


def test_optimizer_forms():
    (build, make_batch, loss_fn), bs = CASES["mlp"]
    by_name = estimate(build, make_batch, batch_size=bs, optimizer="adam", loss_fn=loss_fn)
    by_class = estimate(build, make_batch, batch_size=bs, optimizer=torch.optim.Adam, loss_fn=loss_fn)
    by_factory = estimate(build, make_batch, batch_size=bs, optimizer=lambda p: torch.optim.Adam(p), loss_fn=loss_fn)
    assert by_name.peak == by_class.peak == by_factory.peak
    sgd = estimate(build, make_batch, batch_size=bs, optimizer="sgd", loss_fn=loss_fn)
    assert sgd.breakdown["optimizer_state"] == 0 and by_name.breakdown["optimizer_state"] > 0


def test_bad_arguments():
    (build, make_batch, loss_fn), bs = CASES["mlp"]
    with pytest.raises(ValueError):
        estimate(build, make_batch, batch_size=0)
    with pytest.raises(ValueError):
        estimate(build, make_batch, batch_size=1, step="eval")
    with pytest.raises(ValueError, match="known"):
        estimate(build, make_batch, batch_size=1, device="H900")
    with pytest.raises(ValueError):
        estimate(build, make_batch, batch_size=1, optimizer="lion")
    with pytest.raises(TypeError):
        estimate(build, make_batch, batch_size=1, optimizer=torch.optim.SGD(nn.Linear(1, 1).parameters()))
    with pytest.raises(TypeError):
        estimate(lambda: 3, make_batch, batch_size=1)


def test_reports():
    (build, make_batch, loss_fn), bs = CASES["mlp"]
    est = estimate(build, make_batch, batch_size=bs, loss_fn=loss_fn, device="L4")
    assert "fits on L4" in est.text() and "activations" in est.text()
    assert "<table>" in est._repr_html_()
    assert "Estimate" in repr(est)
    assert est._repr_mimebundle_()["text/plain"] == est.text()


def test_tied_weights_stay_tied():
    (build, make_batch, loss_fn), bs = CASES["transformer"]
    real_model = build()
    unique = {id(p): p for p in real_model.parameters()}
    est = estimate(build, make_batch, batch_size=bs, loss_fn=loss_fn, step="inference")
    assert est.parameters == sum(p.numel() for p in unique.values())
    assert est.breakdown["parameters"] == sum(p.nbytes for p in unique.values())


@pytest.fixture
def speak():
    """``speak("pt-BR")`` or ``speak("en")``; the language is detected again after the test."""
    from vramlab.i18n import set_lang

    yield set_lang
    set_lang(None)


def _made_up(**over) -> Estimate:
    GiB = 2**30
    fields = dict(peak=3 * GiB, breakdown={"parameters": GiB, "gradients": GiB // 2, "optimizer_state": GiB,
                                           "activations": GiB // 4, "other": 5},
                  fits=True, device="T4", capacity=16 * GiB, budget=15 * GiB, after=GiB, parameters=1234567,
                  batch_size=8, step="train", steps=2, dtype="bf16", round_blocks=True,
                  method=Method.ESTIMATED, seconds=1.234, notes=("a note",))
    fields.update(over)
    return Estimate(**fields)


def test_the_report_speaks_english_or_portuguese(speak):
    fits = _made_up(model_states={"parameters": 10, "gradients": 20, "optimizer_state": 30}, checkpoint=3,
                    peak_reserved=4 * 2**30)
    short = _made_up(fits=False, peak=20 * 2**30, method=Method.MEASURED, step="inference",
                     strategy="zero1", world_size=4, rank=2)
    speak("en")
    en = fits.text() + "\n" + short.text()
    en_html = fits._repr_html_() + short._repr_html_()
    speak("pt-BR")
    pt = fits.text() + "\n" + short.text()
    pt_html = fits._repr_html_() + short._repr_html_()
    assert en.splitlines()[:2] == [
        "estimated (FakeTensorMode): train step, batch 8, 1,234,567 parameters, bf16",
        "  fits on T4: reserved peak 4.00 GiB of 15.00 GiB usable (11.00 GiB to spare)"]
    assert pt.splitlines()[:2] == [
        "estimativa (FakeTensorMode): passo de treinamento, batch 8, 1,234,567 parâmetros, bf16",
        "  cabe em T4: pico reservado 4.00 GiB de 15.00 GiB utilizáveis (sobram 11.00 GiB)"]
    pairs = [("does NOT fit on T4", "NÃO cabe em T4"), ("(5.00 GiB short)", "(faltam 5.00 GiB)"),
             ("measured (VirtualGPU): inference step", "medição (VirtualGPU): passo de inferência"),
             ("zero1 on 4 ranks, rank 2 (batch per rank)", "zero1 em 4 ranks, rank 2 (batch por rank)"),
             ("optimizer state", "estado do otimizador"), ("activations (saved)", "ativações (guardadas)"),
             ("model states when the step ends", "estados do modelo ao fim do passo"),
             ("reserved by the caching allocator at most", "reservado pelo alocador com cache: no máximo"),
             ("activation checkpointing on 3 modules", "checkpointing de ativações em 3 módulos"),
             ("after the step 1.00 GiB; took 1.23 s", "depois do passo 1.00 GiB; levou 1.23 s"),
             ("note: a note", "nota: a note")]
    for english, portuguese in pairs:
        assert english in en and portuguese in pt, (english, portuguese)
        assert english not in pt, english
    # the breakdown stays a table: the Portuguese labels are padded as the English ones
    for text in (en, pt):
        rows = [line for line in text.splitlines() if line.startswith("    ")]
        assert len(rows) == 12 and {len(line) for line in rows} == {len(rows[0])}
    for english, portuguese in [("at the peak", "no pico"), ("does NOT fit on T4", "NÃO cabe em T4"),
                                ("estimated (FakeTensorMode), train step", "estimativa (FakeTensorMode), passo de treinamento"),
                                ("optimizer state", "estado do otimizador")]:
        assert english in en_html and portuguese in pt_html, (english, portuguese)
        assert english not in pt_html, english


def test_the_verdict_without_a_device_in_portuguese(speak):
    speak("pt-BR")
    assert _made_up(fits=None, device=None, budget=None, capacity=None).verdict() == \
        "pico 3.00 GiB (nenhum dispositivo informado)"
    speak("en")
    assert _made_up(fits=None, device=None, budget=None, capacity=None).verdict() == "peak 3.00 GiB (no device given)"


# --------------------------------------------------------------------------- absurd inputs


def _linear():
    return nn.Linear(8, 4)


def _rows(b):
    return torch.randn(b, 8)


@pytest.mark.parametrize("bad", [0, -1, -(10**6), 2.0, True, "8", None])
def test_a_zero_or_negative_batch_names_the_argument_and_what_is_allowed(bad):
    with pytest.raises(ValueError) as e:
        estimate(_linear, _rows, batch_size=bad)
    msg = str(e.value)
    assert "batch_size" in msg and repr(bad) in msg and "positive integer" in msg


@pytest.mark.parametrize("bad, says", [
    ("-1GiB", "negative device capacity"), ("0GiB", "must be positive"), (0, "must be positive"),
    ("1e400GiB", "not finite"), ("nan", "not finite"), (float("inf"), "not finite"), ("8EiB", "too large"),
])
def test_an_absurd_device_size_says_what_is_wrong_not_unknown_preset(bad, says):
    """Before: "-1GiB" and "nan" were "unknown GPU preset", "1e400GiB" an OverflowError."""
    with pytest.raises(ValueError) as e:
        estimate(_linear, _rows, batch_size=1, device=bad)
    msg = str(e.value)
    assert says in msg and repr(bad) in msg and "known:" not in msg


def test_a_model_without_parameters_and_an_optimizer_is_refused_clearly():
    """Before: torch's bare "optimizer got an empty parameter list"."""
    for build, lacks in ((nn.Sequential, "has no parameters"), (nn.ReLU, "has no parameters"),
                         (lambda: _linear().requires_grad_(False), "has no trainable parameters")):
        with pytest.raises(ValueError) as e:
            estimate(build, _rows, batch_size=2, optimizer="adamw")
        msg = str(e.value)
        assert lacks in msg and "optimizer='adamw'" in msg and "nothing to optimize" in msg
        assert "optimizer=None" in msg  # and what to do instead


def test_a_model_without_parameters_is_estimated_as_its_forward_pass_and_says_so():
    """Before: a training step without an optimizer died in backward ("element 0 of tensors does
    not require grad"). Nothing to backpropagate: the forward pass's activations, with a note."""
    train = estimate(nn.ReLU, _rows, batch_size=16)
    inference = estimate(nn.ReLU, _rows, batch_size=16, step="inference")
    assert train.peak == inference.peak > 0
    assert train.step == "inference" and train.parameters == 0
    assert any("no trainable parameters" in n and "forward" in n for n in train.notes)
    assert not inference.notes  # asked for inference: nothing to explain
    assert "no trainable parameters" in train.text()


def test_a_frozen_model_without_an_optimizer_is_also_its_forward_pass():
    est = estimate(lambda: _linear().requires_grad_(False), _rows, batch_size=4)
    assert est.step == "inference" and est.parameters == 8 * 4 + 4
    assert est.breakdown["gradients"] == 0 and any("no trainable parameters" in n for n in est.notes)


def test_the_forward_pass_note_speaks_portuguese(speak):
    speak("pt-BR")
    est = estimate(nn.ReLU, _rows, batch_size=2)
    assert any("não tem parâmetros treináveis" in n for n in est.notes), est.notes
