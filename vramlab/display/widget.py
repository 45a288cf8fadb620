"""The live monitor: an ipywidgets box fed by the shared sampler.

The widget's root carries the CSS class ``vramlab-monitor``. It holds three ``HTML``
children: a status line, the stacked bars (each GPU, the host against its effective
limit, swap with its page-in/out rate) and an inline-SVG sparkline of the last minutes
with cell and OOM markers. No custom JavaScript is needed.

Update rules: the sampler thread calls the monitor after each sample; the monitor
re-renders at most :data:`MAX_UPDATES_PER_S` times a second and assigns a child's
``value`` only when the text changed (so an idle machine sends nothing). Each value
stays under 8 KB. ``repr`` is short and stable; the display bundle also carries a
static ``text/html`` copy of the latest reading (``vramlab-monitor-static``).

Saved notebooks: a viewer without a live kernel cannot draw the widget. nbconvert shows
the static copy when the notebook holds no widget state (as JupyterLab saves it by
default), but picks the widget whenever the state was saved (as nbclient and
``nbconvert --execute`` do), and that needs the widget scripts from a CDN: offline, on
GitHub and anywhere scripts do not run, the output is blank. So, in a kernel, the monitor
is displayed with a display id and, when the sampler stops, every output of it is
replaced (``update_display``) by the static copy of its last reading, which then is what
the notebook saves; when the sampler starts again the live widget comes back.
"""

from __future__ import annotations

import html as _html
import threading
import time
import uuid
from typing import Any, Optional

import ipywidgets as widgets

from ..facts import StopReason
from ..i18n import tr
from .bars import bars_html, unreadable_status
from .sparkline import WINDOW_S, SampleWindow, copy_ring, sparkline_svg
from .text import snapshot_text
from .words import stop_text

__all__ = ["Monitor", "TrialProgress", "trial_progress", "MAX_UPDATES_PER_S"]

MAX_UPDATES_PER_S = 4


class Monitor(widgets.VBox):
    """The live memory monitor (see module docs). Create with :func:`vramlab.watch`."""

    def __init__(self, sampler: Any, window_s: float = WINDOW_S) -> None:
        self._status = widgets.HTML(value="")
        self._bars = widgets.HTML(value="")
        self._spark = widgets.HTML(value="")
        super().__init__(children=[self._status, self._bars, self._spark])
        self.add_class("vramlab-monitor")
        self._sampler = sampler
        self._window_s = window_s
        self._window = SampleWindow(window_s)  # the sparkline's samples, kept as they come
        self._lock = threading.RLock()
        self._last_push = 0.0
        self._last_spark_key: Any = None
        self._error_shown: Optional[str] = None
        self._display_id: Optional[str] = None  # set when displayed in a kernel (see module docs)
        self._shown = "live"  # what the outputs of this monitor show: "live" or "static"
        self.updates = 0  # renders pushed (for tests and benchmarks)
        self._closed = False
        self._latest: Any = sampler.latest
        sampler.add_listener(self._on_sample)
        if sampler.latest is not None:
            self._render(sampler.latest, force=True)

    # -- sampler callback (sampler thread)
    def _on_sample(self, snap: Any, sampler: Any) -> None:
        if snap is None:
            self._set(self._status, self._status_html(stopped=True))
            self._switch_view("static")
            return
        self._latest = snap
        if self._shown != "live":
            self._switch_view("live")
        now = time.monotonic()
        if now - self._last_push < 1.0 / MAX_UPDATES_PER_S - 1e-3:
            return
        self._render(snap)

    def _status_html(self, stopped: bool = False) -> str:
        s = self._sampler
        state = _html.escape(tr("stopped") if stopped or not s.running
                             else tr("sampling every {interval} s", interval=f"{s.interval:g}"))
        if stopped and s.stopped_reason is not None and s.stopped_reason.reason is not StopReason.STOPPED:
            state += f" ({_html.escape(stop_text(s.stopped_reason))})"
        text = f'<span style="font-size:12px;opacity:0.85"><b>vramlab</b> · {state}</span>'
        text += unreadable_status(self._snap())
        if s.last_error:
            self._error_shown = self._error_shown or s.last_error
            text += (f'<br><span style="font-size:12px;color:#e15759">'
                     f"{_html.escape(tr('sampling error: {error}', error=self._error_shown))}</span>")
        return text

    def _swap_rate(self) -> Optional[tuple[float, float]]:
        smp = self._sampler.samples
        if len(smp) < 2:
            return None
        a, b = smp[-2], smp[-1]
        dt = b.time - a.time
        if dt <= 0 or a.swap_in is None or b.swap_in is None or a.swap_out is None or b.swap_out is None:
            return None
        return (max(b.swap_in - a.swap_in, 0) / dt, max(b.swap_out - a.swap_out, 0) / dt)

    def _render(self, snap: Any, force: bool = False) -> None:
        with self._lock:
            self._last_push = time.monotonic()
            pushed = self._set(self._status, self._status_html())
            pushed |= self._set(self._bars, bars_html(snap, self._swap_rate()))
            self._window.update(self._sampler.samples, snap.time)
            win = self._window.samples
            markers = copy_ring(self._sampler.markers)
            # redraw the timeline when a reading or marker changed, or every 5 s as the window slides
            key = (_spark_key(win[-1] if win else None), len(markers), int(snap.time // 5))
            if force or key != self._last_spark_key:
                self._last_spark_key = key
                pushed |= self._set(self._spark, sparkline_svg(self._window, markers, snap.time, self._window_s))
            if pushed:
                self.updates += 1

    @staticmethod
    def _set(w: Any, value: str) -> bool:
        if w.value != value:
            w.value = value
            return True
        return False

    # -- lifecycle
    @property
    def sampler(self) -> Any:
        """The sampler this monitor listens to."""
        return self._sampler

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called (the widget's comm is gone)."""
        return self._closed

    def close(self) -> None:
        """Stop listening to the sampler and close the widget."""
        self._closed = True
        self._sampler.remove_listener(self._on_sample)
        for child in (self._status, self._bars, self._spark):
            child.close()
        super().close()

    def refresh(self) -> None:
        """Render the latest reading now (main thread)."""
        if self._sampler.latest is not None:
            self._render(self._sampler.latest, force=True)

    def __repr__(self) -> str:
        return "<vramlab monitor>"

    def _repr_mimebundle_(self, **kwargs: Any) -> Optional[dict[str, Any]]:
        data = super()._repr_mimebundle_(**kwargs) or {}
        data["text/plain"] = tr("<vramlab monitor>")
        if self._snap() is not None:
            data["text/html"] = self.static_html()
        return data

    def _snap(self) -> Any:
        return self._sampler.latest if self._sampler.latest is not None else self._latest

    def static_html(self, stopped: bool = False) -> str:
        """A self-contained copy of the monitor's latest reading (class ``vramlab-monitor-static``)."""
        snap = self._snap()
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(snap.time))
        if stopped:
            last = _html.escape(tr("last reading {when}", when=when))
            status = self._status_html(stopped=True).replace("</span>", f" · {last}</span>", 1)
        else:
            copy = _html.escape(tr("static copy of the live monitor, reading of {when}", when=when))
            status = f'<span style="font-size:12px;opacity:0.85"><b>vramlab</b> · {copy}</span>'
        with self._lock:
            self._window.update(self._sampler.samples, snap.time)
            spark = sparkline_svg(self._window, copy_ring(self._sampler.markers), snap.time, self._window_s)
        return (f'<div class="vramlab-monitor-static" style="color:inherit;padding:2px 0">{status}'
                f"{bars_html(snap, self._swap_rate())}{spark}</div>")

    def _ipython_display_(self) -> None:
        """Display the widget with a display id, so that a stop can leave the static copy in its place."""
        from IPython.display import display

        if self._display_id is None and _in_kernel():
            self._display_id = f"vramlab-monitor-{uuid.uuid4().hex}"
        # shown again while stopped: the static copy, like its other outputs
        bundle = self._frozen_bundle() if self._shown == "static" else self._repr_mimebundle_()
        if self._display_id is None:
            display(bundle, raw=True)
        else:
            display(bundle, raw=True, display_id=self._display_id)

    def _switch_view(self, to: str) -> None:
        """Make every output of this monitor show the live widget or (``"static"``) the frozen copy."""
        if self._display_id is None or self._shown == to or (to == "static" and self._snap() is None):
            return
        try:
            from IPython.display import update_display

            bundle = self._frozen_bundle() if to == "static" else self._repr_mimebundle_()
            update_display(bundle, raw=True, display_id=self._display_id)
            self._shown = to
        except Exception:  # never raise into the sampler thread (or at interpreter exit)
            pass

    def _frozen_bundle(self) -> dict[str, str]:
        """What a stopped monitor's outputs hold: its last reading, with no widget."""
        return {"text/plain": tr("<vramlab monitor: stopped>") + "\n" + snapshot_text(self._snap()),
                "text/html": self.static_html(stopped=True)}


def _in_kernel() -> bool:
    """Whether this runs in a Jupyter kernel (where display ids reach a frontend)."""
    try:
        from IPython import get_ipython

        ip = get_ipython()
    except Exception:
        return False
    return ip is not None and getattr(ip, "kernel", None) is not None


def _spark_key(s: Any) -> Any:
    """What of the newest sample the sparkline shows, to the MiB (``None`` for no sample)."""
    if s is None:
        return None
    mib = 1 << 20
    return (s.rss // mib, s.host_used // mib, tuple((d.id, (d.used or 0) // mib) for d in s.devices))


class TrialProgress:
    """A search's progress in a notebook: a bar (trials run against trials run plus those left at
    most) and the last trial's line (:func:`vramlab.display.text.trial_line`). Never raises: a
    frontend that cannot show it leaves the search as it was."""

    def __init__(self) -> None:
        from IPython.display import display

        self.bar = widgets.IntProgress(value=0, min=0, max=1, layout=widgets.Layout(width="16em"))
        self.label = widgets.HTML()
        display(widgets.HBox([self.bar, self.label]))

    def update(self, line: str, done: int, left: int) -> None:
        """``done`` trials run, at most ``left`` to go."""
        try:
            self.bar.max = max(done + left, 1)
            self.bar.value = done
            self.label.value = _html.escape(line)
        except Exception:
            pass

    def close(self, line: str) -> None:
        try:
            self.bar.max = max(self.bar.value, 1)
            self.bar.value = self.bar.max
            self.bar.bar_style = "success"
            self.label.value = _html.escape(line)
        except Exception:
            pass


def trial_progress() -> Optional[TrialProgress]:
    """A :class:`TrialProgress` shown in this notebook, or ``None`` outside a Jupyter kernel."""
    if not _in_kernel():
        return None
    try:
        return TrialProgress()
    except Exception:
        return None
