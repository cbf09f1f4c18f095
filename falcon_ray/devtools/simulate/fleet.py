"""The simulated fleet in virtual time, behind in-process clients.

Contract
--------
``VirtualFleet(config, scheduler)`` builds one ``falcon_ray.sim.cluster.SimCluster`` per
fleet entry on the run's scheduler and clock: the same model the HTTP simulator serves
(node-pool creation and deletion times, node registration, the flex-start autoscaler
and its visibility lag, reservations and what they have in use, stockouts, quota,
``create_error``, API faults, Job and pod lifecycles, disruptions), with its timings in
seconds of the fleet file, read as seconds of virtual time.

``fleet.connect`` is a ``actors.cluster.Connect``: it hands a ``ClusterGateway`` the
clients of one connection, each with the methods and results of the real one:

- ``SimGke`` (``falcon_ray.gcp.GkeApi``): ``get_cluster``, ``create_node_pool``,
  ``get_node_pool``, ``list_node_pools``, ``delete_node_pool``, ``get_operation``;
  ``PoolInfo``, ``OperationInfo``, ``ClusterEndpoint`` (a pool's fields read from its
  ``json_view``, kept until its status or status message changes, as nothing else in it
  ever does); failures as ``CloudError``
  through ``falcon_ray.errors.classify``, as the real client maps them. A read or
  delete refused as transient or rate-limited is tried again at once (the real client
  retries it after a back-off, up to ``api_retry_timeout_s``), at most ``RETRIES`` times.
  A read's 503 or 429 is drawn from the cluster's stream of read faults, a create's or
  delete's from the model's own: how often the controller reads (a queue stepped at every
  tick or only when it can act) does not change which of its creates and deletes fail.
- ``SimCompute`` (``ComputeApi.reservation``) and ``SimResourcePolicies``
  (``ResourcePolicyApi.get``).
- ``SimKube``: ``falcon_ray.kube.KubeApi`` itself, every method of it, with its
  transport (``_json``, ``_borrowed_json``) answered by the cluster's object store and
  admission rules instead of HTTP. ``_json``'s body is a copy that shares nothing with the
  store; ``_borrowed_json``'s holds the store's own objects, uncopied: its callers only read
  it, and a stored object is never changed in place (a write replaces it), so what they
  read is what a copy would have shown.
- ``SimJobWatcher`` (``falcon_ray.kube.JobWatcher``'s surface: ``step``, ``close``,
  ``reconnects``, ``relists``, ``last_event_at``, ``last_ok_at``): a list, then every
  Job event of the namespace and selector as the cluster's store emits it (no event is
  lost, as after a resumed watch), and a re-list every ``resync_seconds``. It calls
  ``on_events`` when an event is waiting, so the driver wakes the watch loop.

Not modelled here: authentication and token expiry, the TCP proxy, watch streams cut by
``watch_drop_every`` (the real watcher resumes from its resourceVersion, so nothing is
lost), 410 after ``compact_history``.
"""

from __future__ import annotations

import functools
import json
import random
from collections.abc import Callable, Mapping
from typing import Any

from google.api_core import exceptions as gexc
from google.rpc import status_pb2
from kubernetes.client.exceptions import ApiException

from falcon_ray.errors import CloudError, classify
from falcon_ray.gcp import ClusterEndpoint, OperationInfo, PoolInfo, ReservationInfo
from falcon_ray.kube import JobObservation, KubeApi
from falcon_ray.model import ErrorKind
from falcon_ray.sim import kube_admission as admission
from falcon_ray.sim.cluster import SimCluster
from falcon_ray.sim.errors import GoogleError, KubeError
from falcon_ray.sim.fleet import FleetConfig
from falcon_ray.sim.kube_store import RESOURCES, WatchEvent, clone, copy_out
from falcon_ray.sim.node_pools import NODEPOOL_LABEL, NodePool
from falcon_ray.sim.selectors import parse_label_selector

from .schedule import Scheduler

RETRIES = 8
DISRUPTION_TICK_S = 60.0  # virtual seconds between the random disruption draws
_SERVER_METADATA = ("uid", "resourceVersion", "creationTimestamp", "generation", "deletionTimestamp", "managedFields")


def _google(e: GoogleError) -> CloudError:
    return classify(gexc.from_http_status(e.code, e.message))


def _kube(e: KubeError) -> CloudError:
    exc = ApiException(status=e.code, reason=e.reason)
    exc.body = json.dumps(e.status())
    return classify(exc)


class ClusterTimers:
    """One cluster's loop on the run's scheduler: after each of its timers, ``on_change(name,
    pools, capacity)`` when what a ClusterActor can observe of the cluster changed: ``pools``
    the pools whose status or nodes changed, ``capacity`` whether what the reservation has in
    use changed."""

    def __init__(self, name: str, scheduler: Scheduler, on_change: Callable[[str, set[str], bool], None]) -> None:
        self.name = name
        self.scheduler = scheduler
        self.on_change = on_change
        self.cluster: SimCluster | None = None
        self.node_pools: set[str] = set()  # pools of the nodes changed by the timer running now

    def call_later(self, delay: float, fn: Callable[..., None], *args: Any) -> None:
        self.scheduler.call_later(delay, self._fire, fn, args)

    def call_soon(self, fn: Callable[..., None], *args: Any) -> None:
        self.scheduler.call_soon(self._fire, fn, args)

    def _state(self) -> tuple[dict[str, tuple[str, str]], int]:
        c = self.cluster
        assert c is not None
        return {n: (p.status, p.status_message) for n, p in c.pools.pools.items()}, c.pools.reservation_in_use()

    def _fire(self, fn: Callable[..., None], args: tuple[Any, ...]) -> None:
        (pools, in_use) = self._state()
        self.node_pools = set()
        fn(*args)
        (after, in_use_after) = self._state()
        changed = {n for n in pools.keys() | after.keys() if pools.get(n) != after.get(n)} | self.node_pools
        if changed or in_use != in_use_after:
            self.on_change(self.name, changed, in_use != in_use_after)

    def on_store_event(self, ev: WatchEvent) -> None:
        if ev.plural == "nodes":
            labels = (ev.obj.get("metadata") or {}).get("labels") or {}
            self.node_pools.add(labels.get(NODEPOOL_LABEL, ""))


class VirtualFleet:
    def __init__(
        self, config: FleetConfig, scheduler: Scheduler, on_change: Callable[[str, set[str], bool], None] = lambda *_: None
    ) -> None:
        self.config = config
        self.scheduler = scheduler
        self.clusters: dict[str, SimCluster] = {}
        for index, cfg in enumerate(config.clusters):
            timers = ClusterTimers(cfg.name, scheduler, on_change)
            c = SimCluster(cfg, index, config.seed, timers, scheduler.clock)
            timers.cluster = c
            c.store.add_listener(timers.on_store_event)
            c.kube_url = f"http://kubernetes.{cfg.name}.sim"
            c.disruptions.tick_s = DISRUPTION_TICK_S
            self.clusters[cfg.name] = c
        self.calls: dict[str, int] = {}
        self.read_rngs: dict[str, random.Random] = {}
        # (cluster, pool) -> (the pool, its status and message then, its json_view(c, False))
        self._views: dict[tuple[str, str], tuple[NodePool, str, str, dict[str, Any]]] = {}

    def pool_view(self, c: SimCluster, pool: NodePool) -> dict[str, Any]:
        """``pool.json_view(c, False)``, made again only when the pool's status or status message
        changed: nothing else it shows ever changes (its request, name, zones, machine type,
        creation time). Read only, as the view is."""
        key = (c.config.name, pool.name)
        hit = self._views.get(key)
        if hit is not None and hit[0] is pool and hit[1] == pool.status and hit[2] == pool.status_message:
            return hit[3]
        view = pool.json_view(c, False)
        self._views[key] = (pool, pool.status, pool.status_message, view)
        return view

    def count(self, api: str) -> None:
        self.calls[api] = self.calls.get(api, 0) + 1

    def read_fault(self, c: SimCluster) -> None:
        """``inject_api_fault`` for a read, drawn from the cluster's own stream of read faults:
        how often the controller reads does not shift the draws of its creates and deletes."""
        rng = self.read_rngs.get(c.config.name)
        if rng is None:
            rng = self.read_rngs[c.config.name] = random.Random(f"{self.config.seed}:{c.config.name}:read-faults")
        kept, c.fault_rng = c.fault_rng, rng
        try:
            c.inject_api_fault()
        finally:
            c.fault_rng = kept

    def connect(self, cluster, settings, user_agent: str, stage: Callable[[str], None]):
        """An ``actors.cluster.Connect``: the in-process clients of one cluster."""
        from actors.cluster import Adapters

        stage("reading the cluster from the simulated fleet")
        gke = SimGke(self)
        ep = gke.get_cluster(cluster.project, cluster.location, cluster.name)
        sim = self.clusters[cluster.name]
        kube = SimKube(self, sim)
        return Adapters(
            gke=gke,
            kube=kube,
            locations=ep.locations,
            compute=lambda: SimCompute(self),
            resource_policies=lambda: SimResourcePolicies(self),
            job_watcher=lambda namespace, **kw: SimJobWatcher(kube, sim, namespace, **kw),
        )


class SimGke:
    """``GkeApi`` over the fleet model (see the module's contract)."""

    def __init__(self, fleet: VirtualFleet) -> None:
        self.fleet = fleet

    def _cluster(self, project: str, location: str, name: str) -> SimCluster:
        c = self.fleet.clusters.get(name)
        if c is None or c.config.project != project or c.config.location != location:
            raise CloudError(ErrorKind.NOT_FOUND, f"Not found: projects/{project}/locations/{location}/clusters/{name}.", 404)
        return c

    def _call(self, c: SimCluster, fn: Callable[[], Any], retry: bool = True, read: bool = True) -> Any:
        self.fleet.count("gke")
        for attempt in range(RETRIES):
            try:
                if read:
                    self.fleet.read_fault(c)
                else:
                    c.inject_api_fault()
                return fn()
            except GoogleError as e:
                err = _google(e)
                if not retry or err.kind not in (ErrorKind.TRANSIENT, ErrorKind.TOO_MANY_OPERATIONS) or attempt == RETRIES - 1:
                    raise err from None
        raise AssertionError("unreachable")

    def get_cluster(self, project: str, location: str, name: str) -> ClusterEndpoint:
        c = self._cluster(project, location, name)
        body = self._call(c, lambda: c.cluster_json("", False))
        return ClusterEndpoint(body["endpoint"], None, tuple(body.get("locations") or ()))

    def create_node_pool(self, project: str, location: str, cluster: str, pool: Mapping[str, Any]) -> str:
        c = self._cluster(project, location, cluster)
        body = {"nodePool": clone(dict(pool))}
        # the real client retries a create only when it was refused for rate (429)
        for attempt in range(RETRIES):
            try:
                self.fleet.count("gke")
                c.inject_api_fault()
                return c.pools.create(body).name
            except GoogleError as e:
                err = _google(e)
                if err.kind != ErrorKind.TOO_MANY_OPERATIONS or attempt == RETRIES - 1:
                    raise err from None
        raise AssertionError("unreachable")

    def get_node_pool(self, project: str, location: str, cluster: str, name: str) -> PoolInfo | None:
        c = self._cluster(project, location, cluster)
        try:
            return _pool_info(self._call(c, lambda: self.fleet.pool_view(c, c.pools.get(name))))
        except CloudError as e:
            if e.kind == ErrorKind.NOT_FOUND:
                return None
            raise

    def list_node_pools(self, project: str, location: str, cluster: str) -> list[PoolInfo]:
        c = self._cluster(project, location, cluster)
        return [_pool_info(p) for p in self._call(c, lambda: [self.fleet.pool_view(c, p) for p in c.pools.visible()])]

    def delete_node_pool(self, project: str, location: str, cluster: str, name: str) -> str | None:
        c = self._cluster(project, location, cluster)
        try:
            return self._call(c, lambda: c.pools.delete(name).name, read=False)
        except CloudError as e:
            if e.kind == ErrorKind.NOT_FOUND:
                return None
            raise

    def get_operation(self, project: str, location: str, operation: str) -> OperationInfo:
        name = operation.rsplit("/", 1)[-1]
        owner = next(
            (c for c in self.fleet.clusters.values() if c.config.project == project and c.config.location == location and name in c.pools.operations),
            None,
        )
        if owner is None:
            raise CloudError(ErrorKind.NOT_FOUND, f"Not found: operation {name} in projects/{project}/locations/{location}.", 404)
        # the fields of the operation's to_json(False) that OperationInfo holds, read from it directly
        op = self._call(owner, lambda: owner.pools.operations[name])
        done = op.status == "DONE"
        error: CloudError | None = None
        if done and op.error:
            e = op.error
            error = classify(status_pb2.Status(code=int(e.get("code") or 0), message=str(e.get("message") or "")))
        return OperationInfo(
            name=op.name,
            status=op.status,
            done=done,
            error=error,
            target=op.target_link,
            operation_type=op.op_type,
            detail="",  # to_json has no detail
        )

    def close(self) -> None:
        pass


def _pool_info(p: dict[str, Any]) -> PoolInfo:
    """``PoolInfo`` of a pool's ``NodePool.json_view``: its fields are read now, into values
    that share nothing with the pool; ``raw`` copies the view at its first read."""
    config = p.get("config") or {}
    autoscaling = p.get("autoscaling") or {}
    return PoolInfo(
        name=p["name"],
        status=p["status"],
        status_message=p.get("statusMessage", ""),
        initial_node_count=int(p.get("initialNodeCount") or 0),
        max_node_count=int(autoscaling.get("totalMaxNodeCount") or autoscaling.get("maxNodeCount") or 0),
        machine_type=config.get("machineType", ""),
        labels=dict(config.get("labels") or {}),
        resource_labels=dict(config.get("resourceLabels") or {}),
        locations=tuple(p.get("locations") or ()),
        raw=_CopiedOnRead(p),
    )


class _CopiedOnRead(Mapping[str, Any]):
    """A read-only view's ``copy_out``, made when first read (the controller never reads a
    ``PoolInfo.raw``). The view's nested values must never change, as a pool's ``request``'s."""

    __slots__ = ("_view", "_copy")

    def __init__(self, view: dict[str, Any]) -> None:
        self._view: dict[str, Any] | None = view
        self._copy: dict[str, Any] | None = None

    def _body(self) -> dict[str, Any]:
        if self._copy is None:
            self._copy, self._view = copy_out(self._view), None
        return self._copy

    def __getitem__(self, key: str) -> Any:
        return self._body()[key]

    def __iter__(self):
        return iter(self._body())

    def __len__(self) -> int:
        return len(self._body())

    def __repr__(self) -> str:
        return repr(self._body())


class SimCompute:
    """``ComputeApi.reservation`` over the fleet model."""

    def __init__(self, fleet: VirtualFleet) -> None:
        self.fleet = fleet

    def reservation(self, project: str, zone: str, name: str) -> ReservationInfo:
        self.fleet.count("compute")
        owners = [
            c
            for c in self.fleet.clusters.values()
            if c.config.reservation is not None
            and c.config.reservation_project == project
            and c.config.reservation_zone == zone
            and c.config.reservation.name == name
        ]
        if not owners:
            raise CloudError(ErrorKind.NOT_FOUND, f"The resource 'projects/{project}/zones/{zone}/reservations/{name}' was not found", 404)
        for attempt in range(RETRIES):
            try:
                self.fleet.read_fault(owners[0])
                break
            except GoogleError as e:
                if attempt == RETRIES - 1:
                    raise _google(e) from None
        body = owners[0].reservation_json()
        specific = body["specificReservation"]
        return ReservationInfo(
            name=body["name"],
            count=int(specific["count"]),
            in_use=int(specific["inUseCount"]),
            status=body["status"],
            machine_type=specific["instanceProperties"]["machineType"] or "",
        )

    def close(self) -> None:
        pass


class SimResourcePolicies:
    """``ResourcePolicyApi.get`` over the fleet model."""

    def __init__(self, fleet: VirtualFleet) -> None:
        self.fleet = fleet

    def get(self, project: str, region: str, name: str) -> dict[str, Any] | None:
        self.fleet.count("compute")
        for c in self.fleet.clusters.values():
            if c.config.project == project and c.region == region and c.workload_policy(name) is not None:
                return c.resource_policy_json(name)
        return None

    def close(self) -> None:
        pass


class _Verb:
    """A Kubernetes client method, named: ``SimKube._json`` answers it."""

    def __init__(self, name: str) -> None:
        self.name = name


class _Verbs:
    def __getattr__(self, name: str) -> _Verb:
        return _Verb(name)


class SimKube(KubeApi):
    """``KubeApi`` whose transport is the cluster's object store (see the module's contract)."""

    def __init__(self, fleet: VirtualFleet, cluster: SimCluster) -> None:  # no HTTP client
        self.fleet = fleet
        self.cluster = cluster
        self.batch = _Verbs()
        self.core = _Verbs()
        self._service_ips = 0

    @property
    def token_hook(self):
        return None

    def refresh_credentials(self) -> None:
        pass

    def _json(self, call: Any, *args: Any, **kwargs: Any) -> dict[str, Any]:
        return copy_out(self._answer(call, args, kwargs))

    def _borrowed_json(self, call: Any, *args: Any, **kwargs: Any) -> dict[str, Any]:
        return self._answer(call, args, kwargs)

    def _answer(self, call: _Verb, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
        """The body of one API call, made of the store's own objects (the caller copies it)."""
        self.fleet.count("kubernetes")
        try:
            return getattr(self, "_" + call.name)(*args, **kwargs)
        except KubeError as e:
            raise _kube(e) from None

    # ---- the API calls KubeApi makes: bodies of the store's own objects, uncopied ------------------

    def _list(self, plural: str, namespace: str | None, label_selector: str | None = None) -> dict[str, Any]:
        selector = _selector(label_selector)
        store = self.cluster.store
        items = [o for o in store.list(plural, namespace) if selector.matches(o["metadata"].get("labels"))]
        return {"metadata": {"resourceVersion": str(store.rv)}, "items": items}

    def _create(self, plural: str, namespace: str, manifest: Mapping[str, Any]) -> dict[str, Any]:
        rk = RESOURCES[plural]
        body = clone(dict(manifest))
        received = copy_out(body) if plural == "jobs" else {}  # a Job as received, for its record
        md = body.setdefault("metadata", {})
        md["namespace"] = namespace
        for key in _SERVER_METADATA:
            md.pop(key, None)
        admission.validate_metadata(rk, md)
        name = admission.validate_name(rk, md.get("name"))
        c = self.cluster
        uid = c.store.new_uid()
        if plural == "jobs":
            if c.faults.webhook_unavailable:
                c.fault_counts["webhook_unavailable"] += 1
                admission.webhook_unreachable(rk, name)
            admission.default_job(body, name, uid)
            admission.deny_images(rk, name, body["spec"]["template"]["spec"], c.faults.deny_images)
        elif plural == "services":
            admission.default_service(body, self._next_service_ip)
        admission.validate_status(rk, body)
        obj = c.store.create(plural, body, uid=uid)
        if plural == "jobs":
            c.record_job_create(obj, received)
        return obj

    def _next_service_ip(self) -> str:
        self._service_ips += 1
        return f"10.96.{self._service_ips // 250}.{self._service_ips % 250 + 1}"

    def _get(self, plural: str, namespace: str, name: str) -> dict[str, Any]:
        obj = self.cluster.store.get(plural, namespace, name)
        if obj is None:
            raise admission.not_found(RESOURCES[plural], name)
        return obj

    def _create_namespaced_job(self, namespace: str, body: Mapping[str, Any], **_: Any) -> dict[str, Any]:
        return self._create("jobs", namespace, body)

    def _read_namespaced_job(self, name: str, namespace: str, **_: Any) -> dict[str, Any]:
        return self._get("jobs", namespace, name)

    def _delete_namespaced_job(self, name: str, namespace: str, propagation_policy: str = "Background", **_: Any) -> dict[str, Any]:
        self._get("jobs", namespace, name)
        deleted = self.cluster.workloads.delete_job(namespace, name, propagation_policy or "Background")
        return deleted if deleted is not None else {"kind": "Status", "status": "Success"}

    def _list_namespaced_job(self, namespace: str, label_selector: str | None = None, **_: Any) -> dict[str, Any]:
        return self._list("jobs", namespace, label_selector)

    def _create_namespaced_service(self, namespace: str, body: Mapping[str, Any], **_: Any) -> dict[str, Any]:
        return self._create("services", namespace, body)

    def _delete_namespaced_service(self, name: str, namespace: str, **_: Any) -> dict[str, Any]:
        self._get("services", namespace, name)
        return self.cluster.store.delete("services", namespace, name) or {}

    def _list_namespaced_pod(self, namespace: str, label_selector: str | None = None, **_: Any) -> dict[str, Any]:
        return self._list("pods", namespace, label_selector)

    def _list_node(self, label_selector: str | None = None, **_: Any) -> dict[str, Any]:
        return self._list("nodes", None, label_selector)


@functools.lru_cache(maxsize=256)
def _selector(text: str | None):
    """``parse_label_selector``, once per text (a ``LabelSelector`` is frozen; a text it
    refuses raises every time)."""
    return parse_label_selector(text)


class SimJobWatcher:
    """``JobWatcher``'s surface over the cluster's store (see the module's contract)."""

    def __init__(
        self,
        kube: SimKube,
        cluster: SimCluster,
        namespace: str,
        label_selector: str = "",
        timeout_seconds: int = 300,
        *,
        clock: Any,
        resync_seconds: float | None = 900.0,
        **_: Any,
    ) -> None:
        self.kube = kube
        self.cluster = cluster
        self.namespace = namespace
        self.label_selector = label_selector
        self.selector = parse_label_selector(label_selector or None)
        self.clock = clock
        self.resync_seconds = resync_seconds
        self.lists = self.relists = self.reconnects = self.events = 0
        self.last_event_at: float | None = None
        self.last_ok_at: float | None = None
        self.resource_version: str | None = None
        self.listed_at = clock.monotonic()
        self.pending: list[WatchEvent] = []
        self.on_events: Callable[[], None] | None = None  # set by the driver: wake the watch loop
        self._closed = False
        cluster.store.add_listener(self._on_store_event)

    def _on_store_event(self, ev: WatchEvent) -> None:
        if self._closed or self.resource_version is None or ev.plural != "jobs":
            return
        md = ev.obj.get("metadata") or {}
        if md.get("namespace") != self.namespace or not self.selector.matches(md.get("labels")):
            return
        self.pending.append(ev)
        if len(self.pending) == 1 and self.on_events is not None:
            self.on_events()

    def resync_due_at(self) -> float | None:
        """Monotonic time of the next periodic re-list."""
        return None if self.resync_seconds is None else self.listed_at + self.resync_seconds

    def step(self, on_event, on_resync=None, stopping: Callable[[], bool] = lambda: False) -> float:
        due = self.resync_due_at()
        if self.resource_version is None or (due is not None and self.clock.monotonic() > due):
            self.pending.clear()
            observations, rv = self.kube.list_jobs(self.namespace, self.label_selector)
            self.lists += 1
            self.relists += self.lists > 1
            self.resource_version = rv or "0"
            self.listed_at = self.clock.monotonic()
            self.last_ok_at = self.clock.time()
            for obs in observations:
                on_event(obs)
            if on_resync is not None:
                on_resync(observations)
            return 0.0
        events, self.pending = self.pending, []
        for ev in events:
            self.resource_version = str(ev.rv)
            self.events += 1
            self.last_event_at = self.clock.time()
            on_event(JobObservation.from_job(ev.obj, deleted=ev.type == "DELETED"))
        self.last_ok_at = self.clock.time()
        return 0.0

    def close(self) -> None:
        self._closed = True

    def stats(self) -> dict[str, Any]:
        return {"lists": self.lists, "relists": self.relists, "reconnects": self.reconnects, "events": self.events}
