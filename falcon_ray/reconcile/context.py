"""One decision in progress: the observations, what is already claimed, the groups so far.

Contract
--------
``Decision`` is built fresh by ``decide()`` for one call and thrown away after it.
The rule modules read the queue state and the cluster view through it and append
effect groups to it; the only state that passes from one rule to a later one lives
here and is named: the idle pools already claimed this call, the tasks that would
take an idle pool (``demand``), the pools kept idle this call, and the slot holders
that the queue positions count ahead of the waiting tasks. Nothing here does I/O or
reads a clock; ``now`` is given.

Its cost does not grow with the waiting list: it partitions only the tasks that are not
Waiting (``QueueState.held``), and reads the ``WaitingQueue`` through the ``waiting_*``
methods (the count, the heads of the highest priority; the full pick order only for
rule 8) and ``leave``/``leave_all`` for the tasks that leave it in this call.
"""

from __future__ import annotations

import datetime as dt
import functools
from collections import defaultdict

from falcon_ray import faults, messages, render, scheduling
from falcon_ray import lifecycle as lc
from falcon_ray.config import Settings
from falcon_ray.lifecycle import LeaseState, Phase, Reason
from falcon_ray.model import (
    RELEASED,
    ClusterView,
    Disruption,
    JobPhase,
    JobView,
    Lease,
    QueueState,
    QueueTask,
    WaitingQueue,
)
from falcon_ray.reconcile import eta, hold
from falcon_ray.reconcile.effects import (
    DeleteJob,
    DeletePool,
    Effect,
    EffectGroup,
    MoveLease,
    RecordDisruption,
    Transition,
    UpdateTask,
)
from falcon_ray.reconcile.pools import kept_alive, nodes_last_for
from falcon_ray.spec import SupplyMode

_ACQUIRING = frozenset(lc.ACQUIRING_PHASES)

# A lease in one of these belongs to its task.


def fmt_limit(seconds: float) -> str:
    return f"{int(seconds // 60)}m" if seconds >= 60 and seconds % 60 == 0 else f"{seconds:g}s"


@functools.lru_cache(maxsize=4096)
def stamp(at: dt.datetime) -> str:
    """An instant as the Messages show it (UTC, to the minute): a live wait says since when it
    waits, not for how long, so its text does not change as time passes and nothing has to
    rewrite it every minute."""
    return at.strftime("%Y-%m-%d %H:%M")


def fmt_duration(seconds: float) -> str:
    """A wait that is over, as an operator reads it (a live wait's Message says since when, ``stamp``)."""
    minutes = int(seconds // 60)
    if minutes < 1:
        return "<1m"
    return f"{minutes}m" if minutes < 60 else f"{minutes // 60}h{minutes % 60:02d}m"


class Demand:
    """The tasks that would take an idle pool now: every Waiting task (counted, never
    listed) and the acquiring ones whose own pool is not ready yet (they switch to an idle
    pool, original section 5), less the ones ``discard``-ed this call."""

    def __init__(self, waiting: WaitingQueue, acquiring: set[int]) -> None:
        self.waiting, self.acquiring = waiting, acquiring
        self.gone: set[int] = set()  # Waiting tasks discarded

    def __len__(self) -> int:
        return len(self.waiting) - len(self.gone) + len(self.acquiring)

    def __contains__(self, task_id: object) -> bool:
        return task_id in self.acquiring or (task_id in self.waiting and task_id not in self.gone)

    def discard(self, task_id: int) -> None:
        if task_id in self.acquiring:
            self.acquiring.discard(task_id)
        elif task_id in self.waiting:
            self.gone.add(task_id)


class Decision:
    """One round's decision over a queue's rows (``queue``) and what its ClusterActor sees
    (``cluster``) at ``now``: the rules add effect groups to ``groups``."""

    def __init__(self, q: QueueState, cluster: ClusterView, now: dt.datetime, settings: Settings) -> None:
        self.queue, self.cluster, self.now, self.settings = q, cluster, now, settings
        self.groups: list[EffectGroup] = []
        self.lease_by_task = {l.task_id: l for l in q.leases if l.state in lc.LEASE_HELD and l.task_id is not None}
        self.idle = [l for l in q.leases if l.state == LeaseState.IDLE]
        self.claimed: set[int] = set()  # idle leases taken (or deleted) this call
        self.kept = 0  # pools moved to Idle this call
        self.held_ids = {t.id for t in q.held}
        by_phase: defaultdict[Phase, list[QueueTask]] = defaultdict(list)
        for t in q.held:  # the tasks that are not Waiting: few, whatever the queue's length
            by_phase[t.phase].append(t)
        self.acquiring = [t for t in q.held if t.phase in _ACQUIRING]  # in the queue's order
        self.waiting = q.waiting  # read through waiting_*(): never a pass over it in the rounds
        self.left: set[int] = set()  # Waiting tasks that left the waiting list this call
        self.all_left = False
        self.aborting = by_phase.get(lc.ABORTING, [])
        self.running = by_phase.get(lc.RUNNING, [])
        self.recovering = by_phase.get(lc.RECOVERING, [])
        self.holders: list[QueueTask] = list(self.acquiring)  # counted ahead of every waiting task
        self.since_texts: dict[dt.datetime, str] = {}  # rule 8's "waiting since" texts, by minute and by time
        self.expected_texts: dict[tuple[dt.datetime, dt.datetime], str] = {}  # rule 8's start range texts, by their rounded times
        self.ranges: dict[int, eta.Range] = {}  # rule 8's start ranges (eta.ranges)
        self.demand = Demand(q.waiting, {t.id for t in self.acquiring if self.waits_for_gke(t)})

    def is_live(self, task_id: int) -> bool:
        return task_id in self.held_ids or task_id in self.queue.waiting

    # ---- the waiting list ----------------------------------------------------------------

    def waiting_count(self) -> int:
        return 0 if self.all_left else len(self.waiting) - len(self.left)

    def waiting_heads(self) -> list[QueueTask]:
        """Each actor's oldest Waiting task of the highest priority (what the pick rule reads)."""
        return [] if self.all_left else self.waiting.top_heads(self.left)

    def waiting_order(self) -> list[QueueTask]:
        """Every Waiting task still on the list, in pick order (rule 8: once per step)."""
        return [] if self.all_left else scheduling.queue_order(self.waiting, self.queue.last_granted, self.left)

    def waiting_past_deadline(self) -> list[QueueTask]:
        """The Waiting tasks still on the list whose start deadline has come (``deadline``)."""
        return [] if self.all_left else self.waiting.past_deadline(self.now, self.left)

    def leave(self, t: QueueTask) -> None:
        self.left.add(t.id)

    def forget_holder(self, t: QueueTask) -> None:
        """The slot holder ``t`` ends in this call: the slot is free for the later rules."""
        self.acquiring.remove(t)
        self.holders.remove(t)
        self.demand.discard(t.id)

    def leave_all(self) -> None:
        self.all_left = True

    # ---- output ------------------------------------------------------------------------

    def msg(self, key: str, **kw: object) -> str:
        return messages.text(key, self.settings.lang, **kw)

    def add(self, what: str, *effects: Effect) -> None:
        if effects:
            self.groups.append(EffectGroup(what, tuple(effects)))

    def say(self, t: QueueTask, text: str, what: str) -> None:
        """Refresh the task's Message, only when the text changes."""
        if text != t.message:
            self.add(f"task {t.id}: {what}", UpdateTask(t.id, (t.phase,), text))

    def say_effect(self, t: QueueTask, text: str) -> list[Effect]:
        return [UpdateTask(t.id, (t.phase,), text)] if text != t.message else []

    # ---- idle pools ----------------------------------------------------------------------

    def waits_for_gke(self, t: QueueTask) -> bool:
        """An acquiring task that waits for GKE to give it capacity: no pool yet, a create
        not finished, or (WaitingForNode) a pool short of Ready nodes. Such a task takes an
        idle pool of its topology that comes free (``acquire.switch_to_idle``)."""
        if t.phase == lc.DISPATCHING:
            return False
        lease = self.lease_by_task.get(t.id)
        if lease is None or lease.state in (LeaseState.REQUESTED, LeaseState.CREATING):
            return True
        return t.phase == lc.WAITING_FOR_NODE and self.ready_nodes(lease.name) < t.spec.shape.hosts

    def parked(self, t: QueueTask) -> bool:
        """A flex-start task whose pool GKE has created and whose Job waits on it, with no node
        for ``capacity_wait_park_s``: it waits for GKE's capacity (queued by GKE, not by Falcon),
        and that wait no longer holds the queue's slot (``slot_free``)."""
        s = self.settings
        if s.strict_slot or s.capacity_waits_per_queue <= 1 or t.phase != lc.WAITING_FOR_NODE:
            return False
        lease = self.lease_by_task.get(t.id)
        if lease is None or lease.state != LeaseState.IN_USE or not render.scales_from_zero(lease.supply_mode):
            return False
        pool = self.cluster.pools.get(lease.name)
        return pool is not None and pool.registered == 0 and self.phase_age_s(t) >= s.capacity_wait_park_s

    def slot_free(self, mode: SupplyMode | None = None) -> bool:
        """The slot serializes acquiring new capacity: free when no task acquires, or when
        every acquiring task has parked its capacity wait and fewer than
        ``capacity_waits_per_queue`` wait so. ``mode``: the slot of that supply mode
        (``slot_per_supply``): only the acquiring tasks of that mode count, since a task
        waiting for one supply's capacity takes nothing another supply would give."""
        acquiring = self.acquiring if mode is None else [t for t in self.acquiring if self.supply_of(t) == mode]
        if not acquiring:
            return True
        return len(acquiring) < self.settings.capacity_waits_per_queue and all(self.parked(t) for t in acquiring)

    def supply_of(self, t: QueueTask) -> SupplyMode:
        """The supply mode ``t`` acquires on this cluster (its spec's, else the cluster's default)."""
        return scheduling.supply_mode_for(t.spec, self.queue.cluster.default_reservation)

    def free_idle(self, t: QueueTask, ready: bool = False) -> Lease | None:
        """An idle pool that can be handed to ``t`` now: its create finished (it was Ready
        once), no Job of an earlier task still holds it, and its nodes outlive ``t``'s run
        (``pools.nodes_last_for``: flex-start's run limit), and no reservation pool while the
        reservation hold keeps ``t`` out of the held room (``reservation_short``). The one with the most Ready nodes
        first: a pool the autoscaler emptied would make the task wait for capacity while
        another idle pool of its topology holds nodes (a 1,000-task soak ended with a queue
        stuck so). ``ready``: only a pool whose every node is Ready (a hand-over that needs no
        capacity from GKE). None that ``t`` passes over for its own reservation's room
        (``passes_over``)."""
        run_s = float(t.spec.timeout_seconds)
        held = self.reservation_short(t)  # a reservation pool's hosts go to an older task's held room (hold)
        hosts = t.spec.shape.hosts
        free = [
            l for l in self.idle
            if l.id not in self.claimed and self.handable(l) and nodes_last_for(l, self.cluster.pools.get(l.name), self.now, run_s)
            and not (held and l.supply_mode == SupplyMode.RESERVATION) and (not ready or self.ready_nodes(l.name) >= hosts)
            and not self.passes_over(t, l)
        ]  # fmt: skip
        return max(free, key=lambda l: self.ready_nodes(l.name), default=None)  # max keeps the first of equals

    def passes_over(self, t: QueueTask, lease: Lease) -> bool:
        """With ``reservation_room_first``: ``lease`` is an idle pool of another supply short of
        ``t``'s nodes (its create may still be under way), which would wait for that supply's
        capacity, while ``t``'s own reservation has room for it now: ``t`` creates instead."""
        return (
            self.settings.reservation_room_first
            and lease.supply_mode != self.supply_of(t)
            and self.ready_nodes(lease.name) < t.spec.shape.hosts
            and self.reservation_room(t)
        )

    def ready_nodes(self, pool: str) -> int:
        p = self.cluster.pools.get(pool)
        return p.ready if p is not None else 0

    def finishing_idle(self) -> Lease | None:
        """An idle pool whose create its task abandoned and which is not finished yet."""
        return next((l for l in self.idle if l.id not in self.claimed and l.ready_at is None), None)

    def handable(self, lease: Lease) -> bool:
        return lease.ready_at is not None and not any(
            j.node_pool == lease.name and j.holds_pool for j in self.cluster.jobs.values()
        )

    def held_back(self, t: QueueTask, create: bool) -> hold.Hold | None:
        """The reservation hold that keeps ``t`` out of the held room: it applies to ``t``
        and ``t``'s run, on a pool handed over (``create``: created now), would not end
        before the room must be free (``hold``'s contract). None: not held back."""
        r = self.cluster.reservation
        if r is None or not self.queue.reservation_waiters:
            return None
        h = hold.hold_for(self.queue, r, self.now, self.settings, t)
        if h is None:
            return None
        by = hold.shadow(h, r, self.queue.reservation_occupants, self.queue.cluster, self.now, self.settings)
        return None if hold.ends_in_time(t, by, self.now, self.settings, create) else h

    def reservation_room(self, t: QueueTask) -> bool:
        """``t`` acquires the cluster's reservation and it has room for ``t``'s slice now,
        the room the hold keeps for an older task of another topology left out."""
        r = self.cluster.reservation
        if r is None or self.supply_of(t) != SupplyMode.RESERVATION:
            return False
        held = self.held_back(t, create=True)
        claimed = r.claimed + (held.hosts if held is not None else 0)
        return scheduling.reservation_headroom(r.count, r.in_use, t.spec.shape.hosts, claimed=claimed).enough

    def reservation_short(self, t: QueueTask) -> bool:
        """``t`` is held back and the reservation has fewer free hosts than the held room:
        no reservation pool is handed to it."""
        return hold.short(self.held_back(t, create=False), self.cluster.reservation)

    def reservation_pool_wanted(self) -> bool:
        """Whether a reservation pool released or idle now is kept for the task next in
        line for it (an acquiring task, else the next pick): always, unless a hold is short
        of room and that task would be held back (then the pool is deleted, ``hold``)."""
        r = self.cluster.reservation
        if r is None or not self.queue.reservation_waiters or not hold.short(hold.hold_for(self.queue, r, self.now, self.settings), r):
            return True
        nxt = scheduling.pick_next(self.waiting_heads(), self.queue.last_granted) if self.waiting_count() else None
        takers = [t for t in self.acquiring if t.id in self.demand] + ([nxt] if nxt is not None else [])
        return any(not self.reservation_short(t) for t in takers)

    def unclaimed_idle(self) -> int:
        return sum(1 for l in self.idle if l.id not in self.claimed)

    # ---- keep-or-delete --------------------------------------------------------------------

    def release(self, lease: Lease, holder: int | None) -> list[Effect]:
        """The deprovisioning decision for a pool its task no longer needs: keep it Idle
        while more tasks of its topology wait for a pool than there are idle pools (unless
        ``idle_pool_handover`` is off; a reservation pool only while the reservation hold
        lets the task next in line for it have it: ``reservation_pool_wanted``), or for its
        keep-alive window (``pools.kept_alive``)."""
        st = lease.state
        if st not in lc.LEASE_HELD:
            return []
        want = len(self.demand) - (holder in self.demand) - (self.unclaimed_idle() + self.kept)
        q, s = self.queue, self.settings
        wanted = want > 0 and s.idle_pool_handover and (lease.supply_mode != SupplyMode.RESERVATION or self.reservation_pool_wanted())
        alive = kept_alive(s, lease, self.now, active=q.cluster_active, other_topology_waiting=q.other_topology_waiting)
        if q.cluster_active and st != LeaseState.REQUESTED and (wanted or alive):
            self.kept += 1
            return [MoveLease(lease.id, lease.name, (st,), LeaseState.IDLE, {"task_id": None})]
        return self.delete_lease(lease, holder)

    @staticmethod
    def delete_lease(lease: Lease, holder: int | None) -> list[Effect]:
        return [
            MoveLease(lease.id, lease.name, (lease.state,), LeaseState.DELETING, {"task_id": holder}),
            DeletePool(lease.name),
        ]

    def finish(self, t: QueueTask, to: Phase, message: str, keep_pool: bool = True) -> None:
        """End a task: the terminal write, then the Job's delete, then the pool's
        keep-or-delete. The terminal write comes first because a Job that ended is the only
        record of how (a group stopped after the delete would leave a live task with no
        Job, and a live task with no Job gets a new one: a second Job, seen by the chaos
        soak); a crash after it leaves a terminal task's Job and lease, which rules 6 and
        7 clean up. The Job goes before the pool: a Job that failed or ran out of time may
        still hold the pool's TPUs; when none does (no Job, or one that succeeded), a pool
        kept Idle moves with the terminal write (one compare-and-set over both rows) and the
        Job's delete follows. ``keep_pool=False``: the pool is deleted whatever waits (a
        refused Job)."""
        lease = self.lease_by_task.get(t.id)
        pool: list[Effect] = []
        if lease is not None:
            pool = self.release(lease, t.id) if keep_pool else self.delete_lease(lease, t.id)
        done = Transition(t.id, (t.phase,), to, message)
        job = self.job_of(t)
        kept = len(pool) == 1 and isinstance(pool[0], MoveLease) and pool[0].to == LeaseState.IDLE
        if kept and (job is None or not job.holds_pool):
            self.add(f"task {t.id}: finish {to}", done, pool[0], *self.delete_job(t))
            return
        self.add(f"task {t.id}: finish {to}", done, *self.delete_job(t), *pool)

    # ---- Jobs ----------------------------------------------------------------------------------

    def job_of(self, t: QueueTask) -> JobView | None:
        j = self.cluster.jobs.get(t.id)
        return j if j and j.phase != JobPhase.DELETED else None

    def delete_job(self, t: QueueTask) -> list[Effect]:
        j = self.job_of(t)
        return [DeleteJob(t.id, j.namespace, j.name)] if j is not None else []

    def fleet_ended(self, t: QueueTask) -> bool:
        """The task's Job failed by the fleet's fault, or its pods have not all been ready
        for longer than ``disruption_grace_s`` while nodes under them are NotReady or gone:
        a recovery (``disrupt``). True when it was decided here."""
        job = self.job_of(t)
        if job is None or job.attempt < t.attempt:
            return False
        if job.phase == JobPhase.FAILED:
            verdict = self.fleet_fault(t, job)
        elif (
            t.phase == lc.RUNNING
            and job.short_since is not None
            and (self.now - job.short_since).total_seconds() > self.settings.disruption_grace_s
        ):
            verdict = self.fleet_fault(t, job, ended=False)
        else:
            return False
        if not verdict.fleet:
            return False
        self.disrupt(t, job, verdict)
        return True

    def job_outcome(self, t: QueueTask) -> tuple[Phase, str] | None:
        """The terminal phase and Message a finished Job gives its task, if it has finished
        (a failure here is the task's own: ``fleet_ended`` is asked first)."""
        job = self.job_of(t)
        if job is not None and job.attempt < t.attempt:
            return None  # an earlier run's (``earlier_attempt_left``)
        if job is not None and job.phase == JobPhase.SUCCEEDED:
            return lc.SUCCEEDED, self.msg("succeeded")
        if job is not None and job.phase == JobPhase.FAILED:
            return lc.failed(Reason.JOB_FAILED), self.msg("job_failed", detail=job.message or f"Job {job.name} failed")
        return None

    # ---- disruptions: the fleet, not the task, ended a run ------------------------------------

    def fleet_fault(self, t: QueueTask, job: JobView, ended: bool = True) -> faults.Verdict:
        """Whose fault ended (``ended``) or is stalling (not ``ended``) this Job's run."""
        lease = self.lease_by_task.get(t.id)
        pool_name = t.node_pool_name or job.node_pool or (lease.name if lease else "")
        pool = self.cluster.pools.get(pool_name)
        flex = lease is not None and lease.supply_mode == SupplyMode.FLEX_START
        # an absent pool proves something only for a pool the queue asked about (its lease's)
        known = self.cluster.synced and lease is not None and lease.name == pool_name
        if ended:
            return faults.classify(job.evidence, pool, flex=flex, pools_synced=known, job_message=job.message, hosts=t.spec.shape.hosts)
        return faults.degraded(job, pool, t.spec.shape.hosts, flex=flex, pools_synced=known)

    def running_text(self, t: QueueTask, active: int) -> str:
        """The Running Message; after a disruption it says which attempt runs and why."""
        if t.recoveries:
            return self.msg("running_attempt", active=active, expected=t.spec.shape.hosts, attempt=self.attempt_text(t))
        return self.msg("running", active=active, expected=t.spec.shape.hosts)

    def earlier_attempt_left(self, t: QueueTask) -> bool:
        """A Job of an earlier run of ``t`` is still there: delete it and wait (two attempts
        of one task never run at once: the next Job is created once it is gone)."""
        job = self.job_of(t)
        if job is None or job.attempt >= t.attempt:
            return False
        if not job.deleting:
            self.add(f"task {t.id}: Job {job.name} of run {job.attempt} still there", DeleteJob(t.id, job.namespace, job.name))
        return True

    def max_recoveries(self, t: QueueTask) -> int:
        return t.spec.max_recoveries if t.spec.max_recoveries is not None else self.settings.max_recoveries

    def attempt_text(self, t: QueueTask, last: Disruption | None = None) -> str:
        """"Attempt 2 of 4 after maintenance at ... (detail)": which attempt and why (the
        attempt counts the disruptions, not the pools a recovery left)."""
        history = t.recoveries if last is None else (*t.recoveries, last)
        if not history:
            return ""
        last = history[-1]
        return self.msg(
            "attempt", attempt=len(history) + 1, attempts=self.max_recoveries(t) + 1, kind=last.kind,
            at=last.at.strftime("%Y-%m-%d %H:%M:%S"), detail=f"node {last.node}: {last.detail}" if last.node and last.node not in last.detail else last.detail,
        )

    def disrupt(self, t: QueueTask, job: JobView, verdict: faults.Verdict) -> None:
        """The fleet ended run ``job.attempt`` of ``t``: record it, then a new attempt
        (Recovering, the Job deleted) or, past the task's max_recoveries, Failed/Disrupted.
        The record comes first: it is what makes the next Job a new attempt, and writing
        it again after a crash changes nothing."""
        assert verdict.kind is not None
        now_d = Disruption(job.attempt, str(verdict.kind), verdict.node, job.name, verdict.detail, self.now)
        history = tuple(x for x in t.recoveries if x.attempt < job.attempt) + (now_d,)
        record = RecordDisruption(t.id, job.attempt, str(verdict.kind), verdict.node, job.name, verdict.detail)
        limit = self.max_recoveries(t)
        if len(history) > limit:
            items = "; ".join(
                self.msg("disruption_item", n=i + 1, kind=x.kind, node=x.node or "?", at=x.at.strftime("%Y-%m-%d %H:%M:%S"), detail=x.detail)
                for i, x in enumerate(history)
            )
            text = self.msg("disrupted", count=len(history), limit=limit, history=items)
            self.groups.append(EffectGroup(f"task {t.id}: disrupted (record)", (record,)))
            self.finish(t, lc.failed(Reason.DISRUPTED), text)
            return
        text = self.msg("recovering_job_gone", attempt=self.attempt_text(t, now_d), job=job.name, since=stamp(self.now))
        fields = {"dispatched_at": None, "job_uid": None}  # the next attempt's timeout clock starts afresh
        step: Effect = (
            UpdateTask(t.id, (lc.RECOVERING,), text, fields) if t.phase == lc.RECOVERING else Transition(t.id, (t.phase,), lc.RECOVERING, text, fields)
        )
        self.add(f"task {t.id}: run {job.attempt} disrupted ({verdict.kind}), recovering", record, step, DeleteJob(t.id, job.namespace, job.name))

    def requeued_text(self, t: QueueTask) -> str:
        """What a Waiting task that was taken off a pool waits for again, before its position:
        the recovery it is in (``attempt_text``), or the pool it gave back to another
        topology and when (its last ``released`` row); "" for a task that has not run."""
        last = t.disruptions[-1] if t.disruptions else None
        if last is not None and last.kind == RELEASED:
            n, limit = len(t.releases), self.settings.pool_release_limit
            return self.msg("waiting_released", detail=last.detail, at=stamp(last.at), n=n, limit=limit)
        return self.msg("waiting_recovery", attempt=self.attempt_text(t)) if t.recoveries else ""

    def waited(self, t: QueueTask) -> str:
        """`` (waiting since 2026-01-05 14:03 UTC)``: when the task entered its phase (the
        durable event log), for a Message; "" when that is not known."""
        return self.msg("waiting_since", at=self.since(t)) if t.phase_since else ""

    def since(self, t: QueueTask) -> str:
        """When the task entered its phase, as the Messages show it (now when not known)."""
        return stamp(t.phase_since or self.now)

    def phase_age_s(self, t: QueueTask) -> float:
        """Seconds the task has spent in its phase, from the durable event log (0 if unknown)."""
        return max(0.0, (self.now - t.phase_since).total_seconds()) if t.phase_since else 0.0

    def failing_s(self, t: QueueTask, since: dt.datetime | None) -> float:
        """Seconds the task has waited in its phase on answers that keep failing since
        ``since`` (an outage's first failed answer; None: not known, the phase alone): from
        the later of the two, so a wait of another kind before the failures is not theirs."""
        age = self.phase_age_s(t)
        return age if since is None else min(age, max(0.0, (self.now - since).total_seconds()))
