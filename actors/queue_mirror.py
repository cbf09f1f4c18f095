"""The queue's view of its own rows and leases, kept between rounds and steps.

Contract
--------
``QueueMirror`` holds what a ``QueueReconciler`` last knew of its queue's rows (the
``jobs`` rows of this cluster and topology), its node-pool leases and its last granted
actor, and the decisions' value of each row. It does no I/O and reads no clock: it is
changed only by what the database answered, in two ways.

- A read (``merge``): the rows a ``Store.queue_snapshot`` returned, all of them (a full
  read) or the incremental part, the leases when they were read with it, and for the
  rows new to it when each entered its phase and whether the fleet disrupted it.
- A write result (``wrote_task``, ``left``, ``wrote_lease``, ``created_lease``,
  ``messages_written``): the columns of the queue's own won writes, applied to the kept
  rows so that the next round decides on them without reading them back. This queue is
  the only writer of its leases and of its tasks' moves; others only add tasks or abort
  them, which the next read sees. A lost write, or one whose row is not kept, sets
  ``must_read`` (rows) or ``leases_stale`` (leases): the next round reads them. A won
  move into Provisioning or Dispatching makes its task's actor the last granted, as the
  store derives it from that move's event row (``store.queues``): it is read once, at
  the first full read (``granted_read``), and kept from the queue's own moves after.

Everything here is soft state: losing it costs one full read. The task values are kept in
two parts (``held``: the few that are not Waiting; ``waiting``: a
``scheduling.WaitingIndex`` in pick-rule order); ``values`` rebuilds only the rows in
``changed``, so a round does no pass over the waiting list.

Nomenclature: ``not_waiting`` are the rows that were not Waiting at the last read (an
incremental read asks for them again); ``wrote`` are the tasks this queue wrote since the
last read (asked again too); ``seq`` is the newest ``falcon_task_queue.seq`` read.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Collection, Iterable
from dataclasses import fields as dc_fields
from dataclasses import replace

from falcon_ray import lifecycle as lc
from falcon_ray import scheduling
from falcon_ray.lifecycle import Phase
from falcon_ray.model import Disruption, Lease, QueueTask, QueueTasks, SubmitError, Task
from falcon_ray.spec import SpecError, TaskSpec, parse_spec
from falcon_ray.store import SLOT_TAKEN, QueueRead, WriteResult, clip_message

TASK_COLUMNS = frozenset(f.name for f in dc_fields(Task))
LEASE_COLUMNS = frozenset(f.name for f in dc_fields(Lease))

# (ids whose phase entry is not known, ids whose disruptions are not known) ->
# (entered: (id, phase) -> when, disruptions: id -> runs): the event log's answer
EntryReader = Callable[[Collection[int], Collection[int]], tuple[dict, dict]]


class QueueMirror:
    """The rows and leases of one queue as last read, with the queue's own writes applied."""

    def __init__(self, topology: str) -> None:
        self.topology = topology
        self.rows: dict[int, Task] = {}
        self.not_waiting: set[int] = set()
        self.wrote: set[int] = set()
        self.seq = 0
        self.full_read_at = -float("inf")  # monotonic time of the last full read
        self.last_granted = ""
        self.granted_read = False  # last_granted was read (it is kept from the queue's own picks after)
        self.leases: list[Lease] | None = None  # None: never read
        self.leases_stale = True
        self.must_read = True
        # rows new to the mirror since the queue last took them, (created_at, actor, id): the
        # queue keeps its recent arrivals for the start estimate (``eta._Overtakers``)
        self.arrived: list[tuple[dt.datetime, str, int]] = []
        self._init_caches()
        self._init_values()

    def _init_caches(self) -> None:
        """Per-task caches, each dropped with its task."""
        self.specs: dict[int, TaskSpec] = {}
        self.phase_since: dict[int, tuple[Phase, dt.datetime]] = {}
        self.submit_errors: dict[int, SubmitError] = {}
        # the fleet's disruptions of each task's earlier runs: read once per task when the
        # queue first sees it, then kept from this queue's own writes
        self.disrupted: dict[int, tuple[Disruption, ...]] = {}
        # the phases (and when) of the tasks this queue picked, from its own won moves
        self.trails: dict[int, list[tuple[Phase, dt.datetime]]] = {}

    def _init_values(self) -> None:
        self.values: dict[int, QueueTask] = {}  # the decisions' value of each row
        self.waiting = scheduling.WaitingIndex()
        self.held: dict[int, QueueTask] = {}
        self._held_values: tuple[QueueTask, ...] | None = ()  # None: held changed
        self.changed: set[int] = set()  # rows read or written since their value was built

    # ---- reads ---------------------------------------------------------------------------

    def asked(self) -> set[int]:
        """The ids an incremental read asks for: the rows not Waiting and the ones written."""
        return self.not_waiting | self.wrote

    def merge(self, read: QueueRead, full: bool, at: float, asked: Collection[int]) -> None:
        """Merge a read of the queue's rows (``asked``: the ids the read asked for; ``at``:
        monotonic time). Rows not returned that were asked for (or every row, on a full
        read) have left the queue. Sets ``leases_stale`` when the leases were not read with
        the rows and another writer's change may change which refused ones count."""
        got = {t.id: t for t in read.tasks}
        gone = set((self.rows.keys() if full else asked) - got.keys())  # ended, moved away or unassigned
        if read.leases is not None:
            self.leases, self.leases_stale = read.leases, False
        elif self._refused_may_change(gone, got):
            self.leases_stale = True
        for tid in gone:
            self.drop(tid)
        self.changed |= gone | got.keys()
        self.arrived += [(row.created_at, row.actor, tid) for tid, row in got.items() if tid not in self.rows]
        self.rows.update(got)
        self._entries_read(read, got)
        if read.last_granted is not None:
            self.last_granted, self.granted_read = read.last_granted, True
        if full:
            self.full_read_at, self.seq = at, read.seq
        else:
            self.seq = max(self.seq, read.seq)
        self.wrote.clear()
        self.not_waiting = {tid for tid in self.not_waiting | got.keys() if tid in self.rows and self.rows[tid].phase != lc.WAITING}

    def _entries_read(self, read: QueueRead, got: dict[int, Task]) -> None:
        """Keep the phase entries and the "never disrupted" the read brought for its new rows:
        ``task_values`` then reads the event log only for the others."""
        for tid, (entered, disrupted) in read.entries.items():
            row = got.get(tid)
            if row is None:
                continue
            if entered is not None:
                self.phase_since[tid] = (row.phase, entered)
            if not disrupted:
                self.disrupted[tid] = ()

    def _refused_may_change(self, gone: Collection[int], got: dict[int, Task]) -> bool:
        """Whether another writer's change to the rows read may change which Deleted
        (refused) leases the queue's lease read returns: those of tasks acquiring. A task
        that was acquiring and left or moved does; a new task, or a change to one that
        neither was nor is acquiring, does not (only this queue moves a task into an
        acquiring phase)."""
        for tid in gone:
            old = self.rows.get(tid)
            if tid not in self.wrote and (old is None or old.phase in lc.ACQUIRING_PHASES):
                return True
        for tid, t in got.items():
            old = self.rows.get(tid)
            if tid in self.wrote or old is None or old == t:
                continue
            if old.phase in lc.ACQUIRING_PHASES or t.phase in lc.ACQUIRING_PHASES:
                return True
        return False

    def read_leases(self, leases: list[Lease]) -> None:
        self.leases, self.leases_stale = leases, False

    # ---- the decisions' values -----------------------------------------------------------

    def spec(self, task: Task) -> TaskSpec | None:
        """The task's parsed spec (parsed once; None when it does not parse)."""
        spec = self.specs.get(task.id)
        if spec is None:  # the snapshot carries the spec text of tasks not parsed yet
            try:
                spec = parse_spec(task.spec)
            except SpecError:
                return None
            self.specs[task.id] = spec
        return spec

    def task_values(self, read_entries: EntryReader) -> QueueTasks:
        """The decisions' values of the queue's tasks, rebuilt only for the rows in
        ``changed``: a changed Waiting task is put in (or taken out of) the ``WaitingIndex``,
        O(log N). ``read_entries`` answers when a task entered its phase and its disruptions,
        for the tasks whose kept ones are not current."""
        changed, self.changed = self.changed, set()
        rows = []
        for tid in changed:
            t = self.rows.get(tid)
            spec = self.spec(t) if t is not None else None
            if spec is None or spec.topology != self.topology:
                self._forget_value(tid)
                continue
            rows.append(t)
        self._read_entries(rows, [t.id for t in rows if t.id not in self.disrupted], read_entries)
        for t in rows:
            self._set_value(self._value_of(t))
        if self._held_values is None:
            self._held_values = tuple(self.held[k] for k in sorted(self.held))
        return QueueTasks(self._held_values, self.waiting.value())

    def _value_of(self, t: Task) -> QueueTask:
        entry = self.phase_since.get(t.id)
        return QueueTask(
            id=t.id,
            name=t.name,
            actor=t.actor,
            phase=t.phase,
            created_at=t.created_at,
            dispatched_at=t.dispatched_at,
            spec=self.specs[t.id],
            node_pool_name=t.node_pool_name,
            job_uid=t.job_uid,
            message=t.message,
            phase_since=entry[1] if entry else None,
            disruptions=self.disrupted.get(t.id, ()),
        )

    def _read_entries(self, tasks: list[Task], disrupted: Collection[int], read_entries: EntryReader) -> None:
        """When each of ``tasks`` entered its current phase: kept, else from the event log;
        and the fleet's disruptions of the tasks ``disrupted`` (not known yet), in the same read."""
        unknown = {t.id for t in tasks if self.phase_since.get(t.id, (None,))[0] != t.phase}
        if not unknown and not disrupted:
            return
        entered, found = read_entries(unknown, disrupted)
        for t in tasks:
            if t.id in unknown:
                self.phase_since[t.id] = (t.phase, entered.get((t.id, t.phase)) or t.updated_at)
        self.disrupted.update({tid: found.get(tid, ()) for tid in disrupted})

    def _set_value(self, value: QueueTask) -> None:
        self.values[value.id] = value
        if value.phase == lc.WAITING:
            if self.held.pop(value.id, None) is not None:
                self._held_values = None
            self.waiting.put(value)
        else:
            self.waiting.discard(value.id)
            self.held[value.id] = value
            self._held_values = None

    def _forget_value(self, tid: int) -> None:
        self.values.pop(tid, None)
        self.waiting.discard(tid)
        if self.held.pop(tid, None) is not None:
            self._held_values = None

    def drop(self, tid: int) -> None:
        """Forget a task that left the queue (its row, parsed spec and every cache of it)."""
        for cache in (self.rows, self.specs, self.submit_errors, self.phase_since, self.trails, self.disrupted):
            cache.pop(tid, None)
        self._forget_value(tid)

    # ---- the queue's own writes ----------------------------------------------------------

    def writing(self, tid: int) -> None:
        """The queue is about to write task ``tid``: the next read asks for its row, whatever the write does."""
        self.wrote.add(tid)

    def wrote_task(self, tid: int, result: WriteResult, phase: Phase | None = None) -> None:
        """Apply a won write's columns to the kept row (``phase``: the phase a won move
        entered, at the result's time), so that the next round decides on it without
        reading it back; a row that became terminal or left the cluster leaves the queue.
        A lost write, or one to a row not kept, makes the next round read."""
        row = self.rows.get(tid)
        if row is None or not result.won:
            self.must_read = True
            return
        if phase is not None and result.moved and result.at is not None:  # its event row is the phase entry
            self.phase_since[tid] = (phase, result.at)
        if phase in SLOT_TAKEN and result.moved:  # the store's last granted reads this move's event row
            self.last_granted = row.actor
        new = replace(row, **{k: v for k, v in result.values.items() if k in TASK_COLUMNS})
        if new.terminal or new.cluster_id != row.cluster_id:
            self.left(tid)
            return
        self.rows[tid] = new
        self.changed.add(tid)
        if new.phase != lc.WAITING:
            self.not_waiting.add(tid)

    def left(self, tid: int) -> None:
        """A task this queue's own write took out of it (terminal, moved, unassigned)."""
        self.drop(tid)
        self.changed.add(tid)
        self.not_waiting.discard(tid)

    def created_lease(self, lease: Lease) -> None:
        """A lease row as written (or adopted by its name)."""
        rows = [x for x in self.leases or () if x.id != lease.id]
        self.leases = sorted([*rows, lease], key=lambda x: x.id)

    def wrote_lease(self, lease_id: int, result: WriteResult) -> None:
        """Apply a lease write's columns to the kept lease rows (this queue is their only
        writer); a lost one, or one to a lease not kept, makes the next round read them."""
        old = next((x for x in self.leases or () if x.id == lease_id), None)
        if old is None or not result.won:
            self.leases_stale = True
            return
        self.created_lease(replace(old, **{k: v for k, v in result.values.items() if k in LEASE_COLUMNS}))

    def refused_leases_kept(self) -> bool:
        """Whether a kept lease was refused for capacity (which of those count follows the
        acquiring tasks: a write may change it, so the next round reads the leases)."""
        return any(x.refused_at is not None for x in self.leases or ())

    def messages_written(self, updates: Iterable[tuple[int, Phase, str]]) -> None:
        """The kept rows carry the Messages just written (a row whose phase moved meanwhile
        kept its old one, and is read again as a row that is not Waiting any more)."""
        waiting = []
        for tid, phase, text in updates:
            row = self.rows.get(tid)
            if row is None or row.phase != phase:
                continue
            text = clip_message(text)
            self.rows[tid] = row.with_message(text)
            value = self.values.get(tid)
            if value is None:
                continue
            value = self.values[tid] = value.with_message(text)
            if value.phase == lc.WAITING and tid in self.waiting:
                waiting.append(value)
            else:
                self._set_value(value)
        self.waiting.replace(waiting)

    def disruption_written(self, tid: int, run: Disruption) -> None:
        """Keep a run the fleet ended (attempt ``run.attempt``); one not following the kept
        ones is read back with the row."""
        known = self.disrupted.get(tid, ())
        if len(known) == run.attempt:
            self.disrupted[tid] = (*known, run)
        elif len(known) < run.attempt:
            self.disrupted.pop(tid, None)
        self.changed.add(tid)
