"""Probes: read the machine. No IPython, no widgets; plain frozen dataclasses; bytes only.

- :mod:`vramlab.probes.host`: this process, system RAM, swap and the effective (cgroup) limit.
- :mod:`vramlab.probes.nvml`: NVIDIA devices through NVML (package ``nvidia-ml-py``).
- :mod:`vramlab.probes.torch_`: the PyTorch allocators, read only when torch is already imported.
"""
