"""``falcon-ray simulate``: run the controller in virtual time and print the report.

Exit codes: 0 when every invariant is 0, 1 when one is not (the command that replays the
run goes to stderr), 2 for invalid input (one line on stderr). With ``--seeds`` the run is
made once per seed, a line each: 1 when any seed broke an invariant (each one's replay
command on stderr).

``--timing NAME=SECONDS`` or ``--timing NAME=median:M,p90:P`` (repeatable) sets one of the
fleet's timings in every cluster without a fleet file of its own (``parse_timing`` reads
it, ``falcon_ray.sim.fleet.with_timings`` validates it); the replay command repeats them.
"""

from __future__ import annotations

import json
import os
import shlex
import sys
import time

import click

from falcon_ray.cli_shared import InvalidInput

HASH_SEED = "0"


def pin_hash_seed() -> None:
    """Run under a fixed PYTHONHASHSEED (re-executing the command once if needed): the
    product iterates a few sets of strings, and their order (hence the order of two wake-ups
    at the same instant) would otherwise differ from one process to the next."""
    if os.environ.get("PYTHONHASHSEED") == HASH_SEED or os.environ.get("FALCON_SIMULATE_IN_PROCESS"):
        return
    os.environ["PYTHONHASHSEED"] = HASH_SEED
    os.execv(sys.executable, [sys.executable, *sys.argv])


def parse_timing(text: str) -> tuple[str, float | dict[str, float | str]]:
    """``NAME=SECONDS`` or ``NAME=median:M,p90:P`` as (name, value), the value as the fleet
    file would give it (the Timings model judges it); InvalidInput when it has neither shape."""
    name, sep, value = text.partition("=")
    name, value = name.strip(), value.strip()
    if not sep or not name or not value:
        raise InvalidInput(f"--timing: {text!r} is not NAME=SECONDS or NAME=median:M,p90:P")
    if ":" not in value:
        try:
            return name, float(value)
        except ValueError:
            raise InvalidInput(f"--timing: {text!r}: {value!r} is not a number of seconds") from None
    parts: dict[str, float | str] = {}
    for item in value.split(","):
        key, colon, number = item.partition(":")
        if not colon or not key.strip():
            raise InvalidInput(f"--timing: {text!r}: {item!r} is not KEY:NUMBER (e.g. median:1800,p90:3600)")
        try:
            parts[key.strip()] = float(number)
        except ValueError:
            parts[key.strip()] = number.strip()  # the model says what is wrong with it
    return name, parts


def _with_timings(fleet_config, timing_options):
    """The fleet with every ``--timing`` applied to each cluster (InvalidInput when one is invalid)."""
    from falcon_ray.sim.fleet import FleetConfigError, with_timings

    if not timing_options:
        return fleet_config
    changes = dict(parse_timing(t) for t in timing_options)
    try:
        return with_timings(fleet_config, changes, "--timing")
    except FleetConfigError as e:
        raise InvalidInput(str(e)) from None


def _replay_command(fleet, tasks, config, seed, until_s, db_url, exact, timings=()) -> str:
    parts = ["falcon-ray", "simulate", *(["--fleet", fleet] if fleet else []), "--tasks", tasks, "--seed", str(seed)]
    for timing in timings:
        parts += ["--timing", timing]
    if exact:
        parts.append("--exact")
    if config:
        parts += ["--config", config]
    if until_s is not None:
        parts += ["--until-s", f"{until_s:g}"]
    if db_url:
        parts += ["--db", "<a fresh database>"]
    return shlex.join(parts)


def _progress(stream):
    """A progress line in simulated time, at most about once a wall second."""
    shown = [0.0]
    tty = stream.isatty()

    def show(sim) -> None:
        now = time.perf_counter()
        if now - shown[0] < (1.0 if tty else 10.0):
            return
        shown[0] = now
        s = sim.simulated_s
        day, rest = divmod(int(s), 86400)
        line = (
            f"simulate: day {day} {rest // 3600:02d}:{rest % 3600 // 60:02d} virtual · "
            f"{sim.submitted}/{len(sim.plan)} tasks submitted · {sim.falcon_pools_alive()} pools"
        )
        stream.write(("\r" + line + "   ") if tty else line + "\n")
        stream.flush()

    return show


@click.command("simulate")
@click.option("--fleet", type=click.Path(exists=True, dir_okay=False), default=None, help="Fleet YAML in the sim's format, timings in seconds (default: the built-in fleet).")
@click.option("--tasks", "tasks_path", type=click.Path(dir_okay=False), default=None, help="Tasks JSONL in the demo's format (with --generate: the file to write).")
@click.option("--config", type=click.Path(exists=True, dir_okay=False), default=None, help="Settings YAML (default: production defaults for every setting).")
@click.option("--seed", default=1, show_default=True, type=int, help="Seed of the fleet's draws, the controller's jitter and --generate.")
@click.option("--until-s", type=click.FloatRange(min=0, min_open=True), default=None, help="Stop after this many simulated seconds (default: when every task is over and no pool is left).")
@click.option("--db", "db_url", default=None, help="Database URL (default: SQLite in memory). It must be fresh: the run adds its clusters and tasks.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON on stdout.")
@click.option("--out", type=click.Path(dir_okay=False, writable=True), default=None, help="Also write the JSON report to this file.")
@click.option("--generate", is_flag=True, help="Write a realistic tasks file to --tasks for --fleet instead of running (docs/simulate.md).")
@click.option("--count", default=5000, show_default=True, type=click.IntRange(min=1), help="With --generate: tasks on average.")
@click.option("--days", default=7.0, show_default=True, type=click.FloatRange(min=0, min_open=True), help="With --generate: days of arrivals.")
@click.option("--quiet", is_flag=True, help="No progress line on stderr.")
@click.option("--exact", is_flag=True, help="Step every queue at every tick, as the Tickers would (slow; to check the left-out rounds).")
@click.option("--seeds", default=None, help="Run once per seed, e.g. 1-20 or 1,4,7-9: one line per seed; exit 1 when any seed breaks an invariant.")
@click.option("--timing", "timings", multiple=True, metavar="NAME=VALUE", help="Set a fleet timing in every cluster: NAME=SECONDS or NAME=median:M,p90:P (repeatable), e.g. flex_capacity_wait=median:1800,p90:3600.")
def simulate(fleet, tasks_path, config, seed, until_s, db_url, as_json, out, generate, count, days, quiet, exact, seeds, timings):
    """Run the controller's poller, queues and cluster gateways in virtual time against a
    modelled fleet, play a tasks file, and report what users waited and what the fleet
    held idle. The same inputs and seed give the same report (wall_s aside)."""
    from falcon_ray.cli_shared import settings_or_exit
    from falcon_ray.devtools.demo import load_tasks
    from falcon_ray.sim.fleet import FleetConfigError, load_fleet

    from .generate import generate_tasks, write_tasks

    try:
        fleet_config = load_fleet(fleet)
    except (FleetConfigError, OSError) as e:
        raise InvalidInput(f"fleet: {e}") from None
    fleet_config = _with_timings(fleet_config, timings)
    if not tasks_path:
        raise InvalidInput("--tasks is required (the tasks to play, or with --generate the file to write)")
    if generate:
        items = generate_tasks(fleet_config, count, days, seed)
        write_tasks(items, tasks_path)
        click.echo(f"wrote {len(items)} tasks over {days:g} days to {tasks_path}", err=True)
        return
    try:
        tasks = load_tasks(tasks_path)
    except (ValueError, OSError) as e:
        raise InvalidInput(f"tasks: {e}") from None
    settings = settings_or_exit(config)
    if seeds is not None:
        if db_url:
            raise InvalidInput("--seeds runs on SQLite in memory (a --db must be fresh for each run)")
        seed_list = parse_seeds(seeds)
        pin_hash_seed()
        _run_seeds(fleet_config, tasks, settings, seed_list, until_s, exact, as_json, out, (fleet, tasks_path, config, timings))
        return
    pin_hash_seed()
    replay = _replay_command(fleet, tasks_path, config, seed, until_s, db_url, exact, timings)
    progress = None if quiet else _progress(sys.stderr)
    report = _play(fleet_config, tasks, settings, seed, until_s, exact, replay, db_url=db_url, progress=progress)
    if not quiet:
        click.echo("", err=True)
    _write(report, out, as_json)
    if not as_json:
        click.echo(summary(report))
    if any(report["invariants"].values()):
        broken = ", ".join(f"{k}={v}" for k, v in report["invariants"].items() if v)
        click.echo(f"simulate: invariants broken ({broken}); replay with: {replay}", err=True)
        sys.exit(1)


def _play(fleet_config, tasks, settings, seed, until_s, exact, replay, db_url=None, progress=None) -> dict:
    """One run of the tasks on the fleet with ``seed``, and its report; a run that raises
    prints the command that replays it first."""
    from .driver import Simulation
    from .report import build_report

    t0 = time.perf_counter()
    sim = Simulation(fleet_config, tasks, settings, seed, db_url=db_url, until_s=until_s, progress=progress, exact=exact)
    try:
        sim.run()
        return build_report(sim, time.perf_counter() - t0)
    except Exception:
        click.echo(f"\nsimulate: the run failed; replay it with: {replay}", err=True)
        raise
    finally:
        sim.dispose()


def _write(report: dict | list, out: str | None, as_json: bool) -> None:
    """The report as JSON: to ``out`` when given, on stdout with ``--json``."""
    text = json.dumps(report, indent=2)
    if out:
        with open(out, "w", encoding="utf-8") as f:
            f.write(text + "\n")
    if as_json:
        click.echo(text)


def summary(report: dict) -> str:
    ttr = report["time_to_running_s"]["all"]
    lines = [
        f"seed {report['seed']}: {report['tasks']} tasks, {report['simulated_s'] / 3600:.1f} h simulated in {report['wall_s']:.1f} s",
        f"queue steps: {report['queue_steps']['run']} run, {report['queue_steps']['applied']} carried out a decision",
        "outcomes: " + ", ".join(f"{k} {v}" for k, v in report["outcomes"].items()),
        f"time to Running: p50 {ttr['p50']} s, p90 {ttr['p90']} s, p99 {ttr['p99']} s, mean {ttr['mean']} s (n={ttr['n']})",
        f"chip-hours: used {report['used_chip_hours']}, idle {report['idle_chip_hours']}; statements per task {report['statements_per_task']}",
        "invariants: " + ", ".join(f"{k} {v}" for k, v in report["invariants"].items()),
        f"digest {report['digest']}",
    ]
    return "\n".join(lines)


def parse_seeds(text: str) -> list[int]:
    """``1-20``, ``3`` or ``1,4,7-9``: the seeds in the order given."""
    out: list[int] = []
    try:
        for part in text.split(","):
            lo, _, hi = part.strip().partition("-")
            a, b = int(lo), int(hi or lo)
            if b < a:
                raise ValueError(part)
            out.extend(range(a, b + 1))
    except ValueError:
        raise InvalidInput(f"--seeds: {text!r} is not a list of seeds such as 1-20 or 1,4,7-9") from None
    return out


def _run_seeds(fleet_config, tasks, settings, seeds, until_s, exact, as_json, out, paths) -> None:
    """One run per seed, one after the other in this process; a line per seed on stdout (the
    reports as a JSON list with ``--json`` / ``--out``), the replay command of each seed that
    broke an invariant on stderr, exit 1 when one did."""
    fleet, tasks_path, config, timings = paths
    reports, broken = [], []
    for seed in seeds:
        replay = _replay_command(fleet, tasks_path, config, seed, until_s, None, exact, timings)
        report = _play(fleet_config, tasks, settings, seed, until_s, exact, replay)
        reports.append(report)
        if any(report["invariants"].values()):
            broken.append(replay)
        if not as_json:
            click.echo(seed_line(report))
    _write(reports, out, as_json)
    for replay in broken:
        click.echo(f"simulate: invariants broken; replay with: {replay}", err=True)
    if broken:
        sys.exit(1)


def seed_line(report: dict) -> str:
    """One seed's run in a line: outcomes, time to Running, invariants."""
    ttr = report["time_to_running_s"]["all"]
    bad = {k: v for k, v in report["invariants"].items() if v}
    return (
        f"seed {report['seed']}: {report['simulated_s'] / 3600:.1f} h in {report['wall_s']:.1f} s; "
        + ", ".join(f"{k} {v}" for k, v in report["outcomes"].items())
        + f"; to Running p50 {ttr['p50']} s p99 {ttr['p99']} s; invariants "
        + (", ".join(f"{k}={v}" for k, v in bad.items()) if bad else "all 0")
    )
