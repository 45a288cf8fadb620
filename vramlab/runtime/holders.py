"""What holds tensor memory in a user's namespace, named, and what ``%vram free`` can release.

A name can hold memory in ways its own size does not show:

- a tensor with a ``grad_fn`` (a ``loss``) keeps its autograd graph alive, and the graph keeps
  the tensors its nodes saved for backward (activations, often most of a step's memory): a
  4-byte scalar can hold gigabytes;
- a module holds its parameters, buffers and gradients; an optimizer its state;
- IPython's output cache (``Out[n]``, ``_n``, ``_``, ``__``, ``___``) holds what a cell displayed.

:func:`holders` names each, with the bytes of the unique storages it reaches (bytes; a storage
reached by two names is counted in each); :func:`release` drops what can be dropped without
losing a value: a graph is detached from its tensor (``detach_()``: the value stays, the graph
goes), a cached output is removed from the cache. What is left (modules, optimizer state, plain
tensors) is the user's, and is named, not touched.
"""

from __future__ import annotations

import sys
from typing import Any, Iterable, Optional

from ..model import Consumer

#: the kinds of :class:`~vramlab.model.Consumer` this module names (the display translates them)
TENSOR, TENSORS, MODULE, OPTIMIZER, GRAPH, OUTPUT = (
    "tensor", "tensors", "module", "optimizer state", "autograd graph", "output cache")

_OUTPUT_NAMES = ("_", "__", "___")


def _torch() -> Any:
    return sys.modules.get("torch")


def graph_tensors(t: Any) -> list[Any]:
    """The tensors that ``t``'s autograd graph saved for backward (``_saved_*`` attributes of
    its nodes, and the ``saved_tensors`` of Python functions), leaves excluded: a leaf's
    ``AccumulateGrad`` node holds the parameter, which its module owns."""
    torch = _torch()
    fn = getattr(t, "grad_fn", None)
    if torch is None or fn is None:
        return []
    out: list[Any] = []
    seen: set[int] = set()
    stack = [fn]
    while stack:
        node = stack.pop()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        if type(node).__name__ == "AccumulateGrad":
            continue
        names = [a for a in dir(node) if a.startswith("_saved_")]
        if hasattr(node, "saved_tensors"):
            names.append("saved_tensors")
        for attr in names:
            try:
                value = getattr(node, attr)
            except Exception:  # released by a backward pass already
                continue
            if isinstance(value, torch.Tensor):
                out.append(value)
            elif isinstance(value, (list, tuple)):
                out.extend(v for v in value if isinstance(v, torch.Tensor))
        try:
            stack.extend(n for n, _ in node.next_functions)
        except Exception:
            continue
    return out


def _storages(tensors: Iterable[Any]) -> dict[int, tuple[int, str]]:
    """``{storage key: (bytes, device)}`` of the tensors' unique storages."""
    out: dict[int, tuple[int, str]] = {}
    for t in tensors:
        try:
            st = t.untyped_storage()
            key = st.data_ptr() or id(st)
            if key not in out:
                out[key] = (st.nbytes(), str(t.device))
        except Exception:
            continue
    return out


def _items(obj: Any) -> Optional[list[Any]]:
    """The first 4096 values of a flat container (a dict's values, a list's or tuple's items), or
    ``None`` for anything else."""
    if isinstance(obj, dict):
        return list(obj.values())[:4096]
    if isinstance(obj, (list, tuple)):
        return list(obj[:4096])
    return None


def _tensors_in(obj: Any) -> tuple[str, list[Any]]:
    """The kind of holder ``obj`` is and the tensors it holds directly (no graph)."""
    torch = _torch()
    if torch is None:
        return "", []
    try:
        if isinstance(obj, torch.Tensor):
            return TENSOR, [obj]
        if isinstance(obj, torch.nn.Module):
            params = list(obj.parameters())
            return MODULE, params + list(obj.buffers()) + [p.grad for p in params if p.grad is not None]
        if isinstance(obj, torch.optim.Optimizer):
            return OPTIMIZER, [v for st in obj.state.values() for v in st.values() if isinstance(v, torch.Tensor)]
        vals = _items(obj)
        if vals is None:
            return "", []
        tensors = [v for v in vals if isinstance(v, torch.Tensor)]
        return (TENSORS, tensors) if tensors else ("", [])
    except Exception:
        return "", []


def _graph_roots(obj: Any) -> list[Any]:
    """The tensors of ``obj`` (a tensor or a flat container of them) that carry a graph."""
    torch = _torch()
    if torch is None:
        return []
    items = [obj] if isinstance(obj, torch.Tensor) else _items(obj)
    if items is None:
        return []
    return [t for t in items if isinstance(t, torch.Tensor) and t.grad_fn is not None]


def _user_names(ns: dict[str, Any]) -> list[tuple[str, Any]]:
    return [(k, v) for k, v in list(ns.items()) if not k.startswith("_") and k not in ("In", "Out")]


def _cached_outputs(ns: dict[str, Any]) -> list[tuple[str, Any]]:
    """IPython's output cache entries that hold tensors: ``("Out[n]", value)``."""
    out = ns.get("Out")
    if not isinstance(out, dict):
        return []
    return [(f"Out[{k}]", v) for k, v in list(out.items()) if _tensors_in(v)[1] or _graph_roots(v)]


def holders(ns: Optional[dict[str, Any]]) -> list[Consumer]:
    """Every name in ``ns`` that holds tensors, largest first: one :class:`~vramlab.model.Consumer`
    for what a name holds directly (its kind: tensor, tensors, module, optimizer state), one for
    the autograd graph its tensors keep (bytes that no other name holds directly), and one per
    cached output (``Out[n]``). Bytes of unique storages."""
    if _torch() is None or not ns:
        return []
    named = _user_names(ns) + _cached_outputs(ns)
    direct: dict[str, tuple[str, dict[int, tuple[int, str]]]] = {}
    for name, obj in named:
        kind, tensors = _tensors_in(obj)
        if tensors:
            direct[name] = (OUTPUT if name.startswith("Out[") else kind, _storages(tensors))
    owned = {k for _, st in direct.values() for k in st}
    out = [_consumer(name, kind, st) for name, (kind, st) in direct.items()]
    for name, obj in named:
        if name.startswith("Out["):
            continue
        saved = _storages(s for t in _graph_roots(obj) for s in graph_tensors(t))
        only = {k: v for k, v in saved.items() if k not in owned}
        if only:
            out.append(_consumer(name, GRAPH, only))
    out = [c for c in out if c.nbytes]
    out.sort(key=lambda c: -c.nbytes)
    return out


def _consumer(name: str, kind: str, st: dict[int, tuple[int, str]]) -> Consumer:
    return Consumer(name, sum(n for n, _ in st.values()), ", ".join(sorted({d for _, d in st.values()})), kind)


def release(ns: Optional[dict[str, Any]], shell: Any = None) -> list[Consumer]:
    """Drop what holds memory without holding a value the user keeps: the autograd graphs of the
    namespace's tensors (each tensor is detached in place, so its value stays; a view, which
    cannot be, is rebound to a detached alias of the same storage) and IPython's cached outputs
    that hold tensors (``Out[n]``, ``_n`` and ``_``/``__``/``___`` where they are the same
    object). Returns what was dropped, with the bytes each held (as :func:`holders` counts)."""
    if _torch() is None or not ns:
        return []
    before = {(c.name, c.kind): c for c in holders(ns)}
    dropped: list[Consumer] = []
    for name, obj in _user_names(ns):
        roots = _graph_roots(obj)
        if not roots:
            continue
        for t in roots:
            try:
                t.detach_()
            except RuntimeError:  # a view: rebind a detached alias where the name holds it
                if obj is t:
                    ns[name] = t.detach()
                elif isinstance(obj, list):
                    obj[:] = [x.detach() if x is t else x for x in obj]
                elif isinstance(obj, dict):
                    for k, v in list(obj.items()):
                        if v is t:
                            obj[k] = t.detach()
        c = before.get((name, GRAPH))
        if c is not None:
            dropped.append(c)
    out = ns.get("Out")
    for label, obj in _cached_outputs(ns):
        n = int(label[4:-1])
        if isinstance(out, dict):
            out.pop(n, None)
        if ns.get(f"_{n}") is obj:
            ns.pop(f"_{n}", None)
        hook = getattr(shell, "displayhook", None)
        for short in _OUTPUT_NAMES:
            if ns.get(short) is obj:
                ns[short] = ""
            if hook is not None and getattr(hook, short, None) is obj:
                setattr(hook, short, "")
        c = before.get((label, OUTPUT))
        if c is not None:
            dropped.append(c)
        del obj
    return dropped
