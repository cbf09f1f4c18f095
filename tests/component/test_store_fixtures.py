"""The db fixtures: an unreachable MySQL server is skipped locally and fails under CI=true."""

from __future__ import annotations

import pytest

from tests.harness import db as fixtures_db

DEAD = "mysql+pymysql://root@127.0.0.1:1"


@pytest.fixture
def dead_server(monkeypatch):
    monkeypatch.setattr(fixtures_db, "MYSQL_SERVER_URL", DEAD)
    monkeypatch.setattr(fixtures_db, "_reachable", {})


def test_unreachable_server_skips_locally(dead_server, monkeypatch):
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match="unreachable"):
        with fixtures_db.fresh_mysql_database():
            pass


@pytest.mark.parametrize("value", ["true", "TRUE", " true "])
def test_unreachable_server_fails_in_ci(dead_server, monkeypatch, value):
    monkeypatch.setenv("CI", value)
    with pytest.raises(pytest.fail.Exception, match="CI=true"):
        with fixtures_db.fresh_mysql_database():
            pass


def test_db_url_is_a_tmp_sqlite_file_or_a_marked_fresh_mysql_database(db_url, tmp_path, request):
    marked = request.node.get_closest_marker("mysql") is not None
    if db_url.startswith("sqlite"):
        assert db_url == f"sqlite:///{tmp_path / 'falcon.db'}" and not marked
    else:
        assert "/falcon_test_" in db_url and marked


def test_store_fixture_has_every_table(store):
    from falcon_ray.store import migrate

    assert migrate.missing_tables(store.url) == []
    assert store.ping()
