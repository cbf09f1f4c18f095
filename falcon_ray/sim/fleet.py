"""Fleet file: the YAML that describes a simulated fleet, validated by pydantic.

Contract
--------
``load_fleet(path)`` reads a YAML fleet file (``None`` -> the built-in
``default_fleet.yaml`` shipped in this package) and returns a validated
:class:`FleetConfig`, or raises :class:`FleetConfigError` whose message lists
every problem as ``location: reason`` (e.g. ``clusters[0].chips: Input should
be greater than or equal to 0``). Every model forbids unknown keys, so a typo
in a fleet file is an error, not a silently ignored setting. ``with_timings(fleet,
changes)`` is the fleet with the same timings changed in every cluster (a sweep).

The same :class:`Faults` and :class:`Timings` models validate the runtime
control calls (``SimFleet.set_faults`` / ``set_timings`` and the
``POST /sim/clusters/{name}/faults|timings`` endpoints), so a fault can only be
set to a value the fleet file would also accept. All durations are seconds.

A timing that varies is given as a :class:`LogNormal` ``{median: M, p90: P}`` instead of
a number: ``Timings.draw(name, rng)`` is the one place a duration is read for an event
(a number as it is, drawing nothing; a log-normal sampled from ``rng``), so a fleet of
constants draws exactly what it drew before distributions existed.

A cluster's ``stockouts`` are windows of the fleet's own time (seconds since the
cluster was built) in which one or more supplies have no capacity
(:meth:`Stockout.covers`); ``honour_consolidation_delay`` says whether the cluster
autoscaler removes an empty node after its pool's ``config.consolidationDelay`` (the
fleet's value, which a cluster may override) or after ``timings.autoscaler_scale_down``;
``pool_ops_at_once`` is how many node-pool operations the cluster runs together (the
fleet's value, which a cluster may override: GKE's per-cluster quota of concurrent
operations, or 1 for a cluster that runs one at a time).

A cluster's ``location`` is a zone (a zonal cluster) or a region (a regional
cluster, which must list its ``node_locations``); :attr:`ClusterConfig.zones`
are the node locations and :attr:`ClusterConfig.reservation_zone` the zone of
its reservation (default: the cluster's zone, or its first node location).
"""

from __future__ import annotations

import math
import random
import re
from importlib import resources
from pathlib import Path
from statistics import NormalDist
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    ValidationError,
    field_validator,
    model_validator,
)

# GKE resource names: lower-case letter first, then letters, digits and dashes, no trailing dash.
_GKE_NAME = re.compile(r"^[a-z]([-a-z0-9]{0,38}[a-z0-9])?$")
# Compute resource names (reservations): same shape, up to 63 characters.
_COMPUTE_NAME = re.compile(r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")

KNOWN_TPU_TYPES = ("v5e", "v5p", "v6e", "v7x")
# node-pool operations a cluster runs together: GKE's per-cluster quota of concurrent operations, as users report it
POOL_OPS_AT_ONCE = 5

# What GKE does to running work (falcon_ray.sim.disruptions): host maintenance, auto-repair,
# capacity taken back (flex-start run limit, preemption).
DisruptionKind = Literal["maintenance", "repair", "reclaim"]
DISRUPTION_KINDS: tuple[DisruptionKind, ...] = ("maintenance", "repair", "reclaim")

# A Compute zone is its region plus "-<letter>": us-central1-a is a zone of us-central1.
_ZONE = re.compile(r"^[a-z]+(-[a-z]+)*\d+-[a-z]$")


# The fast profile of the tests, the soak and the benchmark (seconds): minutes of GKE scaled
# down so a scenario runs in seconds. Copy it (``dict(FAST_TIMINGS)``) before changing a key.
FAST_TIMINGS = {
    "node_pool_create": 0.6,
    "node_register": 0.3,
    "flex_visibility_lag": 0.5,
    "node_pool_delete": 0.3,
    "pod_start": 0.1,
    "autoscaler_scale_up": 0.3,
    "flex_capacity_wait": 0.3,
}


def is_zone(location: str) -> bool:
    """True for a zone name (``us-central1-a``), False for a region (``us-central1``)."""
    return bool(_ZONE.match(location))


def region_of(location: str) -> str:
    """The region of a zone, or the location itself when it is already a region."""
    return location.rsplit("-", 1)[0] if is_zone(location) else location


class FleetConfigError(ValueError):
    """The fleet file could not be read or is invalid; the message says where and why."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


# The standard normal's 90th percentile: a log-normal's p90 is its median times exp(sigma * Z90).
Z90 = NormalDist().inv_cdf(0.9)


class LogNormal(_Strict):
    """A duration that differs from one event to the next: log-normal, fitted to its median
    and its 90th percentile (seconds). Half the draws are below ``median``, nine in ten below
    ``p90``; the tail beyond ``p90`` is long (p99 is ``median * (p90 / median) ** 1.82``)."""

    median: float = Field(gt=0, description="half the durations are shorter than this")
    p90: float = Field(gt=0, description="nine in ten durations are shorter than this; at least the median")

    @model_validator(mode="after")
    def _p90_not_below_median(self) -> LogNormal:
        if self.p90 < self.median:
            raise ValueError(f"p90 ({self.p90:g}) must be at least the median ({self.median:g})")
        return self

    @property
    def sigma(self) -> float:
        """The standard deviation of the duration's logarithm."""
        return math.log(self.p90 / self.median) / Z90

    def draw(self, rng: random.Random) -> float:
        """One duration, from ``rng`` (one normal draw; p90 == median gives the median)."""
        return self.median * math.exp(self.sigma * rng.normalvariate(0.0, 1.0))


def _duration_kind(value: Any) -> str | None:
    """Which form a timing is given in: a number of seconds or a ``{median, p90}`` mapping."""
    if isinstance(value, dict | LogNormal):
        return "distribution"
    if isinstance(value, int | float) and not isinstance(value, bool):
        return "seconds"
    return None


# A timing that may vary: a number of seconds (the same every time), or {median: M, p90: P}.
Duration = Annotated[
    Annotated[Annotated[float, Field(ge=0)], Tag("seconds")] | Annotated[LogNormal, Tag("distribution")],
    Discriminator(
        _duration_kind,
        custom_error_type="duration",
        custom_error_message="Input should be a number of seconds or a distribution {median: M, p90: P}",
    ),
]
# the loc parts pydantic adds for the form a Duration was given in (left out of error messages)
_DURATION_TAGS = ("seconds", "distribution")


class Timings(_Strict):
    """How long simulated things take, in seconds (scaled down from real minutes). The
    ``Duration`` fields may vary: read them through :meth:`draw`, once per event."""

    node_pool_create: Duration = Field(2.0, description="create call -> operation DONE, pool RUNNING")
    node_register: Duration = Field(1.0, description="pool RUNNING -> its v1 Nodes appear Ready")
    flex_visibility_lag: Duration = Field(
        1.0, description="flex-start pools answer 404 to get/list this long after the create call"
    )
    node_pool_delete: Duration = Field(1.0, description="delete call -> pool, nodes and pods gone")
    pod_start: Duration = Field(0.1, description="pod bound to a node -> container Running")
    watch_bookmark_interval: float = Field(
        5.0, gt=0, description="period of BOOKMARK events on watches that allow them"
    )
    autoscaler_scale_up: Duration = Field(
        0.5,
        description="an unschedulable pod selects an autoscaled pool -> the autoscaler adds node(s)",
    )
    flex_capacity_wait: Duration = Field(
        0.5,
        description="a flex-start scale-up waits this long for its capacity (drawn per attempt); with none "
        "free it tries again after another such wait",
    )
    autoscaler_scale_down: float = Field(
        30.0,
        ge=0,
        description="a node of an autoscaled pool empty this long is removed (not below min), unless its "
        "pool's consolidationDelay says otherwise",
    )
    maintenance_notice: Duration = Field(
        1.0,
        description="host maintenance: the scheduled-maintenance-time label is on the node(s) this long "
        "before GKE drains them",
    )
    maintenance_duration: Duration = Field(
        2.0, description="host maintenance: the drained node(s) stay NotReady this long, then come back"
    )
    repair_detect: Duration = Field(
        1.0,
        description="auto-repair: a node is NotReady this long before GKE recreates its VM (the whole slice)",
    )
    pod_termination: float = Field(
        0.2,
        ge=0,
        description="a deleted pod that runs on a node keeps running (and holding its TPU) this long, its "
        "termination grace period, before it ends and is removed",
    )

    def draw(self, name: str, rng: random.Random) -> float:
        """The duration of one event of timing ``name``: the number itself (``rng`` untouched),
        or a draw of its distribution from ``rng``."""
        value = getattr(self, name)
        return value.draw(rng) if isinstance(value, LogNormal) else value

    def median(self, name: str) -> float:
        """The typical duration of timing ``name``: the number itself, or its distribution's median."""
        value = getattr(self, name)
        return value.median if isinstance(value, LogNormal) else value


class Faults(_Strict):
    """Injected failures; all can be changed while the fleet runs."""

    api_error_rate: float = Field(0.0, ge=0, le=1, description="fraction of GKE/Compute calls answered 503")
    too_many_requests_rate: float = Field(
        0.0, ge=0, le=1, description="fraction of GKE/Compute calls answered 429"
    )
    incompatible_op_rate: float = Field(
        0.0,
        ge=0,
        le=1,
        description="fraction of node-pool create/delete calls refused with GKE's 400 'incompatible operation' "
        "(as while GKE runs its own upgrade or repair on the cluster)",
    )
    create_error: str | None = Field(
        None, description="when set, every node-pool create ends as a DONE operation with this error"
    )
    create_error_code: int = Field(
        8,
        ge=1,
        le=16,
        description="the google.rpc code of the create_error (8 RESOURCE_EXHAUSTED, as a stockout or quota; "
        "13 INTERNAL for a failure that is not about capacity)",
    )
    webhook_unavailable: bool = Field(
        False,
        description="the policy admission webhook (failurePolicy Fail) cannot be reached: every Job and Pod "
        "create is answered 500 InternalError 'failed calling webhook'",
    )
    watch_drop_every: float | None = Field(
        None, gt=0, description="cut every watch stream this many seconds after it opened"
    )
    token_ttl: float | None = Field(
        None, gt=0, description="this cluster rejects tokens older than this (seconds since issue)"
    )
    deny_images: list[str] = Field(
        default_factory=list, description="image prefixes an admission webhook refuses"
    )
    disruption_rate_per_node_hour: float = Field(
        0.0,
        ge=0,
        description="random disruptions: a Poisson rate per hour (of the sim's clock) for every node that has a "
        "running pod",
    )
    disruption_kinds: list[DisruptionKind] = Field(
        default_factory=lambda: list(DISRUPTION_KINDS),
        min_length=1,
        description="the kinds random disruptions take, by turns",
    )

    @model_validator(mode="after")
    def _rates_fit(self) -> Faults:
        if self.api_error_rate + self.too_many_requests_rate > 1.0:
            raise ValueError("api_error_rate + too_many_requests_rate must not exceed 1.0")
        return self


class ReservationConfig(_Strict):
    """A specific Compute reservation; it lives in one zone (by default the cluster's first node location)."""

    name: str
    count: int = Field(ge=0, description="size of the reservation in VMs (TPU hosts)")
    machine_type: str | None = Field(
        None, description="machine type the reservation holds; default: the 4-chip type of tpu_type"
    )
    zone: str | None = Field(
        None, description="the reservation's zone; default: the cluster's zone, or its first node location"
    )
    project: str | None = Field(
        None,
        description="the project that owns it (a reservation shared with the cluster's project); "
        "default: the cluster's project",
    )

    @field_validator("name")
    @classmethod
    def _name_shape(cls, v: str) -> str:
        if not _COMPUTE_NAME.match(v):
            raise ValueError(f"{v!r} is not a valid reservation name (lower-case letters, digits, dashes)")
        return v


class WorkloadPolicyConfig(_Strict):
    """A Compute workload policy (a regional resource policy) in the cluster's project and
    region, as ``gcloud compute resource-policies create workload-policy`` makes it."""

    name: str
    type: Literal["HIGH_THROUGHPUT", "HIGH_AVAILABILITY"] = "HIGH_THROUGHPUT"
    accelerator_topology: str = Field(description="the TPU topology it places, e.g. 2x2x2")

    @field_validator("name")
    @classmethod
    def _name_shape(cls, v: str) -> str:
        if not _COMPUTE_NAME.match(v):
            raise ValueError(f"{v!r} is not a valid resource policy name (lower-case letters, digits, dashes)")
        return v


# What a pool's nodes are bought as (falcon_ray.sim.node_pools): a stockout can take away
# any of them but the reservation, whose capacity is held.
StockoutSupply = Literal["flex-start", "on-demand", "spot"]
STOCKOUT_SUPPLIES: tuple[StockoutSupply, ...] = ("flex-start", "on-demand", "spot")


class Stockout(_Strict):
    """A window of the fleet's time in which a zone has no capacity of some supplies: creates
    of pools that ask for hosts of them end RESOURCE_EXHAUSTED, and autoscaler scale-ups of
    them get nothing."""

    start_s: float = Field(ge=0, description="seconds after the fleet started")
    duration_s: float = Field(gt=0, description="how long it lasts")
    supply: list[StockoutSupply] = Field(
        default_factory=lambda: list(STOCKOUT_SUPPLIES),
        min_length=1,
        description="the supplies it takes away (default: every one but reservations)",
    )

    def covers(self, supply: str, at_s: float) -> bool:
        """True when ``supply`` has no capacity ``at_s`` seconds after the fleet started."""
        return self.start_s <= at_s < self.start_s + self.duration_s and supply in self.supply


class ClusterConfig(_Strict):
    """One simulated GKE cluster: its identity, capacity, timings and faults."""

    name: str
    project: str
    location: str = Field(
        description="a zone (us-east5-b: zonal cluster) or a region (us-central1: regional)"
    )
    node_locations: list[str] | None = Field(
        None, description="zones of the cluster's nodes; required for a region, default [location] for a zone"
    )
    tpu_type: str = "v6e"
    gcs_bucket: str | None = None
    status: Literal["active", "maintenance", "offline"] = "active"
    reservation: ReservationConfig | None = None
    workload_policies: list[WorkloadPolicyConfig] = Field(
        default_factory=list, description="Compute workload policies in the cluster's project and region"
    )
    chips: int = Field(64, ge=0, description="TPU chips available to on-demand, spot and flex-start pools")
    timings: Timings = Field(default_factory=Timings)
    faults: Faults = Field(default_factory=Faults)
    watch_history: int = Field(
        1000, ge=1, description="watch events kept for resumption; older resourceVersions get 410"
    )
    stockouts: list[Stockout] = Field(
        default_factory=list, description="windows in which some supplies have no capacity"
    )
    honour_consolidation_delay: bool | None = Field(
        None,
        description="the autoscaler removes an empty node after its pool's config.consolidationDelay "
        "(true) or after timings.autoscaler_scale_down (false); null: the fleet's setting",
    )
    pool_ops_at_once: int | None = Field(
        None, ge=1, description="node-pool operations this cluster runs together; null: the fleet's setting"
    )

    @field_validator("name")
    @classmethod
    def _name_shape(cls, v: str) -> str:
        if not _GKE_NAME.match(v):
            raise ValueError(
                f"{v!r} is not a valid GKE cluster name (1-40 lower-case letters, digits, dashes; "
                "starts with a letter)"
            )
        return v

    @field_validator("tpu_type")
    @classmethod
    def _known_tpu(cls, v: str) -> str:
        if v not in KNOWN_TPU_TYPES:
            raise ValueError(f"unknown tpu_type {v!r}; allowed: {', '.join(KNOWN_TPU_TYPES)}")
        return v

    @field_validator("project", "location")
    @classmethod
    def _not_blank(cls, v: str) -> str:
        if not v or "/" in v:
            raise ValueError("must be a non-empty name without '/'")
        return v

    @model_validator(mode="after")
    def _zones_fit(self) -> ClusterConfig:
        region = region_of(self.location)
        if self.regional and not self.node_locations:
            raise ValueError(f"node_locations is required: {self.location} is a region (list its zones)")
        for zone in self.node_locations or []:
            if not is_zone(zone) or region_of(zone) != region:
                raise ValueError(f"node_locations: {zone!r} is not a zone of {region}")
        if self.node_locations is not None and len(set(self.node_locations)) != len(self.node_locations):
            raise ValueError("node_locations: zones must not repeat")
        if not self.regional and self.node_locations and self.location not in self.node_locations:
            raise ValueError(f"node_locations of a zonal cluster must include its zone {self.location}")
        res = self.reservation
        if (
            res is not None
            and res.zone is not None
            and (not is_zone(res.zone) or region_of(res.zone) != region)
        ):
            raise ValueError(f"reservation.zone: {res.zone!r} is not a zone of {region}")
        return self

    @property
    def honours_consolidation_delay(self) -> bool:
        """Whether the autoscaler reads a pool's ``consolidationDelay`` (unset: yes)."""
        return self.honour_consolidation_delay is not False

    @property
    def regional(self) -> bool:
        """True when ``location`` is a region (GKE: a regional cluster)."""
        return not is_zone(self.location)

    @property
    def zones(self) -> list[str]:
        """The cluster's node locations (GKE's ``Cluster.locations``)."""
        return list(self.node_locations or [self.location])

    @property
    def reservation_project(self) -> str | None:
        """The project that owns the reservation (None without one)."""
        if self.reservation is None:
            return None
        return self.reservation.project or self.project

    @property
    def reservation_zone(self) -> str | None:
        if self.reservation is None:
            return None
        return self.reservation.zone or (self.location if not self.regional else self.zones[0])


class AuthConfig(_Strict):
    """Fleet-wide authentication of the GKE, Compute and Kubernetes APIs."""

    required: bool = Field(True, description="false: accept requests without a bearer token")
    token_ttl: float = Field(3600.0, gt=0, description="expires_in of tokens the metadata server hands out")


class MetadataConfig(_Strict):
    """Identity the metadata server reports (the controller's Workload Identity)."""

    project_id: str = "falcon-central"
    numeric_project_id: str = "100000000001"
    service_account: str = "falcon-controller@falcon-central.iam.gserviceaccount.com"
    zone: str = "us-central1-a"


class FleetConfig(_Strict):
    """The whole simulated fleet."""

    seed: int = 0
    auth: AuthConfig = Field(default_factory=AuthConfig)
    metadata: MetadataConfig = Field(default_factory=MetadataConfig)
    honour_consolidation_delay: bool = Field(
        True,
        description="every cluster's autoscaler honours its pools' config.consolidationDelay, unless the "
        "cluster says otherwise",
    )
    pool_ops_at_once: int = Field(
        POOL_OPS_AT_ONCE,
        ge=1,
        description="node-pool operations each cluster runs together (GKE's per-cluster quota of concurrent "
        "operations): one more is refused 429 RESOURCE_EXHAUSTED \"Too many operations\"; 1: one at a time, a "
        "second refused 400 FAILED_PRECONDITION \"incompatible operation\"",
    )
    clusters: list[ClusterConfig] = Field(min_length=1)

    @model_validator(mode="after")
    def _clusters_inherit(self) -> FleetConfig:
        for c in self.clusters:
            if c.honour_consolidation_delay is None:
                c.honour_consolidation_delay = self.honour_consolidation_delay
            if c.pool_ops_at_once is None:
                c.pool_ops_at_once = self.pool_ops_at_once
        return self

    @model_validator(mode="after")
    def _unique(self) -> FleetConfig:
        names = [c.name for c in self.clusters]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"cluster names must be unique; repeated: {', '.join(dupes)}")
        seen: dict[tuple[str, str, str], str] = {}
        for c in self.clusters:
            if c.reservation is None:
                continue
            key = (c.reservation_project or c.project, c.reservation_zone or "", c.reservation.name)
            if key in seen:
                raise ValueError(
                    f"reservation {c.reservation.name!r} in {c.project}/{key[1]} is declared by both "
                    f"{seen[key]} and {c.name}"
                )
            seen[key] = c.name
        return self

    def cluster(self, name: str) -> ClusterConfig:
        for c in self.clusters:
            if c.name == name:
                return c
        raise KeyError(name)


def _format_errors(err: ValidationError) -> str:
    lines = []
    for e in err.errors():
        where = ""
        for part in e["loc"]:
            if part in _DURATION_TAGS:
                continue
            where += f"[{part}]" if isinstance(part, int) else (f".{part}" if where else str(part))
        lines.append(f"  {where or '(top level)'}: {e['msg']}")
    return "\n".join(lines)


def with_timings(fleet: FleetConfig, changes: dict[str, Any], source: str = "timings") -> FleetConfig:
    """A copy of ``fleet`` whose every cluster has ``changes`` applied to its timings, each
    validated by :class:`Timings` as the fleet file's are (else :class:`FleetConfigError`,
    its problems on one line, ``source: timings.KEY: reason``)."""
    try:
        clusters = [
            c.model_copy(update={"timings": Timings.model_validate({**c.timings.model_dump(), **changes})})
            for c in fleet.clusters
        ]
    except ValidationError as e:
        problems = "; ".join(line.strip() for line in _format_errors(e).splitlines())
        raise FleetConfigError(f"{source}: {problems}") from None
    return fleet.model_copy(update={"clusters": clusters})


def parse_fleet(data: object, source: str = "fleet") -> FleetConfig:
    """Validate already-parsed YAML/JSON data as a fleet."""
    if not isinstance(data, dict):
        raise FleetConfigError(f"{source}: the top level must be a mapping with a 'clusters' list")
    try:
        return FleetConfig.model_validate(data)
    except ValidationError as e:
        raise FleetConfigError(f"{source} is not a valid fleet:\n{_format_errors(e)}") from None


def load_fleet(path: str | None) -> FleetConfig:
    """Load a fleet file; ``None`` loads the built-in two-cluster default fleet."""
    if path is None:
        text = resources.files("falcon_ray.sim").joinpath("default_fleet.yaml").read_text("utf-8")
        source = "built-in default fleet"
    else:
        try:
            text = Path(path).read_text("utf-8")
        except OSError as e:
            raise FleetConfigError(f"cannot read fleet file {path}: {e.strerror or e}") from None
        source = path
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise FleetConfigError(f"{source} is not valid YAML: {e}") from None
    return parse_fleet(data, source)
