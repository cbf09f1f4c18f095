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
* Listeners (the workload controllers) get every event synchronously too; they
  must only record work and schedule it, never mutate the store re-entrantly.
* All methods run on the simulator's event loop thread; nothing here locks.
  Objects handed out by ``get``/``list`` are the stored dicts: callers that
  change them must go through ``update``/``mutate``.
* What is stored is JSON-shaped, as :func:`clone` returns it (dicts with str
  keys, lists, str, int, float, bool, None; no tuple): ``create`` and ``update``
  take such values and ``mutate``'s ``change`` keeps them so. The store copies
  them with :func:`copy_out` (for the events' snapshots and ``mutate``'s
  working copy) and converts nothing.
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
        self._emit(WatchEvent(self.rv, "ADDED", plural, copy_out(obj)))
        return obj

    def update(self, plural: str, obj: dict[str, Any], prev: dict[str, Any]) -> dict[str, Any]:
        """Replace the stored object with ``obj`` (same key), bumping resourceVersion and generation."""
        md = obj["metadata"]
        key = (md.get("namespace", ""), md["name"])
        if prev.get("spec") != obj.get("spec"):
            md["generation"] = int(prev["metadata"].get("generation", 1)) + 1
        md["resourceVersion"] = str(self._next_rv())
        if key not in self._objects[plural]:
            self._sorted_keys[plural] = None
        self._objects[plural][key] = obj
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
        if new == current:
            return False
        self.update(plural, new, current)
        return True

    def delete(self, plural: str, namespace: str, name: str) -> dict[str, Any] | None:
        obj = self._objects[plural].pop((namespace, name), None)
        if obj is None:
            return None
        self._sorted_keys[plural] = None
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
