"""A local Ray cluster of its own: ``ray start --head --block`` in a process group of its own.

The test session's shared Ray (tests/harness/ray_session.py) and the two-controller fencing
test's two clusters are started this way. Every port is a free one; ``stop`` SIGKILLs the
group and every process the head started (Ray's workers run in process groups of their own)
and waits until they are gone, whatever state the cluster is in.

A watchdog process (this file run as a script) does the same when the process that started
the head dies without calling ``stop`` (SIGKILL, a closed pipe): a pytest run killed that
way once left its Ray running for half an hour.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

BIN = Path(sys.executable).parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RayHead:
    """One local Ray cluster. ``env`` is its processes' environment (``os.environ`` if None)."""

    def __init__(
        self,
        label: str,
        root: Path,
        num_cpus: int = 1,
        env: dict[str, str] | None = None,
        system_config: dict | None = None,
        log_monitor: bool = True,
    ) -> None:
        self.label = label
        self.temp_dir = root / label  # short: Ray's socket paths must stay under 108 bytes
        self.log = root / f"ray-{label}.log"
        self.num_cpus = num_cpus
        self.env = env
        self.system_config = system_config or {}
        self.log_monitor = log_monitor  # False: worker logs stay in their files, never sent to drivers
        self.proc: subprocess.Popen | None = None
        self.address = ""
        self.metrics_port = 0

    def start(self) -> None:
        self.metrics_port = free_port()
        ports = {
            "--port": free_port(),
            "--node-manager-port": free_port(),
            "--object-manager-port": free_port(),
            "--ray-client-server-port": free_port(),
            "--dashboard-port": free_port(),
            "--dashboard-agent-listen-port": free_port(),
            "--dashboard-agent-grpc-port": free_port(),
            "--runtime-env-agent-port": free_port(),
            "--metrics-export-port": self.metrics_port,
        }
        cmd = [str(BIN / "ray"), "start", "--head", "--block", f"--num-cpus={self.num_cpus}", "--include-dashboard=false", "--disable-usage-stats"]
        cmd += [f"{k}={v}" for k, v in ports.items()] + [f"--temp-dir={self.temp_dir}"]
        if not self.log_monitor:
            cmd.append("--include-log-monitor=false")
        if self.system_config:
            cmd.append(f"--system-config={json.dumps(self.system_config)}")
        with open(self.log, "w") as out:
            self.proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=self.env, start_new_session=True)
        # stdlib only, ~0.02 CPU-s to start; it ends with the head
        subprocess.Popen(
            [sys.executable, __file__, str(os.getpid()), str(self.proc.pid)],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
        )

    def wait_ready(self, timeout: float = 180.0, restarts: int = 2) -> str:
        """The head's address once it is up. A head that exits while starting is started
        again on fresh ports, at most ``restarts`` times: a port ``free_port`` found free
        can be taken by another process (another test worker's Ray) before Ray binds it.
        ``timeout`` bounds a start-up that takes seconds alone (docs/bench) and a minute or
        more on a 2-core machine running two suites at once; it proves nothing about timing."""
        deadline = time.monotonic() + timeout  # wall-clock: a real Ray head starting
        while time.monotonic() < deadline:  # wall-clock: a real Ray head starting
            if self.proc.poll() is not None:
                text = self.log.read_text()[-3000:]
                if restarts <= 0:
                    raise RuntimeError(f"ray {self.label} exited:\n{text}")
                restarts -= 1
                kill_tree(self.proc.pid)
                shutil.copy(self.log, self.log.with_suffix(f".exit{restarts}.log"))
                shutil.rmtree(self.temp_dir, ignore_errors=True)
                self.start()
                continue
            m = re.search(r"ray start --address='([^']+)'", self.log.read_text())
            if m:
                self.address = m.group(1)
                return self.address
            time.sleep(0.2)  # wall-clock: polls a real process's log
        raise RuntimeError(f"ray {self.label} not up after {timeout:g}s:\n{self.log.read_text()[-3000:]}")

    def stop(self, keep_logs: bool = False) -> None:
        """SIGKILL the group and every process the head started, then wait until they are
        gone; its temp dir (the session's logs) goes too unless ``keep_logs``."""
        if self.proc is None:
            return
        procs = kill_tree(self.proc.pid)
        self.proc.wait(timeout=10)  # wall-clock: a real Ray process exiting
        deadline = time.monotonic() + 10  # wall-clock: real processes exiting
        while time.monotonic() < deadline and any(alive(p) for p in procs):  # wall-clock: real processes exiting
            time.sleep(0.1)  # wall-clock: real processes exiting
        if not keep_logs:
            shutil.rmtree(self.temp_dir, ignore_errors=True)


def kill_tree(pid: int) -> list[int]:
    """SIGKILL the process group ``pid`` leads and every process below ``pid``; their pids."""
    procs = descendants(pid)
    for kill in (lambda: os.killpg(pid, signal.SIGKILL), *(lambda p=p: os.kill(p, signal.SIGKILL) for p in procs)):
        try:
            kill()
        except ProcessLookupError:
            pass
    return procs


def descendants(pid: int) -> list[int]:
    """Every process below ``pid``, from /proc (children first found, then theirs)."""
    parents: dict[int, int] = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                stat = (d / "stat").read_text()
            except OSError:
                continue
            parents[int(d.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    found, frontier = [], [pid]
    while frontier:
        kids = [p for p, pp in parents.items() if pp in frontier]
        found += kids
        frontier = kids
    return found


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _watch(parent: int, head: int) -> None:
    """Kill the head's tree once ``parent`` is gone; return when the head is gone."""
    while alive(head):
        if not alive(parent):
            kill_tree(head)
            return
        time.sleep(1.0)  # wall-clock: watches real processes


if __name__ == "__main__":  # the watchdog: ray_head.py PARENT_PID HEAD_PID
    _watch(int(sys.argv[1]), int(sys.argv[2]))
