"""pytest fixtures: the simulated fleet.

Contract
--------
* ``sim_fleet`` (session scope): one running :class:`SimFleet` built from
  :data:`SIM_TEST_FLEET` (fast timings, three clusters) that also points
  google-auth at the simulator's metadata server for the session, so
  ``google.auth.default()`` returns the simulator's Workload Identity
  credentials. The environment is restored when the session ends.
* ``sim`` (function scope): the same fleet, with every fault, timing and auth
  setting reset to :data:`SIM_TEST_FLEET` after the test (and before, in case a
  previous test forgot).
* ``reset_sim_faults(fleet)``: that reset, for fixtures of other modules.
* ``gke_client``, ``compute_client``, ``kube_api_client``, ``google_credentials``:
  the REAL clients, aimed at the simulator; ``poll_until`` waits with a deadline;
  ``wait_operation`` polls a GKE operation until DONE.
* ``virtual_sim`` (function scope): :data:`SIM_TEST_FLEET` on a ``ManualClock``, started
  for the test, google-auth pointed at its metadata server (and back after).
* ``virtual_fleet(config)``: a :class:`SimFleet` on a ``ManualClock`` (the model's time
  moves only when the test says); ``advance_until(fleet, probe, within)`` moves it from
  timer to timer until ``probe()`` holds and says how many of its seconds that took;
  ``wait_operation(..., fleet=F)`` does the same for an operation.
* ``InThread(fn)``: a client call that blocks (a watch stream read to its end) on a thread
  of its own while the test moves the fleet's clock; ``open_watches(fleet, cluster, n)``
  waits until the fleet holds ``n`` open watches of a cluster, so the test moves the clock
  only once the stream is open.
* ``private_fleet_config(clusters, **timings)``: a fleet without authentication
  for tests that need clusters of their own (regional ones, tight capacity).

Clusters: ``sim-a`` (reservation ``res-sim-a`` of 4 hosts, 64 chips: node-pool
and reservation tests), ``sim-b`` (8 chips, no reservation: stockouts and API
faults), ``sim-k`` (128 chips: Kubernetes tests keep a pool here).
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from falcon_ray.clock import ManualClock
from falcon_ray.sim.auth import use_sim_metadata
from falcon_ray.sim.fleet import FleetConfig, parse_fleet
from falcon_ray.sim.server import SimFleet

FAST_TIMINGS = {
    "node_pool_create": 0.3,
    "node_register": 0.2,
    "flex_visibility_lag": 0.4,
    "node_pool_delete": 0.2,
    "pod_start": 0.05,
    "watch_bookmark_interval": 0.3,
    "autoscaler_scale_up": 0.2,
    "flex_capacity_wait": 0.2,
    "autoscaler_scale_down": 30,
}

SIM_TEST_FLEET: dict[str, Any] = {
    "seed": 11,
    "auth": {"required": True, "token_ttl": 3600},
    "clusters": [
        {
            "name": "sim-a",
            "project": "proj-sim-a",
            "location": "us-east5-b",
            "tpu_type": "v6e",
            "gcs_bucket": "logs-sim-a",
            "reservation": {"name": "res-sim-a", "count": 4},
            "chips": 64,
            "timings": FAST_TIMINGS,
        },
        {
            "name": "sim-b",
            "project": "proj-sim-b",
            "location": "us-central1-b",
            "tpu_type": "v6e",
            "chips": 8,
            "timings": FAST_TIMINGS,
        },
        {
            "name": "sim-k",
            "project": "proj-sim-k",
            "location": "europe-west4-a",
            "tpu_type": "v6e",
            "chips": 128,
            "timings": FAST_TIMINGS,
        },
    ],
}

_METADATA_ENV = ("GCE_METADATA_HOST", "GCE_METADATA_IP")


def sim_test_config(**overrides: Any) -> FleetConfig:
    """:data:`SIM_TEST_FLEET` with top-level keys replaced (e.g. ``auth={"required": False}``)."""
    return parse_fleet({**SIM_TEST_FLEET, **overrides}, "tests/harness/sim.py")


def reset_sim_faults(fleet: SimFleet) -> None:
    """Faults, timings and auth of every cluster back to the fixture's fleet definition."""
    fleet.reset_faults()


@contextlib.contextmanager
def _metadata_of(fleet: SimFleet) -> Iterator[SimFleet]:
    """``fleet`` started, with google-auth pointed at its metadata server; both undone after."""
    saved = {k: os.environ.get(k) for k in _METADATA_ENV}
    metadata_module = sys.modules.get("google.auth.compute_engine._metadata")
    saved_host = getattr(metadata_module, "_GCE_METADATA_HOST", None)
    endpoints = fleet.start()
    use_sim_metadata(endpoints["metadata"])
    try:
        yield fleet
    finally:
        fleet.stop()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        module = sys.modules.get("google.auth.compute_engine._metadata")
        if module is not None and saved_host is not None:
            module._GCE_METADATA_HOST = saved_host  # type: ignore[attr-defined]


@pytest.fixture(scope="session")
def sim_fleet() -> Iterator[SimFleet]:
    with _metadata_of(SimFleet(sim_test_config())) as fleet:
        yield fleet


@pytest.fixture
def virtual_sim() -> Iterator[SimFleet]:
    """:data:`SIM_TEST_FLEET` on a ``ManualClock``, for one test, with google-auth pointed at it."""
    with _metadata_of(virtual_fleet(sim_test_config())) as fleet:
        yield fleet


@pytest.fixture
def sim(sim_fleet: SimFleet) -> Iterator[SimFleet]:
    # another fleet (a DemoRun) may have pointed this process's google-auth elsewhere
    use_sim_metadata(sim_fleet.endpoints["metadata"])
    reset_sim_faults(sim_fleet)
    yield sim_fleet
    reset_sim_faults(sim_fleet)


# ---- the real clients, aimed at a fleet ----------------------------------------------------------


def google_credentials():
    """``google.auth.default()`` as the controller calls it (resolves to the sim's metadata server)."""
    import google.auth

    credentials, _project = google.auth.default(scopes=["https://www.googleapis.com/auth/cloud-platform"])
    return credentials


def gke_client(fleet: SimFleet, credentials=None):
    from google.cloud import container_v1

    return container_v1.ClusterManagerClient(
        transport="rest",
        client_options={"api_endpoint": fleet.endpoints["gke"]},
        credentials=credentials or google_credentials(),
    )


def compute_client(fleet: SimFleet, credentials=None):
    from google.cloud import compute_v1

    return compute_v1.ReservationsClient(
        transport="rest",
        client_options={"api_endpoint": fleet.endpoints["compute"]},
        credentials=credentials or google_credentials(),
    )


def kube_api_client(fleet: SimFleet, cluster: str, token: str | None = None):
    """A ``kubernetes.client.ApiClient`` for one simulated cluster with a bearer token.

    Without ``token`` it takes a fresh one from ``google.auth.default()`` credentials.
    """
    import google.auth.transport.requests
    from kubernetes import client

    if token is None:
        credentials = google_credentials()
        credentials.refresh(google.auth.transport.requests.Request())
        token = credentials.token
    configuration = client.Configuration(
        host=fleet.endpoints["clusters"][cluster]["kubernetes"],
        api_key={"authorization": token},
        api_key_prefix={"authorization": "Bearer"},
    )
    return client.ApiClient(configuration)


def poll_until(probe, timeout: float = 5.0, interval: float = 0.05, what: str = "condition"):
    """Call ``probe()`` until it returns something truthy; return that, or fail after ``timeout`` seconds."""
    import time

    deadline = time.monotonic() + timeout  # wall-clock: the sim answers from its HTTP server thread
    last = None
    while True:
        last = probe()
        if last:
            return last
        if time.monotonic() >= deadline:  # wall-clock: a bound on the HTTP sim's answer, not a timing claim
            raise AssertionError(f"timed out after {timeout}s waiting for {what}; last value: {last!r}")
        time.sleep(interval)  # wall-clock: polls the HTTP sim's server thread over loopback


def virtual_fleet(config: FleetConfig) -> SimFleet:
    """A fleet (not started) whose model runs on a ``ManualClock``: see ``SimFleet``'s contract."""
    return SimFleet(config, clock=ManualClock())


def advance_until(fleet: SimFleet, probe, within: float, what: str = "condition"):
    """Move ``fleet``'s clock to its next timer, again and again, until ``probe()`` returns
    something truthy; return ``(that, the fleet's seconds it took)``. Fail when ``within``
    of the fleet's seconds passed first (the bound is virtual: the claim can be exact)."""
    start = fleet.clock.monotonic()
    while True:
        last = probe()
        if last:
            return last, fleet.clock.monotonic() - start
        left = start + within - fleet.clock.monotonic()
        if left <= 0:
            raise AssertionError(f"{what} did not happen within {within} s of the fleet's clock; last value: {last!r}")
        due = fleet.next_timer()
        fleet.advance(left if due is None else min(due, left))


class InThread:
    """``fn()`` on a thread of its own; ``result()`` joins it and returns what it returned or
    raises what it raised (see the module's contract)."""

    def __init__(self, fn) -> None:
        self._out: dict[str, Any] = {}
        self._thread = threading.Thread(target=self._run, args=(fn,), daemon=True)
        self._thread.start()

    def _run(self, fn) -> None:
        try:
            self._out["value"] = fn()
        except BaseException as e:  # noqa: BLE001 - handed to result()
            self._out["error"] = e

    def result(self, timeout: float = 30.0):
        self._thread.join(timeout)
        assert not self._thread.is_alive(), "the client's call did not return"
        if "error" in self._out:
            raise self._out["error"]
        return self._out["value"]


def open_watches(fleet: SimFleet, cluster: str, n: int) -> None:
    """Until ``fleet`` holds ``n`` open watches of ``cluster`` (a client's thread opens them)."""
    poll_until(
        lambda: fleet.stats()["clusters"][cluster]["kubernetes"]["open_watches"] == n, 10, what=f"{n} open watches"
    )


def private_fleet_config(clusters: list[dict[str, Any]], **timings: float) -> FleetConfig:
    """A fleet of ``clusters`` without authentication, every cluster with :data:`FAST_TIMINGS` + ``timings``."""
    return parse_fleet(
        {
            "seed": 3,
            "auth": {"required": False},
            "clusters": [{"timings": {**FAST_TIMINGS, **timings}, **c} for c in clusters],
        },
        "tests/fixtures_sim.py",
    )


def wait_operation(gke, location: str, op, timeout: float = 5.0, fleet: SimFleet | None = None):
    """Poll a GKE operation (``location`` = ``projects/P/locations/L``) until DONE; return it.
    With ``fleet`` (one given a clock) it moves the fleet's clock instead, ``timeout`` of its seconds."""
    from google.cloud import container_v1

    def done():
        o = gke.get_operation(name=f"{location}/operations/{op.name}")
        return o.status == container_v1.Operation.Status.DONE and o

    if fleet is not None:
        return advance_until(fleet, done, timeout, what=f"operation {op.name} DONE")[0]
    return poll_until(done, timeout, what=f"operation {op.name} DONE")
