"""falcon_ray.kube against a simulated cluster: the real kubernetes client, no mocks.

The client is built exactly as the controller builds it: ``GkeApi.get_cluster`` for the
endpoint and CA, ``google.auth.default()`` credentials, ``api_client(...)`` with the
refreshing bearer-token hook (scheme http: the simulator's only difference).
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest

from falcon_ray import render
from falcon_ray.errors import CloudError, ErrorKind
from falcon_ray.gcp import default_credentials
from falcon_ray.kube import JobObservation, JobWatcher, KubeApi, api_client
from falcon_ray.spec import TaskSpec
from falcon_ray.store.repository import Cluster
from tests.clients.test_clients_gcp import create, delete, gke_api, registry_cluster, wait_done
from tests.harness.sim import FAST_TIMINGS, InThread, advance_until, open_watches, poll_until

CLUSTER = "sim-k"
NAMESPACE = "falcon-jobs"
_TASK_IDS = itertools.count(920_000)
POD_START = FAST_TIMINGS["pod_start"]  # a bound pod runs this long after its bind (a constant)
RUN = 0.2  # ``submit``'s FALCON_SIM_RUN_SECONDS


def make_kube(fleet, cluster: str = CLUSTER) -> KubeApi:
    c = fleet.config.cluster(cluster)
    endpoint = gke_api(fleet).get_cluster(c.project, c.location, cluster)
    client = api_client(endpoint.endpoint, endpoint.ca_certificate_pem, default_credentials(), scheme="http")
    return KubeApi(client, request_timeout=10, retry_initial=0.01, retry_maximum=0.05, retry_timeout=3)


@dataclass
class Pools:
    cluster: Cluster
    single: str  # a 1-host 2x2 pool
    multi: str  # a 2-host 2x4 pool


def _cluster_and_pools(sim) -> tuple[Cluster, dict[str, tuple[str, object]]]:
    """sim-k as the registry has it (this file's bucket and namespace), and per topology (a
    1-host 2x2, a 2-host 2x4) the name and the create request of an on-demand pool."""
    c = registry_cluster(sim, CLUSTER)
    c = Cluster(**{**c.to_dict(), "gcs_bucket": "logs-sim-k", "namespace": NAMESPACE})
    requests = {}
    for topology in ("2x2", "2x4"):
        task_id = next(_TASK_IDS)
        spec = TaskSpec(tpu_type="v6e", topology=topology, image="busybox", command=["true"])
        name = render.node_pool_name(task_id, topology)
        requests[topology] = (name, render.node_pool_request(spec, c, "on-demand", name, task_id, idle_seconds=600))
    return c, requests


@pytest.fixture(scope="module")
def pools(sim_fleet) -> Iterator[Pools]:
    sim_fleet.reset_faults()
    api = gke_api(sim_fleet)
    c, requests = _cluster_and_pools(sim_fleet)
    names = {}
    for topology, (name, request) in requests.items():
        wait_done(api, c, create(api, c, request))
        names[topology] = name
    kube = make_kube(sim_fleet)
    for name in names.values():
        poll_until(
            lambda name=name: (
                (nodes := kube.list_nodes(f"cloud.google.com/gke-nodepool={name}"))
                and all(n.ready for n in nodes)
            ),
            timeout=10,
            what=f"nodes of {name}",
        )
    yield Pools(c, names["2x2"], names["2x4"])
    for name in names.values():
        delete(api, c, name)


@pytest.fixture
def kube(sim, pools) -> KubeApi:
    return make_kube(sim)


@pytest.fixture
def vkube(virtual_sim) -> tuple[KubeApi, Pools]:
    """A ``KubeApi`` on sim-k of a fleet on a ``ManualClock`` (fresh for the test, nothing in it
    moves unless the test moves it), with a 1-host 2x2 and a 2-host 2x4 pool whose nodes are ready."""
    sim = virtual_sim
    api = gke_api(sim)
    c, requests = _cluster_and_pools(sim)
    names = {}
    for topology, (name, request) in requests.items():
        names[topology] = name
        op = api.create_node_pool(c.project, c.location, c.name, request)
        advance_until(sim, lambda op=op: api.get_operation(c.project, c.location, op).done, 60, what=f"pool {name}")
    kube = make_kube(sim)
    for name in names.values():
        advance_until(
            sim,
            lambda name=name: (
                (nodes := kube.list_nodes(f"cloud.google.com/gke-nodepool={name}")) and all(n.ready for n in nodes)
            ),
            60,
            what=f"nodes of {name}",
        )
    sim.advance(0)  # every effect due at this instant has run
    return kube, Pools(c, names["2x2"], names["2x4"])


def _advance_to(fleet, at: float) -> None:
    """Move ``fleet``'s clock to its monotonic time ``at`` exactly (``at - now`` added to now is ``at``)."""
    fleet.advance(at - fleet.clock.monotonic())


def submit(kube: KubeApi, pools: Pools, topology: str = "2x2", **env: str) -> tuple[int, dict]:
    task_id = next(_TASK_IDS)
    spec = TaskSpec(
        tpu_type="v6e",
        topology=topology,
        image="us-docker.pkg.dev/proj/repo/train:1",
        command=["python3", "train.py"],
        env={"FALCON_SIM_RUN_SECONDS": str(RUN), **env},
    )
    pool = pools.single if topology == "2x2" else pools.multi
    queue = render.queue_label(CLUSTER, topology)
    if spec.shape.multi_host:
        kube.create_service(render.headless_service(task_id, spec, pools.cluster))
    return task_id, render.job_manifest(task_id, spec, pools.cluster, pool, queue)


def observe(kube: KubeApi, name: str) -> JobObservation | None:
    job = kube.get_job(NAMESPACE, name)
    return None if job is None else JobObservation.from_job(job)


def phase_at(fleet, kube: KubeApi, name: str, phase: str, at: float) -> JobObservation:
    """The Job ``name`` is not yet in ``phase`` 1 ms of the fleet's time before the instant ``at``
    and is at ``at``; return its observation there."""
    _advance_to(fleet, at - 0.001)
    before = observe(kube, name)
    assert before is None or before.phase != phase, f"{name} {phase} 1 ms early"
    _advance_to(fleet, at)
    obs = observe(kube, name)
    assert obs is not None and obs.phase == phase, (name, phase, obs)
    return obs


# --- Jobs ------------------------------------------------------------------------------


def test_job_runs_to_succeeded_and_a_repeated_create_adopts_it(virtual_sim, vkube):
    kube, pools = vkube
    task_id, manifest = submit(kube, pools)
    t0 = virtual_sim.clock.monotonic()
    ref = kube.create_job(manifest)
    assert ref.created and ref.uid and ref.name == render.job_name(task_id) and ref.namespace == NAMESPACE
    again = kube.create_job(manifest)  # 409 AlreadyExists -> adopt
    assert (again.created, again.uid) == (False, ref.uid)

    obs = phase_at(virtual_sim, kube, ref.name, "Succeeded", t0 + POD_START + RUN)  # pod start + run time
    assert obs.task_id == task_id and obs.uid == ref.uid and obs.expected == 1 and obs.succeeded == 1
    assert obs.labels[render.LABEL_QUEUE] == f"{CLUSTER}.2x2"
    jobs, rv = kube.list_jobs(NAMESPACE, f"{render.LABEL_TASK_ID}={task_id}")
    assert [j.name for j in jobs] == [ref.name] and rv

    assert kube.delete_job(NAMESPACE, ref.name) is True
    virtual_sim.advance(0)  # its pods ended: the delete removes the Job at once, the clock still
    assert kube.get_job(NAMESPACE, ref.name) is None
    assert kube.delete_job(NAMESPACE, ref.name) is False


def test_oom_killed_job_reports_the_pods_termination(virtual_sim, vkube):
    kube, pools = vkube
    _, manifest = submit(kube, pools, FALCON_SIM_EXIT_CODE="137", FALCON_SIM_OOM="1")
    t0 = virtual_sim.clock.monotonic()
    ref = kube.create_job(manifest)
    obs = phase_at(virtual_sim, kube, ref.name, "Failed", t0 + POD_START + RUN)
    assert obs.failed >= 1 and obs.message  # the Job's own condition text
    message = kube.job_failure_message(NAMESPACE, ref.name)
    assert "OOMKilled" in message and "exit code 137" in message
    assert message.startswith(f"Pod {ref.name}-") and "terminated" in message
    kube.delete_job(NAMESPACE, ref.name)


def test_plain_exit_code_failure(virtual_sim, vkube):
    kube, pools = vkube
    _, manifest = submit(kube, pools, FALCON_SIM_EXIT_CODE="3")
    t0 = virtual_sim.clock.monotonic()
    ref = kube.create_job(manifest)
    phase_at(virtual_sim, kube, ref.name, "Failed", t0 + POD_START + RUN)
    message = kube.job_failure_message(NAMESPACE, kube.get_job(NAMESPACE, ref.name))
    assert "(exit code 3)" in message and "OOMKilled" not in message
    kube.delete_job(NAMESPACE, ref.name)


def test_multi_host_job_has_one_pod_per_host_behind_a_headless_service(virtual_sim, vkube):
    kube, pools = vkube
    task_id, manifest = submit(kube, pools, topology="2x4", FALCON_SIM_RUN_SECONDS="0.5")
    name = render.job_name(task_id)
    assert kube.create_service(render.headless_service(task_id, None, pools.cluster)) is False  # exists
    t0 = virtual_sim.clock.monotonic()
    kube.create_job(manifest)
    running = phase_at(virtual_sim, kube, name, "Running", t0 + POD_START)  # both pods started at pod_start
    assert running.expected == 2 and running.ready == 2
    pods = kube.list_pods(NAMESPACE, f"job-name={name}")
    assert len(pods) == 2 and all(p.node_name for p in pods)
    nodes = {n.name: n for n in kube.list_nodes(f"cloud.google.com/gke-nodepool={pools.multi}")}
    assert {p.node_name for p in pods} == set(nodes)
    phase_at(virtual_sim, kube, name, "Succeeded", t0 + POD_START + 0.5)
    assert kube.delete_job(NAMESPACE, name) and kube.delete_service(NAMESPACE, name)
    assert kube.delete_service(NAMESPACE, name) is False


def test_a_job_of_another_task_is_not_adopted(kube, pools):
    task_id, manifest = submit(kube, pools)
    kube.create_job(manifest)
    impostor = {**manifest, "metadata": {**manifest["metadata"], "labels": {"falcon.dev/task-id": "1"}}}
    with pytest.raises(CloudError) as info:
        kube.create_job(impostor)
    assert info.value.kind == ErrorKind.ALREADY_EXISTS and f"belongs to task {task_id}" in info.value.message
    kube.delete_job(NAMESPACE, render.job_name(task_id))


def test_admission_denial_is_permanent_with_the_webhooks_message(sim, kube, pools):
    sim.set_faults(CLUSTER, deny_images=["us-docker.pkg.dev/proj/"])
    _, manifest = submit(kube, pools)
    with pytest.raises(CloudError) as info:
        kube.create_job(manifest)
    assert info.value.kind == ErrorKind.PERMANENT and info.value.status_code == 403
    assert "denied" in info.value.message


def test_an_unreachable_admission_webhook_is_a_refusal_for_now_then_the_job_is_accepted(sim, kube, pools):
    before = sim.stats()["clusters"][CLUSTER]["fault_counts"]["webhook_unavailable"]
    sim.set_faults(CLUSTER, webhook_unavailable=True)
    task_id, manifest = submit(kube, pools)
    with pytest.raises(CloudError) as info:
        kube.create_job(manifest)  # retried for the client's budget (3 s), then surfaced
    assert info.value.kind == ErrorKind.TRANSIENT and info.value.status_code == 500
    assert 'failed calling webhook "policy.example.com"' in info.value.message
    refused = sim.stats()["clusters"][CLUSTER]["fault_counts"]["webhook_unavailable"] - before
    assert refused >= 2, refused  # the client asked again before giving up
    assert not [j for j in sim.stats()["clusters"][CLUSTER]["jobs"] if j["name"] == render.job_name(task_id)]
    sim.set_faults(CLUSTER, webhook_unavailable=False)
    assert kube.create_job(manifest).created
    kube.delete_job(NAMESPACE, render.job_name(task_id))


def test_transient_kubernetes_errors_surface_after_the_retry_budget(kube, pools):
    unreachable = KubeApi(
        api_client("127.0.0.1:9", None, default_credentials(), scheme="http"),
        retry_timeout=0.2,
        retry_initial=0.01,
    )
    with pytest.raises(CloudError) as info:
        unreachable.get_job(NAMESPACE, "x")
    assert info.value.kind == ErrorKind.TRANSIENT and info.value.status_code is None


# --- tokens ----------------------------------------------------------------------------


def test_a_token_the_cluster_refuses_is_refreshed_and_the_call_retried(virtual_sim):
    sim = virtual_sim  # token ages on the fleet's clock, moved by the test
    kube = make_kube(sim)
    kube.list_nodes()  # the hook has fetched a token
    hook = kube.token_hook
    before = hook.refreshes
    sim.set_faults(CLUSTER, token_ttl=0.3)  # the cluster refuses tokens older than 0.3 s
    sim.advance(0.299)
    assert kube.list_nodes() == [] and hook.refreshes == before  # still accepted: no refresh
    sim.advance(0.002)  # (0.001 more can fall short of 0.3 in floating point)
    assert kube.list_nodes() == []  # answered (no pool in this fleet): 401 -> forced refresh -> retried
    assert hook.refreshes == before + 1


def test_the_hook_refreshes_credentials_that_google_auth_calls_expired(sim, kube, pools):
    # Tokens that expire within google-auth's refresh margin are not "valid": every
    # request must fetch a new one through the hook.
    sim.set_auth(token_ttl=60)
    kube.token_hook.force_refresh()
    issued = sim.stats()["tokens_issued"]
    refreshes = kube.token_hook.refreshes
    for _ in range(3):
        kube.list_nodes()
    assert kube.token_hook.refreshes >= refreshes + 3
    assert sim.stats()["tokens_issued"] >= issued + 3


# --- the watch -------------------------------------------------------------------------


@dataclass
class Recorder:
    events: list[JobObservation] = field(default_factory=list)
    resyncs: list[list[JobObservation]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def on_event(self, obs: JobObservation) -> None:
        with self.lock:
            self.events.append(obs)

    def on_resync(self, observations: list[JobObservation]) -> None:
        with self.lock:
            self.resyncs.append(list(observations))

    def phases(self, name: str) -> list[str]:
        with self.lock:
            return [e.phase for e in self.events if e.name == name]


class Running:
    def __init__(self, watcher: JobWatcher) -> None:
        self.watcher = watcher
        self.recorder = Recorder()
        self.stop = threading.Event()
        self.thread = threading.Thread(
            target=watcher.run,
            args=(self.recorder.on_event, self.stop),
            kwargs={"on_resync": self.recorder.on_resync},
        )

    def __enter__(self) -> Running:
        self.thread.start()
        poll_until(lambda: self.watcher.lists >= 1, what="first list")
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.watcher.close()
        self.thread.join(10)
        assert not self.thread.is_alive()


def watcher_for(kube: KubeApi, **kwargs) -> JobWatcher:
    settings = dict(timeout_seconds=5, backoff_initial=0.02, backoff_max=0.2)
    settings.update(kwargs)
    return JobWatcher(kube, NAMESPACE, **settings)


def test_watcher_lists_then_follows_a_job_to_its_end(virtual_sim, vkube):
    kube, pools = vkube
    with Running(watcher_for(kube)) as run:
        open_watches(virtual_sim, CLUSTER, 1)
        _, manifest = submit(kube, pools)
        t0 = virtual_sim.clock.monotonic()
        ref = kube.create_job(manifest)
        _advance_to(virtual_sim, t0 + POD_START + RUN - 0.001)
        assert observe(kube, ref.name).phase == "Running"
        _advance_to(virtual_sim, t0 + POD_START + RUN)  # the Job ends here; the stream carries it
        # the only wait: the watcher's thread reading what the fleet has sent over loopback
        poll_until(lambda: "Succeeded" in run.recorder.phases(ref.name), what="Succeeded event")
        kube.delete_job(NAMESPACE, ref.name)
        poll_until(lambda: "Deleted" in run.recorder.phases(ref.name), what="Deleted event")
        assert virtual_sim.clock.monotonic() == t0 + POD_START + RUN  # no further fleet time passed
    w = run.watcher
    assert w.lists == 1 and w.relists == 0 and w.errors == 0
    assert run.recorder.resyncs and w.last_ok_at and w.last_event_at and w.resource_version
    assert all(e.labels.get("managed-by") == "falcon" for e in run.recorder.events)


def test_watcher_survives_dropped_streams(sim, kube, pools):
    sim.set_faults(CLUSTER, watch_drop_every=0.3)
    with Running(watcher_for(kube)) as run:
        poll_until(lambda: run.watcher.reconnects >= 2, what="reconnects after drops")
        _, manifest = submit(kube, pools, FALCON_SIM_RUN_SECONDS="0.8")
        ref = kube.create_job(manifest)
        poll_until(lambda: "Succeeded" in run.recorder.phases(ref.name), what="Succeeded across drops")
        kube.delete_job(NAMESPACE, ref.name)
    w = run.watcher
    assert w.reconnects >= 3 and w.relists == 0  # resumed from its resourceVersion, no re-list
    assert run.thread is not None and w.last_ok_at is not None


def test_watcher_relists_after_410_gone(sim, kube, pools):
    watcher = watcher_for(kube, timeout_seconds=1)
    with Running(watcher):
        pass  # listed and watched once; its resourceVersion is now kept in the watcher
    stale = watcher.resource_version
    _, manifest = submit(kube, pools)
    ref = kube.create_job(manifest)  # events after the stale resourceVersion...
    oldest = sim.compact_history(CLUSTER, keep=0)  # ...that the server no longer keeps
    assert int(stale) < oldest
    with Running(watcher) as run:  # the same watcher resumes from the stale version
        poll_until(lambda: watcher.relists >= 1, what="re-list after 410")
        poll_until(
            lambda: ref.name in {o.name for r in run.recorder.resyncs for o in r}, what="job in re-list"
        )
    assert watcher.lists == 2 and watcher.relists == 1 and watcher.errors == 0
    kube.delete_job(NAMESPACE, ref.name)


def test_watcher_outlives_a_token_that_expires_mid_watch(sim, kube, pools):
    with Running(watcher_for(kube, timeout_seconds=1)) as run:
        refreshes = kube.token_hook.refreshes
        sim.set_faults(CLUSTER, token_ttl=0.5)  # the open stream's token ages out
        poll_until(lambda: kube.token_hook.refreshes > refreshes, timeout=10, what="token refresh")
        _, manifest = submit(kube, pools)
        ref = kube.create_job(manifest)
        poll_until(
            lambda: "Succeeded" in run.recorder.phases(ref.name), timeout=10, what="events after refresh"
        )
        kube.delete_job(NAMESPACE, ref.name)
    assert run.watcher.reconnects >= 1 and run.watcher.last_ok_at is not None


def test_dropped_streams_resume_at_once_and_a_refused_token_is_retried_at_once(virtual_sim, vkube):
    """Found by the chaos soak (seed 3): with streams cut every few seconds each cut counted
    as a failure, so the backoff grew to its 30 s ceiling; past the cluster's token
    lifetime the refreshed token was refused again after every backoff. Jobs that ended
    went unseen for minutes. With production backoffs: a stream cut after it was up is a
    drop (resume at once), and the first 401 retries at once with the new token.

    On the fleet's clock, moved by the test (the watcher reads the same clock): each step
    runs on a thread; its stream is still open at 1.199 s and cut at 1.2 s, and the step
    returns 0 as a drop, resuming from its resourceVersion."""
    sim = virtual_sim
    kube, pools = vkube
    w = watcher_for(kube, timeout_seconds=2, backoff_initial=0.5, backoff_max=30, clock=sim.clock)

    def cuts() -> int:
        return sim.stats()["clusters"][CLUSTER]["fault_counts"]["watch_cut"]

    sim.set_faults(CLUSTER, watch_drop_every=1.2)
    for i in range(4):
        step = InThread(lambda: w.step(lambda o: None))
        open_watches(sim, CLUSTER, 1)
        opened = sim.clock.monotonic()  # the fleet's clock stands still until the test moves it
        _advance_to(sim, opened + 1.199)
        assert cuts() == i and sim.stats()["clusters"][CLUSTER]["kubernetes"]["open_watches"] == 1, "cut early"
        _advance_to(sim, opened + 1.2)
        assert cuts() == i + 1
        assert step.result() == 0.0, f"cut {i + 1} was backed off, not resumed at once"
        assert (w.drops, w.errors, w.lists, w.relists, w.reconnects) == (i + 1, 0, 1, 0, i)
        open_watches(sim, CLUSTER, 0)

    sim.set_faults(CLUSTER, watch_drop_every=None, token_ttl=0.3)
    sim.advance(0.5)  # the watcher's token is now older than the cluster accepts
    refreshes = kube.token_hook.refreshes
    assert w.step(lambda o: None) == 0.0  # 401: refreshed, and retried at once
    assert kube.token_hook.refreshes == refreshes + 1 and w.errors == 1

    _, manifest = submit(kube, pools, FALCON_SIM_RUN_SECONDS="0.2")
    ref = kube.create_job(manifest)  # with the new token, still younger than 0.3 s of the fleet's clock
    seen: list[str] = []
    step = InThread(lambda: w.step(lambda o: seen.append(o.phase) if o.name == ref.name else None))
    open_watches(sim, CLUSTER, 1)
    opened = sim.clock.monotonic()
    _advance_to(sim, opened + 1.999)  # the Job runs and ends on the way
    assert sim.stats()["clusters"][CLUSTER]["kubernetes"]["open_watches"] == 1  # up to its timeout,
    _advance_to(sim, opened + 2)
    assert step.result() == 0.0  # and ended cleanly at it, carrying the Job to its end
    assert seen and seen[-1] == "Succeeded", seen
    assert (w.errors, w.drops, w.lists, w.relists) == (1, 4, 1, 0)
    # the token has aged past 0.3 s on that stream: the next 401 is again a first one, retried at once
    assert w.step(lambda o: None) == 0.0
    assert kube.token_hook.refreshes == refreshes + 2 and w.errors == 2
