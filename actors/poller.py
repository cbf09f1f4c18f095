"""The PollerActor's logic: intake. Reads new and aborting tasks, assigns clusters, wakes queues.

Contract
--------
``IntakePoller`` is a plain object (store, port, settings); the PollerActor in
``actors.remote`` is its Ray shell that runs ``poll_once`` on a ``Ticker``. Hard state: none (the ``jobs`` table is the queue of work). Every poll reads only
live rows -- unassigned Pending tasks and Aborting tasks, through the
``(status, cluster_id, id)`` index -- so its cost does not grow with finished rows.

For each new task: validate the spec (InvalidSpec), end it when its start deadline has
passed and it has not run (StartDeadlineExceeded: ``scheduling.start_deadline_passed``; a
held task is read again every poll, so it ends within a poll of its deadline), find the clusters of its TPU
type (UnsupportedTPUType when none is registered; stays Pending with a message
when all are in maintenance or offline; NoCandidateCluster, naming what each active
cluster offers, when none can serve the task: no reservation for a reservation task,
a reservation of another machine type, a topology not in the catalogue), rank them
with ``scheduling.place`` (an idle pool counts only when no older task of its queue
claims it) and record the choice
with a compare-and-set (Pending -> Pending/Waiting with the cluster). Then hint the
QueueActor through the port, creating it if needed (once per queue per poll). A lost compare-and-set (the upper layer aborted
meanwhile) is simply re-read next poll. The poller never talks to GCP or
Kubernetes; Aborting tasks go to their queue, or are finished here when they hold
nothing on a cluster (no cluster assigned, or aborted while Waiting: no pool, no Job).
A poll with new tasks reads the registry, then the queue depths and the idle pools
in one statement. One bad row never stops a poll; ``Fenced`` (a newer controller holds the leader lease,
see ``store.core``) does, and the shell's loop ends.
"""

from __future__ import annotations

import logging
from typing import Any

from actors.port import Port
from falcon_ray import lifecycle as lc
from falcon_ray import messages, metrics, scheduling
from falcon_ray.clock import SYSTEM, Clock
from falcon_ray.config import Settings
from falcon_ray.lifecycle import Reason
from falcon_ray.reconcile import deadline
from falcon_ray.render import FLEX_START_MAX_RUN_SECONDS
from falcon_ray.spec import SpecError, SupplyMode, parse_spec
from falcon_ray.store import Fenced, Store

log = logging.getLogger("falcon.poller")


class IntakePoller:
    def __init__(self, settings: Settings, store: Store, port: Port, clock: Clock = SYSTEM) -> None:
        self.s = settings
        self.clock = clock
        self.store = store
        self.port = port
        self.rows_read = 0
        self._assign: list[tuple[Any, Any, str]] = []  # this poll's Pending -> Waiting moves

    def interval(self) -> float:
        return self.s.poll_interval_s

    def msg(self, key: str, **kw: object) -> str:
        return messages.text(key, self.s.lang, **kw)

    def poll_once(self) -> dict[str, int]:
        t0 = self.clock.monotonic()
        new, aborting = self.store.intake(self.s.intake_batch)
        counts = {"new": len(new), "aborting": len(aborting), "assigned": 0, "failed": 0}
        self.rows_read += len(new) + len(aborting)
        wake: set[tuple[str, str]] = set()  # queues to hint, once each
        if new:
            clusters = self.store.list_clusters()
            load = self._fleet_load(clusters)
            self._assign: list[tuple[Any, Any, str]] = []
            for task in new:
                try:
                    outcome = self._intake(task, clusters, load, wake)
                    counts[outcome] = counts.get(outcome, 0) + 1
                except Fenced:
                    raise  # a newer controller leads: stop the poll
                except Exception as e:  # one bad row never stops the poll
                    log.exception("task %s: intake failed: %s", task.id, e)
            self._flush_assignments(counts, wake)
        if aborting:
            clusters_by_id = {c.id: c for c in self.store.list_clusters()}
            for task in aborting:
                try:
                    self._route_abort(task, clusters_by_id, wake)
                except Fenced:
                    raise
                except Exception as e:
                    log.exception("task %s: abort routing failed: %s", task.id, e)
        for cluster, topology in sorted(wake):
            self.port.hint(cluster, topology)
        metrics.poll(self.clock.monotonic() - t0, len(new) + len(aborting))
        return counts

    def _flush_assignments(self, counts: dict[str, int], wake: set[tuple[str, str]]) -> None:
        """The poll's Pending -> Waiting moves, in one transaction (one CAS per task, the
        events in one insert); a lost one (aborted meanwhile) is re-read next poll."""
        pending, self._assign = self._assign, []
        if not pending:
            return
        moves = [
            (task.id, lc.NEW, lc.WAITING, self.msg("waiting_first", cluster=target.name, topology=topology), {"cluster_id": target.id})
            for task, target, topology in pending
        ]
        # each task's queue (falcon_task_queue) is written in the same transaction
        outcomes = self.store.transition_many(moves, [topology for _, _, topology in pending])
        for (task, target, topology), won in zip(pending, outcomes, strict=True):
            if not won:
                counts["assigned"] -= 1
                counts["lost"] = counts.get("lost", 0) + 1
                continue
            self._logged(task, lc.WAITING, f"assigned to {target.name}/{topology}", target.name, topology)
            wake.add((target.name, topology))

    def _fleet_load(self, clusters) -> scheduling.FleetLoad:
        """Pending and Running tasks and ready idle pools per queue (cluster, topology) (one
        read), and the tasks of those queues that would take the pools first (read only where
        a pool is idle)."""
        depth, running, idle = self.store.fleet_load()
        claimants = self.store.queue_claimants({cid for cid, _ in idle}) if idle else {}
        return scheduling.FleetLoad(depth, running, idle, claimants)

    def _intake(self, task, clusters, load: scheduling.FleetLoad, wake: set[tuple[str, str]]) -> str:
        try:
            spec = parse_spec(task.spec)
        except SpecError as e:
            return self._fail(task, Reason.INVALID_SPEC, self.msg("invalid_spec", detail=str(e)))
        if scheduling.start_deadline_passed(spec, task.created_at, self.clock.now()) is not None:
            outcome = self._deadline_passed(task, spec)
            if outcome is not None:
                return outcome
        placement = scheduling.place(spec, clusters, load)
        if placement.verdict == "unsupported_tpu_type":
            text = self.msg("unsupported_tpu_type", tpu_type=spec.tpu_type, offered=placement.detail)
            return self._fail(task, Reason.UNSUPPORTED_TPU_TYPE, text)
        if placement.verdict == "no_candidate":
            return self._fail(task, Reason.NO_CANDIDATE_CLUSTER, self._no_candidate_text(spec, placement.offers))
        if placement.verdict == "only_inactive":
            text = self.msg("only_inactive_clusters", tpu_type=spec.tpu_type, clusters=placement.detail)
            if text != task.message:
                self.store.update_task(task.id, lc.NEW, text)
            return "held"
        target = placement.clusters[0]
        # written with the poll's other assignments in one transaction (_flush_assignments)
        self._assign.append((task, target, spec.topology))
        load.assigned(target.id, spec.topology)
        return "assigned"

    def _deadline_passed(self, task, spec) -> str | None:
        """A task past its start deadline: read its event log's entry into its phase and its
        disruption rows (one statement, for this task alone), and end it when it has not run
        (``scheduling.start_deadline_passed``); None: it has, the deadline does not apply."""
        entered, disrupted = self.store.entered_and_disruptions([task.id], [task.id])
        at = scheduling.start_deadline_passed(spec, task.created_at, self.clock.now(), disrupted.get(task.id, ()))
        if at is None:
            return None
        since = entered.get((task.id, lc.NEW)) or task.created_at
        text = deadline.text(self.s.lang, at, spec.start_deadline_s, task.created_at, lc.NEW, self.msg("deadline_wait_new"), since, task.message)
        return self._fail(task, Reason.START_DEADLINE_EXCEEDED, text)

    def _no_candidate_text(self, spec, offers) -> str:
        """NoCandidateCluster, naming what each active cluster of the type offers."""
        parts = []
        for o in offers:
            if o.unfit == scheduling.Unfit.NO_RESERVATION:
                parts.append(self.msg("offer_no_reservation", cluster=o.cluster))
            elif o.unfit == scheduling.Unfit.RESERVATION_SIZE:
                parts.append(self.msg("offer_reservation_size", cluster=o.cluster, reservation=o.reservation, count=o.count,
                                      hosts=spec.shape.hosts, topology=spec.topology))
            elif o.unfit == scheduling.Unfit.FLEX_START_MAX_RUN:
                parts.append(self.msg("offer_flex_start_max_run", cluster=o.cluster, seconds=spec.timeout_seconds, limit=f"{FLEX_START_MAX_RUN_SECONDS // 86400} days"))
            elif o.mode == SupplyMode.RESERVATION:
                tops = ", ".join(o.topologies) or "-"
                parts.append(self.msg("offer_reservation", cluster=o.cluster, reservation=o.reservation, machine_type=o.machine_type, topologies=tops))
            else:
                parts.append(self.msg("offer_supply", cluster=o.cluster, supply=o.mode.value, tpu_type=o.tpu_type))
        shape = spec.shape
        return self.msg(
            "no_candidate_cluster",
            tpu_type=spec.tpu_type,
            topology=spec.topology,
            machine_type=shape.machine_type,
            supply=spec.supply_mode.value if spec.supply_mode else "default",
            detail="; ".join(parts),
        )

    def _fail(self, task, reason: Reason, message: str) -> str:
        to = lc.failed(reason)
        if self.store.transition(task.id, lc.NEW, to, message):
            self._logged(task, to, message)
            return "failed"
        return "lost"

    @staticmethod
    def _logged(task, to: lc.Phase, message: str, cluster: str = "", topology: str = "") -> None:
        """One log line and the metrics of a won transition."""
        log.info(
            "task %s: Pending -> %s: %s",
            task.id,
            to,
            message,
            extra={
                "falcon_task_id": task.id,
                "cluster": cluster,
                "topology": topology,
                "actor": task.actor,
                "status": str(to.status),
                "reason": str(to.reason),
            },
        )
        metrics.task_transition(cluster, topology, to)

    def _route_abort(self, task, clusters_by_id, wake: set[tuple[str, str]]) -> None:
        if task.cluster_id is None:
            if self.store.transition(task.id, lc.ABORTING, lc.ABORTED, self.msg("aborted")):
                metrics.task_transition("", "", lc.ABORTED)
            return
        cluster = clusters_by_id.get(task.cluster_id)
        try:
            spec = parse_spec(task.spec)
        except SpecError:
            self.store.transition(task.id, lc.ABORTING, lc.ABORTED, self.msg("aborted"))
            return
        if cluster is None:  # its cluster was removed from the registry: nothing left to clean here
            self.store.transition(task.id, lc.ABORTING, lc.ABORTED, self.msg("aborted"))
            return
        wake.add((cluster.name, spec.topology))  # the queue re-ranks, or cleans up what the task holds
        if task.reason == lc.Reason.WAITING and not task.node_pool_name and not task.job_uid:
            # It never held its queue's slot, so nothing of it is on the cluster: finished here
            # at once, whatever its queue is doing (restarting, or waiting on its ClusterActor).
            # A queue that picks it in the same instant loses its compare-and-set (the pick is
            # the group's first write); a lease made anyway is released as one of a task no
            # longer live.
            if self.store.transition(task.id, lc.ABORTING, lc.ABORTED, self.msg("aborted")):
                metrics.task_transition(cluster.name, spec.topology, lc.ABORTED)

    def snapshot(self) -> dict[str, Any]:
        return {"rows_read": self.rows_read, "db_statements": self.store.statements}
