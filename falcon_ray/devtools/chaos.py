"""The chaos soak: mixed tasks on the simulated fleet while faults and kills rain down.

Contract
--------
``make_plan(n, seed, play_s)`` draws ``n`` tasks (four v6e topologies, the supply modes,
aborts at random moments of every phase, failing and timing-out tasks) with their submit
and abort times. ``ChaosRun`` plays such a plan through ``DemoRun`` (the same controller,
fleet and database as ``falcon-ray demo``) while it injects, on a schedule scaled by
``scale``: GKE/Compute 503 and 429, incompatible-operation refusals, dropped watches and
410 Expired (history compaction), tokens refused after ``20 * scale`` seconds, a random
QueueActor or ClusterActor killed every ``10 * scale`` seconds (``ray.kill(no_restart=False)``:
Ray restarts it), the poller killed, short bursts of node-pool creates that fail with an
INTERNAL error (code 13: not about capacity, so the tasks they hit end NodePoolFailed and
are counted apart, ``failed_by_injected_create_error``), random GKE disruptions of running
pods (host maintenance, auto-repair, capacity reclaimed: the sim's
``disruption_rate_per_node_hour``, ``DISRUPTION_RATE`` by default, which the controller
must recover as new attempts), and, on MariaDB/MySQL, the controller's database
connections killed (``KILL``). An actor is killed only once it answers (a kill
of an actor Ray is still starting is a crash loop, not a fault production sees), and
each kill's restart is timed until the actor answers again: the run's slowest restart
(``actor_restart_s`` in the report) is added to ``Limits.margin``, since a task whose actor
was down waited for that restart and nothing else. It then stops the kills, waits for
quiescence (``drain_s``, extended while tasks still change, up to ``DRAIN_STRETCH`` times) and
returns one report. The fleet (``chaos_fleet``) is issue 10's:
``edge-a`` with a reservation of 6 hosts, ``edge-b`` flex-start with 32 chips, so the
demand for capacity outgrows the supply and the capacity waits are exercised for real.

``check(...)`` is the report's judgement, a pure function of the database rows (tasks and
their event logs), the Message changes the run observed and the fleet's own accounting:

- ``lost``: tasks not terminal at the end;
- ``stuck``: a task that stayed in one phase with no event and no Message change for longer
  than that phase's limit (``Limits``); Running's is the task's own timeout, the product's
  default (``spec.DEFAULT_TIMEOUT_SECONDS``) when its spec gives none, as the product runs it;
  a reservation wait whose Message promises its hosts free by an instant ("free by ... UTC
  at the latest": the reservation hold, ``messages`` ``reservation_holding``, and the Waiting
  tasks behind it, ``waiting_behind_reservation``) is stuck only
  once that instant has passed by the margin, when the judge knows the run's calendar
  (``Limits.origin``: a wait behind runs of two days is long, not stuck, while its promise holds);
- ``second_job_creates``: Jobs the fleet saw created again after one of their creates ran a
  pod (every attempt of a task has its own name, ``falcon-task-ID-aN``: two attempts are two
  Jobs, not a second create; a Job whose pods never ran, deleted with a pool whose nodes
  never came and made again on the next pool, is not one either);
- ``pools_alive``: Falcon node pools alive in the fleet at the end;
- ``aborts_overwritten``: a task whose abort landed (an Aborting event) and that the
  controller then moved anywhere but Aborted (a task that finished before the abort
  landed has no Aborting event: the upper layer's compare-and-set lost, which is fine);
- ``failed_for_capacity``: NodePoolFailed whose message is a capacity refusal or a
  reservation shortfall (a stockout, a reservation without room, a capacity budget or a
  reservation wait that ran out), other than the soak's own injected create failures and
  the ends of a capacity wait that lasted the whole ``Limits.capacity_budget`` (by the event
  log; the soak passes none): capacity that comes back must be waited for, never a failure;
- ``illegal_transitions``: event-log steps not in the lifecycle table;
- ``recovered_own_failure``: a recovery (a ``falcon_task_disruptions`` row) of a run the
  fleet never disrupted: no disruption record of the sim lists its Job (in its ``jobs``,
  or one of the Job's pods in its ``pods``) at or before the row's time, or the row's Job
  is not that task's Job of that attempt. The controller recovered the task's own failure
  or invented a disruption. A ``pool-lost`` row is no exception: in the soak's fleet a pool
  ends in ERROR only at its create (the injected INTERNAL creates included, and a pool that
  failed its create never ran a Job), and is deleted only when the controller asks (the
  soak itself deletes no pool), so a pool lost under a run with no record is the
  controller deleting a pool under a live run (an orphan delete, keep-or-delete): a bug;
- ``failing_task_succeeded``: a task whose spec makes every run fail in the sim
  (``FALCON_SIM_EXIT_CODE`` non-zero, ``FALCON_SIM_OOM``) ended Succeeded.

A task that ends ``Failed/Disrupted`` (more disruptions than its ``max_recoveries``) is no
capacity failure. ``check`` also returns ``figures``: recoveries (rows, by kind, tasks),
tasks ended Disrupted, and the fleet's disrupted Jobs.

The run adds ``controller_loop_died`` (1 when the controller's own loop, which keeps the
leader lease and the registry, did not survive the play: its actors would run on without
it) and, on MariaDB/MySQL, plays a database outage: the controller reaches the database
through a loopback proxy that cuts and refuses its connections for ``db_outage_s`` once,
mid-play (the upper layer's submits and the soak's reads keep a direct connection).

``ok`` is true when every one of these is zero; ``falcon-ray chaos`` exits 1 otherwise.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import random
import re
import statistics
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from falcon_ray import lifecycle as lc
from falcon_ray import messages as texts
from falcon_ray.model import ABANDONED, CONTROLLER_MOVES, RELEASED, SWITCHED, TaskEvent
from falcon_ray.render import job_name, service_of_job
from falcon_ray.sim.fleet import FAST_TIMINGS
from falcon_ray.spec import DEFAULT_TIMEOUT_SECONDS

log = logging.getLogger("falcon.chaos")

TOPOLOGIES = ("1x1", "2x2", "2x4", "4x4")
INVARIANTS = (
    "lost",
    "stuck",
    "second_job_creates",
    "pools_alive",
    "aborts_overwritten",
    "failed_for_capacity",
    "illegal_transitions",
    "recovered_own_failure",
    "failing_task_succeeded",
)
CAPACITY_REFUSAL = re.compile(
    r"does not have enough resources|ZONE_RESOURCE_POOL_EXHAUSTED|stockout|GCE_STOCKOUT|resource pool exhausted"
    r"|capacity_budget_s|reservation_wait_limit_s|reservation_remaining_slices",
    re.IGNORECASE,
)
# A Provisioning Message of a create still waiting its turn among the cluster's node-pool
# operations (messages "create_queued" / "create_refused_busy", both languages, alone or after
# "capacity_retrying" for a create asked again after capacity refusals): a wait under
# create_queue_limit_s, not the create's node_pool_timeout_s.
CREATE_QUEUED = tuple(texts.pattern(key, lang) for key in ("create_queued", "create_refused_busy") for lang in ("en", "zh"))


def create_queued(message: str) -> bool:
    """The Message says the create waits its turn among the cluster's operations."""
    return any(p.search(message) for p in CREATE_QUEUED)

# a reservation wait's promise (messages "reservation_holding" of the task that waits and
# "waiting_behind_reservation" of the tasks behind it, both languages): the hosts are free by
# this instant (UTC, to the minute)
FREE_BY = tuple(
    texts.pattern(key, lang, task=r"\d+", hosts=r"\d+", reservation=r"\S+", by=r"(\d{4}-\d{2}-\d{2} \d{2}:\d{2})")
    for key in ("reservation_holding", "waiting_behind_reservation")
    for lang in ("en", "zh")
)


def promised_free_by(message: str) -> dt.datetime | None:
    """The instant (naive UTC) a reservation wait's Message promises its hosts free by, if any."""
    for pattern in FREE_BY:
        m = pattern.search(message or "")
        if m:
            return dt.datetime.strptime(m.group(1), "%Y-%m-%d %H:%M")
    return None


# The soak's burst of failed creates: GKE's INTERNAL (google.rpc code 13), a failure that is
# not about capacity, so Falcon ends the task NodePoolFailed and the report counts it apart.
CREATE_ERROR = "Internal error: the node pool could not be created (simulated burst of failed creates)."
CREATE_ERROR_CODE = 13
RESERVATION_HOSTS = 6  # edge-a's reservation (issue 10: 6 hosts)
FLEX_CHIPS = 32  # edge-b, flex-start by default (issue 10: 32 chips)
DEFAULT_TASK_TIMEOUT = 120  # seconds: the timeout the soak's ordinary tasks set (they run a few seconds)
# Random disruptions (the sim's ``disruption_rate_per_node_hour``, per node with a running pod,
# per hour of real time). A soak task runs 0.2-2.5 s (timeouts 2-3 s) on 1 host, or 4 for
# 4x4 (a slice is disrupted whole): ~2.5 node-seconds a run, so 120/h disrupts ~8% of the
# runs (1 - exp(-120 * 2.5 / 3600)); a recovered run is exposed again.
DISRUPTION_RATE = 120.0
# a sim record of a disruption may carry a time up to this much later than the controller's
# row of the recovery it caused (two clocks of one machine; the database's milliseconds)
DISRUPTION_CLOCK_SLACK_S = 5.0

# The soak's fleet timings (seconds): the e2e harness's fast profile.
TIMINGS = FAST_TIMINGS
# seconds between two reads of every task's row while the play runs (the play's own loop
# turns every 0.25 s): the Message changes seen this often time the quiet stretches that
# ``stuck`` judges against limits of tens of seconds; each read is every row of the run
OBSERVE_EVERY_S = 1.0
DRAIN_STRETCH = 1.5  # the drain's limit while tasks still change, in drain_s
READY_PING_S = 1.0  # an actor that does not answer a ping this fast is not killed (still starting)


# ---- the plan -------------------------------------------------------------------------------


def make_plan(n: int, seed: int, play_s: float) -> list[dict[str, Any]]:
    """``n`` task items (``parse_task_line`` shape plus ``kind``) submitted over ``play_s`` seconds."""
    rng = random.Random(seed)
    items = []
    for i in range(n):
        topology = rng.choice(TOPOLOGIES)
        draw = rng.random()
        env = {"FALCON_SIM_RUN_SECONDS": f"{rng.uniform(0.2, 2.5):.2f}"}
        timeout = DEFAULT_TASK_TIMEOUT
        kind = "ok"
        if draw < 0.06:
            kind = "oom"
            env["FALCON_SIM_OOM"] = "1"
        elif draw < 0.10:
            kind = "exit1"
            env["FALCON_SIM_EXIT_CODE"] = "1"
        elif draw < 0.14:
            kind = "timeout"
            env["FALCON_SIM_RUN_SECONDS"] = "60"
            timeout = rng.choice((2, 3))
        spec: dict[str, Any] = {
            "tpu_type": "v6e",
            "topology": topology,
            "image": "us-docker.pkg.dev/p/r/img:1",
            "command": ["python", "run.py"],
            "env": env,
            "timeout_seconds": timeout,
        }
        mode = rng.choice((None, None, "flex-start", "on-demand"))
        if mode:
            spec["supply_mode"] = mode
        submit_at = round(rng.uniform(0, play_s), 2)
        abort_at = None
        if rng.random() < 0.15:
            kind = f"{kind}+abort"
            # from before the pick to long after the start: every phase gets some
            abort_at = round(submit_at + rng.choice((0.0, rng.uniform(0, 1.5), rng.uniform(0.5, 6), rng.uniform(3, 15))), 2)
        items.append(
            {"name": f"chaos-{i}", "actor": rng.choice(("alice", "bob", "carol", "dan")), "submit_at": submit_at, "abort_at": abort_at, "spec": spec, "kind": kind}
        )
    return items


def chaos_fleet(seed: int):
    """Two v6e clusters: ``edge-a`` with a reservation of ``RESERVATION_HOSTS`` hosts
    (reservation by default; 64 chips for on-demand and flex-start tasks), ``edge-b``
    flex-start by default with ``FLEX_CHIPS`` chips."""
    from falcon_ray.sim.fleet import FleetConfig

    return FleetConfig(
        seed=seed,
        clusters=[
            {
                "name": "edge-a",
                "project": "proj-a",
                "location": "us-east5-b",
                "tpu_type": "v6e",
                "gcs_bucket": "logs-a",
                "reservation": {"name": "res-a", "count": RESERVATION_HOSTS},
                "chips": 64,
                "timings": dict(TIMINGS),
            },
            {
                "name": "edge-b",
                "project": "proj-b",
                "location": "us-central1-b",
                "tpu_type": "v6e",
                "gcs_bucket": "logs-b",
                "chips": FLEX_CHIPS,
                "timings": dict(TIMINGS),
            },
        ],
    )


# ---- the judgement (pure) -------------------------------------------------------------------------


@dataclass(frozen=True)
class Limits:
    """How long a task may stay in one phase with no event and no Message change (seconds).
    Running: the task's own timeout plus ``margin``; terminal phases: no limit."""

    node_pool_timeout: float
    margin: float = 30.0
    waiting: float = 240.0  # Waiting / ClusterBusy / New: a queue ahead of them may be long
    recovery_wait: float = 0.0  # recovery_pool_wait_s: Recovering waits this long for its nodes
    capacity_budget: float = 0.0  # capacity_budget_s: nodes that do not come are waited for this long
    create_queue: float = 0.0  # create_queue_limit_s: a create waits its turn among the cluster's operations this long
    origin: dt.datetime | None = None  # the instant (naive UTC) of the run's second 0: a Message's promised instants are judged

    def of(self, phase: lc.Phase, timeout_seconds: float | None, message: str = "", since_s: float | None = None) -> float | None:
        """The limit of a stretch in ``phase`` with ``message`` that began at ``since_s``
        (the run's seconds)."""
        if phase.status in lc.TERMINAL:
            return None
        if phase == lc.PROVISIONING and create_queued(message):  # its own limit, not the create's
            return max(self.node_pool_timeout, self.create_queue) + self.margin
        if phase in (lc.CLUSTER_BUSY, lc.WAITING) and self.origin is not None and since_s is not None:
            by = promised_free_by(message)  # to the minute, rounded down: the promise is that minute's end
            if by is not None:
                kept = (by - self.origin).total_seconds() + 60.0 - since_s + self.margin
                return max(self.waiting, kept)
        if phase in (lc.NEW, lc.WAITING, lc.CLUSTER_BUSY):
            return self.waiting
        if phase == lc.RUNNING:
            return float(timeout_seconds or DEFAULT_TIMEOUT_SECONDS) + self.margin
        if phase == lc.WAITING_FOR_NODE:  # nodes that do not come are a capacity wait, ended at
            # the capacity budget
            return max(self.node_pool_timeout, self.capacity_budget, 60.0) + self.margin
        if phase == lc.ABORTING:
            return self.margin
        if phase == lc.RECOVERING:  # the old Job deleted, the next submitted, the nodes back
            return max(self.node_pool_timeout, self.recovery_wait) + self.margin
        return self.node_pool_timeout + self.margin  # Provisioning, Dispatching


# A wait counter in a Message ("waiting 3m") is not progress: a task that only counts the
# minutes of a wait that never ends is stuck all the same.
_WAIT_COUNTER = re.compile(r"\((?:waiting|waited|已等待) [^)]*\)|\b(?:waiting|waited) (?:<1m|\d+h?\d*m)\b")


def progress_text(message: str) -> str:
    return _WAIT_COUNTER.sub("(waiting ...)", message or "")


@dataclass
class Observed:
    """What the run saw of one task: (seconds, status, reason, message) at each change; a
    Message that differs only in its wait counter is no change (``progress_text``)."""

    changes: list[tuple[float, str, str, str]] = field(default_factory=list)

    def see(self, at: float, status: str, reason: str, message: str) -> None:
        key = (str(status), str(reason or ""), progress_text(message))
        if not self.changes or self.changes[-1][1:] != key:
            self.changes.append((at, *key))


def _phase(status: Any, reason: Any) -> lc.Phase:
    return lc.phase_of(str(status), str(reason or "") or None)


def _ran_before_last(job: dict[str, Any]) -> bool:
    """A Job made again after one of its earlier creates ran a pod: its work may run twice.
    A Job deleted before any of its pods ran (its nodes never came) and made again is not
    (a record without ``ran``, from a fleet that does not keep it, counts every create)."""
    if "ran" not in job:
        return True
    return any(n < job.get("creates", 0) for n in job["ran"])


def _second_create(cluster: str, job: dict[str, Any], events: dict[int, list[Any]]) -> dict[str, Any]:
    """A Job the fleet saw created more than once, with what tells the cause: when the fleet
    created and deleted it, and its task's event log, on one clock (Unix seconds)."""
    out: dict[str, Any] = {"cluster": cluster, "job": job["name"], "creates": job["creates"]}
    out["created_at"] = [round(x, 3) for x in job.get("created_at", ())]
    out["deleted_at"] = [round(x, 3) for x in job.get("deleted_at", ())]
    tid = task_of_job(job["name"])
    if tid is not None and tid in events:
        out["events"] = _timeline(events[tid])
    return out


def _timeline(evs: list[Any]) -> list[tuple[float, str, str]]:
    return [(_unix(e.at), str(_phase(e.status, e.reason)), (e.message or "")[:160]) for e in evs]


def _unix(at: dt.datetime) -> float:
    """A database time (naive UTC) as Unix seconds, the fleet's clock."""
    return round((at if at.tzinfo else at.replace(tzinfo=dt.UTC)).timestamp(), 3)


_JOB_NAME = re.compile(r"^falcon-task-([0-9]+)(?:-a[0-9]+)?$")
# a pod of the sim's Job J: J-SUFFIX, or J-INDEX-SUFFIX (Indexed Jobs), SUFFIX 5 characters
_POD_OF_JOB = re.compile(r"^(falcon-task-[0-9]+(?:-a[0-9]+)?)(?:-[0-9]+)?-[a-z0-9]{5}$")


def task_of_job(name: str) -> int | None:
    """The task of a Job of any attempt (``falcon-task-42``, ``falcon-task-42-a1`` -> 42)."""
    m = _JOB_NAME.match(name or "")
    return int(m.group(1)) if m and service_of_job(name) == job_name(int(m.group(1))) else None


def disrupted_jobs(fleet: dict[str, Any]) -> dict[str, float | None]:
    """Every Job the sim's disruption records name: its ``jobs`` (``namespace/name``), and
    the Jobs of its ``pods`` (a pod that came onto a node between a maintenance notice and
    the drain is drained with it, and only ``pods`` is brought up to date then); the
    earliest record's time (Unix seconds; None when a record has none)."""
    out: dict[str, float | None] = {}

    def note(job: str, at: float | None) -> None:
        if job not in out or (at is not None and out[job] is not None and at < out[job]):  # type: ignore[operator]
            out[job] = at

    for c in fleet.get("clusters", {}).values():
        for r in c.get("disruptions") or ():
            at = r.get("at")
            for ref in r.get("jobs") or ():
                note(str(ref).rsplit("/", 1)[-1], at)
            for ref in r.get("pods") or ():
                m = _POD_OF_JOB.match(str(ref).rsplit("/", 1)[-1])
                if m:
                    note(m.group(1), at)
    return out


def _own_failure_recovered(tid: int, d: Any, fleet_jobs: dict[str, float | None], rows: tuple[Any, ...] = ()) -> str | None:
    """Why the recovery row ``d`` of task ``tid`` is not one of a run the fleet disrupted (None: it is).
    An ``abandoned`` row (a recovery that left its pool, not a disruption) must follow a
    disruption of the run before it: it is never a recovery of its own."""
    if d.job != job_name(tid, d.attempt):
        return f"the row names Job {d.job!r}, not the task's Job of attempt {d.attempt} ({job_name(tid, d.attempt)})"
    if d.kind in (RELEASED, SWITCHED):
        return None  # the controller's own move off a pool that was never run on, not a recovery
    if d.kind == ABANDONED:
        before = next((r for r in rows if r.attempt == d.attempt - 1), None)
        if before is None or before.kind in CONTROLLER_MOVES:
            return "an abandoned attempt that follows no disruption"
        return None
    if d.job not in fleet_jobs:
        return "no disruption record of the fleet lists this Job"
    at = fleet_jobs[d.job]
    if at is not None and at > _unix(d.at) + DISRUPTION_CLOCK_SLACK_S:
        return f"the fleet disrupted this Job only {at - _unix(d.at):.1f}s after the recovery was recorded"
    return None


def spec_always_fails(spec: str) -> bool:
    """The sim fails every run of this spec: ``FALCON_SIM_EXIT_CODE`` non-zero (a value that
    is no integer counts as 1, as in the sim) or ``FALCON_SIM_OOM`` set (exit code 137)."""
    try:
        env = (json.loads(spec) or {}).get("env") or {}
    except (ValueError, AttributeError):
        return False
    if not isinstance(env, dict):
        return False
    if str(env.get("FALCON_SIM_OOM", "")).lower() in ("1", "true", "yes"):
        return True
    raw = env.get("FALCON_SIM_EXIT_CODE")
    if raw is None:
        return False
    try:
        return int(str(raw)) != 0
    except ValueError:
        return True


def check(
    tasks: list[Any],
    events: dict[int, list[Any]],
    observed: dict[int, Observed],
    end_at: float,
    fleet: dict[str, Any],
    limits: Limits,
    pauses: tuple[tuple[float, float], ...] = (),
    disruptions: dict[int, tuple[Any, ...]] | None = None,
) -> dict[str, Any]:
    """The invariants of a soak; ``tasks`` are ``jobs`` rows (``model.Task``), ``events``
    their event logs by task id (``model.TaskEvent``, in order), ``observed`` the Message
    changes seen while it ran (times on the clock of ``end_at``), ``fleet`` the sim's stats.
    ``pauses``: (start, end) stretches in which the controller could not write at all (a
    database outage); a quiet stretch does not count them against a phase's limit.
    ``disruptions``: the ``falcon_task_disruptions`` rows by task (``Store.disruptions``)."""
    out: dict[str, list[Any]] = {k: [] for k in INVARIANTS}
    disruptions = disruptions or {}
    fleet_jobs = disrupted_jobs(fleet)
    for t in tasks:
        phase = _phase(t.status, t.reason)
        if phase.status not in lc.TERMINAL:
            out["lost"].append({"id": t.id, "phase": str(phase), "message": t.message})
        timeout = _timeout_of(t)
        obs = observed.get(t.id)
        if obs is not None:
            worst = _longest_quiet(obs, end_at, limits, timeout, pauses)
            if worst is not None:
                out["stuck"].append({"id": t.id, **worst})
        evs = events.get(t.id, [])
        phases = [_phase(e.status, e.reason) for e in evs]
        for a, b in zip(phases, phases[1:], strict=False):
            if a != b and not lc.allowed(a, b):
                out["illegal_transitions"].append({"id": t.id, "from": str(a), "to": str(b)})
        over = _abort_overwritten(phases, phase)
        if over:
            out["aborts_overwritten"].append({"id": t.id, "events": [str(p) for p in phases], "final": str(phase)})
        if failed_for_capacity(phase, t.message or "") and not budget_spent(evs, limits.capacity_budget):
            out["failed_for_capacity"].append({"id": t.id, "message": t.message})
        if phase == lc.SUCCEEDED and spec_always_fails(t.spec):
            out["failing_task_succeeded"].append({"id": t.id, "spec_env": (_json_or_none(t.spec) or {}).get("env")})
        rows = disruptions.get(t.id, ())
        for d in rows:
            why = _own_failure_recovered(t.id, d, fleet_jobs, rows)
            if why is not None:
                out["recovered_own_failure"].append(
                    {
                        "id": t.id, "attempt": d.attempt, "kind": d.kind, "job": d.job, "node": d.node,
                        "at": _unix(d.at), "detail": (d.detail or "")[:200], "why": why,
                        "fleet_jobs": _jobs_of_task(fleet, t.id), "events": _timeline(evs),
                    }
                )
    for cname, c in fleet.get("clusters", {}).items():
        for j in c.get("jobs", []):
            if j.get("creates", 0) > 1 and _ran_before_last(j):
                out["second_job_creates"].append(_second_create(cname, j, events))
        for p in c.get("node_pools", []):
            if p.get("deleted_at") is None and p["name"].startswith("falcon-"):
                out["pools_alive"].append(
                    {
                        "cluster": cname,
                        "pool": p["name"],
                        "status": p.get("status"),
                        "supply": p.get("supply"),
                        "hosts": p.get("hosts"),
                        "nodes": len(p.get("nodes") or ()),
                    }
                )
    counts = {k: len(v) for k, v in out.items()}
    rows = [d for tid in (t.id for t in tasks) for d in disruptions.get(tid, ())]
    figures = {
        "recoveries": sum(1 for d in rows if d.kind not in CONTROLLER_MOVES),  # by kind below, the controller's moves too
        "recoveries_by_kind": dict(sorted(Counter(d.kind for d in rows).items())),
        "recovered_tasks": sum(1 for t in tasks if disruptions.get(t.id)),
        "disrupted": sum(1 for t in tasks if _phase(t.status, t.reason) == lc.failed(lc.Reason.DISRUPTED)),
        "fleet_disrupted_jobs": sum(1 for j in fleet_jobs if task_of_job(j) is not None),
    }
    return {"ok": not any(counts.values()), "invariants": counts, "details": {k: v for k, v in out.items() if v}, "figures": figures}


def _jobs_of_task(fleet: dict[str, Any], tid: int) -> list[dict[str, Any]]:
    """The fleet's records of every Job of a task (each attempt), and the disruptions that named them."""
    out = []
    for cname, c in fleet.get("clusters", {}).items():
        for j in c.get("jobs", []):
            if task_of_job(j.get("name", "")) == tid:
                out.append({"cluster": cname, **{k: j.get(k) for k in ("name", "creates", "created_at", "deleted_at")}})
        for r in c.get("disruptions") or ():
            names = {str(x).rsplit("/", 1)[-1] for x in r.get("jobs") or ()}
            names |= {m.group(1) for x in r.get("pods") or () if (m := _POD_OF_JOB.match(str(x).rsplit("/", 1)[-1]))}
            if any(task_of_job(n) == tid for n in names):
                out.append({"cluster": cname, "disruption": r.get("kind"), "at": r.get("at"), "jobs": sorted(names), "pool": r.get("pool")})
    return out


def _json_or_none(text: str) -> dict[str, Any] | None:
    try:
        v = json.loads(text)
    except (ValueError, TypeError):
        return None
    return v if isinstance(v, dict) else None


def failed_for_capacity(phase: lc.Phase, message: str) -> bool:
    """NodePoolFailed for capacity that comes back, not by the soak's injected create errors
    (a task ended Failed/Disrupted is not one, whatever its Message says)."""
    return phase == lc.failed(lc.Reason.NODE_POOL_FAILED) and bool(CAPACITY_REFUSAL.search(message)) and CREATE_ERROR not in message


def budget_spent(evs: Sequence[TaskEvent], budget_s: float) -> bool:
    """The task waited for capacity the whole of a capacity budget (``budget_s`` > 0) before it
    ended, by its event log: from its first capacity wait (a ClusterBusy that names a capacity
    refusal, or WaitingForNode) to its last event. Such an end is the operator's limit on a
    fleet that could not deliver, not a failure for capacity that came back; a soak that
    passes no budget (0) counts every capacity failure."""
    if budget_s <= 0 or not evs:
        return False
    start = next(
        (
            e.at
            for e in evs
            if (p := _phase(e.status, e.reason)) == lc.WAITING_FOR_NODE
            or (p == lc.CLUSTER_BUSY and CAPACITY_REFUSAL.search(e.message or ""))
        ),
        None,
    )
    return start is not None and (evs[-1].at - start).total_seconds() >= budget_s - 60.0


def failed_by_injection(phase: lc.Phase, message: str) -> bool:
    return phase == lc.failed(lc.Reason.NODE_POOL_FAILED) and CREATE_ERROR in message


def _timeout_of(t: Any) -> float | None:
    """The task's run-time limit: the row's ``timeout_seconds``, else its spec's, else the
    product's default for a spec without one (None when the spec is not JSON)."""
    if getattr(t, "timeout_seconds", None):
        return float(t.timeout_seconds)
    try:
        return float(json.loads(t.spec).get("timeout_seconds") or DEFAULT_TIMEOUT_SECONDS)
    except Exception:
        return None


def _longest_quiet(
    obs: Observed, end_at: float, limits: Limits, timeout: float | None, pauses: tuple[tuple[float, float], ...] = ()
) -> dict[str, Any] | None:
    """The longest stretch over its phase's limit with nothing changing, if any (the time
    spent in ``pauses`` left out)."""
    worst = None
    ch = obs.changes
    for i, (at, status, reason, message) in enumerate(ch):
        phase = _phase(status, reason)
        limit = limits.of(phase, timeout, message, at)
        if limit is None:
            continue
        until = ch[i + 1][0] if i + 1 < len(ch) else end_at
        quiet = until - at - sum(max(0.0, min(until, b) - max(at, a)) for a, b in pauses)
        if quiet > limit and (worst is None or quiet - limit > worst["quiet_s"] - worst["limit_s"]):
            worst = {"phase": str(phase), "message": message, "quiet_s": round(quiet, 1), "limit_s": limit, "since_s": round(at, 1)}
    return worst


def _abort_overwritten(phases: list[lc.Phase], final: lc.Phase) -> bool:
    """After the first Aborting step only Aborting and Aborted may follow, and it ends Aborted."""
    if lc.ABORTING not in phases:
        return False
    after = phases[phases.index(lc.ABORTING) :]
    if any(p not in (lc.ABORTING, lc.ABORTED) for p in after):
        return True
    return final not in (lc.ABORTING, lc.ABORTED)  # still Aborting: lost or stuck, not overwritten


# ---- the run ---------------------------------------------------------------------------------------


class ChaosRun:
    """One soak: ``run()`` returns the report (``check`` plus counts of the faults injected)."""

    def __init__(
        self,
        tasks: int = 200,
        minutes: float = 2.0,
        seed: int = 1,
        db_url: str | None = None,
        scale: float = 0.3,
        drain_s: float | None = None,
        kills: bool = True,
        faults: bool = True,
        db_kills: bool = True,
        settings_overrides: dict[str, Any] | None = None,
        progress=None,
        db_outage_s: float = 30.0,
        margin_s: float = 30.0,
        disruption_rate: float = DISRUPTION_RATE,
    ) -> None:
        self.n, self.play_s, self.seed, self.db_url, self.scale = tasks, minutes * 60.0, seed, db_url, scale
        self.drain_s = drain_s if drain_s is not None else max(90.0, 0.5 * self.play_s)
        self.kills, self.faults, self.db_kills = kills, faults, db_kills
        # MariaDB/MySQL: the controller reaches the database through a proxy that refuses
        # every connection for this long once, mid-play (0: no outage)
        self.db_outage_s = db_outage_s if db_kills else 0.0
        # Limits.margin: Aborting's whole limit, and what Running and the creates get on top
        # of their own timeouts (a killed actor's restart must fit in it)
        self.margin_s = margin_s
        # random disruptions per node-hour of a node with a running pod (0: none)
        self.disruption_rate = disruption_rate
        self.proxy = None
        self.pauses: list[tuple[float, float]] = []  # the outage, in seconds of the play
        self.overrides = settings_overrides or {}
        self.progress = progress
        self.rng = random.Random(seed * 7919 + 1)
        self.counts: Counter[str] = Counter()
        self.observed: dict[int, Observed] = {}
        self.kill_log: list[tuple[float, str]] = []
        self.restarting: dict[str, tuple[float, Any, Any]] = {}  # killed actor -> (killed at, its handle, its ping)
        self.restart_s: list[float] = []  # each kill's restart, until the actor answered again
        self.run = None
        self._t0 = 0.0

    # ---- setup -----------------------------------------------------------------------------

    def _settings(self):
        from falcon_ray.devtools.demo import demo_settings

        # recovery_pool_wait_s, disruption_grace_s: the production 1 h and 60 s scaled down
        # (a recovering task whose pool's nodes do not come back acquires a new pool);
        # reservation_hold_after_s and contested_wait_s: the production 30 and 10 minutes
        # scaled down, so the reservation hold and the contested release play within the
        # 8-minute soak (unscaled, a 4x4 on the 8-host reservation waited unheld behind the
        # other topologies' reuse until the judge called its queue stuck)
        base = {"node_pool_timeout_s": 20, "registry_interval_s": 1, "recovery_pool_wait_s": 20, "disruption_grace_s": 10,
                "reservation_hold_after_s": 60, "contested_wait_s": 20}
        base.update(self.overrides)
        return demo_settings(**base)

    def _set_disruptions(self) -> None:
        for c in ("edge-a", "edge-b"):
            self.run.sim.set_faults(c, disruption_rate_per_node_hour=self.disruption_rate)

    def _set_faults(self) -> None:
        s = self.scale
        for c in ("edge-a", "edge-b"):
            self.run.sim.set_faults(
                c,
                api_error_rate=0.10,
                too_many_requests_rate=0.05,
                incompatible_op_rate=0.05,
                watch_drop_every=max(1.0, 7.0 * s),
                token_ttl=max(3.0, 20.0 * s),  # shorter than a ClusterActor lives between kills, so refusals happen every run
            )

    # ---- injections --------------------------------------------------------------------------

    def _kill_actor(self, kinds: tuple[str, ...]) -> None:
        """Kill one actor of ``kinds`` that answers (is not being started or restarted)."""
        import ray

        from actors import names

        ns = self.run.settings.namespace
        try:
            found = [n for n in names.list_falcon_actors(ns) if n.split("/")[0] in kinds and n not in self.restarting]
        except Exception as e:
            log.warning("chaos: list actors: %s", e)
            return
        if not found:
            self.counts["kills_skipped_restarting"] += 1
            return
        name = self.rng.choice(sorted(found))
        h = names.lookup(name, ns)
        if h is None:
            return
        try:
            ray.get(h.ping.remote(), timeout=READY_PING_S)
        except Exception:  # still starting, or busy past the ping: not this round
            self.counts["kills_skipped_not_ready"] += 1
            return
        try:
            ray.kill(h, no_restart=False)
        except Exception as e:
            log.warning("chaos: kill %s: %s", name, e)
            return
        kind = name.split("/")[0]
        self.counts[f"killed_{kind}"] += 1
        self.kill_log.append((round(self._now(), 1), name))
        self.restarting[name] = (time.monotonic(), h, None)

    def _follow_restarts(self) -> None:
        """Ping each killed actor (through the handle it was killed by: Ray keeps a restarted
        actor's handle) until it answers; record how long its restart took. A ping that
        failed is sent again at the next call, so at most one is out per actor."""
        import ray

        for name, (killed_at, h, ref) in list(self.restarting.items()):
            if ref is not None:
                done, _ = ray.wait([ref], timeout=0)
                if not done:
                    continue
                try:
                    ray.get(ref)
                except Exception:  # unavailable while Ray restarts it: ask again
                    pass
                else:
                    self.restart_s.append(time.monotonic() - killed_at)
                    del self.restarting[name]
                    continue
            self.restarting[name] = (killed_at, h, h.ping.remote())

    def _compact(self) -> None:
        c = self.rng.choice(("edge-a", "edge-b"))
        try:
            self.run.sim.compact_history(c, keep=0)
            self.counts["history_compactions"] += 1
        except Exception as e:
            log.warning("chaos: compact %s: %s", c, e)

    def _controller_url(self) -> str | None:
        """With an outage to play, the controller's URL goes through a loopback proxy."""
        if not self.db_outage_s or not self.db_url or not self.db_url.startswith("mysql"):
            return None
        from sqlalchemy.engine import make_url

        from falcon_ray.sim.tcp_proxy import TcpProxy

        u = make_url(self.db_url)
        self.proxy = TcpProxy(u.port or 3306, u.host or "127.0.0.1")
        port = self.proxy.start()
        return u.set(host="127.0.0.1", port=port).render_as_string(hide_password=False)

    def _outage_step(self, outage: list, now: float) -> list | None:
        """Start the outage when due (every controller connection cut, new ones refused),
        end it ``db_outage_s`` later; None once it is over."""
        start_at, end_at = outage
        if end_at is None and now >= start_at:
            self.proxy.stop()
            self.counts["db_outages"] += 1
            self.counts["db_outage_s"] += int(self.db_outage_s)
            log.info("chaos: the database refuses the controller's connections for %.0fs", self.db_outage_s)
            return [start_at, now + self.db_outage_s]
        if end_at is not None and now >= end_at:
            self.proxy.start()
            log.info("chaos: the database is back")
            self.pauses.append((start_at - self._t0, time.monotonic() - self._t0))
            return None
        return outage

    def _kill_db_connections(self) -> None:
        n = kill_db_connections(self.db_url, self.rng)
        if n:
            self.counts["db_connections_killed"] += n
            self.counts["db_kill_rounds"] += 1

    # ---- observation ---------------------------------------------------------------------------

    def _now(self) -> float:
        return time.monotonic() - self._t0

    def _last_change(self) -> float:
        """Seconds into the play of the newest phase or Message change any task made."""
        return max((o.changes[-1][0] for o in self.observed.values() if o.changes), default=0.0)

    def _observe(self) -> None:
        try:
            rows = self.run.tasks()
        except Exception as e:  # a killed connection: the next look sees it
            log.info("chaos: observe: %s", e)
            return
        now = self._now()
        for t in rows:
            self.observed.setdefault(t.id, Observed()).see(now, t.status, t.reason, t.message)

    # ---- the play --------------------------------------------------------------------------------

    def run_soak(self) -> dict[str, Any]:
        from falcon_ray.devtools.demo import DemoRun, Schedule

        plan = make_plan(self.n, self.seed, self.play_s)
        self.run = DemoRun(chaos_fleet(self.seed), self._settings(), self.db_url, controller_db_url=self._controller_url())
        started = time.monotonic()
        self.run.start()
        try:
            if self.faults:
                self._set_faults()
            if self.disruption_rate > 0:
                self._set_disruptions()
            plain_abort = self.run.abort

            def counted_abort(task_id: int) -> bool:
                self.counts["aborts_requested"] += 1
                landed = plain_abort(task_id)
                self.counts["aborts_landed" if landed else "aborts_after_finish"] += 1
                return landed

            self.run.abort = counted_abort
            sched = Schedule(self.run)
            self._t0 = time.monotonic()
            for item in plan:
                sched.add(item, self._t0)
            s = self.scale
            every = {
                "actor": 10.0 * s,
                "poller": 45.0 * s,
                "compact": 20.0 * s,
                "db": 15.0 * s,
                "create_error": 25.0 * s,
            }
            burst_end: dict[str, float] = {}
            due = {k: self._t0 + v for k, v in every.items()}
            outage = [self._t0 + 0.4 * self.play_s, None] if self.proxy is not None else None  # [start at, end at]
            last_print = last_observe = 0.0
            kill_turn = 0
            while not sched.empty() or self._now() < self.play_s:
                now = time.monotonic()
                try:
                    sched.step(now)
                except Exception as e:  # a killed DB connection under the upper layer's write
                    log.info("chaos: schedule step: %s", e)
                if self.kills:
                    if now >= due["actor"]:  # QueueActors and ClusterActors in turn
                        self._kill_actor((("queue",), ("cluster",))[kill_turn % 2])
                        kill_turn += 1
                        due["actor"] = now + every["actor"]
                    if now >= due["poller"]:
                        self._kill_actor(("poller",))
                        due["poller"] = now + every["poller"]
                if self.faults and now >= due["compact"]:
                    self._compact()
                    due["compact"] = now + every["compact"]
                if self.faults and now >= due["create_error"]:
                    # a short burst of failed creates (pool in ERROR, 0 nodes) on one cluster
                    c = self.rng.choice(("edge-a", "edge-b"))
                    self.run.sim.set_faults(c, create_error=CREATE_ERROR, create_error_code=CREATE_ERROR_CODE)
                    burst_end[c] = now + max(1.0, 3.0 * s)
                    self.counts["create_error_bursts"] += 1
                    due["create_error"] = now + every["create_error"]
                for c, end in list(burst_end.items()):
                    if now >= end:
                        self.run.sim.set_faults(c, create_error=None)
                        del burst_end[c]
                if self.db_kills and now >= due["db"]:
                    self._kill_db_connections()
                    due["db"] = now + every["db"]
                if outage is not None:
                    outage = self._outage_step(outage, now)
                if now - last_observe >= OBSERVE_EVERY_S:
                    self._follow_restarts()
                    self._observe()
                    last_observe = now
                if self.progress and self._now() - last_print >= 10:
                    last_print = self._now()
                    self.progress(self._status_line())
                time.sleep(0.25)
            for c in burst_end:
                self.run.sim.set_faults(c, create_error=None)
            if outage is not None and outage[1] is not None:  # the play ended inside the outage
                self._outage_step(outage, float("inf"))
            # quiescence: no more kills or create failures; API faults stay on until the end
            # a loaded machine is slow, not stuck: the drain goes on while tasks still change
            # (their last change within the margin), up to half as long again
            begun = time.monotonic()
            deadline = begun + self.drain_s
            while time.monotonic() < deadline or (
                time.monotonic() < begun + DRAIN_STRETCH * self.drain_s and self._last_change() > self._now() - self.margin_s
            ):
                self._follow_restarts()
                self._observe()
                try:
                    if self.run.all_terminal() and not self.run.falcon_pools_alive():
                        break
                except Exception as e:
                    log.info("chaos: drain check: %s", e)
                if self.progress and self._now() - last_print >= 10:
                    last_print = self._now()
                    self.progress(self._status_line() + " (draining)")
                time.sleep(0.5)
            self._observe()
            end_at = self._now()
            report = self._report(plan, end_at, time.monotonic() - started)
            if not report["ok"]:
                report["actors"] = self._actor_snapshots()
                report["kill_log"] = self.kill_log  # (seconds into the play, actor): to line up with a stall
            return report
        finally:
            self.run.stop()
            if self.proxy is not None:
                self.proxy.stop()

    def _actor_snapshots(self) -> dict[str, Any]:
        """What the ClusterActors and QueueActors say at the end (for a broken invariant)."""
        import ray

        from actors import names

        out: dict[str, Any] = {}
        ns = self.run.settings.namespace
        for name in names.list_falcon_actors(ns):
            if not name.startswith(("cluster/", "queue/")):
                continue
            try:
                snap = ray.get(names.lookup(name, ns).snapshot.remote(), timeout=10)
            except Exception as e:
                snap = {"error": f"{type(e).__name__}: {e}"[:300]}
            if name.startswith("cluster/"):
                snap = {k: snap.get(k) for k in ("connected", "connect_error", "jobs", "last_ok", "watch", "loops", "counters", "pool_ops", "error") if k in snap}
                snap["now"] = time.time()
            out[name] = snap
        return out

    def _status_line(self) -> str:
        c = Counter()
        for obs in self.observed.values():
            if obs.changes:
                c[str(_phase(obs.changes[-1][1], obs.changes[-1][2]))] += 1
        kills = sum(v for k, v in self.counts.items() if k.startswith("killed_"))
        return f"[{self._now():6.1f}s] " + ", ".join(f"{k} {v}" for k, v in sorted(c.items())) + f"; kills {kills}"

    def _report(self, plan: list[dict[str, Any]], end_at: float, wall: float) -> dict[str, Any]:
        store = self.run.store
        tasks = _retry(lambda: self.run.tasks())
        events = {t.id: _retry(lambda tid=t.id: store.events(tid)) for t in tasks}
        disruptions = _retry(lambda: store.disruptions([t.id for t in tasks]))
        fleet = self.run.sim.stats()
        st = self.run.settings
        restart = max(self.restart_s, default=0.0)
        limits = Limits(node_pool_timeout=float(st.node_pool_timeout_s), margin=self.margin_s + restart, recovery_wait=float(st.recovery_pool_wait_s))
        verdict = check(tasks, events, self.observed, end_at, fleet, limits, tuple(self.pauses), disruptions)
        # the controller's own loop (lease, registry) must outlive every fault, as its actors do
        loop_alive = self.run.thread is not None and self.run.thread.is_alive()
        verdict["invariants"]["controller_loop_died"] = 0 if loop_alive else 1
        verdict["ok"] = verdict["ok"] and loop_alive
        injected = Counter(self.counts)
        for c in fleet["clusters"].values():
            for k, v in (c.get("fault_counts") or {}).items():
                injected[k] += v
            injected["pool_ops_refused_as_concurrent"] += c.get("rejected_pool_ops", 0)
            for kind, v in (c.get("disruption_counts") or {}).items():
                injected[f"disruption_{kind}"] += v
        outcomes = Counter(str(_phase(t.status, t.reason)) for t in tasks)
        injected["failed_by_injected_create_error"] = sum(1 for t in tasks if failed_by_injection(_phase(t.status, t.reason), t.message or ""))
        return {
            "ok": verdict["ok"],
            "seed": self.seed,
            "tasks": len(tasks),
            "db": "mysql" if self.db_url and self.db_url.startswith("mysql") else "sqlite",
            "scale": self.scale,
            "play_s": self.play_s,
            "wall_s": round(wall, 1),
            "quiet_at_s": round(end_at, 1),
            # each kill's restart until the actor answered again (the slowest is added to the
            # limits' margin), and the kills still restarting at the end
            "actor_restart_s": {
                "n": len(self.restart_s),
                "p50": round(statistics.median(self.restart_s), 1) if self.restart_s else None,
                "max": round(restart, 1),
                "unfinished": len(self.restarting),
            },
            "margin_s": round(limits.margin, 1),
            "invariants": verdict["invariants"],
            "details": verdict["details"],
            "faults_injected": dict(sorted(injected.items())),
            "outcomes": dict(sorted(outcomes.items())),
            # the fleet's disruptions the controller recovered: rows of falcon_task_disruptions
            # (by kind), tasks with one, tasks ended Failed/Disrupted, Jobs the fleet disrupted
            "recoveries": verdict["figures"],
            "disruption_rate_per_node_hour": self.disruption_rate,
            # tasks that waited in ClusterBusy (reservation headroom or a stockout) at least once
            "waited_cluster_busy": sum(1 for evs in events.values() if any(_phase(e.status, e.reason) == lc.CLUSTER_BUSY for e in evs)),
            "kinds": dict(sorted(Counter(i["kind"] for i in plan).items())),
            "job_creates": sum(j["creates"] for c in fleet["clusters"].values() for j in c["jobs"]),
            "pools_created": sum(1 for c in fleet["clusters"].values() for p in c["node_pools"] if p["name"].startswith("falcon-")),
        }


def _retry(fn, attempts: int = 5):
    for i in range(attempts):
        try:
            return fn()
        except Exception:
            if i == attempts - 1:
                raise
            time.sleep(0.5)
    raise AssertionError("unreachable")


def kill_db_connections(db_url: str | None, rng: random.Random, fraction: float = 0.5) -> int:
    """MariaDB/MySQL: ``KILL`` about ``fraction`` of the other connections to the run's
    database (the controller's pools; pre-ping and retries must absorb it). Returns how many."""
    if not db_url or not db_url.startswith("mysql"):
        return 0
    import pymysql
    from sqlalchemy.engine import make_url

    from falcon_ray.store.repository import tls_connect_args

    u = make_url(db_url)
    try:
        conn = pymysql.connect(host=u.host or "127.0.0.1", port=u.port or 3306, user=u.username or "root", password=u.password or "", connect_timeout=3, **tls_connect_args(u))
    except Exception as e:
        log.warning("chaos: connect to kill: %s", e)
        return 0
    killed = 0
    try:
        with conn.cursor() as cur:
            cur.execute(
                "SELECT ID FROM information_schema.PROCESSLIST WHERE DB = %s AND ID <> CONNECTION_ID()",
                (u.database,),
            )
            ids = [r[0] for r in cur.fetchall()]
            for cid in ids:
                if rng.random() < fraction:
                    try:
                        cur.execute(f"KILL {int(cid)}")
                        killed += 1
                    except Exception:
                        pass  # gone already
    finally:
        conn.close()
    return killed


def summarize(report: dict[str, Any]) -> str:
    lines = [
        f"falcon-ray chaos: seed {report['seed']}, {report['tasks']} tasks on {report['db']}, "
        f"quiet after {report['quiet_at_s']}s (wall {report['wall_s']}s): {'OK' if report['ok'] else 'INVARIANT BROKEN'}",
        "invariants: " + ", ".join(f"{k}={v}" for k, v in report["invariants"].items()),
        "faults injected: " + ", ".join(f"{k}={v}" for k, v in report["faults_injected"].items()),
        "outcomes: " + ", ".join(f"{k}={v}" for k, v in report["outcomes"].items())
        + f"; waited in ClusterBusy: {report.get('waited_cluster_busy', 0)}",
    ]
    restart = report.get("actor_restart_s")
    if restart and restart["n"]:
        lines.append(
            f"actor restarts after a kill: {restart['n']}, p50 {restart['p50']}s, max {restart['max']}s "
            f"(limits' margin {report['margin_s']}s), {restart['unfinished']} unfinished"
        )
    rec = report.get("recoveries")
    if rec:
        lines.append(
            f"recoveries: {rec['recoveries']} ({', '.join(f'{k}={v}' for k, v in rec['recoveries_by_kind'].items()) or 'none'}) "
            f"of {rec['recovered_tasks']} task(s); ended Disrupted: {rec['disrupted']}; Jobs the fleet disrupted: {rec['fleet_disrupted_jobs']}"
        )
    for k, v in report["details"].items():
        for d in v[:10]:
            lines.append(f"  {k}: {json.dumps(d, default=str)[:300]}")
    return "\n".join(lines)
