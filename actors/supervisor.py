"""The supervisor: leader lease, actor creation and adoption, registry changes, health.

Contract
--------
``Supervisor`` runs in the ``falcon-ray run`` process (and in ``falcon-ray demo``).
It acts only while it holds the leader lease row in the database; a second
controller on the same database waits for the lease. Holding it, it makes the set
of actors match the registry: the poller, a ClusterActor per registered cluster,
and a QueueActor per (cluster, topology) that has live tasks or live leases. It
uses get-if-exists, so starting again adopts the actors already running (they are
detached and outlive this process). A QueueActor with nothing live is retired.
Clusters are taken out of service with ``clusters set-status ... offline``, never by
deleting their row: a deleted row retires the cluster's actors at once, and its
tasks would be left with nobody to finish them. Registry status changes reach the
actors on the next reconcile: a cluster in maintenance or offline gets no new
tasks (the poller ranks only active ones), its queues re-rank their waiting tasks
and delete idle pools, and running tasks finish.

Fencing: taking the lease as a new holder bumps its ``epoch`` (the store does it in
the same UPDATE); the supervisor starts every actor under the epoch it holds. An
actor it adopts (get-if-exists found it running) is asked for its epoch the first
time the supervisor sees it: one started under an older epoch is fenced (its writes
lose, its loops stop), so it is replaced: killed without restart and created again
under the current epoch (killing at any line is safe: the database and the clusters
are the truth). Replacing rather than re-arming keeps the new epoch in the actor's
creation arguments, which are what Ray restarts it with. If the lease is lost and
taken again at a newer epoch, ``start()`` runs again and replaces them all.

``shutdown(drain=True)`` asks every actor to finish its current step, then stops
them and releases the lease: the clean stop of ``falcon-ray run``.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import uuid
from typing import Any

import ray

from actors import names, remote
from falcon_ray.clock import SYSTEM, Clock
from falcon_ray.config import Settings
from falcon_ray.spec import SpecError, parse_spec
from falcon_ray.store import Store

log = logging.getLogger("falcon.supervisor")


class Supervisor:
    def __init__(
        self, settings: Settings, db_url: str, holder: str | None = None, db_ref: str | None = None, clock: Clock = SYSTEM
    ) -> None:
        self.s = settings
        self.clock = clock
        # the supervisor's own store uses the URL; its actors get only the reference
        # (falcon_ray.dbref), which ensure_* refuse when it is a URL with a password
        self.db_ref = db_ref if db_ref is not None else db_url
        self.store = Store(db_url, clock=clock.now, timeouts=remote.db_timeouts(settings))  # its rows and lease in its time
        self.holder = holder or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.leader = False
        self.epoch: int | None = None  # the lease's epoch while this supervisor holds it
        self.actor_epochs: dict[str, int | None] = {}  # what each known actor was started under
        self.replaced: list[str] = []
        self.lease_renewed_at: float | None = None
        self.started_at = self.clock.time()
        self.known: dict[str, ray.actor.ActorHandle] = {}
        self.cluster_rows: dict[str, Any] = {}  # the registry row each ClusterActor was last told about
        self.retired: list[str] = []
        self.stop = threading.Event()
        self._run_stop: threading.Event | None = None
        self._keeper: threading.Thread | None = None
        self._keeper_lock = threading.Lock()
        self.last_registry_at: float | None = None
        self.last_error = ""

    # ---- leadership ---------------------------------------------------------------------

    def try_lead(self) -> bool:
        try:
            self.leader = self.store.acquire_leader(self.holder, self.s.leader_ttl_s)
        except Exception as e:
            self.last_error = f"leader lease: {type(e).__name__}: {e}"[:500]
            log.warning("leader lease renewal failed: %s", e)
            self.leader = False
        if self.leader:
            self.lease_renewed_at = self.clock.time()
            try:
                self.epoch = self.store.leader_epoch(self.holder)
            except Exception as e:
                log.warning("leader epoch: %s", e)
        return self.leader

    def wait_for_lead(self, stop: threading.Event | None = None, timeout: float | None = None) -> bool:
        deadline = None if timeout is None else self.clock.monotonic() + timeout
        stop = stop or self.stop
        announced = False
        while not stop.is_set():
            if self.try_lead():
                log.info("leader lease taken by %s", self.holder)
                self._keep_lease_from_now()
                return True
            if not announced:
                try:
                    held = self.store.leader()
                except Exception as e:  # the database is down: try_lead said so; keep waiting
                    log.warning("waiting for the leader lease (the database does not answer: %s)", e)
                else:
                    log.warning("waiting for the leader lease held by %s", held and held["holder"])
                    announced = True
            if deadline is not None and self.clock.monotonic() > deadline:
                return False
            self.clock.wait(stop, max(0.2, self.s.leader_ttl_s / 3))
        return False

    # ---- actors ----------------------------------------------------------------------------

    def start(self) -> None:
        """Create or adopt every actor the registry calls for (requires the lease)."""
        self.reconcile_registry()

    def _adopt_all(self, makers: dict[str, Any]) -> dict[str, Any]:
        """Create or adopt every actor of ``makers`` (name -> make) under the current epoch;
        replace one that runs under an older epoch. The creations go out together and the
        epochs are asked for together: actors start side by side, not one after another."""
        handles = {name: make() for name, make in makers.items()}
        asked = {
            name: h.epoch.remote()
            for name, h in handles.items()
            if not (name in self.known and self.actor_epochs.get(name) == self.epoch)
        }
        deadline = self.clock.monotonic() + self.s.actor_call_timeout_s
        for name, ref in asked.items():
            try:
                theirs = ray.get(ref, timeout=max(0.1, deadline - self.clock.monotonic()))
            except Exception as e:  # still starting, or dying: look again at the next reconcile
                log.warning("epoch of %s: %s", name, e)
                self.actor_epochs.pop(name, None)
                continue
            if theirs != self.epoch:
                handles[name] = self._replace(name, theirs, handles[name], makers[name])
            self.actor_epochs[name] = self.epoch
        return handles

    def _replace(self, name: str, theirs: int | None, h, make):
        log.warning("replacing %s: started under epoch %s, the lease is at %s", name, theirs, self.epoch)
        try:
            ray.kill(h, no_restart=True)
        except Exception as e:
            log.warning("replace %s: %s", name, e)
        deadline = self.clock.monotonic() + max(10.0, self.s.actor_call_timeout_s)
        while names.lookup(name, self.s.namespace) is not None and self.clock.monotonic() < deadline:
            self.clock.sleep(0.1)  # the name is free once Ray has recorded the kill
        self.replaced.append(name)
        return make()

    def reconcile_registry(self) -> dict[str, list[str]]:
        clusters = self.store.list_clusters()
        wanted: dict[str, tuple] = {}
        for c in clusters:
            wanted[names.cluster_name(c.name)] = ("cluster", c.name)
        by_id = {c.id: c for c in clusters}
        for t in self.store.live_tasks():
            c = by_id.get(t.cluster_id or "")
            if c is None:
                continue
            try:
                topology = parse_spec(t.spec).topology
            except SpecError:
                continue
            wanted[names.queue_name(c.name, topology)] = ("queue", c.name, topology)
        for lease in self.store.leases():
            c = by_id.get(lease.cluster_id)
            if c is not None:
                wanted[names.queue_name(c.name, lease.topology)] = ("queue", c.name, lease.topology)
        makers: dict[str, Any] = {names.POLLER: lambda: remote.ensure_poller(self.s, self.db_ref, self.epoch)}
        for name, what in sorted(wanted.items()):
            if what[0] == "cluster":
                makers[name] = lambda w=what: remote.ensure_cluster(w[1], self.s, self.db_ref, self.epoch)
            else:
                makers[name] = lambda w=what: remote.ensure_queue(w[1], w[2], self.s, self.db_ref, self.epoch)
        created = []
        rows = {names.cluster_name(c.name): c for c in clusters}
        for name, h in self._adopt_all(makers).items():
            if name.startswith("cluster/"):
                # re-read by the actor when first seen here and when its registry row changed
                if name not in self.known or self.cluster_rows.get(name) != rows.get(name):
                    h.refresh_cluster.remote()
                self.cluster_rows[name] = rows.get(name)
            elif name != names.POLLER:
                h.hint.remote(False)  # a nudge: a queue's rows did not change here
            if name not in self.known and name != names.POLLER:
                created.append(name)
            self.known[name] = h
        retired = []
        for name in list(self.known):
            if name == names.POLLER or name in wanted:
                continue
            # a queue with nothing live, or a cluster gone from the registry: retire it
            self._kill(name)
            retired.append(name)
        self.last_registry_at = self.clock.time()
        return {"created": created, "retired": retired}

    def _kill(self, name: str) -> None:
        self.actor_epochs.pop(name, None)
        h = self.known.pop(name, None) or names.lookup(name, self.s.namespace)
        if h is not None:
            try:
                ray.kill(h, no_restart=True)
            except Exception as e:
                log.warning("retire %s: %s", name, e)
        self.retired.append(name)

    # ---- the loop ------------------------------------------------------------------------------

    def run(self, stop: threading.Event | None = None) -> None:
        """Lead until ``stop`` is set: renew the lease, keep actors in step with the registry."""
        stop = stop or self.stop
        self._run_stop = stop  # shutdown() must end this loop too, whoever owns the event
        if not self.wait_for_lead(stop):
            return
        # the lease is renewed from the moment it was taken (wait_for_lead starts the keeper)
        started_under = self.epoch if self._start_for_now() else None
        next_registry = self.clock.monotonic() + self.s.registry_interval_s
        while not self.clock.wait(stop, min(self.s.leader_ttl_s / 3, self.s.registry_interval_s)):
            if not self.leader:
                log.error("leader lease lost; waiting to take it again")
                if not self.wait_for_lead(stop):
                    return
            if self.epoch != started_under:  # taken again after another holder: actors are fenced
                if not self._start_for_now():
                    continue
                started_under = self.epoch
                next_registry = self.clock.monotonic() + self.s.registry_interval_s
            if self.clock.monotonic() >= next_registry:
                try:
                    self.reconcile_registry()
                    self.last_error = ""
                except Exception as e:
                    self.last_error = f"registry: {type(e).__name__}: {e}"[:500]
                    log.exception("registry reconcile failed")
                next_registry = self.clock.monotonic() + self.s.registry_interval_s

    def _start_for_now(self) -> bool:
        """``start()``; False (logged, in ``last_error``) when the database or Ray fails it
        for now: the run loop tries again next round instead of dying."""
        try:
            self.start()
            return True
        except Exception as e:
            self.last_error = f"start: {type(e).__name__}: {e}"[:500]
            log.exception("starting the actors under epoch %s failed", self.epoch)
            return False

    def _keep_lease_from_now(self) -> None:
        """The lease is renewed on its own thread from the moment it is taken: neither the
        first ``start()`` (creating every actor can take longer than the lease lives on a
        loaded machine) nor a slow registry pass lets it lapse."""
        with self._keeper_lock:
            if self._keeper is None or not self._keeper.is_alive():
                self._keeper = threading.Thread(target=self._keep_lease, daemon=True, name="falcon-leader-lease")
                self._keeper.start()

    def _stopping(self) -> bool:
        return self.stop.is_set() or (self._run_stop is not None and self._run_stop.is_set())

    def _keep_lease(self) -> None:
        """Renew the lease every third of its lifetime while leading; a failed renewal
        clears ``leader`` and the run loop waits to take the lease again. Ends when the
        supervisor or its run loop is told to stop."""
        while not self.clock.wait(self.stop, self.s.leader_ttl_s / 3):
            if self._stopping():
                return
            if self.leader:
                self.try_lead()

    def actor_names(self) -> list[str]:
        names_now = set(self.known)
        try:
            names_now.update(names.list_falcon_actors(self.s.namespace))
        except Exception:
            pass
        return sorted(names_now)

    def shutdown(self, drain: bool = True, kill: bool = True, timeout: float = 30.0) -> None:
        """Stop leading. With ``drain``, each actor finishes its current step first."""
        self.stop.set()
        if self._run_stop is not None:
            self._run_stop.set()
        handles = {n: self.known.get(n) or names.lookup(n, self.s.namespace) for n in self.actor_names()}
        if drain:
            refs = [h.drain.remote() for h in handles.values() if h is not None]
            try:
                ray.get(refs, timeout=timeout)
            except Exception as e:
                log.warning("drain: %s", e)
        if kill:
            for h in handles.values():
                if h is not None:
                    try:
                        ray.kill(h, no_restart=True)
                    except Exception:
                        pass
            self.known.clear()
        try:
            self.store.release_leader(self.holder)
        except Exception as e:
            log.warning("release leader lease: %s", e)
        self.leader = False

    # ---- health -----------------------------------------------------------------------------------

    def health(self, probe_timeout: float = 5.0) -> dict[str, Any]:
        from falcon_ray import health

        return health.check(self, probe_timeout)
