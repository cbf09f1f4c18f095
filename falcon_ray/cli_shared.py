"""What every `falcon-ray` command module shares: the errors and their exit codes, the
``--db`` and ``--json`` options, a Store on a checked database, and the table and JSON output.

Errors are one line on stderr and a non-zero exit: ``CliError`` (1) for a refused operation
or a database problem, ``InvalidInput`` (2) for input that can never succeed, like click's
usage errors. A command module imports this one and never ``falcon_ray.cli``, which imports
the command modules (so there is no import cycle).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import click
import sqlalchemy as sa

from falcon_ray import dbref
from falcon_ray.config import Settings, SettingsError, load_settings
from falcon_ray.store import DEFAULT_DB_URL, Store, migrate


class CliError(click.ClickException):
    """A refused operation or an unusable database: one line, exit code 1."""


class InvalidInput(click.ClickException):
    """Input that can never succeed (e.g. an invalid spec): exit code 2, like a usage error."""

    exit_code = 2


def db_url_param(ctx: click.Context | None, param: click.Parameter | None, value: str | None) -> str | None:
    """Click callback: a database URL SQLAlchemy can parse and has a driver for (else exit 2).

    When ``--db`` was not given and ``FALCON_DB_URL`` is unset, the URL is read from the file
    ``FALCON_DB_URL_FILE`` names (a mounted Secret), so a password need not be on a command
    line nor in an environment."""
    source = ctx.get_parameter_source(param.name) if ctx is not None and param is not None and param.name else None
    if source in (None, click.core.ParameterSource.DEFAULT, click.core.ParameterSource.DEFAULT_MAP):
        from falcon_ray.discovery import db_url_from_environment

        try:
            value = db_url_from_environment() or value
        except dbref.UnresolvedReference as e:
            raise click.BadParameter(str(e)) from None
    if value is None:
        return None
    try:
        sa.engine.make_url(value).get_dialect().import_dbapi()
    except sa.exc.ArgumentError:
        raise click.BadParameter(f"not a database URL: {value[:200]!r}") from None
    except (ImportError, sa.exc.NoSuchModuleError) as e:
        raise click.BadParameter(f"no database driver for {safe_url(value)[:200]!r}: {first_line(e)}") from None
    return value


def db_option(f: Callable) -> Callable:
    return click.option(
        "--db",
        "db_url",
        envvar="FALCON_DB_URL",
        default=DEFAULT_DB_URL,
        show_default=True,
        show_envvar=True,
        metavar="URL",
        callback=db_url_param,
        help="SQLAlchemy database URL, e.g. mysql+pymysql://user@host:3306/falcon "
        "(else the file FALCON_DB_URL_FILE names).",
    )(f)


def json_option(f: Callable) -> Callable:
    return click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")(f)


def safe_url(db_url: str) -> str:
    """The URL with any password hidden, for messages (one that does not parse, as given)."""
    text = dbref.redacted(db_url)
    return db_url if text == dbref.UNPARSABLE else text


def first_line(e: BaseException) -> str:
    orig = getattr(e, "orig", None)
    text = str(orig if orig is not None else e).strip()
    return (text.splitlines() or [type(e).__name__])[0][:300]


def check_database(db_url: str, need_jobs: bool = True) -> None:
    """Raise CliError unless the database exists and holds the tables the caller needs."""
    try:
        url = sa.engine.make_url(db_url)
    except sa.exc.ArgumentError as e:
        raise InvalidInput(f"not a database URL: {db_url!r} ({e})") from None
    if url.get_backend_name() == "sqlite" and url.database not in (None, "", ":memory:"):
        if not Path(url.database).exists():
            raise CliError(f"database file {url.database} does not exist; run `falcon-ray db upgrade` first")
    missing = migrate.missing_tables(db_url, with_jobs_table=need_jobs)
    falcon_missing = [name for name in missing if name != "jobs"]
    if falcon_missing:
        raise CliError(
            f"database {safe_url(db_url)} is not migrated (missing: {', '.join(falcon_missing)}); "
            "run `falcon-ray db upgrade` first"
        )
    if missing:
        raise CliError(
            f"database {safe_url(db_url)} has no jobs table; the upper layer creates it, "
            "or run `falcon-ray db upgrade --with-jobs-table`"
        )


@contextlib.contextmanager
def open_store(db_url: str, need_jobs: bool = True) -> Iterator[Store]:
    """A Store on a checked database, disposed afterwards."""
    check_database(db_url, need_jobs=need_jobs)
    store = Store(db_url)
    try:
        yield store
    finally:
        store.dispose()


def _json_default(value: Any) -> Any:
    if isinstance(value, dt.datetime):
        return value.isoformat(timespec="milliseconds") + ("Z" if value.tzinfo is None else "")
    if isinstance(value, set | frozenset | tuple):
        return list(value)
    return str(value)


def echo_json(value: Any) -> None:
    click.echo(json.dumps(value, default=_json_default, indent=2, ensure_ascii=False))


def _cell(value: Any, width: int | None = None) -> str:
    if value is None or value == "":
        return "-"
    if isinstance(value, dt.datetime):
        text = value.strftime("%Y-%m-%d %H:%M:%S")
    else:
        text = " ".join(str(value).split())  # one line per row
    if width is not None and len(text) > width:
        text = text[: width - 3] + "..."
    return text


def render_table(rows: Sequence[dict[str, Any]], columns: Sequence[tuple[str, str]], widths: dict | None = None) -> str:
    """A plain aligned table; ``columns`` are (key, header) pairs."""
    widths = widths or {}
    cells = [[_cell(row.get(key), widths.get(key)) for key, _ in columns] for row in rows]
    heads = [head for _, head in columns]
    size = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(heads)]
    lines = ["  ".join(h.ljust(size[i]) for i, h in enumerate(heads)).rstrip()]
    lines += ["  ".join(c.ljust(size[i]) for i, c in enumerate(r)).rstrip() for r in cells]
    return "\n".join(lines)


def human_duration(seconds: float) -> str:
    seconds = max(0.0, seconds)
    if seconds < 60:
        return f"{seconds:.1f}s"
    s = int(round(seconds))
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


def settings_or_exit(config_path: str | None) -> Settings:
    """Settings from --config, checked before anything starts (bad file: exit 2, one line)."""
    try:
        return load_settings(config_path)
    except SettingsError as e:
        raise InvalidInput(str(e)) from None
