"""Probes: read the machine. No IPython, no widgets; frozen dataclasses; bytes only.

Probes import only :mod:`vramlab.model` and :mod:`vramlab.units` (and each other).

- :mod:`vramlab.probes.host`: this process, system RAM, swap and the effective limit.
- :mod:`vramlab.probes.cgroup`: the cgroup v1/v2 limit and usage that set that limit.
- :mod:`vramlab.probes.nvml`: NVIDIA devices through NVML (package ``nvidia-ml-py``).
- :mod:`vramlab.probes.cuda_order`: CUDA_VISIBLE_DEVICES and MIG names -> NVML devices.
- :mod:`vramlab.probes.torch_alloc`: the PyTorch allocators, read only when torch is already imported.
"""
