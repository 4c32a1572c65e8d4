"""Sweeps that fail part-way and sweeps that are run again: each `python train.py -m ...` run
through its entry in the test's process (conftest's run_volt_here), as Hydra's basic launcher runs
a sweep's jobs one after another in one process anyway."""

import csv
import json
import shutil
from pathlib import Path

from tests.in_process import RunHere

QUIET = ["trainer.max_epochs=1", "callbacks.progress_bar=null", "callbacks.model_summary=null"]


def summary(sweep: Path) -> list[dict[str, str]]:
    with (sweep / "summary.csv").open() as f:
        return list(csv.DictReader(f))


def test_a_failing_job_leaves_the_others_and_is_reported(
    run_volt_here: RunHere, tmp_path: Path
) -> None:
    result = run_volt_here(["-m", "data.batch_size=0,64", *QUIET])
    assert result.returncode != 0  # the sweep as a whole did not succeed
    (sweep,) = (tmp_path / "outputs" / "train" / "multiruns").iterdir()
    rows = summary(sweep)
    assert [(r["job"], r["status"]) for r in rows] == [("1", "completed"), ("0", "failed")]
    assert "data.batch_size=0 is not valid" in rows[1]["error"]
    assert float(rows[0]["test/acc"]) > 0.5


def test_rerunning_a_named_sweep_skips_finished_jobs_and_redoes_the_rest(
    run_volt_here: RunHere, tmp_path: Path
) -> None:
    args = ["-m", "name=grid", "data.batch_size=32,64", *QUIET]
    assert run_volt_here(args).returncode == 0
    sweep = tmp_path / "outputs" / "train" / "multiruns" / "grid"
    finished, killed = sorted(p for p in sweep.iterdir() if p.is_dir())
    kept = (finished / "checkpoints" / "last.ckpt").stat().st_mtime_ns
    # as if job 1 had been killed before it finished
    (killed / "metrics.json").unlink()
    shutil.rmtree(killed / "checkpoints")
    result = run_volt_here(args)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "already finished" in result.stdout + result.stderr
    assert (finished / "checkpoints" / "last.ckpt").stat().st_mtime_ns == kept
    assert json.loads((killed / "metrics.json").read_text())["status"] == "completed"
    assert [r["status"] for r in summary(sweep)] == ["completed", "completed"]
