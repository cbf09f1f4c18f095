"""`falcon-ray run | queues | health`: the product's commands that need Ray.

Contract
--------
``run`` is the controller: it waits for the leader lease, creates or adopts the
actors, serves /healthz, /readyz and the read API /v1 on the health port
(``falcon_ray.health``, ``falcon_ray.api``), and on SIGINT/SIGTERM lets every actor finish
its step before it stops. ``queues`` and ``health`` read a running controller (found
through ``falcon_ray.discovery``: flags, the environment, or a running demo's record).
``COMMANDS`` lists them; ``falcon_ray.cli`` attaches them to the main group. This module
imports ``falcon_ray.cli_shared``, never ``falcon_ray.cli``.
"""

from __future__ import annotations

import json
import signal
import sys
import threading

import click

from falcon_ray.cli_shared import InvalidInput, db_url_param, settings_or_exit


def _db_option(f):
    return click.option(
        "--db", "db_url", envvar="FALCON_DB_URL", default=None, callback=db_url_param,
        help="Database URL (default: FALCON_DB_URL, else the file FALCON_DB_URL_FILE names, else sqlite:///falcon.db).",
    )(f)


def _actor_db_ref(url: str) -> str:
    """What ``falcon-ray run`` gives its actors for the database (``falcon_ray.dbref``)."""
    import os

    from falcon_ray import dbref

    source = click.get_current_context().get_parameter_source("db_url")
    from_env = source == click.core.ParameterSource.ENVIRONMENT
    url_file = None if source == click.core.ParameterSource.COMMANDLINE or from_env else os.environ.get(dbref.DB_URL_FILE_ENV)
    try:
        return dbref.for_controller(url, from_env=from_env, url_file=url_file or None)
    except dbref.SecretInArgument as e:
        raise InvalidInput(str(e)) from None


def _db(url: str | None) -> str:
    from falcon_ray.store import DEFAULT_DB_URL

    return url or DEFAULT_DB_URL


@click.command("run")
@_db_option
@click.option("--ray-address", default=None, help="Ray cluster to join (default: start or join a local one).")
@click.option("--config", "config", type=click.Path(exists=True, dir_okay=False), default=None, help="Settings YAML.")
def run_cmd(db_url, ray_address, config):
    """Run the controller in the foreground until interrupted."""
    import logging

    import ray

    from actors.supervisor import Supervisor
    from falcon_ray import health
    settings = settings_or_exit(config)
    db_ref = _actor_db_ref(_db(db_url))  # before Ray: a refused URL starts nothing
    ray.init(
        address=ray_address,
        namespace=settings.namespace,
        logging_config=ray.LoggingConfig(encoding="JSON", log_level="INFO"),
    )
    logging.basicConfig(level=logging.INFO)
    sup = Supervisor(settings, _db(db_url), db_ref=db_ref)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    if settings.health_port:
        server = health.serve(sup, settings.health_port)
        click.echo(f"falcon-ray: /healthz, /readyz and the read API /v1 on port {server.server_address[1]}", err=True)
    click.echo(f"falcon-ray: controller {sup.holder} starting (namespace {settings.namespace})", err=True)
    sup.run(stop)
    click.echo("falcon-ray: stopping; letting in-flight steps finish", err=True)
    sup.shutdown(drain=True, kill=True)

@click.command("queues")
@click.option("--ray-address", default=None, help="Ray to join (default: FALCON_RAY_ADDRESS, a running demo's, else auto).")
@click.option("--namespace", default=None, help="Ray namespace (default: FALCON_NAMESPACE, a running demo's, else falcon).")
@_db_option
@click.option("--watch", "-w", is_flag=True, help="Redraw every --interval seconds until Ctrl-C.")
@click.option("--interval", default=1.0, show_default=True, type=click.FloatRange(min=0.1), help="Seconds between --watch frames.")
@click.option("--json", "as_json", is_flag=True, help="JSON (with --watch: one document per line per frame).")
def queues_cmd(ray_address, namespace, db_url, watch, interval, as_json):
    """Live state of every QueueActor of a running controller.

    Per queue: the slot holder and its phase, waiting tasks in pick order, running
    tasks (each with its time in phase) and the node pools with their state.
    """
    from falcon_ray import discovery, inspect

    where = discovery.resolve(ray_address, namespace, db_url)
    _join_ray(where)
    ns = where["namespace"]
    if not watch:
        snaps = inspect.queues(ns)
        if as_json:
            click.echo(json.dumps(snaps, indent=2, default=str))
        else:
            click.echo(_queues_text(snaps, _phase_source(where)))
        return
    _watch(ns, interval, as_json, _phase_source(where))

@click.command("health")
@_db_option
@click.option("--ray-address", default=None, help="Ray to join (default: FALCON_RAY_ADDRESS, a running demo's, else auto).")
@click.option("--namespace", default=None, help="Ray namespace (default: the config's, FALCON_NAMESPACE, a running demo's, else falcon).")
@click.option("--config", type=click.Path(exists=True, dir_okay=False), default=None)
@click.option("--json", "as_json", is_flag=True)
def health_cmd(db_url, ray_address, namespace, config, as_json):
    """Report the controller's health; exit 0 healthy, 1 unhealthy."""
    from actors.supervisor import Supervisor
    from falcon_ray import discovery, health
    settings = settings_or_exit(config)
    where = discovery.resolve(ray_address, namespace or (settings.namespace if config else None), db_url)
    settings = settings.model_copy(update={"namespace": where["namespace"]})
    _join_ray(where)
    sup = Supervisor(settings, where["db_url"])
    try:
        lease = sup.store.leader()
    except Exception:  # the database is unreachable: the report says so
        lease = None
    sup.holder = lease["holder"] if lease else sup.holder
    sup.leader = bool(lease)
    report = health.check(sup)
    report["namespace"] = where["namespace"]
    if as_json:
        click.echo(json.dumps(report, indent=2, default=str))
    else:
        click.echo(f"healthy: {report['healthy']}  ready: {report['ready']}  leader: {report['leader']['holder']}  (namespace {where['namespace']})")
        db = report["database"]
        click.echo(f"database: {'ok' if db['ok'] else 'UNREACHABLE: ' + str(db.get('error'))}")
        for name, a in sorted(report["actors"].items()):
            click.echo(f"  {name:<32} {'ok' if a.get('ok') else 'FAIL'}  {a.get('error') or a.get('connect_error') or ''}")
        for t in report["overdue_tasks"]:
            phase = f"{t['status']}/{t['reason']}" if t["reason"] else t["status"]
            click.echo(
                f"  overdue: task {t['id']} {phase} ({t['wait']}) since {t['since']}: {t['age_s']:g}s,"
                f" limit {t['limit_s']:g}s ({t['action']}): {t['message']}"
            )
    sys.exit(0 if report["healthy"] else 1)


# the commands falcon_ray.cli attaches to its main group
COMMANDS = (run_cmd, queues_cmd, health_cmd)


# ---- helpers of the commands above -------------------------------------------------------------


def _join_ray(where: dict) -> None:
    """Attach this process to the controller's Ray as a second driver (one line on error)."""
    import ray

    if ray.is_initialized():
        return
    from falcon_ray import discovery

    discovery.prepare_ray_auth(where.get("record"))
    try:
        ray.init(address=where["address"], namespace=where["namespace"], log_to_driver=False, configure_logging=False)
    except (ConnectionError, RuntimeError) as e:
        hint = "" if where.get("record") else " (no running falcon-ray demo found; pass --ray-address or set FALCON_RAY_ADDRESS)"
        raise click.ClickException(f"cannot reach Ray at {where['address']}: {str(e).splitlines()[0][:200]}{hint}") from None


def _phase_source(where: dict):
    """A callable snaps -> {task id: seconds in phase}: from the event log when the
    controller's database is at hand, else from what this watcher has seen."""
    from falcon_ray.clock import SYSTEM  # a command's console: the machine's clock
    from falcon_ray.queues_view import PhaseClock

    clock = PhaseClock()
    store = None
    if where.get("record") is not None or where["db_url"] != _db(None):
        try:
            from falcon_ray.store import Store

            store = Store(where["db_url"])
            store.ping()
        except Exception:
            store = None

    def source(snaps: list) -> dict:
        nonlocal store
        if store is not None:
            try:
                now = store.clock()
                out = {}
                for q in snaps:
                    for key in ("acquiring", "waiting", "running", "aborting"):
                        for t in q.get(key) or []:
                            events = store.events(t["id"])
                            if events:
                                out[t["id"]] = (now - events[-1].at).total_seconds()
                return out
            except Exception:
                store = None  # fall back to the watcher's own clock
        return clock.observe(snaps, SYSTEM.monotonic())

    return source


def _queues_text(snaps: list, phase_source) -> str:
    from falcon_ray.queues_view import render

    return render(snaps, phase_source(snaps))


def _watch(namespace: str, interval: float, as_json: bool, phase_source) -> None:
    """Redraw until Ctrl-C (exit 0); on a terminal in place, else one frame per interval."""
    import datetime as dt
    import os

    from falcon_ray import inspect
    from falcon_ray.clock import SYSTEM  # a command's console: the machine's clock
    from falcon_ray.queues_view import frame

    tty = sys.stdout.isatty()
    n = 0
    try:
        while True:
            n += 1
            t0 = SYSTEM.monotonic()
            snaps = inspect.queues(namespace, timeout=max(2.0, interval * 3))
            at = SYSTEM.now().replace(tzinfo=dt.UTC)
            if as_json:
                text = json.dumps({"frame": n, "at": at.isoformat(timespec="milliseconds"), "namespace": namespace, "queues": snaps}, default=str)
            else:
                text = frame(snaps, phase_source(snaps), namespace, at, interval, n)
                if tty:
                    text = "\x1b[H\x1b[2J" + text  # home + clear: redraw in place, like top
                elif n > 1:
                    text = "\n" + "=" * 78 + "\n" + text
            sys.stdout.write(text + "\n")
            sys.stdout.flush()
            SYSTEM.sleep(max(0.0, interval - (SYSTEM.monotonic() - t0)))
    except KeyboardInterrupt:
        if tty and not as_json:
            sys.stdout.write("\n")
        sys.stdout.flush()
    except BrokenPipeError:  # `falcon-ray queues --watch | head`
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
