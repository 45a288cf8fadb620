"""The workbook's helpers: what the lessons in ``notebooks/`` call, beside the instrument.

- :mod:`vramlab.lessons.device`: ``pick_device()``, CUDA when present, else a virtual GPU.
- :mod:`vramlab.lessons.models`: small reference models (MLP, CNN, GPT) for lessons and checks.
- :mod:`vramlab.lessons.anatomy`: the phases of a training step, traced.
- :mod:`vramlab.lessons.transfer`: host<->device copies, activation offload, int8, length bucketing.
- :mod:`vramlab.lessons.ramplan`: host-RAM plans against the measured peak.
- :mod:`vramlab.lessons.hparams`: hyper-parameters under a memory budget.
- :mod:`vramlab.lessons.quant`, :mod:`vramlab.lessons.prune`: quantisation and pruning.
- :mod:`vramlab.lessons.finetune`: 8-bit optimizer state, LoRA, bytes per parameter.
- :mod:`vramlab.lessons.predict`: ``guess()``, the learner's prediction beside a measurement.
- :mod:`vramlab.lessons.figures`: the words of a figure (titles, axis labels, legends) kept in
  its PNG output's metadata, and the rule the committed notebooks' figures are checked by.

These modules import torch when they are imported (``device`` only when used); importing
this package imports none of them. It does, in IPython, register :func:`.figures.install`:
from then on each matplotlib figure the shell shows as PNG carries its labels (no matplotlib
is imported for that). All sizes are in bytes.
"""

from .figures import install as _install_figure_labels

_install_figure_labels()
