"""The leader lease: one row per name (``controller``) in ``falcon_leader_lease``.

Contract: ``acquire_leader`` takes the lease when it is free or expired on this Store's
clock, or renews it for its holder, in one compare-and-set UPDATE (an INSERT the first
time); a new holder bumps ``epoch`` by one, a renewal keeps it. ``release_leader``
expires the row at once and keeps it, so the epoch keeps growing: the next holder's epoch
is newer than that of every actor started before (the fence of ``core``). These writes
are never fenced themselves.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import sqlalchemy as sa

from falcon_ray.store import tables as t
from falcon_ray.store.core import StoreCore


class LeaderStore(StoreCore):
    """Taking, renewing, giving up and reading the leader lease."""

    def acquire_leader(self, holder: str, ttl_s: float, name: str = "controller") -> bool:
        """Take or renew the leader lease; True when ``holder`` holds it afterwards."""
        ll = t.leader_lease
        now = self.clock()
        expires = now + dt.timedelta(seconds=ttl_s)
        with self.engine.begin() as c:
            # a new holder (taking an expired or released lease) bumps the epoch: the fence
            # against every actor of the previous holder; a renewal keeps it
            res = c.execute(
                ll.update()
                .where(ll.c.name == name, sa.or_(ll.c.holder == holder, ll.c.expires_at < now))
                .ordered_values(  # epoch first: MySQL assigns left to right and would see the new holder
                    (ll.c.epoch, ll.c.epoch + sa.case((ll.c.holder == holder, 0), else_=1)),
                    (ll.c.holder, holder),
                    (ll.c.expires_at, expires),
                    (ll.c.renewed_at, now),
                )
            )
            if res.rowcount == 1:
                return True
            exists = c.execute(sa.select(ll.c.holder).where(ll.c.name == name)).first()
        if exists:
            return False
        try:
            with self.engine.begin() as c:
                c.execute(ll.insert().values(name=name, holder=holder, expires_at=expires, renewed_at=now, epoch=1))
            return True
        except sa.exc.IntegrityError:
            return False

    def release_leader(self, holder: str, name: str = "controller") -> None:
        """Give the lease up at once. The row stays (holder empty, expired) so the epoch
        keeps growing: the next holder's epoch is newer than every actor started before."""
        ll = t.leader_lease
        now = self.clock()
        with self.engine.begin() as c:
            c.execute(
                ll.update()
                .where(ll.c.name == name, ll.c.holder == holder)
                .values(holder="", expires_at=now - dt.timedelta(seconds=1), renewed_at=now)
            )

    def leader(self, name: str = "controller") -> dict[str, Any] | None:
        """The lease (holder, expires_at, renewed_at, epoch), or None when nobody holds it."""
        ll = t.leader_lease
        with self.engine.connect() as c:
            r = c.execute(ll.select().where(ll.c.name == name)).first()
        return dict(r._mapping) if r and r.holder else None

    def leader_epoch(self, holder: str, name: str = "controller") -> int | None:
        """The epoch of the lease when ``holder`` holds it, else None."""
        ll = t.leader_lease
        with self.engine.connect() as c:
            r = c.execute(sa.select(ll.c.epoch).where(ll.c.name == name, ll.c.holder == holder)).first()
        return int(r[0]) if r else None
