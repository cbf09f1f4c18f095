"""An edge cluster's Kubernetes API as Falcon uses it: Jobs, Services, Pods, Nodes and one Job watch.

Contract
--------
- ``api_client(endpoint, ca_pem, credentials)`` builds a client that authenticates with
  the google-auth credentials' OAuth token (no kubeconfig, no static token). A
  ``refresh_api_key_hook`` runs before every request and refreshes the credentials when
  google-auth no longer calls them valid; a 401 additionally forces a refresh before the
  call is retried. The endpoint is ``host[:port]`` as GKE reports it; an endpoint that
  already has a scheme keeps it, otherwise ``scheme`` (https, or http for the simulated
  fleet) is used, and the cluster CA verifies https. ``user_agent`` replaces the client's
  default ``User-Agent`` (Falcon sends ``gcp.falcon_user_agent(...)``).
- :class:`KubeApi` raises :class:`falcon_ray.errors.CloudError` only, returns plain
  values and frozen, picklable dataclasses, and is idempotent where the controller needs
  it: ``create_job`` meeting 409 adopts the existing Job when it carries the same task-id
  label; deletes of absent objects return False. Idempotent calls are retried with
  google.api_core.retry on TRANSIENT and TOO_MANY_OPERATIONS; creates too, because a
  repeat of a create meets 409 and adopts.
- :class:`JobWatcher` keeps one list+watch of the Falcon-labelled Jobs in a namespace
  alive for as long as it runs, and never dies on an error: it lists (emitting every Job
  and, for the consumer to notice deletions, the whole list), then watches from the
  list's resourceVersion with bookmarks and a bounded server timeout; it reconnects from
  the newest resourceVersion it saw (events and BOOKMARKs) when a stream ends or drops,
  re-lists on 410 Gone, and backs off exponentially with jitter on other errors.
  ``reconnects``, ``relists``, ``errors``, ``last_event_at`` and ``last_ok_at`` show how
  it is doing.
- Transport: every call goes through ``KubeApi._json`` (a body the caller owns) or
  ``KubeApi._borrowed_json`` (a body the caller reads at once and neither changes nor keeps
  any part of; over HTTP the two are the same call). A subclass answering in process may
  override ``_borrowed_json`` to hand out its own objects uncopied.

Job phases (``JobObservation.phase``)
-------------------------------------
Succeeded: condition Complete (or SuccessCriteriaMet) is True. Failed: condition Failed
(or FailureTarget) is True. Running: every expected pod is ready (``status.ready >=
completions``; servers that do not report ``ready`` are judged by ``active``), which is
the original's "Pod running, resources in hand". Pending: anything else. Deleted: the
Job is gone (a DELETED watch event).
"""

from __future__ import annotations

import datetime as dt
import functools
import json
import logging
import random
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import google.auth.transport.requests
from google.api_core.retry import Retry
from kubernetes import client, watch

from falcon_ray.clock import SYSTEM, Clock
from falcon_ray.errors import CloudError, ErrorKind, classify
from falcon_ray.model import NodeState, PodEnd, RunEvidence
from falcon_ray.render import CONTAINER_NAME, LABEL_TASK_ID, MANAGED_SELECTOR, job_attempt
from falcon_ray.tpu import NODEPOOL_LABEL

log = logging.getLogger(__name__)

TERMINAL_PHASES = frozenset({"Succeeded", "Failed", "Deleted"})


# --- authentication --------------------------------------------------------------------


class BearerTokenHook:
    """``Configuration.refresh_api_key_hook``: keep the OAuth token in ``api_key`` fresh.

    The kubernetes client calls the hook only when ``api_key`` already holds an
    ``authorization`` entry, so ``api_client`` seeds one. Thread-safe: the watch thread
    and the actor's calls share one configuration.
    """

    def __init__(self, credentials) -> None:
        self.credentials = credentials
        self.refreshes = 0
        self._lock = threading.Lock()
        self._request = google.auth.transport.requests.Request()

    def __call__(self, configuration: client.Configuration) -> None:
        with self._lock:
            if not self.credentials.valid:
                self._refresh()
            configuration.api_key["authorization"] = self.credentials.token

    def force_refresh(self) -> None:
        """Refresh now (the server refused the token although google-auth still trusted it)."""
        with self._lock:
            self._refresh()

    def _refresh(self) -> None:
        self.credentials.refresh(self._request)
        self.refreshes += 1


def api_client(
    endpoint: str, ca_certificate_pem: str | None, credentials, *, scheme: str = "https", user_agent: str | None = None
) -> client.ApiClient:
    if credentials is None:
        from falcon_ray.gcp import default_credentials

        credentials = default_credentials()
    host = endpoint if "://" in endpoint else f"{scheme}://{endpoint}"
    configuration = client.Configuration(
        host=host.rstrip("/"),
        api_key={"authorization": "pending"},  # replaced by the hook before every request
        api_key_prefix={"authorization": "Bearer"},
    )
    if host.startswith("https://") and ca_certificate_pem:
        configuration.ca_cert_data = ca_certificate_pem
    configuration.refresh_api_key_hook = BearerTokenHook(credentials)
    api = client.ApiClient(configuration)
    if user_agent:  # the Kubernetes audit log records it (``userAgent``)
        api.user_agent = user_agent
    return api


# --- results ---------------------------------------------------------------------------


@dataclass(frozen=True)
class JobRef:
    name: str
    namespace: str
    uid: str
    created: bool  # False: an existing Job of the same task was adopted


@dataclass(frozen=True)
class JobObservation:
    task_id: int | None  # from the falcon.dev/task-id label; None when absent or malformed
    name: str
    uid: str
    namespace: str
    phase: str  # Pending | Running | Succeeded | Failed | Deleted
    active: int
    ready: int
    succeeded: int
    failed: int
    expected: int  # spec.completions
    message: str  # the deciding condition's text; pod-level detail: KubeApi.job_failure_message
    resource_version: str
    labels: Mapping[str, str] = field(default_factory=dict, hash=False)
    node_pool: str = ""  # the pool its pods select (cloud.google.com/gke-nodepool)
    attempt: int = 0  # which run of its task (falcon.dev/attempt)
    deleting: bool = False  # metadata.deletionTimestamp is set: a delete is under way

    @property
    def terminal(self) -> bool:
        return self.phase in TERMINAL_PHASES

    @classmethod
    def from_job(cls, job: Mapping[str, Any], *, deleted: bool = False) -> JobObservation:
        meta = job.get("metadata") or {}
        spec = job.get("spec") or {}
        status = job.get("status") or {}
        labels = dict(meta.get("labels") or {})
        try:
            task_id: int | None = int(labels.get(LABEL_TASK_ID, ""))
        except ValueError:
            task_id = None
        expected = int(spec.get("completions") or 1)
        active = int(status.get("active") or 0)
        ready = int(status.get("ready") if status.get("ready") is not None else active)
        conditions = {c.get("type"): c for c in status.get("conditions") or [] if c.get("status") == "True"}
        message = ""
        if deleted:
            phase = "Deleted"
        elif "Complete" in conditions or "SuccessCriteriaMet" in conditions:
            phase = "Succeeded"
        elif "Failed" in conditions or "FailureTarget" in conditions:
            phase = "Failed"
            cond = conditions.get("Failed") or conditions["FailureTarget"]
            message = _reason_message(cond.get("reason"), cond.get("message"))
        elif ready >= expected:
            phase = "Running"
        else:
            phase = "Pending"
        return cls(
            task_id=task_id,
            name=str(meta.get("name") or ""),
            uid=str(meta.get("uid") or ""),
            namespace=str(meta.get("namespace") or ""),
            phase=phase,
            active=active,
            ready=ready,
            succeeded=int(status.get("succeeded") or 0),
            failed=int(status.get("failed") or 0),
            expected=expected,
            message=message,
            resource_version=str(meta.get("resourceVersion") or ""),
            labels=labels,
            node_pool=str((((spec.get("template") or {}).get("spec") or {}).get("nodeSelector") or {}).get(NODEPOOL_LABEL, "")),
            attempt=job_attempt(labels, str(meta.get("name") or "")),
            deleting=bool(meta.get("deletionTimestamp")),
        )


@dataclass(frozen=True)
class NodeInfo:
    name: str
    pool: str  # cloud.google.com/gke-nodepool
    ready: bool
    created: dt.datetime | None = None  # metadata.creationTimestamp, naive UTC: when the VM came


@dataclass(frozen=True)
class PodInfo:
    name: str
    phase: str  # Pending | Running | Succeeded | Failed | Unknown
    node_name: str
    ready: bool
    reason: str  # the first container's waiting/terminated reason, else the pod's reason
    message: str


def _reason_message(reason: Any, message: Any) -> str:
    reason, message = str(reason or ""), str(message or "")
    if reason and message:
        return f"{reason}: {message}"
    return reason or message


def _condition_true(obj: Mapping[str, Any], kind: str) -> bool:
    return any(
        c.get("type") == kind and c.get("status") == "True"
        for c in (obj.get("status") or {}).get("conditions") or []
    )


def _pod_info(pod: Mapping[str, Any]) -> PodInfo:
    status = pod.get("status") or {}
    reason, message = str(status.get("reason") or ""), str(status.get("message") or "")
    for cs in status.get("containerStatuses") or []:
        state = cs.get("state") or {}
        detail = state.get("waiting") or state.get("terminated")
        if detail and detail.get("reason"):
            reason, message = str(detail.get("reason")), str(detail.get("message") or "")
            break
    return PodInfo(
        name=str((pod.get("metadata") or {}).get("name") or ""),
        phase=str(status.get("phase") or "Unknown"),
        node_name=str((pod.get("spec") or {}).get("nodeName") or ""),
        ready=_condition_true(pod, "Ready"),
        reason=reason,
        message=message,
    )


def _failure_of_pod(pod: Mapping[str, Any]) -> tuple[str, str] | None:
    """(sort key, text) of a pod's container failure, or of the pod's own failure reason."""
    name = (pod.get("metadata") or {}).get("name") or "?"
    status = pod.get("status") or {}
    for statuses in (status.get("containerStatuses"), status.get("initContainerStatuses")):
        for cs in statuses or []:
            term = (cs.get("state") or {}).get("terminated") or (cs.get("lastState") or {}).get("terminated")
            if not term:
                continue
            code = int(term.get("exitCode") or 0)
            reason = str(term.get("reason") or "")
            if code == 0 and reason in ("", "Completed"):
                continue
            who = (
                f"Pod {name}"
                if cs.get("name") in (CONTAINER_NAME, None)
                else f"Pod {name} container {cs['name']}"
            )
            text = f"{who} terminated: {reason or 'Error'} (exit code {code})"
            if term.get("message"):
                text += f": {str(term['message']).strip()}"
            return str(term.get("finishedAt") or "~"), text
    if status.get("phase") == "Failed" and (status.get("reason") or status.get("message")):
        return "~", f"Pod {name} failed: {_reason_message(status.get('reason'), status.get('message'))}"
    return None


# GKE's marks of host maintenance on a node ("Manage GKE node disruption for GPUs and TPUs"):
# the scheduled time and the maintenance in progress as labels, and the taint it adds
# before it drains the node.
MAINTENANCE_LABELS = ("cloud.google.com/scheduled-maintenance-time", "cloud.google.com/active-node-maintenance")
MAINTENANCE_TAINTS = ("cloud.google.com/impending-node-termination", "cloud.google.com/active-node-maintenance")


def _pod_end(pod: Mapping[str, Any]) -> PodEnd:
    """A pod as ``faults.classify`` reads it: where it ran, whether the fleet took it
    (``DisruptionTarget``), how its task's container ended or why it never started."""
    info = _pod_info(pod)
    status = pod.get("status") or {}
    disruption = next(
        (
            _reason_message(c.get("reason"), c.get("message"))
            for c in status.get("conditions") or []
            if c.get("type") == "DisruptionTarget" and c.get("status") == "True"
        ),
        "",
    )
    code: int | None = None
    for cs in status.get("containerStatuses") or []:
        term = (cs.get("state") or {}).get("terminated") or (cs.get("lastState") or {}).get("terminated")
        if term is not None and cs.get("name") in (CONTAINER_NAME, None):
            code = int(term.get("exitCode") or 0)
    return PodEnd(
        name=info.name, node=info.node_name, phase=info.phase, disruption=disruption or "",
        exit_code=code, reason=info.reason, message=info.message[:300],
    )


def _node_state(node: Mapping[str, Any]) -> NodeState:
    meta, spec = node.get("metadata") or {}, node.get("spec") or {}
    labels = meta.get("labels") or {}
    taints = {str(t.get("key") or "") for t in spec.get("taints") or []}
    return NodeState(
        name=str(meta.get("name") or ""),
        ready=_condition_true(node, "Ready"),
        maintenance=any(k in labels for k in MAINTENANCE_LABELS) or bool(taints & set(MAINTENANCE_TAINTS)),
        unschedulable=bool(spec.get("unschedulable")),
    )


# --- the API ---------------------------------------------------------------------------

_RETRYABLE = frozenset({ErrorKind.TRANSIENT, ErrorKind.TOO_MANY_OPERATIONS})


class KubeApi:
    """Jobs, Services, Pods and Nodes of one cluster; CloudError only."""

    def __init__(
        self,
        api: client.ApiClient,
        *,
        request_timeout: float = 30.0,
        retry_initial: float = 0.5,
        retry_maximum: float = 10.0,
        retry_timeout: float = 30.0,
    ) -> None:
        self.api_client = api
        self.batch = client.BatchV1Api(api)
        self.core = client.CoreV1Api(api)
        self.request_timeout = request_timeout
        self._retry = Retry(
            predicate=lambda exc: classify(exc).kind in _RETRYABLE,
            initial=retry_initial,
            maximum=retry_maximum,
            multiplier=2.0,
            timeout=retry_timeout,
            on_error=self._on_error,
        )

    # -- plumbing
    @property
    def token_hook(self) -> BearerTokenHook | None:
        hook = self.api_client.configuration.refresh_api_key_hook
        return hook if isinstance(hook, BearerTokenHook) else None

    def refresh_credentials(self) -> None:
        hook = self.token_hook
        if hook is not None:
            try:
                hook.force_refresh()
            except Exception as exc:
                log.warning("token refresh failed: %s", exc)

    def _on_error(self, exc: Exception) -> None:
        if classify(exc).status_code == 401:
            self.refresh_credentials()

    def _json(self, call: Callable[..., Any], *args: Any, **kwargs: Any) -> dict[str, Any]:
        """Call one API method (retried), returning the response body as a dict."""

        def once() -> dict[str, Any]:
            response = call(*args, _preload_content=False, _request_timeout=self.request_timeout, **kwargs)
            try:
                return json.loads(response.data or b"{}")
            finally:
                response.release_conn()

        try:
            return self._retry(once)()
        except Exception as exc:
            raise classify(exc) from exc

    def _borrowed_json(self, call: Callable[..., Any], *args: Any, **kwargs: Any) -> dict[str, Any]:
        """``_json`` for a caller that only reads the body, before its next API call, and keeps
        no part of it (what it keeps is built of str, int, bool and other immutable values)."""
        return self._json(call, *args, **kwargs)

    def _absent_ok(self, call: Callable[..., Any], *args: Any, **kwargs: Any) -> dict[str, Any] | None:
        try:
            return self._json(call, *args, **kwargs)
        except CloudError as e:
            if e.kind == ErrorKind.NOT_FOUND:
                return None
            raise

    # -- Jobs
    def create_job(self, manifest: Mapping[str, Any]) -> JobRef:
        meta = manifest["metadata"]
        namespace, name = meta["namespace"], meta["name"]
        try:
            job = self._borrowed_json(self.batch.create_namespaced_job, namespace, dict(manifest))
            return JobRef(name, namespace, str(job.get("metadata", {}).get("uid") or ""), True)
        except CloudError as e:
            if e.kind != ErrorKind.ALREADY_EXISTS:
                raise
        existing = self.get_job(namespace, name)
        if existing is None:
            raise CloudError(
                ErrorKind.TRANSIENT, f"Job {namespace}/{name} already existed but is gone now", 409
            )
        want = (meta.get("labels") or {}).get(LABEL_TASK_ID)
        have = ((existing.get("metadata") or {}).get("labels") or {}).get(LABEL_TASK_ID)
        if want != have:
            raise CloudError(
                ErrorKind.ALREADY_EXISTS,
                f"Job {namespace}/{name} already exists and belongs to task {have or 'unknown'}",
                409,
                "AlreadyExists",
            )
        return JobRef(name, namespace, str(existing["metadata"].get("uid") or ""), False)

    def get_job(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self._absent_ok(self.batch.read_namespaced_job, name, namespace)

    def delete_job(self, namespace: str, name: str, propagation: str = "Background") -> bool:
        """Delete a Job and (propagation Background/Foreground) its pods; False when absent."""
        return (
            self._absent_ok(self.batch.delete_namespaced_job, name, namespace, propagation_policy=propagation)
            is not None
        )

    def list_jobs(
        self, namespace: str, label_selector: str = MANAGED_SELECTOR
    ) -> tuple[list[JobObservation], str]:
        body = self._borrowed_json(self.batch.list_namespaced_job, namespace, label_selector=label_selector)
        jobs = [JobObservation.from_job(j) for j in body.get("items") or []]
        return jobs, str((body.get("metadata") or {}).get("resourceVersion") or "")

    # -- Services
    def create_service(self, manifest: Mapping[str, Any]) -> bool:
        """Create a Service; False when one of that name already exists."""
        meta = manifest["metadata"]
        try:
            self._borrowed_json(self.core.create_namespaced_service, meta["namespace"], dict(manifest))
            return True
        except CloudError as e:
            if e.kind == ErrorKind.ALREADY_EXISTS:
                return False
            raise

    def delete_service(self, namespace: str, name: str) -> bool:
        return self._absent_ok(self.core.delete_namespaced_service, name, namespace) is not None

    # -- Pods and Nodes
    def list_pods(self, namespace: str, label_selector: str) -> list[PodInfo]:
        return [_pod_info(p) for p in self._list_pod_dicts(namespace, label_selector)]

    def _list_pod_dicts(self, namespace: str, label_selector: str) -> list[dict[str, Any]]:
        """The pods' bodies, borrowed (see ``_borrowed_json``): for this class's readers only."""
        body = self._borrowed_json(self.core.list_namespaced_pod, namespace, label_selector=label_selector)
        return list(body.get("items") or [])

    def list_nodes(self, label_selector: str | None = None) -> list[NodeInfo]:
        kwargs = {"label_selector": label_selector} if label_selector else {}
        body = self._borrowed_json(self.core.list_node, **kwargs)
        return [
            NodeInfo(
                name=str(n["metadata"]["name"]),
                pool=str((n["metadata"].get("labels") or {}).get(NODEPOOL_LABEL, "")),
                ready=_condition_true(n, "Ready"),
                created=_created(n),
            )
            for n in body.get("items") or []
        ]

    def run_evidence(self, namespace: str, job: str, pool: str, condition: str = "") -> RunEvidence:
        """What ``faults.classify`` needs of one Job's run: its pods and the nodes of its pool.
        A node list that cannot be read is marked so (then an absent node proves nothing)."""
        pods = tuple(_pod_end(p) for p in self._list_pod_dicts(namespace, f"job-name={job}"))
        try:
            body = (
                self._borrowed_json(self.core.list_node, label_selector=f"{NODEPOOL_LABEL}={pool}")
                if pool
                else {"items": []}
            )
            nodes, listed = tuple(_node_state(n) for n in body.get("items") or []), bool(pool)
        except CloudError as e:
            log.warning("nodes of pool %s: %s", pool, e)
            nodes, listed = (), False
        return RunEvidence(pods=pods, nodes=nodes, condition=condition, nodes_listed=listed)

    def job_failure_message(self, namespace: str, job: str | Mapping[str, Any]) -> str:
        """Why a Job failed, from its pods: the earliest failed container, e.g.
        ``Pod falcon-task-7-0-x2k9p terminated: OOMKilled (exit code 137)``; else the
        Job's Failed condition; else "Job failed"."""
        job_obj = self.get_job(namespace, job) if isinstance(job, str) else dict(job)
        name = job if isinstance(job, str) else str((job.get("metadata") or {}).get("name"))
        failures = [
            f for p in self._list_pod_dicts(namespace, f"job-name={name}") if (f := _failure_of_pod(p))
        ]
        if failures:
            return min(failures)[1]
        if job_obj is not None:
            observed = JobObservation.from_job(job_obj)
            if observed.message:
                return f"Job {name} failed: {observed.message}"
        return f"Job {name} failed"


# --- the watch -------------------------------------------------------------------------


class JobWatcher:
    """One list+watch of Falcon's Jobs in a namespace that survives drops, 410s and errors."""

    DROP_AFTER_S = 1.0  # a stream cut after being open this long is a drop, not a failure

    def __init__(
        self,
        kube: KubeApi,
        namespace: str,
        label_selector: str = MANAGED_SELECTOR,
        timeout_seconds: int = 300,
        *,
        on_resync: Callable[[list[JobObservation]], None] | None = None,
        resync_seconds: float | None = 900.0,
        backoff_initial: float = 0.5,
        backoff_max: float = 30.0,
        clock: Clock = SYSTEM,
        rng: random.Random | None = None,
    ) -> None:
        self.kube = kube
        self.clock = clock
        # the backoff's jitter; without one given, a generator seeded from the ``random``
        # module's (a process that seeds ``random`` replays it)
        self.rng = rng if rng is not None else random.Random(random.getrandbits(64))
        self.namespace = namespace
        self.label_selector = label_selector
        self.timeout_seconds = int(timeout_seconds)
        self.on_resync = on_resync
        self.resync_seconds = resync_seconds
        self.backoff_initial = backoff_initial
        self.backoff_max = backoff_max
        # counters and health, read by metrics and the health endpoint
        self.lists = 0  # every list, the first one included
        self.relists = 0  # lists after the first (410 Gone, or a periodic resync)
        self.reconnects = 0  # watch requests after the first, resuming from a resourceVersion
        self.errors = 0  # failed lists/watches (each followed by a backoff)
        self.callback_errors = 0
        self.events = 0
        self.last_event_at: float | None = None  # wall clock of the newest event or bookmark
        self.last_ok_at: float | None = None  # wall clock of the newest successful list or watch
        self.last_error = ""
        self.resource_version: str | None = None
        self._watch: watch.Watch | None = None
        self._closed = threading.Event()
        self._watches = 0
        self._failures = 0  # failed rounds in a row
        self._gone_in_a_row = 0  # 410s in a row
        self._unauthorized_in_a_row = 0  # 401s in a row
        self.drops = 0  # streams cut after they were up (resumed at once, not failures)
        self._stream_opened_at: float | None = None
        self._stream_events = 0
        self._listed_at = self.clock.monotonic()

    def close(self) -> None:
        """End the current ``run`` soon, also interrupting a watch that is waiting for events."""
        self._closed.set()
        w = self._watch
        if w is not None:
            w.stop()

    def run(
        self,
        on_event: Callable[[JobObservation], None],
        stop: threading.Event,
        on_resync: Callable[[list[JobObservation]], None] | None = None,
    ) -> None:
        """Deliver observations until ``stop`` is set (or ``close()`` is called)."""
        self._closed.clear()  # close() ends one run; the watcher may run again later
        while not (stop.is_set() or self._closed.is_set()):
            delay = self.step(on_event, on_resync, stopping=stop.is_set)
            if delay and (self.clock.wait(stop, delay) or self._closed.is_set()):
                break

    def step(
        self,
        on_event: Callable[[JobObservation], None],
        on_resync: Callable[[list[JobObservation]], None] | None = None,
        stopping: Callable[[], bool] = lambda: False,
    ) -> float:
        """One round: list when there is no resourceVersion (or a resync is due), then one
        watch request. Never raises; returns how long to wait before the next round (0
        after a clean round, a jittered backoff after a failure)."""
        on_resync = on_resync or self.on_resync
        done = lambda: stopping() or self._closed.is_set()  # noqa: E731
        try:
            resync_due = self.resync_seconds is not None and self.clock.monotonic() - self._listed_at > self.resync_seconds
            if self.resource_version is None or resync_due:
                self._list(on_event, on_resync)
                self._listed_at = self.clock.monotonic()
                if done():
                    return 0.0
            self._watch_once(on_event, done)
            self._failures = self._gone_in_a_row = self._unauthorized_in_a_row = 0
            return 0.0
        except Exception as exc:  # the watcher must never die
            if done():  # close() cut the stream: not an error
                return 0.0
            err = classify(exc)
            if err.status_code != 401:
                self._unauthorized_in_a_row = 0
            if self._stream_was_up(err):
                # a stream that was open and then cut (a load balancer, an API server
                # restart) is a drop, not a failure: resume at once from the resourceVersion.
                # Backing off here would, with streams cut every few seconds, push every
                # reconnect out to backoff_max and leave the Jobs unwatched in between.
                self.drops += 1
                self._failures = 0
                log.info("job watch %s: stream dropped after %.1fs (%s); resuming", self.namespace, self._stream_age(), err.message)
                return 0.0
            return self._failed(err)

    def _stream_age(self) -> float:
        return self.clock.monotonic() - self._stream_opened_at if self._stream_opened_at is not None else 0.0

    def _stream_was_up(self, err: CloudError) -> bool:
        """True when the failed watch had been streaming (an event arrived, or it was open
        for ``DROP_AFTER_S``) and the error is a cut connection, not a refusal."""
        if self._stream_opened_at is None or err.status_code is not None:
            return False
        return self._stream_events > 0 or self._stream_age() >= self.DROP_AFTER_S

    def _failed(self, err: CloudError) -> float:
        if err.status_code == 410:  # our resourceVersion is too old: list again
            log.info("job watch %s: %s; re-listing", self.namespace, err.message)
            self.resource_version = None
            self._gone_in_a_row += 1
            return min(self.backoff_max, self.backoff_initial * self._gone_in_a_row) if self._gone_in_a_row > 1 else 0.0
        self._failures += 1
        self.errors += 1
        self.last_error = f"{err.kind}: {err.message}"[:500]
        log.warning("job watch %s: %s (attempt %d)", self.namespace, self.last_error, self._failures)
        if err.status_code == 401:
            self.kube.refresh_credentials()
            self._unauthorized_in_a_row += 1
            if self._unauthorized_in_a_row == 1:
                # retry at once with the new token: after a backoff longer than the
                # cluster's token lifetime the new token would be refused again, forever
                return 0.0
        ceiling = min(self.backoff_max, self.backoff_initial * 2 ** min(self._failures, 30))
        return self.rng.uniform(ceiling / 2, ceiling)

    def _emit(self, callback: Callable[[Any], None], value: Any) -> None:
        try:
            callback(value)
        except Exception:  # a consumer's bug must not stop the watch; a resync repairs
            self.callback_errors += 1
            log.exception("job watch %s: callback failed", self.namespace)

    def _list(self, on_event, on_resync) -> None:
        observations, rv = self.kube.list_jobs(self.namespace, self.label_selector)
        self.lists += 1
        if self.lists > 1:
            self.relists += 1
        self.resource_version = rv or None
        self.last_ok_at = self.clock.time()
        for obs in observations:
            self._emit(on_event, obs)
        if on_resync is not None:
            self._emit(on_resync, observations)

    def _watch_once(self, on_event, stopping: Callable[[], bool]) -> None:
        self._watches += 1
        if self._watches > 1:
            self.reconnects += 1
        # return_type=object: events stay the server's JSON; no client-side model validation
        # that could refuse an object and make the same event fail on every reconnect.
        w = watch.Watch(return_type=object)
        self._watch = w
        self._stream_opened_at, self._stream_events = None, 0
        try:
            stream = w.stream(
                self.kube.batch.list_namespaced_job,
                self.namespace,
                label_selector=self.label_selector,
                resource_version=self.resource_version,
                allow_watch_bookmarks=True,
                timeout_seconds=self.timeout_seconds,
                _request_timeout=self.timeout_seconds + 5,
            )
            self._stream_opened_at = self.clock.monotonic()
            for event in stream:
                self._stream_events += 1
                if stopping():
                    w.stop()
                    break
                self._handle(event, on_event)
            self.last_ok_at = self.clock.time()
        finally:
            self._watch = None

    def _handle(self, event: Mapping[str, Any], on_event) -> None:
        kind = event.get("type")
        raw = event.get("raw_object")
        if not isinstance(raw, Mapping):
            raw = {}
        self.last_event_at = self.clock.time()
        self.events += 1
        if kind == "ERROR":  # only reached when the client did not raise for it
            code = raw.get("code")
            raise CloudError(
                ErrorKind.TRANSIENT,
                str(raw.get("message") or "watch error"),
                code if isinstance(code, int) else None,
            )
        rv = (raw.get("metadata") or {}).get("resourceVersion")
        if rv:  # advance first: an event we cannot use must not be replayed forever
            self.resource_version = str(rv)
        if kind not in ("ADDED", "MODIFIED", "DELETED"):  # BOOKMARK: only the resourceVersion
            return
        try:
            observation = JobObservation.from_job(raw, deleted=kind == "DELETED")
        except (TypeError, ValueError, AttributeError):
            self.callback_errors += 1
            log.exception("job watch %s: unreadable %s event skipped", self.namespace, kind)
            return
        self._emit(on_event, observation)

    def stats(self) -> dict[str, Any]:
        return {
            "lists": self.lists,
            "relists": self.relists,
            "reconnects": self.reconnects,
            "drops": self.drops,
            "errors": self.errors,
            "callback_errors": self.callback_errors,
            "events": self.events,
            "last_event_at": self.last_event_at,
            "last_ok_at": self.last_ok_at,
            "last_error": self.last_error,
            "resource_version": self.resource_version,
        }


def observations_by_task(observations: Sequence[JobObservation]) -> dict[int, JobObservation]:
    """Index observations by task id (Jobs without a task-id label are left out)."""
    return {o.task_id: o for o in observations if o.task_id is not None}


def _created(obj: Mapping[str, Any]) -> dt.datetime | None:
    """An object's ``metadata.creationTimestamp`` (RFC 3339, seconds) as naive UTC; None if absent or unreadable."""
    text = str((obj.get("metadata") or {}).get("creationTimestamp") or "")
    return _utc_naive(text) if text else None


@functools.lru_cache(maxsize=4096)
def _utc_naive(text: str) -> dt.datetime | None:
    """RFC 3339 text as naive UTC, None if unreadable; once per text (a datetime is immutable)."""
    try:
        return dt.datetime.fromisoformat(text.replace("Z", "+00:00")).astimezone(dt.UTC).replace(tzinfo=None)
    except ValueError:
        return None
