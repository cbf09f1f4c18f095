"""Fakes for component tests: a clock to move by hand, a port that records every call.

``FakeClock`` is the store's and the queue's clock; ``FakePort`` stands in for the
other actors: it answers ``observe`` with whatever ``view`` the test sets, records
every call as ``(method, args...)``, and lets a test decide what a Job submission
returns. ``QueueBench`` puts a ``QueueReconciler`` and an ``IntakePoller`` on one
SQLite database with both fakes, so a test reads "given these rows and this cluster
view, after one step these rows and these port calls" with no Ray and no HTTP.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field, replace
from typing import Any

from actors.poller import IntakePoller
from actors.queue import QueueReconciler
from falcon_ray.clock import ManualClock
from falcon_ray.config import Settings
from falcon_ray.model import ClusterView, JobView, OpView, Task
from falcon_ray.render import LABEL_TASK_ID
from falcon_ray.store import Store
from falcon_ray.store.migrate import upgrade

T0 = dt.datetime(2026, 12, 1, 12, 0, 0)


class FakeClock(ManualClock):
    """A ``ManualClock`` that is also the ``Store``'s clock (a callable answering the wall time)."""

    def __init__(self, start: dt.datetime = T0) -> None:
        super().__init__(start)

    def __call__(self) -> dt.datetime:
        return self.now()

    def advance(self, seconds: float) -> dt.datetime:  # type: ignore[override]
        super().advance(seconds)
        return self.now()


@dataclass
class FakePort:
    """Like the ClusterActor, it remembers what it was asked for since the test last set
    the ``view`` (a pool operation is queued, a submitted Job is Pending) and shows it on
    top of that view; ``set_view`` says what became of everything."""

    view: ClusterView = field(default_factory=ClusterView)
    calls: list[tuple[Any, ...]] = field(default_factory=list)
    ops: dict[str, OpView] = field(default_factory=dict)
    jobs: dict[int, JobView] = field(default_factory=dict)
    submit_result: dict[str, Any] = field(default_factory=lambda: {"uid": "uid-1", "created": True})
    claims_granted: bool = True
    cluster_views: dict[str, ClusterView] = field(default_factory=dict)  # other clusters' answers, by name

    def set_view(self, view: ClusterView) -> None:
        self.view = view
        self.ops.clear()
        self.jobs.clear()

    def observe(self, cluster: str, queue_label: str, pool_names: list[str], want_reservation: bool) -> ClusterView:
        if cluster in self.cluster_views:
            return self.cluster_views[cluster]
        return replace(self.view, ops={**self.view.ops, **self.ops}, jobs={**self.view.jobs, **self.jobs})

    def claim_reservation(self, cluster: str, name: str, hosts: int) -> bool:
        self.calls.append(("claim_reservation", name, hosts))
        return self.claims_granted

    def ensure_pool(self, cluster: str, name: str, request: dict[str, Any], operation: str | None = None) -> str:
        self.calls.append(("ensure_pool", name, operation))
        self.ops[name] = OpView("create", "queued", operation=operation or "")
        return "queued"

    def delete_pool(self, cluster: str, name: str) -> str:
        self.calls.append(("delete_pool", name))
        self.ops[name] = OpView("delete", "queued")
        return "queued"

    def submit_job(self, cluster: str, manifest: dict[str, Any], service: dict[str, Any] | None) -> dict[str, Any]:
        name = manifest["metadata"]["name"]
        self.calls.append(("submit_job", name))
        if "uid" in self.submit_result:
            tid = int(manifest["metadata"]["labels"][LABEL_TASK_ID])
            self.jobs[tid] = JobView(tid, name, manifest["metadata"]["namespace"], self.submit_result["uid"], "Pending", 0, 0, 1)
        return dict(self.submit_result)

    def delete_job(self, cluster: str, namespace: str, name: str) -> bool:
        self.calls.append(("delete_job", name))
        return True

    def hint(self, cluster: str, topology: str, create: bool = True) -> None:
        self.calls.append(("hint", cluster, topology))

    def took(self, method: str) -> list[tuple[Any, ...]]:
        """The calls of one kind, and forget all calls (each step is read on its own)."""
        out = [c for c in self.calls if c[0] == method]
        self.calls.clear()
        return out


class QueueBench:
    """One queue (edge-a, ``topology``) on SQLite, driven step by step."""

    def __init__(
        self, db_url: str, topology: str = "2x2", reservation: str = "res-a", migrate: bool = True, **settings: Any
    ) -> None:
        if migrate:
            upgrade(db_url, with_jobs_table=True)
        self.clock = FakeClock()
        self.store = Store(db_url, clock=self.clock)
        self.cluster = self.store.add_cluster("edge-a", "proj-a", "us-east5-b", "v6e", "logs-a", reservation)
        self.settings = Settings(**settings)
        self.port = FakePort()
        self.topology = topology
        self.poller = IntakePoller(self.settings, self.store, self.port, clock=self.clock)
        self.queue = self.restart()

    def restart(self, cluster_actor_too: bool = False) -> QueueReconciler:
        """A new QueueReconciler on the same database: what Ray does after a crash."""
        if cluster_actor_too:
            self.port.ops.clear()
        self.queue = QueueReconciler("edge-a", self.topology, self.settings, self.store, self.port, clock=self.clock)
        return self.queue

    def submit(self, actor: str = "alice", topology: str | None = None, **spec: Any) -> int:
        body = {"tpu_type": "v6e", "topology": topology or self.topology, "image": "img:1", "command": ["run"], **spec}
        tid = self.store.submit_task(actor, body, name=f"{actor}-{topology or self.topology}")
        self.poller.poll_once()
        return tid

    def step(self, view: ClusterView | None = None, advance: float = 0.0) -> None:
        if advance:
            self.clock.advance(advance)
        if view is not None:
            self.port.set_view(view)
        self.queue.step()

    def task(self, tid: int) -> Task:
        t = self.store.get_task(tid)
        assert t is not None
        return t

    def phase(self, tid: int) -> str:
        return str(self.task(tid).phase)
