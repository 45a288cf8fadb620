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

These modules import torch when they are imported (``device`` only when used); importing
this package imports none of them. All sizes are in bytes.
"""
