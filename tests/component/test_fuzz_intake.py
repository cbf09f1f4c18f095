"""Fuzzing the intake: 10,000 random specs and raw rows through the real IntakePoller.

Each row ends Failed / InvalidSpec with a message that names the offending field
(``<field>: ...`` or ``spec: ...`` for the document as a whole), or is assigned a
cluster (Pending / Waiting); no poll raises and no row is left behind. The rows come
from a seeded generator (reproducible: the seed is in the test id), written straight
into the ``jobs`` table as an upper layer could: broken JSON, wrong types, huge
strings, control characters, unicode, nested junk, unknown fields, valid specs.
No Ray: the poller runs on a real SQLite store with the fake port.
"""

from __future__ import annotations

import json
import random
import re

import pytest
from sqlalchemy import event as sa_event

from falcon_ray import lifecycle as lc
from falcon_ray import tpu
from falcon_ray.spec import TaskSpec
from falcon_ray.store import tables as t
from tests.harness.fakes import T0, QueueBench

ROWS = 10_000
FIELDS = sorted(TaskSpec.model_fields)
# a known field (or a path below one), the spec as a whole, or the unknown field it refuses
NAMES_A_FIELD = re.compile(r"(?:^|; )(?:(?:spec|" + "|".join(FIELDS) + r")(?:\.[^:;]+)?: |[A-Za-z_][A-Za-z0-9_.]*: unknown field)")

JUNK_STRINGS = [
    "",
    " ",
    "\x00",
    "\x00\x01\x02\x1b[31m",
    "\u202e\u200b\ufeff",
    "日本語のテキスト",
    "😀" * 50,
    "\ud7ff\ue000",
    "a" * 70_000,
    "../../etc/passwd",
    "$(rm -rf /)",
    "{'not': 'json'}",
    "null",
    "\n\r\t",
    "Robert'); DROP TABLE jobs;--",
]


def _junk(rng: random.Random, depth: int = 0):
    kind = rng.randrange(12 if depth < 4 else 8)
    if kind == 0:
        return None
    if kind == 1:
        return rng.choice([True, False])
    if kind == 2:
        return rng.choice([0, -1, 1, 2**31, 2**63, -(2**64), 10**40])
    if kind == 3:
        return rng.choice([0.5, -0.0, 1e308, float("inf"), float("nan")])
    if kind in (4, 5, 6, 7):
        return rng.choice(JUNK_STRINGS) if rng.random() < 0.6 else "".join(chr(rng.randrange(1, 0x2FFFF)) for _ in range(rng.randrange(1, 40))).encode("utf-8", "surrogatepass").decode("utf-8", "replace")
    if kind in (8, 9):
        return [_junk(rng, depth + 1) for _ in range(rng.randrange(4))]
    return {rng.choice(JUNK_STRINGS[:8] + FIELDS): _junk(rng, depth + 1) for _ in range(rng.randrange(4))}


def _valid(rng: random.Random) -> dict:
    tpu_type, topology = rng.choice(sorted(tpu.CATALOGUE))
    spec = {"tpu_type": tpu_type, "topology": topology, "image": "us-docker.pkg.dev/p/r/img:1", "command": ["python", "x.py"]}
    if rng.random() < 0.5:
        spec["env"] = {"A_B": "日本 \t", "x.y-z": ""}
    if rng.random() < 0.3:
        spec["supply_mode"] = rng.choice(["reservation", "flex-start", "on-demand", ""])
    if rng.random() < 0.3:
        spec["timeout_seconds"] = rng.randrange(1, 7 * 24 * 3600)
    return spec


def _row(rng: random.Random) -> str:
    kind = rng.randrange(10)
    spec = _valid(rng)
    if kind <= 1:
        return json.dumps(spec, ensure_ascii=rng.random() < 0.5)
    if kind <= 4:  # one field replaced by junk (or removed)
        field = rng.choice(FIELDS)
        if rng.random() < 0.1:
            spec.pop(field, None)
        else:
            spec[field] = _junk(rng)
        return json.dumps(spec, allow_nan=True)
    if kind == 5:  # unknown fields, some of them smuggling privileges
        spec[rng.choice(["privileged", "hostPath", "namespace", "x" * 300, "", "\x00"])] = _junk(rng)
        return json.dumps(spec)
    if kind == 6:  # broken JSON: truncated, doubled, garbage bytes
        text = json.dumps(spec)
        return rng.choice([text[: rng.randrange(len(text))], text + text, text.replace('"', "'"), text + "}", "\x00" + text])
    if kind == 7:  # not an object, or nested beyond reason
        depth = rng.choice([10, 1000, 100_000])
        return rng.choice(["[]", '"spec"', "42", "null", "true", "[" * depth + "]" * depth, '{"a":' * depth + "1" + "}" * depth])
    if kind == 8:  # numbers JSON allows and Python may not like
        return rng.choice(['{"timeout_seconds": 1e999}', '{"timeout_seconds": NaN}', '{"tpu_type": -Infinity}', '{"cpu": 1' + "0" * 5000 + "}"])
    return json.dumps(_junk(rng))


@pytest.mark.timeout(120)
@pytest.mark.parametrize("seed", [20261201])
def test_ten_thousand_random_rows_each_fail_with_a_field_or_are_assigned(tmp_path, seed):
    rng = random.Random(seed)
    bench = QueueBench(f"sqlite:///{tmp_path / 'fuzz.db'}", intake_batch=1000)
    st = bench.store

    @sa_event.listens_for(st.engine, "connect")
    def _no_fsync(dbapi_conn, _record):  # speed only: the test needs no durability across power loss
        dbapi_conn.execute("PRAGMA synchronous=OFF")

    st.engine.dispose()
    for tpu_type in tpu.tpu_types():  # a cluster for every TPU type, so a valid spec always has a home
        if tpu_type != "v6e":
            st.add_cluster(f"edge-{tpu_type}", "p", "us-east5-b", tpu_type, "logs", "res-x")
    rows = [_row(rng) for _ in range(ROWS)]
    with st.engine.begin() as c:  # as the upper layer would insert them, in one go
        c.execute(
            t.jobs.insert(),
            [
                dict(name=f"fuzz-{i}", actor=rng.choice(["alice", "bob", "日本", "\x1b[0m", "x" * 128]), spec=text,
                     status="Pending", reason="", message="", created_at=T0, updated_at=T0)
                for i, text in enumerate(rows)
            ],
        )  # fmt: skip
    for _ in range(ROWS // 1000 + 5):
        counts = bench.poller.poll_once()  # never raises, whatever the rows hold
        if counts["new"] == 0:
            break
    tasks = st.recent_tasks(limit=ROWS + 1)
    assert len(tasks) == ROWS
    outcomes: dict[str, int] = {}
    for task in tasks:
        text = rows[int(task.name.removeprefix("fuzz-"))]
        if task.phase == lc.WAITING:
            assert task.cluster_id, task
            outcomes["assigned"] = outcomes.get("assigned", 0) + 1
            continue
        assert task.phase == lc.failed(lc.Reason.INVALID_SPEC), (task.phase, task.message, text[:300])
        detail = task.message.removeprefix("Invalid task spec: ")
        assert NAMES_A_FIELD.search(detail), (detail[:300], text[:300])
        assert len(task.message) <= 4000
        outcomes["invalid"] = outcomes.get("invalid", 0) + 1
    assert outcomes.get("assigned", 0) > 1000 and outcomes.get("invalid", 0) > 5000, outcomes
    assert bench.port.took("hint"), "the assigned tasks' queues were woken"
    print(f"{ROWS} rows: {outcomes}")  # pytest --durations tells the time
