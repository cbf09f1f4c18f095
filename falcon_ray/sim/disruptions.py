"""GKE disrupting running work: host maintenance, auto-repair, capacity taken back.

Contract
--------
:class:`Disruptions` does to the nodes under running pods what GKE does to TPU nodes
(GKE "Manage GKE node disruption for GPUs and TPUs", node auto-repair, flex-start;
Kubernetes "Pod disruption conditions"). A disruption hits a *slice*: every node of a
multi-host TPU pool together (a multi-host slice fails as a whole), or the one node of
a single-host pool. Three kinds:

* ``maintenance``: the nodes get ``cloud.google.com/scheduled-maintenance-time=<epoch s>``;
  ``timings.maintenance_notice`` later ``cloud.google.com/active-node-maintenance=ONGOING``,
  the taint ``cloud.google.com/impending-node-termination:NoSchedule``, ``unschedulable``
  and Ready=False ("node is shutting down"); every pod on them is terminated the way the
  kubelet's graceful node shutdown does it (phase Failed, ``reason: Terminated``,
  condition ``DisruptionTarget`` / ``TerminationByKubelet``, containers exit 143).
  ``timings.maintenance_duration`` later the same nodes are Ready again without the
  labels, the taint or ``unschedulable``.
* ``repair``: Ready=Unknown ("Kubelet stopped posting node status.") with the
  ``node.kubernetes.io/unreachable`` taints, the pods' Ready=False (the node lifecycle
  controller); ``timings.repair_detect`` later GKE recreates the VMs: the Nodes are
  deleted, their pods marked Failed with ``DisruptionTarget`` / ``DeletionByPodGC`` and
  deleted (PodGC), and Nodes of the same names register ``timings.node_register`` later.
* ``reclaim``: the VMs are taken back (flex-start's run limit, a preemption): the pods
  are terminated as by graceful node shutdown and the Nodes deleted. A flex-start pool
  releases those hosts and stays RUNNING with fewer (possibly 0) nodes: only the cluster
  autoscaler brings nodes back, for pending pods. Any other pool gets the VMs recreated
  under the same names ``timings.node_register`` later, as a managed instance group does.

Triggers: ``FALCON_SIM_DISRUPT="kind@seconds[,kind@seconds...]"`` in a Job's pod template
(item N applies to the N-th run of the task: the Job's ``falcon.dev/task-id`` label, else
its name, counted per namespace across Jobs; a run starts when all the Job's pods are
Running), the ``disruption_rate_per_node_hour`` fault (Poisson, per node with a running
pod, kinds by turns from ``disruption_kinds``) and :meth:`Disruptions.disrupt`.
Every disruption is recorded (``stats()["disruptions"]``, ``["disruption_counts"]``)
and Events are written for the notices, drains and node changes.

Every method must run on the loop thread.
"""

from __future__ import annotations

import logging
import math
import random
from typing import TYPE_CHECKING, Any

from .fleet import DISRUPTION_KINDS
from .kube_store import WatchEvent, clone, rfc3339
from .node_pools import NODEPOOL_LABEL, NodePool
from .workloads import TERMINAL, job_finished, owner_job

if TYPE_CHECKING:
    from .cluster import SimCluster

log = logging.getLogger(__name__)

TASK_LABEL = "falcon.dev/task-id"  # falcon_ray.render.LABEL_TASK_ID (the sim does not import Falcon)
ENV_KNOB = "FALCON_SIM_DISRUPT"
SCHEDULED_LABEL = "cloud.google.com/scheduled-maintenance-time"
ACTIVE_LABEL = "cloud.google.com/active-node-maintenance"
TERMINATION_TAINT = "cloud.google.com/impending-node-termination"
UNREACHABLE_TAINT = "node.kubernetes.io/unreachable"
SHUTDOWN_MESSAGE = "Pod was terminated in response to imminent node shutdown."
PODGC_MESSAGE = "PodGC: node no longer exists"
SIGTERM_EXIT = 143
TICK = 0.1  # seconds between draws of the random disruptions


def parse_plan(value: str) -> list[tuple[str, float]] | None:
    """``"maintenance@2,repair@0.5"`` -> ``[("maintenance", 2.0), ("repair", 0.5)]``; None when malformed."""
    plan: list[tuple[str, float]] = []
    for item in value.split(","):
        kind, sep, seconds = item.strip().partition("@")
        if not sep or kind.strip() not in DISRUPTION_KINDS:
            return None
        try:
            delay = float(seconds)
        except ValueError:
            return None
        if not math.isfinite(delay) or delay < 0:
            return None
        plan.append((kind.strip(), delay))
    return plan or None


def _plan_value(job: dict[str, Any]) -> str | None:
    for c in ((job.get("spec") or {}).get("template") or {}).get("spec", {}).get("containers") or []:
        for e in c.get("env") or []:
            if e.get("name") == ENV_KNOB and "value" in e:
                return str(e["value"])
    return None


def _phase(pod: dict[str, Any]) -> str:
    return (pod.get("status") or {}).get("phase", "Pending")


def _ref(obj: dict[str, Any]) -> str:
    md = obj["metadata"]
    return f"{md.get('namespace', '')}/{md['name']}"


class Disruptions:
    def __init__(self, cluster: SimCluster, seed: int):
        self.cluster = cluster
        self.store = cluster.store
        self.rng = random.Random(f"{seed}:{cluster.config.name}:disruptions")
        self.records: list[dict[str, Any]] = []
        self.counts: dict[str, int] = dict.fromkeys(DISRUPTION_KINDS, 0)
        self._runs: dict[tuple[str, str], int] = {}  # (namespace, task) -> runs started
        self._run_pods: set[str] = set()  # uids of pods already part of a counted run
        self._busy: set[str] = set()  # nodes under a disruption now
        self._turn = 0
        self._ticking = False
        self._last_tick = 0.0
        # seconds between draws; each draw's chance covers the time since the last, so a longer
        # tick (a simulator in virtual time) keeps the rate and only coarsens when a draw lands
        self.tick_s = TICK
        self.store.add_listener(self._on_event)
        self.poke()

    # ---- triggers ------------------------------------------------------------------------------
    def _on_event(self, ev: WatchEvent) -> None:
        if ev.plural != "pods":
            return
        if ev.type == "DELETED":
            self._run_pods.discard(ev.obj["metadata"]["uid"])
            return
        owner = owner_job(ev.obj)
        if owner and _phase(ev.obj) == "Running":
            self.cluster.call_soon(self._check_run, ev.obj["metadata"].get("namespace", ""), *owner)

    def _check_run(self, ns: str, job_name: str, job_uid: str) -> None:
        """Count a run of the Job's task once all its pods are Running; arm its FALCON_SIM_DISRUPT item."""
        job = self.store.get("jobs", ns, job_name)
        if job is None or job["metadata"]["uid"] != job_uid or job_finished(job):
            return
        spec = job.get("spec") or {}
        parallelism = int(spec.get("parallelism", 1) or 0)
        completions = spec.get("completions")
        expected = parallelism if completions is None else min(parallelism, int(completions))
        pods = [
            p
            for p in self.store.list("pods", ns)
            if (owner_job(p) or ("", ""))[1] == job_uid and _phase(p) not in TERMINAL
        ]
        running = [p for p in pods if _phase(p) == "Running"]
        if not running or len(running) < expected or len(running) != len(pods):
            return
        uids = [p["metadata"]["uid"] for p in running]
        if all(u in self._run_pods for u in uids):
            return  # this run was counted already
        self._run_pods.update(uids)
        task = (job["metadata"].get("labels") or {}).get(TASK_LABEL) or job_name
        key = (ns, task)
        self._runs[key] = run = self._runs.get(key, 0) + 1
        value = _plan_value(job)
        if value is None:
            return
        plan = parse_plan(value)
        if plan is None:
            log.warning(
                "sim cluster %s: Job %s/%s: ignoring malformed %s=%r (want kind@seconds[,kind@seconds...], "
                "kinds %s)",
                self.cluster.config.name,
                ns,
                job_name,
                ENV_KNOB,
                value,
                ", ".join(DISRUPTION_KINDS),
            )
            return
        if run > len(plan):
            return
        kind, delay = plan[run - 1]
        self.cluster.call_later(delay, self._fire_planned, kind, ns, job_name, uids)

    def _fire_planned(self, kind: str, ns: str, job_name: str, uids: list[str]) -> None:
        nodes: list[str] = []
        for pod in self.store.list("pods", ns):
            if pod["metadata"]["uid"] in uids and _phase(pod) == "Running":
                for n in self.slice_of(pod["spec"].get("nodeName", "")):
                    if n not in nodes:
                        nodes.append(n)
        if not nodes:
            log.info(
                "sim cluster %s: %s of Job %s/%s skipped: its pods no longer run",
                self.cluster.config.name,
                kind,
                ns,
                job_name,
            )
            return
        self.disrupt(kind, nodes, trigger=ENV_KNOB)

    def poke(self) -> None:
        """Start the random draws when ``disruption_rate_per_node_hour`` is above 0."""
        if not self._ticking and self.cluster.faults.disruption_rate_per_node_hour > 0:
            self._ticking = True
            self._last_tick = self.cluster.mono()
            self.cluster.call_later(self.tick_s, self._tick)

    def _tick(self) -> None:
        faults = self.cluster.faults
        rate = faults.disruption_rate_per_node_hour
        if rate <= 0:
            self._ticking = False
            return
        now = self.cluster.mono()
        elapsed, self._last_tick = now - self._last_tick, now
        chance = 1.0 - math.exp(-rate * elapsed / 3600.0)
        hosting = sorted(self.cluster.running_nodes() - {None})
        for node in hosting:
            if node in self._busy or self.store.get("nodes", "", node) is None:
                continue
            if self.rng.random() < chance:
                kinds = faults.disruption_kinds
                kind = kinds[self._turn % len(kinds)]
                self._turn += 1
                self.disrupt(kind, self.slice_of(node), trigger="disruption_rate_per_node_hour")
        self.cluster.call_later(self.tick_s, self._tick)

    # ---- the disruption ------------------------------------------------------------------------
    def _pool_of(self, node_name: str) -> NodePool | None:
        node = self.store.get("nodes", "", node_name)
        if node is None:
            return None
        name = (node["metadata"].get("labels") or {}).get(NODEPOOL_LABEL)
        return self.cluster.pools.pools.get(name or "")

    def slice_of(self, node_name: str) -> list[str]:
        """The nodes a disruption of ``node_name`` takes down: its whole pool for a multi-host slice."""
        pool = self._pool_of(node_name)
        if pool is None or pool.slice_hosts <= 1:
            return [node_name] if self.store.get("nodes", "", node_name) is not None else []
        return [n for n in pool.node_names if self.store.get("nodes", "", n) is not None]

    def disrupt(self, kind: str, nodes: list[str], trigger: str = "api") -> dict[str, Any] | None:
        """Disrupt ``nodes`` (one pool's slice) now; the record, or None when none can be disrupted."""
        if kind not in DISRUPTION_KINDS:
            raise ValueError(f"unknown disruption kind {kind!r}; allowed: {', '.join(DISRUPTION_KINDS)}")
        by_pool: dict[str, list[str]] = {}
        for n in nodes:
            pool = self._pool_of(n)
            if pool is not None and n not in self._busy:
                by_pool.setdefault(pool.name, []).append(n)
        record = None
        for pool_name, names in by_pool.items():
            record = self._start(kind, self.cluster.pools.pools[pool_name], names, trigger)
        return record

    def _start(self, kind: str, pool: NodePool, nodes: list[str], trigger: str) -> dict[str, Any]:
        pods = self._pods_on(nodes)
        jobs = sorted({f"{p['metadata'].get('namespace', '')}/{o[0]}" for p in pods if (o := owner_job(p))})
        record: dict[str, Any] = {
            "kind": kind,
            "trigger": trigger,
            "pool": pool.name,
            "supply": pool.supply,
            "nodes": list(nodes),
            "pods": [_ref(p) for p in pods],
            "jobs": jobs,
            "at": self.cluster.wall(),
            "drained_at": None,
            "restored_at": None,
        }
        self.records.append(record)
        self.counts[kind] += 1
        self._busy.update(nodes)
        log.info(
            "sim cluster %s: %s of %s (pool %s, pods %s)",
            self.cluster.config.name,
            kind,
            nodes,
            pool.name,
            record["pods"],
        )
        if kind == "maintenance":
            self._notify_maintenance(record, nodes)
        elif kind == "repair":
            self._fail_nodes(record, pool, nodes)
        else:
            self._reclaim(record, pool, nodes)
        return record

    def _pods_on(self, nodes: list[str], live_only: bool = True) -> list[dict[str, Any]]:
        return [
            p
            for p in self.store.list("pods")
            if (p.get("spec") or {}).get("nodeName") in nodes and (not live_only or _phase(p) not in TERMINAL)
        ]

    # ---- maintenance ---------------------------------------------------------------------------
    def _notify_maintenance(self, record: dict[str, Any], nodes: list[str]) -> None:
        notice = self.cluster.draw("maintenance_notice")
        when = int(self.cluster.wall() + notice)
        for name in nodes:
            self._mutate_node(
                name, lambda n: n["metadata"].setdefault("labels", {}).update({SCHEDULED_LABEL: str(when)})
            )
            self._node_event(
                name,
                "Normal",
                "MaintenanceScheduled",
                f"Host maintenance of node {name} is scheduled at {rfc3339_epoch(when)} "
                f"({SCHEDULED_LABEL}={when})",
            )
        self.cluster.call_later(notice, self._drain_for_maintenance, record, nodes)

    def _drain_for_maintenance(self, record: dict[str, Any], nodes: list[str]) -> None:
        now = self.cluster.stamp()

        def ongoing(n: dict[str, Any]) -> None:
            n["metadata"].setdefault("labels", {})[ACTIVE_LABEL] = "ONGOING"
            spec = n.setdefault("spec", {})
            spec["unschedulable"] = True
            taints = [t for t in spec.get("taints") or [] if t.get("key") != TERMINATION_TAINT]
            spec["taints"] = taints + [
                {"key": TERMINATION_TAINT, "value": "true", "effect": "NoSchedule", "timeAdded": now}
            ]
            _set_ready(n, "False", "KubeletNotReady", "node is shutting down", now)

        for name in nodes:
            self._mutate_node(name, ongoing)
            self._node_event(
                name,
                "Warning",
                "MaintenanceStarted",
                f"Host maintenance of node {name} started: GKE is stopping its workloads "
                f"({ACTIVE_LABEL}=ONGOING, taint {TERMINATION_TAINT}:NoSchedule)",
            )
        pods = self._pods_on(nodes)
        for pod in pods:
            self._terminate(pod, "TerminationByKubelet", SHUTDOWN_MESSAGE, SIGTERM_EXIT, graceful=True)
            self.cluster.record_event(
                pod,
                "Warning",
                "HostMaintenance",
                f"Stopping pod for host maintenance of node {pod['spec'].get('nodeName')}: {SHUTDOWN_MESSAGE}",
            )
        record["drained_at"] = self.cluster.wall()
        record["pods"] = sorted(set(record["pods"]) | {_ref(p) for p in pods})
        self.cluster.call_later(
            self.cluster.draw("maintenance_duration"), self._end_maintenance, record, nodes
        )

    def _end_maintenance(self, record: dict[str, Any], nodes: list[str]) -> None:
        now = self.cluster.stamp()

        def done(n: dict[str, Any]) -> None:
            labels = n["metadata"].setdefault("labels", {})
            labels.pop(SCHEDULED_LABEL, None)
            labels.pop(ACTIVE_LABEL, None)
            spec = n.setdefault("spec", {})
            spec.pop("unschedulable", None)
            spec["taints"] = [t for t in spec.get("taints") or [] if t.get("key") != TERMINATION_TAINT]
            _set_ready(n, "True", "KubeletReady", "kubelet is posting ready status", now)

        for name in nodes:
            if self._mutate_node(name, done):
                self._node_event(
                    name,
                    "Normal",
                    "MaintenanceCompleted",
                    f"Host maintenance of node {name} completed; the node is Ready",
                )
            self._busy.discard(name)
        record["restored_at"] = self.cluster.wall()

    # ---- repair --------------------------------------------------------------------------------
    def _fail_nodes(self, record: dict[str, Any], pool: NodePool, nodes: list[str]) -> None:
        now = self.cluster.stamp()

        def unknown(n: dict[str, Any]) -> None:
            spec = n.setdefault("spec", {})
            taints = [t for t in spec.get("taints") or [] if t.get("key") != UNREACHABLE_TAINT]
            spec["taints"] = taints + [
                {"key": UNREACHABLE_TAINT, "effect": "NoSchedule", "timeAdded": now},
                {"key": UNREACHABLE_TAINT, "effect": "NoExecute", "timeAdded": now},
            ]
            _set_ready(n, "Unknown", "NodeStatusUnknown", "Kubelet stopped posting node status.", now)

        for name in nodes:
            self._mutate_node(name, unknown)
            self._node_event(name, "Normal", "NodeNotReady", f"Node {name} status is now: NodeNotReady")
        for pod in self._pods_on(nodes):
            md = pod["metadata"]

            def not_ready(p: dict[str, Any]) -> None:
                for cond in (p.get("status") or {}).get("conditions") or []:
                    if cond.get("type") == "Ready" and cond.get("status") != "False":
                        cond.update(status="False", lastTransitionTime=now)

            self.store.mutate("pods", md["namespace"], md["name"], not_ready)
            self.cluster.record_event(pod, "Warning", "NodeNotReady", "Node is not ready")
        self.cluster.call_later(self.cluster.draw("repair_detect"), self._recreate, record, pool, nodes)

    def _recreate(self, record: dict[str, Any], pool: NodePool, nodes: list[str]) -> None:
        """GKE auto-repair: delete the VMs (Nodes) and their pods (PodGC), then register them again."""
        zones = self._delete_nodes(record, nodes, "DeletionByPodGC", PODGC_MESSAGE, None)
        self.cluster.call_later(self.cluster.draw("node_register"), self._reregister, record, pool, zones)

    # ---- reclaim -------------------------------------------------------------------------------
    def _reclaim(self, record: dict[str, Any], pool: NodePool, nodes: list[str]) -> None:
        why = "its flex-start capacity was reclaimed" if pool.flex else "its VM was preempted"
        for name in nodes:
            self._node_event(name, "Warning", "CapacityReclaimed", f"Node {name} is shutting down: {why}")
        pods = self._pods_on(nodes)
        for pod in pods:
            self._terminate(pod, "TerminationByKubelet", SHUTDOWN_MESSAGE, SIGTERM_EXIT, graceful=True)
        record["drained_at"] = self.cluster.wall()
        if pool.flex:
            for name in nodes:
                self._node_event(
                    name, "Normal", "RemovingNode", f"Node {name} event: Removing Node {name} from Controller"
                )
            self.cluster.pools.remove_nodes(pool, [n for n in nodes if n in pool.node_names])
            self._busy.difference_update(nodes)
            self.cluster.autoscaler.poke()
            return  # nodes come back only through the autoscaler, for pending pods
        zones = self._delete_nodes(record, nodes, "DeletionByPodGC", PODGC_MESSAGE, None)
        self.cluster.call_later(self.cluster.draw("node_register"), self._reregister, record, pool, zones)

    # ---- shared steps --------------------------------------------------------------------------
    def _delete_nodes(
        self, record: dict[str, Any], nodes: list[str], reason: str, message: str, exit_code: int | None
    ) -> dict[str, str]:
        """Delete the Nodes; pods still on them are marked Failed with DisruptionTarget, then deleted."""
        zones: dict[str, str] = {}
        for name in nodes:
            node = self.store.get("nodes", "", name)
            if node is None:
                continue
            zones[name] = (node["metadata"].get("labels") or {}).get("topology.kubernetes.io/zone", "")
            self._node_event(
                name, "Normal", "RemovingNode", f"Node {name} event: Removing Node {name} from Controller"
            )
            for pod in self._pods_on([name], live_only=False):
                if _phase(pod) not in TERMINAL:
                    self._terminate(pod, reason, message, exit_code, graceful=False)
                    record["pods"] = sorted(set(record["pods"]) | {_ref(pod)})
                md = pod["metadata"]
                self.store.delete("pods", md["namespace"], md["name"])
            self.store.delete("nodes", "", name)
        if record["drained_at"] is None:
            record["drained_at"] = self.cluster.wall()
        self.cluster.refresh_idle()
        return zones

    def _reregister(self, record: dict[str, Any], pool: NodePool, zones: dict[str, str]) -> None:
        alive = (
            pool.status == "RUNNING"
            and pool.deleted_at is None
            and self.cluster.pools.pools.get(pool.name) is pool
        )
        for name, zone in zones.items():
            self._busy.discard(name)
            if not alive or name not in pool.node_names or self.store.get("nodes", "", name) is not None:
                continue
            self.cluster.add_node(pool, zone or pool.zones[0], name=name)
            self._node_event(
                name, "Normal", "RegisteredNode", f"Node {name} event: Registered Node {name} in Controller"
            )
        record["restored_at"] = self.cluster.wall()
        self.cluster.refresh_idle()

    def _terminate(
        self, pod: dict[str, Any], reason: str, message: str, exit_code: int | None, graceful: bool
    ) -> None:
        """Phase Failed with ``DisruptionTarget``; ``exit_code``: the containers were stopped (else untouched)."""
        now = self.cluster.stamp()

        def change(p: dict[str, Any]) -> None:
            st = p.setdefault("status", {})
            st["phase"] = "Failed"
            if graceful:
                st["reason"] = "Terminated"
                st["message"] = SHUTDOWN_MESSAGE
            conds = [c for c in st.get("conditions") or [] if c.get("type") != "DisruptionTarget"]
            for cond in conds:
                if cond.get("type") in ("Ready", "ContainersReady") and exit_code is not None:
                    cond.update(status="False", reason="PodCompleted", lastTransitionTime=now)
            st["conditions"] = [
                {
                    "type": "DisruptionTarget",
                    "status": "True",
                    "reason": reason,
                    "message": message,
                    "lastProbeTime": None,
                    "lastTransitionTime": now,
                }
            ] + conds
            if exit_code is None:
                return
            for cs in st.get("containerStatuses") or []:
                started = (cs.get("state") or {}).get("running", {}).get("startedAt", now)
                cs["state"] = {
                    "terminated": {
                        "exitCode": exit_code,
                        "reason": "Error",
                        "startedAt": started,
                        "finishedAt": now,
                        "containerID": cs.get("containerID", ""),
                    }
                }
                cs["ready"] = False
                cs["started"] = False

        md = pod["metadata"]
        self.store.mutate("pods", md["namespace"], md["name"], change)
        logs = self.cluster.workloads.logs.get(md["uid"])
        if logs is not None:
            logs.append(f"[falcon-sim] {now} pod terminated: DisruptionTarget {reason}: {message}")

    def _mutate_node(self, name: str, change: Any) -> bool:
        return self.store.get("nodes", "", name) is not None and (
            self.store.mutate("nodes", "", name, change) or True
        )

    def _node_event(self, name: str, etype: str, reason: str, message: str) -> None:
        node = self.store.get("nodes", "", name) or {
            "kind": "Node",
            "apiVersion": "v1",
            "metadata": {"name": name},
        }
        node = clone(node)
        node.setdefault("kind", "Node")
        node.setdefault("apiVersion", "v1")
        self.cluster.record_event(node, etype, reason, message)

    def stats(self) -> dict[str, Any]:
        return {"disruptions": clone(self.records), "disruption_counts": dict(self.counts)}


def _set_ready(node: dict[str, Any], status: str, reason: str, message: str, now: str) -> None:
    conds = node.setdefault("status", {}).setdefault("conditions", [])
    for cond in conds:
        if cond.get("type") == "Ready":
            if cond.get("status") != status:
                cond["lastTransitionTime"] = now
            cond.update(status=status, reason=reason, message=message, lastHeartbeatTime=now)
            return
    conds.append(
        {
            "type": "Ready",
            "status": status,
            "reason": reason,
            "message": message,
            "lastHeartbeatTime": now,
            "lastTransitionTime": now,
        }
    )


def rfc3339_epoch(ts: float) -> str:
    from datetime import UTC, datetime

    return rfc3339(datetime.fromtimestamp(ts, UTC))
