"""One background sampler per kernel: reads :func:`vramlab.snapshot` on a daemon thread.

- The default interval is 0.5 s (:data:`DEFAULT_INTERVAL`); ``start(interval=...)`` changes it.
- Samples go into a bounded ring buffer of :data:`RING_SIZE` entries (2 hours at the
  default rate), so its memory is fixed however long the kernel lives.
- ``start`` and ``stop`` are idempotent; the thread also stops at interpreter exit.
- An exception while sampling is recorded (``last_error``, ``errors``) and the thread
  goes on; after :data:`MAX_CONSECUTIVE_ERRORS` failures in a row it stops cleanly and
  says why (``stopped_reason``). It never prints and never raises into the kernel.
- The thread makes no CUDA runtime call (no ``mem_get_info``, no device switch): during
  CUDA graph capture such a call from another thread can invalidate the capture. It reads
  NVML and the allocators' host-side counters only.
- Listeners (the live monitors) are called on the sampler thread after each sample; a
  listener that raises is recorded the same way and removed.

Markers (cell starts and OOMs) are kept in a second bounded buffer so timelines can
draw them.
"""

from __future__ import annotations

import atexit
import collections
import threading
import time
from typing import Any, Callable, Deque, Optional

from ..facts import MarkerKind, Stop, StopReason
from ..model import DeviceSample, Marker, Sample
from ..units import MIN_INTERVAL, check_interval

__all__ = ["Sample", "Marker", "Sampler", "get_sampler", "existing_sampler", "DEFAULT_INTERVAL", "RING_SIZE"]

DEFAULT_INTERVAL = 0.5  # seconds
RING_SIZE = int(2 * 3600 / DEFAULT_INTERVAL)  # samples: 2 hours at the default rate
MARKER_SIZE = 4096
MAX_CONSECUTIVE_ERRORS = 20


def _background_reading() -> Any:
    """One snapshot fit for a background thread: NVML and the allocators' host-side
    counters, no CUDA runtime call (see :func:`vramlab.reconcile.snapshot`)."""
    from ..reconcile import snapshot  # at first use: %load_ext stays cheap

    return snapshot(cuda_calls=False)


def sample_from(snap: Any) -> Sample:
    """Compress a :class:`~vramlab.model.Snapshot` into a :class:`~vramlab.model.Sample`."""
    h = snap.host
    scope_used = h.cgroup_usage if h.cgroup_usage is not None else h.used
    return Sample(
        time=snap.time, rss=h.process_rss, peak=h.process_peak, host_used=scope_used, available=h.available,
        limit=h.limit, swap_used=h.swap_used, swap_in=h.swap_in, swap_out=h.swap_out,
        devices=tuple(DeviceSample(d.id, d.torch_allocated, d.torch_reserved, d.used, d.total) for d in snap.devices),
    )


class Sampler:
    """The background sampler (use :func:`get_sampler` for the kernel's one).

    A context manager too: ``with Sampler() as s:`` starts it and stops it at the end of
    the block, whatever happens in it.
    """

    def __init__(self, read: Optional[Callable[[], Any]] = None, ring_size: int = RING_SIZE) -> None:
        if read is None:
            read = _background_reading
        self._read = read
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self.interval = DEFAULT_INTERVAL
        self.samples: Deque[Sample] = collections.deque(maxlen=ring_size)
        self.markers: Deque[Marker] = collections.deque(maxlen=MARKER_SIZE)
        self.latest: Any = None  # the latest full Snapshot
        self.errors = 0
        self.last_error: Optional[str] = None
        self.stopped_reason: Optional[Stop] = None
        self._listeners: list[Callable[[Any, "Sampler"], None]] = []
        self.cpu_seconds = 0.0  # CPU time the sampler thread itself used

    # -- control
    @property
    def running(self) -> bool:
        """Whether the thread is alive."""
        t = self._thread
        return t is not None and t.is_alive()

    def start(self, interval: Optional[float] = None) -> None:
        """Start sampling (idempotent); ``interval`` in seconds changes the rate.

        A running thread is told to stop and joined *outside* the lock (the thread takes
        the lock to drop a failing listener), then one new thread starts.
        """
        with self._lock:
            if interval is not None:
                self.interval = check_interval(interval, minimum=MIN_INTERVAL)  # IntervalError (a ValueError)
            old = self._thread if self.running else None
            self._stop.set()  # wake the old thread so the new interval applies now
            stop = threading.Event()
            self._stop = stop
            self.stopped_reason = None
            t = threading.Thread(target=self._run, args=(stop,), name="vramlab-sampler", daemon=True)
            self._thread = t
        if old is not None and old is not threading.current_thread():
            old.join(timeout=5)
        with self._lock:
            if self._thread is t and not stop.is_set():  # not stopped or restarted meanwhile
                t.start()

    def stop(self, reason: StopReason = StopReason.STOPPED) -> None:
        """Stop sampling and wait for the thread to end (idempotent); the join is outside the lock.
        ``reason`` is kept in :attr:`stopped_reason` unless the thread already stopped itself."""
        with self._lock:
            t = self._thread
            self._stop.set()
            self._thread = None
            if self.stopped_reason is None:
                self.stopped_reason = Stop(reason)
        if t is not None and t is not threading.current_thread() and t.is_alive():
            t.join(timeout=5)

    def __enter__(self) -> "Sampler":
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def add_listener(self, fn: Callable[[Any, "Sampler"], None]) -> None:
        """Call ``fn(snapshot, sampler)`` on the sampler thread after each sample."""
        with self._lock:
            if fn not in self._listeners:
                self._listeners.append(fn)

    def remove_listener(self, fn: Callable[[Any, "Sampler"], None]) -> None:
        """Stop calling ``fn``."""
        with self._lock:
            if fn in self._listeners:
                self._listeners.remove(fn)

    def mark(self, kind: MarkerKind, execution_count: Optional[int] = None, when: Optional[float] = None) -> None:
        """Add a timeline marker for the cell ``execution_count`` (cheap; works whether or not the
        thread runs); ``when`` in seconds since the epoch, now by default."""
        self.markers.append(Marker(time.time() if when is None else when, kind, execution_count))

    def sample_now(self, read: Optional[Callable[[], Any]] = None) -> Any:
        """Take one sample on the calling thread and return the Snapshot; ``read`` replaces
        the sampler's reader for this one sample (a full reading, on the main thread)."""
        snap = (read or self._read)()
        self.latest = snap
        self.samples.append(sample_from(snap))
        return snap

    # -- the thread
    def _record(self, where: str, e: BaseException) -> None:
        self.errors += 1
        self.last_error = f"{where}: {type(e).__name__}: {e}"

    def _run(self, stop: threading.Event) -> None:
        consecutive = 0
        c0 = time.thread_time()
        try:
            while not stop.is_set():
                t0 = time.monotonic()
                try:
                    snap = self.sample_now()
                    consecutive = 0
                except Exception as e:  # never let a reading kill the thread or print
                    self._record("sampling", e)
                    consecutive += 1
                    if consecutive >= MAX_CONSECUTIVE_ERRORS:
                        self.stopped_reason = Stop(StopReason.FAILED_READINGS, consecutive, self.last_error or "")
                        break
                    snap = None
                if snap is not None:
                    for fn in list(self._listeners):
                        try:
                            fn(snap, self)
                        except Exception as e:
                            self._record("monitor", e)
                            self.remove_listener(fn)
                self.cpu_seconds = time.thread_time() - c0
                stop.wait(max(self.interval - (time.monotonic() - t0), 0.0))
        except BaseException as e:  # pragma: no cover - interpreter shutdown
            try:
                self._record("sampler", e)
            except BaseException:
                pass
        finally:
            self.cpu_seconds = time.thread_time() - c0
            with self._lock:  # never held while a thread is joined, so this cannot stall
                if self._thread is threading.current_thread():  # ended by a failure, not by start/stop
                    self._thread = None
                ended = self._thread is None
            if ended:  # not restarted (a new thread goes on then): tell monitors the sampler ended
                for fn in list(self._listeners):
                    try:
                        fn(None, self)
                    except Exception:
                        pass


_SAMPLER: Optional[Sampler] = None
_SAMPLER_LOCK = threading.Lock()


def get_sampler() -> Sampler:
    """The kernel's one sampler (created on first use, not started)."""
    global _SAMPLER
    with _SAMPLER_LOCK:
        if _SAMPLER is None:
            _SAMPLER = Sampler()
            atexit.register(_SAMPLER.stop)
        return _SAMPLER


def existing_sampler() -> Optional[Sampler]:
    """The kernel's sampler if one was created, else ``None`` (creates nothing)."""
    return _SAMPLER
