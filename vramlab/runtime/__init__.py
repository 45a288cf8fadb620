"""The runtime: what lives as long as the kernel.

- :mod:`vramlab.runtime.sampler`: the one background sampler and its ring buffer of samples;
- :mod:`vramlab.runtime.records`: per-cell records with exact peaks (``%%vram``, auto mode);
- :mod:`vramlab.runtime.history`: the records and samples as one frozen history;
- :mod:`vramlab.runtime.oom`: the OOM predicate and explainer, and ``%vram free``.

The runtime reads through :func:`vramlab.reconcile.snapshot` and never renders: the
display takes what it produces. All sizes are in bytes.
"""
