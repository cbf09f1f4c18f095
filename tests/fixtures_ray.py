"""pytest fixtures: ray."""
