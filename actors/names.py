"""Actor names and options: how every Falcon actor is named and started in Ray.

Contract
--------
Every Falcon actor is named in one Ray namespace (``Settings.namespace``, default
``falcon``): ``poller``, ``cluster/<cluster>``, ``queue/<cluster>/<topology>``. All
are detached (they outlive the process that created them), restart forever, reserve
no CPU, and are created with get-if-exists, so any number of callers converge on one
actor per name. ``lookup`` and ``list_falcon_actors`` are for operator tools; the
actors themselves reach each other only through ``actors.remote.RayPort``, which
keeps the one handle cache.
"""

from __future__ import annotations

from typing import Any

POLLER = "poller"


def cluster_name(cluster: str) -> str:
    return f"cluster/{cluster}"


def queue_name(cluster: str, topology: str) -> str:
    return f"queue/{cluster}/{topology}"


def options(name: str, namespace: str, max_concurrency: int) -> dict[str, Any]:
    return dict(
        name=name,
        namespace=namespace,
        lifetime="detached",
        get_if_exists=True,
        max_restarts=-1,
        max_task_retries=0,
        num_cpus=0,
        max_concurrency=max_concurrency,
    )


def lookup(name: str, namespace: str):
    """An existing actor's handle, or None (never creates)."""
    import ray

    try:
        return ray.get_actor(name, namespace=namespace)
    except ValueError:
        return None


def list_falcon_actors(namespace: str) -> list[str]:
    """Names of the live named actors in ``namespace`` (from Ray's control store; no dashboard needed)."""
    import ray

    found = ray.util.list_named_actors(all_namespaces=True)
    return sorted(a["name"] for a in found if a.get("namespace") == namespace)
