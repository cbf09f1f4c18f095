"""The in-cluster controllers of a simulated cluster: Job controller, scheduler and kubelet.

Contract
--------
:class:`Workloads` listens to its cluster's :class:`ObjectStore` and keeps it
converging, the way kube-controller-manager, kube-scheduler and the kubelets do:

* Job controller: for every Job it creates pods from ``spec.template``
  (``parallelism`` at a time, up to ``completions``; Indexed Jobs get the
  ``batch.kubernetes.io/job-completion-index`` annotation and label,
  ``JOB_COMPLETION_INDEX`` env and hostname ``<job>-<index>``), counts finished
  pods (a pod deleted before it finished counts as failed), and writes the
  status the real controller writes: ``startTime``, ``active`` / ``succeeded``
  / ``failed`` (omitted when zero, as the API does), ``ready``,
  ``completedIndexes``, ``completionTime`` and the conditions
  ``SuccessCriteriaMet`` + ``Complete`` or ``FailureTarget`` + ``Failed``
  (reasons ``BackoffLimitExceeded``, ``DeadlineExceeded`` or ``PodFailurePolicy``).
  ``spec.podFailurePolicy`` is applied to every pod that ends Failed, as
  :func:`match_pod_failure_policy` (FailJob / Ignore / Count). A failed Job's
  remaining pods are deleted.
* Scheduler: binds each unbound Pending pod to the first Ready node (by name)
  that matches its nodeSelector / required node affinity, whose taints it
  tolerates, and that has enough free ``google.com/tpu``. Otherwise the pod
  keeps a ``PodScheduled=False`` / ``Unschedulable`` condition with a message
  in the scheduler's words.
* Kubelet: a bound pod becomes Running after ``timings.pod_start`` and
  terminates after the longest ``FALCON_SIM_RUN_SECONDS`` of its containers
  (default 1), each container with exit code ``FALCON_SIM_EXIT_CODE`` (default
  0); ``FALCON_SIM_OOM=1`` or exit code 137 is reason ``OOMKilled``. Pods are
  restartPolicy Never in effect (OnFailure is treated the same).
* Job deletion and the garbage collector (:meth:`Workloads.delete_job`):
  ``Foreground`` marks the Job (``deletionTimestamp``, finalizer
  ``foregroundDeletion``) and removes it once no pod with ``blockOwnerDeletion``
  is left; ``Background`` removes it at once; ``Orphan`` strips the pods'
  ownerReference to it, then removes it. The pods are deleted gracefully: one
  on a node keeps running (and its TPU) for ``timings.pod_termination`` with
  ``deletionTimestamp`` set, then ends Failed (exit 143) and is removed; an
  ended or unbound one goes at once. A Job being deleted gets no new pods.

Work triggered by store events is batched into one pass per loop iteration.
"""

from __future__ import annotations

import logging
import math
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from .kube_store import WatchEvent, copy_out, rfc3339
from .node_pools import TPU_RESOURCE
from .quantities import whole_units
from .selectors import node_matches, tolerates

if TYPE_CHECKING:
    from .cluster import SimCluster

log = logging.getLogger(__name__)

INDEX_KEY = "batch.kubernetes.io/job-completion-index"
JOB_NAME_LABEL = "batch.kubernetes.io/job-name"
CONTROLLER_UID_LABEL = "batch.kubernetes.io/controller-uid"
TERMINAL = ("Succeeded", "Failed")
FOREGROUND_FINALIZER = "foregroundDeletion"
_NAME_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"


def owner_job(pod: dict[str, Any]) -> tuple[str, str] | None:
    """(name, uid) of the Job controlling this pod, if any."""
    for ref in pod.get("metadata", {}).get("ownerReferences") or []:
        if ref.get("kind") == "Job" and ref.get("controller"):
            return ref.get("name", ""), ref.get("uid", "")
    return None


def tpu_request(pod: dict[str, Any]) -> int:
    """The pod's ``google.com/tpu`` (requests, else limits, summed over its containers)."""
    total = 0
    for c in (pod.get("spec") or {}).get("containers") or []:
        res = c.get("resources") or {}
        value = (res.get("requests") or {}).get(TPU_RESOURCE, (res.get("limits") or {}).get(TPU_RESOURCE, 0))
        total += quantity(value)
    return total


def quantity(value: Any) -> int:
    """A quantity (string or number) in whole units; 0 when absent or malformed."""
    try:
        return whole_units(value if value is not None else 0)
    except ValueError:
        return 0


def _env(container: dict[str, Any]) -> dict[str, str]:
    return {e.get("name", ""): str(e.get("value", "")) for e in container.get("env") or [] if "value" in e}


@dataclass(frozen=True)
class ContainerPlan:
    name: str
    run_seconds: float
    exit_code: int
    reason: str


def container_plan(container: dict[str, Any]) -> ContainerPlan:
    env = _env(container)
    try:
        run = max(0.0, float(env.get("FALCON_SIM_RUN_SECONDS", "1")))
    except ValueError:
        run = 1.0
    try:
        code = int(env.get("FALCON_SIM_EXIT_CODE", "0"))
    except ValueError:
        code = 1
    if env.get("FALCON_SIM_OOM", "").lower() in ("1", "true", "yes"):
        code = 137
    reason = "OOMKilled" if code == 137 else "Completed" if code == 0 else "Error"
    return ContainerPlan(container.get("name", "main"), run, code, reason)


def compress_indexes(indexes: set[int]) -> str:
    """{0,1,2,4} -> '0-2,4' (the format of status.completedIndexes)."""
    out: list[str] = []
    ordered = sorted(indexes)
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        out.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    return ",".join(out)


def _condition(ctype: str, reason: str, message: str, now: str) -> dict[str, str]:
    return {
        "type": ctype,
        "status": "True",
        "lastProbeTime": now,
        "lastTransitionTime": now,
        "reason": reason,
        "message": message,
    }


def job_finished(job: dict[str, Any]) -> str | None:
    for cond in (job.get("status") or {}).get("conditions") or []:
        if cond.get("type") in ("Complete", "Failed") and cond.get("status") == "True":
            return cond["type"]
    return None


def match_pod_failure_policy(
    policy: dict[str, Any] | None, pod: dict[str, Any]
) -> tuple[str | None, bool, str | None]:
    """(FailJob message, counts toward backoffLimit, action) for a Failed pod, as the job controller's
    ``matchPodFailurePolicy`` (kubernetes pkg/controller/job/pod_failure_policy.go): rules in order, the
    first match wins; a rule with an unknown action is skipped; no match is the default (counted)."""
    if not policy:
        return None, True, None
    md = pod.get("metadata") or {}
    status = pod.get("status") or {}
    for index, rule in enumerate(policy.get("rules") or []):
        action = rule.get("action")
        message = None
        if rule.get("onExitCodes") is not None:
            container = _matching_container(status, rule["onExitCodes"])
            if container is None:
                continue
            code = container["state"]["terminated"].get("exitCode")
            message = (
                f"Container {container.get('name')} for pod {md.get('namespace')}/{md.get('name')} failed with "
                f"exit code {code} matching {action} rule at index {index}"
            )
        elif rule.get("onPodConditions"):
            condition = _matching_condition(status, rule["onPodConditions"])
            if condition is None:
                continue
            message = (
                f"Pod {md.get('namespace')}/{md.get('name')} has condition {condition.get('type')} matching "
                f"{action} rule at index {index}"
            )
        else:
            continue
        if action == "Ignore":
            return None, False, "Ignore"
        if action == "Count":
            return None, True, "Count"
        if action == "FailJob":
            return message, True, "FailJob"
        # FailIndex needs backoffLimitPerIndex (not modelled); unknown actions are skipped
    return None, True, None


def _matching_container(status: dict[str, Any], req: dict[str, Any]) -> dict[str, Any] | None:
    values = req.get("values") or []
    for key in ("containerStatuses", "initContainerStatuses"):
        for cs in status.get(key) or []:
            terminated = (cs.get("state") or {}).get("terminated")
            if terminated is None:
                continue
            if req.get("containerName") is not None and req["containerName"] != cs.get("name"):
                continue
            code = terminated.get("exitCode", 0)
            if code == 0:
                continue
            if (req.get("operator") == "In" and code in values) or (
                req.get("operator") == "NotIn" and code not in values
            ):
                return cs
    return None


def _matching_condition(status: dict[str, Any], patterns: list[dict[str, Any]]) -> dict[str, Any] | None:
    for cond in status.get("conditions") or []:
        for pattern in patterns:
            if cond.get("type") == pattern.get("type") and cond.get("status") == pattern.get(
                "status", "True"
            ):
                return cond
    return None


@dataclass
class JobTrack:
    counted: set[str] = field(default_factory=set)
    succeeded: int = 0
    failed: int = 0
    ignored: int = 0  # failed pods a podFailurePolicy Ignore rule matched: not in status.failed
    succeeded_indexes: set[int] = field(default_factory=set)
    deadline_armed: bool = False
    policy: dict[str, Any] | None = None  # spec.podFailurePolicy
    fail_job_message: str | None = None  # set by the first pod that matched a FailJob rule

    def count(self, pod: dict[str, Any], phase: str) -> None:
        uid = pod["metadata"]["uid"]
        if uid in self.counted:
            return
        self.counted.add(uid)
        if phase == "Succeeded":
            self.succeeded += 1
            index = (pod["metadata"].get("annotations") or {}).get(INDEX_KEY)
            if index is not None and index.isdigit():
                self.succeeded_indexes.add(int(index))
            return
        if (pod.get("status") or {}).get("phase") == "Failed":  # only Failed pods are matched
            message, counts, _action = match_pod_failure_policy(self.policy, pod)
            if not counts:
                self.ignored += 1
                return
            if message and self.fail_job_message is None:
                self.fail_job_message = message
        self.failed += 1


class Workloads:
    def __init__(self, cluster: SimCluster):
        self.cluster = cluster
        self.store = cluster.store
        self._dirty_jobs: set[tuple[str, str]] = set()
        self._schedule_needed = False
        self._pass_armed = False
        self._tracks: dict[str, JobTrack] = {}
        self._unschedulable_msg: dict[str, str] = {}
        self._bound: set[str] = set()  # uids of pods the kubelet has taken over
        self.logs: dict[str, list[str]] = {}  # pod uid -> log lines
        # kept by _on_event, for the stored pods: the controlling Job's uid -> its pods' (namespace, name)
        self._owned: dict[str, set[tuple[str, str]]] = {}
        self._owner_of: dict[tuple[str, str], str] = {}
        self._tpu: dict[str, tuple[Any, int]] = {}  # pod uid -> (resourceVersion, tpu_request)
        self.store.add_listener(self._on_event)

    def pod_tpu(self, pod: dict[str, Any]) -> int:
        """``tpu_request`` of a stored pod, worked out once per resourceVersion (a stored object is
        never changed in place: a write stores a new one with a new resourceVersion)."""
        md = pod["metadata"]
        rv = md.get("resourceVersion")
        hit = self._tpu.get(md["uid"])
        if hit is not None and hit[0] == rv:
            return hit[1]
        want = tpu_request(pod)
        self._tpu[md["uid"]] = (rv, want)
        return want

    def _job_pods(self, namespace: str, job_uid: str) -> list[dict[str, Any]]:
        """The stored pods of ``namespace`` whose controller is the Job ``job_uid``, in the
        store's order (as ``store.list`` filtered by ``owner_job``)."""
        keys = sorted(k for k in self._owned.get(job_uid, ()) if k[0] == namespace)
        return [self.store.get("pods", *k) for k in keys]  # type: ignore[misc]

    def _index_owner(self, key: tuple[str, str], owner_uid: str | None) -> None:
        old = self._owner_of.get(key)
        if old == owner_uid:
            return
        if old is not None:
            keys = self._owned[old]
            keys.discard(key)
            if not keys:
                del self._owned[old]
            del self._owner_of[key]
        if owner_uid is not None:
            self._owner_of[key] = owner_uid
            self._owned.setdefault(owner_uid, set()).add(key)

    # ---- event intake --------------------------------------------------------------------------
    def _on_event(self, ev: WatchEvent) -> None:
        if ev.plural == "jobs":
            md = ev.obj["metadata"]
            if ev.type == "DELETED":
                self._tracks.pop(md["uid"], None)
            else:
                self._dirty_jobs.add((md.get("namespace", ""), md["name"]))
        elif ev.plural == "pods":
            md = ev.obj["metadata"]
            owner = owner_job(ev.obj)
            phase = (ev.obj.get("status") or {}).get("phase", "Pending")
            self._index_owner(
                (md.get("namespace", ""), md["name"]), owner[1] if owner and ev.type != "DELETED" else None
            )
            if owner:
                self._dirty_jobs.add((md.get("namespace", ""), owner[0]))
                if ev.type == "DELETED":
                    track = self._tracks.get(owner[1])
                    if track is not None:
                        track.count(ev.obj, phase if phase in TERMINAL else "Failed")
            if ev.type == "DELETED":
                self.logs.pop(md["uid"], None)
                self._bound.discard(md["uid"])
                self._unschedulable_msg.pop(md["uid"], None)
                self._tpu.pop(md["uid"], None)
            self._schedule_needed = True
        elif ev.plural == "nodes":
            self._schedule_needed = True
        else:
            return
        self._arm()

    def _arm(self) -> None:
        if not self._pass_armed:
            self._pass_armed = True
            self.cluster.call_soon(self._run_pass)

    def _run_pass(self) -> None:
        self._pass_armed = False
        if self._schedule_needed:
            self._schedule_needed = False
            self._schedule()
        while self._dirty_jobs:
            ns, name = self._dirty_jobs.pop()
            try:
                self._sync_job(ns, name)
            except Exception:  # noqa: BLE001 - one odd Job must not stall the others
                log.exception("sim cluster %s: syncing Job %s/%s failed", self.cluster.config.name, ns, name)
        self.cluster.refresh_idle()

    # ---- job controller ------------------------------------------------------------------------
    def delete_job(self, namespace: str, name: str, propagation: str) -> dict[str, Any] | None:
        """Delete a Job the way the apiserver and the garbage collector do, per ``propagation``.

        * ``Foreground``: the Job gets ``deletionTimestamp`` and the ``foregroundDeletion`` finalizer
          and stays (the caller answers it); its pods are deleted (:meth:`delete_pod_gracefully`);
          once no pod that blocks its deletion remains, the Job is removed (see :meth:`_sync_deleting`).
        * ``Background``: the Job is removed now, then its pods are deleted gracefully.
        * ``Orphan``: its pods lose their ownerReference to it, then the Job is removed.

        A Job already being deleted is returned unchanged. Returns the Job (as stored, or as removed),
        None when absent.
        """
        job = self.store.get("jobs", namespace, name)
        if job is None:
            return None
        md = job["metadata"]
        if md.get("deletionTimestamp"):
            return job
        uid = md["uid"]
        self.cluster.record_job_delete(job)
        if propagation == "Foreground":
            now = self.cluster.stamp()

            def mark(obj: dict[str, Any]) -> None:
                omd = obj["metadata"]
                omd["deletionTimestamp"] = now
                omd["deletionGracePeriodSeconds"] = 0
                finalizers = omd.setdefault("finalizers", [])
                if FOREGROUND_FINALIZER not in finalizers:
                    finalizers.append(FOREGROUND_FINALIZER)

            self.store.mutate("jobs", namespace, name, mark)
            for pod in self._dependents(namespace, uid):
                self.delete_pod_gracefully(pod)
            self._dirty_and_arm(namespace, name)  # removed by the pass once nothing blocks it
            return self.store.get("jobs", namespace, name) or job
        if propagation == "Orphan":
            for pod in self._dependents(namespace, uid):

                def orphan(obj: dict[str, Any]) -> None:
                    refs = [r for r in obj["metadata"].get("ownerReferences") or [] if r.get("uid") != uid]
                    if refs:
                        obj["metadata"]["ownerReferences"] = refs
                    else:
                        obj["metadata"].pop("ownerReferences", None)

                self.store.mutate("pods", namespace, pod["metadata"]["name"], orphan)
            return self.remove_job(namespace, name) or job
        gone = self.remove_job(namespace, name) or job
        for pod in self._dependents(namespace, uid):
            self.delete_pod_gracefully(pod)
        return gone

    def remove_job(self, namespace: str, name: str) -> dict[str, Any] | None:
        """Take the Job object out of the store (watch: DELETED) and note when in its record's ``gone_at``."""
        job = self.store.delete("jobs", namespace, name)
        if job is not None:
            rec = self.cluster.job_records.get((namespace, name))
            if rec is not None:
                rec.setdefault("gone_at", []).append(self.cluster.wall())
        return job

    def _dependents(self, namespace: str, owner_uid: str) -> list[dict[str, Any]]:
        """The pods with an ownerReference to ``owner_uid`` (controller or not)."""
        return [
            p
            for p in self.store.list("pods", namespace)
            if any(r.get("uid") == owner_uid for r in p["metadata"].get("ownerReferences") or [])
        ]

    def delete_pod_gracefully(self, pod: dict[str, Any]) -> None:
        """Delete a pod as the garbage collector's delete does: a pod that has ended (Succeeded/Failed)
        or was never bound to a node goes at once; one on a node gets ``deletionTimestamp`` (now +
        its grace period) and ``deletionGracePeriodSeconds``, keeps running and holding its TPU for
        ``timings.pod_termination``, then ends (Failed, exit 143) and is removed. A pod already
        terminating is left alone."""
        md = pod["metadata"]
        ns, name, uid = md.get("namespace", ""), md["name"], md["uid"]
        if md.get("deletionTimestamp"):
            return
        phase = (pod.get("status") or {}).get("phase", "Pending")
        grace = self.cluster.timings.pod_termination
        if phase in TERMINAL or not (pod.get("spec") or {}).get("nodeName") or grace <= 0:
            self.store.delete("pods", ns, name)
            return
        deadline = rfc3339_from(self.cluster.wall() + grace)
        whole_seconds = max(1, math.ceil(grace))

        def mark(obj: dict[str, Any]) -> None:
            obj["metadata"]["deletionTimestamp"] = deadline
            obj["metadata"]["deletionGracePeriodSeconds"] = whole_seconds

        self.store.mutate("pods", ns, name, mark)
        self.cluster.record_event(pod, "Normal", "Killing", "Stopping container(s)")
        self.cluster.call_later(grace, self._end_termination, ns, name, uid)

    def _end_termination(self, ns: str, name: str, uid: str) -> None:
        """The grace period of a deleted pod is over: its containers end (SIGTERM, exit 143), the pod
        is Failed, then removed (the kubelet's last status write, then its final delete)."""
        pod = self._live_pod(ns, name, uid)
        if pod is None:
            return
        if (pod.get("status") or {}).get("phase") == "Running":
            now = self.cluster.stamp()

            def end(obj: dict[str, Any]) -> None:
                st = obj["status"]
                st["phase"] = "Failed"
                for cond in st.get("conditions") or []:
                    if cond["type"] in ("Ready", "ContainersReady"):
                        cond.update(status="False", reason="PodCompleted", lastTransitionTime=now)
                for cs in st.get("containerStatuses") or []:
                    running = (cs.get("state") or {}).get("running")
                    if running is None:
                        continue
                    cs["state"] = {
                        "terminated": {
                            "exitCode": 143,
                            "reason": "Error",
                            "startedAt": running.get("startedAt", now),
                            "finishedAt": now,
                            "containerID": cs.get("containerID", ""),
                        }
                    }
                    cs["ready"] = False
                    cs["started"] = False

            self.store.mutate("pods", ns, name, end)
        self.store.delete("pods", ns, name)

    def _sync_deleting(self, job: dict[str, Any]) -> None:
        """A Job with ``deletionTimestamp``: no new pods. Remove it once its ``foregroundDeletion``
        finalizer has nothing left to wait for (no pod with ``blockOwnerDeletion`` remains), as the
        garbage collector does; until then keep ``active`` / ``terminating`` / ``ready`` current."""
        md = job["metadata"]
        ns, name, uid = md.get("namespace", ""), md["name"], md["uid"]
        pods = self._dependents(ns, uid)
        blocking = [
            p
            for p in pods
            if any(
                r.get("uid") == uid and r.get("blockOwnerDeletion")
                for r in p["metadata"].get("ownerReferences") or []
            )
        ]
        finalizers = md.get("finalizers") or []
        if not finalizers:  # a client took the finalizer off: nothing holds the object any more
            self.remove_job(ns, name)
            return
        if not blocking:
            # the GC drops its finalizer; with no finalizer left the apiserver removes the object
            others = [f for f in finalizers if f != FOREGROUND_FINALIZER]
            if not others:
                self.remove_job(ns, name)
                return
            if len(others) != len(finalizers):

                def drop(obj: dict[str, Any]) -> None:
                    obj["metadata"]["finalizers"] = others

                self.store.mutate("jobs", ns, name, drop)
        running = [p for p in pods if (p.get("status") or {}).get("phase", "Pending") not in TERMINAL]
        active = [p for p in running if not p["metadata"].get("deletionTimestamp")]
        terminating = len(running) - len(active)
        ready = sum(1 for p in active if _pod_ready(p))

        def write(obj: dict[str, Any]) -> None:
            st = obj.setdefault("status", {})
            if active:
                st["active"] = len(active)
            else:
                st.pop("active", None)
            st["ready"] = ready
            st["terminating"] = terminating

        self.store.mutate("jobs", ns, name, write)

    def _sync_job(self, ns: str, name: str) -> None:
        job = self.store.get("jobs", ns, name)
        if job is None:
            return
        if job["metadata"].get("deletionTimestamp"):
            self._sync_deleting(job)
            return
        if job_finished(job):
            return
        uid = job["metadata"]["uid"]
        spec = job.get("spec") or {}
        track = self._tracks.setdefault(uid, JobTrack())
        track.policy = spec.get("podFailurePolicy")
        pods = self._job_pods(ns, uid)
        for p in pods:
            phase = (p.get("status") or {}).get("phase", "Pending")
            if phase in TERMINAL:
                track.count(p, phase)
        active = [p for p in pods if (p.get("status") or {}).get("phase", "Pending") not in TERMINAL]

        parallelism = int(spec.get("parallelism", 1) or 0)
        completions = spec.get("completions")
        backoff_limit = int(spec.get("backoffLimit", 6))
        indexed = spec.get("completionMode") == "Indexed"
        suspended = bool(spec.get("suspend"))
        status = copy_out(job.get("status") or {})
        now = self.cluster.stamp()
        if not suspended and not status.get("startTime"):
            status["startTime"] = now

        finish: tuple[str, str, str] | None = None
        deadline = spec.get("activeDeadlineSeconds")
        if track.fail_job_message is not None:
            finish = ("Failed", "PodFailurePolicy", track.fail_job_message)
        elif track.failed > backoff_limit:
            finish = ("Failed", "BackoffLimitExceeded", "Job has reached the specified backoff limit")
        elif (
            deadline is not None and status.get("startTime") and self._job_age(job, status) >= float(deadline)
        ):
            finish = ("Failed", "DeadlineExceeded", "Job was active longer than specified deadline")
        elif indexed and completions is not None and len(track.succeeded_indexes) >= int(completions):
            finish = ("Complete", "CompletionsReached", "Reached expected number of succeeded pods")
        elif not indexed and completions is not None and track.succeeded >= int(completions):
            finish = ("Complete", "CompletionsReached", "Reached expected number of succeeded pods")
        elif not indexed and completions is None and track.succeeded >= 1 and not active:
            finish = ("Complete", "CompletionsReached", "Reached expected number of succeeded pods")

        if finish and finish[0] == "Failed":
            for p in active:
                self.store.delete("pods", ns, p["metadata"]["name"])  # the listener counts them as failed
            active = []
        elif finish is None and not suspended:
            active += self._create_missing_pods(job, active, track, parallelism, completions, indexed)
            if deadline is not None and not track.deadline_armed:
                track.deadline_armed = True
                remaining = float(deadline) - self._job_age(job, status)
                self.cluster.call_later(max(0.0, remaining) + 0.01, self._dirty_and_arm, ns, name)

        ready = sum(1 for p in active if _pod_ready(p))
        for key, value in (("active", len(active)), ("succeeded", track.succeeded), ("failed", track.failed)):
            if value:
                status[key] = value
            else:
                status.pop(key, None)
        status["ready"] = ready
        status["terminating"] = 0
        status.setdefault("uncountedTerminatedPods", {})
        if indexed and track.succeeded_indexes:
            status["completedIndexes"] = compress_indexes(track.succeeded_indexes)
        if finish:
            kind, reason, message = finish
            first = "SuccessCriteriaMet" if kind == "Complete" else "FailureTarget"
            status["conditions"] = (status.get("conditions") or []) + [
                _condition(first, reason, message, now),
                _condition(kind, reason, message, now),
            ]
            if kind == "Complete":
                status["completionTime"] = now
                self.cluster.record_event(job, "Normal", "Completed", "Job completed")
            else:
                self.cluster.record_event(job, "Warning", reason, message)

        def write(obj: dict[str, Any]) -> None:
            obj["status"] = status

        self.store.mutate("jobs", ns, name, write)

    def _dirty_and_arm(self, ns: str, name: str) -> None:
        self._dirty_jobs.add((ns, name))
        self._arm()

    def _job_age(self, job: dict[str, Any], status: dict[str, Any]) -> float:
        try:
            start = datetime.strptime(status["startTime"], "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
        except (KeyError, ValueError):
            return 0.0
        return self.cluster.wall() - start.timestamp()

    def _create_missing_pods(
        self,
        job: dict[str, Any],
        active: list[dict[str, Any]],
        track: JobTrack,
        parallelism: int,
        completions: Any,
        indexed: bool,
    ) -> list[dict[str, Any]]:
        room = parallelism - len(active)
        if room <= 0:
            return []
        created = []
        if indexed:
            busy = set()
            for p in active:
                idx = (p["metadata"].get("annotations") or {}).get(INDEX_KEY, "")
                if idx.isdigit():
                    busy.add(int(idx))
            todo = [i for i in range(int(completions)) if i not in track.succeeded_indexes and i not in busy]
            for i in todo[:room]:
                created.append(self._create_pod(job, i))
        else:
            if completions is not None:
                want = min(room, int(completions) - track.succeeded - len(active))
            else:
                want = room if track.succeeded == 0 else 0
            for _ in range(max(0, want)):
                created.append(self._create_pod(job, None))
        return created

    def _create_pod(self, job: dict[str, Any], index: int | None) -> dict[str, Any]:
        jmd = job["metadata"]
        template = copy_out((job.get("spec") or {}).get("template") or {})
        md = template.get("metadata") or {}
        labels = dict(md.get("labels") or {})
        annotations = dict(md.get("annotations") or {})
        labels.update(
            {
                CONTROLLER_UID_LABEL: jmd["uid"],
                JOB_NAME_LABEL: jmd["name"],
                "controller-uid": jmd["uid"],
                "job-name": jmd["name"],
            }
        )
        spec = template.get("spec") or {}
        base = jmd["name"]
        if index is not None:
            labels[INDEX_KEY] = str(index)
            annotations[INDEX_KEY] = str(index)
            spec["hostname"] = f"{jmd['name']}-{index}"[:63]
            base = f"{jmd['name']}-{index}"
            for c in spec.get("containers") or []:
                env = c.setdefault("env", [])
                if not any(e.get("name") == "JOB_COMPLETION_INDEX" for e in env):
                    env.append(
                        {
                            "name": "JOB_COMPLETION_INDEX",
                            "valueFrom": {"fieldRef": {"fieldPath": f"metadata.annotations['{INDEX_KEY}']"}},
                        }
                    )
        spec.setdefault("restartPolicy", "Never")
        spec.setdefault("schedulerName", "default-scheduler")
        pod = {
            "metadata": {
                "namespace": jmd.get("namespace", "default"),
                "labels": labels,
                "annotations": annotations,
                "ownerReferences": [
                    {
                        "apiVersion": "batch/v1",
                        "kind": "Job",
                        "name": jmd["name"],
                        "uid": jmd["uid"],
                        "controller": True,
                        "blockOwnerDeletion": True,
                    }
                ],
            },
            "spec": spec,
            "status": {"phase": "Pending", "qosClass": "BestEffort"},
        }
        while True:
            suffix = "".join(self.cluster.rng.choice(_NAME_ALPHABET) for _ in range(5))
            pod["metadata"]["name"] = f"{base[:57]}-{suffix}"
            if self.store.get("pods", pod["metadata"]["namespace"], pod["metadata"]["name"]) is None:
                break
        created = self.store.create("pods", pod)
        self.cluster.record_event(
            job, "Normal", "SuccessfulCreate", f"Created pod: {created['metadata']['name']}"
        )
        return created

    # ---- scheduler -----------------------------------------------------------------------------
    def _schedule(self) -> None:
        nodes = [n for n in self.store.list("nodes") if _node_ready(n)]
        used: Counter[str] = Counter()
        pending = []
        for pod in self.store.list("pods"):
            phase = (pod.get("status") or {}).get("phase", "Pending")
            node = (pod.get("spec") or {}).get("nodeName")
            if node:
                if phase not in TERMINAL:
                    used[node] += self.pod_tpu(pod)  # a terminating pod holds its TPU until it is gone
                if pod["metadata"].get("deletionTimestamp"):
                    continue
                if phase == "Pending" and pod["metadata"]["uid"] not in self._bound:
                    pending.append(pod)  # created with spec.nodeName: the kubelet still has to start it
            elif phase == "Pending":
                pending.append(pod)
        pending.sort(key=lambda p: (p["metadata"].get("creationTimestamp", ""), p["metadata"]["name"]))
        by_name = {n["metadata"]["name"]: n for n in nodes}
        alloc: dict[str, int] = {}
        for pod in pending:
            try:
                self._place(pod, nodes, by_name, used, alloc)
            except Exception:  # noqa: BLE001 - one odd pod must not stall scheduling
                md = pod["metadata"]
                log.exception(
                    "sim cluster %s: scheduling %s/%s failed",
                    self.cluster.config.name,
                    md.get("namespace"),
                    md["name"],
                )

    def _place(
        self,
        pod: dict[str, Any],
        nodes: list[dict[str, Any]],
        by_name: dict[str, dict[str, Any]],
        used: Counter[str],
        alloc: dict[str, int],
    ) -> None:
        """Bind one pending pod, or record why it cannot be bound (``alloc``: the allocatable
        ``google.com/tpu`` of the nodes read so far in this pass, by name)."""
        spec = pod.get("spec") or {}
        preset = spec.get("nodeName")
        if preset:
            if preset in by_name:  # bound by its creator; the kubelet of that node starts it
                self._bind(pod, by_name[preset])
            return
        want = self.pod_tpu(pod)
        requested = {TPU_RESOURCE} if want else set()
        reasons: Counter[str] = Counter()
        for node in nodes:
            if not node_matches(spec, node):
                reasons["node(s) didn't match Pod's node affinity/selector"] += 1
                continue
            taints = (node.get("spec") or {}).get("taints") or []
            blocking = [t for t in taints if not tolerates(spec, t, requested)]
            if blocking:
                t = blocking[0]
                reasons[f"node(s) had untolerated taint {{{t.get('key')}: {t.get('value', '')}}}"] += 1
                continue
            name = node["metadata"]["name"]
            allocatable = alloc.get(name)
            if allocatable is None:
                allocatable = alloc[name] = quantity(
                    (node.get("status") or {}).get("allocatable", {}).get(TPU_RESOURCE, "0")
                )
            if want > allocatable - used[name]:
                reasons[f"Insufficient {TPU_RESOURCE}"] += 1
                continue
            used[node["metadata"]["name"]] += want
            self._bind(pod, node)
            return
        self._mark_unschedulable(pod, len(nodes), reasons)

    def _mark_unschedulable(self, pod: dict[str, Any], total: int, reasons: Counter[str]) -> None:
        if total == 0:
            message = "no nodes available to schedule pods"
        else:
            detail = ", ".join(f"{n} {r}" for r, n in sorted(reasons.items()))
            message = f"0/{total} nodes are available: {detail}."
        uid = pod["metadata"]["uid"]
        if self._unschedulable_msg.get(uid) == message:
            return
        self._unschedulable_msg[uid] = message
        now = self.cluster.stamp()

        def change(p: dict[str, Any]) -> None:
            st = p.setdefault("status", {})
            st["phase"] = "Pending"
            st["conditions"] = [
                {
                    "type": "PodScheduled",
                    "status": "False",
                    "reason": "Unschedulable",
                    "message": message,
                    "lastProbeTime": None,
                    "lastTransitionTime": now,
                }
            ]

        md = pod["metadata"]
        self.store.mutate("pods", md["namespace"], md["name"], change)
        self.cluster.record_event(pod, "Warning", "FailedScheduling", message)

    def _bind(self, pod: dict[str, Any], node: dict[str, Any]) -> None:
        md = pod["metadata"]
        node_name = node["metadata"]["name"]
        host_ip = next(
            (
                a["address"]
                for a in node.get("status", {}).get("addresses", [])
                if a.get("type") == "InternalIP"
            ),
            "",
        )
        now = self.cluster.stamp()
        self._unschedulable_msg.pop(md["uid"], None)
        self._bound.add(md["uid"])

        def change(p: dict[str, Any]) -> None:
            p["spec"]["nodeName"] = node_name
            st = p.setdefault("status", {})
            st["phase"] = "Pending"
            st["hostIP"] = host_ip
            st["conditions"] = [
                {"type": "PodScheduled", "status": "True", "lastProbeTime": None, "lastTransitionTime": now}
            ]
            st["containerStatuses"] = [
                {
                    "name": c.get("name", "main"),
                    "image": c.get("image", ""),
                    "imageID": "",
                    "ready": False,
                    "restartCount": 0,
                    "started": False,
                    "state": {"waiting": {"reason": "ContainerCreating"}},
                    "lastState": {},
                }
                for c in p["spec"].get("containers") or []
            ]

        self.store.mutate("pods", md["namespace"], md["name"], change)
        self.cluster.record_event(
            pod, "Normal", "Scheduled", f"Successfully assigned {md['namespace']}/{md['name']} to {node_name}"
        )
        self.cluster.call_later(
            self.cluster.draw("pod_start"), self._start_pod, md["namespace"], md["name"], md["uid"]
        )

    # ---- kubelet -------------------------------------------------------------------------------
    def _live_pod(self, ns: str, name: str, uid: str) -> dict[str, Any] | None:
        pod = self.store.get("pods", ns, name)
        if pod is None or pod["metadata"]["uid"] != uid:
            return None
        return pod

    def _start_pod(self, ns: str, name: str, uid: str) -> None:
        pod = self._live_pod(ns, name, uid)
        if pod is None or (pod.get("status") or {}).get("phase") != "Pending":
            return
        if pod["metadata"].get("deletionTimestamp"):
            return  # deleted before its containers started: it is removed when its grace period ends
        plans = [container_plan(c) for c in pod["spec"].get("containers") or []]
        now = self.cluster.stamp()
        started = self.cluster.wall()
        ip = f"10.{64 + self.cluster.index % 64}.{(self.store.rv // 250) % 250}.{self.store.rv % 250 + 2}"

        def change(p: dict[str, Any]) -> None:
            st = p["status"]
            st["phase"] = "Running"
            st["startTime"] = now
            st["podIP"] = ip
            st["podIPs"] = [{"ip": ip}]
            st["conditions"] = [
                {"type": t, "status": "True", "lastProbeTime": None, "lastTransitionTime": now}
                for t in (
                    "PodReadyToStartContainers",
                    "Initialized",
                    "Ready",
                    "ContainersReady",
                    "PodScheduled",
                )
            ]
            for cs in st.get("containerStatuses") or []:
                cs["state"] = {"running": {"startedAt": now}}
                cs["ready"] = True
                cs["started"] = True
                cs["containerID"] = f"containerd://{uid.replace('-', '')}{cs['name']}"[:76]

        self.store.mutate("pods", ns, name, change)
        owner = owner_job(pod)
        if owner is not None:
            self.cluster.record_job_ran(ns, owner[0])
        self.logs[uid] = [
            f"[falcon-sim] {now} container {pl.name} started on {pod['spec'].get('nodeName')}; "
            f"will run {pl.run_seconds:g}s and exit {pl.exit_code}"
            for pl in plans
        ]
        self.cluster.record_event(pod, "Normal", "Started", "Started container(s)")
        duration = max((pl.run_seconds for pl in plans), default=0.0)
        self.cluster.call_later(duration, self._finish_pod, ns, name, uid, plans, started)

    def _finish_pod(self, ns: str, name: str, uid: str, plans: list[ContainerPlan], started: float) -> None:
        pod = self._live_pod(ns, name, uid)
        if pod is None or (pod.get("status") or {}).get("phase") != "Running":
            return
        by_name = {pl.name: pl for pl in plans}
        failed = any(pl.exit_code != 0 for pl in plans)
        now = self.cluster.stamp()

        def change(p: dict[str, Any]) -> None:
            st = p["status"]
            st["phase"] = "Failed" if failed else "Succeeded"
            for cond in st.get("conditions") or []:
                if cond["type"] in ("Ready", "ContainersReady"):
                    cond.update(status="False", reason="PodCompleted", lastTransitionTime=now)
            for cs in st.get("containerStatuses") or []:
                pl = by_name.get(cs["name"])
                if pl is None:
                    continue
                started_at = (cs.get("state") or {}).get("running", {}).get("startedAt", now)
                finished_at = rfc3339_from(started + pl.run_seconds)
                cs["state"] = {
                    "terminated": {
                        "exitCode": pl.exit_code,
                        "reason": pl.reason,
                        "startedAt": started_at,
                        "finishedAt": finished_at,
                        "containerID": cs.get("containerID", ""),
                    }
                }
                cs["ready"] = False
                cs["started"] = False

        self.store.mutate("pods", ns, name, change)
        for pl in plans:
            self.logs.setdefault(uid, []).append(
                f"[falcon-sim] {now} container {pl.name} exited with code {pl.exit_code} ({pl.reason})"
            )
        if pod["metadata"].get("deletionTimestamp"):
            self.store.delete("pods", ns, name)  # ended inside its grace period: the kubelet removes it now


def rfc3339_from(ts: float) -> str:
    return rfc3339(datetime.fromtimestamp(ts, UTC))


def _node_ready(node: dict[str, Any]) -> bool:
    if (node.get("spec") or {}).get("unschedulable"):
        return False
    return any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in (node.get("status") or {}).get("conditions") or []
    )


def _pod_ready(pod: dict[str, Any]) -> bool:
    return any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in (pod.get("status") or {}).get("conditions") or []
    )
