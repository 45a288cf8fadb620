"""The words of a figure, kept beside its picture: what the workbook's tests read.

A figure in a committed notebook is a PNG, and its title, axis labels and legend are pixels.
Importing :mod:`vramlab.lessons` in IPython calls :func:`install`: from then on every
matplotlib figure the shell shows as PNG carries :func:`figure_labels` in its output's
metadata, under ``image/png`` → :data:`KEY`, so a test can check without reading pixels
that no committed figure has an empty label (:func:`label_problems`), and that a translated
edition's figures speak its language.

The labels of a figure, a JSON-serialisable dict::

    {"suptitle": str, "supxlabel": str, "supylabel": str,
     "legend": [str, ...],                 # the texts of the figure's own legends
     "axes": [{"title": str,               # the axes' left, centre and right titles, joined by a space
               "xlabel": str, "ylabel": str,
               "legend": [str, ...], "legend_title": str,
               "visible": bool,            # Axes.get_visible()
               "axis_on": bool,            # False after ax.axis("off")
               "has_data": bool,           # Axes.has_data(): lines, patches, collections or images
               "colorbar": bool,           # the axes of a colorbar
               "xcategorical": bool,       # the ticks name categories: bar(names, ...),
               "ycategorical": bool,       #   or set_xticks(positions, words)
               "sharex": [int, ...],       # the other axes (indices into "axes") that share
               "sharey": [int, ...]}, ...]}  #   this one's x (y) axis

Nothing here imports matplotlib, torch or IPython: a figure is read through its methods, and
:func:`install` hands :func:`figure_labels` to :mod:`vramlab.ipython.figures` only when IPython
is running.
"""

from __future__ import annotations

from typing import Any, Mapping, Optional

__all__ = ["KEY", "figure_labels", "label_problems", "install"]

#: the key of a figure's labels in its ``image/png`` output metadata
KEY = "vramlab/labels"


def _text(artist: Any) -> str:
    """The text of a ``Text`` artist, or ``""`` for none."""
    if artist is None:
        return ""
    return str(artist.get_text())


def _fig_text(fig: Any, name: str) -> str:
    getter = getattr(fig, f"get_{name}", None)  # matplotlib >= 3.8
    if callable(getter):
        return str(getter())
    return _text(getattr(fig, f"_{name}", None))


def _is_number(s: str) -> bool:
    if s.startswith("$") and s.endswith("$"):  # mathtext: 10^{2} on a log axis
        return True
    try:
        float(s.replace("\N{MINUS SIGN}", "-").replace(",", ""))
    except ValueError:
        return False
    return True


def _categorical(axis: Any) -> bool:
    """Whether an axis's ticks name categories rather than numbers: the ticks of ``bar(names, ...)``
    (a category axis), or ticks placed by hand with words (``set_xticks(positions, words)``)."""
    fmt, locator = axis.get_major_formatter(), axis.get_major_locator()
    if type(fmt).__name__ == "StrCategoryFormatter":
        return True
    if type(locator).__name__ != "FixedLocator" and type(fmt).__name__ != "FixedFormatter":
        return False
    try:
        texts = [str(t).strip() for t in fmt.format_ticks(list(locator()))]
    except Exception:
        return False
    return any(t and not _is_number(t) for t in texts)


def _siblings(grouper: Any, ax: Any, index: dict[int, int]) -> list[int]:
    return sorted(index[id(a)] for a in grouper.get_siblings(ax) if a is not ax and id(a) in index)


def _legend_texts(legend: Any) -> list[str]:
    return [] if legend is None else [str(t.get_text()) for t in legend.get_texts()]


def _axes_labels(ax: Any, index: dict[int, int]) -> dict[str, Any]:
    legend = ax.get_legend()
    return {
        "title": " ".join(t for t in (ax.get_title(loc) for loc in ("left", "center", "right")) if t.strip()),
        "xlabel": str(ax.get_xlabel()),
        "ylabel": str(ax.get_ylabel()),
        "legend": _legend_texts(legend),
        "legend_title": "" if legend is None else _text(legend.get_title()),
        "visible": bool(ax.get_visible()),
        "axis_on": bool(getattr(ax, "axison", True)),
        "has_data": bool(ax.has_data()),
        "colorbar": getattr(ax, "_colorbar", None) is not None,
        "xcategorical": _categorical(ax.xaxis),
        "ycategorical": _categorical(ax.yaxis),
        "sharex": _siblings(ax.get_shared_x_axes(), ax, index),
        "sharey": _siblings(ax.get_shared_y_axes(), ax, index),
    }


def figure_labels(fig: Any) -> dict[str, Any]:
    """The words of a matplotlib figure: its titles, axis labels and legends (the schema above)."""
    axes = list(fig.axes)
    index = {id(ax): i for i, ax in enumerate(axes)}
    return {
        "suptitle": _fig_text(fig, "suptitle"),
        "supxlabel": _fig_text(fig, "supxlabel"),
        "supylabel": _fig_text(fig, "supylabel"),
        "legend": [t for leg in getattr(fig, "legends", ()) for t in _legend_texts(leg)],
        "axes": [_axes_labels(ax, index) for ax in axes],
    }


def label_problems(labels: Mapping[str, Any]) -> list[str]:
    """What a figure's labels (:func:`figure_labels`) lack; empty when nothing.

    The rule, for every axes that shows something (visible, axis on, with data):

    - both axes are labelled: an axis is labelled by its own label, by the label of an axes
      of the figure that shares it (``sharey=True`` labels the row once), or by the
      figure's ``supxlabel``/``supylabel``;
    - except that an axis whose ticks name categories (the bars' names) may go without a
      label when the axes has a title (its own, or the figure's ``suptitle``) that says
      what the categories are; the other axis still needs its label;
    - a colorbar needs its one label;
    - no legend entry is blank.

    Axes turned off (``ax.axis("off")``), hidden or empty are exempt; a figure as a whole
    needs at least one title or label somewhere.
    """
    axes: list[Mapping[str, Any]] = list(labels.get("axes", []))

    def has(s: Any) -> bool:
        return isinstance(s, str) and bool(s.strip())

    problems: list[str] = []
    suptitle = labels.get("suptitle", "")
    if not any(has(labels.get(k)) for k in ("suptitle", "supxlabel", "supylabel")) and not any(
            has(a.get(k)) for a in axes for k in ("title", "xlabel", "ylabel")):
        problems.append("the figure has no title and no axis label")
    for leg in labels.get("legend", []):
        if not has(leg):
            problems.append("the figure's legend has a blank entry")
    for i, ax in enumerate(axes):
        if not (ax.get("visible", True) and ax.get("axis_on", True) and ax.get("has_data", True)):
            continue
        where = f"axes {i}" + (f" ({ax['title']!r})" if has(ax.get("title")) else "")
        if any(not has(t) for t in ax.get("legend", [])):
            problems.append(f"{where}: a legend entry is blank")
        if ax.get("colorbar"):
            if not (has(ax.get("xlabel")) or has(ax.get("ylabel"))):
                problems.append(f"{where}: the colorbar has no label")
            continue

        def labelled(axis: str, ax: Mapping[str, Any] = ax) -> bool:
            if has(ax.get(f"{axis}label")) or has(labels.get(f"sup{axis}label")):
                return True
            shared: list[int] = list(ax.get(f"share{axis}", []))
            return any(0 <= j < len(axes) and has(axes[j].get(f"{axis}label")) for j in shared)

        titled = has(ax.get("title")) or has(suptitle)
        for axis, other in (("x", "y"), ("y", "x")):
            if labelled(axis):
                continue
            if ax.get(f"{axis}categorical") and titled and labelled(other):
                continue
            if ax.get(f"{axis}categorical") and not titled:
                problems.append(f"{where}: no {axis} label, and no title to say what its categories are")
            else:
                problems.append(f"{where}: no {axis} label")
    return problems


def install(shell: Optional[Any] = None) -> bool:
    """Have every figure the running IPython shell (or ``shell``) shows as PNG carry its labels.

    Called by ``import vramlab.lessons``; calling it again changes nothing. Outside IPython
    it does nothing and returns False; it never raises.
    """
    try:
        from ..ipython.figures import add_figure_metadata

        return add_figure_metadata(KEY, figure_labels, shell)
    except Exception:
        return False
