"""The cluster registry: the ``falcon_clusters`` rows the operator keeps and the
reservation ledger the ClusterActors write into them.

Contract: the operator's writes (``add_cluster``, ``set_cluster_zone``,
``set_cluster_status``) are unfenced one-statement writes and stamp ``updated_at``;
``record_reservation`` is a controller write, fenced like every other, written only when a
figure changed (``reservation_seen_at`` says when) and leaving ``updated_at`` alone. A
status outside ``ClusterStatus`` raises ``ValueError`` before any SQL.
"""

from __future__ import annotations

import uuid

import sqlalchemy as sa

from falcon_ray.model import Cluster, ClusterStatus
from falcon_ray.store import tables as t
from falcon_ray.store.core import StoreCore, field_columns, row_value, row_values


def registry_select():
    """Every cluster row, in name order, as ``Cluster``'s fields (``row_values``): the
    registry read of ``list_clusters`` and of a queue's snapshot, built once per Store."""
    return sa.select(*field_columns(t.clusters, Cluster)).order_by(t.clusters.c.name)

CLUSTER_STATUSES = tuple(s.value for s in ClusterStatus)


class RegistryStore(StoreCore):
    """The registry's reads and writes."""

    def add_cluster(
        self,
        name: str,
        project: str,
        location: str,
        tpu_type: str,
        gcs_bucket: str = "",
        default_reservation: str = "",
        status: str = "active",
        namespace: str = "falcon-jobs",
        service_account: str = "falcon-job",
        zone: str = "",
    ) -> Cluster:
        if status not in CLUSTER_STATUSES:
            raise ValueError(f"status must be one of {', '.join(CLUSTER_STATUSES)}, got {status!r}")
        now = self.clock()
        values = dict(
            id=str(uuid.uuid4()),
            name=name,
            project=project,
            location=location,
            tpu_type=tpu_type,
            gcs_bucket=gcs_bucket or "",
            default_reservation=default_reservation or "",
            status=status,
            namespace=namespace,
            service_account=service_account,
            created_at=now,
            updated_at=now,
            zone=zone or "",
        )
        with self.engine.begin() as c:
            c.execute(t.clusters.insert().values(**values))
        return Cluster(**values)

    def list_clusters(self) -> list[Cluster]:
        with self.engine.connect() as c:
            return row_values(Cluster, c.execute(self._built(("clusters",), registry_select)).all())

    def get_cluster(self, name_or_id: str) -> Cluster | None:
        q = t.clusters.select().where(sa.or_(t.clusters.c.name == name_or_id, t.clusters.c.id == name_or_id))
        with self.engine.connect() as c:
            r = c.execute(q).first()
        return row_value(Cluster, r) if r else None

    def set_cluster_zone(self, name: str, zone: str) -> bool:
        with self.engine.begin() as c:
            res = c.execute(
                t.clusters.update().where(t.clusters.c.name == name).values(zone=zone or "", updated_at=self.clock())
            )
        return res.rowcount == 1

    def record_reservation(
        self, cluster_id: str, machine_type: str, count: int | None, in_use: int | None, claimed: int | None
    ) -> bool:
        """The ClusterActor's last reading of its reservation: the machine type it holds and
        the ledger. Written only when a figure changed (``reservation_seen_at`` says when);
        the operator's ``updated_at`` is left alone. Fenced like every controller write."""
        c_ = t.clusters.c
        values = dict(
            reservation_machine_type=machine_type or "", reservation_count=count, reservation_in_use=in_use, reservation_claimed=claimed
        )
        changed = sa.or_(*(sa.not_(getattr(c_, k).is_not_distinct_from(v)) for k, v in values.items()))
        stmt = t.clusters.update().where(c_.id == cluster_id, changed).values(**values, reservation_seen_at=self.clock())
        with self.engine.begin() as c:
            res = self._write(c, stmt)
        return res.rowcount == 1

    def set_cluster_status(self, name: str, status: str) -> bool:
        if status not in CLUSTER_STATUSES:
            raise ValueError(f"status must be one of {', '.join(CLUSTER_STATUSES)}, got {status!r}")
        with self.engine.begin() as c:
            res = c.execute(
                t.clusters.update()
                .where(t.clusters.c.name == name)
                .values(status=status, updated_at=self.clock())
            )
        return res.rowcount == 1
