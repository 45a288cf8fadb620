"""The lessons' prediction cells: they start empty (``None``), and a measuring cell prints the
learner's guess beside the measurement only when one was given.

A guess in words is compared with what happened in every language vramlab speaks: the lesson
names the outcome by its English key, marked for the catalog (``N_("error")``), and a learner of
the Portuguese edition who typed ``"erro"`` is right just as one who typed ``"error"``. Case,
accents, quotes and spaces do not count.

This module imports nothing heavy (no torch).
"""

from __future__ import annotations

import unicodedata
from typing import Any, Callable, Optional, Union

from ..i18n import tr, tr_all

__all__ = ["guess", "given", "matches"]


def _plain(word: str) -> str:
    decomposed = unicodedata.normalize("NFKD", word.casefold())
    letters = "".join(ch for ch in decomposed if not unicodedata.combining(ch))
    return " ".join(letters.strip().strip("\"'“”‘’`").split())


def matches(prediction: Any, answer: str) -> bool:
    """Whether ``prediction`` names ``answer`` (an English key) in any language vramlab speaks.

    >>> matches("Error", "error")
    True
    """
    if not isinstance(prediction, str):
        return False
    return _plain(prediction) in {_plain(w) for w in tr_all(answer).values()}


def guess(prediction: Any, fmt: Union[str, Callable[[Any], str]] = "{}", *,
          none: Optional[str] = None, answer: Optional[str] = None) -> str:
    """``"predicted <prediction>"`` for a print, or ``none`` when the prediction cell was left ``None``.

    ``fmt`` is a format string (``"{:.1f}x"``) or a function of the prediction. With ``answer``
    (the English key of what happened, e.g. ``"error"``), a guess in words is also judged right
    or not (:func:`matches`). The words are in the learner's language (:func:`vramlab.i18n.lang`).

    >>> guess(None)
    'no prediction given'
    >>> guess(2.5, "{:.1f}x")
    'predicted 2.5x'
    >>> guess("erro", answer="error")
    'predicted erro: right'
    """
    if prediction is None:
        return tr("no prediction given") if none is None else none
    text = fmt(prediction) if callable(fmt) else fmt.format(prediction)
    if answer is None:
        return tr("predicted {text}", text=text)
    if matches(prediction, answer):
        return tr("predicted {text}: right", text=text)
    return tr("predicted {text}: it was {answer}", text=text, answer=tr(answer))


def given(prediction: Optional[Any]) -> bool:
    """Whether the learner filled the prediction cell in."""
    return prediction is not None
