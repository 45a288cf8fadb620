"""GPU presets: the table, the three memory figures, lookup by name and alias, unknown names."""

from __future__ import annotations

import subprocess
import sys

import pytest

from vramlab.sim.presets import CONTEXT_FIGURES, CUDA_CONTEXT_OVERHEAD, GPU_PRESETS, GPUPreset, get_preset, preset_names

GiB = 2**30
MiB = 2**20


def test_the_table_has_the_gpus_the_lessons_name():
    for name in ["T4", "L4", "A10G", "RTX 3090", "RTX 4090", "RTX 5090", "V100-16GB", "V100-32GB",
                 "A100-40GB", "A100-80GB", "H100-80GB", "H200-141GB", "B200-180GB"]:
        assert get_preset(name).name == name
    assert any(p.memory == 8 * GiB and "Laptop" in p.name for p in GPU_PRESETS)
    assert any(p.host_link == "NVLink-C2C" for p in GPU_PRESETS)


def test_every_preset_is_complete_and_sane():
    names = set()
    for p in GPU_PRESETS:
        assert isinstance(p, GPUPreset) and p.kind == "cuda"
        assert p.name not in names
        names.add(p.name)
        assert p.datasheet_memory >= 8 * GiB and p.datasheet_memory % GiB == 0
        # the reported total: whole MiB (nvidia-smi's unit), at most the datasheet's, by less than 10%
        assert p.memory % MiB == 0 and 0.9 * p.datasheet_memory < p.memory <= p.datasheet_memory, p.name
        assert p.memory_source and p.usable == p.memory - p.context_overhead
        assert 100e9 <= p.bandwidth <= 10e12, "bytes per second"
        assert p.host_link.startswith(("PCIe", "NVLink")) and p.host_link_bandwidth > 0
        assert p.source
        # a published figure where one was found, cited; else the assumption, said to be one
        if p.name in CONTEXT_FIGURES:
            assert (p.context_overhead, p.context_source) == CONTEXT_FIGURES[p.name]
        else:
            assert p.context_overhead == CUDA_CONTEXT_OVERHEAD and p.context_source.startswith("assumed")
        assert 128 * MiB <= p.context_overhead < p.memory
        # what a lookup hands out is this preset, context figure and all, by its name and every alias
        assert all(get_preset(n) is p for n in (p.name, *p.aliases))


def test_known_figures():
    t4 = get_preset("T4")
    assert t4.datasheet_memory == 16 * GiB and t4.memory == 15360 * MiB  # a T4 reports 15 GiB, not 16
    assert t4.usable == 15360 * MiB - CUDA_CONTEXT_OVERHEAD < 15 * GiB
    assert get_preset("A100-40GB").memory == 40 * GiB
    assert get_preset("A100-80GB").memory == 80 * GiB
    assert get_preset("H100").bandwidth == 3350 * 10**9
    assert get_preset("H100").memory == 85520809984  # torch's total_memory on an H100 80GB, reported
    assert get_preset("H200").datasheet_memory == 141 * GiB and get_preset("H200").memory == 143771 * MiB


def test_datasheet_memory_defaults_to_memory():
    p = GPUPreset("X", 12 * GiB, "GDDR6", 300 * 10**9, "PCIe 4.0 x16", 32 * 10**9)
    assert p.datasheet_memory == p.memory == 12 * GiB and p.usable == 12 * GiB - CUDA_CONTEXT_OVERHEAD
    assert get_preset("RTX 4090").host_link == "PCIe 4.0 x16"


@pytest.mark.parametrize("alias", ["A100-80GB", "a100_80gb", "A100 80GB", "a100-80g", "A10080GB", " a100 "])
def test_lookup_ignores_case_spaces_dashes_and_underscores(alias):
    assert get_preset(alias).name == "A100-80GB"


@pytest.mark.parametrize("alias,name", [("tesla t4", "T4"), ("GeForce RTX 4090", "RTX 4090"), ("rtx_3090", "RTX 3090"),
                                        ("v100", "V100-16GB"), ("h200", "H200-141GB"), ("b200", "B200-180GB"),
                                        ("4060 laptop", "RTX 4060 Laptop")])
def test_aliases(alias, name):
    assert get_preset(alias).name == name


def test_unknown_name_lists_the_known_ones():
    with pytest.raises(ValueError) as ei:
        get_preset("H900")
    msg = str(ei.value)
    for n in preset_names():
        assert n in msg
    with pytest.raises(ValueError):
        get_preset(80)  # type: ignore[arg-type]


def test_presets_do_not_import_torch():
    code = "import sys, vramlab.sim.presets, vramlab.sim; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_every_preset_has_its_compute_capability():
    from vramlab.sim.presets import COMPUTE_CAPABILITY, GPU_PRESETS

    assert set(COMPUTE_CAPABILITY) == {p.name for p in GPU_PRESETS}
    assert get_preset("T4").compute_capability == (7, 5) and get_preset("H100").compute_capability == (9, 0)
