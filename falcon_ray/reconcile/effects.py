"""What a decision asks for: effects, grouped per task or per lease.

Contract
--------
An effect names one idempotent step: a compare-and-set write (``Transition``,
``UpdateTask``, ``RefreshMessages``, ``MoveLease``,
``CreateLease``, ``RecordOperation``, ``Unassign``) or a call to the edge cluster
(``EnsurePool``, ``DeletePool``, ``SubmitJob``, ``DeleteJob``); ``MoveTask`` is both
(a compare-and-set, then the two queues' wake-ups). An ``EffectGroup``
is carried out in order and stops at its first failed or lost step; the next tick
decides again from what is observed then, so a group cut short by a crash is simply
decided again.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from falcon_ray import lifecycle as lc
from falcon_ray.lifecycle import LeaseState, Phase
from falcon_ray.spec import SupplyMode


@dataclass(frozen=True)
class Transition:
    task_id: int
    expect: tuple[Phase, ...]
    to: Phase
    message: str
    fields: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class UpdateTask:
    task_id: int
    expect: tuple[Phase, ...]
    message: str | None
    fields: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class RefreshMessages:
    updates: tuple[tuple[int, Phase, str], ...]


@dataclass(frozen=True)
class CreateLease:
    task_id: int
    name: str
    supply_mode: SupplyMode


@dataclass(frozen=True)
class RecordOperation:
    """Write GKE's operation name on the lease: it outlives the ClusterActor's memory."""

    lease_id: int
    operation: str


@dataclass(frozen=True)
class ClaimReservation:
    """Take ``hosts`` of the cluster's reservation for pool ``name`` from the ledger (its one
    writer is the ClusterActor); refused when another queue took them first."""

    name: str
    hosts: int


@dataclass(frozen=True)
class MarkReady:
    """An idle pool whose create was abandoned by its task has finished it: it may be handed over."""

    lease_id: int


@dataclass(frozen=True)
class EnsurePool:
    name: str
    request: dict[str, Any]
    operation: str | None = None  # a create GKE accepted before: follow it instead of asking again


@dataclass(frozen=True)
class MoveLease:
    lease_id: int
    name: str
    expect: tuple[LeaseState, ...]
    to: LeaseState
    fields: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class DeletePool:
    name: str


@dataclass(frozen=True)
class SubmitJob:
    task_id: int
    manifest: dict[str, Any]
    service: dict[str, Any] | None
    first: bool  # dispatched_at is written with the Job: the timeout clock starts now
    phase: Phase = lc.DISPATCHING  # the task's phase when the Job's uid is written
    message: str | None = None  # written with the Job's uid (the Message of a Job just accepted)
    # the group's move into ``phase`` already wrote ``message`` (and dispatched_at when
    # ``first``): an accepted submit writes nothing more (the uid goes with the Running
    # move); a refused first one clears dispatched_at, so the clock starts with the Job
    recorded: bool = False


@dataclass(frozen=True)
class DeleteJob:
    task_id: int
    namespace: str
    name: str


@dataclass(frozen=True)
class RecordDisruption:
    """The fleet ended run ``attempt`` of a task: the durable record, written before the
    task leaves the run (the number of such records is the task's next attempt)."""

    task_id: int
    attempt: int
    kind: str
    node: str
    job: str
    detail: str


@dataclass(frozen=True)
class Unassign:
    task_id: int
    message: str
    expect: Phase = lc.WAITING


@dataclass(frozen=True)
class MoveTask:
    """ClusterBusy here -> Waiting on another cluster's queue (a compare-and-set on the
    phase and the cluster); both queues are woken."""

    task_id: int
    from_cluster_id: str
    to_cluster_id: str
    to_cluster: str
    topology: str
    message: str


Effect = (
    Transition | UpdateTask | RefreshMessages | CreateLease | ClaimReservation | RecordOperation | MarkReady | EnsurePool
    | MoveLease | DeletePool | SubmitJob | DeleteJob | Unassign | MoveTask | RecordDisruption
)


@dataclass(frozen=True)
class EffectGroup:
    what: str  # e.g. "task 42: finish", for logs
    effects: tuple[Effect, ...]
