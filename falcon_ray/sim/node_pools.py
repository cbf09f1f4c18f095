"""Node pools and their long-running operations on one simulated GKE cluster.

Contract
--------
:class:`NodePools` is the GKE side of a :class:`~falcon_ray.sim.cluster.SimCluster`:

* ``create(request)`` validates a NodePool body as GKE would (400
  INVALID_ARGUMENT for a bad name or an inconsistent TPU size, 409
  ALREADY_EXISTS for a taken name, 400 FAILED_PRECONDITION "Cluster is running
  incompatible operation ..." while an operation of the same pool runs, or any other
  while the cluster takes one at a time (``pool_ops_at_once`` 1), 429
  RESOURCE_EXHAUSTED "Too many operations ..." while ``pool_ops_at_once`` run) and returns a
  RUNNING :class:`Operation`. ``timings.node_pool_create`` later the operation
  is DONE and the pool RUNNING, or - when the cluster is out of chips, a
  stockout of the pool's supply is on (it asks for hosts), the reservation is
  short, or the ``create_error`` fault is set - the operation
  is DONE with ``error`` and the pool stays in status ERROR (this is how GKE
  reports quota and stockouts found mid-create; the pool must be deleted).
* Every duration is drawn per event (``SimCluster.draw``): per create, per
  delete, per registration of the nodes a create or a scale-up asked for.
* ``timings.node_register`` after RUNNING, one v1 Node per host of
  ``initialNodeCount`` (per zone, as GKE counts it) appears in the cluster's
  Kubernetes store, labelled with its zone. Pools created with 0 nodes get
  nodes only from the cluster autoscaler
  (:mod:`~falcon_ray.sim.autoscaler`), which calls :meth:`NodePools.add_hosts`
  and :meth:`NodePools.remove_nodes`.
* Zones: a pool's ``locations`` default to the cluster's node locations and
  must be zones of the cluster's region; a TPU pool must name exactly one zone
  of the cluster's node locations (else 400 INVALID_ARGUMENT).
* Autoscaling (``autoscaling.enabled``): ``totalMin/MaxNodeCount``, or
  ``min/maxNodeCount`` per zone; a multi-host TPU pool (its topology spans
  more than one host) must have a max of exactly its slice's hosts and grows
  and shrinks by whole slices.
* ``delete(name)`` moves the pool to STOPPING and returns a RUNNING operation;
  ``timings.node_pool_delete`` later nodes, the pods on them and the pool are gone.
* Flex-start pools are hidden from ``get``/``visible`` for
  ``timings.flex_visibility_lag`` after the create call returned.
* Run limit (``config.maxRunDuration``, ``"604800s"``; a flex-start pool without one
  gets seven days, GKE's default and maximum): that long after a node registered its VM
  is deleted, a ``reclaim`` of :mod:`~falcon_ray.sim.disruptions` (trigger
  ``maxRunDuration``), and a flex-start pool gets new nodes only for pending pods.
* ``config.consolidationDelay`` (``"600s"``; 400 INVALID_ARGUMENT when it is not a
  duration in seconds) is kept as ``NodePool.consolidation_delay`` for the autoscaler.
* Capacity: reservation pools (SPECIFIC_RESERVATION affinity) count their hosts
  against the reservation from the create call (or the autoscaler's scale-up)
  until their deletion (or scale-down) finishes; all other TPU pools count
  chips against the cluster's ``chips`` the same way. Failed (ERROR) pools hold
  nothing. While a stockout of a pool's supply is on, no host of it is free. A reservation pool must be in the reservation's zone, of its machine
  type, and fit its free hosts, else its create ends with an operation error.
* ``max_concurrent_pool_ops`` records the most pool operations that were
  running or attempted at the same moment: a create/delete refused because
  others run counts as one more than ran, so it stays at most the cluster's
  ``pool_ops_at_once`` only if the caller keeps within it; ``rejected_pool_ops`` counts
  those refusals.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from .errors import GoogleError
from .fleet import POOL_OPS_AT_ONCE, is_zone, region_of
from .kube_store import clone, copy_out
from .machines import TpuFamily, chips_per_host, default_topology, tpu_family

if TYPE_CHECKING:
    from .cluster import SimCluster

NODEPOOL_LABEL = "cloud.google.com/gke-nodepool"
ACCELERATOR_LABEL = "cloud.google.com/gke-tpu-accelerator"
TOPOLOGY_LABEL = "cloud.google.com/gke-tpu-topology"
TPU_RESOURCE = "google.com/tpu"
RESERVATION_KEY = "compute.googleapis.com/reservation-name"
GKE_VERSION = "1.33.5-gke.1080000"
FLEX_START_MAX_RUN_S = 7 * 24 * 3600.0  # NodeConfig.maxRunDuration: flex-start's default and maximum

_POOL_NAME = re.compile(r"^[a-z]([-a-z0-9]{0,38}[a-z0-9])?$")

# proto enum numbers (google.container.v1); the client sends and accepts either form
POOL_STATUS = {
    "PROVISIONING": 1,
    "RUNNING": 2,
    "RUNNING_WITH_ERROR": 3,
    "RECONCILING": 4,
    "STOPPING": 5,
    "ERROR": 6,
}
OP_STATUS = {"PENDING": 1, "RUNNING": 2, "DONE": 3, "ABORTING": 4}
OP_TYPE = {"CREATE_NODE_POOL": 7, "DELETE_NODE_POOL": 8}
RESERVATION_TYPE = {
    0: "UNSPECIFIED",
    1: "NO_RESERVATION",
    2: "ANY_RESERVATION",
    3: "SPECIFIC_RESERVATION",
    4: "ANY_RESERVATION_THEN_FAIL",
}
TAINT_EFFECT = {1: "NoSchedule", 2: "PreferNoSchedule", 3: "NoExecute"}
TAINT_EFFECT_NAMES = {
    "NO_SCHEDULE": "NoSchedule",
    "PREFER_NO_SCHEDULE": "PreferNoSchedule",
    "NO_EXECUTE": "NoExecute",
}

# google.rpc.Code values used in operation errors
CODE_NOT_FOUND = 5
CODE_RESOURCE_EXHAUSTED = 8
CODE_FAILED_PRECONDITION = 9


def enum_name(value: Any, numbers: dict[int, str]) -> str:
    """An enum given as int or name, as its name ('' when unset or unknown)."""
    if isinstance(value, bool):
        return ""
    if isinstance(value, int):
        return numbers.get(value, "")
    if isinstance(value, str):
        return value
    return ""


@functools.lru_cache(maxsize=4096)
def google_time(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _expect(obj: Any, where: str, fields: dict[str, type]) -> None:
    """400 INVALID_ARGUMENT when ``obj`` or one of its fields has the wrong JSON type."""
    names = {dict: "an object", list: "a list", str: "a string", bool: "a boolean"}
    if not isinstance(obj, dict):
        raise GoogleError(400, f"Invalid value at '{where}': must be an object.")
    for key, expected in fields.items():
        value = obj.get(key)
        if value is not None and not isinstance(value, expected):
            raise GoogleError(
                400, f"Invalid value at '{where}.{key}': must be {names.get(expected, expected)}."
            )


def _int_field(value: Any, where: str) -> int:
    if value is None:
        return 0
    try:
        out = int(value)
    except (TypeError, ValueError):
        raise GoogleError(400, f"Invalid value at '{where}': {value!r} is not an integer") from None
    if out < 0:
        raise GoogleError(400, f"Invalid value at '{where}': must not be negative")
    return out


def _check_config(config: dict[str, Any]) -> None:
    """400 INVALID_ARGUMENT for a ``config`` whose fields the sim reads have the wrong types."""
    _expect(
        config,
        "node_pool.config",
        {
            "machineType": str,
            "labels": dict,
            "reservationAffinity": dict,
            "taints": list,
            "flexStart": bool,
            "maxRunDuration": str,
            "consolidationDelay": str,
        },
    )
    if not all(isinstance(v, str) for v in (config.get("labels") or {}).values()):
        raise GoogleError(400, "Invalid value at 'node_pool.config.labels': values must be strings.")
    for i, taint in enumerate(config.get("taints") or []):
        _expect(taint, f"node_pool.config.taints[{i}]", {"key": str, "value": str})


_SECONDS = re.compile(r"^\d+(\.\d+)?s$")  # a google.protobuf.Duration in JSON: "600s", "1.5s"


def _consolidation_delay(config: dict[str, Any]) -> float | None:
    """``config.consolidationDelay`` in seconds (None when not sent); 400 when it is not a duration."""
    text = config.get("consolidationDelay")
    if text is None:
        return None
    if not _SECONDS.match(text):
        raise GoogleError(
            400,
            f"Invalid value at 'node_pool.config.consolidation_delay' ({text!r}): must be a duration in seconds.",
        )
    return float(text[:-1])


def _reservation_name(config: dict[str, Any]) -> str | None:
    """The reservation a SPECIFIC_RESERVATION affinity names (None for any other affinity)."""
    affinity = config.get("reservationAffinity") or {}
    _expect(affinity, "node_pool.config.reservation_affinity", {"key": str, "values": list})
    if enum_name(affinity.get("consumeReservationType"), RESERVATION_TYPE) != "SPECIFIC_RESERVATION":
        return None
    values = affinity.get("values") or []
    if affinity.get("key") != RESERVATION_KEY or len(values) != 1 or not isinstance(values[0], str):
        raise GoogleError(
            400,
            "Invalid reservation affinity: SPECIFIC_RESERVATION needs "
            f"key '{RESERVATION_KEY}' and exactly one reservation name in 'values'.",
        )
    return _reservation_ref(values[0])[1]


_SHARED_RESERVATION = re.compile(r"^projects/([^/]+)/reservations/([^/]+)$")


def _reservation_ref(value: str) -> tuple[str | None, str]:
    """(owner project or None for the pool's own, name) of an affinity value: a bare name (a
    reservation of the cluster's project) or ``projects/P/reservations/NAME`` (one shared
    from P), the two forms Compute's ReservationAffinity documents; else 400."""
    m = _SHARED_RESERVATION.match(value)
    if m:
        return m.group(1), m.group(2)
    if "/" in value or not value:
        raise GoogleError(
            400,
            f"Invalid reservation affinity value {value!r}: give a reservation name of the cluster's project "
            "or projects/PROJECT/reservations/NAME for a reservation shared from another project.",
        )
    return None, value


def _autoscaling(spec: dict[str, Any], zone_count: int) -> AutoscalingRange | None:
    """An enabled ``autoscaling`` as totals: ``totalMin/MaxNodeCount``, or ``min/maxNodeCount`` per zone."""
    _expect(spec, "node_pool.autoscaling", {"enabled": bool})
    if not spec.get("enabled"):
        return None
    where = "node_pool.autoscaling."
    totals = [_int_field(spec.get(k), where + k) for k in ("totalMinNodeCount", "totalMaxNodeCount")]
    per_zone = [_int_field(spec.get(k), where + k) for k in ("minNodeCount", "maxNodeCount")]
    if any(totals) and any(per_zone):
        raise GoogleError(
            400,
            "Invalid autoscaling: total_min/max_node_count and min/max_node_count are mutually exclusive.",
        )
    low, high = totals if any(totals) else [n * zone_count for n in per_zone]
    if high < 1 or high < low:
        raise GoogleError(
            400,
            f"Invalid autoscaling: the max node count ({high}) must be at least 1 and at least the min "
            f"node count ({low}).",
        )
    return AutoscalingRange(low, high)


def _tpu_slice(
    request: dict[str, Any],
    config: dict[str, Any],
    family: TpuFamily,
    machine_type: str,
    per_host: int,
    size: int,
) -> tuple[str, int]:
    """(topology, hosts of one slice) of a TPU pool; 400 when ``size`` does not match the topology."""
    placement = request.get("placementPolicy") or {}
    _expect(placement, "node_pool.placement_policy", {"tpuTopology": str, "policyName": str})
    topology = placement.get("tpuTopology") or (config.get("labels") or {}).get(TOPOLOGY_LABEL)
    if not topology:
        return default_topology(family, size * per_host or per_host), 1
    try:
        topo_chips = 1
        for side in topology.split("x"):
            topo_chips *= int(side)
    except ValueError:
        raise GoogleError(400, f"Invalid TPU topology {topology!r}.") from None
    expected_hosts = max(1, topo_chips // per_host) if per_host else 0
    if size != expected_hosts:
        raise GoogleError(
            400,
            f"Invalid node pool size: TPU topology {topology} with machine type {machine_type} "
            f"needs {expected_hosts} node(s), but the request has {size}.",
        )
    return topology, max(1, expected_hosts)


@dataclass
class Operation:
    name: str
    op_type: str  # CREATE_NODE_POOL | DELETE_NODE_POOL
    pool: str
    cluster: SimCluster
    started_at: float  # wall clock
    status: str = "RUNNING"
    ended_at: float | None = None
    error: dict[str, Any] | None = None

    @property
    def target_link(self) -> str:
        """The operation's ``targetLink``: its node pool's URL."""
        c = self.cluster.config
        base = f"projects/{c.project}/locations/{c.location}"
        return f"https://container.googleapis.com/v1/{base}/clusters/{c.name}/nodePools/{self.pool}"

    def to_json(self, enums_as_int: bool) -> dict[str, Any]:
        c = self.cluster.config
        base = f"projects/{c.project}/locations/{c.location}"
        body: dict[str, Any] = {
            "name": self.name,
            "zone": c.location,
            "location": c.location,
            "operationType": OP_TYPE[self.op_type] if enums_as_int else self.op_type,
            "status": OP_STATUS[self.status] if enums_as_int else self.status,
            "selfLink": f"https://container.googleapis.com/v1/{base}/operations/{self.name}",
            "targetLink": self.target_link,
            "startTime": google_time(self.started_at),
        }
        if self.ended_at is not None:
            body["endTime"] = google_time(self.ended_at)
        if self.error is not None:
            body["error"] = dict(self.error)
            body["statusMessage"] = self.error["message"]
        return body

    def stats(self) -> dict[str, Any]:
        return {
            "operation": self.name,
            "type": self.op_type,
            "pool": self.pool,
            "status": self.status,
            "started_at": self.started_at,
            "ended_at": self.ended_at,
            "error": dict(self.error) if self.error else None,
        }


@dataclass(frozen=True)
class AutoscalingRange:
    """``autoscaling`` of an enabled pool, as totals over its zones."""

    min_nodes: int
    max_nodes: int


@dataclass
class NodePool:
    name: str
    request: dict[str, Any]  # the NodePool JSON exactly as received
    supply: str  # reservation | flex-start | spot | on-demand
    machine_type: str
    family: TpuFamily | None
    hosts: int  # hosts held now: registered nodes plus those still provisioning
    chips_per_host: int
    topology: str | None
    reservation: str | None
    created_at: float  # wall clock of the create call
    visible_after: float  # monotonic; get/list answer 404 before this
    zones: list[str] = field(default_factory=list)
    autoscaling: AutoscalingRange | None = None
    consolidation_delay: float | None = None  # config.consolidationDelay in seconds, if sent
    slice_hosts: int = 1  # hosts a scale-up or scale-down moves at once (a multi-host slice: all)
    status: str = "PROVISIONING"
    status_message: str = ""
    ready_at: float | None = None
    delete_requested_at: float | None = None
    deleted_at: float | None = None
    error: dict[str, Any] | None = None
    doomed: dict[str, Any] | None = None  # error decided at create time, reported when the op ends
    node_names: list[str] = field(default_factory=list)
    provisioning: int = 0  # hosts held whose nodes have not registered yet
    first_node_at: float | None = None  # wall clock of the first node's registration
    idle_mark: float | None = None  # monotonic; the pool is idle since then (chip-seconds added up to it)
    idle_chip_seconds: float = 0.0

    @property
    def chips(self) -> int:
        return self.hosts * self.chips_per_host

    @property
    def holds_capacity(self) -> bool:
        return self.deleted_at is None and self.doomed is None and self.status != "ERROR"

    @property
    def billed(self) -> bool:
        """VMs exist: from RUNNING until the deletion has finished."""
        return self.status in ("RUNNING", "STOPPING") and self.deleted_at is None

    @property
    def flex(self) -> bool:
        return self.supply == "flex-start"

    def idle_total(self, now_mono: float) -> float:
        """Idle chip-seconds up to ``now_mono`` (see :meth:`SimCluster.refresh_idle`)."""
        running = (now_mono - self.idle_mark) * self.chips if self.idle_mark is not None else 0.0
        return self.idle_chip_seconds + running

    def to_json(self, cluster: SimCluster, enums_as_int: bool) -> dict[str, Any]:
        """The pool as GKE's NodePool JSON, a copy that shares nothing with the pool."""
        return copy_out(self.json_view(cluster, enums_as_int))

    def json_view(self, cluster: SimCluster, enums_as_int: bool) -> dict[str, Any]:
        """``to_json``'s body uncopied: a new top-level dict and ``config`` whose other values
        are the ``request``'s own (made by clone in ``_describe``, never changed). For a reader
        that changes nothing in it; ``copy_out`` of it, however much later, is what ``to_json``
        answered when it was made."""
        c = cluster.config
        body = dict(self.request)
        if isinstance(body.get("config"), dict):
            body["config"] = dict(body["config"])  # its machineType default is set below
        body["name"] = self.name
        body.setdefault("config", {}).setdefault("machineType", self.machine_type)
        body.setdefault("locations", list(self.zones))
        body["initialNodeCount"] = self.request.get("initialNodeCount", 0)
        body["selfLink"] = (
            f"https://container.googleapis.com/v1/projects/{c.project}/locations/{c.location}"
            f"/clusters/{c.name}/nodePools/{self.name}"
        )
        body["version"] = GKE_VERSION
        body["status"] = POOL_STATUS[self.status] if enums_as_int else self.status
        if self.status_message:
            body["statusMessage"] = self.status_message
        body["instanceGroupUrls"] = [
            f"https://www.googleapis.com/compute/v1/projects/{c.project}/zones/{zone}"
            f"/instanceGroupManagers/gke-{c.name[:20]}-{self.name[:20]}-grp"
            for zone in self.zones
        ]
        body.setdefault("podIpv4CidrSize", 24)
        body["etag"] = f"sim-{int(self.created_at * 1000)}-{self.status.lower()}"
        return body

    def stats(self, now_mono: float) -> dict[str, Any]:
        scaling = self.autoscaling
        return {
            "name": self.name,
            "request": copy_out(self.request),
            "created_at": self.created_at,
            "ready_at": self.ready_at,
            "delete_requested_at": self.delete_requested_at,
            "deleted_at": self.deleted_at,
            "status": "DELETED" if self.deleted_at is not None else self.status,
            "supply": self.supply,
            "machine_type": self.machine_type,
            "hosts": self.hosts,
            "chips": self.chips,
            "topology": self.topology,
            "reservation": self.reservation,
            "error": dict(self.error) if self.error else None,
            "nodes": list(self.node_names),
            "first_node_at": self.first_node_at,
            "zone": self.zones[0] if len(self.zones) == 1 else None,
            "locations": list(self.zones),
            "autoscaling": (
                {"min_nodes": scaling.min_nodes, "max_nodes": scaling.max_nodes} if scaling else None
            ),
            "idle_chip_seconds": round(self.idle_total(now_mono), 3),
        }


class NodePools:
    """All node pools (alive and deleted) and pool operations of one cluster."""

    def __init__(self, cluster: SimCluster):
        self.cluster = cluster
        self.pools: dict[str, NodePool] = {}  # alive pools by name (ERROR pools included)
        self.history: list[NodePool] = []  # every pool ever accepted, for stats
        self.operations: dict[str, Operation] = {}
        self.running_ops: dict[str, Operation] = {}  # by pool
        self.max_concurrent_ops = 0
        self.rejected_ops = 0

    # ---- queries -------------------------------------------------------------------------------
    def visible(self) -> list[NodePool]:
        now = self.cluster.mono()
        return [p for n, p in sorted(self.pools.items()) if now >= p.visible_after]

    def get(self, name: str) -> NodePool:
        pool = self.pools.get(name)
        if pool is None or self.cluster.mono() < pool.visible_after:
            c = self.cluster.config
            raise GoogleError(
                404,
                f"Not found: projects/{c.project}/locations/{c.location}/clusters/{c.name}/nodePools/{name}.",
            )
        return pool

    def autoscaled(self) -> list[NodePool]:
        """RUNNING pools with autoscaling enabled, by name: the ones the cluster autoscaler resizes."""
        return [
            p
            for _, p in sorted(self.pools.items())
            if p.autoscaling is not None and p.status == "RUNNING" and p.deleted_at is None
        ]

    def chips_committed(self) -> int:
        return sum(p.chips for p in self.pools.values() if p.holds_capacity and p.supply != "reservation")

    def reservation_in_use(self) -> int:
        return sum(p.hosts for p in self.pools.values() if p.holds_capacity and p.supply == "reservation")

    # ---- create --------------------------------------------------------------------------------
    def create(self, body: dict[str, Any]) -> Operation:
        request = body.get("nodePool")
        if not isinstance(request, dict):
            raise GoogleError(400, "Invalid request: 'nodePool' must be an object.")
        name = request.get("name")
        if not isinstance(name, str) or not _POOL_NAME.match(name):
            raise GoogleError(
                400,
                f"Invalid node pool name {name!r}: must be 1-40 lower-case letters, digits or dashes, "
                "start with a letter and not end with a dash.",
            )
        pool = self._describe(name, request)
        if name in self.pools:
            c = self.cluster.config
            raise GoogleError(
                409,
                f"Already exists: projects/{c.project}/locations/{c.location}/clusters/{c.name}/nodePools/{name}.",
            )
        self._claim_operation_slot(name)
        pool.doomed = self._capacity_error(pool)
        op = self._start_op("CREATE_NODE_POOL", name)
        self.pools[name] = pool
        self.history.append(pool)
        self.cluster.call_later(self.cluster.draw("node_pool_create"), self._finish_create, pool, op)
        return op

    def _describe(self, name: str, request: dict[str, Any]) -> NodePool:
        """Validate the request and work out supply, zones, size and placement."""
        _expect(
            request,
            "node_pool",
            {"config": dict, "autoscaling": dict, "placementPolicy": dict, "locations": list},
        )
        config = request.get("config") or {}
        _check_config(config)
        machine_type = config.get("machineType") or "e2-medium"
        family = tpu_family(machine_type)
        per_host = chips_per_host(machine_type)
        zones = self._pool_zones(request, family is not None)
        initial = _int_field(request.get("initialNodeCount"), "node_pool.initial_node_count") * len(zones)
        autoscaling = _autoscaling(request.get("autoscaling") or {}, len(zones))
        flex = bool(config.get("flexStart"))
        reservation = _reservation_name(config)
        if reservation and flex:
            raise GoogleError(400, "Flex-start node pools cannot consume a specific reservation.")
        spot = bool(config.get("spot") or config.get("preemptible"))
        supply = "reservation" if reservation else "flex-start" if flex else "spot" if spot else "on-demand"

        size = initial or (autoscaling.max_nodes if autoscaling else 0)
        topology, slice_hosts = None, 1
        if family is not None:
            placed = self._placed_by_policy(request)
            topology, slice_hosts = _tpu_slice(placed, config, family, machine_type, per_host, size)
        if slice_hosts > 1 and autoscaling and autoscaling.max_nodes != slice_hosts:
            raise GoogleError(
                400,
                f"Invalid autoscaling for a multi-host TPU slice: TPU topology {topology} has {slice_hosts} "
                f"hosts, so the max node count must be {slice_hosts} (got {autoscaling.max_nodes}).",
            )

        consolidation_delay = _consolidation_delay(config)
        lag = self.cluster.draw("flex_visibility_lag") if flex else 0.0
        return NodePool(
            name=name,
            request=clone(request),
            supply=supply,
            machine_type=machine_type,
            family=family,
            hosts=initial,
            chips_per_host=per_host,
            topology=topology,
            reservation=reservation,
            created_at=self.cluster.wall(),
            visible_after=self.cluster.mono() + lag,
            zones=zones,
            autoscaling=autoscaling,
            slice_hosts=slice_hosts,
            consolidation_delay=consolidation_delay,
        )

    def _placed_by_policy(self, request: dict[str, Any]) -> dict[str, Any]:
        """A request whose ``placementPolicy.policyName`` names a workload policy: the policy
        must exist in the cluster's project and region (else 404), and its accelerator
        topology is the slice's (the policy replaces ``tpuTopology``)."""
        placement = request.get("placementPolicy") or {}
        name = placement.get("policyName") if isinstance(placement, dict) else None
        if not name:
            return request
        c = self.cluster
        policy = c.workload_policy(name)
        if policy is None:
            raise GoogleError(
                404,
                f"The resource 'projects/{c.config.project}/regions/{c.region}/resourcePolicies/{name}' was not found",
            )
        return {**request, "placementPolicy": {**placement, "tpuTopology": policy.accelerator_topology}}

    def _pool_zones(self, request: dict[str, Any], tpu: bool) -> list[str]:
        """The pool's zones: ``locations``, else the cluster's node locations (400 when GKE refuses them)."""
        c = self.cluster.config
        requested = request.get("locations")
        if requested and not all(isinstance(z, str) for z in requested):
            raise GoogleError(400, "Invalid value at 'node_pool.locations': must be a list of zone names.")
        zones = list(requested) if requested else c.zones
        region = region_of(c.location)
        foreign = [z for z in zones if not is_zone(z) or region_of(z) != region]
        if foreign or len(set(zones)) != len(zones):
            raise GoogleError(
                400,
                f"Invalid argument: node pool locations {zones} must be distinct zones of the cluster's "
                f"region {region}.",
            )
        if tpu and (len(zones) != 1 or zones[0] not in c.zones):
            raise GoogleError(
                400,
                f"Invalid argument: a TPU node pool must be in exactly one zone of the cluster's node "
                f"locations; node_pool.locations is {zones} (cluster {c.name} has node locations "
                f"{', '.join(c.zones)}). Set node_pool.locations to one of them.",
            )
        return zones

    # ---- capacity ------------------------------------------------------------------------------
    def free_hosts(self, pool: NodePool) -> int | None:
        """More hosts of ``pool``'s kind that fit now: reservation or cluster chips, none in a
        stockout of its supply (None: unlimited)."""
        if pool.supply != "reservation" and self.cluster.stocked_out(pool.supply):
            return 0
        if pool.supply == "reservation":
            res = self.cluster.config.reservation
            return (res.count if res else 0) - self.reservation_in_use()
        if not pool.chips_per_host:
            return None
        return max(0, self.cluster.config.chips - self.chips_committed()) // pool.chips_per_host

    def _capacity_error(self, pool: NodePool) -> dict[str, Any] | None:
        """The error this create will end with (None if it fits)."""
        faults = self.cluster.faults
        if faults.create_error:
            self.cluster.fault_counts["create_error"] += 1
            return {"code": faults.create_error_code, "message": faults.create_error}
        if pool.supply == "reservation":
            error = self._reservation_error(pool)
            if error is not None:
                return error
        free = self.free_hosts(pool)
        if free is not None and pool.hosts > free:
            if free == 0 and pool.supply != "reservation" and self.cluster.stocked_out(pool.supply):
                self.cluster.fault_counts["stockout"] += 1
            return self._shortage(pool, pool.hosts, free)
        return None

    def _reservation_error(self, pool: NodePool) -> dict[str, Any] | None:
        """Why ``pool`` cannot consume its reservation at all (unknown, other zone, other machine type)."""
        c = self.cluster.config
        res, res_zone = c.reservation, c.reservation_zone
        values = ((pool.request.get("config") or {}).get("reservationAffinity") or {}).get("values") or [""]
        project = _reservation_ref(values[0])[0] or c.project  # a bare name is the cluster's project's
        path = f"projects/{project}/zones/{pool.zones[0]}/reservations/{pool.reservation}"
        if res is None or res.name != pool.reservation or project != c.reservation_project:
            return {"code": CODE_NOT_FOUND, "message": f"Reservation '{path}' was not found."}
        if pool.zones != [res_zone]:
            return {
                "code": CODE_NOT_FOUND,
                "message": (
                    f"Reservation '{path}' was not found: reservation {res.name} is in zone {res_zone}, and a "
                    f"node pool that consumes a specific reservation must be in the reservation's zone "
                    f"(node pool locations: {', '.join(pool.zones)})."
                ),
            }
        res_machine = self.cluster.reservation_machine_type()
        if res_machine != pool.machine_type:
            return {
                "code": CODE_FAILED_PRECONDITION,
                "message": (
                    f"Reservation {res.name} holds {res_machine} VMs; the node pool asks for {pool.machine_type}."
                ),
            }
        return None

    def _shortage(self, pool: NodePool, wanted: int, free: int) -> dict[str, Any]:
        res = self.cluster.config.reservation
        if pool.supply == "reservation" and res is not None:
            message = (
                f"Reservation {res.name} does not have enough resources: {wanted} VM(s) requested, "
                f"{free} of {res.count} available."
            )
        else:
            zone = f"projects/{self.cluster.config.project}/zones/{pool.zones[0]}"
            message = (
                f"ZONE_RESOURCE_POOL_EXHAUSTED: The zone '{zone}' does not have enough resources "
                f"available to fulfill the request ({pool.machine_type} x {wanted}). "
                "Try a different zone, or try again later."
            )
        return {"code": CODE_RESOURCE_EXHAUSTED, "message": message}

    # ---- nodes ---------------------------------------------------------------------------------
    def _finish_create(self, pool: NodePool, op: Operation) -> None:
        if pool.doomed is not None:
            pool.status = "ERROR"
            pool.error = pool.doomed
            pool.doomed = None
            pool.status_message = pool.error["message"]
            self._end_op(op, pool.error)
            return
        pool.status = "RUNNING"
        pool.ready_at = self.cluster.wall()
        self._end_op(op, None)
        self.cluster.refresh_idle()
        self._provision(pool, pool.hosts)
        self.cluster.autoscaler.poke()

    def add_hosts(self, pool: NodePool, count: int) -> None:
        """Hold ``count`` more hosts for ``pool`` (the autoscaler checked they fit); nodes follow."""
        self.cluster.refresh_idle()
        pool.hosts += count
        self._provision(pool, count)

    def remove_nodes(self, pool: NodePool, names: list[str]) -> None:
        """Delete these nodes of ``pool`` (with any pod on them) and release their hosts."""
        self.cluster.refresh_idle()
        for node in names:
            self.cluster.remove_node(node)
            pool.node_names.remove(node)
        pool.hosts -= len(names)
        self.cluster.refresh_idle()

    def _provision(self, pool: NodePool, count: int) -> None:
        if count <= 0:
            return
        pool.provisioning += count
        self.cluster.call_later(self.cluster.draw("node_register"), self._register_nodes, pool, count)

    def _register_nodes(self, pool: NodePool, count: int) -> None:
        pool.provisioning -= count
        if pool.status != "RUNNING" or pool.deleted_at is not None:
            return
        added = []
        for _ in range(count):
            zone = pool.zones[len(pool.node_names) % len(pool.zones)]  # round robin over the pool's zones
            added.append(self.cluster.add_node(pool, zone))
            pool.node_names.append(added[-1])
        if pool.first_node_at is None:
            pool.first_node_at = self.cluster.wall()
        limit = max_run_seconds(pool)
        if limit is not None:
            self.cluster.call_later(limit, self._run_limit, pool, added)

    def _run_limit(self, pool: NodePool, nodes: list[str]) -> None:
        """``maxRunDuration`` after they came, GKE deletes the VMs: a reclaim of those still there."""
        alive = [n for n in nodes if n in pool.node_names]
        if alive and pool.deleted_at is None:
            self.cluster.disruptions.disrupt("reclaim", alive, trigger="maxRunDuration")

    # ---- delete --------------------------------------------------------------------------------
    def delete(self, name: str) -> Operation:
        pool = self.get(name)
        self._claim_operation_slot(name)
        op = self._start_op("DELETE_NODE_POOL", name)
        pool.status = "STOPPING"
        pool.delete_requested_at = self.cluster.wall()
        self.cluster.call_later(self.cluster.draw("node_pool_delete"), self._finish_delete, pool, op)
        return op

    def _finish_delete(self, pool: NodePool, op: Operation) -> None:
        for node in pool.node_names:
            self.cluster.remove_node(node)
        pool.deleted_at = self.cluster.wall()
        self.pools.pop(pool.name, None)
        self.cluster.refresh_idle()
        self._end_op(op, None)

    # ---- operations ----------------------------------------------------------------------------
    def _claim_operation_slot(self, pool: str) -> None:
        rate = self.cluster.faults.incompatible_op_rate
        if rate and self.cluster.fault_rng.random() < rate:
            # GKE's own operation (an upgrade, a repair) holds the cluster: the same refusal as
            # a concurrent Falcon operation, but not counted as one in max_concurrent_pool_ops
            self.cluster.fault_counts["incompatible_op"] += 1
            raise GoogleError(
                400,
                f"Cluster is running incompatible operation operation-{int(self.cluster.wall() * 1000)}-upgrade. "
                "Please wait and try again.",
                "FAILED_PRECONDITION",
            )
        at_once = self.cluster.config.pool_ops_at_once or POOL_OPS_AT_ONCE
        same = self.running_ops.get(pool)
        if same is not None or (self.running_ops and at_once == 1):
            running = same or next(iter(self.running_ops.values()))
            refusal = GoogleError(
                400, f"Cluster is running incompatible operation {running.name}. Please wait and try again.", "FAILED_PRECONDITION"
            )
        elif len(self.running_ops) >= at_once:
            refusal = GoogleError(
                429,
                f'Too many operations: cluster "{self.cluster.config.name}" hits the concurrent operations '
                f"quota {at_once}, please try again later.",
                "RESOURCE_EXHAUSTED",
            )
        else:
            return
        self.max_concurrent_ops = max(self.max_concurrent_ops, len(self.running_ops) + 1)
        self.rejected_ops += 1
        raise refusal

    def _start_op(self, op_type: str, pool: str) -> Operation:
        suffix = "".join(self.cluster.rng.choice("0123456789abcdef") for _ in range(8))
        name = f"operation-{int(self.cluster.wall() * 1000)}-{suffix}"
        op = Operation(name, op_type, pool, self.cluster, started_at=self.cluster.wall())
        self.operations[name] = op
        self.running_ops[pool] = op
        self.max_concurrent_ops = max(self.max_concurrent_ops, len(self.running_ops))
        return op

    def _end_op(self, op: Operation, error: dict[str, Any] | None) -> None:
        op.status = "DONE"
        op.ended_at = self.cluster.wall()
        op.error = error
        if self.running_ops.get(op.pool) is op:
            del self.running_ops[op.pool]

    def stats(self) -> dict[str, Any]:
        now = self.cluster.mono()
        return {
            "node_pools": [p.stats(now) for p in self.history],
            "pool_ops": [o.stats() for o in self.operations.values()],
            "max_concurrent_pool_ops": self.max_concurrent_ops,
            "rejected_pool_ops": self.rejected_ops,
        }


def max_run_seconds(pool: NodePool) -> float | None:
    """How long the pool's VMs may exist (``config.maxRunDuration``, e.g. ``"604800s"``); a
    flex-start pool that does not say gets GKE's default and maximum, seven days. None: no
    limit."""
    text = str((pool.request.get("config") or {}).get("maxRunDuration") or "")
    if text.endswith("s"):
        try:
            return float(text[:-1])
        except ValueError:
            pass
    return FLEX_START_MAX_RUN_S if pool.flex else None


def node_object(cluster: SimCluster, pool: NodePool, node_name: str, index: int, zone: str) -> dict[str, Any]:
    """The v1 Node GKE registers for one host of a pool, in ``zone``."""
    c = cluster.config
    config = pool.request.get("config") or {}
    labels: dict[str, str] = {str(k): str(v) for k, v in (config.get("labels") or {}).items()}
    labels.update(
        {
            NODEPOOL_LABEL: pool.name,
            "cloud.google.com/gke-boot-disk": "pd-balanced",
            "cloud.google.com/gke-os-distribution": "cos",
            "kubernetes.io/arch": "amd64",
            "kubernetes.io/os": "linux",
            "kubernetes.io/hostname": node_name,
            "node.kubernetes.io/instance-type": pool.machine_type,
            "topology.kubernetes.io/zone": zone,
            "topology.kubernetes.io/region": region_of(zone),
        }
    )
    if pool.supply == "spot":
        labels["cloud.google.com/gke-spot"] = "true"
    if pool.supply == "flex-start":
        labels["cloud.google.com/gke-flex-start"] = "true"
    taints: list[dict[str, str]] = []
    for t in config.get("taints") or []:
        effect = t.get("effect")
        effect_name = TAINT_EFFECT.get(effect) if isinstance(effect, int) else TAINT_EFFECT_NAMES.get(effect)
        taints.append(
            {"key": t.get("key", ""), "value": t.get("value", ""), "effect": effect_name or "NoSchedule"}
        )
    capacity = {"cpu": "8", "memory": "32Gi", "pods": "110", "ephemeral-storage": "100Gi"}
    if pool.family is not None:
        labels[ACCELERATOR_LABEL] = pool.family.accelerator
        labels[TOPOLOGY_LABEL] = pool.topology or ""
        capacity = {"cpu": "180", "memory": "720Gi", "pods": "110", "ephemeral-storage": "100Gi"}
        capacity[TPU_RESOURCE] = str(pool.chips_per_host)
        taints.append({"key": TPU_RESOURCE, "value": "present", "effect": "NoSchedule"})
    now = cluster.stamp()
    ip = f"10.128.{len(cluster.pools.history) % 250}.{index % 250 + 2}"
    return {
        "metadata": {"name": node_name, "labels": labels, "annotations": {"sim.falcon/pool": pool.name}},
        "spec": {
            "providerID": f"gce://{c.project}/{zone}/{node_name}",
            "taints": taints,
        },
        "status": {
            "capacity": dict(capacity),
            "allocatable": dict(capacity),
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True",
                    "reason": "KubeletReady",
                    "message": "kubelet is posting ready status",
                    "lastHeartbeatTime": now,
                    "lastTransitionTime": now,
                }
            ],
            "addresses": [{"type": "InternalIP", "address": ip}, {"type": "Hostname", "address": node_name}],
            "nodeInfo": {
                "architecture": "amd64",
                "bootID": node_name + "-boot",
                "containerRuntimeVersion": "containerd://2.0.6",
                "kernelVersion": "6.6.93+",
                "kubeProxyVersion": "v" + GKE_VERSION,
                "kubeletVersion": "v" + GKE_VERSION,
                "machineID": node_name + "-machine",
                "operatingSystem": "linux",
                "osImage": "Container-Optimized OS from Google",
                "systemUUID": node_name + "-uuid",
            },
        },
    }
