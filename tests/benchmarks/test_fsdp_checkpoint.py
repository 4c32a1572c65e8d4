"""benchmarks/fsdp_checkpoint.py at its CPU size: two gloo ranks, both layouts, every column."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from volt.config import PROJECT_ROOT


@pytest.mark.slow
def test_both_layouts_are_timed_on_two_cpu_ranks(tmp_path: Path) -> None:
    command = [sys.executable, "benchmarks/fsdp_checkpoint.py", "--outputs", str(tmp_path)]
    command += ["--repeats", "1"]
    done = subprocess.run(command, cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    rows = [line.split() for line in done.stdout.splitlines()]
    rows = [row for row in rows if row and row[0] in ("sharded", "full") and row[1].isdigit()]
    assert [(row[0], row[1]) for row in rows] == [
        ("sharded", "0"), ("sharded", "1"), ("full", "0"), ("full", "1"),
    ]  # fmt: skip
    for layout, _, save_s, collect_s, host_gib, floor_s, floor_gib, sync in rows:
        # Seconds and GiB at two decimals: a tiny model's may print as 0.00.
        assert min(map(float, (save_s, collect_s, host_gib, floor_s, floor_gib))) >= 0
        # DCP's async save is timed for the sharded layout only: "blocking/total" seconds.
        assert (sync != "-") is (layout == "sharded")
    sharded = tmp_path / "train" / "runs" / "bench_sharded"
    records = sorted(sharded.glob("saves_rank*.json"))
    assert [p.name for p in records] == ["saves_rank0.json", "saves_rank1.json"]
    for record in map(json.loads, (p.read_text() for p in records)):
        assert [save["seconds"] > 0 for save in record["saves"]] == [True]  # --repeats 1
        assert record["floor"]["seconds"] > 0
