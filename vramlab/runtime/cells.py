"""What makes two runs "the same cell", and the batch size a run used.

A cell record keeps two things that let the OOM explainer compare runs of one cell
(:func:`vramlab.runtime.oom.explain_oom`):

- :func:`cell_key`: a short digest of the cell's code in which the value given to a batch
  variable (``batch_size = 512``, ``bs=512`` as a keyword argument) is left out, so the same
  code run at another batch size has the same key; comments, blank lines and spacing do
  not change it either;
- :func:`batch_size_in`: the batch variable's value in the user's namespace (the first of
  :data:`BATCH_NAMES` bound to a positive ``int``), read when the cell has run.

Nothing here imports IPython: the IPython layer gives the code (after IPython's own
transformations, so a line magic is a call) and the namespace.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import re
from typing import Any, Mapping, Optional

__all__ = ["BATCH_NAMES", "batch_size_in", "cell_key"]

#: the names a batch size goes by, in the order they are looked up
BATCH_NAMES: tuple[str, ...] = ("batch_size", "BATCH_SIZE", "bs", "batch")

_PLACEHOLDER = "__vramlab_batch__"
# for code that does not parse: ``batch_size = 512`` / ``bs=512`` with a literal number
_LITERAL = re.compile(r"\b(" + "|".join(BATCH_NAMES) + r")(\s*=\s*)[0-9_]+\b")


def batch_size_in(ns: Optional[Mapping[str, Any]]) -> Optional[int]:
    """The batch size bound in ``ns``: the first of :data:`BATCH_NAMES` whose value is a
    positive ``int`` (not a ``bool``), or ``None``."""
    for name in BATCH_NAMES:
        v = (ns or {}).get(name)
        if isinstance(v, int) and not isinstance(v, bool) and v > 0:
            return v
    return None


class _LeaveOutTheBatch(ast.NodeTransformer):
    """Replaces what is assigned to a batch variable, or passed as a batch keyword, by one name."""

    @staticmethod
    def _placeholder(node: ast.AST) -> ast.Name:
        return ast.copy_location(ast.Name(id=_PLACEHOLDER, ctx=ast.Load()), node)

    def visit_Assign(self, node: ast.Assign) -> ast.AST:
        self.generic_visit(node)
        if any(isinstance(t, ast.Name) and t.id in BATCH_NAMES for t in node.targets):
            node.value = self._placeholder(node.value)
        return node

    def visit_AnnAssign(self, node: ast.AnnAssign) -> ast.AST:
        self.generic_visit(node)
        if isinstance(node.target, ast.Name) and node.target.id in BATCH_NAMES and node.value is not None:
            node.value = self._placeholder(node.value)
        return node

    def visit_keyword(self, node: ast.keyword) -> ast.AST:
        self.generic_visit(node)
        if node.arg in BATCH_NAMES:
            node.value = self._placeholder(node.value)
        return node


@functools.lru_cache(maxsize=256)
def cell_key(code: Optional[str]) -> Optional[str]:
    """A digest (16 hex digits) of a cell's code with the batch size left out; ``None`` for
    empty code.

    Two cells have the same key when their code has the same syntax tree once the values
    assigned to a batch variable (``batch_size = 512`` and ``batch_size = 4096``) or passed
    as a batch keyword (``DataLoader(ds, batch_size=64)``) are left out: comments, blank
    lines and spacing do not count. Code that does not parse (IPython syntax not yet
    transformed) is compared line by line, stripped, with literal batch numbers left out.
    The last 256 keys are kept: a cell run again costs a lookup.
    """
    if code is None or not code.strip():
        return None
    try:
        tree = _LeaveOutTheBatch().visit(ast.parse(code))
        text = "ast:" + ast.dump(tree, include_attributes=False)
    except (SyntaxError, ValueError, RecursionError):
        lines = (_LITERAL.sub(r"\1\2" + _PLACEHOLDER, line.strip()) for line in code.splitlines())
        text = "lines:" + "\n".join(line for line in lines if line and not line.startswith("#"))
    return hashlib.sha1(text.encode("utf-8", "surrogatepass")).hexdigest()[:16]
