"""The database password never reaches Ray: a live demo on a password-protected MariaDB
user, with Ray's GCS fault tolerant on Redis as KubeRay runs it in production.

``falcon-ray demo --hold`` takes the URL from ``FALCON_DB_URL`` (never a command line),
and its actors get a ``file:`` reference to a 0600 file (``falcon_ray.dbref``). While the
actors live, the password must be nowhere Ray keeps or shows it: Ray's tables in Redis,
the dashboard's listings of actors (with details), tasks, jobs and nodes, and the files of
the session's log directory. Each place is first shown to hold what the scan looks for
(the actors' reference, their class names, log files), so an empty scan cannot pass by
looking in the wrong place; and the same Redis scan finds the password once an actor is
created with the URL as its argument, which is what the controller used to do.

Everything this module creates is its own: a MariaDB user and database with a random
password (dropped at the end), a Redis key namespace (deleted at the end), a Ray temp
directory (``RAY_TMPDIR``) and a runtime directory for the demo's record.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest
import sqlalchemy as sa

from tests.e2e.test_demo_inspect import CLI, ROOT, Demo, _line, _token_header
from tests.harness.db import MYSQL_SERVER_URL, _server_engine, in_ci

REDIS = ("127.0.0.1", 6379)
ONE_CLUSTER = """
seed: 3
clusters:
  - {name: edge-s, project: proj-s, location: us-east5-b, tpu_type: v6e, gcs_bucket: logs-s, chips: 32,
     timings: {node_pool_create: 0.5, node_register: 0.3, node_pool_delete: 0.3, flex_visibility_lag: 0.3,
               autoscaler_scale_up: 0.2, flex_capacity_wait: 0.2}}
"""


def _redis():
    import redis

    r = redis.Redis(*REDIS, socket_timeout=10)
    try:
        r.ping()
    except redis.RedisError as e:
        msg = f"Redis at {REDIS[0]}:{REDIS[1]} is unreachable ({e})"
        if in_ci():
            pytest.fail(msg + "; CI=true requires it", pytrace=False)
        pytest.skip(msg)
    return r


def _redis_values(r, namespace: str) -> dict[str, bytes]:
    """Every value Ray's GCS keeps under its storage namespace, by key (and hash field)."""
    out: dict[str, bytes] = {}
    for key in r.scan_iter(match=f"*{namespace}*", count=1000):
        k = key.decode(errors="replace")
        kind = r.type(key).decode()
        if kind == "hash":
            for field, value in r.hgetall(key).items():
                out[f"{k}:{field.hex()[:16]}"] = bytes(field) + b" " + bytes(value)
        elif kind == "string":
            out[k] = r.get(key) or b""
        else:
            out[k] = repr(r.dump(key)).encode()
    return out


def _found(values: dict[str, bytes], needle: bytes) -> list[str]:
    return sorted(k for k, v in values.items() if needle in v)


@pytest.fixture(scope="module")
def secret_db():
    """A MariaDB user with a random password and a database only it uses."""
    try:
        engine = _server_engine()
        with engine.connect():
            pass
    except Exception as e:
        msg = f"MariaDB/MySQL at {MYSQL_SERVER_URL} is unreachable ({e})"
        if in_ci():
            pytest.fail(msg + "; CI=true requires it", pytrace=False)
        pytest.skip(msg)
    tag = secrets.token_hex(4)
    user, db, password = f"falcon_s_{tag}", f"falcon_secret_{tag}", "pw" + secrets.token_hex(12)
    hosts = ("localhost", "127.0.0.1")  # the demo and its actors connect from this machine
    host = sa.engine.make_url(MYSQL_SERVER_URL)
    url = f"mysql+pymysql://{user}:{password}@{host.host or '127.0.0.1'}:{host.port or 3306}/{db}?charset=utf8mb4"
    try:
        with engine.begin() as c:
            c.exec_driver_sql(f"CREATE DATABASE `{db}` CHARACTER SET utf8mb4")
            for h in hosts:
                c.exec_driver_sql(f"CREATE USER '{user}'@'{h}' IDENTIFIED BY '{password}'")
                c.exec_driver_sql(f"GRANT ALL PRIVILEGES ON `{db}`.* TO '{user}'@'{h}'")
        yield url, password
    finally:
        with engine.begin() as c:
            for h in hosts:
                c.exec_driver_sql(f"DROP USER IF EXISTS '{user}'@'{h}'")
            c.exec_driver_sql(f"DROP DATABASE IF EXISTS `{db}`")
        engine.dispose()


@pytest.fixture(scope="module")
def live(secret_db, tmp_path_factory):
    url, password = secret_db
    r = _redis()
    storage_ns = f"falcon-secret-{secrets.token_hex(4)}"
    ray_tmp = Path(tempfile.mkdtemp(prefix="frs-"))  # short: Ray's socket paths stay under 108 bytes
    tmp = tmp_path_factory.mktemp("secrets")
    (tmp / "fleet.yaml").write_text(ONE_CLUSTER)
    env = {
        "FALCON_DB_URL": url,
        "RAY_REDIS_ADDRESS": f"{REDIS[0]}:{REDIS[1]}",
        "RAY_external_storage_namespace": storage_ns,
        "RAY_TMPDIR": str(ray_tmp),
        "TMPDIR": str(ray_tmp),
    }
    demo = Demo(tmp, env=env, args=("--fleet", str(tmp / "fleet.yaml")))
    try:
        demo.start()
        demo.feed(_line("secret-quick", 0.5))
        demo.feed(_line("secret-long", 900))  # keeps a queue and its pool alive during the scans
        demo.wait_task("secret-quick", lambda t: t.status == "Succeeded", timeout=180)
        demo.wait_task("secret-long", lambda t: t.status == "Running", timeout=180)
        yield demo, password, r, storage_ns, ray_tmp
    finally:
        demo.kill()
        for key in r.scan_iter(match=f"*{storage_ns}*", count=1000):
            r.delete(key)
        shutil.rmtree(ray_tmp, ignore_errors=True)


@pytest.mark.mysql
@pytest.mark.timeout(400)
def test_the_password_is_nowhere_ray_keeps_or_shows_it(live):
    demo, password, r, storage_ns, ray_tmp = live
    secret = password.encode()
    ref = demo.record["db_url"]
    assert ref.startswith("file:") and password not in ref, "the demo's record names the file, not the URL"
    assert password not in demo.err() and password not in " ".join(demo.args), "nor its output and command line"

    # Ray's tables in Redis: the actors' creation specs hold the reference, never the URL
    values = _redis_values(r, storage_ns)
    assert any("ACTOR" in k for k in values), sorted(values)[:20]
    assert _found(values, ref.encode()), "the scan reads the actors' creation arguments"
    assert _found(values, secret) == []

    # the dashboard: actors with details (what `ray list actors --detail` reads), tasks, jobs, nodes
    base = demo.record["dashboard_url"].rstrip("/")
    pages = {}
    deadline = time.monotonic() + 90
    for path in ("/api/v0/actors?detail=1&limit=1000", "/api/v0/tasks?detail=1&limit=1000", "/api/jobs/", "/nodes?view=summary"):
        while True:
            try:
                req = urllib.request.Request(base + path, headers=_token_header(demo.env))
                with urllib.request.urlopen(req, timeout=30) as resp:
                    pages[path] = resp.read()
                break
            except OSError as e:  # the dashboard still starting its modules
                assert time.monotonic() < deadline, (path, e)
                time.sleep(2)
    actors = json.loads(pages["/api/v0/actors?detail=1&limit=1000"])["data"]["result"]["result"]
    assert {"PollerActor", "ClusterActor", "QueueActor"} <= {a["class_name"] for a in actors}, actors
    assert [p for p, body in pages.items() if secret in body] == []

    # the session's log files (every actor's stdout/stderr, the GCS, raylet and dashboard logs)
    logs = [p for p in (ray_tmp / "ray").rglob("*") if p.is_file() and "/logs/" in str(p)]
    assert len(logs) > 10, logs
    assert [str(p) for p in logs if secret in p.read_bytes()] == []


LEAK = """
import os, sys, ray
ray.init(address=os.environ["LEAK_RAY_ADDRESS"], namespace="leak-check", log_to_driver=False)

@ray.remote(num_cpus=0)
class TakesTheUrl:
    def __init__(self, url):
        self.ok = bool(url)
    def ready(self):
        return self.ok

a = TakesTheUrl.options(name="takes-the-url").remote(os.environ["FALCON_DB_URL"])
assert ray.get(a.ready.remote(), timeout=120)
print("alive", flush=True)
sys.stdin.readline()  # alive until the test has scanned
ray.kill(a)
"""


@pytest.mark.mysql
@pytest.mark.timeout(300)
def test_the_same_scan_finds_a_password_passed_as_an_actor_argument(live):
    """What `ensure_*` now refuse (tests/unit/test_dbref.py) is what this scan catches: a
    live actor created with the URL as its argument puts the password in Ray's tables."""
    demo, password, r, storage_ns, _ = live
    assert _found(_redis_values(r, storage_ns), password.encode()) == []
    # a joining driver uses token auth only when told (the token: RAY_AUTH_TOKEN or the file a local Ray wrote)
    env = demo.env | {"LEAK_RAY_ADDRESS": demo.record["ray_address"], "RAY_AUTH_MODE": "token"}
    p = subprocess.Popen([sys.executable, "-c", LEAK], env=env, cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        line = p.stdout.readline()
        assert line.strip() == "alive", p.stderr.read()[-3000:] if p.poll() is not None else line
        leaked = _found(_redis_values(r, storage_ns), password.encode())
        assert leaked and any("ACTOR" in k for k in leaked), leaked
    finally:
        try:
            p.communicate("\n", timeout=60)
        except subprocess.TimeoutExpired:
            p.kill()


@pytest.mark.mysql
@pytest.mark.timeout(120)
def test_commands_reach_the_demo_database_from_the_environment(live):
    """An operator's command finds the password-protected database through FALCON_DB_URL
    (or the demo's record), never through a URL on its command line."""
    demo, password, *_ = live
    p = subprocess.run(CLI + ["status", "--json"], env=demo.env, cwd=ROOT, capture_output=True, text=True, timeout=100)
    assert p.returncode == 0, p.stderr[-3000:]
    names = {t["name"] for t in json.loads(p.stdout)}
    assert {"secret-quick", "secret-long"} <= names, names
    assert password not in p.stdout + p.stderr
    assert os.environ.get("FALCON_DB_URL") is None or password not in os.environ["FALCON_DB_URL"]
