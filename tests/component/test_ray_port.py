"""``RayPort.hint`` never blocks its caller (no Ray cluster needed: the lookup is faked).

Found by the chaos soak: a ClusterActor's watch thread hints the queue of every Job
event; with the queue's actor being restarted, ``ray.get_actor`` blocked that thread,
and no Job event was delivered for minutes (tasks stayed Running after their Jobs ended).
"""

from __future__ import annotations

import threading
import time

from actors import remote
from actors.remote import RayPort
from falcon_ray.config import Settings


class FakeHandle:
    def __init__(self) -> None:
        self.hints = 0
        self.hint = self
        self.sent = threading.Event()

    def remote(self, rows: bool = True):
        self.hints += 1
        self.sent.set()
        return FakeRef()


class FakeRef:
    def future(self):
        return self

    def add_done_callback(self, fn) -> None:
        pass


def test_a_hint_that_needs_a_slow_lookup_does_not_block_the_caller(monkeypatch):
    released = threading.Event()
    returned = threading.Event()
    looked_up: list[str] = []
    handle = FakeHandle()

    def slow_lookup(name, namespace):
        looked_up.append(name)
        released.wait(10)  # wall-clock: ray.get_actor of an actor being restarted, on RayPort's real hint thread
        returned.set()
        return handle

    monkeypatch.setattr(remote.names, "lookup", slow_lookup)
    port = RayPort(Settings(), "sqlite://")
    t0 = time.monotonic()  # wall-clock: RayPort's hint pool is real threads; the caller's real time is the claim
    for _ in range(50):  # a burst of Job events for one queue
        port.hint("edge-a", "2x2", create=False)
    assert not returned.is_set(), "the caller (a watch thread) waited for the lookup to end"
    assert time.monotonic() - t0 < 0.5, "the caller (a watch thread) waited for the lookup"  # wall-clock: as above
    released.set()
    handle.sent.wait(5)  # wall-clock: the hint goes out from RayPort's real hint thread
    assert handle.hints >= 1, "the hint still reaches the queue"
    assert looked_up == ["queue/edge-a/2x2"], "one lookup per queue at a time"
    # with the handle cached, a hint goes out at once from the caller
    port.hint("edge-a", "2x2", create=False)
    assert handle.hints >= 2
