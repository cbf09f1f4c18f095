"""What the Ray dashboard shows of each Falcon actor is true: its identity, not its state.

Ray reads an actor's ``repr`` once, when the actor is created, and the dashboard's Actors
view (``repr_name`` in the state API, ``ray.util.state.list_actors(detail=True)``) shows it
for the actor's whole life. Here a queue's state changes (a task submitted and running)
and every actor's ``repr_name`` is still exactly its identity.

The session's Ray runs without the dashboard (tests/harness/ray_session.py), which is the
state API's server, so ``list_actors`` has nothing to ask; the test reads the record that
``list_actors`` serves ``repr_name`` from: the GCS actor table (``ActorTableData.repr_name``).
tests/e2e/test_demo_inspect.py reads the same field through the dashboard's HTTP API.
"""

from __future__ import annotations

import time
import uuid

import pytest
import ray
from ray.exceptions import RayActorError

from actors import remote
from falcon_ray import lifecycle as lc
from tests.harness.e2e import make_fleet, spec, wait_for

pytestmark = pytest.mark.timeout(180)


def _actors(namespace: str) -> dict[str, dict]:
    """name -> {class_name, repr_name, state} of the named actors in ``namespace``, from the
    GCS actor table (what ``list_actors(detail=True)`` returns, without the dashboard)."""
    from ray._private.state import state
    from ray.core.generated import gcs_pb2

    out = {}
    for raw in state._connect_and_get_accessor().get_actor_table(None, None):
        a = gcs_pb2.ActorTableData.FromString(raw)
        if a.ray_namespace == namespace and a.name:
            out[a.name] = {
                "class_name": a.class_name,
                "repr_name": a.repr_name,
                "state": gcs_pb2.ActorTableData.ActorState.Name(a.state),
            }
    return out


def test_repr_name_is_identity_only_after_the_queue_state_changed(controller):
    run = controller(make_fleet(with_b=False))
    task_id = run.submit("alice", spec("2x2", 300), "repr-running")
    wait_for(run, task_id, lambda t: t.phase == lc.RUNNING)
    queue = ray.get_actor("queue/edge-a/2x2", namespace=run.settings.namespace)
    deadline = time.monotonic() + 30
    while True:  # the queue's own view catches up at its next tick
        snap = ray.get(queue.snapshot.remote(), timeout=30)
        if [t["id"] for t in snap["running"]] == [task_id] or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert [t["id"] for t in snap["running"]] == [task_id], snap  # the queue's state has moved on

    expected = {
        "poller": ("PollerActor", "PollerActor()"),
        "cluster/edge-a": ("ClusterActor", "ClusterActor(edge-a)"),
        "queue/edge-a/2x2": ("QueueActor", "QueueActor(edge-a/2x2)"),
    }
    deadline = time.monotonic() + 30
    while True:  # the GCS records the repr with the actor's creation reply
        seen = _actors(run.settings.namespace)
        got = {n: (seen[n]["class_name"], seen[n]["repr_name"]) for n in expected if n in seen}
        if got == expected or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert got == expected, seen
    assert all(seen[n]["state"] == "ALIVE" for n in expected), seen
    for name, a in seen.items():  # every other Falcon actor here names itself the same way
        if a["class_name"] in ("PollerActor", "ClusterActor", "QueueActor"):
            assert "(" in a["repr_name"] and ":" not in a["repr_name"], (name, a)


def test_an_actor_whose_constructor_failed_dies_with_its_own_error(ray_session):
    """A constructor that fails at its first step (here the Store: an unusable database URL;
    in production a killed connection): the actor dies with that error, and the repr Ray
    asks for then is its identity, not an ``AttributeError`` for what was never set."""
    from falcon_ray.devtools.demo import demo_settings

    ns = f"falcon-repr-{uuid.uuid4().hex[:8]}"
    settings = demo_settings().model_copy(update={"namespace": ns})
    h = remote.QueueActor.options(name="queue/edge-x/2x2", namespace=ns, num_cpus=0, max_restarts=0).remote(
        "edge-x", "2x2", settings, "nosuchdialect://db.invalid/falcon"
    )
    try:
        with pytest.raises(RayActorError) as err:
            ray.get(h.ping.remote(), timeout=60)
        text = str(err.value)
        assert "nosuchdialect" in text  # the constructor's own error
        assert "repr=QueueActor(edge-x/2x2)" in text  # Ray asked for the repr, and got it
        assert "AttributeError" not in text
        a = _actors(ns).get("queue/edge-x/2x2")
        assert a is not None and a["state"] == "DEAD", a
    finally:
        ray.kill(h)
