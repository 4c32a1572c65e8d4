"""The SLURM path through Hydra's submitit launcher, run with submitit's local executor: each job
is a separate process started by submitit, and inside it volt's DDP launcher starts the ranks."""

import csv
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

Run = Callable[..., subprocess.CompletedProcess[str]]


def test_ddp_sweep_through_submitit_local(run_volt: Run, tmp_path: Path) -> None:
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher", reason="the slurm extra")
    result = run_volt(
        [
            "-m",
            "hydra/launcher=submitit_local",
            "trainer=ddp",
            "trainer.devices=2",
            "trainer.max_epochs=1",
            "model.optimizer.lr=1e-3,1e-2",
            "callbacks.progress_bar=null",
            "callbacks.model_summary=null",
            "+callbacks.lr_probe={_target_:tests.strategies.rank_probes.RecordLearningRate}",
        ],
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    (sweep,) = (tmp_path / "outputs" / "train" / "multiruns").iterdir()
    jobs = sorted(p for p in sweep.iterdir() if p.is_dir() and not p.name.startswith("."))
    assert len(jobs) == 2
    for job, lr in zip(jobs, (1e-3, 1e-2), strict=True):
        assert (job / "train_rank1.log").is_file()
        used = {float((job / f"lr_rank{rank}.txt").read_text()) for rank in (0, 1)}
        assert used == {lr}, job.name
    with (sweep / "summary.csv").open() as f:
        assert [row["status"] for row in csv.DictReader(f)] == ["completed", "completed"]
