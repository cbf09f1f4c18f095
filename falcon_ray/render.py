"""What Falcon asks GKE and Kubernetes for: node-pool requests, Jobs and Services as plain dicts.

Contract
--------
Pure functions, no I/O: the same (task id, spec, cluster, pool) always renders the same
objects, so every create is idempotent by name and a repeated create meets 409 and adopts.

- Names: ``node_pool_name(task_id, topology, attempt)`` (``falcon-t42-2x4``, then
  ``falcon-t42-2x4-r1`` ... after capacity refusals; a valid GKE name, at most 40 characters) and ``job_name(task_id)`` (``falcon-task-42``; DNS-1123). The
  headless Service of a multi-host Job has the Job's name.
- Marks: node pools carry the ``falcon-`` prefix and the resource label
  ``managed-by=falcon``; Jobs, their pods and Services carry ``managed-by=falcon``,
  ``falcon.dev/task-id`` and (Jobs and pods) ``falcon.dev/queue``. The ClusterActor's
  single watch selects on ``managed-by=falcon``.
- ``node_pool_request`` returns a NodePool in the GKE v1 REST JSON shape (camelCase field
  names, enum names), accepted by ``container_v1.NodePool.from_json(json.dumps(...))``.
  Machine type, host count, node labels and placement come from the TPU catalogue only.
- ``job_manifest`` returns a batch/v1 Job. Only image, command, args, env, working
  directory, cpu and memory come from the spec; namespace, service account, node
  placement, security settings and volumes come from the cluster registry and from here,
  and nothing in a spec can change them. Spec text is only ever placed in argv and env
  values, never inside a shell script.

Logs (original section 7)
-------------------------
When the cluster has a ``gcs_bucket`` and the spec gives a ``command``, the pod mounts
the bucket's ``logs/<task id>/`` subtree through the GCS FUSE CSI driver at
``LOG_MOUNT_PATH`` and runs the command under a fixed POSIX ``sh`` wrapper
(``LOG_WRAPPER_SCRIPT``) that copies stdout and stderr, merged, both to the container's
own stdout and to ``<mount>/<pod name>.log``, i.e. ``log_path(cluster, task, pod)``. The
user's argv is handed to the wrapper as positional parameters, so no spec content is
ever parsed by a shell. The wrapper keeps the command's exit status (a signal death
stays 128+N, e.g. 137), forwards SIGTERM (what Kubernetes sends on delete), and falls back to running the command
unwrapped when the image lacks ``tee``/``mkfifo`` or has no writable ``$TMPDIR``. The
image needs ``/bin/sh`` (distroless images without a shell cannot be wrapped).

If the spec gives only ``args`` (the image's own entrypoint runs), Falcon cannot wrap a
command it does not know: the Job runs unwrapped, without the log volume, and its output
is only in the container log. Such a Job carries the annotation
``falcon.dev/log-capture: "off"`` so operators can tell.

Unverified against real GKE (see docs): ``placementPolicy.policyName`` for TPU7x
workload policies, ``consolidationDelay`` on TPU pools, flex-start for multi-host pools,
whether the ``google.com/tpu`` toleration is required.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from falcon_ray.model import Cluster
from falcon_ray.spec import SupplyMode, TaskSpec
from falcon_ray.tpu import NODEPOOL_LABEL, TPU_RESOURCE, Placement, SliceShape

# --- labels and names ------------------------------------------------------------------

LABEL_MANAGED_BY = "managed-by"
MANAGED_BY_VALUE = "falcon"
LABEL_TASK_ID = "falcon.dev/task-id"
LABEL_QUEUE = "falcon.dev/queue"
LABEL_ATTEMPT = "falcon.dev/attempt"  # which run of the task a Job is (0 first; +1 per recovery)
RESOURCE_LABEL_TASK = "falcon-task"  # GCE resource label on node pools (no '/' allowed there)
RESOURCE_LABEL_INSTALLATION = "falcon-installation"  # whose pool it is (Settings.installation)
LABEL_INSTALLATION = "falcon.dev/installation"  # the same mark on Jobs, Services and pods
DEFAULT_INSTALLATION = "default"
_ATTEMPT_RE = re.compile(r"^falcon-task-[0-9]+-a([0-9]+)$")
MANAGED_SELECTOR = f"{LABEL_MANAGED_BY}={MANAGED_BY_VALUE}"
ANNOTATION_LOG_PATH = "falcon.dev/log-path"
ANNOTATION_LOG_CAPTURE = "falcon.dev/log-capture"
COMPLETION_INDEX_ANNOTATION = "batch.kubernetes.io/job-completion-index"

POOL_NAME_PREFIX = "falcon-"
MAX_POOL_NAME = 40
MAX_LABEL_VALUE = 63

FLEX_START_MAX_RUN_SECONDS = 7 * 24 * 3600  # flex-start VMs live at most seven days
# The nodes' OAuth scopes unless Settings.node_oauth_scopes says otherwise (as xpk creates pools).
DEFAULT_NODE_OAUTH_SCOPES: tuple[str, ...] = ("https://www.googleapis.com/auth/cloud-platform",)

# --- node pool constants ---------------------------------------------------------------

RESERVATION_KEY = "compute.googleapis.com/reservation-name"
ZONE_RE = re.compile(r"^[a-z]+-[a-z]+[0-9]+-[a-z]$")

# --- pod constants ---------------------------------------------------------------------

CONTAINER_NAME = "task"
LOG_VOLUME = "falcon-logs"
LOG_MOUNT_PATH = "/falcon/logs"
GCSFUSE_DRIVER = "gcsfuse.csi.storage.gke.io"
GCSFUSE_ANNOTATION = "gke-gcsfuse/volumes"
ENV_TASK_ID = "FALCON_TASK_ID"
ENV_POD_NAME = "FALCON_POD_NAME"
ENV_LOG_DIR = "FALCON_LOG_DIR"
ENV_WORKER_ID = "TPU_WORKER_ID"
ENV_WORKER_HOSTNAMES = "TPU_WORKER_HOSTNAMES"
WRAPPER_ARGV0 = "falcon-log-wrapper"  # $0 of the wrapper script; the user's argv follows as "$@"
LOG_DRAIN_SECONDS = 10  # after the command exits, how long tee may drain before it is stopped

# The log wrapper. Fixed text: nothing from a spec is ever inserted here (the user's argv
# arrives as "$@"). It avoids "$(" and "$$" because the kubelet expands $(VAR) and turns
# $$ into $ in command and args. Steps: make a fifo; tee reads it into the log file and
# its own stdout; the command writes stdout+stderr into the fifo; wait for the command
# (forwarding TERM -- the trap is set before the command starts, so a TERM that arrives
# in between is passed on too -- and re-waiting after a trapped signal); give tee a bounded time to
# drain (a leftover background process may hold the fifo open), then exit with the
# command's status.
LOG_WRAPPER_SCRIPT = f"""\
log="${ENV_LOG_DIR}/${ENV_POD_NAME}.log"
fifo="${{TMPDIR:-/tmp}}/falcon-log.fifo"
if ! command -v tee >/dev/null 2>&1 || ! {{ rm -f "$fifo" && mkfifo "$fifo"; }} 2>/dev/null; then
  echo "falcon: cannot copy output to $log (no tee, mkfifo or writable TMPDIR); running without it" >&2
  exec "$@"
fi
tee "$log" <"$fifo" &
tee_pid=$!
pid=
term=
trap 'term=1; [ -z "$pid" ] || kill -TERM "$pid" 2>/dev/null' TERM
"$@" >"$fifo" 2>&1 &
pid=$!
[ -z "$term" ] || kill -TERM "$pid" 2>/dev/null
wait "$pid"
rc=$?
if [ -n "$term" ]; then
  # the TERM trap interrupts wait (status 128+15) even when the command has already been
  # reaped: wait again for the command's own status (127: there was nothing left to wait for)
  wait "$pid"
  again=$?
  [ "$again" -eq 127 ] || rc=$again
fi
(sleep {LOG_DRAIN_SECONDS}; kill "$tee_pid" 2>/dev/null) </dev/null >/dev/null 2>&1 &
watchdog=$!
wait "$tee_pid"
kill "$watchdog" 2>/dev/null
rm -f "$fifo"
exit "$rc"
"""


def _short_hash(text: str, n: int = 6) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:n]


def label_value(text: str) -> str:
    """A Kubernetes label value for any text: at most 63 characters of [A-Za-z0-9._-],
    starting and ending alphanumeric; deterministic, with a hash suffix when cut."""
    safe = re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("._-")
    if len(safe) > MAX_LABEL_VALUE:
        safe = f"{safe[: MAX_LABEL_VALUE - 7].rstrip('._-')}-{_short_hash(text)}"
    return safe


def queue_label(cluster_name: str, topology: str) -> str:
    return label_value(f"{cluster_name}.{topology}")


def node_pool_name(task_id: int, topology: str, attempt: int = 0) -> str:
    """``falcon-t<task>-<topology>``, and ``...-r<attempt>`` for a create asked again (after
    capacity refusals, or when a lease row of the task holds the name already; the earlier
    pool may still be being deleted under its own name): lowercase letters, digits,
    hyphens; <= 40 characters, the suffix kept."""
    if task_id < 0 or attempt < 0:
        raise ValueError(f"task id and attempt must not be negative, got {task_id}, {attempt}")
    topo = re.sub(r"[^a-z0-9]+", "-", topology.lower()).strip("-") or "x"
    suffix = f"-r{attempt}" if attempt else ""
    name = f"{POOL_NAME_PREFIX}t{task_id}-{topo}"
    if len(name) + len(suffix) > MAX_POOL_NAME:
        name = f"{POOL_NAME_PREFIX}t{task_id}-{_short_hash(topology)}"[: MAX_POOL_NAME - len(suffix)].rstrip("-")
    return name + suffix


def job_name(task_id: int, attempt: int = 0) -> str:
    """``falcon-task-42`` for a task's first run, ``falcon-task-42-a1`` for its second
    (a recovery after the fleet disrupted the first), and so on: one name per attempt."""
    if task_id < 0 or attempt < 0:
        raise ValueError(f"task id and attempt must not be negative, got {task_id}, {attempt}")
    return f"falcon-task-{task_id}-a{attempt}" if attempt else f"falcon-task-{task_id}"


def job_attempt(labels: Mapping[str, str] | None, name: str = "") -> int:
    """The attempt a Job runs, from its ``falcon.dev/attempt`` label (else its name; 0)."""
    raw = (labels or {}).get(LABEL_ATTEMPT)
    if raw is None:
        m = _ATTEMPT_RE.search(name)
        raw = m.group(1) if m else "0"
    try:
        return max(0, int(raw))
    except ValueError:
        return 0


def service_of_job(job: str) -> str:
    """The Service name of a task's Job of any attempt (``falcon-task-42-a1`` -> ``falcon-task-42``)."""
    m = _ATTEMPT_RE.match(job)
    return job[: -len(m.group(1)) - 2] if m else job


def service_name(task_id: int) -> str:
    """The headless Service of a multi-host task (every attempt's pods): ``<job>-<i>.<service>``."""
    return job_name(task_id)


def worker_hostnames(task_id: int, hosts: int, attempt: int = 0) -> list[str]:
    job, svc = job_name(task_id, attempt), service_name(task_id)
    return [f"{job}-{i}.{svc}" for i in range(hosts)]


# --- supply modes and reservations -----------------------------------------------------


def cluster_zone(cluster: Cluster) -> str | None:
    """The cluster's zone when its location is a zone (``us-east5-b``), else None (regional)."""
    return cluster.location if ZONE_RE.match(cluster.location) else None


def cluster_region(cluster: Cluster) -> str:
    """The cluster's region: its location, or the region of its zone (``us-east5-b`` -> ``us-east5``)."""
    return cluster.location.rsplit("-", 1)[0] if ZONE_RE.match(cluster.location) else cluster.location


# Compute resource names: a lower-case letter, then up to 62 letters, digits or dashes, no
# trailing dash. Project ids: 6-30 characters (a domain-scoped "example.com:proj" too).
_COMPUTE_NAME = r"[a-z](?:[-a-z0-9]{0,61}[a-z0-9])?"
_PROJECT_ID = r"(?:[a-z][-a-z0-9.]*:)?[a-z][-a-z0-9]{4,28}[a-z0-9]"
_ZONE = r"[a-z]+-[a-z]+[0-9]+-[a-z]"
_RESERVATION_FORMS = (
    re.compile(rf"^(?P<name>{_COMPUTE_NAME})$"),
    re.compile(rf"^(?P<zone>{_ZONE})/(?P<name>{_COMPUTE_NAME})$"),
    re.compile(rf"^projects/(?P<project>{_PROJECT_ID})/reservations/(?P<name>{_COMPUTE_NAME})$"),
    re.compile(rf"^projects/(?P<project>{_PROJECT_ID})/zones/(?P<zone>{_ZONE})/reservations/(?P<name>{_COMPUTE_NAME})$"),
)
RESERVATION_FORMS_HELP = (
    "NAME, ZONE/NAME, projects/PROJECT/reservations/NAME (shared from PROJECT) "
    "or projects/PROJECT/zones/ZONE/reservations/NAME"
)


class ReservationRef(NamedTuple):
    """A registry reservation, parsed. ``project`` is set for the ``projects/P/...`` forms (a
    reservation shared from project P, or the cluster's own project spelled out); ``zone``
    when the reference names it."""

    project: str | None
    zone: str | None
    name: str

    def owner(self, cluster_project: str) -> str:
        """The project whose Compute API holds the reservation."""
        return self.project or cluster_project

    def affinity_value(self, cluster_project: str) -> str:
        """What ``reservationAffinity.values`` carries: the bare name for a reservation of the
        cluster's own project, ``projects/P/reservations/NAME`` for one shared from project P
        (Compute's ReservationAffinity: "a name to a reservation in the same project or
        projects/different-project/reservations/some-reservation-name to target a shared
        reservation in the same zone but in a different project")."""
        if self.project and self.project != cluster_project:
            return f"projects/{self.project}/reservations/{self.name}"
        return self.name


def parse_reservation(ref: str) -> ReservationRef:
    """A registry reservation in one of ``RESERVATION_FORMS_HELP``'s forms; ValueError otherwise."""
    text = (ref or "").strip()
    for form in _RESERVATION_FORMS:
        m = form.match(text)
        if m:
            g = m.groupdict()
            return ReservationRef(g.get("project"), g.get("zone"), g["name"])
    raise ValueError(f"invalid reservation {ref[:120]!r}: expected {RESERVATION_FORMS_HELP}")


def reservation_parts(ref: str) -> tuple[str | None, str]:
    """A registry reservation (any form of ``parse_reservation``) -> (zone or None, bare name).
    A reference that is none of the forms gives (None, the text), as before."""
    try:
        parsed = parse_reservation(ref)
    except ValueError:
        return None, ref
    return parsed.zone, parsed.name


# --- node pools --------------------------------------------------------------------------


def _placement_policy(shape: SliceShape, workload_policy: str | None) -> dict[str, Any] | None:
    if shape.placement == Placement.COMPACT:
        return {"type": "COMPACT", "tpuTopology": shape.topology}
    if shape.placement == Placement.WORKLOAD_POLICY:
        # UNVERIFIED: gcloud's --placement-policy=NAME for TPU7x maps to policyName; the
        # workload policy (HIGH_THROUGHPUT, accelerator topology T) replaces COMPACT and
        # tpuTopology and must exist in the cluster's region (created by the operator).
        if not workload_policy:
            raise ValueError(f"topology {shape.topology} needs a workload policy name (Settings.v7x_workload_policy)")
        return {"policyName": workload_policy}
    # Single host: the machine type fixes the slice, and GKE asks for a TPU topology only
    # for multi-host slices, so no placement policy is sent.
    return None


def node_pool_request(
    spec: TaskSpec,
    cluster: Cluster,
    supply_mode: SupplyMode | str,
    name: str,
    task_id: int,
    *,
    idle_seconds: int,
    workload_policy: str | None = None,
    installation: str = DEFAULT_INSTALLATION,
    zone: str | None = None,
    oauth_scopes: Sequence[str] = DEFAULT_NODE_OAUTH_SCOPES,
    service_account: str = "",
    node_zones: Sequence[str] = (),
) -> dict[str, Any]:
    """The NodePool to create for one slice of ``spec``'s shape, in GKE v1 REST JSON.

    A TPU slice lives in one zone: ``zone`` (the reservation's, or the one chosen for a
    regional cluster), else the cluster's own zone when its location is one, else (a
    regional cluster) the first of its node zones ``node_zones`` in sorted order; with none
    of them known it raises ValueError rather than leave ``locations`` out (GKE would then
    put the pool in every node zone, ``initialNodeCount`` nodes in each).

    ``oauth_scopes`` and ``service_account`` are the nodes' (``config.oauthScopes``,
    ``config.serviceAccount``): without scopes GKE gives the nodes only the logging and
    monitoring ones, and they cannot pull private Artifact Registry images."""
    shape = spec.shape
    mode = SupplyMode(supply_mode)
    config = _node_config(shape, task_id, installation, int(idle_seconds), oauth_scopes, service_account)
    reservation_zone = _supply_config(config, cluster, mode)
    zone = zone or reservation_zone
    pool = _autoscaled_pool(name, config, shape, mode)
    pool["locations"] = [pool_zone(cluster, zone, node_zones)]
    placement = _placement_policy(shape, workload_policy)
    if placement:
        pool["placementPolicy"] = placement
    return pool


def _node_config(
    shape: SliceShape, task_id: int, installation: str, idle: int, oauth_scopes: Sequence[str], service_account: str
) -> dict[str, Any]:
    """The pool's NodeConfig before the supply mode's fields: machine, labels, identity, scopes."""
    config: dict[str, Any] = {
        "machineType": shape.machine_type,
        "labels": {LABEL_MANAGED_BY: MANAGED_BY_VALUE},
        "resourceLabels": {
            LABEL_MANAGED_BY: MANAGED_BY_VALUE,
            RESOURCE_LABEL_TASK: str(task_id),
            RESOURCE_LABEL_INSTALLATION: installation,
        },
        # Workload Identity for the pods and the GCS FUSE driver.
        "workloadMetadataConfig": {"mode": "GKE_METADATA"},
        # Explicit scopes (as xpk: cloud-platform), so nodes can pull private images.
        "oauthScopes": list(oauth_scopes) or list(DEFAULT_NODE_OAUTH_SCOPES),
        # The closest GKE field to a per-pool scale-down-unneeded time (NodeConfig
        # consolidation_delay). UNVERIFIED for TPU pools; Falcon also deletes idle pools itself.
        "consolidationDelay": f"{idle}s",
    }
    if service_account:
        config["serviceAccount"] = service_account
    return config


def _supply_config(config: dict[str, Any], cluster: Cluster, mode: SupplyMode) -> str | None:
    """Adds the supply mode's fields to ``config`` (reservation affinity, flex-start); returns
    the reservation's zone when the mode is reservation and the reference names one."""
    reservation_zone = None
    if mode == SupplyMode.RESERVATION:
        if not cluster.default_reservation:
            raise ValueError(f"cluster {cluster.name} has no default_reservation for supply mode reservation")
        ref = parse_reservation(cluster.default_reservation)
        config["reservationAffinity"] = {
            "consumeReservationType": "SPECIFIC_RESERVATION",
            "key": RESERVATION_KEY,
            "values": [ref.affinity_value(cluster.project)],
        }
        reservation_zone = ref.zone
    else:
        # On-demand and flex-start must not quietly eat a reservation's capacity.
        config["reservationAffinity"] = {"consumeReservationType": "NO_RESERVATION"}
    if mode == SupplyMode.FLEX_START:
        # As xpk creates flex-start pools: --flex-start --num-nodes=0 --enable-autoscaling
        # --location-policy=ANY --reservation-affinity=none --no-enable-autorepair.
        config["flexStart"] = True
        # The pool may be handed over to later tasks, so ask for the longest lifetime
        # rather than this task's timeout.
        config["maxRunDuration"] = f"{FLEX_START_MAX_RUN_SECONDS}s"
    return reservation_zone


def _autoscaled_pool(name: str, config: dict[str, Any], shape: SliceShape, mode: SupplyMode) -> dict[str, Any]:
    """The NodePool around ``config``: its size, autoscaling 0..hosts and management."""
    flex = mode == SupplyMode.FLEX_START
    return {
        "name": name,
        "config": config,
        # A multi-host slice is atomic: all hosts or none. A flex-start pool starts empty:
        # the autoscaler adds its nodes only for pending Pods that select it.
        "initialNodeCount": 0 if scales_from_zero(mode) else shape.hosts,
        # Autoscaling 0..hosts in every mode, so the idle time above has an effect.
        "autoscaling": {
            "enabled": True,
            "totalMinNodeCount": 0,
            "totalMaxNodeCount": shape.hosts,
            "locationPolicy": "ANY",
        },
        # Auto-repair recreates broken TPU VMs; flex-start pools go without it (as xpk).
        # Auto-upgrade is GKE's default for new pools and required on release channels.
        "management": {"autoRepair": not flex, "autoUpgrade": True},
    }


def pool_zone(cluster: Cluster, zone: str | None = None, node_zones: Sequence[str] = ()) -> str:
    """The one zone of a TPU pool: ``zone`` if given, the cluster's zone (zonal), the
    registry's zone for the cluster, else the first of its node zones in sorted order
    (deterministic); ValueError when none is known (never a pool without ``locations``)."""
    chosen = zone or cluster_zone(cluster) or cluster.zone or (sorted(node_zones)[0] if node_zones else None)
    if not chosen:
        raise ValueError(
            f"cluster {cluster.name} is regional ({cluster.location}) and no zone is known for its pool: "
            f"set one with `falcon-ray clusters set-zone {cluster.name} ZONE`"
        )
    return chosen


def workload_policy_command(policy: str, topology: str, project: str, region: str) -> str:
    """The gcloud command that creates a TPU7x workload policy (GKE Ironwood how-to, xpk)."""
    return (
        f"gcloud compute resource-policies create workload-policy {policy} --type=HIGH_THROUGHPUT "
        f"--accelerator-topology={topology} --project={project} --region={region}"
    )


def pool_policy_name(request: Mapping[str, Any]) -> str:
    """The workload policy a node-pool request names (``placementPolicy.policyName``), or ""."""
    return str((request.get("placementPolicy") or {}).get("policyName") or "")


def workload_policy_problem(
    policy: str, topology: str, cluster: Cluster, found: Mapping[str, Any] | None
) -> str | None:
    """Why a node-pool create that names workload policy ``policy`` for a ``topology`` slice
    cannot succeed, or None (also when ``policy`` is empty).

    ``found`` is the policy as Compute returned it (``resourcePolicies.get`` in the
    cluster's project and region: ``{"name", "workloadPolicy": {"type",
    "acceleratorTopology"}}``), None when it does not exist. Pure: the ClusterActor reads,
    this decides."""
    if not policy:
        return None
    region = cluster_region(cluster)
    command = workload_policy_command(policy, topology or "TOPOLOGY", cluster.project, region)
    if found is None:
        return (
            f"workload policy {policy} does not exist in project {cluster.project}, region {region}; "
            f"a multi-host TPU7x node pool is placed by it. Create it with: {command}"
        )
    wp = found.get("workloadPolicy") or {}
    have_type, have_topology = str(wp.get("type") or ""), str(wp.get("acceleratorTopology") or "")
    if have_type != "HIGH_THROUGHPUT":
        return (
            f"resource policy {policy} in {region} is not a HIGH_THROUGHPUT workload policy "
            f"(type {have_type or 'none'}); create one with: {command}"
        )
    if topology and have_topology and have_topology != topology:
        return (
            f"workload policy {policy} in {region} is for accelerator topology {have_topology}, not {topology}; "
            f"name one policy per topology (setting v7x_workload_policy, default falcon-{{topology}}) and create it with: {command}"
        )
    return None


# --- Jobs ------------------------------------------------------------------------------


def bucket_name(cluster: Cluster) -> str:
    """The registry's bucket without a ``gs://`` prefix or slashes; empty when unset."""
    return cluster.gcs_bucket.strip().removeprefix("gs://").strip("/")


def log_path(cluster: Cluster, task_id: int, pod_name: str) -> str | None:
    """``gs://<bucket>/logs/<task>/<pod>.log``, or None when the cluster has no bucket."""
    bucket = bucket_name(cluster)
    return f"gs://{bucket}/logs/{task_id}/{pod_name}.log" if bucket else None


def logs_captured(spec: TaskSpec, cluster: Cluster) -> bool:
    """Whether the Job for ``spec`` on ``cluster`` writes its output to GCS."""
    return bool(bucket_name(cluster)) and bool(spec.command)


def scales_from_zero(supply_mode: SupplyMode | str) -> bool:
    """A pool created with no node: its nodes come only for the Job's pending Pods
    (flex-start, as GKE's how-to creates it), so its Job is submitted first."""
    return SupplyMode(supply_mode) == SupplyMode.FLEX_START


def owned_pool(name: str, resource_labels: Mapping[str, str], installation: str) -> bool:
    """A node pool this installation created: both marks, and its installation label."""
    return (
        name.startswith(POOL_NAME_PREFIX)
        and resource_labels.get(LABEL_MANAGED_BY) == MANAGED_BY_VALUE
        and resource_labels.get(RESOURCE_LABEL_INSTALLATION) == installation
    )


def installation_selector(installation: str) -> str:
    """The label selector of one installation's Jobs."""
    return f"{MANAGED_SELECTOR},{LABEL_INSTALLATION}={installation}"


def job_labels(task_id: int, queue: str | None = None, installation: str = DEFAULT_INSTALLATION) -> dict[str, str]:
    labels = {LABEL_MANAGED_BY: MANAGED_BY_VALUE, LABEL_TASK_ID: str(task_id), LABEL_INSTALLATION: installation}
    if queue:
        labels[LABEL_QUEUE] = label_value(queue)
    return labels


def _field_env(name: str, path: str) -> dict[str, Any]:
    return {"name": name, "valueFrom": {"fieldRef": {"fieldPath": path}}}


def _container_env(task_id: int, spec: TaskSpec, capture: bool, attempt: int = 0) -> list[dict[str, Any]]:
    shape = spec.shape
    falcon_env: list[dict[str, Any]] = [
        {"name": ENV_TASK_ID, "value": str(task_id)},
        _field_env(ENV_POD_NAME, "metadata.name"),
    ]
    if capture:
        falcon_env.append({"name": ENV_LOG_DIR, "value": LOG_MOUNT_PATH})
    if shape.multi_host:
        # GKE may inject these itself for Indexed Jobs; the values are the same.
        falcon_env.append(_field_env(ENV_WORKER_ID, f"metadata.annotations['{COMPLETION_INDEX_ANNOTATION}']"))
        falcon_env.append(
            {"name": ENV_WORKER_HOSTNAMES, "value": ",".join(worker_hostnames(task_id, shape.hosts, attempt))}
        )
    owned = {e["name"] for e in falcon_env}
    # The spec's variables first; a name Falcon sets is Falcon's (the spec validator
    # refuses most of them already).
    user_env = [{"name": k, "value": v} for k, v in spec.env.items() if k not in owned]
    return user_env + falcon_env


def _resources(spec: TaskSpec) -> dict[str, Any]:
    amounts: dict[str, Any] = {TPU_RESOURCE: str(spec.shape.chips_per_host)}  # quantities are strings
    if spec.cpu:
        amounts["cpu"] = spec.cpu
    if spec.memory:
        amounts["memory"] = spec.memory
    return {"limits": dict(amounts), "requests": dict(amounts)}


def pod_failure_policy() -> dict[str, Any]:
    """Tells the fleet's failures from the task's, in the Job itself. Both rules end the Job
    at once (FailJob), so Kubernetes never retries anything: a slice is re-run whole, as a
    new attempt the controller creates, never one host replaced inside a broken slice.
    Rule 0: a pod the fleet took (the ``DisruptionTarget`` condition: drain for host
    maintenance, a node lost or repaired, a preemption) -- the Job's ``Failed`` condition
    (reason ``PodFailurePolicy``) names it, and the controller starts a recovery. Rule 1:
    the task's own container ended with a non-zero exit code -- the task's failure."""
    return {
        "rules": [
            {"action": "FailJob", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]},
            {"action": "FailJob", "onExitCodes": {"containerName": CONTAINER_NAME, "operator": "NotIn", "values": [0]}},
        ]
    }


def job_manifest(
    task_id: int,
    spec: TaskSpec,
    cluster: Cluster,
    pool: str,
    queue: str,
    installation: str = DEFAULT_INSTALLATION,
    attempt: int = 0,
) -> dict[str, Any]:
    """The batch/v1 Job that runs attempt ``attempt`` of task ``task_id`` on node pool ``pool``."""
    shape = spec.shape
    name = job_name(task_id, attempt)
    labels = {**job_labels(task_id, queue, installation), LABEL_ATTEMPT: str(attempt)}
    capture = logs_captured(spec, cluster)
    pod_spec = _pod_spec(cluster, shape, pool, _container(task_id, spec, capture, attempt))
    pod_annotations: dict[str, str] = {}
    job_annotations: dict[str, str] = {}
    if capture:
        pod_annotations[GCSFUSE_ANNOTATION] = "true"
        pod_spec["volumes"] = [_log_volume(cluster, task_id)]
        job_annotations[ANNOTATION_LOG_PATH] = f"gs://{bucket_name(cluster)}/logs/{task_id}/"
    else:
        job_annotations[ANNOTATION_LOG_CAPTURE] = "off"
    job_spec: dict[str, Any] = {
        # Kubernetes retries nothing: a pod the task failed fails the task; a pod the fleet
        # took fails the Job too, and the controller re-runs the whole slice as a new attempt.
        "backoffLimit": 0,
        "podFailurePolicy": pod_failure_policy(),
        "completions": shape.hosts,
        "parallelism": shape.hosts,
        # No activeDeadlineSeconds: Falcon enforces the task timeout itself (Failed/Timeout);
        # no ttlSecondsAfterFinished: Falcon deletes the Job once it has read the outcome.
    }
    if shape.multi_host:
        job_spec["completionMode"] = "Indexed"
        pod_spec["subdomain"] = service_name(task_id)
    pod_metadata: dict[str, Any] = {"labels": dict(labels)}
    if pod_annotations:
        pod_metadata["annotations"] = pod_annotations
    job_spec["template"] = {"metadata": pod_metadata, "spec": pod_spec}
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "namespace": cluster.namespace, "labels": labels, "annotations": job_annotations},
        "spec": job_spec,
    }


def _container(task_id: int, spec: TaskSpec, capture: bool, attempt: int) -> dict[str, Any]:
    """The task's container: the spec's command (behind the log wrapper when logs are
    captured), its environment and resources, unprivileged."""
    container: dict[str, Any] = {"name": CONTAINER_NAME, "image": spec.image}
    if capture:
        container["command"] = ["/bin/sh", "-c", LOG_WRAPPER_SCRIPT, WRAPPER_ARGV0]
        container["args"] = [*spec.command, *spec.args]
        container["volumeMounts"] = [{"name": LOG_VOLUME, "mountPath": LOG_MOUNT_PATH}]
    else:
        if spec.command:
            container["command"] = list(spec.command)
        if spec.args:
            container["args"] = list(spec.args)
    if spec.working_dir:
        container["workingDir"] = spec.working_dir
    container["env"] = _container_env(task_id, spec, capture, attempt)
    container["resources"] = _resources(spec)
    container["securityContext"] = {"privileged": False, "allowPrivilegeEscalation": False}
    return container


def _pod_spec(cluster: Cluster, shape: SliceShape, pool: str, container: dict[str, Any]) -> dict[str, Any]:
    """The pod spec of every host of the slice: on ``pool``'s nodes, no host namespaces, no API token."""
    return {
        "restartPolicy": "Never",
        "serviceAccountName": cluster.service_account,
        # Workload Identity works through the GKE metadata server and the GCS FUSE driver
        # asks for its own token, so the pod needs no Kubernetes API token.
        "automountServiceAccountToken": False,
        "hostNetwork": False,
        "hostPID": False,
        "hostIPC": False,
        "nodeSelector": {**shape.node_selector, NODEPOOL_LABEL: pool},
        # GKE taints TPU nodes with google.com/tpu; samples tolerate it explicitly.
        # UNVERIFIED whether GKE would add this toleration by itself.
        "tolerations": [{"key": TPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}],
        "containers": [container],
    }


def _log_volume(cluster: Cluster, task_id: int) -> dict[str, Any]:
    """The GCS FUSE volume the log wrapper writes to: this task's subtree of the bucket."""
    return {
        "name": LOG_VOLUME,
        "csi": {
            "driver": GCSFUSE_DRIVER,
            "volumeAttributes": {
                "bucketName": bucket_name(cluster),
                # Only this task's subtree is mounted (and writable through the mount).
                "mountOptions": f"implicit-dirs,only-dir=logs/{task_id}",
            },
        },
    }


def headless_service(
    task_id: int, spec: TaskSpec | None, cluster: Cluster, installation: str = DEFAULT_INSTALLATION
) -> dict[str, Any]:
    """The headless Service giving a multi-host Job's pods stable DNS names."""
    del spec  # the Service does not depend on the spec; kept for a uniform call shape
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": service_name(task_id),
            "namespace": cluster.namespace,
            "labels": job_labels(task_id, installation=installation),
        },
        "spec": {
            "clusterIP": "None",
            # every attempt's pods (the Job's name changes per attempt, the task's label not)
            "selector": {LABEL_TASK_ID: str(task_id), LABEL_INSTALLATION: installation},
            # Workers look each other up while starting, before any is Ready.
            "publishNotReadyAddresses": True,
        },
    }
