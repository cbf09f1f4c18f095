"""`falcon-ray run | demo | bench | queues | health`: the commands that need Ray.

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
    from falcon_ray.cli import db_url_param

    return click.option(
        "--db", "db_url", envvar="FALCON_DB_URL", default=None, callback=db_url_param,
        help="Database URL (default: FALCON_DB_URL, else the file FALCON_DB_URL_FILE names, else sqlite:///falcon.db).",
    )(f)


def _db_url_param(ctx, param, value):
    from falcon_ray.cli import db_url_param

    return db_url_param(ctx, param, value)


def _settings(config):
    """Settings from --config, checked before anything starts (bad file: exit 2, one line)."""
    from falcon_ray.cli import InvalidInput
    from falcon_ray.config import SettingsError, load_settings

    try:
        return load_settings(config)
    except SettingsError as e:
        raise InvalidInput(str(e)) from None


def _actor_db_ref(url: str) -> str:
    """What ``falcon-ray run`` gives its actors for the database (``falcon_ray.dbref``)."""
    import os

    from falcon_ray import dbref
    from falcon_ray.cli import InvalidInput

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
        settings = _settings(config)
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
            health.serve(sup, settings.health_port)
        click.echo(f"falcon-ray: controller {sup.holder} starting (namespace {settings.namespace})", err=True)
        sup.run(stop)
        click.echo("falcon-ray: stopping; letting in-flight steps finish", err=True)
        sup.shutdown(drain=True, kill=True)

    @main.command("bench")
    @click.option(
        "--db", "db_url", envvar="FALCON_BENCH_DB", default=None,
        help="SQLite (default) or a MySQL server URL: fresh databases are created there and dropped "
        "(FALCON_BENCH_DB, never FALCON_DB_URL: the bench drops what it creates).",
    )
    @click.option("--quick", is_flag=True, help="100/1,000 tasks instead of up to 10,000 (under two minutes).")
    @click.option("--json", "as_json", is_flag=True, help="Print only the JSON document.")
    @click.option("--part", "parts", multiple=True, type=click.Choice(["intake", "handover", "idle", "scale", "e2e", "lifecycle-mixed"]), help="Run only these parts (repeatable).")
    @click.option("--out", "out", type=click.Path(dir_okay=False), default=None, help="Also write the JSON document to this file.")
    def bench_cmd(db_url, quick, as_json, parts, out):
        """Measure the controller's costs (issue 11): statements per task, idle, hand-over, intake, scale."""
        import logging

        from falcon_ray.devtools import bench

        logging.getLogger("falcon").setLevel(logging.WARNING)
        doc = bench.run_bench(db_url, quick=quick, parts=tuple(parts))
        text = json.dumps(doc, indent=2, sort_keys=True, default=str)
        if out:
            with open(out, "w") as f:
                f.write(text + "\n")
        if as_json:
            click.echo(text)
        else:
            click.echo(text)
            click.echo(bench.render(doc))

    @main.command("demo")
    @click.option("--fleet", type=click.Path(exists=True, dir_okay=False), default=None, help="Fleet YAML (default: built-in).")
    @click.option(
        "--tasks",
        "tasks_path",
        type=click.Path(exists=True, dir_okay=False, allow_dash=True),
        default=None,
        help="Tasks JSONL (default: the sample tasks); '-' reads one JSON line per task from stdin as they come.",
    )
    @click.option("--config", type=click.Path(exists=True, dir_okay=False), default=None, help="Settings YAML.")
    @click.option(
        "--db", "db_url", envvar="FALCON_DB_URL", default=None, callback=_db_url_param,
        help="Database URL (default: FALCON_DB_URL, else the file FALCON_DB_URL_FILE names, else a fresh SQLite file).",
    )
    @click.option("--timeout", default=300.0, show_default=True, type=click.FloatRange(min=0, min_open=True), help="Give up on the play after this many seconds (not with --hold).")
    @click.option("--hold", is_flag=True, help="Keep the controller and the fleet running after the play, until Ctrl-C.")
    @click.option("--shutdown-timeout", default=90.0, show_default=True, type=click.FloatRange(min=0, min_open=True), help="On Ctrl-C: seconds to let the controller abort live tasks and delete pools.")
    @click.option("--json", "as_json", is_flag=True, help="Print one JSON document (tasks and fleet) on stdout.")
    def demo_cmd(fleet, tasks_path, config, db_url, timeout, hold, shutdown_timeout, as_json):
        """Run Falcon-Ray end to end on a simulated fleet and play a tasks file.

        It prints where to look (dashboard, Ray address, namespace, metrics, database)
        before the play; `falcon-ray queues`, `falcon-ray health` and the notebooks find it
        with no flags while it runs. Ctrl-C aborts the live tasks, lets the controller
        delete its pools, prints the fleet's accounting and exits 0.
        """
        from falcon_ray.devtools.demo import DemoRun, demo_settings, load_tasks

        from_stdin = tasks_path == "-"
        try:
            tasks = [] if from_stdin else load_tasks(tasks_path)
            settings = demo_settings(config)
        except Exception as e:  # a bad tasks or settings file is bad input
            from falcon_ray.cli import InvalidInput

            raise InvalidInput(" ".join(str(e).split())[:1000]) from None
        run = DemoRun(fleet, settings, db_url, namespace=settings.namespace, dashboard=True)
        sys.exit(_demo(run, tasks, from_stdin, timeout, hold, shutdown_timeout, as_json))

    @main.command("chaos")
    @click.option("--tasks", "n_tasks", default=200, show_default=True, type=click.IntRange(min=1), help="Tasks to play.")
    @click.option("--minutes", default=2.0, show_default=True, type=click.FloatRange(min=0.05), help="Length of the play (submits spread over it).")
    @click.option("--seed", default=1, show_default=True, type=int, help="Seeds the plan, the kills and the fleet's fault draws.")
    @click.option(
        "--db", "db_url", envvar="FALCON_CHAOS_DB", default=None,
        help="Database URL (default: a fresh SQLite file); on MariaDB/MySQL its connections are killed too "
        "(FALCON_CHAOS_DB, never FALCON_DB_URL: the soak kills that server's connections).",
    )
    @click.option("--scale", default=0.3, show_default=True, type=click.FloatRange(min=0.01), help="Multiplies the injection periods (kill every 10s, tokens 60s, watches cut every 7s...).")
    @click.option("--drain", "drain_s", default=None, type=float, help="Seconds to wait for quiescence after the play (default: max(90, half the play)).")
    @click.option("--no-kills", is_flag=True, help="Inject no actor kills.")
    @click.option("--no-faults", is_flag=True, help="Inject no API faults, watch cuts, 410s or token refusals.")
    @click.option("--no-db-kills", is_flag=True, help="Kill no database connections and play no outage (MariaDB/MySQL).")
    @click.option("--db-outage", "db_outage_s", default=30.0, show_default=True, type=click.FloatRange(min=0),
                  help="MariaDB/MySQL: seconds the database refuses the controller's connections, once mid-play (0: none).")  # fmt: skip
    @click.option("--disruption-rate", "disruption_rate", default=120.0, show_default=True, type=click.FloatRange(min=0),
                  help="Random GKE disruptions (maintenance, repair, reclaim) per node-hour of a node with a running pod (0: none).")  # fmt: skip
    @click.option("--json", "as_json", is_flag=True, help="Print the report as one JSON document on stdout.")
    @click.option("--out", "out_path", default=None, type=click.Path(dir_okay=False, writable=True),
                  help="Also write the JSON report to this file (Ray may print to stdout too).")  # fmt: skip
    def chaos_cmd(n_tasks, minutes, seed, db_url, scale, drain_s, no_kills, no_faults, no_db_kills, db_outage_s, disruption_rate, as_json, out_path):
        """Soak the controller on the simulated fleet under faults and kills; report the invariants.

        Exit code 1 when a task was lost or stuck, a Job created twice, a Falcon pool left
        alive, an abort overwritten, a task failed for capacity that comes back (a stockout
        or a reservation shortfall), an illegal lifecycle step, a recovery of a run the fleet
        did not disrupt, or a task whose every run fails ending Succeeded; 0 when every
        invariant holds.
        """
        from falcon_ray.devtools.chaos import ChaosRun, summarize

        def say(line: str) -> None:
            click.echo(line, err=True)

        soak = ChaosRun(
            n_tasks, minutes, seed, db_url, scale=scale, drain_s=drain_s, kills=not no_kills, faults=not no_faults, db_kills=not no_db_kills, progress=say,
            db_outage_s=db_outage_s, disruption_rate=disruption_rate,
        )
        report = soak.run_soak()
        if out_path:
            with open(out_path, "w") as f:
                json.dump(report, f, indent=2, default=str)
        if as_json:
            click.echo(json.dumps(report, indent=2, default=str))
        else:
            click.echo(summarize(report))
        sys.exit(0 if report["ok"] else 1)

    @main.command("queues")
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

    @main.command("health")
    @_db_option
    @click.option("--ray-address", default=None, help="Ray to join (default: FALCON_RAY_ADDRESS, a running demo's, else auto).")
    @click.option("--namespace", default=None, help="Ray namespace (default: the config's, FALCON_NAMESPACE, a running demo's, else falcon).")
    @click.option("--config", type=click.Path(exists=True, dir_okay=False), default=None)
    @click.option("--json", "as_json", is_flag=True)
    def health_cmd(db_url, ray_address, namespace, config, as_json):
        """Report the controller's health; exit 0 healthy, 1 unhealthy."""
        from actors.supervisor import Supervisor
        from falcon_ray import discovery, health
        settings = _settings(config)
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


def _where_to_look(run, started: float) -> str:
    """The block the demo prints before its play: where to look and what to type."""
    from falcon_ray import dbref, discovery
    from falcon_ray.clock import SYSTEM  # a command's console: the machine's clock

    info = run.ray_info
    ns = run.settings.namespace
    nsflag = "" if ns == discovery.DEFAULT_NAMESPACE else f" --namespace {ns}"
    lines = [f"falcon-ray demo: controller up after {SYSTEM.monotonic() - started:.1f}s. Where to look:"]
    if run.namespace_note:
        lines.append(f"  note         {run.namespace_note}")
    lines += [
        f"  dashboard    {info.get('dashboard_url') or '(not started: this demo joined an existing Ray)'}"
        "   (Actors: poller, cluster/<cluster>, queue/<cluster>/<topology>; it asks for the token of `ray get-auth-token`)",
        f"  Ray address  {info.get('address')}",
        f"  namespace    {ns}",
        f"  metrics      {info.get('metrics_url') or '-'}   (Falcon's series are ray_falcon_*)",
        f"  database     {dbref.redacted(run.db_url)}",
        f"  record       {discovery.record_path(ns)}   (how the commands below find this demo; removed when it stops)",
        "  in another terminal (in the venv: . .venv/bin/activate; tour: docs/demo.md):",
    ]
    cmds = [
        (f"falcon-ray queues --watch{nsflag}", "slot holder, waiting in pick order, running, pools"),
        (f"falcon-ray health{nsflag}", "leader, database, every actor"),
        ("jupyter lab notebooks/", "queues.ipynb, fleet.ipynb, task.ipynb"),
    ]
    width = max(len(c) for c, _ in cmds)
    lines += [f"    {c.ljust(width)}   # {why}" for c, why in cmds]
    # a URL with a password is not repeated on a command line (ps shows those): the
    # commands then take it from FALCON_DB_URL, which the reader sets in their shell
    db = "" if dbref.carries_password(run.db_url) else f" --db {run.db_url}"
    lines += [
        f"    falcon-ray status{db}",
        f"    falcon-ray submit{db} --actor me --tpu-type v6e --topology 2x2 --image img:1 --env FALCON_SIM_RUN_SECONDS=30 -- python run.py",
    ]
    return "\n".join(lines)


def _demo(run, tasks, from_stdin: bool, timeout: float, hold: bool, shutdown_timeout: float, as_json: bool) -> int:
    """The body of `falcon-ray demo`; returns the exit code."""
    import queue as queue_mod

    from falcon_ray import discovery
    from falcon_ray.clock import SYSTEM  # a command's console: the machine's clock
    from falcon_ray.devtools.demo import Schedule, parse_task_line, progress_printer, summarize

    def say(text: str) -> None:
        click.echo(text, err=True)

    stop = threading.Event()
    interrupts = {"n": 0}

    def on_signal(signum, _frame):
        interrupts["n"] += 1
        if interrupts["n"] == 1:
            stop.set()
            return
        raise KeyboardInterrupt  # a second Ctrl-C: stop at once, without waiting for the fleet

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    started = SYSTEM.monotonic()
    recorded = False
    lines: queue_mod.Queue = queue_mod.Queue()
    report = None
    code = 0
    try:
        say("falcon-ray demo: starting the simulated fleet, the database and Ray (with its dashboard)...")
        run.start()
        discovery.write(run.discovery_record())
        recorded = True
        say(_where_to_look(run, started))
        schedule = Schedule(run)
        for item in tasks:
            schedule.add(item, run.t0)
        stdin_open = from_stdin
        if from_stdin:
            threading.Thread(target=_read_lines, args=(sys.stdin, lines), daemon=True, name="stdin-tasks").start()
            say("falcon-ray demo: reading tasks from stdin, one JSON line each (times count from when a line arrives)")
        else:
            say(f"falcon-ray demo: playing {len(tasks)} task(s)")
        tick = progress_printer(run, sys.stderr)
        held_said = False
        done = False
        next_track = 0.0
        while not stop.is_set():
            now = SYSTEM.monotonic()
            while True:
                try:
                    got = lines.get_nowait()
                except queue_mod.Empty:
                    break
                if got is None:
                    stdin_open = False
                    say("falcon-ray demo: stdin closed; no more tasks from it")
                    continue
                n, line = got
                if not line.strip() or line.lstrip().startswith("#"):
                    continue
                try:
                    schedule.add(parse_task_line(line, f"stdin:{n}"), now)
                except ValueError as e:
                    say(f"falcon-ray demo: error: {e}; line ignored, the demo goes on")
            try:
                schedule.step(now)
            except Exception as e:  # the database refused a row: say so, keep the controller
                say(f"falcon-ray demo: error: could not submit: {type(e).__name__}: {str(e).splitlines()[0][:200]}")
            if now >= next_track:  # tasks submitted by others (falcon-ray submit --db ...) are shown too
                run.track_all()
                next_track = now + 1.0
            tick()
            finished = schedule.empty() and not stdin_open and run.all_terminal() and not run.falcon_pools_alive()
            if not hold:
                if finished:
                    done = True
                    break
                if now - started > timeout:
                    break
            elif finished and not held_said:
                say("falcon-ray demo: play over; holding the controller and the fleet (Ctrl-C to stop)")
                held_said = True
            stop.wait(0.2)
        if stop.is_set():
            dropped = schedule.drop()
            say(
                "\nfalcon-ray demo: stopping: aborting live tasks and letting the controller delete its pools"
                + (f" ({dropped} scheduled task(s) not submitted)" if dropped else "")
                + f" (at most {shutdown_timeout:g}s; Ctrl-C again to stop at once)"
            )
            done = run.wind_down(shutdown_timeout, on_tick=tick)
            left = run.falcon_pools_alive()
            if left:
                say(f"falcon-ray demo: {len(left)} Falcon pool(s) still alive after {shutdown_timeout:g}s: {', '.join(left)}")
        else:
            run.track_all()
        report = run.report()
        code = 0 if done else 1
    except KeyboardInterrupt:
        say("\nfalcon-ray demo: stopped at once (second Ctrl-C); pools may be left in the simulated fleet")
        code = 130
    finally:
        if recorded:
            discovery.remove(run.settings.namespace)
        run.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if report is None:
        return code or 1
    report["done"] = code == 0
    report["wall_seconds"] = round(SYSTEM.monotonic() - started, 1)
    if as_json:
        click.echo(json.dumps(report, indent=2, default=str))
    else:
        click.echo(summarize(report))
        if stop.is_set():
            verdict = "stopped: every task terminal, no Falcon pool left" if code == 0 else "stopped, NOT CLEAN (see above)"
        else:
            verdict = "every task terminal, no Falcon pool left" if code == 0 else "TIMED OUT"
        click.echo(f"\nfinished in {report['wall_seconds']}s; {verdict}")
    return code


def _read_lines(stream, out) -> None:
    n = 0
    try:
        for line in stream:
            n += 1
            out.put((n, line))
    except (OSError, ValueError) as e:  # stdin closed under us, or undecodable bytes
        click.echo(f"falcon-ray demo: error: reading stdin: {e}", err=True)
    out.put(None)
