"""The development tools' commands: ``demo``, ``chaos``, ``bench``, ``sim`` and ``simulate``.

``register(group)`` attaches them to the main `falcon-ray` group; ``falcon_ray.cli`` calls it
when this package is installed (an image built without it answers these names with one line
saying so). ``demo`` runs the embedded default (simulated fleet, SQLite, local Ray) and
exits 0 when every task is terminal and no Falcon pool is left; ``chaos`` soaks the
controller under faults and exits 1 when an invariant breaks; ``bench`` measures the
controller's costs; ``sim`` serves the simulated fleet alone; ``simulate`` runs the controller
in virtual time against the fleet model (``falcon_ray.devtools.simulate``).
"""

from __future__ import annotations

import json
import queue as queue_mod
import signal
import sys
import threading

import click

from falcon_ray import dbref, discovery
from falcon_ray.cli_shared import InvalidInput, db_url_param
from falcon_ray.clock import SYSTEM  # a command's console: the machine's clock


def register(group: click.Group) -> None:
    """Attach the tools' commands to the main CLI group."""
    from falcon_ray.devtools.simulate.cli import simulate
    from falcon_ray.sim.cli import sim

    for command in (demo_cmd, chaos_cmd, bench_cmd, sim, simulate):
        group.add_command(command)


@click.command("demo")
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
    "--db", "db_url", envvar="FALCON_DB_URL", default=None, callback=db_url_param,
    help="Database URL (default: FALCON_DB_URL, else the file FALCON_DB_URL_FILE names, else a fresh SQLite file).",
)
@click.option("--timeout", default=300.0, show_default=True, type=click.FloatRange(min=0, min_open=True), help="Give up on the play after this many seconds (not with --hold).")
@click.option("--hold", is_flag=True, help="Keep the controller and the fleet running after the play, until Ctrl-C.")
@click.option("--shutdown-timeout", default=90.0, show_default=True, type=click.FloatRange(min=0, min_open=True), help="On Ctrl-C: seconds to let the controller abort live tasks and delete pools.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document (tasks and fleet) on stdout.")
def demo_cmd(fleet, tasks_path, config, db_url, timeout, hold, shutdown_timeout, as_json):
    """Run Falcon-Ray end to end on a simulated fleet and play a tasks file.

    It prints where to look (dashboard, Ray address, namespace, metrics, database, the
    read API) before the play; `falcon-ray queues`, `falcon-ray health` and the notebooks find it
    with no flags while it runs. Ctrl-C aborts the live tasks, lets the controller
    delete its pools, prints the fleet's accounting and exits 0.
    """
    from falcon_ray.devtools.demo import DemoRun, demo_settings, load_tasks

    from_stdin = tasks_path == "-"
    try:
        tasks = [] if from_stdin else load_tasks(tasks_path)
        settings = demo_settings(config)
    except Exception as e:  # a bad tasks or settings file is bad input
        raise InvalidInput(" ".join(str(e).split())[:1000]) from None
    run = DemoRun(fleet, settings, db_url, namespace=settings.namespace, dashboard=True, api=True)
    sys.exit(_demo(run, tasks, from_stdin, timeout, hold, shutdown_timeout, as_json))

@click.command("chaos")
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

@click.command("bench")
@click.option(
    "--db", "db_url", envvar="FALCON_BENCH_DB", default=None,
    help="SQLite (default) or a MySQL server URL: fresh databases are created there and dropped "
    "(FALCON_BENCH_DB, never FALCON_DB_URL: the bench drops what it creates).",
)
@click.option("--quick", is_flag=True, help="100/1,000 tasks instead of up to 10,000 (under two minutes).")
@click.option(
    "--smoke", is_flag=True,
    help="Every part once at its smallest, to check that each figure is produced (its figures are too noisy to compare).",
)
@click.option("--json", "as_json", is_flag=True, help="Print only the JSON document.")
@click.option("--part", "parts", multiple=True, type=click.Choice(["intake", "handover", "idle", "scale", "e2e", "lifecycle-mixed"]), help="Run only these parts (repeatable).")
@click.option("--out", "out", type=click.Path(dir_okay=False), default=None, help="Also write the JSON document to this file.")
def bench_cmd(db_url, quick, smoke, as_json, parts, out):
    """Measure the controller's costs (issue 11): statements per task, idle, hand-over, intake, scale."""
    import logging

    from falcon_ray.devtools import bench

    logging.getLogger("falcon").setLevel(logging.WARNING)
    if quick and smoke:
        raise click.UsageError("--quick and --smoke are two sizes: give one")
    doc = bench.run_bench(db_url, "smoke" if smoke else "quick" if quick else "full", parts=tuple(parts))
    text = json.dumps(doc, indent=2, sort_keys=True, default=str)
    if out:
        with open(out, "w") as f:
            f.write(text + "\n")
    if as_json:
        click.echo(text)
    else:
        click.echo(text)
        click.echo(bench.render(doc))


# ---- the demo's console -------------------------------------------------------------------


def _where_to_look(run, started: float) -> str:
    """The block the demo prints before its play: where to look and what to type."""
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
        f"  api          {run.api_url or '-'}   (the upper layer's read API: /v1/tasks/<id>, /v1/queues, /v1/clusters,"
        f" /openapi.json; docs/api.md{'; bearer token in ' + run.settings.api_token_file if run.settings.api_token_file else ''})",
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


def _say(text: str) -> None:
    click.echo(text, err=True)


class _Interrupts:
    """SIGINT and SIGTERM while the demo runs: the first sets ``stop`` (wind down: abort the
    live tasks, let the controller delete its pools), a second raises KeyboardInterrupt (stop
    at once, without waiting for the fleet). The previous handlers come back on exit."""

    def __init__(self) -> None:
        self.stop = threading.Event()
        self._count = 0
        self._previous: dict = {}

    def __enter__(self) -> _Interrupts:
        self._previous = {sig: signal.signal(sig, self._on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
        return self

    def __exit__(self, *exc) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)

    def _on_signal(self, signum, _frame) -> None:
        self._count += 1
        if self._count == 1:
            self.stop.set()
            return
        raise KeyboardInterrupt


def _demo(run, tasks, from_stdin: bool, timeout: float, hold: bool, shutdown_timeout: float, as_json: bool) -> int:
    """The body of `falcon-ray demo`; returns the exit code."""
    started = SYSTEM.monotonic()
    report = None
    code = 0
    with _Interrupts() as interrupts:
        recorded = False
        try:
            _say("falcon-ray demo: starting the simulated fleet, the database and Ray (with its dashboard)...")
            run.start()
            discovery.write(run.discovery_record())
            recorded = True
            _say(_where_to_look(run, started))
            play = _Play(run, tasks, from_stdin, interrupts.stop)
            done = play.until_done(started, timeout, hold)
            if interrupts.stop.is_set():
                done = play.wind_down(shutdown_timeout)
            else:
                run.track_all()
            report = run.report()
            code = 0 if done else 1
        except KeyboardInterrupt:
            _say("\nfalcon-ray demo: stopped at once (second Ctrl-C); pools may be left in the simulated fleet")
            code = 130
        finally:
            if recorded:
                discovery.remove(run.settings.namespace)
            run.stop()
    if report is None:
        return code or 1
    _print_report(report, code, interrupts.stop.is_set(), started, as_json)
    return code


class _Play:
    """The demo's play: submits the scheduled tasks when they are due (and stdin's tasks as
    their lines come), prints each task's progress, and tracks tasks others submit."""

    def __init__(self, run, tasks, from_stdin: bool, stop: threading.Event) -> None:
        from falcon_ray.devtools.demo import Schedule, progress_printer

        self.run = run
        self.stop = stop
        self.schedule = Schedule(run)
        for item in tasks:
            self.schedule.add(item, run.t0)
        self.lines: queue_mod.Queue = queue_mod.Queue()
        self.stdin_open = from_stdin
        if from_stdin:
            threading.Thread(target=_read_lines, args=(sys.stdin, self.lines), daemon=True, name="stdin-tasks").start()
            _say("falcon-ray demo: reading tasks from stdin, one JSON line each (times count from when a line arrives)")
        else:
            _say(f"falcon-ray demo: playing {len(tasks)} task(s)")
        self.tick = progress_printer(run, sys.stderr)

    def until_done(self, started: float, timeout: float, hold: bool) -> bool:
        """Play until every task is terminal and no Falcon pool is left (True), the timeout
        passes (False) or, with ``hold``, until ``stop`` only."""
        held_said = False
        next_track = 0.0
        while not self.stop.is_set():
            now = SYSTEM.monotonic()
            self._take_stdin_lines(now)
            self._submit_due(now)
            if now >= next_track:  # tasks submitted by others (falcon-ray submit --db ...) are shown too
                self.run.track_all()
                next_track = now + 1.0
            self.tick()
            finished = self._finished()
            if not hold:
                if finished:
                    return True
                if now - started > timeout:
                    return False
            elif finished and not held_said:
                _say("falcon-ray demo: play over; holding the controller and the fleet (Ctrl-C to stop)")
                held_said = True
            self.stop.wait(0.2)
        return False

    def wind_down(self, shutdown_timeout: float) -> bool:
        """After a stop: abort the live tasks and let the controller delete its pools; True
        when it is clean within ``shutdown_timeout``."""
        dropped = self.schedule.drop()
        _say(
            "\nfalcon-ray demo: stopping: aborting live tasks and letting the controller delete its pools"
            + (f" ({dropped} scheduled task(s) not submitted)" if dropped else "")
            + f" (at most {shutdown_timeout:g}s; Ctrl-C again to stop at once)"
        )
        done = self.run.wind_down(shutdown_timeout, on_tick=self.tick)
        left = self.run.falcon_pools_alive()
        if left:
            _say(f"falcon-ray demo: {len(left)} Falcon pool(s) still alive after {shutdown_timeout:g}s: {', '.join(left)}")
        return done

    def _take_stdin_lines(self, now: float) -> None:
        from falcon_ray.devtools.demo import parse_task_line

        while True:
            try:
                got = self.lines.get_nowait()
            except queue_mod.Empty:
                return
            if got is None:
                self.stdin_open = False
                _say("falcon-ray demo: stdin closed; no more tasks from it")
                continue
            n, line = got
            if not line.strip() or line.lstrip().startswith("#"):
                continue
            try:
                self.schedule.add(parse_task_line(line, f"stdin:{n}"), now)
            except ValueError as e:
                _say(f"falcon-ray demo: error: {e}; line ignored, the demo goes on")

    def _submit_due(self, now: float) -> None:
        try:
            self.schedule.step(now)
        except Exception as e:  # the database refused a row: say so, keep the controller
            _say(f"falcon-ray demo: error: could not submit: {type(e).__name__}: {str(e).splitlines()[0][:200]}")

    def _finished(self) -> bool:
        return (
            self.schedule.empty() and not self.stdin_open and self.run.all_terminal() and not self.run.falcon_pools_alive()
        )


def _print_report(report: dict, code: int, stopped: bool, started: float, as_json: bool) -> None:
    from falcon_ray.devtools.demo import summarize

    report["done"] = code == 0
    report["wall_seconds"] = round(SYSTEM.monotonic() - started, 1)
    if as_json:
        click.echo(json.dumps(report, indent=2, default=str))
        return
    click.echo(summarize(report))
    if stopped:
        verdict = "stopped: every task terminal, no Falcon pool left" if code == 0 else "stopped, NOT CLEAN (see above)"
    else:
        verdict = "every task terminal, no Falcon pool left" if code == 0 else "TIMED OUT"
    click.echo(f"\nfinished in {report['wall_seconds']}s; {verdict}")


def _read_lines(stream, out) -> None:
    n = 0
    try:
        for line in stream:
            n += 1
            out.put((n, line))
    except (OSError, ValueError) as e:  # stdin closed under us, or undecodable bytes
        click.echo(f"falcon-ray demo: error: reading stdin: {e}", err=True)
    out.put(None)
