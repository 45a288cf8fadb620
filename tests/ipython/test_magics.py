import json

import pytest
from IPython.core.error import UsageError
from IPython.utils.capture import capture_output


def test_load_registers_and_vram_displays_both_mimetypes(ip):
    ip.run_line_magic("load_ext", "vramlab")
    assert "vram" in ip.magics_manager.magics["line"]
    with capture_output() as cap:
        ip.run_line_magic("vram", "")
    assert len(cap.outputs) == 1
    data = cap.outputs[0].data
    assert "text/plain" in data and "text/html" in data
    plain, html = data["text/plain"], data["text/html"]
    assert "host" in plain and "this process" in plain and "available" in plain
    assert "iB" in plain  # figures with units
    assert "vramlab-bar" in html and "this process" in html


def test_json_prints_the_dict(ip):
    ip.run_line_magic("load_ext", "vramlab")
    with capture_output() as cap:
        ip.run_line_magic("vram", "--json")
    d = json.loads(cap.stdout)
    assert d["host"]["total"] > 0 and isinstance(d["devices"], list)


def test_show_subcommand_is_the_default(ip):
    ip.run_line_magic("load_ext", "vramlab")
    with capture_output() as cap:
        ip.run_line_magic("vram", "show --json")
    assert json.loads(cap.stdout)["host"]["limit"] > 0


@pytest.mark.parametrize("line,needle", [
    ("bogus", "unknown subcommand 'bogus'"),
    ("--nope", "unrecognized arguments: --nope"),
    ("show extra", "takes no arguments"),
    # an option of another subcommand is an error, never silently ignored
    ("--json watch", "--json goes with %vram show, not %vram watch"),
    ("--uss history", "--uss goes with %vram show and %vram auto and %%vram"),
    ("--last 3", "--last goes with %vram history and %vram plot, not %vram show"),
    ("--samples history", "--samples goes with %vram export"),
    ("--keep-peaks show", "--keep-peaks goes with %vram auto and %%vram"),
    ("--interval 1 stop", "--interval goes with %vram watch, not %vram stop"),
])
def test_bad_arguments_are_usage_errors_with_usage_line(ip, line, needle):
    ip.run_line_magic("load_ext", "vramlab")
    with pytest.raises(UsageError) as e:
        ip.run_line_magic("vram", line)
    assert needle in str(e.value)
    assert "usage: %vram" in str(e.value)


def test_bad_argument_in_a_cell_shows_one_message_no_traceback(ip):
    ip.run_line_magic("load_ext", "vramlab")
    with capture_output() as cap:
        result = ip.run_cell("%vram bogus")
    assert not result.success
    text = cap.stdout + cap.stderr
    assert "UsageError" in text and "unknown subcommand" in text
    assert "Traceback" not in text


def test_help_is_the_manual(ip):
    ip.run_line_magic("load_ext", "vramlab")
    doc = ip.magics_manager.magics["line"]["vram"].__doc__
    assert "--json" in doc and "SUBCOMMAND" in doc


def test_load_twice_is_harmless_and_unload_removes_everything(ip):
    before_line = set(ip.magics_manager.magics["line"])
    before_cell = set(ip.magics_manager.magics["cell"])
    ip.run_line_magic("load_ext", "vramlab")
    ip.run_line_magic("load_ext", "vramlab")
    with capture_output() as cap:
        ip.run_line_magic("vram", "--json")
    assert cap.stdout.count('"host"') == 1
    ip.run_line_magic("unload_ext", "vramlab")
    assert set(ip.magics_manager.magics["line"]) == before_line
    assert set(ip.magics_manager.magics["cell"]) == before_cell
    ip.run_line_magic("load_ext", "vramlab")
    assert "vram" in ip.magics_manager.magics["line"]


# ---------------------------------------------------------------- per-cell records, auto, watch, history, free

MiB = 2**20


def test_cell_magic_reports_exact_host_peak(ip):
    import vramlab

    ip.run_line_magic("load_ext", "vramlab")
    with capture_output() as cap:
        r = ip.run_cell("%%vram\nimport numpy as np\nx = np.ones(300 * 2**20 // 8)\ndel x\n")
    assert r.success
    rec = vramlab.last()
    assert rec.host.peak_delta >= 290 * MiB
    assert "peak during cell" in cap.outputs[0].data["text/plain"]
    assert "vramlab-record" in cap.outputs[0].data["text/html"]


def test_cell_magic_returns_last_value_and_propagates_errors(ip):
    import vramlab

    ip.run_line_magic("load_ext", "vramlab")
    with capture_output():
        r = ip.run_cell("%%vram\n6 * 7\n")
    assert r.result == 42
    with capture_output() as cap:
        r = ip.run_cell("%%vram\nraise KeyError('nope')\n")
    assert not r.success and isinstance(r.error_in_exec, KeyError)
    assert vramlab.last().error == "KeyError"
    assert any("raised KeyError" in o.data["text/plain"] for o in cap.outputs)


def test_cell_magic_rejects_subcommands(ip):
    ip.run_line_magic("load_ext", "vramlab")
    with capture_output() as cap:
        r = ip.run_cell("%%vram watch\n1\n")
    assert not r.success and "UsageError" in cap.stderr + cap.stdout


def test_auto_prints_one_line_per_cell_even_if_loaded_twice(ip):
    ip.run_line_magic("load_ext", "vramlab")
    ip.run_line_magic("load_ext", "vramlab")
    with capture_output():
        ip.run_line_magic("vram", "auto on")
    try:
        with capture_output() as cap:
            ip.run_cell("z = 1")
        assert cap.stdout.count("[vramlab] cell") == 1
        assert "RSS" in cap.stdout
    finally:
        with capture_output():
            ip.run_line_magic("vram", "auto off")
    with capture_output() as cap:
        ip.run_cell("z = 2")
    assert "[vramlab]" not in cap.stdout


def test_auto_bad_argument(ip):
    ip.run_line_magic("load_ext", "vramlab")
    for line in ("auto", "auto maybe", "auto on off"):
        with pytest.raises(UsageError, match="on or off"):
            ip.run_line_magic("vram", line)


def test_watch_and_stop(ip):
    import threading

    import vramlab

    ip.run_line_magic("load_ext", "vramlab")
    with capture_output() as cap:
        ip.run_line_magic("vram", "watch --interval 0.25")
    try:
        assert cap.outputs[0].data["text/plain"] == "<vramlab monitor>"
        from vramlab.runtime.sampler import get_sampler

        assert get_sampler().running and get_sampler().interval == 0.25
    finally:
        with capture_output():
            ip.run_line_magic("vram", "stop")
    assert not [t for t in threading.enumerate() if t.name == "vramlab-sampler"]
    for bad in ("watch --interval fast", "watch --interval 0", "show --interval 1"):
        with pytest.raises(UsageError):
            ip.run_line_magic("vram", bad)
    m = vramlab.watch()
    try:
        assert "vramlab-monitor" in m._dom_classes
    finally:
        vramlab.stop()
        m.close()


def test_unload_stops_the_sampler_and_unregisters_events(ip):
    n_pre = len(ip.events.callbacks["pre_run_cell"])
    ip.run_line_magic("load_ext", "vramlab")
    assert len(ip.events.callbacks["pre_run_cell"]) == n_pre + 1
    with capture_output():
        ip.run_line_magic("vram", "watch")
    ip.run_line_magic("unload_ext", "vramlab")
    from vramlab.runtime.sampler import get_sampler

    assert not get_sampler().running
    assert len(ip.events.callbacks["pre_run_cell"]) == n_pre
    assert "vram" not in ip.magics_manager.magics["cell"]


@pytest.mark.slow
def test_history_export_plot_free_last(ip, tmp_path):
    ip.run_line_magic("load_ext", "vramlab")
    with capture_output():
        ip.run_cell("%%vram\nq = 1\n")
    with capture_output() as cap:
        ip.run_line_magic("vram", "history --last 3")
    assert "cell" in cap.stdout and "RSS" in cap.stdout
    with capture_output() as cap:
        ip.run_line_magic("vram", f"export {tmp_path / 'h.csv'}")
    assert (tmp_path / "h.csv").exists() and "wrote" in cap.stdout
    with pytest.raises(UsageError, match="does not exist"):
        ip.run_line_magic("vram", f"export {tmp_path / 'no' / 'h.csv'}")
    with pytest.raises(UsageError, match="suffix"):
        ip.run_line_magic("vram", f"export {tmp_path / 'h.xlsx'}")
    with pytest.raises(UsageError, match="one PATH"):
        ip.run_line_magic("vram", "export")
    fig = ip.run_line_magic("vram", "plot")
    from matplotlib.figure import Figure

    assert isinstance(fig, Figure) and fig._repr_png_().startswith(b"\x89PNG")
    with capture_output() as cap:
        ip.run_line_magic("vram", "free")
    assert "freed" in cap.stdout
    with capture_output() as cap:
        ip.run_line_magic("vram", "last")
    assert cap.outputs and "vramlab cell" in cap.outputs[0].data["text/plain"]


def test_oom_in_a_cell_is_explained(ip):
    ip.run_line_magic("load_ext", "vramlab")
    code = ("import torch\nbatch_size = 32\n"
            "raise torch.OutOfMemoryError('CUDA out of memory. Tried to allocate 1.00 GiB. GPU 0 has a total "
            "capacity of 8.00 GiB of which 512.00 MiB is free. Of the allocated memory 7.00 GiB is allocated by "
            "PyTorch, and 0 bytes is reserved by PyTorch but unallocated.')\n")
    with capture_output() as cap:
        r = ip.run_cell(code)
    assert not r.success
    texts = [o.data["text/plain"] for o in cap.outputs]
    expl = next(t for t in texts if "out of memory" in t)
    assert "requested            1.00 GiB" in expl and "batch size 32 -> try 16" in expl  # not measured: halve
    from vramlab.runtime.sampler import get_sampler

    assert get_sampler().markers[-1].kind == "oom"


_SETUP_TWO_RUNS = """
import gc, torch
from torch import nn
from vramlab.sim import VirtualGPU

def step(batch):
    # fixed: an embedding table, its dense gradient and Adam's two moments; per sample: 64 tokens
    torch.manual_seed(0)
    emb, head = nn.Embedding(20000, 256), nn.Linear(256, 10)
    opt = torch.optim.Adam([*emb.parameters(), *head.parameters()])
    tokens, labels = torch.randint(0, 20000, (batch, 64)), torch.randint(0, 10, (batch * 64,))
    nn.functional.cross_entropy(head(torch.relu(emb(tokens))).flatten(0, 1), labels).backward()
    opt.step()

gpu = VirtualGPU("512MiB").__enter__()
"""


@pytest.mark.parametrize("first", ["auto", "cell magic"])
@pytest.mark.slow
def test_a_cell_that_fitted_at_a_smaller_batch_gives_a_batch_that_fits(ip, first, monkeypatch):
    """In a notebook: the cell runs at batch 512 (it fits), then at 4096 (torch.OutOfMemoryError on
    a 512 MiB virtual card). The explanation shown after the cell derives its batch from the two
    runs (the one that ran, with a bound of the largest), and that batch runs in the next cell. The first run is recorded by %vram auto on, or by
    %%vram with the same code: the records know the cell by its code with the batch left out."""
    import collections
    import re

    from vramlab.runtime.records import get_recorder

    # a history of this test's cells only: the other parameter's runs of the same cell stay out
    monkeypatch.setattr(get_recorder(), "history", collections.deque(maxlen=get_recorder().history.maxlen))
    ip.run_line_magic("load_ext", "vramlab")
    r = ip.run_cell(_SETUP_TWO_RUNS)
    assert r.success, r.error_in_exec
    try:
        with capture_output():
            if first == "cell magic":
                r = ip.run_cell("%%vram\nbatch_size = 512\nstep(batch_size)\n", store_history=True)
                assert r.success
            ip.run_line_magic("vram", "auto on")
            if first == "auto":
                assert ip.run_cell("batch_size = 512\nstep(batch_size)\n", store_history=True).success
        with capture_output() as cap:
            r = ip.run_cell("batch_size = 4096\nstep(batch_size)\n", store_history=True)
        assert not r.success and type(r.error_in_exec).__name__ == "OutOfMemoryError"
        expl = next(o.data["text/plain"] for o in cap.outputs if "out of memory" in o.data["text/plain"])
        fit = int(re.search(r"batch size 4096 -> (\d+) fits: this cell ran at batch 512", expl).group(1))
        upper = int(re.search(r"the largest batch that fits is at most (\d+)", expl).group(1))
        assert fit == 512 < upper < 4096, "the batch that ran is advised, and a bound above it"
        with capture_output():
            ip.run_line_magic("vram", "free")
            ip.run_cell("gpu.empty_cache()")  # what %vram free does on a CUDA card: give the cache back
            r = ip.run_cell(f"batch_size = {fit}\nstep(batch_size)\n", store_history=True)
        assert r.success, r.error_in_exec
        import vramlab

        key = vramlab.last().cell_key
        runs = [(c.batch_size, c.error) for c in vramlab.history().cells if c.cell_key == key][-3:]
        assert key is not None and runs == [(512, None), (4096, "OutOfMemoryError"), (fit, None)]
    finally:
        with capture_output():
            ip.run_line_magic("vram", "auto off")
            ip.run_cell("gpu.__exit__(None, None, None); del gpu, step; gc.collect()")
        from vramlab.lessons.ramplan import release_free_heap

        release_free_heap()  # the steps' freed heap would serve the next tests' new pages, hiding them


@pytest.mark.parametrize("line", ["--json", "--last 2", "--interval 1", "history"])
def test_cell_magic_rejects_every_option_but_keep_peaks_and_uss(ip, line):
    ip.run_line_magic("load_ext", "vramlab")
    ip.user_ns.pop("ran", None)
    with pytest.raises(UsageError, match="%%vram takes only --keep-peaks and --uss"):
        ip.run_cell_magic("vram", line, "ran = True")
    assert "ran" not in ip.user_ns  # the cell did not run


def test_options_that_apply_still_work(ip):
    ip.run_line_magic("load_ext", "vramlab")
    with capture_output() as cap:
        ip.run_line_magic("vram", "history --last 1")
        ip.run_line_magic("vram", "auto on --keep-peaks")
        ip.run_line_magic("vram", "auto off")
    assert "peak counters kept" in cap.stdout


def test_a_traceback_in_a_vram_cell_shows_the_cell_source(ip):
    ip.run_line_magic("load_ext", "vramlab")
    with capture_output() as cap:
        ip.run_cell("%%vram\nfirst_line = 1\nraise ValueError('from line two')\n")
    text = cap.stdout + cap.stderr
    assert "ValueError: from line two" in text
    # the failing line of the cell is printed in the traceback, not a blank one
    assert "raise ValueError('from line two')" in text, text
    assert "<vram-cell>" not in text


def test_rerunning_a_watch_cell_fifty_times_leaves_one_monitor_and_one_renderer(ip):
    import vramlab
    from vramlab.runtime.sampler import get_sampler

    ip.run_line_magic("load_ext", "vramlab")
    try:
        for _ in range(50):
            with capture_output():
                ip.run_cell("%vram watch")
        s = get_sampler()
        assert len(vramlab.api.monitors()) == 1
        assert len(s._listeners) == 1
        assert s.running
    finally:
        vramlab.stop()
        for m in vramlab.api.monitors():
            m.close()
    assert get_sampler()._listeners == []


def test_uss_reaches_the_cell_record_of_percent_percent_vram_and_of_auto(ip):
    """--uss makes a cell's record read the USS of the kernel's children; without it, not."""
    import vramlab

    ip.run_line_magic("load_ext", "vramlab")
    ip.run_cell_magic("vram", "--uss", "x = 1")
    assert vramlab.last().host.children_uss_end is not None
    ip.run_cell_magic("vram", "", "x = 2")
    assert vramlab.last().host.children_uss_end is None
    ip.run_line_magic("vram", "auto on --uss")
    try:
        ip.run_cell("x = 3")
        assert vramlab.last().host.children_uss_end is not None
    finally:
        ip.run_line_magic("vram", "auto off")


# ---------------------------------------------------------------- the line as a shell splits it


@pytest.mark.parametrize("line", ['"export', "'", '"', "export 'a.csv"])
def test_an_unbalanced_quote_is_a_usage_error(ip, line):
    ip.run_line_magic("load_ext", "vramlab")
    with pytest.raises(UsageError, match="cannot split the arguments") as e:
        ip.run_line_magic("vram", line)
    assert "usage: %vram" in str(e.value)


def test_an_unbalanced_quote_in_a_cell_is_one_line(ip):
    ip.run_line_magic("load_ext", "vramlab")
    with capture_output() as cap:
        r = ip.run_cell("%%vram '\nran_unbalanced = 1\n")
    assert not r.success and "UsageError" in cap.stdout + cap.stderr
    assert "Traceback" not in cap.stdout + cap.stderr and "ran_unbalanced" not in ip.user_ns


@pytest.mark.parametrize("form", ['"{p}"', "'{p}'", "{e}"])
def test_export_takes_a_quoted_or_escaped_path_with_a_space(ip, tmp_path, form):
    ip.run_line_magic("load_ext", "vramlab")
    with capture_output():
        ip.run_cell("%%vram\nq = 1\n")
    target = tmp_path / "my cells.csv"
    line = "export " + form.format(p=target, e=str(target).replace(" ", "\\ "))
    with capture_output() as cap:
        ip.run_line_magic("vram", line)
    assert target.exists() and target.read_text().startswith("execution_count")
    assert str(target) in cap.stdout


def test_an_option_may_sit_between_the_subcommand_and_its_argument(ip, tmp_path):
    ip.run_line_magic("load_ext", "vramlab")
    with capture_output():
        ip.run_cell("%%vram\nq = 1\n")
    with capture_output() as cap:
        ip.run_line_magic("vram", f"export --samples {tmp_path / 's.csv'}")
        ip.run_line_magic("vram", "auto --keep-peaks on")
        ip.run_line_magic("vram", "auto off")
    assert (tmp_path / "s.csv").exists()
    assert "per-cell records on (peak counters kept)" in cap.stdout


@pytest.mark.parametrize("flag", ["--help", "-h", "history --help"])
def test_help_prints_the_manual(ip, flag):
    ip.run_line_magic("load_ext", "vramlab")
    with capture_output() as cap:
        ip.run_line_magic("vram", flag)
    assert "SUBCOMMAND" in cap.stdout and "--keep-peaks" in cap.stdout
    assert "%vram watch" in cap.stdout and "%%vram --keep-peaks" in cap.stdout  # the usage summary


@pytest.mark.parametrize("value", ["1e10", "9.3e9", "1e308"])
def test_an_interval_no_thread_can_wait_is_refused_before_the_sampler_starts(ip, value):
    from vramlab.runtime.sampler import get_sampler

    ip.run_line_magic("load_ext", "vramlab")
    get_sampler().stop()
    with pytest.raises(UsageError, match="at most"):
        ip.run_line_magic("vram", f"watch --interval {value}")
    assert not get_sampler().running


def _watch_then_stop(ip):
    """What ``%vram watch`` showed; the sampler is stopped afterwards, silently, whatever happened."""
    try:
        with capture_output() as cap:
            ip.run_line_magic("vram", "watch")
    finally:
        with capture_output():
            ip.run_line_magic("vram", "stop")
    return cap


def test_watch_in_a_terminal_says_where_the_terminal_monitor_is(ip):
    ip.run_line_magic("load_ext", "vramlab")
    assert getattr(ip, "kernel", None) is None  # the test shell is a terminal IPython
    cap = _watch_then_stop(ip)
    assert "python -m vramlab --watch" in cap.stdout


def test_plot_last_n_draws_only_the_last_cells(ip):
    ip.run_line_magic("load_ext", "vramlab")
    with capture_output():
        for i in range(4):
            ip.run_cell(f"%%vram\nq{i} = {i}\n", store_history=True)
    import vramlab.runtime.history as h

    wanted = {f"[{c.execution_count}]" for c in h.history().cells[-2:]}
    fig = ip.run_line_magic("vram", "plot --last 2")
    labels = {t.get_text() for ax in fig.axes for t in ax.texts}
    assert labels and labels <= wanted, (labels, wanted)
    with pytest.raises(UsageError, match="at least 1"):
        ip.run_line_magic("vram", "plot --last 0")
    with pytest.raises(UsageError, match="--last goes with %vram history and %vram plot"):
        ip.run_line_magic("vram", "show --last 2")


def test_uss_prints_this_processs_uss_in_the_record(ip):
    """%%vram --uss: its help says it reads the USS of this process too, so the record shows it
    (a cell that writes 64 MiB of new private pages raises it by at least that much)."""
    import vramlab

    ip.run_line_magic("load_ext", "vramlab")
    with capture_output() as cap:
        ip.run_cell_magic("vram", "--uss", "kept_uss = bytearray(64 << 20)\nkept_uss[::4096] = b'x' * (64 << 8)")
    h = vramlab.last().host
    # 64 MiB of new private pages, less whatever private pages the process gave back meanwhile
    # (a loaded run measured +63.75 MiB: the allocator and GC return pages of their own)
    assert h.uss_start is not None and h.uss_end is not None and h.uss_delta >= 48 << 20
    assert "host USS" in cap.outputs[0].data["text/plain"] and "USS" in cap.outputs[0].data["text/html"]
    with capture_output():
        ip.run_cell_magic("vram", "", "x = 1")
    assert vramlab.last().host.uss_delta is None  # without --uss nothing is read
    ip.user_ns.pop("kept_uss", None)


@pytest.fixture
def speak():
    """``speak("pt-BR")`` or ``speak("en")``; the language is detected again after the test."""
    from vramlab.i18n import set_lang

    yield set_lang
    set_lang(None)


def test_the_usage_summary_is_the_modules_docs():
    import inspect

    from vramlab.i18n import set_lang
    from vramlab.ipython import magics

    doc = inspect.cleandoc(magics.__doc__)
    summary = doc[doc.find("Usage::"):].split("Per-cell records reset")[0].rstrip().replace("Usage::", "Usage:")
    set_lang("en")
    try:
        assert magics._usage_summary() == summary
    finally:
        set_lang(None)


def test_the_magic_speaks_portuguese(ip, speak):
    ip.run_line_magic("load_ext", "vramlab")
    speak("pt-BR")
    with capture_output() as cap:
        ip.run_line_magic("vram", "--help")
    manual = cap.stdout
    for portuguese in ("Uso:", "a leitura conciliada", "argumentos posicionais:", "opções:",
                       "show, %%vram e auto: lê também o USS", "o mesmo, sem zerar os contadores de pico globais"):
        assert portuguese in manual, portuguese
    for english in ("Usage:", "positional arguments", "options:", "the reconciled snapshot", "(default"):
        assert english not in manual, english
    assert "%vram watch" in manual and "--keep-peaks" in manual and "SUBCOMMAND" in manual  # commands stay
    with pytest.raises(UsageError) as e:
        ip.run_line_magic("vram", "--uss history")
    assert "--uss vai com %vram show e %vram auto e %%vram, não com %vram history" in str(e.value)
    assert "uso: %vram [--json]" in str(e.value)
    with pytest.raises(UsageError, match="subcomando desconhecido 'bogus'"):
        ip.run_line_magic("vram", "bogus")
    with pytest.raises(UsageError, match="aceita um número de segundos; veio 'fast'"):
        ip.run_line_magic("vram", "watch --interval fast")
    with capture_output() as cap:
        ip.run_line_magic("vram", "auto --keep-peaks on")
        ip.run_line_magic("vram", "auto off")
        ip.run_line_magic("vram", "stop")
    assert cap.stdout.splitlines() == ["[vramlab] registros por célula ligados (contadores de pico mantidos)",
                                       "[vramlab] registros por célula desligados",
                                       "[vramlab] o amostrador não estava rodando: não há o que parar "
                                       "(%vram watch o inicia)"]
    speak("en")
    with capture_output() as cap:
        ip.run_line_magic("vram", "stop")
    assert cap.stdout == "[vramlab] the sampler was not running: nothing to stop (%vram watch starts it)\n"


def test_watch_shows_the_monitors_name_in_the_notebooks_language(ip, speak):
    ip.run_line_magic("load_ext", "vramlab")
    speak("pt-BR")
    cap = _watch_then_stop(ip)
    assert cap.outputs[0].data["text/plain"] == "<monitor do vramlab>"
    assert "o monitor ao vivo é um widget do Jupyter" in cap.stdout and "python -m vramlab --watch 1" in cap.stdout


@pytest.mark.slow
def test_a_virtual_card_entered_inside_the_cell_is_measured_by_its_record(ip, monkeypatch):
    """The documented way: ``with VirtualGPU(...):`` inside the cell. The card has left when the
    record ends; its last reading stands for the cell's end, so the cell is measured like any
    other: no "did not measure this cell", and an OOM gets the two-runs advice."""
    import collections
    import re

    from vramlab.runtime.records import get_recorder

    monkeypatch.setattr(get_recorder(), "history", collections.deque(maxlen=get_recorder().history.maxlen))
    ip.run_line_magic("load_ext", "vramlab")
    setup = _SETUP_TWO_RUNS.replace('gpu = VirtualGPU("512MiB").__enter__()', "")
    assert ip.run_cell(setup).success
    cell = 'with VirtualGPU("512MiB"):\n    batch_size = {b}\n    step(batch_size)\n'
    try:
        with capture_output():
            ip.run_line_magic("vram", "auto on")
            assert ip.run_cell(cell.format(b=512), store_history=True).success
        import vramlab

        ok = vramlab.last()
        dev = [d for d in ok.devices if d.id.startswith("virtual")]
        assert dev and dev[0].peak_allocated and dev[0].peak_allocated > 100 * 2**20, ok
        with capture_output() as cap:
            r = ip.run_cell(cell.format(b=4096), store_history=True)
        assert not r.success and type(r.error_in_exec).__name__ == "OutOfMemoryError"
        text = "\n".join(o.data["text/plain"] for o in cap.outputs)
        assert "did not measure this cell" not in text, text
        assert re.search(r"batch size 4096 -> 512 fits: this cell ran at batch 512", text), text
    finally:
        with capture_output():
            ip.run_line_magic("vram", "auto off")
            ip.run_line_magic("vram", "free")


def test_stop_says_so_only_when_something_ran(ip):
    """%vram stop said "sampler stopped" when nothing ran (hardening, small lies)."""
    from IPython.utils.capture import capture_output

    from vramlab.runtime.sampler import get_sampler

    ip.run_line_magic("load_ext", "vramlab")
    get_sampler().stop()
    with capture_output() as out:
        ip.run_line_magic("vram", "stop")
    assert "nothing to stop" in out.stdout and "sampler stopped" not in out.stdout
    with capture_output():
        ip.run_line_magic("vram", "watch --interval 5")
    with capture_output() as out:
        ip.run_line_magic("vram", "stop")
    assert "sampler stopped" in out.stdout


def test_vram_commands_are_not_rows_of_the_history(ip):
    """Every mistyped %vram line became a row in %vram history (hardening, small lies): a cell
    of %vram commands is vramlab's own, and auto mode keeps no record of it."""
    import vramlab

    ip.run_line_magic("load_ext", "vramlab")
    with capture_output():
        ip.run_cell("%vram auto on", store_history=True)
        before = len(vramlab.history().cells)
        ip.run_cell("%vram bogus", store_history=True)
        ip.run_cell("%vram history", store_history=True)
        ip.run_cell("x_for_history = 1", store_history=True)
        ip.run_cell("%vram auto off", store_history=True)
    assert len(vramlab.history().cells) == before + 1  # the user's cell only


def test_a_syntax_error_in_a_vram_cell_shows_none_of_vramlab_s_frames(ip):
    """A SyntaxError in a %%vram cell showed three of vramlab's frames and pointed at '<unknown>'
    (hardening, small lies): it points at the cell's line, and its traceback holds only the magic's
    own entry, as IPython's %%time shows its own."""
    import traceback

    ip.run_line_magic("load_ext", "vramlab")
    with capture_output():
        r = ip.run_cell("%%vram\nx = 1\ny = (\n", store_history=True)
    e = r.error_in_exec
    assert isinstance(e, SyntaxError)
    ours = [f for f in traceback.extract_tb(e.__traceback__) if "vramlab" in f.filename]
    assert [f.name for f in ours] == ["vram"], ours
    assert e.lineno == 2 and "y = (" in (e.text or "") and e.filename != "<unknown>"
    with capture_output():  # an error the code raises as it runs keeps its own frames
        r = ip.run_cell("%%vram\nexec('(')\n", store_history=True)
    assert isinstance(r.error_in_exec, SyntaxError)
