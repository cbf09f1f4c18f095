"""The rendered log wrapper, run for real with the local /bin/sh.

The container's command from ``job_manifest`` is executed as the kubelet would execute
it (command + args as argv), with the GCS FUSE mount replaced by a temporary directory
and the downward-API variables set by hand.
"""

from __future__ import annotations

import datetime as dt
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from falcon_ray import render
from falcon_ray.model import Cluster
from falcon_ray.spec import TaskSpec

pytestmark = pytest.mark.skipif(
    not Path("/bin/sh").exists() or not shutil.which("tee"), reason="needs /bin/sh"
)

POD = "falcon-task-5-0-abcde"


def cluster() -> Cluster:
    now = dt.datetime(2026, 1, 1)
    return Cluster(
        "c",
        "edge",
        "p",
        "us-east5-b",
        "v6e",
        "bucket",
        "",
        "active",
        "ns",
        "sa",
        created_at=now,
        updated_at=now,
    )


def rendered_argv(command: list[str], args: list[str] | None = None) -> tuple[list[str], dict]:
    spec = TaskSpec(tpu_type="v6e", topology="2x2", image="busybox", command=command, args=args or [])
    job = render.job_manifest(5, spec, cluster(), "pool", "q")
    (container,) = job["spec"]["template"]["spec"]["containers"]
    return [*container["command"], *container["args"]], container


def run(argv: list[str], log_dir: Path, **popen) -> subprocess.CompletedProcess:
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "FALCON_LOG_DIR": str(log_dir),
        "FALCON_POD_NAME": POD,
        "TMPDIR": str(log_dir),
    }
    env.update(popen.pop("env", {}))
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=30, cwd=log_dir, **popen)


def test_exit_code_and_both_streams_reach_stdout_and_the_log_file(tmp_path):
    script = "echo to-stdout; echo to-stderr >&2; exit 3"
    argv, container = rendered_argv(["/bin/sh", "-c", script])
    assert argv[:3] == ["/bin/sh", "-c", render.LOG_WRAPPER_SCRIPT]
    result = run(argv, tmp_path)
    assert result.returncode == 3
    assert result.stdout.splitlines() == ["to-stdout", "to-stderr"]
    log = (tmp_path / f"{POD}.log").read_text()
    assert log.splitlines() == ["to-stdout", "to-stderr"]
    # the log lands where log_path() says once the mount maps to gs://bucket/logs/5/
    assert render.log_path(cluster(), 5, POD) == f"gs://bucket/logs/5/{POD}.log"
    assert not (tmp_path / "falcon-log.fifo").exists()


def test_success_and_signal_deaths_keep_their_status(tmp_path):
    assert run(rendered_argv(["true"])[0], tmp_path).returncode == 0
    killed = run(rendered_argv(["/bin/sh", "-c", "kill -9 $$"])[0], tmp_path)
    assert killed.returncode == 128 + signal.SIGKILL


def test_hostile_arguments_are_data_not_shell(tmp_path):
    hostile = [
        "; touch pwned-1",
        "$(touch pwned-2)",
        "`touch pwned-3`",
        "a\nb && touch pwned-4",
        "' \" \\ $HOME $$ $(FALCON_POD_NAME) *",
        "",
    ]
    argv, _ = rendered_argv(["printf", "[%s]\\n"], hostile)
    result = run(argv, tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "".join(f"[{h}]\n" for h in hostile)
    assert not list(tmp_path.glob("pwned-*"))
    assert render.LOG_WRAPPER_SCRIPT == argv[2]  # the script text never contains spec content


def test_sigterm_is_forwarded_to_the_command(tmp_path):
    child = (
        "import os, signal\n"
        # os.write/_exit: the signal may land while print() is still flushing "ready"
        "signal.signal(signal.SIGTERM, lambda *a: (os.write(1, b'got TERM\\n'), os._exit(42)))\n"
        "print('ready', flush=True)\n"
        "signal.pause()\n"  # only a signal ends it: without the forwarded TERM, communicate() times out
    )
    argv, _ = rendered_argv([sys.executable, "-c", child])
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "FALCON_LOG_DIR": str(tmp_path),
        "FALCON_POD_NAME": POD,
        "TMPDIR": str(tmp_path),
    }
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, text=True, cwd=tmp_path)
    assert proc.stdout.readline().strip() == "ready"
    started = time.monotonic()  # wall-clock: a real child process and a real SIGTERM
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=20)
    assert proc.returncode == 42
    assert "got TERM" in out and time.monotonic() - started < 10  # wall-clock: the TERM ended it at once
    assert "got TERM" in (tmp_path / f"{POD}.log").read_text()


def test_without_tee_the_command_still_runs_with_its_status(tmp_path):
    empty_path = tmp_path / "bin"
    empty_path.mkdir()
    argv, _ = rendered_argv(["/bin/sh", "-c", "echo hi; exit 5"])
    result = run(argv, tmp_path, env={"PATH": str(empty_path)})
    assert result.returncode == 5
    assert result.stdout == "hi\n"
    assert "running without it" in result.stderr
    assert not (tmp_path / f"{POD}.log").exists()


def test_an_unwritable_log_file_does_not_break_the_command(tmp_path):
    argv, _ = rendered_argv(["/bin/sh", "-c", "echo still-here; exit 4"])
    result = run(argv, tmp_path, env={"FALCON_LOG_DIR": str(tmp_path / "missing-mount")})
    assert result.returncode == 4
    assert "still-here" in result.stdout
