"""pick_order (a heap) gives exactly the order of pick_next applied again and again."""

import datetime as dt
import random
from dataclasses import dataclass

from falcon_ray import scheduling as s


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
