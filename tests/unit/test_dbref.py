"""Database references: a password never becomes an actor argument (falcon_ray.dbref)."""

from __future__ import annotations

import os
import stat

import pytest

from actors import remote
from falcon_ray import dbref
from falcon_ray.config import Settings

SECRET_URL = "mysql+pymysql://falcon:s3cr%40t@db.internal:3306/falcon"


def test_a_url_with_a_password_is_refused_before_ray_sees_it():
    with pytest.raises(dbref.SecretInArgument) as e:
        dbref.passable(SECRET_URL)
    assert "s3cr" not in str(e.value) and "***" in str(e.value)
    # the shells' creation functions check before .remote(): no Ray call is made at all
    for make in (
        lambda: remote.ensure_poller(Settings(), SECRET_URL),
        lambda: remote.ensure_cluster("edge-a", Settings(), SECRET_URL),
        lambda: remote.ensure_queue("edge-a", "2x2", Settings(), SECRET_URL),
    ):
        with pytest.raises(dbref.SecretInArgument):
            make()


@pytest.mark.parametrize("ref", ["sqlite:///x.db", "sqlite://", "mysql+pymysql://root@127.0.0.1:3306/test", "env:FALCON_DB_URL", "file:/run/secrets/db"])
def test_references_and_passwordless_urls_pass(ref):
    assert dbref.passable(ref) == ref


def test_env_and_file_references_resolve_in_the_reading_process(tmp_path, monkeypatch):
    monkeypatch.setenv("FALCON_TEST_DB_REF", SECRET_URL + "\n")
    assert dbref.resolve("env:FALCON_TEST_DB_REF") == SECRET_URL
    ref = dbref.private_file(SECRET_URL, str(tmp_path))
    path = ref.removeprefix("file:")
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert dbref.resolve(ref) == SECRET_URL
    fresh = dbref.private_file(SECRET_URL).removeprefix("file:")
    assert stat.S_IMODE(os.stat(os.path.dirname(fresh)).st_mode) == 0o700


def test_an_unresolvable_reference_says_what_is_missing(tmp_path, monkeypatch):
    monkeypatch.delenv("FALCON_TEST_DB_MISSING", raising=False)
    with pytest.raises(dbref.UnresolvedReference, match="FALCON_TEST_DB_MISSING is not set"):
        dbref.resolve("env:FALCON_TEST_DB_MISSING")
    with pytest.raises(dbref.UnresolvedReference, match="cannot read"):
        dbref.resolve(f"file:{tmp_path}/absent")
    (tmp_path / "empty").write_text("\n")
    with pytest.raises(dbref.UnresolvedReference, match="empty"):
        dbref.resolve(f"file:{tmp_path}/empty")


def test_local_actors_get_the_url_or_a_private_file(tmp_path):
    assert dbref.for_local_actors("sqlite:///a.db") == "sqlite:///a.db"
    ref = dbref.for_local_actors(SECRET_URL, str(tmp_path))
    assert ref.startswith("file:") and "s3cr" not in ref and dbref.resolve(ref) == SECRET_URL


def test_the_controller_reference_follows_where_the_url_came_from(tmp_path):
    assert dbref.for_controller("sqlite:///a.db", from_env=False) == "sqlite:///a.db"
    assert dbref.for_controller(SECRET_URL, from_env=True) == "env:FALCON_DB_URL"
    f = tmp_path / "url"
    f.write_text(SECRET_URL)
    assert dbref.for_controller(SECRET_URL, from_env=False, url_file=str(f)) == f"file:{f}"
    with pytest.raises(dbref.SecretInArgument, match="command line"):
        dbref.for_controller(SECRET_URL, from_env=False)


def test_redacted_hides_the_password_only():
    assert dbref.redacted(SECRET_URL) == "mysql+pymysql://falcon:***@db.internal:3306/falcon"
    assert dbref.redacted("env:X") == "env:X"


def test_run_refuses_a_password_on_its_command_line_before_starting_ray(monkeypatch):
    from click.testing import CliRunner

    from falcon_ray.cli import main

    monkeypatch.delenv("FALCON_DB_URL", raising=False)
    r = CliRunner().invoke(main, ["run", "--db", SECRET_URL])
    assert r.exit_code == 2, r.output
    assert "FALCON_DB_URL" in r.output and "s3cr" not in r.output


def test_commands_read_the_url_from_the_file_falcon_db_url_file_names(tmp_path, monkeypatch):
    from click.testing import CliRunner

    from falcon_ray.cli import main
    from falcon_ray.store.migrate import upgrade

    db = f"sqlite:///{tmp_path}/f.db"
    upgrade(db, with_jobs_table=True)
    (tmp_path / "url").write_text(db + "\n")
    monkeypatch.delenv("FALCON_DB_URL", raising=False)
    monkeypatch.setenv("FALCON_DB_URL_FILE", str(tmp_path / "url"))
    r = CliRunner().invoke(main, ["clusters", "list", "--json"])
    assert r.exit_code == 0, r.output
    monkeypatch.setenv("FALCON_DB_URL_FILE", str(tmp_path / "absent"))
    r = CliRunner().invoke(main, ["clusters", "list", "--json"])
    assert r.exit_code == 2 and "cannot read" in r.output, r.output
