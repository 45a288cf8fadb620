"""The language of what vramlab prints for a learner: English, or Brazilian Portuguese.

Everything vramlab prints or draws for a person goes through :func:`tr`: the ``%vram`` tables and
the monitor, the per-cell records, the out-of-memory advice, the lessons' helpers, and the
lessons' own printed lines and plot labels (their code cells call ``tr`` too). What a program
reads (``python -m vramlab --json``, ``--prometheus``) stays English. The catalog is gettext's
(``vramlab/locale/pt_BR/LC_MESSAGES/vramlab.po``, filled by ``tools/extract_runtime_strings.py``
and compiled to the ``.mo`` beside it with polib by ``python tools/i18n.py compile``), read with
the standard library's :mod:`gettext`.

:func:`lang` decides, in this order:

1. :func:`set_lang`, when it was called;
2. the environment variable ``VRAMLAB_LANG`` (``en`` or ``pt-BR``);
3. the notebook being run, when it lies in a ``pt-BR`` folder: Jupyter Server gives the
   kernel the notebook's path in ``JPY_SESSION_NAME``, and nbclient and nbval start the kernel
   in the notebook's folder, so the Portuguese edition of the workbook (``notebooks/pt-BR/``)
   speaks Portuguese with the same code cells as the English one;
4. English.

Numbers and units are never translated. This module imports only the standard library.
"""

from __future__ import annotations

import gettext as _gettext
import os
from functools import lru_cache
from pathlib import Path
from typing import Optional

__all__ = ["LANGS", "N_", "lang", "set_lang", "tr", "tr_all"]

#: The languages vramlab speaks: English and Brazilian Portuguese.
LANGS = ("en", "pt-BR")

_LOCALE = Path(__file__).resolve().parent / "locale"
_forced: Optional[str] = None


def _norm(code: Optional[str]) -> Optional[str]:
    if not code:
        return None
    c = code.strip().replace("_", "-").lower()
    if c in ("en", "en-us", "en-gb", "c", "posix"):
        return "en"
    if c in ("pt-br", "pt"):
        return "pt-BR"
    return None


def set_lang(code: Optional[str]) -> None:
    """Speak ``code`` (``"en"`` or ``"pt-BR"``) from now on; ``None`` goes back to detecting it.

    Raises:
        ValueError: for a language vramlab does not speak.
    """
    global _forced
    if code is None:
        _forced = None
        return
    n = _norm(code)
    if n is None:
        raise ValueError(f"vramlab speaks {' and '.join(LANGS)}; got {code!r}")
    _forced = n


@lru_cache(maxsize=64)
def _in_pt_br_folder(path: str) -> bool:
    parts = Path(path).parts
    return any(p.lower() == "pt-br" for p in parts)


def lang() -> str:
    """The language to speak now: ``"en"`` or ``"pt-BR"`` (see the module's docs for the order)."""
    if _forced:
        return _forced
    env = _norm(os.environ.get("VRAMLAB_LANG"))
    if env:
        return env
    session = os.environ.get("JPY_SESSION_NAME", "")
    if session:
        return "pt-BR" if _in_pt_br_folder(os.path.dirname(session)) else "en"
    try:
        cwd = os.getcwd()
    except OSError:
        return "en"
    return "pt-BR" if os.path.basename(cwd.rstrip(os.sep)).lower() == "pt-br" else "en"


@lru_cache(maxsize=None)
def _catalog(code: str) -> _gettext.NullTranslations:
    return _gettext.translation("vramlab", localedir=str(_LOCALE), languages=[code.replace("-", "_")], fallback=True)


def tr(message: str, **fields: object) -> str:
    """``message`` in the current language, with ``fields`` put in (``str.format``).

    The English text is the key; one that the catalog lacks comes back in English.
    """
    code = lang()
    text = message if code == "en" else _catalog(code).gettext(message)
    return text.format(**fields) if fields else text


def N_(message: str) -> str:
    """``message`` unchanged, marked for the catalog (gettext's ``gettext_noop``): for an English
    key that is translated later, or compared in every language (:func:`tr_all`)."""
    return message


def tr_all(message: str) -> dict[str, str]:
    """``message`` in every language vramlab speaks: ``{"en": ..., "pt-BR": ...}``."""
    return {code: message if code == "en" else _catalog(code).gettext(message) for code in LANGS}
