"""The Ray side of Falcon: the actor shells, how they are created, and the one port.

Contract
--------
``PollerActor``, ``QueueActor`` and ``ClusterActor`` are thin ``@ray.remote`` shells
around the plain objects that hold the logic (``IntakePoller``,
``QueueReconciler``, ``ClusterGateway``): each builds its object with a ``Store``
and a ``RayPort``, runs its loop on a ``Ticker``, and forwards its remote methods.
``ensure_poller`` / ``ensure_cluster`` / ``ensure_queue`` create an actor or return
the live one (get-if-exists), with the options from ``actors.names``.

The database reaches an actor as a reference (``falcon_ray.dbref``: ``env:NAME``,
``file:PATH`` or a URL without a password), resolved in the actor's own process: Ray
keeps creation arguments for restarts and shows them, so ``ensure_*`` refuse a URL
that carries a password before anything reaches Ray.

``RayPort`` is the only code that calls ``ray.get`` on another actor. It keeps one
handle per actor name; a call that meets a dead actor drops the handle, looks the
actor up again (creating it when that is the caller's right) and retries once. A
hint is fired without waiting; when it meets a dead actor the same happens from the
reply's callback, so a queue that was retired and created again gets the wake-up at
once instead of at its next timed tick.

Fencing: every actor is created under a leader epoch (the ``epoch`` argument of
``ensure_*``, which the supervisor takes from the lease it holds; actors that the
RayPort creates on demand get their creator's). The epoch goes into the actor's
``Store``, so each of its writes loses once a newer controller holds the lease (see
``store.core``). Besides, each shell runs a ``fence`` loop that reads the lease
every third of ``leader_ttl_s``: when the epoch is no longer the actor's, the actor
stops its loops (the ClusterActor also closes its watch and refuses GKE/Kubernetes
calls), stays alive to be seen, and says so in ``snapshot()["fenced"]``. ``epoch()``
answers the epoch it was started under, so a supervisor can replace an actor it
adopts from an older epoch. Ray restarts an actor with its creation arguments, so a
replaced actor keeps the new epoch across crashes.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import ray
from ray.exceptions import RayActorError

from actors import names
from actors.ticker import Ticker
from falcon_ray import dbref
from falcon_ray.config import Settings
from falcon_ray.model import ClusterView
from falcon_ray.store import DbTimeouts, Fenced, Store

log = logging.getLogger("falcon.remote")

POLLER_CONCURRENCY = 8
QUEUE_CONCURRENCY = 16
CLUSTER_CONCURRENCY = 64


class RayPort:
    """``actors.port.Port`` over Ray actor calls, with the timeouts from ``Settings``."""

    def __init__(self, settings: Settings, db_ref: str, epoch: int | None = None) -> None:
        self.s = settings
        self.db_ref = db_ref  # what the actors this port creates are given (falcon_ray.dbref)
        self.epoch = epoch  # what the actors this port creates are started under
        self._handles: dict[str, Any] = {}
        self._lock = threading.Lock()
        self.dropped = 0  # handles found dead and looked up again
        self._creator = ThreadPoolExecutor(max_workers=2, thread_name_prefix="falcon-port-create")
        # a hint that needs a look-up (which may block) goes out from a hint thread, never
        # from the caller's (a watch, a poll) nor from Ray's callback thread
        self._hints_pending: set[str] = set()
        self._hint_pool = ThreadPoolExecutor(max_workers=4, thread_name_prefix="falcon-hint")

    # ---- handles ------------------------------------------------------------------------

    def _handle(self, name: str, make: Callable[[], Any] | None) -> Any:
        with self._lock:
            h = self._handles.get(name)
        if h is None:
            h = self._bounded(make) if make is not None else names.lookup(name, self.s.namespace)
            if h is not None:
                with self._lock:
                    self._handles[name] = h
        return h

    def _bounded(self, make: Callable[[], Any]) -> Any:
        """Create-or-get an actor, bounded in time: right after an actor with the same name
        was killed, Ray's get-if-exists can block until the name is free."""
        future = self._creator.submit(make)
        return future.result(timeout=self.s.actor_call_timeout_s)

    def _drop(self, name: str, h: Any) -> None:
        with self._lock:
            if self._handles.get(name) is h:
                del self._handles[name]
                self.dropped += 1

    def _cluster_call(self, cluster: str, method: str, *args: Any, timeout: float) -> Any:
        name = names.cluster_name(cluster)
        for attempt in (1, 2):
            h = self._handle(name, lambda: ensure_cluster(cluster, self.s, self.db_ref, self.epoch))
            try:
                return ray.get(getattr(h, method).remote(*args), timeout=timeout)
            except RayActorError:
                self._drop(name, h)
                if attempt == 2:
                    raise
        raise AssertionError("unreachable")

    # ---- the port ---------------------------------------------------------------------------

    def observe(self, cluster: str, queue_label: str, pool_names: list[str], want_reservation: bool) -> ClusterView:
        return self._cluster_call(cluster, "observe", queue_label, pool_names, want_reservation, timeout=self.s.actor_call_timeout_s)

    def claim_reservation(self, cluster: str, name: str, hosts: int) -> bool:
        return self._cluster_call(cluster, "claim_reservation", name, hosts, timeout=self.s.actor_call_timeout_s)

    def ensure_pool(self, cluster: str, name: str, request: dict[str, Any], operation: str | None = None) -> str:
        return self._cluster_call(cluster, "ensure_pool", name, request, operation, timeout=self.s.actor_call_timeout_s)

    def delete_pool(self, cluster: str, name: str) -> str:
        return self._cluster_call(cluster, "delete_pool", name, timeout=self.s.actor_call_timeout_s)

    def submit_job(self, cluster: str, manifest: dict[str, Any], service: dict[str, Any] | None) -> dict[str, Any]:
        return self._cluster_call(cluster, "submit_job", manifest, service, timeout=self.s.submit_call_timeout_s)

    def delete_job(self, cluster: str, namespace: str, name: str) -> bool:
        return self._cluster_call(cluster, "delete_job", namespace, name, timeout=self.s.actor_call_timeout_s)

    def hint(self, cluster: str, topology: str, create: bool = True) -> None:
        """Never blocks the caller: a hint whose handle is cached goes out at once; one that
        needs a lookup (``ray.get_actor`` can wait for as long as the actor is being
        restarted) is sent from a hint thread, one per queue at a time. A ClusterActor's
        watch thread calls this for every Job event, and must never wait on a lookup."""
        name = names.queue_name(cluster, topology)
        make = (lambda: ensure_queue(cluster, topology, self.s, self.db_ref, self.epoch)) if create else None
        with self._lock:
            h = self._handles.get(name)
        if h is not None:
            self._fire_hint(name, make, retry=True)
        else:
            self._hint_later(name, make, retry=True)

    def _hint_later(self, name: str, make: Callable[[], Any] | None, retry: bool) -> None:
        """Send the hint from a hint thread (it needs a lookup, which may block)."""
        if threading.current_thread().name.startswith("falcon-hint"):
            self._fire_hint(name, make, retry=retry)  # already on one
            return
        with self._lock:
            if name in self._hints_pending:
                return  # a lookup for this queue is under way; its hint wakes the queue
            self._hints_pending.add(name)
        self._hint_pool.submit(self._hint_in_background, name, make, retry)

    def _hint_in_background(self, name: str, make: Callable[[], Any] | None, retry: bool) -> None:
        try:
            self._fire_hint(name, make, retry=retry)
        finally:
            with self._lock:
                self._hints_pending.discard(name)

    def _fire_hint(self, name: str, make: Callable[[], Any] | None, retry: bool) -> None:
        h = None
        try:
            h = self._handle(name, make)
            if h is None:
                return  # no such queue and not ours to create: nothing to wake
            ref = h.hint.remote(make is not None)  # a hinter that may create the queue changed its rows
        except RayActorError:  # refused at once: the cached handle's actor is gone
            self._drop(name, h)
            if retry:
                self._hint_later(name, make, retry=False)
            return
        except Exception as e:  # a hint is best effort: the queue's own tick re-reads anyway
            log.warning("hint %s: %s", name, e)
            return
        if retry:
            ref.future().add_done_callback(lambda f: self._hint_done(f, name, h, make))

    def _hint_done(self, f, name: str, h: Any, make: Callable[[], Any] | None) -> None:
        try:
            f.result()
        except RayActorError:  # the actor behind the cached handle is gone: find the live one
            self._drop(name, h)
            self._hint_later(name, make, retry=False)  # not on Ray's callback thread
        except Exception as e:
            log.warning("hint %s: %s", name, e)


def db_timeouts(settings: Settings) -> DbTimeouts:
    """The database timeouts of every controller Store (a hung connection must not hang an actor)."""
    return DbTimeouts(settings.db_connect_timeout_s, settings.db_read_timeout_s, settings.db_write_timeout_s)


# ---- the shells ------------------------------------------------------------------------------


def actor_identity(kind: str, *names_: str) -> str:
    """An actor's ``repr``: its kind and what names it, never its state: ``PollerActor()``
    (one per namespace), ``ClusterActor(edge-a)``, ``QueueActor(edge-a/2x2)``.

    Ray asks for the repr once, when the actor is created (also when its constructor
    failed), and the dashboard shows it (``repr_name`` in the state API) for the actor's
    whole life, so live state there would be stale at once; it stays where it refreshes
    (``falcon-ray queues``, ``falcon-ray health``, the metrics, the notebooks)."""
    return f"{kind}({'/'.join(names_)})"


class _Fencing:
    """The fence loop every shell runs: read the lease every third of its TTL; once a
    newer epoch holds it, call ``_on_fenced`` (stop the loops) and stop checking."""

    store: Store
    # set first in each constructor, from its arguments only; until then the class name
    _identity: str | None = None

    def __repr__(self) -> str:
        """Identity only (``actor_identity``); never raises, even for a constructor that
        failed half-way (a killed database connection)."""
        return self._identity or type(self).__name__

    def _start_fence(self, settings: Settings, log_name: str) -> None:
        period = max(0.2, settings.leader_ttl_s / 3)
        self.fence = Ticker(
            "fence", self._fence_step, lambda: period, logging.getLogger(log_name),
            start_after=period, halted=lambda: self.store.fenced,
        )

    def _fence_step(self) -> None:
        try:
            self.store.check_fence(0.0)
        except Fenced:
            self._on_fenced()

    def _on_fenced(self) -> None:  # pragma: no cover - each shell says what to stop
        raise NotImplementedError

    def _process(self) -> dict[str, Any]:
        """Where this actor runs: its pid and Ray worker id (Ray names the actor's log files
        and labels its metric series (``WorkerId``) with it)."""
        return {"pid": os.getpid(), "ray_worker_id": ray.get_runtime_context().get_worker_id()}

    def epoch(self) -> int | None:
        return self.store.epoch

    def fenced(self) -> str:
        return self.store.fenced


class _Shell(_Fencing):
    """What every Falcon actor answers: ping, snapshot, shutdown, drain (and, from _Fencing, its identity as repr)."""

    ticker: Ticker
    core: Any

    def ping(self) -> bool:
        return True

    def _on_fenced(self) -> None:
        self.ticker.stop()

    def shutdown(self) -> None:
        self.ticker.stop()

    def drain(self, timeout: float = 30.0) -> bool:
        """Finish the step in progress, then stop; True when the loop has ended."""
        return self.ticker.drain(timeout)

    def loop(self) -> dict[str, Any]:
        return {"steps": self.ticker.steps, "last_step_at": self.ticker.last_step_at, "last_error": self.ticker.last_error, "fenced": self.store.fenced}


@ray.remote
class PollerActor(_Shell):
    def __init__(self, settings: Settings, db_ref: str, epoch: int | None = None) -> None:
        self._identity = actor_identity("PollerActor")
        from actors.poller import IntakePoller  # each actor imports its own logic only (below)

        self.store = Store(dbref.resolve(db_ref), epoch=epoch, timeouts=db_timeouts(settings))
        self.core = IntakePoller(settings, self.store, RayPort(settings, db_ref, epoch))
        self.ticker = Ticker(
            "poll", self.core.poll_once, self.core.interval, logging.getLogger("falcon.poller"), halted=lambda: self.store.fenced
        )
        self._start_fence(settings, "falcon.poller")

    def poll_now(self) -> None:
        self.ticker.wake()

    def snapshot(self) -> dict[str, Any]:
        t = self.ticker
        return {
            "polls": t.steps,
            "last_poll_at": t.last_step_at,
            "last_poll_s": t.last_step_s,
            "last_error": t.last_error,
            "epoch": self.store.epoch,
            "fenced": self.store.fenced,
            "process": self._process(),
            **self.core.snapshot(),
        }


@ray.remote
class QueueActor(_Shell):
    def __init__(self, cluster_name: str, topology: str, settings: Settings, db_ref: str, epoch: int | None = None) -> None:
        self._identity = actor_identity("QueueActor", cluster_name, topology)
        from actors.queue import QueueReconciler

        self.store = Store(dbref.resolve(db_ref), epoch=epoch, timeouts=db_timeouts(settings))
        self.core = QueueReconciler(cluster_name, topology, settings, self.store, RayPort(settings, db_ref, epoch))
        self.core.read_every_step = False  # its rows are read when a hint says they changed (rows_changed)
        self.ticker = Ticker(
            f"queue {self.core.label}", self.core.step, self.core.interval, logging.getLogger("falcon.queue"),
            halted=lambda: self.store.fenced,
        )
        self._start_fence(settings, "falcon.queue")

    def hint(self, rows: bool = True) -> None:
        """Something changed for this queue: its rows (a new task, an abort: ``rows``), or
        only its cluster (a Job event, a pool operation) or the registry."""
        if rows:
            self.core.rows_changed()
        self.ticker.wake()

    def snapshot(self, waiting_offset: int = 0, waiting_limit: int | None = None, task_id: int | None = None) -> dict[str, Any]:
        """``QueueReconciler.snapshot`` (a page of the waiting tasks, or one task's entry) with the loop's state."""
        c = self.core
        return {
            "queue": names.queue_name(c.cluster_name, c.topology),
            "last_tick_at": self.ticker.last_step_at,
            "last_error": self.ticker.last_error,
            "ticks": self.ticker.steps,
            "epoch": self.store.epoch,
            "fenced": self.store.fenced,
            "process": self._process(),
            **c.snapshot(waiting_offset, waiting_limit, task_id),
        }


@ray.remote
class ClusterActor(_Fencing):
    def __init__(self, cluster_name: str, settings: Settings, db_ref: str, epoch: int | None = None) -> None:
        self._identity = actor_identity("ClusterActor", cluster_name)
        # the GKE, Compute and Kubernetes libraries come with it: a queue or poller process
        # never loads them, and starts that much faster
        from actors.cluster import ClusterGateway

        self.store = Store(dbref.resolve(db_ref), epoch=epoch, timeouts=db_timeouts(settings))
        self.core = ClusterGateway(cluster_name, settings, self.store, RayPort(settings, db_ref, epoch))
        self._start_fence(settings, "falcon.cluster")

    def _on_fenced(self) -> None:
        self.core._fence()  # logs, stops every loop and closes the watch

    def ping(self) -> bool:
        return True

    def observe(self, queue_label: str, pool_names: list[str], want_reservation: bool) -> ClusterView:
        return self.core.observe(queue_label, pool_names, want_reservation)

    def claim_reservation(self, name: str, hosts: int) -> bool:
        return self.core.claim_reservation(name, hosts)

    def ensure_pool(self, name: str, request: dict[str, Any], operation: str | None = None) -> str:
        return self.core.ensure_pool(name, request, operation)

    def delete_pool(self, name: str) -> str:
        return self.core.delete_pool(name)

    def submit_job(self, manifest: dict[str, Any], service: dict[str, Any] | None) -> dict[str, Any]:
        return self.core.submit_job(manifest, service)

    def delete_job(self, namespace: str, name: str) -> bool:
        return self.core.delete_job(namespace, name)

    def orphan_scan(self) -> dict[str, list[str]]:
        return self.core.orphan_scan()

    def refresh_cluster(self) -> None:
        self.core.refresh_cluster()

    def snapshot(self) -> dict[str, Any]:
        return {**self.core.snapshot(), "process": self._process()}

    def shutdown(self) -> None:
        self.core.shutdown()

    def drain(self, timeout: float = 30.0) -> bool:
        return self.core.drain(timeout)


# ---- creation ---------------------------------------------------------------------------------


def ensure_poller(settings: Settings, db_ref: str, epoch: int | None = None):
    opts = names.options(names.POLLER, settings.namespace, POLLER_CONCURRENCY)
    return PollerActor.options(**opts).remote(settings, dbref.passable(db_ref), epoch)


# What a ClusterActor or QueueActor asks of ``Settings.actor_resource``: a token amount, so
# that the resource only steers them to the nodes that advertise it (KubeRay's worker group
# advertises 1000), never limits how many fit on one. The poller asks for none: it stays
# with the driver on the head (deploy/kuberay-workers, docs/deploy.md "Sizing").
ACTOR_RESOURCE_AMOUNT = 0.001


def _worker_options(name: str, settings: Settings, max_concurrency: int) -> dict[str, Any]:
    """``names.options`` plus ``resources={actor_resource: 0.001}`` when the setting names one."""
    opts = names.options(name, settings.namespace, max_concurrency)
    if settings.actor_resource:
        opts["resources"] = {settings.actor_resource: ACTOR_RESOURCE_AMOUNT}
    return opts


def ensure_cluster(cluster: str, settings: Settings, db_ref: str, epoch: int | None = None):
    opts = _worker_options(names.cluster_name(cluster), settings, CLUSTER_CONCURRENCY)
    return ClusterActor.options(**opts).remote(cluster, settings, dbref.passable(db_ref), epoch)


def ensure_queue(cluster: str, topology: str, settings: Settings, db_ref: str, epoch: int | None = None):
    opts = _worker_options(names.queue_name(cluster, topology), settings, QUEUE_CONCURRENCY)
    return QueueActor.options(**opts).remote(cluster, topology, settings, dbref.passable(db_ref), epoch)
