"""pytest fixtures: one local Ray for the whole session.

``ray_session`` starts Ray once (2 CPUs, no dashboard UI, metrics export on a free
port so the metrics test can scrape it) and shuts it down at the end of the
session (one per xdist worker: `make test` runs three). Scenario tests share it and isolate themselves with a Ray namespace of
their own, killing their actors when they finish.
"""

from __future__ import annotations

import os
import socket

import pytest


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def ray_session():
    import ray

    port = _free_port()
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    if ray.is_initialized():  # a test that joined some Ray of its own ran first (xdist order)
        ray.shutdown()
    ray.init(
        num_cpus=2,
        include_dashboard=False,
        log_to_driver=False,
        configure_logging=False,
        _metrics_export_port=port,
        _system_config={"metrics_report_interval_ms": 2000},
    )
    yield {"metrics_port": port}
    ray.shutdown()
