"""PATCH bodies of the simulated Kubernetes API: JSON merge patch and JSON patch.

Contract
--------
* ``merge_patch(target, patch)``: RFC 7386 (``null`` deletes a key, objects merge,
  everything else replaces). Strategic merge patches are applied with it too, so a
  list in a strategic patch replaces the whole list.
* ``json_patch(doc, ops)``: RFC 6902 (add, remove, replace, test, copy, move) on a
  copy of ``doc``; an operation that does not apply raises a 422 :class:`KubeError`.
Neither function mutates its inputs.
"""

from __future__ import annotations

from typing import Any

from .errors import KubeError
from .kube_store import clone


def merge_patch(target: Any, patch: Any) -> Any:
    if not isinstance(patch, dict):
        return clone(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def _pointer(path: Any) -> list[str]:
    if not isinstance(path, str) or (path and not path.startswith("/")):
        raise KubeError(422, f"invalid JSON pointer {path!r}")
    if path == "":
        return []
    return [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]


def _walk(doc: Any, parts: list[str]) -> Any:
    cur = doc
    for p in parts:
        cur = cur[int(p)] if isinstance(cur, list) else cur[p]
    return cur


def _apply_one(doc: Any, op: dict[str, Any]) -> Any:
    """Apply one operation; returns the (possibly replaced) document."""
    kind, parts = op["op"], _pointer(op["path"])
    if kind == "test":
        if _walk(doc, parts) != op.get("value"):
            raise KubeError(422, f"test operation failed at {op['path']}")
        return doc
    if kind in ("copy", "move"):
        src = _pointer(op.get("from", ""))
        value = clone(_walk(doc, src))
        if kind == "move":
            holder = _walk(doc, src[:-1])
            del holder[int(src[-1]) if isinstance(holder, list) else src[-1]]
        kind, op = "add", {"op": "add", "path": op["path"], "value": value}
    if not parts:
        if kind in ("add", "replace"):
            return clone(op.get("value"))
        raise KubeError(422, "cannot remove the whole document")
    holder, key = _walk(doc, parts[:-1]), parts[-1]
    if isinstance(holder, list):
        index = len(holder) if key == "-" else int(key)
        if kind == "add":
            holder.insert(index, clone(op.get("value")))
        elif kind == "replace":
            holder[index] = clone(op.get("value"))
        elif kind == "remove":
            del holder[index]
        else:
            raise KubeError(422, f"unknown JSON patch operation {kind!r}")
        return doc
    if kind not in ("add", "replace", "remove"):
        raise KubeError(422, f"unknown JSON patch operation {kind!r}")
    if kind != "add" and key not in holder:
        raise KubeError(422, f"{kind} operation does not apply: doc is missing path: {op['path']}")
    if kind == "remove":
        del holder[key]
    else:
        holder[key] = clone(op.get("value"))
    return doc


def json_patch(doc: Any, ops: list[Any]) -> Any:
    doc = clone(doc)
    for op in ops:
        if not isinstance(op, dict) or "op" not in op or "path" not in op:
            raise KubeError(422, "each JSON patch operation needs 'op' and 'path'")
        try:
            doc = _apply_one(doc, op)
        except (KeyError, IndexError, ValueError, TypeError):
            raise KubeError(
                422, f"JSON patch operation {op['op']} does not apply at {op['path']!r}"
            ) from None
    return doc
