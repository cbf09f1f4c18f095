"""`falcon-ray bench --smoke --json` runs and its JSON has every figure of issues 11 and 25.

The smoke size runs every part once at its smallest (``bench.SIZES``): the figures' shape is
what this proves; their values are `make bench`'s (docs/bench/)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest


@pytest.mark.timeout(900)  # the subprocess's own limit: about a minute alone, a few beside the suite's other workers
def test_bench_smoke_has_every_figure(tmp_path):
    out = tmp_path / "bench.json"
    proc = subprocess.run(
        [str(Path(sys.executable).parent / "falcon-ray"), "bench", "--smoke", "--json", "--out", str(out)],
        capture_output=True, text=True, timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    doc = json.loads(out.read_text())
    assert doc["size"] == "smoke"
    assert doc["lifecycle"]["statements_per_task"] is not None
    mixed = doc["lifecycle_mixed"]  # issue 25: the mixed workload, with where the statements go
    assert mixed["statements_per_task"] is not None and all(r["done"] for r in mixed["runs"]), mixed["runs"]
    assert {"SELECT", "UPDATE", "INSERT"} <= set(mixed["by_kind"]) and mixed["by_method"] and mixed["by_role"]
    assert "nothing_live" in doc["idle"] and "poller_per_s" in doc["idle_queues"]
    assert doc["handover"]["runs"] and "ratio_largest_to_100" in doc["handover"]
    assert "rows_per_dispatch" in doc["messages"]
    assert doc["intake"]["seconds"] > 0
    assert doc["scale"]["queues"] == 104 and "step_p99_ms" in doc["scale"]
    assert doc["actors_rss_mb"]
