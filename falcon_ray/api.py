"""The read API for the upper layer: HTTP/JSON, read-only, on the controller's health port.

Contract
--------
``create_app(source, token_file=..., probes=...)`` returns one ASGI application (FastAPI)
that serves

- ``GET /v1/tasks/{task_id}``: one task as the upper layer follows it (``TaskOut``);
- ``GET /v1/queues``: per (cluster, topology) the slot holder, a page of the waiting
  tasks in pick order, the running tasks and the pools (``QueuesOut``);
- ``GET /v1/clusters``: every registered cluster, its reservation's ledger and its pools
  (``ClustersOut``);
- ``GET /openapi.json``: the document FastAPI generates from the response models below;
- ``GET /healthz`` and ``GET /readyz`` when ``probes`` is given (``falcon_ray.health``):
  the health report with 200 or 503, never behind the token, so the kubelet needs none.

Read-only: ``source`` (``Source``) answers from the Store's rows and the live actors'
snapshots and is never asked to change anything. Every response is bounded: each list
has a ``limit`` with a maximum (``MAX_LIMIT``), the waiting tasks of a queue are paged
(``offset``, ``next_offset``), the number of queues and clusters is capped (``MAX_QUEUES``,
``MAX_CLUSTERS``) and a capped list says so (``*_total``, ``truncated``). An unknown task
is 404, a malformed id or query 422, both with a JSON body; a source that cannot answer
(the database or Ray unreachable) is 503 with a JSON body.

The token: when ``token_file`` names a file, every ``/v1`` request must carry
``Authorization: Bearer <the file's content, stripped>``, compared in constant time; the
file is read again when its modification time changes, so a rotated Secret takes effect
without a restart. Without the header, or with another token, the answer is 401 with a
JSON body and ``WWW-Authenticate``; a named file that cannot be read closes ``/v1`` (503)
rather than opening it. ``token_file`` None: ``/v1`` is open.

The shaping (``task_out``, ``queue_out``, ``cluster_out``) is pure: rows and snapshot dicts
in, response models out; it reads no clock, no database and no Ray. Times are seconds
since the epoch (UTC). A waiting task's ``eta`` is read from its queue snapshot's entry:
the structured ``eta`` (``{"expected_at", "latest_at"}``, epoch seconds) when the entry
has one, else the start time its Message names (``expected_start``, a minute-rounded
point: ``expected_at`` only, ``latest_at`` null), else null.
"""

from __future__ import annotations

import datetime as dt
import hmac
import json
import os
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Annotated, Any, Protocol

from fastapi import APIRouter, Depends, FastAPI, HTTPException, Path, Query, Request
from fastapi.responses import JSONResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import BaseModel, ConfigDict, Field

from falcon_ray import lifecycle as lc
from falcon_ray import messages
from falcon_ray.model import Cluster, Disruption, Lease, Task
from falcon_ray.scheduling import supply_mode_for
from falcon_ray.spec import SpecError, parse_spec

API_VERSION = "1"
DEFAULT_LIMIT = 50
MAX_LIMIT = 200  # the most entries of one list in one response
MAX_OFFSET = 10_000_000
MAX_QUEUES = 200  # the most queues in one /v1/queues response
MAX_CLUSTERS = 200
MAX_DISRUPTIONS = 50  # a task's newest disruptions (bounded anyway by max_recoveries)
MAX_TASK_ID = 2**63 - 1  # jobs.id is a BIGINT


# ---- the response models (what /openapi.json documents) -------------------------------------


class _Out(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Eta(_Out):
    """When a waiting task is expected to reach Running."""

    expected_at: float | None = Field(
        description="Expected start, seconds since the epoch (UTC); null when no estimate is given"
    )
    latest_at: float | None = Field(
        description="Latest start the estimate allows, seconds since the epoch (UTC); null when the estimate gives no "
        "upper bound (a point estimate)"
    )


class DisruptionOut(_Out):
    """One run of the task that the fleet ended (maintenance, repair, reclaimed capacity)."""

    attempt: int = Field(description="The run it ended (0: the first run)")
    kind: str = Field(description="What ended it (the fleet's disruption kind)")
    node: str = Field(description="The node the run was on")
    job: str = Field(description="The Kubernetes Job of that run")
    detail: str = Field(description="What the cluster said")
    at: float = Field(description="When, seconds since the epoch (UTC)")


class TaskOut(_Out):
    """One task as the upper layer follows it."""

    id: int = Field(description="The jobs row's id")
    name: str
    actor: str = Field(description="Who submitted it (the fairness key)")
    status: str = Field(description="Pending, Running, Succeeded, Failed, Aborting or Aborted")
    reason: str = Field(description="The phase within the status (Waiting, Provisioning, ...); empty for none")
    message: str = Field(description="The human-readable Message of the jobs row")
    cluster: str | None = Field(description="The cluster it is assigned to; null before assignment")
    topology: str | None = Field(description="The TPU topology it asks for; null when its spec cannot be read")
    supply_mode: str | None = Field(
        description="reservation, on-demand or flex-start: its pool's when it holds one, else the spec's, else the "
        "cluster's default; null before assignment when the spec names none"
    )
    position: int | None = Field(
        description="Place in its queue (1: next to take the slot once the holder is done), as its Message counts "
        "it; null unless it waits in a queue that answered"
    )
    ahead: int | None = Field(description="Tasks before it, the slot holder included; null when position is")
    eta: Eta | None = Field(description="When it is expected to start; null when there is no estimate")
    since: float | None = Field(description="When it entered its current status and reason, seconds since the epoch (UTC)")
    attempt: int = Field(description="Its current run: 0 the first, one more per run the fleet ended")
    disruptions: list[DisruptionOut] = Field(
        description=f"The runs the fleet ended, oldest first (at most the newest {MAX_DISRUPTIONS})"
    )


class TaskBrief(_Out):
    """A live task of a queue, as its QueueActor last saw it."""

    id: int
    name: str
    actor: str
    status: str
    reason: str
    message: str
    node_pool: str | None = Field(description="The node pool it holds or creates; null when none")
    in_phase_s: float | None = Field(description="Seconds in its current status and reason; null when not known")


class WaitingTask(TaskBrief):
    """A waiting task, in pick order."""

    position: int = Field(description="Place in the queue, the slot holder counted ahead (1: next)")
    ahead: int = Field(description="Tasks before it, the slot holder included")
    eta: Eta | None = Field(description="When it is expected to start; null when there is no estimate")


class Page(_Out):
    """Which part of a list this response holds."""

    total: int = Field(description="Entries in the whole list")
    offset: int = Field(description="Index of the first entry returned (0-based)")
    limit: int = Field(description="Most entries returned")
    next_offset: int | None = Field(description="The offset of the next page; null on the last page")


class QueuePool(_Out):
    """A node pool of the queue (a lease)."""

    name: str
    state: str = Field(description="Falcon's lease state: Requested, Creating, Ready, InUse, Idle, Deleting")
    task_id: int | None = Field(description="The task it serves; null when idle or being deleted")
    supply_mode: str
    pool_status: str | None = Field(description="GKE's status of the pool as the cluster last said; null if not seen")
    nodes_ready: int = Field(description="Ready nodes of the pool")
    created_at: float | None = Field(description="Seconds since the epoch (UTC)")
    idle_since: float | None = Field(description="When it became idle, seconds since the epoch (UTC); null unless Idle")


class QueueOut(_Out):
    """One (cluster, topology) queue."""

    cluster: str
    topology: str
    error: str | None = Field(description="Why its QueueActor did not answer; the lists are then empty")
    holder: TaskBrief | None = Field(description="The task holding the slot (acquiring a pool); null when none")
    waiting: list[WaitingTask] = Field(description="One page of the waiting tasks, in pick order")
    waiting_page: Page
    running: list[TaskBrief] = Field(description="Running tasks (at most limit)")
    running_total: int
    pools: list[QueuePool] = Field(description="The queue's node pools (at most limit)")
    pools_total: int


class QueuesOut(_Out):
    queues: list[QueueOut] = Field(description=f"The queues, by cluster then topology (at most {MAX_QUEUES})")
    total: int = Field(description="Queues matching the filters")
    truncated: bool = Field(description="True when more queues matched than are listed")


class Reservation(_Out):
    """The cluster's reservation ledger, in hosts (VMs)."""

    count: int = Field(description="Hosts the reservation holds")
    in_use: int = Field(description="Hosts GKE counts as in use")
    free_hosts: int = Field(description="Hosts free for a new pool (count less in use less claimed by pools being created)")


class ClusterPool(_Out):
    """A live Falcon node pool of the cluster."""

    name: str
    topology: str
    supply_mode: str
    state: str
    task_id: int | None


class ClusterOut(_Out):
    name: str
    status: str = Field(description="Registry status: active, maintenance or offline")
    tpu_type: str
    connected: bool | None = Field(description="Whether its ClusterActor reaches the cluster; null when it did not answer")
    reservation: Reservation | None = Field(description="null when the cluster has no reservation or it is not read yet")
    pools: list[ClusterPool] = Field(description="Its live Falcon pools (at most limit)")
    pools_total: int


class ClustersOut(_Out):
    clusters: list[ClusterOut] = Field(description=f"Registered clusters by name (at most {MAX_CLUSTERS})")
    total: int
    truncated: bool


class ErrorOut(_Out):
    detail: str = Field(description="What went wrong, in one line")


# ---- what the API reads ----------------------------------------------------------------------


class Unavailable(Exception):
    """The source cannot answer now (database or Ray unreachable): 503."""


class Source(Protocol):
    """The read-only data the API shapes (``falcon_ray.inspect.ApiSource`` is the live one)."""

    def get_task(self, task_id: int) -> Task | None: ...

    def clusters(self) -> list[Cluster]: ...

    def since(self, task: Task) -> dt.datetime | None: ...

    def disruptions(self, task_id: int) -> Sequence[Disruption]: ...

    def leases(self) -> list[Lease]: ...

    def queue(self, cluster: str, topology: str, task_id: int | None = None) -> dict[str, Any] | None:
        """The queue's snapshot; with ``task_id``, its waiting list may hold that task's entry alone."""
        ...

    def queues(
        self, offset: int = 0, limit: int | None = None, cluster: str | None = None, topology: str | None = None
    ) -> list[dict[str, Any]]:
        """Every queue's snapshot (of ``cluster`` and ``topology`` when given: the others need
        not be asked); its waiting list may be the page asked for (``waiting_total`` then
        counts them all)."""
        ...

    def cluster_snapshots(self) -> dict[str, dict[str, Any]]: ...


# ---- the shaping (pure) -------------------------------------------------------------------------


def epoch(t: dt.datetime | str | float | None) -> float | None:
    """Seconds since the epoch of a naive-UTC datetime (as the database stores it), an ISO
    string or a number; None for None or an unreadable value."""
    if t is None:
        return None
    if isinstance(t, int | float):
        return float(t)
    if isinstance(t, str):
        try:
            t = dt.datetime.fromisoformat(t)
        except ValueError:
            return None
    if t.tzinfo is None:
        t = t.replace(tzinfo=dt.UTC)
    return round(t.timestamp(), 3)


_EXPECTED = tuple(
    messages.pattern("expected_start", lang, at=r"(\d{4}-\d{2}-\d{2} \d{2}:\d{2})", latest=r"((?:\d{4}-\d{2}-\d{2} )?\d{2}:\d{2})")
    for lang in ("en", "zh")
)


def eta_from_message(message: str) -> Eta | None:
    """The start range a Waiting Message names (``messages`` ``expected_start``: the expected
    start, and the latest start as a time on the same day or with its date)."""
    for pattern in _EXPECTED:
        m = pattern.search(message or "")
        if m:
            at = dt.datetime.strptime(m.group(1), "%Y-%m-%d %H:%M")
            latest = m.group(2)
            if len(latest) == 5:
                latest = f"{at:%Y-%m-%d} {latest}"
            return Eta(expected_at=epoch(at), latest_at=epoch(dt.datetime.strptime(latest, "%Y-%m-%d %H:%M")))
    return None


def _number(v: Any) -> float | None:
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None


def eta_of(entry: Mapping[str, Any]) -> Eta | None:
    """A waiting entry's start estimate: its structured ``eta`` when it has one, else the
    point its Message names, else None."""
    structured = entry.get("eta")
    if isinstance(structured, Mapping):
        expected, latest = _number(structured.get("expected_at")), _number(structured.get("latest_at"))
        return Eta(expected_at=expected, latest_at=latest) if expected is not None or latest is not None else None
    return eta_from_message(str(entry.get("message") or ""))


def _brief(t: Mapping[str, Any]) -> TaskBrief:
    return TaskBrief(**_brief_fields(t))


def _brief_fields(t: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "id": int(t["id"]),
        "name": str(t.get("name") or ""),
        "actor": str(t.get("actor") or ""),
        "status": str(t.get("status") or ""),
        "reason": str(t.get("reason") or ""),
        "message": str(t.get("message") or ""),
        "node_pool": t.get("node_pool") or None,
        "in_phase_s": _number(t.get("in_phase_s")),
    }


def waiting_entries(snap: Mapping[str, Any]) -> list[WaitingTask]:
    """Every waiting task of a queue snapshot, with its position as its Message counts it
    (the slot holders ahead of every waiting task) and its start estimate."""
    holders = len(snap.get("acquiring") or [])
    out = []
    for i, t in enumerate(snap.get("waiting") or []):
        if isinstance(t.get("ahead"), int):  # counted by the queue as its Message counts
            ahead = int(t["ahead"])
        else:  # an entry whose position is its place among the waiting tasks alone
            ahead = holders + (int(t["position"]) - 1 if isinstance(t.get("position"), int) else i)
        out.append(WaitingTask(**_brief_fields(t), position=ahead + 1, ahead=ahead, eta=eta_of(t)))
    return out


def _page(total: int, offset: int, limit: int) -> Page:
    end = offset + limit
    return Page(total=total, offset=offset, limit=limit, next_offset=end if end < total else None)


def _pool(l: Mapping[str, Any]) -> QueuePool:
    return QueuePool(
        name=str(l.get("name") or ""),
        state=str(l.get("state") or ""),
        task_id=l.get("task_id"),
        supply_mode=str(l.get("supply_mode") or ""),
        pool_status=l.get("pool_status"),
        nodes_ready=int(l.get("nodes_ready") or 0),
        created_at=epoch(l.get("created_at")),
        idle_since=epoch(l.get("idle_since")),
    )


def queue_names(snap: Mapping[str, Any]) -> tuple[str, str]:
    """(cluster, topology) of a queue snapshot, or of a ``{"actor", "error"}`` row."""
    if snap.get("cluster") and snap.get("topology"):
        return str(snap["cluster"]), str(snap["topology"])
    parts = str(snap.get("actor") or "").split("/", 2)
    return (parts[1], parts[2]) if len(parts) == 3 else (str(snap.get("actor") or "?"), "")


def queue_out(snap: Mapping[str, Any], limit: int = DEFAULT_LIMIT, offset: int = 0) -> QueueOut:
    """One QueueActor snapshot (or the error row of one that did not answer) as a bounded QueueOut."""
    cluster, topology = queue_names(snap)
    if "error" in snap:
        return QueueOut(
            cluster=cluster, topology=topology, error=str(snap["error"]), holder=None, waiting=[],
            waiting_page=_page(0, offset, limit), running=[], running_total=0, pools=[], pools_total=0,
        )  # fmt: skip
    waiting = waiting_entries(snap)
    total = snap.get("waiting_total")
    if isinstance(total, int) and snap.get("waiting_offset") == offset:  # the actor sent the page asked for
        page = waiting[:limit]
    else:
        total, page = len(waiting), waiting[offset : offset + limit]
    running = list(snap.get("running") or [])
    leases = list(snap.get("leases") or [])
    acquiring = snap.get("acquiring") or []
    return QueueOut(
        cluster=cluster,
        topology=topology,
        error=None,
        holder=_brief(acquiring[0]) if acquiring else None,
        waiting=page,
        waiting_page=_page(total, offset, limit),
        running=[_brief(t) for t in running[:limit]],
        running_total=len(running),
        pools=[_pool(l) for l in leases[:limit]],
        pools_total=len(leases),
    )


def _spec_of(t: Task):
    try:
        return parse_spec(t.spec)
    except SpecError:
        return None


def _topology_of(t: Task, spec) -> str | None:
    if spec is not None:
        return spec.topology
    try:  # an invalid spec may still name its topology
        raw = json.loads(t.spec or "{}")
    except (ValueError, RecursionError):
        return None
    top = raw.get("topology") if isinstance(raw, dict) else None
    return top if isinstance(top, str) and top else None


def task_out(
    t: Task,
    cluster: Cluster | None,
    queue: Mapping[str, Any] | None,
    since: dt.datetime | None,
    disruptions: Sequence[Disruption],
) -> TaskOut:
    """A task's row, its cluster's row, its queue's snapshot (None: not asked or no answer),
    when it entered its phase and its disruptions, as the API shows it."""
    spec = _spec_of(t)
    topology = _topology_of(t, spec)
    snap = queue if queue is not None and "error" not in queue else None
    mine = next((w for w in waiting_entries(snap) if w.id == t.id), None) if snap else None
    pool = None
    if snap and t.node_pool_name:
        pool = next((l for l in snap.get("leases") or [] if l.get("name") == t.node_pool_name), None)
    if pool is not None and pool.get("supply_mode"):
        supply = str(pool["supply_mode"])
    elif spec is not None and (spec.supply_mode is not None or cluster is not None):
        supply = str(supply_mode_for(spec, cluster.default_reservation if cluster else ""))
    else:
        supply = None
    waiting = t.phase == lc.WAITING
    eta = (mine.eta if mine else eta_from_message(t.message)) if waiting else None
    shown = list(disruptions)[-MAX_DISRUPTIONS:]
    return TaskOut(
        id=t.id,
        name=t.name,
        actor=t.actor,
        status=str(t.status),
        reason=str(t.reason),
        message=t.message,
        cluster=cluster.name if cluster else None,
        topology=topology,
        supply_mode=supply,
        position=mine.position if mine and waiting else None,
        ahead=mine.ahead if mine and waiting else None,
        eta=eta,
        since=epoch(since or t.updated_at),
        attempt=len(disruptions),
        disruptions=[
            DisruptionOut(attempt=d.attempt, kind=d.kind, node=d.node, job=d.job, detail=d.detail, at=epoch(d.at) or 0.0)
            for d in shown
        ],
    )


def reservation_of(c: Cluster, snap: Mapping[str, Any] | None) -> Reservation | None:
    """The reservation's ledger: live from the ClusterActor's snapshot, else as last recorded
    on the cluster row; None without a reservation or before it was read."""
    if not c.default_reservation:
        return None
    live = (snap or {}).get("reservation")
    if isinstance(live, Mapping) and live.get("count") is not None:
        count, used, claimed = int(live["count"]), int(live.get("in_use") or 0), int(live.get("claimed") or 0)
    elif c.reservation_count is not None:
        count, used, claimed = c.reservation_count, c.reservation_in_use or 0, c.reservation_claimed or 0
    else:
        return None
    return Reservation(count=count, in_use=used, free_hosts=max(0, count - used - claimed))


def cluster_out(c: Cluster, snap: Mapping[str, Any] | None, leases: Sequence[Lease], limit: int = DEFAULT_LIMIT) -> ClusterOut:
    """A cluster's registry row, its ClusterActor's snapshot (None: no answer) and its live leases."""
    mine = sorted((l for l in leases if l.cluster_id == c.id), key=lambda l: (l.topology, l.name))
    connected = snap.get("connected") if snap and "error" not in snap else None
    return ClusterOut(
        name=c.name,
        status=str(c.status),
        tpu_type=c.tpu_type,
        connected=connected if isinstance(connected, bool) else None,
        reservation=reservation_of(c, snap),
        pools=[
            ClusterPool(name=l.name, topology=l.topology, supply_mode=str(l.supply_mode), state=str(l.state), task_id=l.task_id)
            for l in mine[:limit]
        ],
        pools_total=len(mine),
    )


# ---- the token --------------------------------------------------------------------------------


class TokenFile:
    """The bearer token as the file named in the settings holds it, read again when the
    file's modification time (or size) changes."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._stamp: tuple[int, int] | None = None
        self._token: bytes | None = None

    def token(self) -> bytes:
        """The token; raises OSError (unreadable) or ValueError (empty)."""
        st = os.stat(self.path)
        stamp = (st.st_mtime_ns, st.st_size)
        with self._lock:
            if stamp != self._stamp:
                with open(self.path, "rb") as f:
                    token = f.read(4096).strip()
                if not token:
                    raise ValueError("empty")
                self._token, self._stamp = token, stamp
            assert self._token is not None
            return self._token


_bearer = HTTPBearer(auto_error=False, description="The token of the file `api_token_file` names (when set)")


def _guard(token_file: str | None) -> Callable[..., None]:
    tokens = TokenFile(token_file) if token_file else None

    def check(credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]) -> None:
        if tokens is None:
            return
        try:
            expected = tokens.token()
        except (OSError, ValueError):
            raise HTTPException(503, "the API's token file cannot be read; /v1 stays closed") from None
        if credentials is None:
            raise HTTPException(
                401, "a bearer token is required (Authorization: Bearer <token>)",
                headers={"WWW-Authenticate": 'Bearer realm="falcon-ray"'},
            )  # fmt: skip
        if not hmac.compare_digest(credentials.credentials.encode(), expected):
            raise HTTPException(
                401, "the bearer token is not valid",
                headers={"WWW-Authenticate": 'Bearer realm="falcon-ray", error="invalid_token"'},
            )  # fmt: skip

    return check


# ---- the application --------------------------------------------------------------------------

Limit = Annotated[int, Query(ge=1, le=MAX_LIMIT, description=f"Most entries of each list (1 to {MAX_LIMIT})")]
_ERRORS: dict[int | str, dict[str, Any]] = {
    401: {"model": ErrorOut, "description": "No bearer token, or not the configured one"},
    503: {"model": ErrorOut, "description": "The database or the actors cannot be read now"},
}


def _router(source: Source, token_file: str | None) -> APIRouter:
    r = APIRouter(prefix="/v1", dependencies=[Depends(_guard(token_file))], responses=_ERRORS)
    @r.get("/tasks/{task_id}", response_model=TaskOut, responses={404: {"model": ErrorOut, "description": "No such task"}})
    def get_task(task_id: Annotated[int, Path(ge=1, le=MAX_TASK_ID, description="The jobs row's id")]) -> TaskOut:
        """One task: its state, where it waits and when it is expected to start, its runs."""
        t = source.get_task(task_id)
        if t is None:
            raise HTTPException(404, f"no task {task_id}")
        cluster = next((c for c in source.clusters() if c.id == t.cluster_id), None) if t.cluster_id else None
        topology = _topology_of(t, _spec_of(t))
        queue = source.queue(cluster.name, topology, task_id=t.id) if cluster and topology and not t.terminal else None
        return task_out(t, cluster, queue, source.since(t), source.disruptions(t.id))

    @r.get("/queues", response_model=QueuesOut)
    def get_queues(
        limit: Limit = DEFAULT_LIMIT,
        offset: Annotated[int, Query(ge=0, le=MAX_OFFSET, description="First waiting task of each queue's page (0-based)")] = 0,
        cluster: Annotated[str | None, Query(max_length=200, description="Only this cluster's queues")] = None,
        topology: Annotated[str | None, Query(max_length=50, description="Only this topology's queues")] = None,
    ) -> QueuesOut:
        """Every queue: the slot holder, a page of the waiting tasks in pick order, running tasks, pools."""
        snaps = sorted(source.queues(offset, limit, cluster, topology), key=queue_names)
        snaps = [s for s in snaps if (cluster is None or queue_names(s)[0] == cluster) and (topology is None or queue_names(s)[1] == topology)]
        return QueuesOut(
            queues=[queue_out(s, limit, offset) for s in snaps[:MAX_QUEUES]], total=len(snaps), truncated=len(snaps) > MAX_QUEUES
        )

    @r.get("/clusters", response_model=ClustersOut)
    def get_clusters(limit: Limit = DEFAULT_LIMIT) -> ClustersOut:
        """Every registered cluster: status, TPU type, the reservation's ledger, Falcon's pools."""
        rows = sorted(source.clusters(), key=lambda c: c.name)
        snaps = source.cluster_snapshots()
        leases = source.leases()
        return ClustersOut(
            clusters=[cluster_out(c, snaps.get(c.name), leases, limit) for c in rows[:MAX_CLUSTERS]],
            total=len(rows),
            truncated=len(rows) > MAX_CLUSTERS,
        )

    return r


def create_app(
    source: Source,
    token_file: str | None = None,
    probes: Callable[[], dict[str, Any]] | None = None,
) -> FastAPI:
    """The ASGI application: /v1 over ``source``, guarded by ``token_file``'s token when set,
    and /healthz, /readyz from ``probes`` (a callable returning the health report) when given."""
    app = FastAPI(
        title="Falcon-Ray read API",
        version=API_VERSION,
        description="Read-only state of the tasks, queues and clusters of a Falcon-Ray controller (docs/api.md).",
        docs_url=None,
        redoc_url=None,
    )

    @app.exception_handler(Unavailable)
    def _unavailable(_request: Request, e: Unavailable) -> JSONResponse:
        return JSONResponse({"detail": " ".join(str(e).split())[:300] or "unavailable"}, status_code=503)

    app.include_router(_router(source, token_file))
    if probes is not None:
        _probe_routes(app, probes)
    return app


def _probe_routes(app: FastAPI, probes: Callable[[], dict[str, Any]]) -> None:
    def answer(key: str) -> JSONResponse:
        try:
            report = probes()
            ok = bool(report[key])
        except Exception as e:
            report, ok = {"error": str(e)}, False
        body = json.loads(json.dumps(report, default=str))
        return JSONResponse(body, status_code=200 if ok else 503)

    @app.get("/healthz", tags=["probes"], responses={503: {"description": "Not healthy"}})
    def healthz() -> JSONResponse:
        """Liveness: the database reachable and, while leading, every actor answering (no token)."""
        return answer("healthy")

    @app.get("/readyz", tags=["probes"], responses={503: {"description": "Not ready"}})
    def readyz() -> JSONResponse:
        """Readiness: healthy and holding the leader lease (no token)."""
        return answer("ready")
