"""`falcon-ray run | demo | queues | health`: the commands that need Ray."""

import click


def register(main: click.Group) -> None:
    """Attach the controller commands to the main CLI group."""
