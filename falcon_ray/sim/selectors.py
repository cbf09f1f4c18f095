"""Kubernetes label selectors, field selectors, node selection and taints, as the apiserver reads them.

Contract
--------
* ``parse_label_selector(text)`` -> :class:`LabelSelector` understanding ``a=b``,
  ``a==b``, ``a!=b``, ``a``, ``!a``, ``a in (x,y)``, ``a notin (x,y)`` joined by
  commas; a malformed selector raises ``ValueError`` with the apiserver's
  wording (the API layer answers it 400).
* ``parse_field_selector(text)`` -> :class:`FieldSelector` for ``path=value``,
  ``path==value`` and ``path!=value`` on any dotted field (``metadata.name``,
  ``metadata.namespace``, ``status.phase``, ``spec.nodeName``...).
* ``node_matches(pod, node)`` applies a pod's ``nodeSelector`` and required
  node affinity (``In``, ``NotIn``, ``Exists``, ``DoesNotExist``, ``Gt``, ``Lt``).
* ``tolerates(pod, taint, requests)`` applies tolerations; a pod that requests
  an extended resource tolerates ``NoSchedule`` taints keyed by that resource
  name, as GKE's ExtendedResourceToleration admission arranges.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

_KEY = r"[A-Za-z0-9]([-A-Za-z0-9_./]*[A-Za-z0-9])?"
_VALUE = r"([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?"
_KEY_RE = re.compile(rf"^{_KEY}$")
_VALUE_RE = re.compile(rf"^{_VALUE}$")


@dataclass(frozen=True)
class Requirement:
    key: str
    op: str  # "=", "!=", "in", "notin", "exists", "!"
    values: tuple[str, ...] = ()

    def matches(self, labels: dict[str, str]) -> bool:
        present = self.key in labels
        value = labels.get(self.key)
        if self.op == "=":
            return present and value == self.values[0]
        if self.op == "!=":
            return not present or value != self.values[0]
        if self.op == "in":
            return present and value in self.values
        if self.op == "notin":
            return not present or value not in self.values
        if self.op == "exists":
            return present
        return not present  # "!"


@dataclass(frozen=True)
class LabelSelector:
    requirements: tuple[Requirement, ...] = ()

    def matches(self, labels: dict[str, str] | None) -> bool:
        labels = labels or {}
        return all(r.matches(labels) for r in self.requirements)


def _split_top_level(text: str) -> list[str]:
    """Split on commas that are not inside parentheses."""
    parts, depth, current = [], 0, []
    for ch in text:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
            if depth < 0:
                raise ValueError(f"unable to parse requirement: unbalanced ')' in {text!r}")
        if ch == "," and depth == 0:
            parts.append("".join(current))
            current = []
        else:
            current.append(ch)
    if depth != 0:
        raise ValueError(f"unable to parse requirement: unbalanced '(' in {text!r}")
    parts.append("".join(current))
    return parts


def _check_key(key: str, clause: str) -> str:
    if not _KEY_RE.match(key):
        raise ValueError(f"unable to parse requirement: invalid label key {key!r} in {clause!r}")
    return key


def _check_value(value: str, clause: str) -> str:
    if len(value) > 63 or not _VALUE_RE.match(value):
        raise ValueError(f"unable to parse requirement: invalid label value {value!r} in {clause!r}")
    return value


_SET_RE = re.compile(r"^\s*(?P<key>\S+)\s+(?P<op>in|notin)\s*\((?P<vals>[^()]*)\)\s*$")


def parse_label_selector(text: str | None) -> LabelSelector:
    if text is None or not text.strip():
        return LabelSelector()
    reqs: list[Requirement] = []
    for raw in _split_top_level(text):
        clause = raw.strip()
        if not clause:
            raise ValueError(f"unable to parse requirement: empty clause in {text!r}")
        m = _SET_RE.match(clause)
        if m:
            values = tuple(_check_value(v.strip(), clause) for v in m["vals"].split(",") if v.strip())
            if not values:
                raise ValueError(
                    f"unable to parse requirement: {m['op']} needs at least one value in {clause!r}"
                )
            reqs.append(Requirement(_check_key(m["key"], clause), m["op"], values))
            continue
        if "!=" in clause:
            key, value = clause.split("!=", 1)
            reqs.append(
                Requirement(_check_key(key.strip(), clause), "!=", (_check_value(value.strip(), clause),))
            )
        elif "==" in clause:
            key, value = clause.split("==", 1)
            reqs.append(
                Requirement(_check_key(key.strip(), clause), "=", (_check_value(value.strip(), clause),))
            )
        elif "=" in clause:
            key, value = clause.split("=", 1)
            reqs.append(
                Requirement(_check_key(key.strip(), clause), "=", (_check_value(value.strip(), clause),))
            )
        elif clause.startswith("!"):
            reqs.append(Requirement(_check_key(clause[1:].strip(), clause), "!"))
        else:
            reqs.append(Requirement(_check_key(clause, clause), "exists"))
    return LabelSelector(tuple(reqs))


def get_path(obj: dict[str, Any], dotted: str) -> Any:
    cur: Any = obj
    for part in dotted.split("."):
        if not isinstance(cur, dict):
            return None
        cur = cur.get(part)
    return cur


@dataclass(frozen=True)
class FieldSelector:
    terms: tuple[tuple[str, bool, str], ...] = ()  # (path, equal?, value)

    def matches(self, obj: dict[str, Any]) -> bool:
        for path, equal, value in self.terms:
            actual = get_path(obj, path)
            actual_text = "" if actual is None else str(actual)
            if (actual_text == value) != equal:
                return False
        return True


def parse_field_selector(text: str | None) -> FieldSelector:
    if text is None or not text.strip():
        return FieldSelector()
    terms = []
    for raw in text.split(","):
        clause = raw.strip()
        if "!=" in clause:
            path, value = clause.split("!=", 1)
            equal = False
        elif "==" in clause:
            path, value = clause.split("==", 1)
            equal = True
        elif "=" in clause:
            path, value = clause.split("=", 1)
            equal = True
        else:
            raise ValueError(f"invalid selector: {text!r}; can't understand {clause!r}")
        path = path.strip()
        if not re.match(r"^[A-Za-z][A-Za-z0-9]*(\.[A-Za-z][A-Za-z0-9]*)*$", path):
            raise ValueError(f"invalid field path {path!r} in field selector {text!r}")
        terms.append((path, equal, value.strip()))
    return FieldSelector(tuple(terms))


def _expression_matches(expr: dict[str, Any], labels: dict[str, str]) -> bool:
    key, op, values = expr.get("key"), expr.get("operator"), expr.get("values") or []
    present = key in labels
    if op == "In":
        return present and labels[key] in values
    if op == "NotIn":
        return not present or labels[key] not in values
    if op == "Exists":
        return present
    if op == "DoesNotExist":
        return not present
    if op in ("Gt", "Lt") and present and values:
        try:
            actual, bound = int(labels[key]), int(values[0])
        except ValueError:
            return False
        return actual > bound if op == "Gt" else actual < bound
    return False


def node_matches(pod_spec: dict[str, Any], node: dict[str, Any]) -> bool:
    """True when the node satisfies the pod's nodeSelector and required node affinity."""
    labels = node.get("metadata", {}).get("labels") or {}
    for key, value in (pod_spec.get("nodeSelector") or {}).items():
        if labels.get(key) != value:
            return False
    required = ((pod_spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    ) or {}
    terms = required.get("nodeSelectorTerms") or []
    if terms:
        return any(
            all(_expression_matches(e, labels) for e in (term.get("matchExpressions") or []))
            for term in terms
        )
    return True


def tolerates(pod_spec: dict[str, Any], taint: dict[str, Any], requested: set[str]) -> bool:
    """True when the pod tolerates the taint (PreferNoSchedule never blocks scheduling)."""
    effect = taint.get("effect")
    if effect == "PreferNoSchedule":
        return True
    if effect == "NoSchedule" and taint.get("key") in requested:
        return True  # ExtendedResourceToleration
    for tol in pod_spec.get("tolerations") or []:
        if tol.get("effect") and tol.get("effect") != effect:
            continue
        op = tol.get("operator") or "Equal"
        if op == "Exists":
            if not tol.get("key") or tol.get("key") == taint.get("key"):
                return True
        elif tol.get("key") == taint.get("key") and (tol.get("value") or "") == (taint.get("value") or ""):
            return True
    return False
