"""A snapshot in Prometheus' text exposition format, for node_exporter's textfile collector.

    python -m vramlab --prometheus                          # to stdout
    python -m vramlab --prometheus /var/lib/node_exporter/textfile/vramlab.prom --watch 15

or, from inside the job whose memory it should attribute (so that "tensors" and "torch
cache" are that job's)::

    from vramlab.exposition import write_textfile
    write_textfile("/var/lib/node_exporter/textfile/vramlab-job.prom")

Every value is a gauge in bytes, one series per layer of :class:`vramlab.model.Snapshot`:

- ``vramlab_device_layer_bytes{device, uuid, gpu_name, pid, layer}``: each of the device's
  layers, ``layer`` being its key in :data:`vramlab.model.DEVICE_LAYERS` (``tensors``,
  ``torch_cache``, ``context``, ``unattributed``, ``other_processes``, ``driver_reserved``,
  ``free``, ...); per device they add up to ``vramlab_device_total_bytes`` exactly, as the
  snapshot's layers do;
- ``vramlab_device_total_bytes{device, uuid, gpu_name, pid}``;
- ``vramlab_host_layer_bytes{pid, layer}``: the host's layers, keys of
  :data:`vramlab.model.HOST_LAYERS` (``process``, ``others``, ``out_of_reach``,
  ``available``, ...), which add up to ``vramlab_host_limit_bytes{pid, limit_source}``,
  the effective limit (a cgroup's, or physical RAM);
- ``vramlab_swap_used_bytes{pid}``, ``vramlab_swap_total_bytes{pid}`` (absent when not read);
- ``vramlab_snapshot_timestamp_seconds{pid}``: when the reading was taken (``time.time()``).

``device`` is vramlab's name for it (``cuda:0``, ``nvml:2`` for a GPU this process cannot
see, ``virtual:0``); ``uuid`` and ``gpu_name`` are NVML's (or torch's), empty when unknown.
``pid`` is the process whose snapshot it is ("this process" in the layers); every series
carries it, so that two processes writing two files on one node never publish the same
series, which node_exporter rejects. A device with no total (no reading) has no series.

prometheus_client is an optional extra (``pip install 'vramlab[prometheus]'``); this module
imports it only when a function here is called, and :class:`vramlab._extras.MissingExtra`
says what to install when it is missing. Nothing here opens a port.

Not yet run on a GPU: the figures come from :func:`vramlab.reconcile.snapshot`, whose CUDA
paths are tested against a simulated NVIDIA driver only.
"""

from __future__ import annotations

import os
import re
from typing import Any, Iterator, Mapping, Optional

from ._extras import require_prometheus_client
from .files import write_atomically
from .model import Snapshot

__all__ = ["SnapshotCollector", "exposition_text", "write_textfile", "check_labels"]

_FEATURE = "the Prometheus exposition"
_LABEL_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
_DEVICE_LABELS = ("device", "uuid", "gpu_name", "pid")
_RESERVED_LABELS = frozenset(_DEVICE_LABELS + ("layer", "limit_source"))


def check_labels(labels: Optional[Mapping[str, str]]) -> dict[str, str]:
    """Validate extra constant labels (e.g. ``{"slurm_job_id": "4242"}``) and return them as a dict.

    Raises:
        ValueError: a name that Prometheus does not accept, one starting with ``__``
            (reserved), or one of the labels this module sets itself.
    """
    out: dict[str, str] = {}
    for k, v in (labels or {}).items():
        if not _LABEL_NAME.match(k) or k.startswith("__"):
            raise ValueError(f"not a Prometheus label name: {k!r} (letters, digits and _, not starting "
                             "with a digit or __)")
        if k in _RESERVED_LABELS:
            raise ValueError(f"the label {k!r} is set by vramlab itself; choose another name")
        out[k] = str(v)
    return out


class SnapshotCollector:
    """A prometheus_client collector that yields the gauges of one :class:`Snapshot` (bytes).

    Register it on a ``CollectorRegistry`` of your own (never the global one: the values
    are a snapshot's, not live). ``pid`` defaults to this process's; ``labels`` are added
    to every series (see :func:`check_labels`).
    """

    def __init__(self, snap: Snapshot, *, pid: Optional[int] = None,
                 labels: Optional[Mapping[str, str]] = None) -> None:
        self.snap = snap
        self.pid = os.getpid() if pid is None else int(pid)
        self.labels = check_labels(labels)

    def collect(self) -> Iterator[Any]:
        """The metric families, gauges in bytes (and the snapshot's time in seconds)."""
        require_prometheus_client(_FEATURE)
        from prometheus_client.core import GaugeMetricFamily

        extra_names = list(self.labels)
        extra_values = list(self.labels.values())
        pid = str(self.pid)
        snap = self.snap

        def family(name: str, doc: str, labels: tuple[str, ...], unit: str = "bytes") -> Any:
            return GaugeMetricFamily(name, doc, labels=list(labels) + extra_names, unit=unit)

        layer = family("vramlab_device_layer_bytes",
                       "Device memory by vramlab layer, in bytes; per device the layers add up to "
                       "vramlab_device_total_bytes", _DEVICE_LABELS + ("layer",))
        total = family("vramlab_device_total_bytes", "Device memory total, in bytes", _DEVICE_LABELS)
        for d in snap.devices:
            if d.total is None:
                continue
            dl = [d.id, d.uuid or "", d.name or "", pid]
            total.add_metric(dl + extra_values, float(d.total))
            for key, n in d.layers:
                layer.add_metric(dl + [key] + extra_values, float(n))
        yield layer
        yield total

        h = snap.host
        host = family("vramlab_host_layer_bytes",
                      "Host memory by vramlab layer against the effective limit, in bytes; the layers add "
                      "up to vramlab_host_limit_bytes. The 'process' layer is the process of label pid: "
                      "for python -m vramlab --prometheus, the exporter itself", ("pid", "layer"))
        for key, n in h.layers:
            host.add_metric([pid, key] + extra_values, float(n))
        yield host
        limit = family("vramlab_host_limit_bytes",
                       "The effective host memory limit (a cgroup's, or physical RAM), in bytes",
                       ("pid", "limit_source"))
        limit.add_metric([pid, h.limit_source] + extra_values, float(h.limit))
        yield limit
        for name, value, doc in (("vramlab_swap_used_bytes", h.swap_used, "Swap in use, in bytes"),
                                 ("vramlab_swap_total_bytes", h.swap_total, "Swap space, in bytes")):
            if value is not None:
                g = family(name, doc, ("pid",))
                g.add_metric([pid] + extra_values, float(value))
                yield g
        ts = family("vramlab_snapshot_timestamp_seconds", "When the snapshot was read, in seconds since the epoch",
                    ("pid",), unit="seconds")
        ts.add_metric([pid] + extra_values, float(snap.time))
        yield ts


def _registry(snap: Snapshot, pid: Optional[int], labels: Optional[Mapping[str, str]]) -> Any:
    prometheus_client = require_prometheus_client(_FEATURE)
    registry = prometheus_client.CollectorRegistry(auto_describe=False)
    registry.register(SnapshotCollector(snap, pid=pid, labels=labels))
    return registry


def exposition_text(snap: Snapshot, *, pid: Optional[int] = None,
                    labels: Optional[Mapping[str, str]] = None) -> str:
    """``snap`` in Prometheus' text exposition format (version 0.0.4); values in bytes.

    Raises:
        MissingExtra: prometheus_client is not installed.
        ValueError: a bad extra label (see :func:`check_labels`).
    """
    prometheus_client = require_prometheus_client(_FEATURE)
    text: str = prometheus_client.generate_latest(_registry(snap, pid, labels)).decode("utf-8")
    return text


def write_textfile(path: str | os.PathLike[str], snap: Optional[Snapshot] = None, *, pid: Optional[int] = None,
                   labels: Optional[Mapping[str, str]] = None) -> str:
    """Write ``snap`` (default: a :func:`vramlab.reconcile.snapshot` read now) to ``path``, atomically.

    The text goes to a new temporary file beside ``path``, with a name no one can guess
    (``.<name>.<pid>.<random>.tmp``, which the textfile collector ignores, since it reads only
    ``*.prom``; one left by a killed writer is removed at the next write: :mod:`vramlab.files`), created exclusively (``O_EXCL``: a file or symbolic link planted there in
    advance is never written through); it is flushed to disk, given the mode a new file gets
    under the umask (``0o666 & ~umask``, so a collector running as another user can read it),
    then renamed over ``path`` (``rename(2)``, atomic within one filesystem): a reader sees
    the old file or the new one, never half of one. The temporary file is removed when any
    step fails or is interrupted. Returns ``path`` as a string.

    Raises:
        MissingExtra: prometheus_client is not installed.
        OSError: ``path`` cannot be written.
    """
    prometheus_client = require_prometheus_client(_FEATURE)
    if snap is None:
        from .reconcile import snapshot

        snap = snapshot()
    p = os.fspath(path)
    data: bytes = prometheus_client.generate_latest(_registry(snap, pid, labels))
    write_atomically(p, data)
    return p
