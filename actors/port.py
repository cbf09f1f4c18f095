"""The one port through which a Falcon actor reaches another.

Contract
--------
A QueueActor, the poller and a ClusterActor never hold another actor's handle: they
call a ``Port``. ``observe``, ``claim_reservation``, ``ensure_pool``, ``delete_pool``, ``submit_job``
and ``delete_job`` go to the ClusterActor of a cluster and return its answer (or raise
when it does not answer in time); ``hint`` wakes the QueueActor of a (cluster,
topology), creating it when asked to, and never raises; a hint that may create the
queue (the poller's, a moving queue's) also tells it that its rows changed, one that
may not (its ClusterActor's, its own) that only its cluster did. The Ray implementation
(``actors.remote.RayPort``) is the only code that calls ``ray.get`` on another actor;
tests drive the actors' logic with a fake port.
"""

from __future__ import annotations

from typing import Any, Protocol

from falcon_ray.model import ClusterView


class Port(Protocol):
    def observe(self, cluster: str, queue_label: str, pool_names: list[str], want_reservation: bool) -> ClusterView: ...

    def claim_reservation(self, cluster: str, name: str, hosts: int) -> bool: ...

    def ensure_pool(self, cluster: str, name: str, request: dict[str, Any], operation: str | None = None) -> str: ...

    def delete_pool(self, cluster: str, name: str) -> str: ...

    def submit_job(self, cluster: str, manifest: dict[str, Any], service: dict[str, Any] | None) -> dict[str, Any]: ...

    def delete_job(self, cluster: str, namespace: str, name: str) -> bool: ...

    def hint(self, cluster: str, topology: str, create: bool = True) -> None: ...
