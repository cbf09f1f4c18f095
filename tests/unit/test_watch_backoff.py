"""The Job watch's backoff after a failed list or watch draws its jitter from the generator
it is given (the simulator hands each ClusterGateway's watch a seeded one, so a run replays)."""

from __future__ import annotations

import random

from falcon_ray.errors import CloudError, ErrorKind
from falcon_ray.kube import JobWatcher


def delays(rng: random.Random, failures: int) -> list[float]:
    watcher = JobWatcher(None, "ns", backoff_initial=0.5, backoff_max=30.0, rng=rng)  # the kube API is not called
    return [watcher._failed(CloudError(ErrorKind.TRANSIENT, "503", status_code=503)) for _ in range(failures)]


def test_the_backoff_jitter_comes_from_the_given_rng():
    first, again = delays(random.Random(7), 8), delays(random.Random(7), 8)
    assert first == again
    assert first != delays(random.Random(8), 8)
    # doubling from the initial delay, capped, each in [ceiling / 2, ceiling]
    for n, d in enumerate(first, start=1):
        ceiling = min(30.0, 0.5 * 2**n)
        assert ceiling / 2 <= d <= ceiling, (n, d)
