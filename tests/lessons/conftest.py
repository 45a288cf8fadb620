"""Fixtures for the lessons' helpers."""

import pytest


@pytest.fixture
def lang_back():
    """Whatever a test sets with ``set_lang``, detection is back afterwards."""
    from vramlab.i18n import set_lang

    try:
        yield set_lang
    finally:
        set_lang(None)
