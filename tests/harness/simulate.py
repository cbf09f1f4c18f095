"""Tasks in the demo's format for ``falcon-ray simulate``'s tests (``devtools.simulate.driver``)."""

from __future__ import annotations


def sim_task(i: int, submit_at: float, run_s: float, topology: str = "2x2", abort_at: float | None = None, **spec) -> dict:
    """Task ``i``: a v6e ``topology`` slice submitted at ``submit_at`` (aborted at
    ``abort_at``), whose run lasts ``run_s`` on the simulated fleet; ``spec`` adds or
    replaces spec fields."""
    return {
        "name": f"t{i}",
        "actor": ("alice", "bob", "carol")[i % 3],
        "submit_at": submit_at,
        "abort_at": abort_at,
        "spec": {
            "tpu_type": "v6e",
            "topology": topology,
            "image": "us-docker.pkg.dev/p/r/train:1",
            "command": ["python", "train.py"],
            "env": {"FALCON_SIM_RUN_SECONDS": str(int(run_s))},
            "timeout_seconds": int(run_s) + 3600,
            **spec,
        },
    }
