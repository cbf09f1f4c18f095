"""Fuzzing the command line: random arguments to every command never give a traceback.

Every command path ``falcon-ray --help`` lists gets seeded random argument lists
(its own option names with junk values, junk positionals, unknown options). Each
run must end with exit 0, 1 (a refused operation or a database problem) or 2 (bad
input), never with an exception, and an error is one ``Error:`` line. Commands that
would start Ray, a demo or a server are safe here: their entry points are replaced
by a sentinel, so an argument list that gets past validation stops there. The table
at the end pins inputs that used to traceback or exit 1 and are bad input (exit 2).
"""

from __future__ import annotations

import random

import click
import pytest
from click.testing import CliRunner

from falcon_ray import cli
from falcon_ray.store.migrate import upgrade

JUNK = [
    "", "-", "--", "x", "0", "-1", "1e9", "99999999999999999999999", "nan", "inf", "NaN", "{", "{}", "[]",
    '{"a": 1}', "null", "日本", "\x1b[31m", "\u202e", "a" * 5000, "../../etc", "mysql://", "notaurl",
    "foo://bar", "sqlite:///nonexistent/dir/x.db", "=", "A=", "=B", "A=B", "v6e", "2x4", "active", "offline",
    "us-east5-b", "--json", "--help-me", "-z",
]  # fmt: skip


class _Started(Exception):
    """The arguments got past validation to where Ray, a demo or a server would start."""


def _error_lines(result) -> list[str]:
    """stderr without click's usage lines: the error itself must be one line."""
    return [l for l in result.stderr.splitlines() if l.strip() and not l.startswith(("Usage: ", "Try '", "\t"))]  # click lists choices on tab lines


def _commands(group: click.Group, prefix: tuple[str, ...] = ()):
    for name, cmd in sorted(group.commands.items()):
        if isinstance(cmd, click.Group):
            yield from _commands(cmd, (*prefix, name))
        else:
            yield (*prefix, name), cmd


COMMANDS = list(_commands(cli.main))


def _args(rng: random.Random, cmd: click.Command) -> list[str]:
    opts = [o for p in cmd.params if isinstance(p, click.Option) for o in p.opts]
    out: list[str] = []
    for _ in range(rng.randrange(6)):
        r = rng.random()
        if r < 0.5 and opts:
            out.append(rng.choice(opts))
            if rng.random() < 0.8:
                out.append(rng.choice(JUNK))
        elif r < 0.9:
            out.append(rng.choice(JUNK))
        else:
            out.append("--" + rng.choice(["nope", "db-url", "x" * 50]))
    return out


@pytest.fixture
def guarded(monkeypatch):
    """Stop anything that would leave this process: Ray, the demo, the simulated fleet, the benchmark."""
    import ray

    from falcon_ray.devtools import bench, demo
    from falcon_ray.sim import server

    def started(*_a, **_k):
        raise _Started()

    monkeypatch.setattr(ray, "init", started)
    # a Ray this worker joined for an earlier test must not be found either (xdist order):
    # `queues --watch` against a live Ray redraws until Ctrl-C
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(demo.DemoRun, "__init__", started)
    monkeypatch.setattr(server.SimFleet, "start", started)
    monkeypatch.setattr(bench, "run_bench", started)


@pytest.mark.timeout(120)
def test_random_arguments_to_every_command_never_traceback(tmp_path, guarded):
    db = f"sqlite:///{tmp_path / 'cli.db'}"
    upgrade(db, with_jobs_table=True)
    rng = random.Random(1201)
    runner = CliRunner(env={"FALCON_DB_URL": db})
    seen = 0
    for path, cmd in COMMANDS:
        for _ in range(25):
            argv = [*path, *_args(rng, cmd)]
            result = runner.invoke(cli.main, argv)
            if isinstance(result.exception, _Started):
                continue
            seen += 1
            assert result.exception is None or isinstance(result.exception, SystemExit), (argv, result.exception, result.output[-2000:])
            assert result.exit_code in (0, 1, 2), (argv, result.exit_code, result.output[-500:])
            assert "Traceback" not in result.output, argv
            if result.exit_code != 0:
                assert len(_error_lines(result)) == 1, (argv, result.stderr[-1000:])
    assert seen > len(COMMANDS) * 10


@pytest.mark.parametrize(
    "argv",
    [
        ["status", "--db", "notaurl"],
        ["status", "--db", "foo://bar"],
        ["db", "upgrade", "--db", "postgresql://h/db"],  # no driver installed
        ["status", "--limit", "-5"],
        ["status", "99999999999999999999999"],
        ["abort", "99999999999999999999"],
        ["run", "--db", "notaurl"],
        ["run", "--config", "{bad_yaml}"],
        ["run", "--config", "{bad_value}"],
        ["health", "--config", "{bad_yaml}"],
        ["demo", "--timeout", "-1"],
        ["demo", "--tasks", "{bad_json}"],
        ["demo", "--config", "{bad_yaml}"],
    ],
)
def test_bad_input_exits_2_with_one_line(tmp_path, guarded, argv):
    (tmp_path / "bad.yaml").write_text("a: [\n")
    (tmp_path / "value.yaml").write_text("leader_ttl_s: -3\nregistry_interval_s: soon\n")
    (tmp_path / "bad.jsonl").write_text("{bad\n")
    files = {"{bad_yaml}": "bad.yaml", "{bad_value}": "value.yaml", "{bad_json}": "bad.jsonl"}
    argv = [str(tmp_path / files[a]) if a in files else a for a in argv]
    db = f"sqlite:///{tmp_path / 'cli.db'}"
    upgrade(db, with_jobs_table=True)
    result = CliRunner(env={"FALCON_DB_URL": db}).invoke(cli.main, argv)
    assert not isinstance(result.exception, _Started), "bad input must be refused before anything starts"
    assert result.exit_code == 2, (result.exit_code, result.output[-1000:])
    assert "Traceback" not in result.output
    errors = _error_lines(result)
    assert len(errors) == 1 and errors[0].startswith("Error: "), result.stderr
