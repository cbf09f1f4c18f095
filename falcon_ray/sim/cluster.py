"""One simulated GKE cluster: its node pools, its Kubernetes objects, its faults and its accounting.

Contract
--------
:class:`SimCluster` ties together, for one fleet entry:

* ``pools`` (:class:`~falcon_ray.sim.node_pools.NodePools`): the GKE side;
* ``store`` (:class:`~falcon_ray.sim.kube_store.ObjectStore`) and
  ``workloads`` (:class:`~falcon_ray.sim.workloads.Workloads`): the Kubernetes side;
* ``autoscaler`` (:class:`~falcon_ray.sim.autoscaler.Autoscaler`): the cluster
  autoscaler that resizes pools with autoscaling enabled;
* its zones: ``config.location`` is a zone or a region, ``config.zones`` the
  node locations GKE reports in ``Cluster.locations``; the reservation (if any)
  lives in ``config.reservation_zone`` and Compute answers it only there;
* ``faults`` / ``timings``: live, validated copies of the fleet file's values,
  replaced wholesale by :meth:`set_faults` / :meth:`set_timings`;
* private ``random.Random`` generators seeded from the fleet seed and the
  cluster name - one for generated names, one for fault draws, one for the
  timings given as distributions (:meth:`draw`) - so one cluster's traffic never
  shifts another's draws, the fault sequence depends only on the sequence of
  GKE/Compute calls to this cluster, and timings that are numbers draw nothing;
* its stockouts (:meth:`stocked_out`): windows of its clock, counted from when
  the cluster was built, in which a supply has no capacity;
* accounting that does not trust any client: Job create counts and manifests,
  idle chip-seconds per pool (chips of a pool whose VMs exist - RUNNING or
  STOPPING - while no pod on its nodes is Running).

Every method must run on the simulator's event-loop thread.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import random
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, Protocol

from falcon_ray.clock import SYSTEM, Clock

from .autoscaler import Autoscaler
from .disruptions import Disruptions
from .errors import GoogleError
from .fleet import ClusterConfig, Faults, Timings, WorkloadPolicyConfig, region_of
from .kube_store import ObjectStore, WatchEvent, copy_out, rfc3339
from .machines import family_for_type
from .node_pools import NodePool, NodePools, node_object
from .workloads import Workloads

log = logging.getLogger(__name__)

MAX_EVENTS = 500


class TimerLoop(Protocol):
    """What a cluster needs of its loop: an asyncio loop, or a simulator's own event queue."""

    def call_later(self, delay: float, callback: Callable[..., None], *args: Any) -> Any: ...

    def call_soon(self, callback: Callable[..., None], *args: Any) -> Any: ...


class SimCluster:
    def __init__(
        self,
        config: ClusterConfig,
        index: int,
        seed: int,
        loop: asyncio.AbstractEventLoop | TimerLoop,
        clock: Clock = SYSTEM,
    ):
        self.config = config
        self.index = index
        self.loop = loop
        self.clock = clock
        self.faults: Faults = config.faults.model_copy(deep=True)
        self.timings: Timings = config.timings.model_copy(deep=True)
        self._stamp_at: float | None = None  # the clock's time that _stamp_text shows
        self._stamp_text = ""
        self.rng = random.Random(f"{seed}:{config.name}")  # names (operations, nodes, pods, events)
        # fault draws get their own generator: they depend only on the sequence of API calls
        self.fault_rng = random.Random(f"{seed}:{config.name}:faults")
        # timings given as distributions draw from their own generator (numbers draw nothing)
        self.timing_rng = random.Random(f"{seed}:{config.name}:timings")
        self.started_at = clock.monotonic()  # the zero of the stockouts' windows
        # how many faults were actually injected, by kind (stats()["fault_counts"])
        self.fault_counts: dict[str, int] = {
            "api_503": 0,
            "api_429": 0,
            "incompatible_op": 0,
            "watch_cut": 0,
            "watch_410": 0,
            "token_rejected": 0,
            "create_error": 0,
            "webhook_unavailable": 0,
            "stockout": 0,
        }
        if clock is SYSTEM:
            self.store = ObjectStore(config.watch_history)
        else:  # a given clock: stamps in its time, uids from the cluster's seed (a replayable run)
            uid_rng = random.Random(f"{seed}:{config.name}:uids")
            self.store = ObjectStore(config.watch_history, stamp=self.stamp, new_uid=lambda: str(uuid.UUID(int=uid_rng.getrandbits(128), version=4)))
        # (namespace, name) -> spec.nodeName of each stored pod in phase Running, kept by a listener
        # registered before any other, so it is current whenever anything reads it
        self._running_pods: dict[tuple[str, str], Any] = {}
        self.store.add_listener(self._index_pod)
        # the pools of pools.history that refresh_idle may still change, in history's order
        self._idle_open: list[NodePool] = []
        self._idle_seen = 0
        self.pools = NodePools(self)
        self.workloads = Workloads(self)
        self.autoscaler = Autoscaler(self)  # after Workloads: its pass sees the scheduler's verdicts
        self.disruptions = Disruptions(self, seed)
        self.kube_url = ""  # set once its HTTP site is listening
        self.job_records: dict[tuple[str, str], dict[str, Any]] = {}
        self._node_seq = 0
        self._event_names: list[tuple[str, str]] = []

    # ---- time and timers -----------------------------------------------------------------------
    def mono(self) -> float:
        return self.clock.monotonic()

    def wall(self) -> float:
        return self.clock.time()

    def stamp(self) -> str:
        """Now as an RFC 3339 timestamp (seconds), for the objects' server-set times."""
        now = self.clock.time()
        if now != self._stamp_at:  # formatted again only when the clock has moved
            self._stamp_at, self._stamp_text = now, rfc3339(datetime.fromtimestamp(now, UTC))
        return self._stamp_text

    def draw(self, timing: str) -> float:
        """How long one event of ``timing`` (a :class:`Timings` field) takes this time."""
        return self.timings.draw(timing, self.timing_rng)

    def stocked_out(self, supply: str) -> bool:
        """True while one of the cluster's stockouts takes away ``supply`` (its clock's time
        since the cluster was built is in the window)."""
        stockouts = self.config.stockouts
        if not stockouts:
            return False
        at = self.mono() - self.started_at
        return any(s.covers(supply, at) for s in stockouts)

    def call_later(self, delay: float, fn: Callable[..., None], *args: Any) -> None:
        self.loop.call_later(max(0.0, delay), self._guarded, fn, args)

    def call_soon(self, fn: Callable[..., None], *args: Any) -> None:
        self.loop.call_soon(self._guarded, fn, args)

    def _guarded(self, fn: Callable[..., None], args: tuple[Any, ...]) -> None:
        try:
            fn(*args)
        except Exception:  # noqa: BLE001 - a simulator bug must not stop the loop
            log.exception("sim cluster %s: timer %s failed", self.config.name, getattr(fn, "__name__", fn))

    # ---- faults --------------------------------------------------------------------------------
    def set_faults(self, **changes: Any) -> Faults:
        self.faults = Faults.model_validate({**self.faults.model_dump(), **changes})
        self.store.poke_watchers()  # watch_drop_every may have changed
        self.disruptions.poke()  # disruption_rate_per_node_hour may have changed
        return self.faults

    def set_timings(self, **changes: Any) -> Timings:
        self.timings = Timings.model_validate({**self.timings.model_dump(), **changes})
        self.store.poke_watchers()
        return self.timings

    def reset_faults(self) -> None:
        self.faults = self.config.faults.model_copy(deep=True)
        self.timings = self.config.timings.model_copy(deep=True)
        self.store.poke_watchers()
        self.disruptions.poke()

    def inject_api_fault(self) -> None:
        """Raise the 503 or 429 the fault rates ask for (one draw per GKE/Compute call)."""
        f = self.faults
        if not f.api_error_rate and not f.too_many_requests_rate:
            return
        draw = self.fault_rng.random()
        if draw < f.api_error_rate:
            self.fault_counts["api_503"] += 1
            raise GoogleError(503, "The service is currently unavailable.", "UNAVAILABLE")
        if draw < f.api_error_rate + f.too_many_requests_rate:
            self.fault_counts["api_429"] += 1
            raise GoogleError(
                429,
                "Too many operations: the request rate for this cluster is limited. Try again later.",
                "RESOURCE_EXHAUSTED",
            )

    # ---- GKE-facing views ----------------------------------------------------------------------
    def reservation_machine_type(self) -> str | None:
        res = self.config.reservation
        if res is None:
            return None
        return res.machine_type or family_for_type(self.config.tpu_type).host_machine

    def reservation_json(self) -> dict[str, Any]:
        c = self.config
        res = c.reservation
        assert res is not None
        owner = c.reservation_project
        zone_url = f"https://www.googleapis.com/compute/v1/projects/{owner}/zones/{c.reservation_zone}"
        return {
            "kind": "compute#reservation",
            "id": str(
                int(
                    hashlib.sha256(f"{owner}/{c.reservation_zone}/{res.name}".encode()).hexdigest()[:15],
                    16,
                )
            ),
            "name": res.name,
            "zone": zone_url,
            "selfLink": f"{zone_url}/reservations/{res.name}",
            "specificReservationRequired": True,
            **({"shareSettings": {"shareType": "SPECIFIC_PROJECTS"}} if owner != c.project else {}),
            "specificReservation": {
                "count": str(res.count),
                "inUseCount": str(self.pools.reservation_in_use()),
                "instanceProperties": {"machineType": self.reservation_machine_type()},
            },
            "status": "READY",
        }

    @property
    def region(self) -> str:
        return region_of(self.config.location)

    def workload_policy(self, name: str) -> WorkloadPolicyConfig | None:
        """The workload policy ``name`` of the cluster's project and region, if declared."""
        return next((w for w in self.config.workload_policies if w.name == name), None)

    def resource_policy_json(self, name: str) -> dict[str, Any]:
        """A workload policy as Compute's resourcePolicies.get answers it."""
        w = self.workload_policy(name)
        assert w is not None
        c = self.config
        region_url = f"https://www.googleapis.com/compute/v1/projects/{c.project}/regions/{self.region}"
        return {
            "kind": "compute#resourcePolicy",
            "id": str(int(hashlib.sha256(f"{c.project}/{self.region}/{name}".encode()).hexdigest()[:15], 16)),
            "name": name,
            "region": region_url,
            "selfLink": f"{region_url}/resourcePolicies/{name}",
            "status": "READY",
            "workloadPolicy": {"type": w.type, "acceleratorTopology": w.accelerator_topology},
        }

    def cluster_json(self, ca_b64: str, enums_as_int: bool) -> dict[str, Any]:
        c = self.config
        host = self.kube_url.split("://", 1)[-1]
        return {
            "name": c.name,
            "location": c.location,
            "zone": c.location,
            "endpoint": host,
            "masterAuth": {"clusterCaCertificate": ca_b64},
            "status": 2 if enums_as_int else "RUNNING",
            "currentMasterVersion": "1.33.5-gke.1080000",
            "currentNodeVersion": "1.33.5-gke.1080000",
            "selfLink": (
                f"https://container.googleapis.com/v1/projects/{c.project}/locations/{c.location}/clusters/{c.name}"
            ),
            "locations": c.zones,
            "workloadIdentityConfig": {"workloadPool": f"{c.project}.svc.id.goog"},
            "resourceLabels": {"falcon-sim": "true", "registry-status": c.status},
            "nodePools": [p.to_json(self, enums_as_int) for p in self.pools.visible()],
        }

    # ---- nodes (called by NodePools) -----------------------------------------------------------
    def add_node(self, pool: NodePool, zone: str, name: str | None = None) -> str:
        """Register a Node of ``pool`` in ``zone``: a new name, or ``name`` for a VM GKE recreated."""
        self._node_seq += 1
        if name is None:
            digest = "".join(self.rng.choice("0123456789abcdef") for _ in range(8))
            tail = "".join(self.rng.choice("abcdefghijklmnopqrstuvwxyz0123456789") for _ in range(4))
            name = f"gke-{self.config.name[:16]}-{pool.name[:20]}-{digest}-{tail}"
        self.store.create("nodes", node_object(self, pool, name, self._node_seq, zone))
        return name

    def remove_node(self, name: str) -> None:
        for pod in list(self.store.list("pods")):
            if (pod.get("spec") or {}).get("nodeName") == name:
                md = pod["metadata"]
                self.store.delete("pods", md["namespace"], md["name"])
        self.store.delete("nodes", "", name)

    # ---- accounting ----------------------------------------------------------------------------
    def refresh_idle(self) -> None:
        """Add up idle chip-seconds to now and note which pools are idle from now on.

        Call it before a pool's size changes, so each stretch is counted at the chips it had.
        """
        running_nodes = self.running_nodes()
        now = self.mono()
        history = self.pools.history
        if len(history) != self._idle_seen:  # pools accepted since the last call (history only grows)
            self._idle_open.extend(history[self._idle_seen :])
            self._idle_seen = len(history)
        still_open = []
        for pool in self._idle_open:
            pool.idle_chip_seconds = pool.idle_total(now)
            idle = pool.billed and not any(n in running_nodes for n in pool.node_names)
            pool.idle_mark = now if idle else None
            # a deleted pool is never billed again: once it is not idle, nothing here changes it again
            if pool.deleted_at is None or pool.idle_mark is not None:
                still_open.append(pool)
        self._idle_open = still_open

    def running_nodes(self) -> set[Any]:
        """The ``spec.nodeName`` of every stored pod in phase Running (None for one without)."""
        return set(self._running_pods.values())

    def _index_pod(self, ev: WatchEvent) -> None:
        if ev.plural != "pods":
            return
        md = ev.obj["metadata"]
        key = (md.get("namespace", ""), md["name"])
        if ev.type != "DELETED" and (ev.obj.get("status") or {}).get("phase") == "Running":
            self._running_pods[key] = (ev.obj.get("spec") or {}).get("nodeName")
        else:
            self._running_pods.pop(key, None)

    def record_job_create(self, job: dict[str, Any], manifest: dict[str, Any]) -> None:
        """A Job created through the API; ``manifest``: the body as received, JSON-shaped (as
        ``kube_store.clone`` returns it), of which the record keeps a copy."""
        md = job["metadata"]
        key = (md.get("namespace", ""), md["name"])
        now = self.wall()
        rec = self.job_records.get(key)
        if rec is None:
            rec = self.job_records[key] = {
                "name": md["name"],
                "namespace": key[0],
                "creates": 0,
                "first_created_at": now,
                "created_at": [],
                "ran": [],  # record_job_ran
            }
        rec["creates"] += 1
        rec["manifest"] = copy_out(manifest)
        rec["last_created_at"] = now
        rec["created_at"].append(now)
        rec["uid"] = md["uid"]

    def record_job_ran(self, namespace: str, name: str) -> None:
        """A pod of the Job's latest create started running: ``ran`` lists the creates (1, 2,
        ...) that ran a pod, so a Job made again after one of its creates ran (work that may
        run twice) can be told from one made again after a create that never ran a pod."""
        rec = self.job_records.get((namespace, name))
        if rec is not None and rec["creates"] not in rec["ran"]:
            rec["ran"].append(rec["creates"])

    def record_job_delete(self, job: dict[str, Any]) -> None:
        """A Job deleted through the API: when, so a second create can be told apart from
        a 409 (the soak's report shows the create and delete times of a Job made twice)."""
        md = job["metadata"]
        rec = self.job_records.get((md.get("namespace", ""), md["name"]))
        if rec is not None:
            rec.setdefault("deleted_at", []).append(self.wall())

    def record_event(self, obj: dict[str, Any], etype: str, reason: str, message: str) -> None:
        md = obj["metadata"]
        ns = md.get("namespace") or "default"
        suffix = "".join(self.rng.choice("0123456789abcdef") for _ in range(16))
        now = self.stamp()
        event = {
            "metadata": {"name": f"{md['name']}.{suffix}", "namespace": ns},
            "involvedObject": {
                "kind": obj.get("kind"),
                "apiVersion": obj.get("apiVersion"),
                "namespace": ns,
                "name": md["name"],
                "uid": md.get("uid"),
            },
            "reason": reason,
            "message": message,
            "type": etype,
            "count": 1,
            "firstTimestamp": now,
            "lastTimestamp": now,
            "source": {"component": "falcon-sim"},
            "reportingComponent": "falcon-sim",
        }
        self.store.create("events", event)
        self._event_names.append((ns, event["metadata"]["name"]))
        while len(self._event_names) > MAX_EVENTS:
            old_ns, old_name = self._event_names.pop(0)
            self.store.delete("events", old_ns, old_name)

    def idle_chip_seconds(self) -> float:
        now = self.mono()
        return round(sum(pool.idle_total(now) for pool in self.pools.history), 3)

    def stats(self) -> dict[str, Any]:
        self.refresh_idle()
        c = self.config
        pools = self.pools.stats()
        jobs = sorted(self.job_records.values(), key=lambda r: r["first_created_at"])
        return {
            "project": c.project,
            "location": c.location,
            "node_locations": c.zones,
            "status": c.status,
            "tpu_type": c.tpu_type,
            "chips": c.chips,
            "chips_committed": self.pools.chips_committed(),
            "reservation": (
                {
                    "name": c.reservation.name,
                    "zone": c.reservation_zone,
                    "count": c.reservation.count,
                    "in_use": self.pools.reservation_in_use(),
                }
                if c.reservation
                else None
            ),
            **pools,
            "jobs": [copy_out(r) for r in jobs],
            "idle_chip_seconds": self.idle_chip_seconds(),
            "kubernetes": {
                "resource_version": self.store.rv,
                "open_watches": self.store.watcher_count,
                "objects": {p: self.store.count(p) for p in ("jobs", "pods", "nodes", "services", "events")},
            },
            "faults": self.faults.model_dump(),
            "fault_counts": dict(self.fault_counts),
            **self.disruptions.stats(),
            "timings": self.timings.model_dump(),
        }
