"""`python -m falcon_ray.sim serve` / `falcon-ray sim serve` as a real subprocess."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from falcon_ray.sim.cli import sim
from tests.harness.sim import SIM_TEST_FLEET

REPO = Path(__file__).resolve().parents[2]


def serve(*args: str, command: list[str] | None = None) -> subprocess.Popen:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen(
        [*(command or [sys.executable, "-m", "falcon_ray.sim"]), "serve", *args],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@pytest.mark.parametrize("stop_signal", [signal.SIGTERM, signal.SIGINT])
def test_serve_prints_the_endpoints_first_and_stops_on_signal(tmp_path, stop_signal):
    fleet_file = tmp_path / "fleet.yaml"
    fleet_file.write_text(yaml.safe_dump(SIM_TEST_FLEET))
    proc = serve("--fleet", str(fleet_file), "--port", "0")
    try:
        first = proc.stdout.readline()
        endpoints = json.loads(first)
        assert set(endpoints) == {"gke", "compute", "metadata", "stats", "clusters"}
        assert set(endpoints["clusters"]) == {"sim-a", "sim-b", "sim-k"}
        assert endpoints["clusters"]["sim-a"]["project"] == "proj-sim-a"
        stats = json.loads(urllib.request.urlopen(endpoints["stats"], timeout=5).read())
        assert stats["clusters"]["sim-b"]["chips"] == 8
        with urllib.request.urlopen(
            endpoints["clusters"]["sim-k"]["kubernetes"] + "/healthz", timeout=5
        ) as r:
            assert r.read() == b"ok"
        proc.send_signal(stop_signal)
        assert proc.wait(timeout=15) == 0  # wall-clock: a real `falcon-ray sim` process exiting on a signal
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_serve_without_a_fleet_uses_the_default_fleet():
    proc = serve("--port", "0")
    try:
        endpoints = json.loads(proc.stdout.readline())
        assert set(endpoints["clusters"]) == {"edge-a", "edge-b", "edge-r"}
        proc.terminate()
        assert proc.wait(timeout=15) == 0  # wall-clock: a real `falcon-ray sim` process exiting on a signal
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_the_falcon_ray_console_script_serves_too():
    script = Path(sys.executable).with_name("falcon-ray")
    if not script.exists():
        pytest.skip("the falcon-ray console script is not installed in this environment")
    proc = serve("--port", "0", command=[str(script), "sim"])
    try:
        endpoints = json.loads(proc.stdout.readline())
        assert endpoints["stats"].startswith("http://127.0.0.1:")
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=15) == 0  # wall-clock: a real `falcon-ray sim` process exiting on a signal
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_a_bad_fleet_file_exits_2_with_the_reason(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("clusters:\n  - name: x\n    project: p\n    location: l\n    chips: lots\n")
    result = CliRunner().invoke(sim, ["serve", "--fleet", str(bad)])
    assert result.exit_code == 2
    assert "clusters[0].chips" in result.output
    result = CliRunner().invoke(sim, ["check", str(bad)])
    assert result.exit_code == 2


def test_check_summarises_a_valid_fleet(tmp_path):
    good = tmp_path / "good.yaml"
    good.write_text(yaml.safe_dump(SIM_TEST_FLEET))
    result = CliRunner().invoke(sim, ["check", str(good)])
    assert result.exit_code == 0 and "3 cluster(s): sim-a, sim-b, sim-k" in result.output


def test_sim_group_is_registered_on_the_main_cli():
    main_cli = pytest.importorskip("falcon_ray.cli")
    result = CliRunner().invoke(main_cli.main, ["sim", "--help"])
    assert result.exit_code == 0 and "serve" in result.output
