"""pick_order (a heap) gives exactly the order of pick_next applied again and again."""

import datetime as dt
import random
from dataclasses import dataclass

from falcon_ray import lifecycle as lc
from falcon_ray import scheduling as s
from falcon_ray.model import QueueTask
from falcon_ray.spec import parse_spec


@dataclass(frozen=True)
class T:
    id: int
    actor: str
    created_at: dt.datetime
    priority: int = 0


def old_order(w, last):
    left, out = list(w), []
    while left:
        n = s.pick_next(left, last)
        out.append(n)
        left.remove(n)
        last = n.actor
    return out


def test_pick_order_is_repeated_pick_next():
    r = random.Random(1)
    t0 = dt.datetime(2026, 1, 1)
    for _ in range(3000):
        n, k = r.randint(0, 30), r.randint(1, 5)
        prios = r.choice([(0,), (0, 5), (-3, 0, 7)])
        w = [T(i, f"a{r.randint(1, k)}", t0 + dt.timedelta(seconds=r.randint(0, 10)), r.choice(prios)) for i in range(n)]
        r.shuffle(w)
        last = r.choice(["", "a1", "a2", "zz"])
        assert s.pick_order(w, last) == old_order(w, last), (w, last)


def _qtask(i: int, actor: str, at: dt.datetime, priority: int, message: str = "") -> QueueTask:
    spec = parse_spec({"tpu_type": "v6e", "topology": "2x2", "image": "img", "command": ["x"], "priority": priority})
    return QueueTask(i, f"t{i}", actor, lc.WAITING, at, None, spec, None, None, message)


def test_waiting_index_keeps_the_pick_order_through_adds_removals_and_new_messages():
    r = random.Random(2)
    t0 = dt.datetime(2026, 1, 1)
    index, live = s.WaitingIndex(), {}
    for step in range(400):
        op = r.random()
        if op < 0.55 or not live:
            i = r.randint(0, 60)
            t = _qtask(i, f"a{r.randint(1, 4)}", t0 + dt.timedelta(seconds=r.randint(0, 10)), r.choice((0, 0, 5)))
            t = live.get(i, t)
            live[i] = t
            index.put(t)
        elif op < 0.85:
            i = r.choice(sorted(live))
            del live[i]
            index.discard(i)
        else:  # a Message written: the same task, another value in place
            some = r.sample(sorted(live), r.randint(1, len(live)))
            for i in some:
                live[i] = live[i].with_message(f"m{step}")
            if step % 2:
                index.replace([live[i] for i in some])
            else:
                for i in some:
                    index.put(live[i])
        w = index.value()
        last = r.choice(["", "a1", "a2"])
        assert len(w) == len(index) == len(live) and all(i in w for i in live)
        expected = old_order(list(live.values()), last)
        assert s.queue_order(w, last) == expected
        assert [t.message for t in s.queue_order(w, last)] == [t.message for t in expected]
        assert s.pick_next(w.top_heads(), last) == (expected[0] if expected else None)
        gone = set(r.sample(sorted(live), min(2, len(live))))
        assert s.queue_order(w, last, gone) == old_order([t for t in live.values() if t.id not in gone], last)


def test_a_waiting_queue_value_does_not_change_when_the_index_does():
    t0 = dt.datetime(2026, 1, 1)
    index = s.WaitingIndex()
    index.put(_qtask(1, "a1", t0, 0))
    before = index.value()
    index.put(_qtask(2, "a1", t0, 0))
    index.discard(1)
    assert [t.id for t in before] == [1] and 2 not in before
    assert [t.id for t in index.value()] == [2]
