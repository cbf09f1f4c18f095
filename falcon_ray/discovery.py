"""Where a running ``falcon-ray demo`` is: the discovery record, and flag-free defaults.

Contract
--------
``falcon-ray demo`` writes one small JSON record when its controller is up and removes
it when it stops: its pid, Ray address (GCS), namespace, dashboard URL, metrics
endpoint, database URL and the read API's base URL (``api``: /v1 and /openapi.json
are under it). ``falcon-ray queues``, ``falcon-ray health``, the
notebooks (through ``falcon_ray.inspect``) and ``docs/queues_chart.py`` read it to find
the demo with no flags. It is only a default: an explicit flag or environment
variable always wins, and without a live record everything falls back to the
production defaults (Ray ``address="auto"``, namespace ``falcon``,
``sqlite:///falcon.db``), so nothing changes for a controller on KubeRay.

Where: one file per demo namespace, ``demo-<namespace>.json``, in the per-user
directory ``$FALCON_RUNTIME_DIR``, else ``$XDG_RUNTIME_DIR/falcon-ray``, else
``<tempdir>/falcon-ray-<uid>`` (``tempfile.gettempdir()``, so ``$TMPDIR`` is honoured).
The directory is created with mode 0700 and a record with 0600 (it names the database).
A record whose pid is no longer alive (a demo killed with SIGKILL) is ignored and
removed by the next reader.

Why the Ray address is in the record: ``address="auto"`` picks *any* Ray on the machine
when several run (other demos, test sessions), so a reader that has a record joins
exactly the demo's Ray.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

from falcon_ray import dbref
from falcon_ray.clock import SYSTEM

DEFAULT_NAMESPACE = "falcon"
RECORD_PREFIX = "demo-"


def runtime_dir() -> Path:
    explicit = os.environ.get("FALCON_RUNTIME_DIR")
    if explicit:
        return Path(explicit)
    xdg = os.environ.get("XDG_RUNTIME_DIR")
    if xdg and os.path.isdir(xdg) and os.access(xdg, os.W_OK):
        return Path(xdg) / "falcon-ray"
    uid = os.getuid() if hasattr(os, "getuid") else os.environ.get("USERNAME", "user")
    return Path(tempfile.gettempdir()) / f"falcon-ray-{uid}"


def record_path(namespace: str) -> Path:
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in namespace)
    return runtime_dir() / f"{RECORD_PREFIX}{safe}.json"


def _alive(pid: Any) -> bool:
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process with that pid: not ours
        return False
    return True


def write(record: dict[str, Any]) -> Path:
    """Write (atomically) the record of this process's demo; returns its path."""
    d = runtime_dir()
    d.mkdir(mode=0o700, parents=True, exist_ok=True)
    path = record_path(record["namespace"])
    data = {"pid": os.getpid(), "started_at": SYSTEM.time(), **record}
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(data, f, indent=2)
        f.write("\n")
    os.replace(tmp, path)
    return path


def remove(namespace: str) -> None:
    """Remove this process's record (never another live demo's)."""
    path = record_path(namespace)
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return
    if data.get("pid") == os.getpid() or not _alive(data.get("pid")):
        try:
            path.unlink()
        except OSError:
            pass


def records() -> list[dict[str, Any]]:
    """Every live demo's record, newest first (stale ones are removed)."""
    d = runtime_dir()
    out = []
    try:
        paths = sorted(d.glob(f"{RECORD_PREFIX}*.json"))
    except OSError:
        return []
    for path in paths:
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if not isinstance(data, dict) or not data.get("namespace"):
            continue
        if not _alive(data.get("pid")):
            try:
                path.unlink()
            except OSError:
                pass
            continue
        data["record_path"] = str(path)
        out.append(data)
    return sorted(out, key=lambda r: -float(r.get("started_at") or 0))


def find(namespace: str | None = None) -> dict[str, Any] | None:
    """The live demo in ``namespace``; without one, the demo in ``falcon``, else the newest."""
    found = records()
    if namespace:
        return next((r for r in found if r["namespace"] == namespace), None)
    return next((r for r in found if r["namespace"] == DEFAULT_NAMESPACE), found[0] if found else None)


def prepare_ray_auth(record: dict[str, Any] | None) -> None:
    """Before joining a demo's Ray as a second driver: a local Ray 2.60 enables token
    authentication, and a driver joins only with ``RAY_AUTH_MODE=token`` (the token itself
    is read from ``~/.ray/auth_token``, never from the record). An explicit
    ``RAY_AUTH_MODE`` is left alone."""
    if not record or record.get("ray_auth_mode") != "token" or os.environ.get("RAY_AUTH_MODE"):
        return
    os.environ["RAY_AUTH_MODE"] = "token"
    try:  # Ray caches its config when it is imported: make this process see the mode now
        from ray._raylet import Config

        Config.initialize("")
    except Exception:
        pass


def db_url_from_environment() -> str | None:
    """``FALCON_DB_URL``, else the content of the file ``FALCON_DB_URL_FILE`` names, else None."""
    url = os.environ.get(dbref.DB_URL_ENV, "").strip()
    if url:
        return url
    path = os.environ.get(dbref.DB_URL_FILE_ENV, "").strip()
    return dbref.resolve(dbref.FILE_PREFIX + path) if path else None


def resolve(
    address: str | None = None,
    namespace: str | None = None,
    db_url: str | None = None,
) -> dict[str, Any]:
    """Ray address, namespace and database URL to use: explicit values, else the
    environment (``FALCON_RAY_ADDRESS``/``RAY_ADDRESS``, ``FALCON_NAMESPACE``,
    ``FALCON_DB_URL``, ``FALCON_DB_URL_FILE``), else a live demo's record, else the production defaults. An
    address of ``auto`` counts as unset (a record names the demo's Ray exactly; ``auto``
    picks any Ray on the machine).
    ``record`` is the record used (or None)."""
    address = address or os.environ.get("FALCON_RAY_ADDRESS") or os.environ.get("RAY_ADDRESS") or None
    if address == "auto":  # "find it": a demo's record is the exact answer when there is one
        address = None
    namespace = namespace or os.environ.get("FALCON_NAMESPACE") or None
    db_url = db_url or db_url_from_environment()
    rec = None
    if address is None or namespace is None or db_url is None:
        rec = find(namespace)
        # a record of a demo in another Ray than the one asked for does not apply
        if rec is not None and address is not None and address != rec.get("ray_address"):
            rec = None
    if rec is not None:
        address = address or rec.get("ray_address")
        namespace = namespace or rec.get("namespace")
        # a demo whose URL carries a password records a file: reference to it
        db_url = db_url or (dbref.resolve(rec["db_url"]) if rec.get("db_url") else None)
    from falcon_ray.store import DEFAULT_DB_URL

    return {
        "address": address or "auto",
        "namespace": namespace or DEFAULT_NAMESPACE,
        "db_url": db_url or DEFAULT_DB_URL,
        "record": rec,
    }
