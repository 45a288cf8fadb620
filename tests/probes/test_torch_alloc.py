import subprocess
import sys

import pytest

from vramlab.probes.torch_alloc import read_torch, reset_peaks


def run(code):
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True).stdout


def test_import_and_snapshot_do_not_import_torch():
    out = run("import sys, vramlab; vramlab.snapshot(); print('torch' in sys.modules)")
    assert out.strip() == "False"


@pytest.mark.slow
def test_load_ext_and_vram_do_not_import_torch():
    out = run(
        "import sys\n"
        "from IPython.testing.globalipapp import start_ipython\n"
        "ip = start_ipython()\n"
        "ip.run_line_magic('load_ext', 'vramlab')\n"
        "ip.run_line_magic('vram', '')\n"
        "print('TORCH', 'torch' in sys.modules)\n")
    assert "TORCH False" in out


@pytest.mark.slow
def test_reading_with_torch_does_not_initialise_cuda():
    out = run("import torch, vramlab; vramlab.snapshot(); print(torch.cuda.is_initialized())")
    assert out.strip() == "False"


def test_cpu_torch_has_no_allocator_devices():
    import torch  # noqa: F401

    r = read_torch()
    devices, notes = r.devices, r.notes
    assert [d for d in devices if d.kind == "cuda"] == [] or torch.cuda.is_initialized()
    assert isinstance(notes, tuple)


def test_not_imported_reads_nothing():
    out = run("import sys; from vramlab.probes.torch_alloc import read_torch; print(read_torch(), 'torch' in sys.modules)")
    assert out.strip() == "TorchReading(devices=(), notes=()) False"


def test_reset_peaks_without_cuda_is_a_no_op():
    assert reset_peaks() == [] or sys.modules["torch"].cuda.is_initialized()
