"""Actor names and get-or-create handles: the only place actor options are set.

Contract
--------
Every Falcon actor is named in one Ray namespace (``Settings.namespace``, default
``falcon``): ``poller``, ``cluster/<cluster>``, ``queue/<cluster>/<topology>``.
``ensure_*`` creates the actor if it does not exist and returns the live one if it
does (``get_if_exists``), so any number of callers -- the supervisor, the poller, a
restarted ``falcon-ray run`` -- converge on one actor per name. All are detached
(they outlive the process that created them), restart forever, and reserve no CPU.
Handles are cached per process; a cached handle stays valid across actor restarts.
"""

from __future__ import annotations

import threading

import ray

from falcon_ray.config import Settings

POLLER = "poller"
_cache: dict[tuple[str, str], ray.actor.ActorHandle] = {}
_lock = threading.Lock()


def cluster_name(cluster: str) -> str:
    return f"cluster/{cluster}"


def queue_name(cluster: str, topology: str) -> str:
    return f"queue/{cluster}/{topology}"


def _options(name: str, settings: Settings, max_concurrency: int) -> dict:
    return dict(
        name=name,
        namespace=settings.namespace,
        lifetime="detached",
        get_if_exists=True,
        max_restarts=-1,
        max_task_retries=0,
        num_cpus=0,
        max_concurrency=max_concurrency,
    )


def _ensure(name: str, settings: Settings, make) -> ray.actor.ActorHandle:
    key = (settings.namespace, name)
    with _lock:
        h = _cache.get(key)
        if h is None:
            h = make()
            _cache[key] = h
        return h


def ensure_poller(settings: Settings, db_url: str) -> ray.actor.ActorHandle:
    from actors.poller import PollerActor

    return _ensure(
        POLLER, settings, lambda: PollerActor.options(**_options(POLLER, settings, 8)).remote(settings, db_url)
    )


def ensure_cluster(cluster: str, settings: Settings, db_url: str) -> ray.actor.ActorHandle:
    from actors.cluster import ClusterActor

    name = cluster_name(cluster)
    return _ensure(
        name, settings, lambda: ClusterActor.options(**_options(name, settings, 64)).remote(cluster, settings, db_url)
    )


def ensure_queue(cluster: str, topology: str, settings: Settings, db_url: str) -> ray.actor.ActorHandle:
    from actors.queue import QueueActor

    name = queue_name(cluster, topology)
    return _ensure(
        name,
        settings,
        lambda: QueueActor.options(**_options(name, settings, 16)).remote(cluster, topology, settings, db_url),
    )


def lookup(name: str, namespace: str) -> ray.actor.ActorHandle | None:
    """An existing actor's handle, or None (never creates)."""
    key = (namespace, name)
    with _lock:
        if key in _cache:
            return _cache[key]
    try:
        h = ray.get_actor(name, namespace=namespace)
    except ValueError:
        return None
    with _lock:
        _cache[key] = h
    return h


def forget(namespace: str, name: str | None = None) -> None:
    """Drop cached handles (after the actors were killed)."""
    with _lock:
        for key in [k for k in _cache if k[0] == namespace and (name is None or k[1] == name)]:
            del _cache[key]


def list_falcon_actors(namespace: str) -> list[str]:
    """Names of the live named actors in ``namespace`` (from Ray's control store; no dashboard needed)."""
    found = ray.util.list_named_actors(all_namespaces=True)
    return sorted(a["name"] for a in found if a.get("namespace") == namespace)
