"""GPU presets: memory capacity, memory bandwidth and host link of real GPUs, from datasheets.

``get_preset("A100-80GB")`` looks a GPU up by name, case-insensitively, ignoring spaces,
dashes and underscores (``"a100_80gb"``, ``"A100 80GB"``, ``"a100-80g"`` all work).
:class:`~vramlab.VirtualGPU` and :func:`~vramlab.sim.estimate.estimate` accept these names.

Units: ``memory`` in bytes, ``bandwidth`` and ``host_link_bandwidth`` in bytes per second
(decimal, as datasheets give them: 1 GB/s = 10**9 B/s).

Memory capacities. Three figures, from the largest down:

- ``datasheet_memory``: the datasheet's size. Datasheets write "16 GB" for what is 16 GiB of
  DRAM (memory dies come in binary sizes), so it is read as GiB: 16 GB -> 16 * 2**30 bytes.
- ``memory``: the **total the card reports**, ``nvidia-smi``'s "Total" (NVML's
  ``nvmlDeviceGetMemoryInfo`` total, in MiB), on recent drivers. It is lower than the datasheet
  where ECC or the driver's own reservations take memory: a T4 shows 15360 MiB, not 16384.
  Each row cites where the figure was reported (``memory_source``); older drivers reported
  less on some cards, and that figure is given beside it. This is what a
  :class:`~vramlab.VirtualGPU` of the preset's name has, and what ``torch.OutOfMemoryError``
  calls the card's total capacity.
- ``usable``: ``memory`` minus the modelled CUDA context (:data:`CUDA_CONTEXT_OVERHEAD`), the
  most that tensors can get. ``estimate()`` verdicts and the lessons' "fits" use it.

torch can report a total a little below ``memory`` (``torch.cuda.mem_get_info()`` leaves out
what NVML v2 calls "reserved"). None of these figures has been read on a card by vramlab yet:
the real ones are what ``python -m vramlab.selftest`` prints on the card in use.

This module does not import torch.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace

__all__ = ["GPUPreset", "GPU_PRESETS", "COMPUTE_CAPABILITY", "CONTEXT_FIGURES", "CUDA_CONTEXT_OVERHEAD", "get_preset", "preset_names"]

GiB = 2**30
MiB = 2**20
GB = 10**9

#: Bytes a CUDA context takes on the card before any tensor, for a card without a published
#: figure (:data:`CONTEXT_FIGURES`): the driver's context and the kernels of torch's CUDA
#: libraries loaded lazily. This is an **assumption** (published figures for torch 2.x with
#: lazy module loading span about 250 to 550 MiB, depending on the GPU) until the GPU
#: self-check measures it on the card in use: NVML's figure for the process minus torch's
#: reserved bytes after the first kernel ran.
CUDA_CONTEXT_OVERHEAD = 512 * 2**20


@dataclass(frozen=True)
class GPUPreset:
    """One GPU model.

    Attributes:
        name: the canonical name (``"A100-80GB"``).
        memory: the total memory the card reports (``nvidia-smi``'s "Total"), bytes.
        memory_type: ``"HBM3"``, ``"GDDR6"``, ...
        bandwidth: memory bandwidth in bytes per second.
        host_link: how the GPU reaches host memory (``"PCIe 4.0 x16"``, ``"NVLink-C2C"``).
        host_link_bandwidth: that link's bandwidth per direction, bytes per second.
        context_overhead: bytes modelled for the CUDA context: a published figure for the card
            under torch 2.x with lazy module loading where one was found (:data:`CONTEXT_FIGURES`),
            else :data:`CUDA_CONTEXT_OVERHEAD`, an assumption.
        context_source: where ``context_overhead`` comes from (a citation, or "assumed").
        aliases: other names it is found by.
        source: the datasheet the bandwidth and link figures come from.
        datasheet_memory: the datasheet's memory size, bytes (``memory`` when 0).
        memory_source: where the reported total ``memory`` was published.
    """

    name: str
    memory: int
    memory_type: str
    bandwidth: int
    host_link: str
    host_link_bandwidth: int
    context_overhead: int = CUDA_CONTEXT_OVERHEAD
    aliases: tuple[str, ...] = field(default_factory=tuple)
    context_source: str = ""
    source: str = ""
    datasheet_memory: int = 0
    memory_source: str = ""

    def __post_init__(self) -> None:
        if not self.datasheet_memory:
            object.__setattr__(self, "datasheet_memory", self.memory)

    @property
    def usable(self) -> int:
        """Bytes that tensors can get: the reported total minus the modelled CUDA context."""
        return self.memory - self.context_overhead

    @property
    def kind(self) -> str:
        """The device kind the preset models: ``"cuda"``."""
        return "cuda"

    @property
    def compute_capability(self) -> tuple[int, int]:
        """The card's CUDA compute capability (major, minor), from :data:`COMPUTE_CAPABILITY`: it
        decides which attention kernel torch runs and the cuBLAS workspace (:mod:`vramlab.sim.kernels`)."""
        return COMPUTE_CAPABILITY[self.name]


#: Compute capability per preset, as NVIDIA lists it ("CUDA GPUs - Compute Capability",
#: developer.nvidia.com/cuda-gpus): Volta 7.0, Turing 7.5, Ampere 8.0 (A100) and 8.6
#: (GA10x), Ada 8.9, Hopper 9.0, Blackwell 10.0 (B200) and 12.0 (GeForce RTX 50).
COMPUTE_CAPABILITY: dict[str, tuple[int, int]] = {
    "T4": (7, 5), "L4": (8, 9), "A10G": (8, 6), "RTX 3090": (8, 6), "RTX 4090": (8, 9), "RTX 5090": (12, 0),
    "RTX 4060 Laptop": (8, 9), "V100-16GB": (7, 0), "V100-32GB": (7, 0), "A100-40GB": (8, 0), "A100-80GB": (8, 0),
    "H100-80GB": (9, 0), "H200-141GB": (9, 0), "GH200-96GB": (9, 0), "B200-180GB": (10, 0),
}


# PCIe per-direction bandwidth of an x16 link: 3.0 ~16 GB/s, 4.0 ~32 GB/s, 5.0 ~64 GB/s
# (PCI-SIG base specifications; NVIDIA datasheets give the bidirectional x16 figure,
# e.g. "PCIe Gen4 x16: 64 GB/s").
_PCIE3, _PCIE4, _PCIE5 = 16 * GB, 32 * GB, 64 * GB

GPU_PRESETS: tuple[GPUPreset, ...] = (
    # NVIDIA T4 Tensor Core GPU datasheet: 16 GB GDDR6, 320+ GB/s, PCIe Gen3 x16.
    GPUPreset("T4", 15360 * MiB, "GDDR6", 320 * GB, "PCIe 3.0 x16", _PCIE3,
              aliases=("Tesla T4", "T4-16GB"), source="NVIDIA T4 datasheet",
              datasheet_memory=16 * GiB,
              memory_source="nvidia-smi on recent drivers (modal-labs/modal-client PR #2797); older drivers "
                            "showed 15109 or 15079 MiB (NVIDIA developer forum, topic 173099)"),
    # NVIDIA L4 Tensor Core GPU datasheet: 24 GB GDDR6, 300 GB/s, PCIe Gen4 x16 64 GB/s.
    GPUPreset("L4", 23034 * MiB, "GDDR6", 300 * GB, "PCIe 4.0 x16", _PCIE4,
              aliases=("L4-24GB",), source="NVIDIA L4 datasheet",
              datasheet_memory=24 * GiB,
              memory_source="nvidia-smi (modal-labs/modal-client PR #2797)"),
    # NVIDIA A10G (AWS EC2 G5 instances): 24 GB GDDR6; the A10 datasheet gives 600 GB/s
    # and PCIe Gen4 x16 (AWS EC2 G5 instance page; NVIDIA A10 Tensor Core GPU datasheet).
    GPUPreset("A10G", 23028 * MiB, "GDDR6", 600 * GB, "PCIe 4.0 x16", _PCIE4,
              aliases=("A10G-24GB", "A10"), source="AWS G5 page; NVIDIA A10 datasheet",
              datasheet_memory=24 * GiB,
              memory_source="nvidia-smi (NVIDIA/DCGM issue #232)"),
    # GeForce RTX 3090 specifications: 24 GB GDDR6X, 384-bit, 19.5 Gbps -> 936 GB/s, PCIe 4.0.
    GPUPreset("RTX 3090", 24576 * MiB, "GDDR6X", 936 * GB, "PCIe 4.0 x16", _PCIE4,
              aliases=("3090", "GeForce RTX 3090"), source="NVIDIA GeForce RTX 3090 specifications",
              datasheet_memory=24 * GiB,
              memory_source="nvidia-smi (noonghunna/club-3090 issue #1127)"),
    # GeForce RTX 4090 specifications: 24 GB GDDR6X, 384-bit, 21 Gbps -> 1008 GB/s, PCIe 4.0.
    GPUPreset("RTX 4090", 24564 * MiB, "GDDR6X", 1008 * GB, "PCIe 4.0 x16", _PCIE4,
              aliases=("4090", "GeForce RTX 4090"), source="NVIDIA GeForce RTX 4090 specifications",
              datasheet_memory=24 * GiB,
              memory_source="nvidia-smi (RLinf/RLinf issue #255)"),
    # GeForce RTX 5090 specifications: 32 GB GDDR7, 512-bit, 28 Gbps -> 1792 GB/s, PCIe 5.0.
    GPUPreset("RTX 5090", 32607 * MiB, "GDDR7", 1792 * GB, "PCIe 5.0 x16", _PCIE5,
              aliases=("5090", "GeForce RTX 5090"), source="NVIDIA GeForce RTX 5090 specifications",
              datasheet_memory=32 * GiB,
              memory_source="nvidia-smi (noonghunna/club-3090 issue #617)"),
    # GeForce RTX 4060 Laptop GPU specifications: 8 GB GDDR6, 128-bit, 16 Gbps -> 256 GB/s,
    # PCIe 4.0 x8 (NVIDIA GeForce RTX 40 Series laptops specifications).
    GPUPreset("RTX 4060 Laptop", 8 * GiB, "GDDR6", 256 * GB, "PCIe 4.0 x8", _PCIE4 // 2,
              aliases=("4060 Laptop", "RTX 4060 Mobile", "laptop-8GB"),
              source="NVIDIA GeForce RTX 40 Series laptop specifications",
              datasheet_memory=8 * GiB,
              memory_source="the datasheet's size: no citable report of the total was found "
                            "(users' nvidia-smi outputs show 8188 MiB)"),
    # NVIDIA V100 Tensor Core GPU datasheet: 16 or 32 GB HBM2, 900 GB/s (SXM2 and PCIe);
    # host link PCIe Gen3 x16 (NVLink 2.0 links GPUs to GPUs, not to x86 hosts).
    GPUPreset("V100-16GB", 16384 * MiB, "HBM2", 900 * GB, "PCIe 3.0 x16", _PCIE3,
              aliases=("V100", "Tesla V100", "V100-16"), source="NVIDIA V100 datasheet",
              datasheet_memory=16 * GiB,
              memory_source="nvidia-smi on recent drivers (1CatAI/1Cat-vLLM issue #85); older drivers showed 16160 MiB"),
    GPUPreset("V100-32GB", 32768 * MiB, "HBM2", 900 * GB, "PCIe 3.0 x16", _PCIE3,
              aliases=("V100-32", "Tesla V100 32GB"), source="NVIDIA V100 datasheet",
              datasheet_memory=32 * GiB,
              memory_source="nvidia-smi on recent drivers (Wan-Video/Wan2.1 issue #5); older drivers showed 32510 MiB"),
    # NVIDIA A100 Tensor Core GPU datasheet: 40 GB HBM2 1,555 GB/s; 80 GB HBM2e 2,039 GB/s
    # (SXM; 1,935 GB/s for the 80 GB PCIe card); PCIe Gen4 x16 64 GB/s.
    GPUPreset("A100-40GB", 40960 * MiB, "HBM2", 1555 * GB, "PCIe 4.0 x16", _PCIE4,
              aliases=("A100-40", "A100 40GB"), source="NVIDIA A100 datasheet",
              datasheet_memory=40 * GiB,
              memory_source="nvidia-smi on recent drivers (modal-labs/modal-client PR #2797); older drivers "
                            "showed 40536 MiB (facebookresearch/vissl issue #422)"),
    GPUPreset("A100-80GB", 81920 * MiB, "HBM2e", 2039 * GB, "PCIe 4.0 x16", _PCIE4,
              aliases=("A100", "A100-80", "A100 80GB"), source="NVIDIA A100 datasheet",
              datasheet_memory=80 * GiB,
              memory_source="nvidia-smi on recent drivers (allenai/PeerRead issue #40); older drivers showed 81251 MiB"),
    # NVIDIA H100 Tensor Core GPU datasheet: H100 SXM 80 GB HBM3, 3.35 TB/s; PCIe Gen5
    # x16 128 GB/s.
    GPUPreset("H100-80GB", 81559 * MiB, "HBM3", 3350 * GB, "PCIe 5.0 x16", _PCIE5,
              aliases=("H100", "H100-SXM", "H100 80GB"), source="NVIDIA H100 datasheet",
              datasheet_memory=80 * GiB,
              memory_source="nvidia-smi (NVIDIA/nccl issue #1264); torch's total_memory 85520809984 B, the "
                            "same (modal-labs/modal-client PR #2797)"),
    # NVIDIA H200 Tensor Core GPU datasheet: 141 GB HBM3e, 4.8 TB/s; PCIe Gen5 x16 128 GB/s.
    # 141 GB is read as GiB like the others; the card reports 143771 MiB (140.4 GiB).
    GPUPreset("H200-141GB", 143771 * MiB, "HBM3e", 4800 * GB, "PCIe 5.0 x16", _PCIE5,
              aliases=("H200", "H200 141GB"), source="NVIDIA H200 datasheet",
              datasheet_memory=141 * GiB,
              memory_source="nvidia-smi (NVIDIA/cuda-samples issue #311)"),
    # NVIDIA GH200 Grace Hopper Superchip datasheet: 96 GB HBM3, 4 TB/s; the GPU reaches
    # the Grace CPU's memory over NVLink-C2C, 900 GB/s total (450 GB/s per direction).
    GPUPreset("GH200-96GB", 97871 * MiB, "HBM3", 4000 * GB, "NVLink-C2C", 450 * GB,
              aliases=("GH200",), source="NVIDIA GH200 datasheet",
              datasheet_memory=96 * GiB,
              memory_source="nvidia-smi (NVIDIA/apex issue #1833)"),
    # NVIDIA DGX B200 / HGX B200 datasheet: 1,440 GB of HBM3e for 8 GPUs, i.e. 180 GB per
    # GPU, 64 TB/s total, i.e. 8 TB/s per GPU; PCIe Gen5 x16 to the host.
    GPUPreset("B200-180GB", 183359 * MiB, "HBM3e", 8000 * GB, "PCIe 5.0 x16", _PCIE5,
              aliases=("B200", "B200 180GB"), source="NVIDIA DGX B200 datasheet",
              datasheet_memory=180 * GiB,
              memory_source="nvidia-smi (NVIDIA/TensorRT-LLM issue #10278)"),
)


def _norm(name: str) -> str:
    s = re.sub(r"[\s_\-]+", "", name.strip().lower())
    s = s.replace("nvidia", "").replace("geforce", "").replace("tesla", "") or s
    return re.sub(r"(\d+)g(b)?$", r"\1gb", s)


def preset_names() -> list[str]:
    """The canonical preset names, in table order."""
    return [p.name for p in GPU_PRESETS]


#: The CUDA context per card where a figure measured under torch 2.x with lazy module loading
#: (torch sets ``CUDA_MODULE_LOADING=LAZY`` since 1.13, pytorch/pytorch#86509) was published:
#: the memory a process holds on the card before its first tensor, bytes. Eager loading, as in
#: older figures (1343 MB on a V100 with CUDA 11.2, Hugging Face's "model memory anatomy"),
#: takes about twice as much and is not used. The cuBLAS workspace is not in these: it is
#: counted as the kernels take it (:mod:`vramlab.sim.kernels`). Cards of one chip share a figure
#: (the context grows with the chip's SMs, not with its memory). No GPU run of vramlab's has
#: checked them yet.
CONTEXT_FIGURES: dict[str, tuple[int, str]] = {
    "A100-80GB": (481 * MiB, "0.47 GiB used after torch.ones(1).cuda() on an A100 80GB, torch 2.1.1+cu121, lazy "
                             "loading (stas00/ml-engineering, training/performance/README.md)"),
    "A100-40GB": (481 * MiB, "the A100 80GB's figure (same GA100 chip, 108 SMs): 0.47 GiB after torch.ones(1).cuda(), "
                             "torch 2.1.1+cu121 (stas00/ml-engineering, training/performance/README.md)"),
    "H100-80GB": (534 * MiB, "'On H100, each primary context costs ~534 MiB' (meta-pytorch/torchcomms PR #777)"),
    "H200-141GB": (534 * MiB, "the H100's figure (same GH100 chip, 132 SMs): ~534 MiB per primary context "
                              "(meta-pytorch/torchcomms PR #777)"),
    "RTX 3090": (256 * MiB, "'a flat 256 MiB' per process on RTX 3090s, torch 2.7.1+cu128 (invoke-ai/InvokeAI issue "
                            "#9413)"),
}

_ASSUMED = ("assumed: no figure measured under torch 2.x with lazy loading was found for this card; 512 MiB, "
            "within the 250 to 550 MiB that published figures for other cards span")

GPU_PRESETS = tuple(
    replace(p, context_overhead=CONTEXT_FIGURES[p.name][0], context_source=CONTEXT_FIGURES[p.name][1])
    if p.name in CONTEXT_FIGURES else replace(p, context_source=_ASSUMED) for p in GPU_PRESETS)

# built from the presets above, with their context figures (an index built before would hand out
# the presets without them)
_INDEX: dict[str, GPUPreset] = {}
for _p in GPU_PRESETS:
    for _n in (_p.name, *_p.aliases):
        _INDEX.setdefault(_norm(_n), _p)


def get_preset(name: str | GPUPreset) -> GPUPreset:
    """The preset named ``name`` (case, spaces, dashes and underscores ignored).

    Raises:
        ValueError: for an unknown name, listing the known ones.
    """
    if isinstance(name, GPUPreset):
        return name
    if not isinstance(name, str):
        raise ValueError(f"a GPU preset name must be a string; got {name!r}")
    p = _INDEX.get(_norm(name))
    if p is None:
        raise ValueError(f"unknown GPU preset {name!r}; known: {', '.join(preset_names())}")
    return p
