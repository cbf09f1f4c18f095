"""pytest fixtures: one local Ray for the whole test run.

Under xdist (``make test`` runs ``TEST_WORKERS`` workers) the controller process starts one Ray
cluster before the workers exist (``ray start --head``, 2 CPUs, no dashboard UI, metrics
export on a free port so the metrics test can scrape it) and kills it when the run ends;
every worker joins it. One Ray instead of one per worker: each Ray costs ~6 CPU-s to start
and ~0.05 cores while it runs, on a 2-core machine where the run is CPU-bound. Without
xdist (one file, ``pytest -n 0``) ``ray_session`` starts a local Ray in-process as before.

Tests isolate themselves with a Ray namespace of their own (every DemoRun takes a fresh
one) and kill their actors when they finish; the metrics test, which reads series every
worker's controllers add to, names its cluster and poller so it counts only its own.
"""

from __future__ import annotations

import os
import secrets
import shutil
import tempfile
from pathlib import Path

import pytest

from tests.harness.ray_head import RayHead, free_port

ADDRESS_ENV = "FALCON_TEST_RAY_ADDRESS"  # the shared Ray's GCS address, for the workers
METRICS_ENV = "FALCON_TEST_RAY_METRICS_PORT"
SYSTEM_CONFIG = {"metrics_report_interval_ms": 2000}  # the metrics test waits seconds, not tens
_HEAD = pytest.StashKey[RayHead]()


def _parallel(config: pytest.Config) -> bool:
    """True in the controller of an xdist run with workers."""
    n = getattr(config.option, "numprocesses", None)
    return not hasattr(config, "workerinput") and bool(n) and n != "0" and getattr(config.option, "dist", "no") != "no"


def pytest_configure(config: pytest.Config) -> None:
    if not _parallel(config) or os.environ.get(ADDRESS_ENV):
        return
    # token auth, as production runs it and as a local ray.init() would. `ray start --head`
    # does not create a token (a local ray.init() writes ~/.ray/auth_token, the head only
    # reads one), so on a machine that never ran Ray it would exit: the run makes its own and
    # hands it to the head, the workers and their actors through the environment, leaving the
    # home directory alone. A joining driver uses token auth only when RAY_AUTH_MODE says so.
    os.environ.setdefault("RAY_AUTH_MODE", "token")
    os.environ.setdefault("RAY_AUTH_TOKEN", secrets.token_hex(16))
    # no log monitor: every driver here runs with log_to_driver=False, so it only tailed the
    # hundreds of actor log files a run writes (~21 CPU-s of a run, measured 2026-12-02)
    head = RayHead("ray", Path(tempfile.mkdtemp(prefix="fr-")), num_cpus=2, system_config=SYSTEM_CONFIG, log_monitor=False)
    head.start()
    try:
        address = head.wait_ready(timeout=180)
    except Exception:
        head.stop()
        raise
    config.stash[_HEAD] = head
    os.environ[ADDRESS_ENV] = address  # the workers start after every pytest_configure: they inherit it
    os.environ[METRICS_ENV] = str(head.metrics_port)


_FAILED = pytest.StashKey[bool]()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    session.config.stash[_FAILED] = exitstatus != 0


def pytest_unconfigure(config: pytest.Config) -> None:
    head = config.stash.get(_HEAD, None)
    if head is not None:
        failed = config.stash.get(_FAILED, False)
        head.stop(keep_logs=failed)
        if failed:
            # a failed run keeps every actor's log (a soak invariant names tasks and times;
            # the QueueActors' logs say which rule acted on them)
            print(f"\nthe shared Ray's logs of this failed run are kept in {head.temp_dir}")
        else:
            shutil.rmtree(head.temp_dir.parent, ignore_errors=True)  # its log too
        os.environ.pop(ADDRESS_ENV, None)
        os.environ.pop(METRICS_ENV, None)


@pytest.fixture(scope="session")
def ray_session():
    import ray

    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    if ray.is_initialized():  # a test that joined some Ray of its own ran first (xdist order)
        ray.shutdown()
    address = os.environ.get(ADDRESS_ENV)
    # the actors log at INFO to their files (which rule deleted a Job, every transition), as
    # `falcon-ray run` has them do: a failed run keeps those files (pytest_unconfigure)
    logs = ray.LoggingConfig(encoding="TEXT", log_level="INFO")
    if address:
        ray.init(address=address, log_to_driver=False, configure_logging=False, logging_config=logs)
        yield {"metrics_port": int(os.environ[METRICS_ENV])}
    else:
        port = free_port()
        ray.init(
            num_cpus=2,
            include_dashboard=False,
            log_to_driver=False,
            configure_logging=False,
            _metrics_export_port=port,
            _system_config=SYSTEM_CONFIG,
            logging_config=logs,
        )
        yield {"metrics_port": port}
    ray.shutdown()
