"""The message catalogue renders in both languages with the fields the code passes."""

from __future__ import annotations

import string

import pytest

from falcon_ray import messages

PLAUSIBLE = {
    "active": 1,
    "attempt": "Attempt 2 of 4 after maintenance at 2026-12-01 10:42:00 UTC (node gke-n-1: drained)",
    "attempts": 4,
    "count": 2,
    "hosts": 16,
    "history": "#1 maintenance on node gke-n-1 at 2026-12-01 10:42:00 UTC (drained)",
    "kind": "maintenance",
    "n": 1,
    "task": 258,
    "by": "2026-12-03 18:00",
    "node": "gke-edge-a-falcon-t42-2x4-0",
    "why": "node pool falcon-t42-2x4 is gone",
    "at": "2026-12-01 10:42",
    "latest": "11:05",
    "since": "10:42:00",
    "ahead": 2,
    "cluster": "tpuv7x-64-node",
    "clusters": "edge-a, edge-b",
    "detail": "quota 'TPUS_PER_PROJECT' exceeded",
    "eta": "~25m",
    "expected": 2,
    "held": "ct6e-standard-4t",
    "job": "falcon-task-42",
    "limit": "10m",
    "machine_type": "ct6e-standard-1t",
    "needed": 2,
    "offered": "v6e, v7x",
    "origin": "edge-a",
    "zone": "us-central1-b",
    "pool": "falcon-2x4-abcd",
    "position": 3,
    "ready": 0,
    "refusals": 3,
    "registered": 0,
    "retry": "4m",
    "remaining": 1,
    "reservation": "res-a",
    "seconds": 3600,
    "status": "maintenance",
    "supply": "reservation",
    "target_reservation": "res-c",
    "tasks": "user-a: profiling-v7x, user-b: benchmark-v7x",
    "topologies": "2x2, 2x4, 4x4",
    "topology": "2x4",
    "tpu_type": "v7x",
    "waited": "12m",
    "own": "falcon-42-2x2-1",
    "deadline": "2026-12-01 15:00",
    "created": "2026-12-01 14:00",
    "phase": "Pending/WaitingForNode",
    "waiting": "waiting for flex-start capacity: the nodes of node pool falcon-2x4-abcd",
    "message": "node pool falcon-2x4-abcd control-plane RUNNING but 0/2 expected node(s) registered (Ready=0)...",
}


def fields_of(template: str) -> set[str]:
    return {name for _, name, _, _ in string.Formatter().parse(template) if name}


@pytest.mark.parametrize("key", messages.keys())
@pytest.mark.parametrize("lang", ["en", "zh"])
def test_every_key_renders(key, lang):
    out = messages.text(key, lang, **PLAUSIBLE)
    assert "{" not in out and "}" not in out
    assert len(out) <= messages.MAX_MESSAGE


@pytest.mark.parametrize("key", messages.keys())
def test_both_languages_take_the_same_fields(key):
    en, zh = messages._CATALOGUE[key]
    assert fields_of(en) == fields_of(zh), key
    assert fields_of(en) <= set(PLAUSIBLE), f"add the new field of {key!r} to PLAUSIBLE"
    need = fields_of(en)
    if need:  # a missing field is a KeyError, not a silent blank
        with pytest.raises(KeyError):
            messages.text(key, "en", **{k: v for k, v in PLAUSIBLE.items() if k != sorted(need)[0]})


def test_language_from_environment(monkeypatch):
    monkeypatch.delenv("FALCON_LANG", raising=False)
    assert messages.lang() == "en"
    assert messages.text("aborted") == "Aborted by user"
    monkeypatch.setenv("FALCON_LANG", "zh_CN")
    assert messages.lang() == "zh"
    assert messages.text("aborted") == "用户中止"
    assert messages.text("aborted", "en") == "Aborted by user"


def test_succeeded_is_empty_as_in_the_original():
    assert messages.text("succeeded", "en") == messages.text("succeeded", "zh") == ""


def test_long_messages_are_clipped():
    out = messages.text("job_failed", "en", detail="x" * 10_000)
    assert len(out) == messages.MAX_MESSAGE and out.endswith("...")


def test_unknown_key_is_an_error():
    with pytest.raises(KeyError):
        messages.text("no_such_key")
