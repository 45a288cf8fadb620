"""The lessons' prediction cells: they start empty (``None``), and a measuring cell prints the
learner's guess beside the measurement only when one was given.

This module imports nothing heavy (no torch).
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Union

from ..i18n import tr

__all__ = ["guess", "given"]


def guess(prediction: Any, fmt: Union[str, Callable[[Any], str]] = "{}", *,
          none: Optional[str] = None) -> str:
    """``"predicted <prediction>"`` for a print, or ``none`` when the prediction cell was left ``None``.

    ``fmt`` is a format string (``"{:.1f}x"``) or a function of the prediction. The words are
    in the learner's language (:func:`vramlab.i18n.lang`).

    >>> guess(None)
    'no prediction given'
    >>> guess(2.5, "{:.1f}x")
    'predicted 2.5x'
    """
    if prediction is None:
        return tr("no prediction given") if none is None else none
    text = fmt(prediction) if callable(fmt) else fmt.format(prediction)
    return tr("predicted {text}", text=text)


def given(prediction: Optional[Any]) -> bool:
    """Whether the learner filled the prediction cell in."""
    return prediction is not None
