"""The GKE and Compute APIs as Falcon uses them: a few calls, plain results, CloudError only.

Contract
--------
- Credentials come only from ``google.auth.default(scopes=[cloud-platform])`` (Workload
  Identity on GKE; the simulated fleet's metadata server in tests and the demo). There
  is no key file, kubeconfig or token parameter; a caller may pass a credentials object
  it obtained the same way so that GKE, Compute and Kubernetes share one token.
- An endpoint override (``http://127.0.0.1:P`` for the simulated fleet) is configuration
  passed to the constructor; the code path is the same as against Google.
- Every method raises :class:`falcon_ray.errors.CloudError` and nothing else. Reads that
  find nothing return ``None`` instead of raising NOT_FOUND where the caller expects
  absence (``get_node_pool``, ``delete_node_pool``).
- Results are frozen dataclasses of plain values, safe to pickle across Ray actors.
- ``user_agent`` (``falcon_user_agent(installation, epoch)``) names the installation and
  the leader epoch the caller acts under; the Google REST clients send it first in the
  ``x-goog-api-client`` header of every request, so a request can be traced to the
  controller that made it (the fencing test reads the simulated fleet's record of it).

Retries (google.api_core.retry.Retry, exponential with jitter, configurable)
----------------------------------------------------------------------------
- Reads (get cluster / node pool / operation / reservation, list node pools): retried
  on TRANSIENT and TOO_MANY_OPERATIONS within the ``timeout`` budget.
- ``delete_node_pool``: idempotent, so retried like a read; a repeat after a lost
  response meets 404 and returns None.
- ``create_node_pool``: retried only when the request certainly did nothing: 429 (a
  refusal) and failures before the request left (connection refused, no token). A 5xx
  or read timeout is ambiguous -- the pool may exist -- so it is raised as TRANSIENT;
  the controller re-observes, and a later create of the same deterministic name meets
  ALREADY_EXISTS and adopts the pool.
- INCOMPATIBLE_OPERATION (another operation runs on the cluster, possibly for minutes)
  is raised at once from create and delete: the caller serializes the cluster's pool
  operations and knows when to try again; retrying blindly here would only block its
  thread and hammer the API.
- STOCKOUT, QUOTA_EXCEEDED and PERMANENT are never retried here (a stockout is waited
  out by the QueueActor, with its own backoff).

Import cost
-----------
``google.cloud.compute_v1``'s package ``__init__`` imports every one of its more than 100
service clients, a cost paid in CPU at every process start; Falcon uses one, ``ReservationsClient``, and every
ClusterActor process (started again after each restart) pays the import.
``_lean_compute_v1`` registers the package without running its ``__init__`` so that only
the reservations service and the shared types load; the first access to any other name
of the package (``compute_v1.Instance``) runs the real ``__init__`` then, so other code in
the same process sees the whole package as usual. Even that lean load (the shared types)
waits for the first ``ComputeApi``: a ClusterActor builds one only for a
cluster with a default reservation, the one thing it reads from Compute.
"""

from __future__ import annotations

import base64
import binascii
import importlib
import importlib.util
import json
import sys
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

import google.auth
from google.api_core.client_options import ClientOptions
from google.api_core.gapic_v1.client_info import ClientInfo
from google.api_core.retry import Retry
from google.cloud import container_v1

from falcon_ray import render
from falcon_ray.errors import CloudError, ErrorKind, classify, from_rpc_status, request_not_sent

_LEAN_LOCK = threading.RLock()  # the lean package's loads, one thread at a time


def _lean_compute_v1() -> None:
    """Register ``google.cloud.compute_v1`` unexecuted; its ``__init__`` runs on the first
    access of a name that is not a submodule (see "Import cost"). Thread-safe: a ClusterActor's
    threads (an actor call, its watch loop) may build their first ``ComputeApi`` at once, and a
    name read while another thread runs the ``__init__`` waits for it instead of finding the
    package half-built."""
    name = "google.cloud.compute_v1"
    with _LEAN_LOCK:
        if name in sys.modules:
            return
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return  # not installed: the import below fails with the usual error
        pkg = importlib.util.module_from_spec(spec)
        loader = spec.loader
        state = {"running": False}

        def load_on_access(attr: str) -> Any:
            with _LEAN_LOCK:
                if attr in pkg.__dict__:  # bound while this thread waited
                    return pkg.__dict__[attr]
                if importlib.util.find_spec(f"{name}.{attr}") is not None:
                    return importlib.import_module(f"{name}.{attr}")  # a submodule: no need for the rest
                if state["running"] or "__getattr__" not in pkg.__dict__:
                    raise AttributeError(f"module {name!r} has no attribute {attr!r}")
                state["running"] = True
                try:
                    loader.exec_module(pkg)  # the whole package, as a plain import would have
                finally:
                    state["running"] = False
                pkg.__dict__.pop("__getattr__", None)
                return getattr(pkg, attr)

        pkg.__getattr__ = load_on_access  # type: ignore[attr-defined]
        sys.modules[name] = pkg
        import google.cloud

        google.cloud.compute_v1 = pkg  # type: ignore[attr-defined]
        from google.cloud.compute_v1.services.reservations import ReservationsClient

        pkg.ReservationsClient = ReservationsClient  # what the full __init__ would bind it to


CLOUD_PLATFORM_SCOPE = "https://www.googleapis.com/auth/cloud-platform"

T = TypeVar("T")


def falcon_user_agent(installation: str, epoch: int | None) -> str:
    """The product token Falcon's GKE, Compute and Kubernetes requests carry."""
    return f"falcon-ray/{installation or 'default'} epoch/{'none' if epoch is None else epoch}"


def default_credentials():
    """Application Default Credentials with the cloud-platform scope (Workload Identity)."""
    credentials, _project = google.auth.default(scopes=[CLOUD_PLATFORM_SCOPE])
    return credentials


# --- results ---------------------------------------------------------------------------


@dataclass(frozen=True)
class ClusterEndpoint:
    endpoint: str  # host[:port] of the cluster's API server, as GKE reports it
    ca_certificate_pem: str | None  # the cluster CA, decoded; None when GKE gave none
    locations: tuple[str, ...] = ()  # the zones of its nodes (Cluster.locations)


@dataclass(frozen=True)
class PoolInfo:
    """One node pool as GKE reports it (NodePool has no creation time in the v1 API)."""

    name: str
    status: str  # PROVISIONING, RUNNING, RUNNING_WITH_ERROR, RECONCILING, STOPPING, ERROR
    status_message: str
    initial_node_count: int
    max_node_count: int  # autoscaling total maximum (0 without autoscaling)
    machine_type: str
    labels: Mapping[str, str] = field(hash=False)  # Kubernetes node labels (config.labels)
    resource_labels: Mapping[str, str] = field(hash=False)  # GCE resource labels (config.resourceLabels)
    locations: tuple[str, ...]
    raw: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False, hash=False)

    @property
    def managed_by_falcon(self) -> bool:
        return self.resource_labels.get(render.LABEL_MANAGED_BY) == render.MANAGED_BY_VALUE


@dataclass(frozen=True)
class OperationInfo:
    name: str
    status: str  # PENDING, RUNNING, DONE, ABORTING
    done: bool
    error: CloudError | None  # set when a DONE operation failed
    target: str  # the target link (the node pool's self link)
    operation_type: str  # CREATE_NODE_POOL, DELETE_NODE_POOL, ...
    detail: str = ""


@dataclass(frozen=True)
class ReservationInfo:
    name: str
    count: int  # VMs reserved
    in_use: int  # VMs currently consuming it
    status: str  # CREATING, READY, UPDATING, DELETING
    machine_type: str = ""  # specificReservation.instanceProperties.machineType: the VMs it holds

    @property
    def available(self) -> int:
        return max(0, self.count - self.in_use)


# --- retry -----------------------------------------------------------------------------


@dataclass(frozen=True)
class RetrySettings:
    initial: float = 1.0  # first delay, seconds
    maximum: float = 30.0  # longest delay
    multiplier: float = 2.0
    timeout: float = 120.0  # total budget of one call, retries included
    request_timeout: float = 30.0  # one HTTP request

    def build(self, predicate: Callable[[Exception], bool]) -> Retry:
        return Retry(
            predicate=predicate,
            initial=self.initial,
            maximum=self.maximum,
            multiplier=self.multiplier,
            timeout=self.timeout,
        )


def _kinds(*kinds: ErrorKind) -> Callable[[Exception], bool]:
    wanted = frozenset(kinds)
    return lambda exc: classify(exc).kind in wanted


_READ_RETRY = _kinds(ErrorKind.TRANSIENT, ErrorKind.TOO_MANY_OPERATIONS)
_DELETE_RETRY = _READ_RETRY
_REFUSED = _kinds(ErrorKind.TOO_MANY_OPERATIONS)


def _create_retry(exc: Exception) -> bool:
    return _REFUSED(exc) or (classify(exc).kind == ErrorKind.TRANSIENT and request_not_sent(exc))


def _call(fn: Callable[[], T]) -> T:
    try:
        return fn()
    except Exception as exc:  # one place where client exceptions become CloudError
        raise classify(exc) from exc


def _retry_settings(
    retry: RetrySettings | None,
    initial: float | None,
    maximum: float | None,
    multiplier: float | None,
    timeout: float | None,
    request_timeout: float | None,
) -> RetrySettings:
    base = retry or RetrySettings()
    overrides = dict(
        initial=initial,
        maximum=maximum,
        multiplier=multiplier,
        timeout=timeout,
        request_timeout=request_timeout,
    )
    return RetrySettings(**{**base.__dict__, **{k: v for k, v in overrides.items() if v is not None}})


def _client_options(endpoint: str | None) -> ClientOptions | None:
    return ClientOptions(api_endpoint=endpoint) if endpoint else None


def _message_dict(message: Any) -> dict[str, Any]:
    return json.loads(type(message).to_json(message))


# --- GKE -------------------------------------------------------------------------------


class _RestApi:
    """A Google REST client with Falcon's retry settings; ``CLIENT`` is the client class."""

    CLIENT: Any = None

    def __init__(
        self,
        endpoint: str | None = None,
        credentials=None,
        *,
        retry: RetrySettings | None = None,
        initial: float | None = None,
        maximum: float | None = None,
        multiplier: float | None = None,
        timeout: float | None = None,
        request_timeout: float | None = None,
        user_agent: str | None = None,
    ) -> None:
        self.retry = _retry_settings(retry, initial, maximum, multiplier, timeout, request_timeout)
        extra = {"client_info": ClientInfo(user_agent=user_agent)} if user_agent else {}
        self.client = self.CLIENT(
            credentials=credentials or default_credentials(),
            transport="rest",
            client_options=_client_options(endpoint),
            **extra,
        )


class GkeApi(_RestApi):
    """GKE v1 (REST transport): cluster endpoint, node pools and their operations."""

    CLIENT = container_v1.ClusterManagerClient

    @staticmethod
    def _cluster_path(project: str, location: str, cluster: str) -> str:
        return f"projects/{project}/locations/{location}/clusters/{cluster}"

    def _kw(self, predicate: Callable[[Exception], bool]) -> dict[str, Any]:
        return {"retry": self.retry.build(predicate), "timeout": self.retry.request_timeout}

    def get_cluster(self, project: str, location: str, name: str) -> ClusterEndpoint:
        cluster = _call(
            lambda: self.client.get_cluster(
                name=self._cluster_path(project, location, name), **self._kw(_READ_RETRY)
            )
        )
        return ClusterEndpoint(
            cluster.endpoint, _decode_ca(cluster.master_auth.cluster_ca_certificate), tuple(cluster.locations)
        )

    def create_node_pool(self, project: str, location: str, cluster: str, pool: Mapping[str, Any]) -> str:
        """Start creating ``pool`` (GKE REST JSON, as render.node_pool_request returns it);
        returns the operation's name."""
        try:
            node_pool = container_v1.NodePool.from_json(json.dumps(pool))
        except Exception as exc:  # a malformed request is our bug, not the API's
            raise CloudError(ErrorKind.PERMANENT, f"invalid node pool request: {exc}") from exc
        request = container_v1.CreateNodePoolRequest(
            parent=self._cluster_path(project, location, cluster), node_pool=node_pool
        )
        operation = _call(lambda: self.client.create_node_pool(request=request, **self._kw(_create_retry)))
        return operation.name

    def get_node_pool(self, project: str, location: str, cluster: str, name: str) -> PoolInfo | None:
        path = f"{self._cluster_path(project, location, cluster)}/nodePools/{name}"
        try:
            pool = _call(lambda: self.client.get_node_pool(name=path, **self._kw(_READ_RETRY)))
        except CloudError as e:
            if e.kind == ErrorKind.NOT_FOUND:
                return None
            raise
        return _pool_info(pool)

    def list_node_pools(self, project: str, location: str, cluster: str) -> list[PoolInfo]:
        parent = self._cluster_path(project, location, cluster)
        response = _call(lambda: self.client.list_node_pools(parent=parent, **self._kw(_READ_RETRY)))
        return [_pool_info(p) for p in response.node_pools]

    def delete_node_pool(self, project: str, location: str, cluster: str, name: str) -> str | None:
        """Start deleting a pool; the operation's name, or None when it is already gone."""
        path = f"{self._cluster_path(project, location, cluster)}/nodePools/{name}"
        try:
            operation = _call(lambda: self.client.delete_node_pool(name=path, **self._kw(_DELETE_RETRY)))
        except CloudError as e:
            if e.kind == ErrorKind.NOT_FOUND:
                return None
            raise
        return operation.name

    def get_operation(self, project: str, location: str, operation: str) -> OperationInfo:
        path = (
            operation
            if "/" in operation
            else f"projects/{project}/locations/{location}/operations/{operation}"
        )
        op = _call(lambda: self.client.get_operation(name=path, **self._kw(_READ_RETRY)))
        status = container_v1.Operation.Status(op.status).name
        done = op.status == container_v1.Operation.Status.DONE
        error: CloudError | None = None
        if done and (op.error.code or op.error.message):
            error = classify(op.error)
        elif done and op.status_message:  # older servers report failures only here
            error = from_rpc_status(2, op.status_message)  # UNKNOWN: the text decides
        return OperationInfo(
            name=op.name,
            status=status,
            done=done,
            error=error,
            target=op.target_link,
            operation_type=container_v1.Operation.Type(op.operation_type).name,
            detail=op.detail,
        )

    def close(self) -> None:
        self.client.transport.close()


def _decode_ca(data: str) -> str | None:
    if not data:
        return None
    try:
        return base64.b64decode(data).decode()
    except (binascii.Error, UnicodeDecodeError):
        return data if "BEGIN CERTIFICATE" in data else None


def _pool_info(pool: container_v1.NodePool) -> PoolInfo:
    return PoolInfo(
        name=pool.name,
        status=container_v1.NodePool.Status(pool.status).name,
        status_message=pool.status_message,
        initial_node_count=pool.initial_node_count,
        max_node_count=pool.autoscaling.total_max_node_count or pool.autoscaling.max_node_count,
        machine_type=pool.config.machine_type,
        labels=dict(pool.config.labels),
        resource_labels=dict(pool.config.resource_labels),
        locations=tuple(pool.locations),
        raw=_message_dict(pool),
    )


# --- Compute ---------------------------------------------------------------------------


class ComputeApi(_RestApi):
    """Compute Engine reservations (REST): how much of a reservation is free."""

    CLIENT: Any = None  # compute_v1.ReservationsClient, loaded by the first ComputeApi

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        if ComputeApi.CLIENT is None:  # the package, lean, on first use
            with _LEAN_LOCK:
                _lean_compute_v1()
                from google.cloud import compute_v1

                ComputeApi.CLIENT = compute_v1.ReservationsClient
        super().__init__(*args, **kwargs)

    def reservation(self, project: str, zone: str, name: str) -> ReservationInfo:
        """A specific reservation's size and use; NOT_FOUND raises (a registry error).
        ``project`` is the reservation's owner: for a reservation shared from another
        project (``projects/P/reservations/R`` in the registry) that is P, not the cluster's."""
        res = _call(
            lambda: self.client.get(
                project=project,
                zone=zone,
                reservation=name,
                retry=self.retry.build(_READ_RETRY),
                timeout=self.retry.request_timeout,
            )
        )
        specific = res.specific_reservation
        return ReservationInfo(
            name=res.name or name,
            count=int(specific.count),
            in_use=int(specific.in_use_count),
            status=res.status,
            machine_type=specific.instance_properties.machine_type or "",
        )

    def close(self) -> None:
        self.client.transport.close()


class ResourcePolicyApi(_RestApi):
    """Compute Engine resource policies (REST): whether a TPU7x workload policy exists.

    Loaded only by a ClusterActor that creates a pool naming a workload policy
    (``placementPolicy.policyName``); lean like ``ComputeApi``."""

    CLIENT: Any = None  # compute_v1 ResourcePoliciesClient, loaded by the first ResourcePolicyApi

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        if ResourcePolicyApi.CLIENT is None:
            _lean_compute_v1()
            from google.cloud.compute_v1.services.resource_policies import ResourcePoliciesClient

            ResourcePolicyApi.CLIENT = ResourcePoliciesClient
        super().__init__(*args, **kwargs)

    def get(self, project: str, region: str, name: str) -> dict[str, Any] | None:
        """The resource policy as Compute's JSON (camelCase: ``name``, ``workloadPolicy``
        ``{type, acceleratorTopology}``, ``status``), or None when it does not exist."""
        try:
            policy = _call(
                lambda: self.client.get(
                    project=project,
                    region=region,
                    resource_policy=name,
                    retry=self.retry.build(_READ_RETRY),
                    timeout=self.retry.request_timeout,
                )
            )
        except CloudError as e:
            if e.kind == ErrorKind.NOT_FOUND:
                return None
            raise
        return _message_dict(policy)

    def close(self) -> None:
        self.client.transport.close()
