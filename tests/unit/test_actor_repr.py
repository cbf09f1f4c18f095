"""An actor's repr is its identity only, and never raises.

Ray asks for an actor's ``repr`` once, when the actor is created, and shows it in the
dashboard (``repr_name``) for the actor's life; when the constructor failed it asks too,
and a repr that raised (``'ClusterActor' object has no attribute 'core'``) was logged as
an unexpected internal error. Here the undecorated shells (``ActorClass.__ray_actor_class__``)
are built outside Ray with a Store that fails the way a killed database connection does.
"""

from __future__ import annotations

import pytest

from actors import remote
from falcon_ray.config import Settings


class ConnectionKilled(Exception):
    pass


def _failing_store(*args, **kwargs):
    raise ConnectionKilled("(2013, 'Lost connection to MySQL server during query')")


CASES = [
    (remote.PollerActor, (), "PollerActor()"),
    (remote.QueueActor, ("edge-a", "2x2"), "QueueActor(edge-a/2x2)"),
    (remote.ClusterActor, ("edge-a",), "ClusterActor(edge-a)"),
]


@pytest.mark.parametrize("actor_class, names, identity", CASES, ids=[c[2] for c in CASES])
def test_repr_of_an_actor_whose_constructor_failed_is_its_identity(monkeypatch, actor_class, names, identity):
    shell = actor_class.__ray_actor_class__
    # the first thing each constructor opens. Patched in the constructor's own globals: once
    # this process has created actors through Ray (an end-to-end test before this one in the
    # same worker), Ray may hand back a copy of the class loaded from its GCS, whose module
    # dict is not ``actors.remote``'s.
    monkeypatch.setitem(shell.__init__.__globals__, "Store", _failing_store)
    actor = shell.__new__(shell)
    with pytest.raises(ConnectionKilled):
        actor.__init__(*names, Settings(), "mysql+pymysql://falcon@db.invalid/falcon", 7)
    assert not hasattr(actor, "core")  # failed half-way: what the old repr read is missing
    assert repr(actor) == identity


@pytest.mark.parametrize("actor_class, names, identity", CASES, ids=[c[2] for c in CASES])
def test_repr_before_the_constructor_ran_is_the_class_name(actor_class, names, identity):
    shell = actor_class.__ray_actor_class__
    assert repr(shell.__new__(shell)) == identity.split("(")[0]


def test_identity_names_kind_cluster_and_topology_only():
    assert remote.actor_identity("PollerActor") == "PollerActor()"
    assert remote.actor_identity("ClusterActor", "edge-l") == "ClusterActor(edge-l)"
    assert remote.actor_identity("QueueActor", "edge-l", "2x2x1") == "QueueActor(edge-l/2x2x1)"
