"""`falcon-ray sim ...` commands (filled in by the simulated-fleet work)."""

import click


@click.group()
def sim() -> None:
    """The simulated fleet (GKE, Compute and Kubernetes APIs on loopback)."""
