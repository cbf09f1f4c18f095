"""Health: what a probe or an operator needs to know to trust the controller.

Contract
--------
``check(supervisor)`` returns one JSON-able report: the leader lease, the database,
every actor's answer (with a deadline, so one hung actor cannot hang the probe),
each ClusterActor's last successful GKE / Kubernetes call and watch age (a cluster
that cannot be reached is listed in ``degraded_clusters``: it makes neither probe
fail, since restarting the controller would not fix it), and the live tasks past the
limit of their wait (``overdue_tasks``, from the one table ``falcon_ray.limits``:
which wait, since when, the limit and its action; a task past its start deadline too). ``healthy`` is the liveness verdict
(leader held or waiting, database reachable, actors answering); ``ready`` adds that the
lease is held. Overdue tasks are reported, not fatal: they are the operator's
business, not a reason to restart the controller.
An actor started under an older leader epoch than the lease's (``fenced``: it
stopped its loops) is reported with its reason and counts as not answering, so the
probes fail until the supervisor has replaced it. ``leader.epoch`` is the lease's.
``serve(supervisor, port)`` serves ``/healthz`` and ``/readyz`` (200 or 503 with the
report, a report at most 2 s old) and the read API of ``falcon_ray.api`` (``/v1``, its
token from the settings' ``api_token_file``) as one ASGI application on one port
(uvicorn on a daemon thread); the probes never need the token.
"""

from __future__ import annotations

import json
import socket
import threading
from typing import Any

from falcon_ray import lifecycle as lc
from falcon_ray import limits
from falcon_ray.clock import SYSTEM, Clock
from falcon_ray.lifecycle import LeaseState
from falcon_ray.model import has_run
from falcon_ray.spec import DEFAULT_TIMEOUT_SECONDS


def _spec_fields(text: str) -> dict[str, Any]:
    """The two spec fields health needs, without validating the whole spec."""
    try:
        spec = json.loads(text or "{}")
    except ValueError:
        return {}
    return spec if isinstance(spec, dict) else {}


def overdue_tasks(store, settings, now=None, clock: Clock = SYSTEM) -> list[dict[str, Any]]:
    """Every live task past the limit of its wait (``falcon_ray.limits``): which wait, since
    when (the record the wait is counted from), the limit and the action it has. Running
    tasks are bounded by their own timeout (the queue ends them) and are not listed."""
    now = now or clock.now()
    tasks = [t for t in store.live_tasks() if t.phase != lc.RUNNING]
    clusters = {c.id: c for c in store.list_clusters()}
    active_types = {c.tpu_type for c in clusters.values() if c.active}
    fields = {t.id: _spec_fields(t.spec) for t in tasks}
    entered = store.phase_entered([t.id for t in tasks])
    refused = store.capacity_refused_since([t.id for t in tasks if t.phase == lc.CLUSTER_BUSY])
    creates = _creates(store, tasks)
    out = []
    for t in tasks:
        c = clusters.get(t.cluster_id or "")
        wait = limits.wait_of(
            t.phase,
            job_accepted=t.dispatched_at is not None,
            # not ``contested``: that wait counts from the pool's first node, which only the
            # cluster shows; health reads the database, so it holds WaitingForNode to the
            # capacity budget (the longer limit), never to a count that would list a task early
            out_of_service=c is not None and not c.active and c.tpu_type in active_types,
            capacity_refused=t.id in refused,
            create_accepted=t.id in creates and creates[t.id].state != LeaseState.REQUESTED,
        )
        if wait is not None:
            since = _wait_since(t, wait, entered, refused, creates.get(t.id))
            row = _overdue_row(t, wait, fields[t.id], settings, now, since)
            if row is not None:
                out.append(row)
    return out + _past_start_deadline(store, tasks, fields, settings, now)


def _past_start_deadline(store, tasks, fields: dict[int, dict[str, Any]], settings, now) -> list[dict[str, Any]]:
    """The tasks waiting for their first start past their start deadline and its grace (the
    queue or the poller did not end them): their disruption rows are read only for those,
    and a task that has run is left out (the deadline is about the first start)."""
    late = []
    for t in tasks:
        limit = fields[t.id].get("start_deadline_s")
        if t.phase not in lc.BEFORE_START_PHASES or isinstance(limit, bool) or not isinstance(limit, int | float):
            continue
        r = _overdue_row(t, limits.Wait.START_DEADLINE, fields[t.id], settings, now, t.created_at)
        if r is not None:
            late.append(r)
    if not late:
        return []
    ran = store.disruptions([r["id"] for r in late])
    return [r for r in late if not has_run(ran.get(r["id"], ()))]


def _creates(store, tasks) -> dict[int, Any]:
    """The lease of each Provisioning task's pool (by its cluster and name), when it has one:
    whether GKE accepted the create decides which of the create's waits the task is in.
    A Provisioning task without a lease (the cluster or its reservation cannot be read) is
    in the create's wait, counted from the phase, as the queue counts it."""
    named = {(t.cluster_id, t.node_pool_name): t.id for t in tasks if t.phase == lc.PROVISIONING and t.node_pool_name}
    if not named:
        return {}
    return {named[(x.cluster_id, x.name)]: x for x in store.leases() if (x.cluster_id, x.name) in named}


def _wait_since(t, wait: limits.Wait, entered: dict, refused: dict, lease: Any = None) -> Any:
    """When a task's wait began: the record the limit of ``wait`` is counted from (for the
    create's waits, its lease row: written for the queued wait, GKE's acceptance after)."""
    if lease is not None and wait == limits.Wait.CREATE_QUEUED:
        return lease.created_at
    if lease is not None and wait == limits.Wait.CREATE:
        return lease.accepted_at or lease.created_at
    if wait == limits.Wait.PODS:
        return t.dispatched_at
    if wait == limits.Wait.CAPACITY:
        return refused[t.id]
    if wait == limits.Wait.ABORT:
        return t.aborting_at or entered.get((t.id, t.phase)) or t.updated_at
    return entered.get((t.id, t.phase)) or t.updated_at


def _overdue_row(t, wait: limits.Wait, fields: dict[str, Any], settings, now, since) -> dict[str, Any] | None:
    """The report's row for a task past its wait's limit and grace; None when it is not."""
    row = limits.limit(wait)
    timeout = fields.get("timeout_seconds", t.timeout_seconds or DEFAULT_TIMEOUT_SECONDS)
    deadline = fields.get("start_deadline_s")
    limit = row.seconds(settings, timeout if isinstance(timeout, int) else None, deadline if isinstance(deadline, int | float) else None)
    if limit is None or since is None:
        return None
    age = (now - since).total_seconds()
    if age <= limit + row.grace(settings):
        return None
    return {
        "id": t.id,
        "status": str(t.status),
        "reason": str(t.reason),
        "wait": str(wait),
        "since": since.isoformat(),
        "age_s": round(age, 1),
        "limit_s": limit,
        "action": str(row.action),
        "message": t.message,
    }


def check(sup, probe_timeout: float = 5.0) -> dict[str, Any]:
    """The health report of the controller ``sup`` supervises (see the module's contract)."""
    clock = getattr(sup, "clock", SYSTEM)  # the supervisor's: a health check in virtual time reads virtual time
    report: dict[str, Any] = {"holder": sup.holder, "checked_at": clock.time()}
    report["database"], lease = _database_and_lease(sup.store)
    report["leader"] = {
        "held": bool(sup.leader),
        "holder": lease["holder"] if lease else None,
        "expires_at": lease["expires_at"].isoformat() if lease else None,
        "renewed_at": sup.lease_renewed_at,
        "epoch": lease.get("epoch") if lease else None,
    }
    actors, degraded = _probe_actors(sup, clock, probe_timeout)
    report["actors"] = actors
    report["degraded_clusters"] = degraded
    try:
        report["overdue_tasks"] = overdue_tasks(sup.store, sup.s, clock=clock) if report["database"]["ok"] else []
    except Exception as e:
        report["overdue_tasks"] = []
        report["overdue_error"] = str(e)[:300]
    actors_ok = all(a.get("ok") for a in actors.values()) if actors else False
    report["healthy"] = report["database"]["ok"] and (actors_ok or not sup.leader)
    report["ready"] = report["healthy"] and sup.leader and actors_ok
    return report


def _database_and_lease(store) -> tuple[dict[str, Any], dict | None]:
    """The database's entry of the report and the leader lease it holds (None: unreadable)."""
    try:
        store.ping()
    except Exception as e:
        return {"ok": False, "error": f"{type(e).__name__}: {e}"[:300]}, None
    try:
        return {"ok": True}, store.leader()
    except Exception:
        return {"ok": True}, None
def _probe_actors(sup, clock: Clock, probe_timeout: float) -> tuple[dict[str, Any], list[str]]:
    """Every actor's entry (its snapshot's answer within ``probe_timeout`` in all) and the
    ClusterActors that cannot reach their edge cluster."""
    import ray  # Ray and the actors only where a live controller is probed

    from actors import names

    actors: dict[str, Any] = {}
    degraded: list[str] = []
    refs = {}
    for name in sup.actor_names():
        h = sup.known.get(name) or names.lookup(name, sup.s.namespace)
        if h is None:
            actors[name] = {"ok": False, "error": "not found"}
            continue
        refs[name] = h.snapshot.remote()
    deadline = clock.monotonic() + probe_timeout
    for name, ref in refs.items():
        try:
            snap = ray.get(ref, timeout=max(0.1, deadline - clock.monotonic()))
            entry: dict[str, Any] = {"ok": True}
            if name.startswith("cluster/"):
                entry.update(_cluster_entry(snap, clock.time()))
                if not snap.get("connected"):
                    # an unreachable edge cluster degrades that cluster only; restarting the
                    # controller would not fix it and would interrupt every other queue
                    degraded.append(name)
            else:
                entry["last_error"] = snap.get("last_error") or ""
            entry["epoch"] = snap.get("epoch")
            if snap.get("fenced"):
                entry.update(ok=False, fenced=snap["fenced"], error=snap["fenced"])
            actors[name] = entry
        except Exception as e:
            actors[name] = {"ok": False, "error": f"{type(e).__name__}: {e}"[:300]}
    return actors, degraded


def _cluster_entry(snap: dict[str, Any], now: float) -> dict[str, Any]:
    """A ClusterActor's connection, last successful calls and watch, from its snapshot."""
    last = snap.get("last_ok", {})
    watch = snap.get("watch", {})
    return dict(
        connected=snap.get("connected"),
        connect_error=snap.get("connect_error"),
        connect_stage=snap.get("connect_stage"),
        connect_stage_since=snap.get("connect_stage_since"),
        connect_timings=snap.get("connect_timings"),
        last_gke_ok_age_s=round(now - last["gke"], 1) if last.get("gke") else None,
        last_kubernetes_ok_age_s=round(now - last["kubernetes"], 1) if last.get("kubernetes") else None,
        watch_age_s=round(now - watch["last_ok_at"], 1) if watch.get("last_ok_at") else None,
        watch_reconnects=watch.get("reconnects"),
        watch_relists=watch.get("relists"),
    )


class Server:
    """The HTTP server of the health port, on a daemon thread: ``server_address`` is the
    bound (host, port); ``shutdown`` stops serving, ``server_close`` releases the socket."""

    def __init__(self, app, host: str, port: int) -> None:
        import uvicorn

        self.sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind((host, port))
        self.sock.listen(128)
        self.server_address = self.sock.getsockname()[:2]
        # log_config None: the process keeps its own logging set-up (JSON lines in `falcon-ray run`)
        config = uvicorn.Config(
            app, log_config=None, log_level="warning", access_log=False, lifespan="off", timeout_graceful_shutdown=5
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True, name="health")
        self.thread.start()

    @property
    def url(self) -> str:
        host, port = self.server_address
        host = "127.0.0.1" if host in ("0.0.0.0", "") else host
        return f"http://{host}:{port}"

    def shutdown(self, timeout: float = 10.0) -> None:
        self.server.should_exit = True
        self.thread.join(timeout)

    def server_close(self) -> None:
        self.sock.close()


def serve(sup, port: int, host: str = "0.0.0.0", token_file: str | None = None) -> Server:
    """Serve /healthz (liveness), /readyz (readiness) and the read API (``falcon_ray.api``:
    /v1, guarded by ``token_file``, default the settings' ``api_token_file``) on one port,
    on a daemon thread."""
    from falcon_ray import api
    from falcon_ray.inspect import ApiSource

    cache: dict[str, Any] = {"at": 0.0, "report": None}
    clock = getattr(sup, "clock", SYSTEM)
    lock = threading.Lock()

    def current() -> dict[str, Any]:
        with lock:
            if cache["report"] is None or clock.monotonic() - cache["at"] > 2.0:
                cache["report"] = check(sup)
                cache["at"] = clock.monotonic()
            return cache["report"]

    settings = sup.s
    token_file = token_file if token_file is not None else settings.api_token_file
    app = api.create_app(ApiSource(sup.store, settings.namespace), token_file=token_file, probes=current)
    return Server(app, host, port)
