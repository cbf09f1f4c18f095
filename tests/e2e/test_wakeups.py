"""A queue that was retired and created again gets the poller's and the ClusterActor's
wake-ups at once, not at its next timed tick.

Both senders use ``RayPort.hint`` (the poller with ``create=True``, the ClusterActor
with ``create=False``); each port here has cached the first actor's handle, as a
long-running poller or ClusterActor would have. The queue ticks every 60 s (an empty
one every 300 s), so only a delivered hint can make it step within seconds.
"""

from __future__ import annotations

import time
import uuid

import ray

from actors import names, remote
from actors.remote import RayPort
from falcon_ray.config import Settings
from falcon_ray.store.migrate import upgrade


def steps(h) -> int:
    return ray.get(h.loop.remote(), timeout=30)["steps"]


def wait_steps_above(h, n: int, timeout: float) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        now = steps(h)
        if now > n:
            return now
        time.sleep(0.05)
    raise AssertionError(f"the queue did not step within {timeout}s (still {n} steps): the hint was lost")


def wait_until(fn, what: str, timeout: float = 60):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = fn()
        if got is not None:
            return got
        time.sleep(0.05)
    raise AssertionError(f"no {what} within {timeout}s")


def test_a_retired_and_recreated_queue_gets_both_kinds_of_hint_at_once(ray_session, tmp_path):
    db = f"sqlite:///{tmp_path / 'wake.db'}"
    upgrade(db, with_jobs_table=True)  # no cluster registered: the queue steps without calling anyone
    s = Settings(namespace=f"wake-{uuid.uuid4().hex[:8]}", queue_tick_s=60, queue_idle_tick_s=300)
    poller_port, cluster_port = RayPort(s, db), RayPort(s, db)
    name = names.queue_name("edge-a", "2x2")
    try:
        poller_port.hint("edge-a", "2x2")  # creates the queue (from a hint thread: a hint never blocks)
        first = wait_until(lambda: names.lookup(name, s.namespace), "the queue created by the hint")
        wait_steps_above(first, 0, timeout=60)
        cluster_port.hint("edge-a", "2x2", create=False)  # the ClusterActor's port caches it too
        wait_until(lambda: cluster_port._handles.get(name), "the ClusterActor's port caching the handle")
        ray.kill(first, no_restart=True)  # the supervisor retires it
        deadline = time.monotonic() + 60
        while names.lookup(name, s.namespace) is not None and time.monotonic() < deadline:
            time.sleep(0.1)  # until Ray has let go of the name
        second = remote.ensure_queue("edge-a", "2x2", s, db)  # a later task brings it back
        n = wait_steps_above(second, 0, timeout=60)
        time.sleep(0.5)
        n = steps(second)

        poller_port.hint("edge-a", "2x2")
        n = wait_steps_above(second, n, timeout=5)
        cluster_port.hint("edge-a", "2x2", create=False)
        wait_steps_above(second, n, timeout=5)
        assert poller_port.dropped == 1 and cluster_port.dropped == 1
    finally:
        h = names.lookup(name, s.namespace)
        if h is not None:
            ray.kill(h, no_restart=True)
