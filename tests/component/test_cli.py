"""falcon-ray CLI: db upgrade, clusters, submit, abort, status (run through click's CliRunner)."""

from __future__ import annotations

import datetime as dt
import json

import pytest
import sqlalchemy as sa
from click.testing import CliRunner

from falcon_ray import cli
from falcon_ray import lifecycle as lc
from falcon_ray.store import Store, migrate
from falcon_ray.store import tables as t

ARGS = ["--actor", "alice", "--tpu-type", "v6e", "--topology", "2x4", "--image", "python:3.12"]


def run(*args: str, db: str | None = None, env: dict | None = None):
    # --db goes right after the command path: everything after submit's command is the command
    n = 2 if args and args[0] in ("db", "clusters") else 1
    argv = list(args[:n]) + (["--db", db] if db else []) + list(args[n:])
    return CliRunner(env=env).invoke(cli.main, argv, catch_exceptions=False)


def ok(*args: str, db: str | None = None):
    result = run(*args, db=db)
    assert result.exit_code == 0, (result.stdout, result.stderr)
    return result


def no_traceback(result) -> None:
    assert "Traceback" not in result.output
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr


@pytest.fixture
def url(store):
    """A migrated database (jobs table included)."""
    return store.url


# --- db upgrade ---------------------------------------------------------------------------


def test_db_upgrade_creates_every_table_then_is_a_noop(db_url):
    first = ok("db", "upgrade", "--with-jobs-table", db=db_url)
    assert "applied" in first.stdout and "falcon_0001" in first.stdout and "jobs_0001" in first.stdout
    engine = sa.create_engine(db_url)
    try:
        tables = set(sa.inspect(engine).get_table_names())
    finally:
        engine.dispose()
    assert set(t.metadata.tables) <= tables
    assert migrate.drift(db_url) == []

    second = ok("db", "upgrade", "--with-jobs-table", "--json", db=db_url)
    report = json.loads(second.stdout)
    assert report["applied"] == []
    assert sorted(report["current"]) == sorted(migrate.heads().values())
    assert "up to date" in ok("db", "upgrade", db=db_url).stdout


def test_db_upgrade_adds_jobs_later(db_url):
    assert json.loads(ok("db", "upgrade", "--json", db=db_url).stdout)["applied"] == ["falcon_0001", "falcon_0002", "falcon_0003", "falcon_0004", "falcon_0005", "falcon_0006", "falcon_0007", "falcon_0008", "falcon_0009"]
    assert migrate.missing_tables(db_url) == ["jobs"]
    assert json.loads(ok("db", "upgrade", "--with-jobs-table", "--json", db=db_url).stdout)["applied"] == [
        "jobs_0001"
    ]
    assert migrate.missing_tables(db_url) == []


def test_unmigrated_database_is_one_clear_line(db_url):
    for args in (["status"], ["clusters", "list"], ["abort", "1"], ["submit", *ARGS, "--", "true"]):
        result = run(*args, db=db_url)
        assert result.exit_code == 1, args
        assert "falcon-ray db upgrade" in result.stderr
        no_traceback(result)


def test_missing_sqlite_file_is_not_created(tmp_path):
    path = tmp_path / "nope.db"
    result = run("status", db=f"sqlite:///{path}")
    assert result.exit_code == 1 and "falcon-ray db upgrade" in result.stderr
    no_traceback(result)
    assert not path.exists()


def test_missing_jobs_table_names_the_flag(db_url):
    ok("db", "upgrade", db=db_url)
    assert ok("clusters", "list", db=db_url).exit_code == 0  # clusters need no jobs table
    result = run("status", db=db_url)
    assert result.exit_code == 1 and "--with-jobs-table" in result.stderr
    no_traceback(result)


def test_unreachable_database_is_one_line():
    result = run("clusters", "list", db="mysql+pymysql://root@127.0.0.1:1/none")
    assert result.exit_code == 1 and "database error" in result.stderr
    no_traceback(result)


def test_db_url_from_environment(tmp_path):
    db = f"sqlite:///{tmp_path / 'env.db'}"
    result = CliRunner(env={"FALCON_DB_URL": db}).invoke(cli.main, ["db", "upgrade"])
    assert result.exit_code == 0 and str(tmp_path / "env.db") in result.stdout
    assert (tmp_path / "env.db").exists()


# --- clusters -------------------------------------------------------------------------------


def test_clusters_add_list_set_status(url):
    added = ok(
        "clusters", "add", "edge-1", "--project", "proj-a", "--location", "us-central1",
        "--tpu-type", "v7x", "--reservation", "res-1", "--gcs-bucket", "bkt", "--json", db=url,
    )  # fmt: skip
    row = json.loads(added.stdout)
    assert row["name"] == "edge-1" and row["default_reservation"] == "res-1" and row["status"] == "active"
    ok("clusters", "add", "edge-2", "--project", "p", "--location", "l", "--tpu-type", "v6e",
       "--status", "maintenance", "--namespace", "ns", "--service-account", "sa", db=url)  # fmt: skip

    table = ok("clusters", "list", db=url).stdout.splitlines()
    assert table[0].split()[:3] == ["NAME", "TPU", "STATUS"]
    assert table[1].split()[:3] == ["edge-1", "v7x", "active"]
    assert table[2].split()[:3] == ["edge-2", "v6e", "maintenance"]
    listed = json.loads(ok("clusters", "list", "--json", db=url).stdout)
    assert [(c["name"], c["namespace"], c["service_account"]) for c in listed] == [
        ("edge-1", "falcon-jobs", "falcon-job"),
        ("edge-2", "ns", "sa"),
    ]

    assert "maintenance -> active" in ok("clusters", "set-status", "edge-2", "active", db=url).stdout
    assert json.loads(ok("clusters", "set-status", "edge-1", "offline", "--json", db=url).stdout)["status"] == "offline"


def test_clusters_list_shows_the_reservation_ledger_as_last_recorded(url):
    ok("clusters", "add", "edge-a", "--project", "p", "--location", "us-east5-b", "--tpu-type", "v6e", "--reservation", "res-a", db=url)
    ok("clusters", "add", "edge-b", "--project", "p", "--location", "us-central1-b", "--tpu-type", "v6e", db=url)
    store = Store(url)
    store.record_reservation(store.get_cluster("edge-a").id, "ct6e-standard-4t", 6, 2, 3)
    table = ok("clusters", "list", db=url).stdout.splitlines()
    head = table[0].split()
    cells = dict(zip(head, table[1].split(), strict=False))
    assert head[6:12] == ["RESERVATION", "HOLDS", "COUNT", "IN-USE", "CLAIMED", "FREE"]
    assert [cells[k] for k in head[6:12]] == ["res-a", "ct6e-standard-4t", "6", "2", "3", "1"]
    assert table[2].split()[6:12] == ["-"] * 6  # no reservation, nothing read
    listed = {c["name"]: c for c in json.loads(ok("clusters", "list", "--json", db=url).stdout)}
    assert (listed["edge-a"]["reservation_claimed"], listed["edge-a"]["reservation_free"]) == (3, 1)
    assert listed["edge-b"]["reservation_free"] is None


def test_clusters_refusals(url):
    base = ["--project", "p", "--location", "l", "--tpu-type", "v6e"]
    ok("clusters", "add", "edge-1", *base, db=url)
    dup = run("clusters", "add", "edge-1", *base, db=url)
    assert dup.exit_code == 1 and "already exists" in dup.stderr
    no_traceback(dup)

    bad_type = run("clusters", "add", "edge-9", "--project", "p", "--location", "l", "--tpu-type", "v9", db=url)
    assert bad_type.exit_code == 2 and "v6e" in bad_type.stderr and "v7x" in bad_type.stderr
    bad_status = run("clusters", "add", "edge-9", *base, "--status", "broken", db=url)
    assert bad_status.exit_code == 2
    unknown = run("clusters", "set-status", "nope", "active", db=url)
    assert unknown.exit_code == 1 and "nope" in unknown.stderr
    assert run("clusters", "set-status", "edge-1", "sleeping", db=url).exit_code == 2
    assert len(json.loads(ok("clusters", "list", "--json", db=url).stdout)) == 1


# --- submit -------------------------------------------------------------------------------


def test_submit_prints_only_the_id_and_writes_a_pending_task(url):
    result = ok(
        "submit", *ARGS, "--name", "probe", "--env", "A=1", "--env", "B=x=y", "--timeout", "600",
        "--supply-mode", "flex-start", "--cpu", "8", "--memory", "16Gi", "--working-dir", "/app",
        "--", "python", "-c", "print(1)", db=url,
    )  # fmt: skip
    assert result.stdout.strip().isdigit() and result.stdout == result.stdout.strip() + "\n"
    assert result.stderr == ""
    store = Store(url)
    try:
        task = store.get_task(int(result.stdout))
        assert (task.status, task.reason, task.cluster_id, task.name, task.actor) == (
            "Pending", "", None, "probe", "alice",
        )  # fmt: skip
        assert task.timeout_seconds == 600
        spec = json.loads(task.spec)
        assert spec["command"] == ["python", "-c", "print(1)"]
        assert spec["env"] == {"A": "1", "B": "x=y"}
        assert spec["supply_mode"] == "flex-start" and spec["working_dir"] == "/app"
        assert [e.status for e in store.events(task.id)] == ["Pending"]
        new, _ = store.intake()
        assert [x.id for x in new] == [task.id]
    finally:
        store.dispose()


def test_submit_command_without_double_dash(url):
    out = run("submit", *ARGS, "--db", url, "python", "train.py", "--steps", "10")
    assert out.exit_code == 0, out.stderr
    store = Store(url)
    try:
        assert json.loads(store.get_task(int(out.stdout)).spec)["command"] == ["python", "train.py", "--steps", "10"]
    finally:
        store.dispose()


@pytest.mark.parametrize(
    "extra,words",
    [
        (["--tpu-type", "v9"], ["tpu_type", "v6e"]),
        (["--topology", "3x3"], ["topology", "2x4"]),
        (["--image", "Not An Image"], ["image"]),
        (["--env", "FALCON_TASK_ID=1"], ["env", "FALCON_TASK_ID"]),
        (["--env", "1BAD=x"], ["env"]),
        (["--timeout", "0"], ["timeout_seconds"]),
        (["--timeout", "99999999"], ["timeout_seconds"]),
        (["--supply-mode", "spot"], ["supply_mode", "flex-start"]),
        (["--cpu", "many"], ["cpu"]),
        (["--working-dir", "relative"], ["working_dir"]),
    ],
)
def test_submit_refuses_an_invalid_spec_with_exit_2(url, extra, words):
    result = run("submit", *ARGS, *extra, "--", "true", db=url)
    assert result.exit_code == 2, (result.stdout, result.stderr)
    assert result.stdout == ""
    for word in words:
        assert word in result.stderr
    no_traceback(result)
    store = Store(url)
    try:
        assert store.recent_tasks() == []
    finally:
        store.dispose()


def test_submit_without_a_command_or_with_a_bad_env_flag(url):
    empty = run("submit", *ARGS, db=url)
    assert empty.exit_code == 2 and "command" in empty.stderr
    bad = run("submit", *ARGS, "--env", "NOEQUALS", "--", "true", db=url)
    assert bad.exit_code == 2 and "NAME=VALUE" in bad.stderr
    assert run("submit", *ARGS, "--timeout", "soon", "--", "true", db=url).exit_code == 2


# --- abort ---------------------------------------------------------------------------------


def _submit(url: str) -> int:
    return int(ok("submit", *ARGS, "--", "true", db=url).stdout)


def test_abort(url):
    tid = _submit(url)
    first = ok("abort", str(tid), "--json", db=url)
    assert json.loads(first.stdout) == {"id": tid, "status": "Aborting", "previous": "Pending", "changed": True}
    assert "already" in ok("abort", str(tid), db=url).stdout

    store = Store(url)
    try:
        assert store.get_task(tid).status == "Aborting"
        assert store.transition(tid, lc.ABORTING, lc.ABORTED, "Aborted by user")
    finally:
        store.dispose()
    done = run("abort", str(tid), db=url)
    assert done.exit_code == 1 and "already finished" in done.stderr and "Aborted" in done.stderr
    no_traceback(done)
    unknown = run("abort", "4242", db=url)
    assert unknown.exit_code == 1 and "4242" in unknown.stderr and "not found" in unknown.stderr
    assert run("abort", "abc", db=url).exit_code == 2


# --- status ---------------------------------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = dt.datetime(2030, 5, 1, 9, 0, 0)

    def __call__(self) -> dt.datetime:
        return self.now

    def tick(self, seconds: float) -> None:
        self.now += dt.timedelta(seconds=seconds)


def _walk_a_task(url: str) -> tuple[int, str]:
    """A task submitted, assigned to edge-1, provisioned, run and finished, on a fake clock."""
    clock = Clock()
    store = Store(url, clock=clock)
    try:
        cluster = store.add_cluster("edge-1", "p", "l", "v6e")
        tid = store.submit_task("alice", {"tpu_type": "v6e", "topology": "2x4", "image": "x", "command": ["t"]}, "run-a")
        clock.tick(2)
        store.transition(tid, lc.NEW, lc.WAITING, "Queue position #1", cluster_id=cluster.id)
        clock.tick(10)
        store.transition(tid, lc.WAITING, lc.PROVISIONING, "Creating node pool falcon-2x4-a")
        clock.tick(300)
        store.transition(tid, lc.PROVISIONING, lc.DISPATCHING, "Node pool ready", node_pool_name="falcon-2x4-a")
        clock.tick(5)
        store.transition(tid, lc.DISPATCHING, lc.RUNNING, "Pod running (2/2 active)", dispatched_at=clock())
        clock.tick(7200)
        store.transition(tid, lc.RUNNING, lc.SUCCEEDED, "")
        return tid, cluster.id
    finally:
        store.dispose()


def test_status_table_and_json(url):
    tid, cluster_id = _walk_a_task(url)
    other = _submit(url)

    table = ok("status", db=url).stdout.splitlines()
    assert table[0].split()[:5] == ["ID", "NAME", "ACTOR", "STATUS", "REASON"]
    assert table[1].split()[:4] == [str(other), "-", "alice", "Pending"]  # newest first
    assert "edge-1" in table[2] and "falcon-2x4-a" in table[2] and "Succeeded" in table[2]
    assert "2030-05-01 11:05:17" in table[2]  # finished

    rows = json.loads(ok("status", str(tid), "--json", db=url).stdout)
    assert len(rows) == 1
    row = rows[0]
    assert (row["status"], row["reason"], row["cluster_name"], row["node_pool_name"]) == (
        "Succeeded", "", "edge-1", "falcon-2x4-a",
    )  # fmt: skip
    assert row["created_at"].startswith("2030-05-01T09:00:00") and row["finished_at"]
    assert row["dispatched_at"].startswith("2030-05-01T09:05:17")

    both = json.loads(ok("status", str(other), str(tid), "--json", db=url).stdout)
    assert [r["id"] for r in both] == [other, tid]  # in the order asked
    assert len(json.loads(ok("status", "--limit", "1", "--json", db=url).stdout)) == 1

    missing = run("status", str(tid), "999", db=url)
    assert missing.exit_code == 1 and "999" in missing.stderr
    assert "Succeeded" in missing.stdout


def test_status_events_timeline(url):
    tid, _ = _walk_a_task(url)
    out = ok("status", str(tid), "--events", db=url).stdout
    lines = out.splitlines()
    assert lines[0].startswith(f"task {tid} 'run-a' by alice: Succeeded on edge-1")
    assert lines[1].split()[:3] == ["TIME", "(UTC)", "STEP"]
    steps = [line.split()[2] for line in lines[2:-1]]
    assert steps == [
        "Pending", "Pending/Waiting", "Pending/Provisioning", "Pending/Dispatching", "Running", "Succeeded",
    ]  # fmt: skip
    assert "2.0s" in lines[2] and "10.0s" in lines[3] and "5m00s" in lines[4] and "2h00m" in lines[6]
    assert "Queue position #1" in lines[3]
    assert lines[-1] == "total: 2h05m"

    report = json.loads(ok("status", str(tid), "--events", "--json", db=url).stdout)
    assert report["task"]["id"] == tid
    assert [e["seconds"] for e in report["events"]] == [2.0, 10.0, 300.0, 5.0, 7200.0, None]
    assert report["events"][2]["reason"] == "Provisioning"


def test_status_events_of_a_live_task_runs_to_now(url):
    tid = _submit(url)
    report = json.loads(ok("status", str(tid), "--events", "--json", db=url).stdout)
    assert len(report["events"]) == 1 and report["events"][0]["ongoing"] is True
    assert report["events"][0]["seconds"] >= 0
    assert "so far" in ok("status", str(tid), "--events", db=url).stdout


def test_status_usage_errors(url):
    assert run("status", "--events", db=url).exit_code == 2
    assert run("status", "1", "2", "--events", db=url).exit_code == 2
    assert "no tasks" in ok("status", db=url).stdout
    assert json.loads(ok("status", "--json", db=url).stdout) == []


def test_other_command_groups_are_attached():
    assert "sim" in cli.main.commands
    assert {"db", "clusters", "submit", "abort", "status"} <= set(cli.main.commands)


def test_helpers():
    assert cli.human_duration(0.5) == "0.5s" and cli.human_duration(-3) == "0.0s"
    assert cli.human_duration(61) == "1m01s" and cli.human_duration(3 * 86400 + 7200) == "3d02h"
    assert cli.safe_url("mysql+pymysql://u:secret@h/db") == "mysql+pymysql://u:***@h/db"
