"""`falcon-ray run | demo | queues | health`: the commands that need Ray.

Contract
--------
``run`` is the controller: it waits for the leader lease, creates or adopts the
actors, serves /healthz and /readyz, and on SIGINT/SIGTERM lets every actor finish
its step before it stops. ``demo`` is the embedded default (simulated fleet, SQLite,
local Ray) and exits when every task is terminal and no Falcon pool is left.
``queues`` and ``health`` read a running controller.
"""

from __future__ import annotations

import json
import signal
import sys
import threading

import click


def _db_option(f):
    return click.option(
        "--db", "db_url", envvar="FALCON_DB_URL", default=None, help="Database URL (default: FALCON_DB_URL or sqlite:///falcon.db)."
    )(f)


def _db(url: str | None) -> str:
    from falcon_ray.store import DEFAULT_DB_URL

    return url or DEFAULT_DB_URL


def register(main: click.Group) -> None:
    """Attach the controller commands to the main CLI group."""

    @main.command("run")
    @_db_option
    @click.option("--ray-address", default=None, help="Ray cluster to join (default: start or join a local one).")
    @click.option("--config", "config", type=click.Path(exists=True, dir_okay=False), default=None, help="Settings YAML.")
    def run_cmd(db_url, ray_address, config):
        """Run the controller in the foreground until interrupted."""
        import logging

        import ray

        from actors.supervisor import Supervisor
        from falcon_ray import health
        from falcon_ray.config import load_settings

        settings = load_settings(config)
        ray.init(
            address=ray_address,
            namespace=settings.namespace,
            logging_config=ray.LoggingConfig(encoding="JSON", log_level="INFO"),
        )
        logging.basicConfig(level=logging.INFO)
        sup = Supervisor(settings, _db(db_url))
        stop = threading.Event()
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: stop.set())
        if settings.health_port:
            health.serve(sup, settings.health_port)
        click.echo(f"falcon-ray: controller {sup.holder} starting (namespace {settings.namespace})", err=True)
        sup.run(stop)
        click.echo("falcon-ray: stopping; letting in-flight steps finish", err=True)
        sup.shutdown(drain=True, kill=True)

    @main.command("demo")
    @click.option("--fleet", type=click.Path(exists=True, dir_okay=False), default=None, help="Fleet YAML (default: built-in).")
    @click.option("--tasks", "tasks_path", type=click.Path(exists=True, dir_okay=False), default=None, help="Tasks JSONL.")
    @click.option("--config", type=click.Path(exists=True, dir_okay=False), default=None, help="Settings YAML.")
    @click.option("--db", "db_url", default=None, help="Database URL (default: a fresh SQLite file).")
    @click.option("--timeout", default=300.0, show_default=True, help="Give up after this many seconds.")
    @click.option("--json", "as_json", is_flag=True, help="Print one JSON document (tasks and fleet) on stdout.")
    def demo_cmd(fleet, tasks_path, config, db_url, timeout, as_json):
        """Run Falcon-Ray end to end on a simulated fleet and play a tasks file."""
        import time

        from falcon_ray.demo import DemoRun, demo_settings, load_tasks, progress_printer, summarize

        try:
            tasks = load_tasks(tasks_path)
            settings = demo_settings(config)
        except Exception as e:
            raise click.ClickException(str(e)) from None
        started = time.monotonic()
        run = DemoRun(fleet, settings, db_url)
        try:
            click.echo("falcon-ray demo: starting the simulated fleet, the database and Ray...", err=True)
            run.start()
            click.echo(f"falcon-ray demo: controller up after {time.monotonic() - started:.1f}s; playing {len(tasks)} task(s)", err=True)
            tick = progress_printer(run, sys.stderr)
            run.play(tasks, on_tick=tick, timeout=timeout)
            left = max(1.0, timeout - (time.monotonic() - started))
            done = run.wait_done(left, on_tick=tick)
            report = run.report()
        finally:
            run.stop()
        report["done"] = done
        report["wall_seconds"] = round(time.monotonic() - started, 1)
        if as_json:
            click.echo(json.dumps(report, indent=2, default=str))
        else:
            click.echo(summarize(report))
            click.echo(f"\nfinished in {report['wall_seconds']}s; {'every task terminal, no Falcon pool left' if done else 'TIMED OUT'}")
        if not done:
            sys.exit(1)

    @main.command("queues")
    @click.option("--ray-address", default="auto", show_default=True)
    @click.option("--namespace", default="falcon", show_default=True)
    @click.option("--json", "as_json", is_flag=True)
    def queues_cmd(ray_address, namespace, as_json):
        """Live state of every QueueActor of a running controller."""
        from falcon_ray import inspect

        inspect.connect(ray_address, namespace)
        snaps = inspect.queues(namespace)
        if as_json:
            click.echo(json.dumps(snaps, indent=2, default=str))
            return
        if not snaps:
            click.echo("no queues")
        for q in snaps:
            if "error" in q:
                click.echo(f"{q['actor']}: {q['error']}")
                continue
            click.echo(f"{q['queue']}  (last granted: {q['last_granted'] or '-'})")
            for t in q["acquiring"]:
                click.echo(f"  slot     #{t['id']:<5} {t['actor']}: {t['name']}  {t['reason']}  {t['message']}")
            for t in q["waiting"]:
                click.echo(f"  wait {t['position']:>3} #{t['id']:<5} {t['actor']}: {t['name']}  {t['waiting_s']}s")
            for t in q["running"]:
                click.echo(f"  running  #{t['id']:<5} {t['actor']}: {t['name']}  pool {t['node_pool']}")
            for l in q["leases"]:
                click.echo(f"  pool     {l['name']:<22} {l['state']:<9} task {l['task_id'] or '-'}  {l['supply_mode']}  {l['pool_status'] or '-'}")

    @main.command("health")
    @_db_option
    @click.option("--ray-address", default="auto", show_default=True)
    @click.option("--config", type=click.Path(exists=True, dir_okay=False), default=None)
    @click.option("--json", "as_json", is_flag=True)
    def health_cmd(db_url, ray_address, config, as_json):
        """Report the controller's health; exit 0 healthy, 1 unhealthy."""
        import ray

        from actors.supervisor import Supervisor
        from falcon_ray import health
        from falcon_ray.config import load_settings

        settings = load_settings(config)
        ray.init(address=ray_address, namespace=settings.namespace, log_to_driver=False)
        sup = Supervisor(settings, _db(db_url))
        lease = sup.store.leader()
        sup.holder = lease["holder"] if lease else sup.holder
        sup.leader = bool(lease)
        report = health.check(sup)
        if as_json:
            click.echo(json.dumps(report, indent=2, default=str))
        else:
            click.echo(f"healthy: {report['healthy']}  ready: {report['ready']}  leader: {report['leader']['holder']}")
            click.echo(f"database: {'ok' if report['database']['ok'] else report['database'].get('error')}")
            for name, a in sorted(report["actors"].items()):
                click.echo(f"  {name:<32} {'ok' if a.get('ok') else 'FAIL'}  {a.get('error') or a.get('connect_error') or ''}")
            for t in report["stuck_tasks"]:
                click.echo(f"  stuck: task {t['id']} {t['status']}/{t['reason']} unchanged {t['unchanged_s']}s: {t['message']}")
        sys.exit(0 if report["healthy"] else 1)
