"""Controller settings: one frozen object, loaded from YAML, every default documented.

Contract
--------
``Settings`` holds every tunable of the controller; ``load_settings(path)`` reads a
YAML mapping (unknown keys are an error, so a typo never silently falls back to a
default) and ``Settings()`` gives the production defaults; an unreadable file, bad
YAML or an invalid value raises ``SettingsError`` (one line naming the file and the
key), and only that. The same object is passed
to every actor; decisions read their timeouts from it, never from constants of their
own. docs/configuration.md lists every field; a test keeps the two in step.
"""

from __future__ import annotations

from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from falcon_ray.spec import SupplyMode


class Settings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    # --- intake and queues
    poll_interval_s: float = Field(1.0, gt=0, description="PollerActor: seconds between polls of the jobs table")
    intake_batch: int = Field(500, gt=0, description="PollerActor: most new or aborting rows read per poll")
    queue_tick_s: float = Field(1.0, gt=0, description="QueueActor: seconds between reconciles without a hint")
    queue_idle_tick_s: float = Field(
        30.0,
        gt=0,
        description="QueueActor: seconds between reconciles of an empty queue (no task, no pool) without a hint; "
        "a safety tick for a lost wake-up, never shorter than queue_tick_s",
    )
    queue_full_read_s: float = Field(
        10.0, gt=0, description="QueueActor: seconds between full re-reads of its tasks; the rounds in between read only what changed"
    )
    # --- node pools
    node_pool_timeout_s: float = Field(
        3600.0,
        gt=0,
        description="control plane not RUNNING within this many seconds of GKE accepting the create: the pool is given "
        "back and the task goes to the head of its queue (pool_release_limit), then Failed/NodePoolTimeout; the "
        "original's 10m is 600, shorter than many TPU creates take",
    )
    # --- a create waiting its turn among the cluster's node-pool operations
    create_queue_limit_s: float = Field(
        10800.0,
        gt=0,
        description="a create not yet accepted by GKE (queued behind the cluster's other node-pool operations, or "
        "refused because one runs) this long -> Failed/NodePoolFailed, saying the cluster's operations were saturated",
    )
    create_visibility_grace_s: float = Field(
        120.0, ge=0, description="a new pool that reads as 404 is kept (never deleted as an orphan) this long"
    )
    reservation_idle_s: int = Field(600, gt=0, description="autoscaler idle time for pools on a reservation")
    on_demand_idle_s: int = Field(600, gt=0, description="autoscaler idle time for on-demand pools")
    flex_start_idle_s: int = Field(21600, gt=0, description="autoscaler idle time for flex-start pools")
    pool_refresh_s: float = Field(2.0, gt=0, description="ClusterActor: how stale its node-pool/node view may be")
    operation_poll_s: float = Field(2.0, gt=0, description="ClusterActor: seconds between GKE operation polls")
    pool_ops_at_once: int = Field(
        4,
        ge=1,
        le=16,
        description="ClusterActor: node-pool operations (creates, deletes) it runs side by side on its cluster; GKE "
        "takes operations on distinct pools together up to a per-cluster quota (reported as 5), so 4 leaves room for "
        "GKE's own; 1: one at a time, as GKE once required. A cluster that refuses one as concurrent is given as many "
        "as were running, for pool_ops_probe_s",
    )
    pool_ops_probe_s: float = Field(
        1800.0,
        gt=0,
        description="ClusterActor: after GKE refused a node-pool operation as concurrent, seconds before "
        "pool_ops_at_once is tried again",
    )
    pool_op_backoff_initial_s: float = Field(2.0, gt=0, description="first retry delay of a refused pool operation")
    pool_op_backoff_max_s: float = Field(120.0, gt=0, description="longest retry delay of a pool operation")
    pool_delete_report_after: int = Field(
        3, ge=1, description="failed delete attempts after which the task's Message says the pool is not deleted"
    )
    orphan_scan_interval_s: float = Field(60.0, gt=0, description="ClusterActor: seconds between orphan scans")
    node_oauth_scopes: list[str] = Field(
        default_factory=lambda: ["https://www.googleapis.com/auth/cloud-platform"],
        min_length=1,
        description="OAuth scopes of the nodes of every pool Falcon creates (config.oauthScopes); "
        "cloud-platform lets IAM decide, as xpk does",
    )
    node_service_account: str = Field(
        "", description="service account of the nodes (config.serviceAccount); empty: the Compute Engine default"
    )
    v7x_workload_policy: str = Field(
        "falcon-{topology}", description="name of the TPU7x workload policy per topology (UNVERIFIED field mapping)"
    )
    capacity_retry_first_s: float = Field(
        60.0, gt=0, description="a create GKE refused for capacity (stockout) is asked again after this many seconds"
    )
    capacity_retry_factor: float = Field(2.0, ge=1, description="each further capacity refusal multiplies the wait by this")
    capacity_retry_max_s: float = Field(1800.0, gt=0, description="longest wait between two creates refused for capacity")
    capacity_budget_s: float = Field(
        21600.0,
        gt=0,
        description="a capacity wait (stockout) ends Failed/NodePoolFailed this long after the first refusal; "
        "waits for reservation headroom have no limit",
    )
    failover_after_s: float | None = Field(
        3600.0,
        ge=0,
        description="an on-demand or flex-start task in a capacity wait this long (since GKE first refused it on its "
        "cluster; at once after flex-start nodes not delivered within capacity_budget_s) moves to a cluster of its TPU "
        "type in another zone whose queue for the topology is empty and that has not refused it (each such cluster "
        "once); null: never",
    )
    reservation_hold_after_s: float | None = Field(
        1800.0,
        gt=0,
        description="a task ClusterBusy this long for its cluster's reservation holds the room its slice needs: "
        "tasks of other topologies submitted after it claim only what is left beyond that room, and their idle "
        "reservation pools are not kept for hand-over while the room is short (null: never held)",
    )
    submit_budget_s: float = Field(
        600.0, gt=0, description="a Job submission refused for now (5xx, timeouts) is retried this long, then JobSubmitFailed"
    )
    # --- the acquisition slot and a contested wait for nodes (docs/architecture.md)
    strict_slot: bool = Field(
        False,
        description="the original rule: at most one task of a queue between its pick and Running, hand-overs "
        "included; false: the slot serializes acquiring new capacity only, and a waiting task takes an idle pool "
        "of its topology whose nodes are Ready while the slot holder waits for GKE",
    )
    slot_per_supply: bool = Field(
        False,
        description="each supply mode of a queue has its own acquisition slot: a task waiting for reservation room, "
        "or for GKE's flex-start or on-demand capacity, does not hold back a task of the queue that would take another "
        "supply (other capacity); false (the default): one slot for the queue whatever the supply; ignored with "
        "strict_slot. It starts most tasks sooner and the largest slices on a shared reservation later "
        "(docs/bench/timings.md)",
    )
    reservation_room_first: bool = Field(
        False,
        description="a reservation task whose reservation has room for its slice now creates its own pool rather "
        "than take an idle pool of another supply short of nodes (or wait for the create of one an aborted task "
        "began), which would wait for that supply's capacity; false (the default): it takes the pool. It shortens "
        "the waits where flex-start capacity takes an hour and lengthens them where it comes in minutes "
        "(docs/bench/timings.md)",
    )
    capacity_waits_per_queue: int = Field(
        1,
        ge=1,
        description="how many tasks of a queue may wait at once for GKE to deliver flex-start capacity to a pool it "
        "has created (no node yet, capacity_wait_park_s after the pool's create): such a wait no longer holds the "
        "slot, so the next task may start its own create; 1 (the default): the slot is held until Running; ignored "
        "with strict_slot. More helps where flex-start capacity is slow but plentiful and hurts where the cluster's "
        "chips are scarce (docs/bench/timings.md)",
    )
    capacity_wait_park_s: float = Field(
        300.0,
        ge=0,
        description="a flex-start task whose created pool has had no node for this long parks its capacity wait "
        "(capacity_waits_per_queue) and lets the slot go",
    )
    contested_wait_s: float = Field(
        600.0,
        gt=0,
        description="a pool that holds part of its nodes this long after its first node came, while a task of another "
        "topology waits on the cluster, is given back and its task goes to the head of its queue (pool_release_limit)",
    )
    pool_release_limit: int = Field(
        3,
        ge=0,
        description="a task gives a pool back (its create past node_pool_timeout_s, or its nodes contested past "
        "contested_wait_s) and goes to the head of its queue this many times; the next time it ends Failed "
        "(NodePoolTimeout for a create, NodePoolFailed for nodes: the fleet's capacity, not the task)",
    )
    # --- idle pools: kept after their task ended (docs/bench/keep-alive.md measures the choices)
    idle_pool_handover: bool = Field(
        True,
        description="keep a pool whose task ended while more tasks of its topology wait for a pool than there are "
        "idle ones (the hand-over); false: every pool is deleted as soon as its task no longer needs it, and the "
        "keep_idle_* windows are not used",
    )
    keep_idle_reservation_s: float = Field(
        0.0,
        ge=0,
        le=86400,
        description="a reservation pool nobody waits for is kept Idle this many seconds after it went idle, then "
        "deleted; given up at once when a task of another topology of the cluster waits (0: deleted at once)",
    )
    keep_idle_on_demand_s: float = Field(
        0.0, ge=0, le=86400, description="the same window for on-demand pools (0: deleted at once)"
    )
    keep_idle_flex_start_s: float = Field(
        0.0, ge=0, le=86400, description="the same window for flex-start pools (0: deleted at once)"
    )
    keep_idle_reacquire_factor: float = Field(
        0.0,
        ge=0,
        le=4,
        description="a pool nobody waits for is also kept Idle for this many times what it took to get it (its "
        "lease's create request to its nodes Ready: the cluster's queue of node-pool operations, the create, "
        "flex-start capacity, registration), at most keep_idle_max_s: the break-even of keeping against getting "
        "it again; such a pool is given up at once when a task of another topology of the cluster waits "
        "(0: only the keep_idle_* windows)",
    )
    keep_idle_max_s: float = Field(
        4 * 3600.0, ge=0, le=86400, description="the longest window keep_idle_reacquire_factor gives a pool"
    )

    # --- disruptions (the fleet ended a run: maintenance, repair, reclaim)
    max_recoveries: int = Field(
        3, ge=0, le=100, description="new attempts after the fleet disrupted a task's run, unless its spec says max_recoveries; past them Failed/Disrupted"
    )
    disruption_grace_s: float = Field(
        60.0, gt=0, description="a Running task whose pods are not all ready while nodes under them are NotReady or gone is recovered after this long"
    )
    recovery_pool_wait_s: float = Field(
        3600.0, gt=0, description="a recovering task waits this long for its pool's nodes to come back, then acquires a new pool (ahead of the queue)"
    )
    # --- calls between actors
    actor_call_timeout_s: float = Field(
        60.0, gt=0, description="QueueActor: longest wait for one call to its ClusterActor (observe, pools, Jobs)"
    )
    submit_call_timeout_s: float = Field(
        120.0, gt=0, description="QueueActor: longest wait for one Job submission through its ClusterActor"
    )
    # --- database
    db_connect_timeout_s: float = Field(10.0, gt=0, description="MySQL/MariaDB: longest wait to open a connection")
    db_read_timeout_s: float = Field(
        30.0, gt=0, description="MySQL/MariaDB: longest wait for one answer of the server (a hung connection fails, is replaced and the call retried)"
    )
    db_write_timeout_s: float = Field(30.0, gt=0, description="MySQL/MariaDB: longest wait to send one statement to the server")
    # --- Kubernetes
    watch_timeout_s: int = Field(300, gt=0, description="server-side timeout of one Job watch request")
    # --- endpoints (empty: Google's production endpoints)
    gke_endpoint: str | None = Field(None, description="GKE API endpoint override (the simulated fleet)")
    compute_endpoint: str | None = Field(None, description="Compute API endpoint override")
    metadata_host: str | None = Field(
        None, description="GCE/GKE metadata server host:port override for google.auth.default()"
    )
    kubernetes_scheme: str = Field("https", pattern="^https?$", description="scheme of the edge clusters' API")
    api_retry_timeout_s: float = Field(30.0, gt=0, description="total retry budget of one GKE, Compute or Kubernetes call")
    # --- process
    installation: str = Field(
        "default",
        pattern=r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$",
        description="this controller's mark on its pools and Jobs; installations sharing a cluster never touch each other's",
    )
    namespace: str = Field("falcon", description="Ray namespace of the actors")
    actor_resource: str = Field(
        "",
        pattern=r"^([A-Za-z_][A-Za-z0-9_]*)?$",
        description="custom Ray resource every ClusterActor and QueueActor asks for (0.001 of it), so they run only on "
        "nodes that advertise it (the worker group of deploy/kuberay-workers); empty: no custom resource, any node",
    )
    leader_ttl_s: float = Field(15.0, gt=0, description="leader lease lifetime; renewed every third of it")
    registry_interval_s: float = Field(5.0, gt=0, description="supervisor: seconds between registry reconciles; a busy QueueActor re-reads the registry (cluster status, reservation) as often")
    health_port: int = Field(
        8088, ge=0, le=65535, description="`falcon-ray run`: port of /healthz, /readyz and the read API /v1 (docs/api.md; 0 = off)"
    )
    api_token_file: str | None = Field(
        None,
        min_length=1,
        description="file holding the bearer token the read API's /v1 requires (read again when it changes; "
        "unreadable: /v1 answers 503); null: /v1 is open. /healthz and /readyz never need it",
    )
    lang: str = Field("en", pattern="^(en|zh)$", description="language of task Messages")
    # --- limits of the waits (falcon_ray.limits is the table; node_pool_timeout_s and
    # submit_budget_s above are two of them)
    intake_limit_s: float = Field(
        300.0, gt=0, description="health: a Pending task the poller has not assigned this long is listed"
    )
    waiting_limit_s: float = Field(86400.0, gt=0, description="health: a task Waiting this long is listed")
    reservation_wait_limit_s: float | None = Field(
        None, gt=0, description="ClusterBusy for reservation headroom this long -> Failed/NodePoolFailed (null: no limit)"
    )
    waiting_for_node_limit_s: float = Field(
        21600.0,
        gt=0,
        description="not read: WaitingForNode is bounded by capacity_budget_s (kept so settings files that set it still load)",
    )
    aborting_limit_s: float = Field(600.0, gt=0, description="health: a task Aborting this long is listed")

    def idle_seconds(self, mode: SupplyMode | str) -> int:
        """The autoscaler idle time of a pool, by the supply mode it was created with."""
        return {
            SupplyMode.RESERVATION: self.reservation_idle_s,
            SupplyMode.ON_DEMAND: self.on_demand_idle_s,
            SupplyMode.FLEX_START: self.flex_start_idle_s,
        }[SupplyMode(mode)]

    def keep_idle_s(self, mode: SupplyMode | str) -> float:
        """How long a pool nobody waits for is kept Idle, by its supply mode (0: not kept)."""
        if not self.idle_pool_handover:
            return 0.0
        return {
            SupplyMode.RESERVATION: self.keep_idle_reservation_s,
            SupplyMode.ON_DEMAND: self.keep_idle_on_demand_s,
            SupplyMode.FLEX_START: self.keep_idle_flex_start_s,
        }[SupplyMode(mode)]

    def capacity_retry_after_s(self, refusals: int) -> float:
        """The wait after the ``refusals``-th capacity refusal: first, x factor each time, capped."""
        exponent = max(0, refusals - 1)
        return min(self.capacity_retry_first_s * self.capacity_retry_factor**exponent, self.capacity_retry_max_s)

    def workload_policy(self, topology: str) -> str:
        """The TPU7x workload policy's name for a topology."""
        return self.v7x_workload_policy.format(topology=topology)


class SettingsError(ValueError):
    """The settings file cannot be used; the message says which file and key, in one line."""


def load_settings(path: str | Path | None = None, **overrides: object) -> Settings:
    data: dict = {}
    where = str(path) if path else "settings"
    if path:
        try:
            loaded = yaml.safe_load(Path(path).read_text()) or {}
        except (OSError, UnicodeDecodeError, yaml.YAMLError) as e:
            raise SettingsError(f"{where}: not readable YAML: {' '.join(str(e).split())[:300]}") from None
        if not isinstance(loaded, dict):
            raise SettingsError(f"{path}: settings must be a YAML mapping")
        data.update(loaded)
    data.update({k: v for k, v in overrides.items() if v is not None})
    try:
        return Settings(**{str(k): v for k, v in data.items()})
    except ValidationError as e:
        parts = [f"{'.'.join(str(x) for x in err['loc']) or 'settings'}: {err['msg']}" for err in e.errors(include_url=False)]
        raise SettingsError(f"{where}: {'; '.join(parts)}"[:1000]) from None
