"""`falcon-ray sim ...` commands (also `python -m falcon_ray.sim ...`).

Contract
--------
``falcon-ray sim serve [--fleet FLEET.yaml] [--host H] [--port P]`` starts a
:class:`~falcon_ray.sim.server.SimFleet` in the foreground. Its FIRST line on
stdout is one JSON object with the endpoints (the same dict as
``SimFleet.endpoints``), flushed at once so a parent process can read it; then
it serves until SIGINT or SIGTERM and exits 0. A bad fleet file exits 2 with
the validation message on stderr; a listener that cannot bind exits 1.
``falcon-ray sim check FLEET.yaml`` only
validates a fleet file.
"""

from __future__ import annotations

import json
import signal
import sys
import threading

import click

from .fleet import FleetConfigError, load_fleet


@click.group()
def sim() -> None:
    """The simulated fleet (GKE, Compute, metadata and Kubernetes APIs on loopback)."""


@sim.command()
@click.option(
    "--fleet",
    "fleet_path",
    type=click.Path(dir_okay=False),
    default=None,
    help="Fleet YAML file (default: the built-in two-cluster fleet).",
)
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to bind.")
@click.option(
    "--port",
    default=0,
    show_default=True,
    type=click.IntRange(0, 65535),
    help="Port of the GKE/Compute/metadata/control API (0: any free port).",
)
def serve(fleet_path: str | None, host: str, port: int) -> None:
    """Serve the simulated fleet until SIGINT/SIGTERM; the first stdout line is the endpoints JSON."""
    from .server import SimFleet

    try:
        config = load_fleet(fleet_path)
    except FleetConfigError as e:
        click.echo(str(e), err=True)
        sys.exit(2)
    stop = threading.Event()

    def on_signal(signum: int, frame: object) -> None:
        stop.set()

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    fleet = SimFleet(config, host=host, port=port)
    try:
        try:
            endpoints = fleet.start()
        except RuntimeError as e:  # e.g. the port is taken
            click.echo(str(e), err=True)
            sys.exit(1)
        sys.stdout.write(json.dumps(endpoints) + "\n")
        sys.stdout.flush()
        while not stop.wait(0.5):
            pass
    finally:
        fleet.stop()
        for s, handler in previous.items():
            signal.signal(s, handler)


@sim.command()
@click.argument("fleet_path", type=click.Path(dir_okay=False))
def check(fleet_path: str) -> None:
    """Validate a fleet file and print a one-line summary."""
    try:
        config = load_fleet(fleet_path)
    except FleetConfigError as e:
        click.echo(str(e), err=True)
        sys.exit(2)
    names = ", ".join(c.name for c in config.clusters)
    click.echo(f"ok: {len(config.clusters)} cluster(s): {names}")
