"""The SLURM path through Hydra's submitit launcher, run with submitit's local executor: the sweep
runs in the test's process, each job in a separate process started by submitit; under
trainer=ddp it starts its own ranks."""

import csv
from pathlib import Path

import pytest

from tests.in_process import RunHere

PROBE = "+callbacks.lr_probe={_target_:tests.strategies.rank_probes.RecordLearningRate}"


# The local executor starts a sweep's jobs at the same time; two DDP jobs on one machine then race
# for a free rendezvous port (seen once: EADDRINUSE), so the DDP case sweeps a single job. That
# case is `make test-slow`'s (two fresh interpreters: the job and its second rank): the default
# suite has the launcher in `two-jobs` and DDP ranks in a sweep's jobs in
# tests/strategies/test_ddp.py's multirun test.
@pytest.mark.parametrize(
    ("trainer", "lrs"),
    [
        pytest.param(["trainer=ddp", "trainer.devices=2"], (1e-3,), marks=pytest.mark.slow),
        (["trainer=cpu"], (1e-3, 1e-2)),
    ],
    ids=["ddp", "two-jobs"],
)
def test_sweep_through_submitit_local(
    trainer: list[str], lrs: tuple[float, ...], run_volt_here: RunHere, tmp_path: Path
) -> None:
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher", reason="the slurm extra")
    ranks = (0, 1) if "trainer=ddp" in trainer else (0,)
    # The sweep's own process is this one (train.py's entry); submitit starts each job's.
    result = run_volt_here(
        [
            "-m",
            "hydra/launcher=submitit_local",
            *trainer,
            "trainer.max_epochs=1",
            f"model.optimizer.lr={','.join(map(str, lrs))}",
            "callbacks.progress_bar=null",
            "callbacks.model_summary=null",
            PROBE,
            "trusted_targets=[tests]",
        ],
    )
    assert result.returncode == 0, result.stderr[-3000:]
    (sweep,) = (tmp_path / "outputs" / "train" / "multiruns").iterdir()
    jobs = sorted(p for p in sweep.iterdir() if p.is_dir() and not p.name.startswith("."))
    assert len(jobs) == len(lrs)
    if len(lrs) > 1:
        # Named in submitit's job processes by what the sweep varies, from the environment they
        # inherit (volt.config.job_dirname), not by the overrides every job shares.
        assert [p.name for p in jobs] == [
            f"{i}_model.optimizer.lr={lr}" for i, lr in enumerate(lrs)
        ]
    for job, lr in zip(jobs, lrs, strict=True):
        used = {float((job / f"lr_rank{rank}.txt").read_text()) for rank in ranks}
        assert used == {lr}, job.name
    with (sweep / "summary.csv").open() as f:
        assert [row["status"] for row in csv.DictReader(f)] == ["completed"] * len(lrs)
