"""vramlab.lessons.anatomy: the phases of a training step, split by part, on the virtual GPU."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

import vramlab  # noqa: E402
from vramlab.lessons.anatomy import PARTS, storage_bytes, trace_step  # noqa: E402
from vramlab.sim.virtual_gpu import active_virtual_gpu  # noqa: E402


@pytest.fixture(autouse=True)
def _no_leftover_gpu():
    yield
    gpu = active_virtual_gpu()
    if gpu is not None:
        gpu.__exit__(None, None, None)


def setup(round_blocks=False, allocator="exact"):
    """Exact accounting by default: bytes per parameter are the tensors' own."""
    torch.manual_seed(0)
    dev = vramlab.pick_device(virtual="1GiB", force_virtual=True, round_blocks=round_blocks, allocator=allocator)
    model = dev.put(nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 10)))
    n = sum(p.numel() for p in model.parameters())
    make_batch = lambda: (torch.randn(64, 256), torch.randint(0, 10, (64,)))  # noqa: E731
    return dev, model, n, make_batch


def test_storage_bytes_counts_shared_storage_once_and_rounds():
    a = torch.empty(100)
    assert storage_bytes([a, a[10:], None, 3]) == 400
    assert storage_bytes([a], round_blocks=True) == 512


@pytest.mark.parametrize("round_blocks,allocator", [(False, "exact"), (True, "exact"), (True, "caching")])
@pytest.mark.slow
def test_parts_add_up_to_allocated(round_blocks, allocator):
    dev, model, n, make_batch = setup(round_blocks, allocator)
    opt = torch.optim.Adam(model.parameters())
    an = trace_step(dev, model, make_batch, opt, steps=2)
    names = [(p.step, p.name) for p in an.phases]
    assert names[0] == (0, "model") and names[1:5] == [(1, "forward"), (1, "backward"), (1, "optimizer step"),
                                                        (1, "zero_grad")]
    for p in an.phases:
        assert sum(p.parts[k] for k in PARTS) == p.allocated
        assert p.peak >= p.allocated
    assert an.parameters == n == an.trainable


def test_fp32_adam_is_16_bytes_per_parameter_and_phases_behave():
    dev, model, n, make_batch = setup()
    an = trace_step(dev, model, make_batch, torch.optim.Adam(model.parameters()), steps=2)
    bpp = an.bytes_per_parameter()
    assert bpp["weights"] == pytest.approx(4) and bpp["gradients"] == pytest.approx(4)
    assert bpp["optimizer_state"] == pytest.approx(8, rel=0.01)  # two moments (+ a scalar step each)
    fwd, bwd = an.phase("forward", 2), an.phase("backward", 2)
    assert fwd.parts["activations"] > 0 and fwd.parts["gradients"] == 0
    assert bwd.parts["gradients"] == 4 * n
    assert bwd.parts["activations"] < fwd.parts["activations"]  # backward frees what forward saved
    zero = an.phase("zero_grad", 2)
    assert zero.parts["gradients"] == 0 and zero.parts["activations"] == 0
    assert an.phase("optimizer step", 1).parts["optimizer_state"] > 0 == an.phase("forward", 1).parts["optimizer_state"]
    assert an.peak == max(p.peak for p in an.phases)
    assert "optimizer step" in an.text() and len(an.table()) == len(an.phases)


def test_sgd_without_optimizer_and_autocast():
    dev, model, n, make_batch = setup()
    an = trace_step(dev, model, make_batch, None, steps=1)
    assert an.phase("backward").parts["gradients"] == 4 * n
    an2 = trace_step(dev, model, make_batch, torch.optim.SGD(model.parameters(), lr=0.1), steps=1,
                     autocast_dtype=torch.bfloat16)
    assert an2.phase("forward").parts["activations"] > 0
    with pytest.raises(KeyError):
        an.phase("optimizer step")
    with pytest.raises(ValueError):
        trace_step(dev, model, make_batch, None, steps=0)


def test_plot_draws():
    pytest.importorskip("matplotlib")
    import matplotlib

    matplotlib.use("Agg")
    dev, model, n, make_batch = setup()
    ax = trace_step(dev, model, make_batch, torch.optim.Adam(model.parameters()), steps=1).plot()
    assert ax.get_ylabel() == "MiB on the device"


def test_text_speaks_the_notebooks_language_and_stays_aligned(lang_back):
    dev, model, n, make_batch = setup()
    an = trace_step(dev, model, make_batch, torch.optim.Adam(model.parameters()), steps=1)
    lang_back("en")
    en = an.text().splitlines()
    assert en[0] == f"training-step anatomy on {an.device}: {n:,} parameters ({n:,} trainable)"
    assert en[1] == ("  step  phase                parameters       gradients optimizer_state     activations"
                     "   allocated        peak")
    assert [line[8:23].rstrip() for line in en[2:]] == ["model", "forward", "backward", "optimizer step", "zero_grad"]
    lang_back("pt-BR")  # needs the catalog with vramlab/lessons' strings
    pt = an.text().splitlines()
    assert pt[0].startswith("anatomia do passo de treinamento em ") and "parâmetros" in pt[0]
    for word in ("passo", "fase", "parâmetros", "gradientes", "est. otimizador", "ativações", "alocada", "pico"):
        assert word in pt[1]
    assert "allocated" not in pt[1] and "phase" not in pt[1]
    assert "passo do otimizador" in pt[5] and "optimizer step" not in "\n".join(pt)
    assert len({len(line) for line in pt[1:]}) == 1  # the columns widen together: still aligned
    assert an.phase("optimizer step").name == "optimizer step"  # the data stays English


def test_plot_speaks_the_notebooks_language(lang_back):
    pytest.importorskip("matplotlib")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    dev, model, n, make_batch = setup()
    an = trace_step(dev, model, make_batch, torch.optim.Adam(model.parameters()), steps=1)
    lang_back("en")
    ax = an.plot()
    assert ax.get_legend_handles_labels()[1] == ["peak during the phase", "parameters", "gradients",
                                                 "optimizer state", "activations"]
    assert [t.get_text() for t in ax.get_xticklabels()][:4] == ["model", "1: forward", "1: backward",
                                                                "1: optimizer step"]
    plt.close(ax.figure)
    lang_back("pt-BR")  # needs the catalog with vramlab/lessons' strings
    ax = an.plot()
    assert ax.get_ylabel() == "MiB no dispositivo"
    assert ax.get_legend_handles_labels()[1] == ["pico durante a fase", "parâmetros", "gradientes",
                                                 "estado do otimizador", "ativações"]
    assert [t.get_text() for t in ax.get_xticklabels()][:4] == ["modelo", "1: forward", "1: backward",
                                                                "1: passo do otimizador"]
    plt.close(ax.figure)
