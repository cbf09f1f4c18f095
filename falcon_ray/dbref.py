"""Database references: how an actor finds the database without its password crossing Ray.

Contract
--------
Ray keeps every actor's creation arguments (in its control store, in Redis when the GCS
is fault tolerant, in the dashboard's listings) so that it can restart the actor. A
database password must therefore never be one of them. What the controller hands an
actor is a *reference*, resolved inside the actor's own process by ``resolve``:

- ``env:NAME``: the URL is the value of the environment variable ``NAME`` there (a
  local Ray started by the driver, whose workers inherit its environment);
- ``file:PATH``: the URL is the content of the file ``PATH`` there, surrounding
  whitespace stripped (on KubeRay, the ``falcon-db`` Secret mounted in every Ray
  container; in a demo or a test, a file of mode 0600 in a private directory);
- a URL that carries no password (SQLite, a passwordless local MariaDB user): itself.

``passable`` is the guard every actor creation goes through: it returns a reference
unchanged and raises ``SecretInArgument`` for a URL that carries a password, before
anything reaches Ray. ``for_local_actors`` turns any URL into a passable reference for
actors on this machine (the URL itself, or a private file). ``redacted`` is the URL for
messages and logs. Nothing here logs a URL.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError

ENV_PREFIX = "env:"
FILE_PREFIX = "file:"
DB_URL_ENV = "FALCON_DB_URL"
DB_URL_FILE_ENV = "FALCON_DB_URL_FILE"


class SecretInArgument(ValueError):
    """A URL with a password where only a reference may go (an actor argument)."""


class UnresolvedReference(RuntimeError):
    """A reference this process cannot resolve (variable unset, file unreadable or empty)."""


def carries_password(url: str) -> bool:
    """True when ``url`` parses as a database URL with a non-empty password."""
    try:
        return bool(make_url(url).password)
    except (ArgumentError, ValueError):
        return False


def is_reference(value: str) -> bool:
    return value.startswith((ENV_PREFIX, FILE_PREFIX))


def passable(ref: str) -> str:
    """``ref`` if it may be an actor's argument; ``SecretInArgument`` if it is a URL with a password."""
    if not is_reference(ref) and carries_password(ref):
        raise SecretInArgument(
            f"the database URL {redacted(ref)} carries a password and would be kept by Ray as an "
            f"actor argument; give the actors a reference instead: {ENV_PREFIX}NAME (a variable "
            f"set in the Ray workers' environment) or {FILE_PREFIX}PATH (a file they can read)"
        )
    return ref


def resolve(ref: str) -> str:
    """The URL a reference stands for, read in this process."""
    if ref.startswith(ENV_PREFIX):
        name = ref[len(ENV_PREFIX):]
        value = os.environ.get(name, "").strip()
        if not value:
            raise UnresolvedReference(
                f"database reference {ref}: the variable {name} is not set in this process "
                f"(pid {os.getpid()}); the Ray containers must have it (docs/deploy.md)"
            )
        return value
    if ref.startswith(FILE_PREFIX):
        path = ref[len(FILE_PREFIX):]
        try:
            value = Path(path).read_text().strip()
        except OSError as e:
            raise UnresolvedReference(f"database reference {ref}: cannot read the file ({e.strerror})") from None
        if not value:
            raise UnresolvedReference(f"database reference {ref}: the file is empty")
        return value
    return ref


UNPARSABLE = "<unparsable database URL>"


def redacted(url: str) -> str:
    """``url`` with its password, if any, replaced by ``***`` (references are returned as
    they are, a string that is no URL as ``UNPARSABLE``)."""
    if is_reference(url):
        return url
    try:
        return make_url(url).render_as_string(hide_password=True)
    except (ArgumentError, ValueError):
        return UNPARSABLE


def private_file(url: str, directory: str | None = None) -> str:
    """Write ``url`` to a new file of mode 0600 (in a new directory of mode 0700 unless
    ``directory`` is given); the ``file:`` reference to it."""
    where = directory or tempfile.mkdtemp(prefix="falcon-db-")
    fd, path = tempfile.mkstemp(prefix="db-url-", dir=where)
    try:
        os.fchmod(fd, 0o600)
        os.write(fd, url.encode())
    finally:
        os.close(fd)
    return FILE_PREFIX + path


def for_local_actors(url: str, directory: str | None = None) -> str:
    """A passable reference for actors that run on this machine: ``url`` itself when it
    carries no password, else a private file holding it."""
    if is_reference(url) or not carries_password(url):
        return url
    return private_file(url, directory)


def for_controller(url: str, *, from_env: bool, url_file: str | None = None) -> str:
    """The reference ``falcon-ray run`` gives its actors: ``file:`` the URL file when the URL
    came from one; the URL itself without a password; ``env:FALCON_DB_URL`` when it came
    from that variable (the Ray containers must then have it too). A password given on the
    command line is refused: ``ps`` shows it and Ray records a driver's command line."""
    if url_file:
        return FILE_PREFIX + str(Path(url_file).resolve())
    if not carries_password(url):
        return url
    if from_env:
        return ENV_PREFIX + DB_URL_ENV
    raise SecretInArgument(
        f"--db {redacted(url)} carries a password on the command line, where ps shows it and Ray "
        f"records it as the driver's entrypoint; set {DB_URL_ENV} or {DB_URL_FILE_ENV} instead"
    )
