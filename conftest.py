"""Repository-wide pytest hooks: mark every nbval notebook cell with ``notebook``.

``python3 -m pytest -m notebook`` runs only the workbook; ``-m "not notebook"`` only the unit tests.
"""

from __future__ import annotations

import pytest


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if str(item.fspath).endswith(".ipynb"):
            item.add_marker(pytest.mark.notebook)
