"""SimFleet: the whole simulated fleet in one process, served on loopback from a background thread.

Contract
--------
``SimFleet(config, host="127.0.0.1", port=0, clock=SYSTEM)``; ``start()`` runs an
asyncio loop on a daemon thread, binds every listener and returns :attr:`endpoints`::

    {"gke": "http://127.0.0.1:P", "compute": "http://127.0.0.1:P",
     "metadata": "127.0.0.1:P", "stats": "http://127.0.0.1:P/sim/stats",
     "clusters": {NAME: {"project", "location", "kubernetes": "http://127.0.0.1:Q"}}}

GKE, Compute, the metadata server and the control endpoints share port P;
each cluster's Kubernetes API has its own port Q. ``stop()`` closes open
watches and listeners and joins the thread; the object is also a context
manager. The control methods (``stats``, ``set_faults``, ``set_timings``,
``reset_faults``, ``set_auth``, ``compact_history``, ``advance``) may be called from
any thread: they run on the fleet's loop and return plain dicts.

Time. Every time the model keeps (node-pool creation and deletion, node registration,
the autoscaler, pod lifecycles and termination, disruptions, stockout windows, token
lifetimes, watch timeouts and bookmarks, idle chip-seconds, the objects' timestamps)
is read from ``clock``:

* ``SYSTEM`` (the default; ``falcon-ray sim`` and the demo): the timers run on the
  asyncio loop, in the machine's seconds.
* a ``falcon_ray.clock.ManualClock`` (or the ``falcon-ray simulate`` driver's
  ``VirtualClock``): the timers go on a ``falcon_ray.sim.timers.TimerQueue`` on that
  clock, the mechanism the simulate driver runs the same model on. Nothing moves until
  ``advance(seconds)``, which runs, on the loop and in order, every timer due up to
  ``seconds`` ahead, leaves the clock there and lets the open watches act on the new
  time (a bookmark, a cut, the end of ``timeoutSeconds``) before it returns; an effect
  that is due at once (a request's follow-up, a ``call_soon``) runs at the loop's next
  turn without moving the clock. The HTTP servers stay real; only the model's time is virtual, so a test waits
  for "the create is done" by moving the clock past its timing instead of sleeping, and
  the same calls give the same fleet each run (object uids come from the seed too).
  Move such a clock only through ``advance``; ``next_timer()`` says how far ahead the
  next timer is.

Control endpoints on port P (no authentication):

* ``GET  /sim/stats`` - accounting of every cluster (see :meth:`SimFleet.stats`).
* ``GET  /sim/endpoints``.
* ``POST /sim/clusters/{name}/faults`` and ``.../timings`` - JSON merged into
  the current values, validated like the fleet file (400 on a bad key/value).
* ``POST /sim/clusters/{name}/reset`` - faults and timings back to the fleet file.
* ``POST /sim/clusters/{name}/compact`` ``{"keep": N}`` - drop watch history
  (forces 410 Expired for older resourceVersions).
* ``POST /sim/auth`` ``{"required": bool, "token_ttl": seconds}``.
* ``POST /sim/clusters/{name}/disrupt`` ``{"kind": "maintenance"|"repair"|"reclaim", "node": NODE}`` -
  disrupt NODE's slice now (see :mod:`~falcon_ray.sim.disruptions`); answers the record.
"""

from __future__ import annotations

import asyncio
import base64
import secrets
import threading
from collections.abc import Callable
from typing import Any

from aiohttp import web
from pydantic import ValidationError

from falcon_ray.clock import SYSTEM, Clock

from .auth import CallerBook, TokenBook, metadata_routes
from .cluster import SimCluster
from .errors import GoogleError, google_errors, json_response, read_json_object
from .fleet import AuthConfig, FleetConfig
from .gcp_api import gcp_routes
from .kube_api import kube_app
from .timers import TimerQueue


def _front_api(request: web.Request) -> str | None:
    """Which API of the shared port a request is for (None: a control endpoint)."""
    path = request.path
    if path.startswith("/sim/"):
        return None
    if path.startswith("/compute/"):
        return "compute"
    if path.startswith("/computeMetadata/") or path == "/":
        return "metadata"
    return "gke"


def _fake_ca_pem() -> str:
    body = base64.b64encode(secrets.token_bytes(480)).decode()
    lines = [body[i : i + 64] for i in range(0, len(body), 64)]
    return "-----BEGIN CERTIFICATE-----\n" + "\n".join(lines) + "\n-----END CERTIFICATE-----\n"


# loop turns advance() yields after poking the watches: a woken watch needs three or four (its
# queue's getter, wait_for's waiter, the handler) to read the new time and write or close
_SETTLE_TURNS = 16


class _LoopTimers:
    """A fleet's timers on a given clock: a ``TimerQueue`` whose entries due now run at the
    loop's next turn, and the later ones when ``SimFleet.advance`` reaches them."""

    def __init__(self, queue: TimerQueue, loop: asyncio.AbstractEventLoop) -> None:
        self.queue = queue
        self.loop = loop
        self._draining = False

    def call_later(self, delay: float, fn: Callable[..., None], *args: Any) -> None:
        self.queue.call_later(delay, fn, *args)
        if delay <= 0:
            self._drain_soon()

    def call_soon(self, fn: Callable[..., None], *args: Any) -> None:
        self.queue.call_soon(fn, *args)
        self._drain_soon()

    def _drain_soon(self) -> None:
        if not self._draining:
            self._draining = True
            self.loop.call_soon(self._drain)

    def _drain(self) -> None:
        self.queue.run_until(self.queue.clock.monotonic())
        self._draining = False


class SimFleet:
    def __init__(self, config: FleetConfig, host: str = "127.0.0.1", port: int = 0, clock: Clock = SYSTEM):
        self.config = config
        self.host = host
        self.port = port
        self.clock = clock
        # the model's timers on a given clock (None: on the asyncio loop, in the machine's time)
        self.timers: TimerQueue | None = None if clock is SYSTEM else TimerQueue(clock)
        self.book = TokenBook(config.auth, clock)
        self.callers = CallerBook(clock)
        self.ca_pem = _fake_ca_pem()
        self.ca_b64 = base64.b64encode(self.ca_pem.encode()).decode()
        self.clusters: dict[str, SimCluster] = {}
        self.endpoints: dict[str, Any] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._startup_error: BaseException | None = None
        self._stop_event: asyncio.Event | None = None
        self._closing: asyncio.Event | None = None

    # ---- lifecycle -----------------------------------------------------------------------------
    def start(self) -> dict[str, Any]:
        if self._thread is not None:
            return self.endpoints
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name="falcon-sim", daemon=True)
        self._thread.start()
        if not self._ready.wait(30):
            raise RuntimeError("the simulated fleet did not start within 30 s")
        if self._startup_error is not None:
            self._thread.join(5)
            self._thread = None
            raise RuntimeError(
                f"the simulated fleet failed to start: {self._startup_error}"
            ) from self._startup_error
        return self.endpoints

    def stop(self) -> None:
        if self._thread is None or self._loop is None:
            return
        if self._stop_event is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._stop_event.set)
        self._thread.join(15)
        self._thread = None

    def __enter__(self) -> SimFleet:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _run(self) -> None:
        assert self._loop is not None
        asyncio.set_event_loop(self._loop)
        try:
            self._loop.run_until_complete(self._serve())
        except BaseException as e:  # noqa: BLE001 - reported to start()
            self._startup_error = e
            self._ready.set()
        finally:
            self._loop.close()

    async def _serve(self) -> None:
        loop = asyncio.get_running_loop()
        self._stop_event = asyncio.Event()
        self._closing = asyncio.Event()
        timers = loop if self.timers is None else _LoopTimers(self.timers, loop)
        for index, cfg in enumerate(self.config.clusters):
            self.clusters[cfg.name] = SimCluster(cfg, index, self.config.seed, timers, self.clock)

        runners: list[web.AppRunner] = []
        try:
            front = web.Application(
                middlewares=[self.callers.middleware(_front_api), google_errors],
                client_max_size=16 * 1024 * 1024,
            )
            front.add_routes(metadata_routes(self.book, self.config.metadata))
            front.add_routes(gcp_routes(self))
            front.add_routes(self._control_routes())
            port = await self._listen(front, self.port, runners)
            base = f"http://{self.host}:{port}"
            clusters: dict[str, Any] = {}
            for cluster in self.clusters.values():
                record = self.callers.middleware(lambda _r, name=cluster.config.name: f"kubernetes/{name}")
                kport = await self._listen(kube_app(cluster, self.book, self._closing, (record,)), 0, runners)
                cluster.kube_url = f"http://{self.host}:{kport}"
                clusters[cluster.config.name] = {
                    "project": cluster.config.project,
                    "location": cluster.config.location,
                    "kubernetes": cluster.kube_url,
                }
            self.endpoints = {
                "gke": base,
                "compute": base,
                "metadata": f"{self.host}:{port}",
                "stats": f"{base}/sim/stats",
                "clusters": clusters,
            }
            self._ready.set()
            await self._stop_event.wait()
        finally:
            self._closing.set()
            for cluster in self.clusters.values():
                cluster.store.poke_watchers()
            await asyncio.sleep(0)
            for runner in reversed(runners):
                await runner.cleanup()

    async def _listen(self, app: web.Application, port: int, runners: list[web.AppRunner]) -> int:
        runner = web.AppRunner(app, access_log=None, shutdown_timeout=1.0)
        await runner.setup()
        runners.append(runner)
        site = web.TCPSite(runner, self.host, port)
        await site.start()
        return int(runner.addresses[-1][1])

    # ---- thread-safe control -------------------------------------------------------------------
    def _call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        if self._loop is None or self._thread is None:
            raise RuntimeError("the simulated fleet is not running; call start() first")
        if threading.current_thread() is self._thread:
            return fn(*args, **kwargs)

        async def run() -> Any:
            return fn(*args, **kwargs)

        return asyncio.run_coroutine_threadsafe(run(), self._loop).result(timeout=30)

    def _cluster(self, name: str) -> SimCluster:
        try:
            return self.clusters[name]
        except KeyError:
            raise KeyError(
                f"no simulated cluster named {name!r}; known: {', '.join(self.clusters)}"
            ) from None

    def advance(self, seconds: float) -> int:
        """Move the fleet's clock ``seconds`` ahead, running every timer due on the way in
        order; how many ran. Only for a fleet given a clock (see the module's contract)."""
        timers = self.timers
        if timers is None:
            raise RuntimeError("this fleet runs on the machine's clock; only a fleet given a clock is advanced")
        if seconds < 0:
            raise ValueError("a clock does not go back")

        async def run() -> int:
            target = timers.clock.monotonic() + seconds
            ran = timers.run_until(target)
            timers.clock.advance_to(target)
            for c in self.clusters.values():
                c.store.poke_watchers()  # a watch's timeout, bookmark or cut may be due now
            for _ in range(_SETTLE_TURNS):  # the poked watches act on the new time before this returns
                await asyncio.sleep(0)
            return ran

        if self._loop is None or self._thread is None:
            raise RuntimeError("the simulated fleet is not running; call start() first")
        return asyncio.run_coroutine_threadsafe(run(), self._loop).result(timeout=30)

    def next_timer(self) -> float | None:
        """Seconds of the fleet's clock until its next timer is due (None: none is queued).
        Only for a fleet given a clock."""
        timers = self.timers
        if timers is None:
            raise RuntimeError("this fleet runs on the machine's clock; its timers are the loop's")
        at = self._call(timers.next_at)
        return None if at is None else max(0.0, at - timers.clock.monotonic())

    def stats(self) -> dict[str, Any]:
        """``{"clusters": {NAME: {...}}, "tokens_issued": N}``; see docs/sim.md for every field."""
        return self._call(self._stats)

    def _stats(self) -> dict[str, Any]:
        return {
            "clusters": {name: c.stats() for name, c in self.clusters.items()},
            "tokens_issued": self.book.issued_count,
            "auth": {"required": self.book.required, "token_ttl": self.book.ttl},
            "callers": self.callers.stats(),
        }

    def set_faults(self, cluster: str, **faults: Any) -> dict[str, Any]:
        """Merge ``faults`` into the cluster's faults (validated); returns the new faults."""
        c = self._cluster(cluster)
        return self._call(lambda: c.set_faults(**faults).model_dump())

    def set_timings(self, cluster: str, **timings: Any) -> dict[str, Any]:
        c = self._cluster(cluster)
        return self._call(lambda: c.set_timings(**timings).model_dump())

    def reset_faults(self, cluster: str | None = None) -> None:
        """Faults and timings of one cluster (or all) back to the fleet file; auth back too when all."""
        targets = [self._cluster(cluster)] if cluster else list(self.clusters.values())

        def reset() -> None:
            for c in targets:
                c.reset_faults()
            if cluster is None:
                self.book.required = self.config.auth.required
                self.book.ttl = self.config.auth.token_ttl

        self._call(reset)

    def set_auth(self, required: bool | None = None, token_ttl: float | None = None) -> dict[str, Any]:
        def apply() -> dict[str, Any]:
            merged = AuthConfig(
                required=self.book.required if required is None else required,
                token_ttl=self.book.ttl if token_ttl is None else token_ttl,
            )
            self.book.required, self.book.ttl = merged.required, merged.token_ttl
            return merged.model_dump()

        return self._call(apply)

    def compact_history(self, cluster: str, keep: int = 0) -> int:
        """Drop all but ``keep`` watch-history events; returns the oldest resourceVersion still resumable."""
        c = self._cluster(cluster)

        def compact() -> int:
            c.store.compact(keep)
            return c.store.compacted_rv

        return self._call(compact)

    def disrupt(self, cluster: str, kind: str, node: str) -> dict[str, Any] | None:
        """Disrupt ``node``'s slice (its whole pool for a multi-host slice) now; the record, or None."""
        c = self._cluster(cluster)
        return self._call(lambda: c.disruptions.disrupt(kind, c.disruptions.slice_of(node), trigger="api"))

    # ---- control HTTP routes -------------------------------------------------------------------
    def _control_routes(self) -> list[web.RouteDef]:
        def cluster_of(request: web.Request) -> SimCluster:
            name = request.match_info["name"]
            if name not in self.clusters:
                raise GoogleError(404, f"no simulated cluster named {name!r}")
            return self.clusters[name]

        def validated(fn: Callable[[], Any]) -> Any:
            try:
                return fn()
            except ValidationError as e:
                problems = "; ".join(
                    f"{'.'.join(str(x) for x in err['loc'])}: {err['msg']}" for err in e.errors()
                )
                raise GoogleError(400, problems, "INVALID_ARGUMENT") from None

        async def stats(request: web.Request) -> web.Response:
            return json_response(self._stats())

        async def endpoints(request: web.Request) -> web.Response:
            return json_response(self.endpoints)

        async def faults(request: web.Request) -> web.Response:
            c = cluster_of(request)
            body = await read_json_object(request, "google")
            return json_response(validated(lambda: c.set_faults(**body).model_dump()))

        async def timings(request: web.Request) -> web.Response:
            c = cluster_of(request)
            body = await read_json_object(request, "google")
            return json_response(validated(lambda: c.set_timings(**body).model_dump()))

        async def reset(request: web.Request) -> web.Response:
            c = cluster_of(request)
            c.reset_faults()
            return json_response({"faults": c.faults.model_dump(), "timings": c.timings.model_dump()})

        async def compact(request: web.Request) -> web.Response:
            c = cluster_of(request)
            body = await read_json_object(request, "google")
            keep = body.get("keep", 0)
            if not isinstance(keep, int) or keep < 0:
                raise GoogleError(400, "'keep' must be a non-negative integer")
            c.store.compact(keep)
            return json_response({"compacted_resource_version": c.store.compacted_rv})

        async def disrupt(request: web.Request) -> web.Response:
            c = cluster_of(request)
            body = await read_json_object(request, "google")
            kind, node = body.get("kind"), body.get("node")
            if not isinstance(node, str) or c.store.get("nodes", "", node) is None:
                raise GoogleError(404, f"no node named {node!r} in cluster {c.config.name}")
            try:
                record = c.disruptions.disrupt(str(kind), c.disruptions.slice_of(node), trigger="api")
            except ValueError as e:
                raise GoogleError(400, str(e), "INVALID_ARGUMENT") from None
            if record is None:
                raise GoogleError(409, f"node {node} is already under a disruption", "ABORTED")
            return json_response(record)

        async def auth(request: web.Request) -> web.Response:
            body = await read_json_object(request, "google")
            unknown = set(body) - {"required", "token_ttl"}
            if unknown:
                raise GoogleError(400, f"unknown auth keys: {', '.join(sorted(unknown))}")

            def apply() -> dict[str, Any]:
                merged = AuthConfig(
                    required=body.get("required", self.book.required),
                    token_ttl=body.get("token_ttl", self.book.ttl),
                )
                self.book.required, self.book.ttl = merged.required, merged.token_ttl
                return merged.model_dump()

            return json_response(validated(apply))

        return [
            web.get("/sim/stats", stats),
            web.get("/sim/endpoints", endpoints),
            web.post("/sim/clusters/{name}/faults", faults),
            web.post("/sim/clusters/{name}/timings", timings),
            web.post("/sim/clusters/{name}/reset", reset),
            web.post("/sim/clusters/{name}/compact", compact),
            web.post("/sim/clusters/{name}/disrupt", disrupt),
            web.post("/sim/auth", auth),
        ]
