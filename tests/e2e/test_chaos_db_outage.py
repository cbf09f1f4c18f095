"""The soak's database outage, on MariaDB: the controller reaches the database through the
soak's loopback proxy, which cuts every connection and refuses new ones for a few seconds
mid-play; the upper layer (submits, aborts, the soak's own reads) keeps its direct
connection. Every invariant must still hold and the outage must have happened."""

from __future__ import annotations

import json

import pytest

from falcon_ray.devtools.chaos import ChaosRun
from tests.harness.db import fresh_mysql_database

pytestmark = [pytest.mark.mysql, pytest.mark.timeout(300)]


def test_a_database_outage_mid_play_loses_nothing(ray_session):
    with fresh_mysql_database() as url:
        soak = ChaosRun(tasks=16, minutes=0.4, seed=3, db_url=url, scale=0.3, drain_s=90, kills=False, db_outage_s=6)
        report = soak.run_soak()
    assert report["faults_injected"].get("db_outages") == 1 and report["faults_injected"].get("db_outage_s") == 6
    assert report["tasks"] == 16
    assert report["ok"], json.dumps({"invariants": report["invariants"], "details": report.get("details")}, default=str)[:4000]
