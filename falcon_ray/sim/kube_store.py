"""In-memory object store of one simulated Kubernetes cluster: resourceVersions, history, watchers.

Contract
--------
* One store per cluster; one integer resourceVersion counter for all kinds in
  it. Every create, change and delete takes the next value and appends one
  :class:`WatchEvent` (a frozen snapshot of the object, plus the previous
  snapshot for changes) to a bounded history.
* The store owns server-side metadata: ``uid``, ``resourceVersion``,
  ``creationTimestamp``, ``generation`` (bumped when ``spec`` changes) and the
  namespace of namespaced objects.
* ``events_since(rv)`` returns the events after ``rv`` or ``None`` when ``rv``
  is older than the history window (the caller answers 410 Expired).
* Watchers subscribe with :meth:`subscribe`; events are pushed to their queues
  synchronously inside the mutation, so "snapshot history, then subscribe" in
  one loop step never loses or repeats an event.
* ``labelled(plural, key, values)``: the keys of the objects carrying a label, kept
  at every write (a superset for a selector that requires that label: the caller
  still applies the selector, in key order).
* Listeners (the workload controllers) get every event synchronously too; they
  must only record work and schedule it, never mutate the store re-entrantly.
* All methods run on the simulator's event loop thread; nothing here locks.
  Objects handed out by ``get``/``list`` are the stored dicts: callers that
  change them must go through ``update``/``mutate``.
* What is stored is JSON-shaped, as :func:`clone` returns it (dicts with str
  keys, lists, str, int, float, bool, None; no tuple): ``create`` and ``update``
  take such values and ``mutate``'s ``change`` keeps them so. The store copies
  them with :func:`copy_out` (for the events' snapshots and ``mutate``'s and
  ``replace``'s working copies) and converts nothing.
"""

from __future__ import annotations

import asyncio
import json
import marshal
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from .errors import KubeError


@dataclass(frozen=True)
class ResourceKind:
    plural: str
    kind: str
    api_version: str  # "v1" or "batch/v1"
    namespaced: bool

    @property
    def list_kind(self) -> str:
        return self.kind + "List"


RESOURCES: dict[str, ResourceKind] = {
    r.plural: r
    for r in (
        ResourceKind("jobs", "Job", "batch/v1", True),
        ResourceKind("pods", "Pod", "v1", True),
        ResourceKind("nodes", "Node", "v1", False),
        ResourceKind("services", "Service", "v1", True),
        ResourceKind("events", "Event", "v1", True),
    )
}


def clone(obj: Any) -> Any:
    """Deep copy of a JSON-shaped value, normalized as JSON would carry it (tuples become
    lists; a value JSON cannot carry raises): for what comes in from a caller."""
    return json.loads(json.dumps(obj))


def copy_out(obj: Any) -> Any:
    """Deep copy of a value already stored as JSON would carry it (made by ``clone``, changed
    only in JSON's types), about three times cheaper than ``clone``: for what goes out to a
    caller. Marshal format 2 shares no object between two places of the copy."""
    return marshal.loads(marshal.dumps(obj, 2))


def _same_besides_spec(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """``a == b`` for two objects whose ``spec``s are known to be equal: the same keys, and
    equal values under every key but ``spec`` (compared as ``==`` on dicts compares them)."""
    if len(a) != len(b):
        return False
    for key, value in a.items():
        if key == "spec":
            if key not in b:
                return False
            continue
        if key not in b:
            return False
        other = b[key]
        if value is not other and not value == other:
            return False
    return True


def _labels_of(obj: Any) -> Any:
    """An object's ``metadata.labels`` as stored (``None`` for no object)."""
    if obj is None:
        return None
    md = obj.get("metadata")
    return md.get("labels") if isinstance(md, dict) else None


def _hashable(value: Any) -> bool:
    try:
        hash(value)
    except TypeError:
        return False
    return True


def rfc3339(ts: datetime | None = None) -> str:
    return (ts or datetime.now(UTC)).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class WatchEvent:
    rv: int
    type: str  # ADDED | MODIFIED | DELETED
    plural: str
    obj: dict[str, Any]
    prev: dict[str, Any] | None = None
    _encoded: dict[str, bytes] = field(default_factory=dict, repr=False)

    def encode(self, event_type: str | None = None) -> bytes:
        """One watch line; cached per event type since every watcher sends the same bytes."""
        t = event_type or self.type
        if t not in self._encoded:
            self._encoded[t] = json.dumps({"type": t, "object": self.obj}).encode() + b"\n"
        return self._encoded[t]


class Watcher:
    """A subscription: a queue of events of one kind. ``None`` in the queue means "re-check your timers"."""

    def __init__(self, plural: str):
        self.plural = plural
        self.queue: asyncio.Queue[WatchEvent | None] = asyncio.Queue()

    def poke(self) -> None:
        self.queue.put_nowait(None)


class ObjectStore:
    def __init__(
        self,
        history_limit: int,
        stamp: Callable[[], str] | None = None,
        new_uid: Callable[[], str] | None = None,
    ):
        self._stamp = stamp or rfc3339
        self._new_uid = new_uid or (lambda: str(uuid.uuid4()))
        self.rv = 0
        self.history_limit = history_limit
        self.compacted_rv = 0  # events with rv <= this are gone from history
        self._objects: dict[str, dict[tuple[str, str], dict[str, Any]]] = {p: {} for p in RESOURCES}
        # each kind's keys in sorted order, worked out again only after a create or delete of that kind
        self._sorted_keys: dict[str, list[tuple[str, str]] | None] = {p: None for p in RESOURCES}
        # each kind's keys by label: label key -> label value -> the keys of the objects with it;
        # an object whose labels are not a map of hashable values is kept apart, in _odd_labels
        self._labelled: dict[str, dict[str, dict[Any, set[tuple[str, str]]]]] = {p: {} for p in RESOURCES}
        self._odd_labels: dict[str, set[tuple[str, str]]] = {p: set() for p in RESOURCES}
        self._history: deque[WatchEvent] = deque()
        self._watchers: set[Watcher] = set()
        self._listeners: list[Callable[[WatchEvent], None]] = []

    def new_uid(self) -> str:
        """A uid for a new object (a caller that needs it before the create, as the API does)."""
        return self._new_uid()

    # ---- reading -------------------------------------------------------------------------------
    def get(self, plural: str, namespace: str, name: str) -> dict[str, Any] | None:
        return self._objects[plural].get((namespace, name))

    def list(self, plural: str, namespace: str | None = None) -> list[dict[str, Any]]:
        items = self._objects[plural]
        keys = self._sorted_keys[plural]
        if keys is None:
            keys = self._sorted_keys[plural] = sorted(items)
        if namespace is None:
            return [items[k] for k in keys]
        return [items[k] for k in keys if k[0] == namespace]

    def count(self, plural: str) -> int:
        return len(self._objects[plural])

    def labelled(self, plural: str, key: str, values: tuple[Any, ...] | None) -> set[tuple[str, str]]:
        """The keys of the objects whose label ``key`` is one of ``values`` (any value when
        ``None``), with those of every object whose labels are not a map of hashable values:
        a superset of the objects a selector requiring such a label matches. A new set."""
        by_value = self._labelled[plural].get(key, {})
        out = set(self._odd_labels[plural])
        for value in by_value if values is None else values:
            out.update(by_value.get(value, ()))
        return out

    def _index_labels(self, plural: str, key: tuple[str, str], old: Any, new: Any) -> None:
        """Move ``key`` in the label index from the labels of ``old`` to those of ``new`` (the
        objects stored under it before and after a write; ``None`` when there is none)."""
        before = _labels_of(old)
        after = _labels_of(new)
        if before is after or (type(before) is dict and type(after) is dict and before == after):
            return  # the same entries (equal maps are both indexed, or both kept apart)
        index = self._labelled[plural]
        odd = self._odd_labels[plural]
        if key in odd:
            odd.discard(key)
        elif isinstance(before, dict):
            for label, value in before.items():
                keys = index[label][value]
                keys.discard(key)
                if not keys:
                    del index[label][value]
                    if not index[label]:
                        del index[label]
        if not after:
            return
        if not isinstance(after, dict) or not all(_hashable(v) for v in after.values()):
            odd.add(key)
            return
        for label, value in after.items():
            index.setdefault(label, {}).setdefault(value, set()).add(key)

    # ---- writing -------------------------------------------------------------------------------
    def create(self, plural: str, obj: dict[str, Any], uid: str | None = None) -> dict[str, Any]:
        """Store a new object (already validated); raises 409 AlreadyExists on a taken name.

        ``uid`` lets the API layer pick the uid before defaulting fields that embed it.
        """
        rk = RESOURCES[plural]
        md = obj.setdefault("metadata", {})
        ns = md.get("namespace", "") if rk.namespaced else ""
        key = (ns, md["name"])
        if key in self._objects[plural]:
            raise KubeError(
                409,
                f"{rk.plural}{'.' + rk.api_version.split('/')[0] if '/' in rk.api_version else ''} "
                f'"{md["name"]}" already exists',
                "AlreadyExists",
                {"name": md["name"], "kind": rk.plural},
            )
        obj["kind"], obj["apiVersion"] = rk.kind, rk.api_version
        if not rk.namespaced:
            md.pop("namespace", None)
        md["uid"] = uid or self._new_uid()
        md["creationTimestamp"] = self._stamp()
        md["generation"] = 1
        md.pop("deletionTimestamp", None)
        md["resourceVersion"] = str(self._next_rv())
        self._objects[plural][key] = obj
        self._sorted_keys[plural] = None
        self._index_labels(plural, key, None, obj)
        self._emit(WatchEvent(self.rv, "ADDED", plural, copy_out(obj)))
        return obj

    def update(
        self, plural: str, obj: dict[str, Any], prev: dict[str, Any], *, same_spec: bool = False
    ) -> dict[str, Any]:
        """Replace the stored object with ``obj`` (same key), bumping resourceVersion and generation
        (``same_spec``: the caller knows ``obj``'s spec is a copy of ``prev``'s, left as it was)."""
        md = obj["metadata"]
        key = (md.get("namespace", ""), md["name"])
        if not same_spec and prev.get("spec") != obj.get("spec"):
            md["generation"] = int(prev["metadata"].get("generation", 1)) + 1
        md["resourceVersion"] = str(self._next_rv())
        stored = self._objects[plural].get(key)
        if stored is None:
            self._sorted_keys[plural] = None
        self._objects[plural][key] = obj
        self._index_labels(plural, key, stored, obj)
        self._emit(WatchEvent(self.rv, "MODIFIED", plural, copy_out(obj), prev))
        return obj

    def mutate(
        self, plural: str, namespace: str, name: str, change: Callable[[dict[str, Any]], None]
    ) -> bool:
        """Apply ``change`` to a copy of the object; store it only if something changed. True if stored."""
        current = self.get(plural, namespace, name)
        if current is None:
            return False
        new = copy_out(current)
        change(new)
        # new == current, with the spec compared once for both that and update's generation
        same_spec = new.get("spec") == current.get("spec")
        if same_spec and _same_besides_spec(new, current):
            return False
        self.update(plural, new, current, same_spec=same_spec)
        return True

    def replace(self, plural: str, namespace: str, name: str, key: str, value: Any) -> bool:
        """``mutate`` with a ``change`` that sets the top-level field ``key`` to ``value`` (which
        the store then holds: the caller keeps no hold on it), answered without its working
        copy's compare: the copy equals the stored object in every other field, so it differs
        exactly when ``key`` is missing or holds something else. True if stored."""
        current = self.get(plural, namespace, name)
        if current is None or (key in current and current[key] == value):
            return False
        new = copy_out(current)
        new[key] = value
        self.update(plural, new, current, same_spec=key != "spec")
        return True

    def delete(self, plural: str, namespace: str, name: str) -> dict[str, Any] | None:
        obj = self._objects[plural].pop((namespace, name), None)
        if obj is None:
            return None
        self._sorted_keys[plural] = None
        self._index_labels(plural, (namespace, name), obj, None)
        obj["metadata"]["resourceVersion"] = str(self._next_rv())
        self._emit(WatchEvent(self.rv, "DELETED", plural, copy_out(obj)))
        return obj

    # ---- watching ------------------------------------------------------------------------------
    def events_since(self, plural: str, rv: int) -> list[WatchEvent] | None:
        if rv < self.compacted_rv:
            return None
        return [e for e in self._history if e.rv > rv and e.plural == plural]

    def subscribe(self, plural: str) -> Watcher:
        w = Watcher(plural)
        self._watchers.add(w)
        return w

    def unsubscribe(self, watcher: Watcher) -> None:
        self._watchers.discard(watcher)

    def poke_watchers(self) -> None:
        for w in self._watchers:
            w.poke()

    @property
    def watcher_count(self) -> int:
        return len(self._watchers)

    def add_listener(self, listener: Callable[[WatchEvent], None]) -> None:
        self._listeners.append(listener)

    def compact(self, keep: int) -> None:
        """Drop all but the newest ``keep`` history events (tests use this to force 410)."""
        while len(self._history) > keep:
            self.compacted_rv = self._history.popleft().rv

    # ---- internals -----------------------------------------------------------------------------
    def _next_rv(self) -> int:
        self.rv += 1
        return self.rv

    def _emit(self, event: WatchEvent) -> None:
        self._history.append(event)
        while len(self._history) > self.history_limit:
            self.compacted_rv = self._history.popleft().rv
        for w in self._watchers:
            if w.plural == event.plural:
                w.queue.put_nowait(event)
        for listener in self._listeners:
            listener(event)
