"""A real search on digits in a subprocess: pruned trials, a kill mid-search, the same command
continuing it, and a larger n_trials adding trials (those two in the test's process: the kill
needs a process, what follows only the result)."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest
import yaml
from optuna.trial import TrialState

from tests.in_process import RunHere
from volt.config import PROJECT_ROOT
from volt.sweeps.pruning import open_journal

TINY_LR, GOOD_LR = 1e-06, 0.01
# RandomSampler(seed=0) draws 0.01, 1e-06, 0.01 for the first three trials (Optuna 4-5): a pruned
# trial, and a good one running when the search is killed.
SEARCH = [
    "-m",
    "name=search",
    "hydra/sweeper=volt_optuna",
    f"model.optimizer.lr={TINY_LR},{GOOD_LR}",
    "hydra.sweeper.sampler={_target_:optuna.samplers.RandomSampler,seed:0}",
    # lr=1e-6 stays near chance (10 classes); lr=0.01 is past 0.5 after one epoch of 5 batches.
    "hydra.sweeper.pruner={_target_:optuna.pruners.ThresholdPruner,lower:0.3}",
    "trainer.max_epochs=3",
    "+trainer.limit_train_batches=5",
    "+trainer.limit_val_batches=2",
    "test=false",
    "callbacks.progress_bar=null",
    "callbacks.model_summary=null",
]


def study_of(sweep: Path) -> optuna.Study:
    return optuna.load_study(study_name="search", storage=open_journal(sweep))


def job_dir(sweep: Path, number: int) -> Path:
    (job,) = sweep.glob(f"{number}_*")
    return job


def start_and_kill_during_trial(args: list[str], sweep: Path, number: int) -> None:
    """Run the search until trial `number` has saved its first checkpoint, then kill every
    process of it at once (SIGKILL: nothing gets to tidy up)."""
    command = [sys.executable, "train.py", *args]
    with subprocess.Popen(
        command, cwd=PROJECT_ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        start_new_session=True,
    ) as process:  # fmt: skip
        deadline = time.monotonic() + 90
        try:
            while not list(sweep.glob(f"{number}_*/checkpoints/last.ckpt")):
                assert process.poll() is None, (
                    process.stderr.read()[-3000:] if process.stderr else ""
                )
                assert time.monotonic() < deadline, "trial never saved a checkpoint"
                time.sleep(0.02)
        finally:
            os.killpg(process.pid, signal.SIGKILL)


@pytest.mark.slow
def test_a_killed_search_continues_and_prunes(run_volt_here: RunHere, tmp_path: Path) -> None:
    args = [*SEARCH, "hydra.sweeper.n_trials=3", f"paths.outputs_dir={tmp_path / 'outputs'}"]
    sweep = tmp_path / "outputs" / "train" / "multiruns" / "search"
    start_and_kill_during_trial(args, sweep, number=2)
    study = study_of(sweep)
    states = [t.state for t in study.trials]
    assert states == [TrialState.COMPLETE, TrialState.PRUNED, TrialState.RUNNING]
    interrupted = study.trials[2].params
    assert not (job_dir(sweep, 2) / "metrics.json").exists()
    on_demand = subprocess.run(
        [sys.executable, "-m", "volt.sweeps.summary", str(sweep)],
        capture_output=True, text=True, cwd=PROJECT_ROOT, check=True,
    )  # fmt: skip
    assert "interrupted" in on_demand.stdout

    # The same command: trial 2 again, in its own directory, from its checkpoint.
    first_done = (job_dir(sweep, 0) / "metrics.json").stat().st_mtime_ns
    result = run_volt_here(args[:-1])
    assert result.returncode == 0, result.stderr[-3000:]
    assert "resuming run search" in result.stdout + result.stderr
    study = study_of(sweep)
    assert [t.state for t in study.trials] == [*states[:2], TrialState.COMPLETE]
    assert study.trials[2].params == interrupted
    assert len(list(sweep.glob("*_*/.hydra"))) == 3

    # More trials: one more job, the finished ones untouched.
    result = run_volt_here([*args[:-2], "hydra.sweeper.n_trials=4"])
    assert result.returncode == 0, result.stderr[-3000:]
    study = study_of(sweep)
    assert len(study.trials) == 4 and study.trials[3].state != TrialState.RUNNING
    assert (job_dir(sweep, 0) / "metrics.json").stat().st_mtime_ns == first_done

    # Pruned exactly when the learning rate is too small, and the job says so.
    for trial in study.trials:
        pruned = trial.params["model.optimizer.lr"] == TINY_LR
        assert trial.state == (TrialState.PRUNED if pruned else TrialState.COMPLETE)
        record = json.loads((job_dir(sweep, trial.number) / "metrics.json").read_text())
        assert record["status"] == ("pruned" if pruned else "completed")
        if pruned:  # stopped after the first validation, with no test run
            assert not any(k.startswith("test/") for k in record["metrics"])
            assert list(trial.intermediate_values) == [0]
    best = yaml.safe_load((sweep / "best.yaml").read_text())
    completed = [t for t in study.trials if t.state == TrialState.COMPLETE]
    assert best["value"] == max(t.value for t in completed)
    assert best["params"] == {"model.optimizer.lr": GOOD_LR}
    pruned = 4 - len(completed)
    assert best["trials"] == {"running": 0, "complete": 4 - pruned, "pruned": pruned, "fail": 0,
                              "waiting": 0}  # fmt: skip
    # The table's rows (under it, a line names the overrides every job shares)
    rows = [r for r in (sweep / "summary.md").read_text().splitlines()[2:] if r.startswith("|")]
    assert len(rows) == 4 and all("| completed |" in r for r in rows[: len(completed)])
    assert (sweep / "summary.csv").is_file()
    assert (sweep / "search.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.slow
def test_the_gpt_search_runs_at_a_tiny_size(run_volt_here: RunHere, tmp_path: Path) -> None:
    """hparams_search=gpt_bytes_tiny_optuna as shipped, shrunk: two trials of 60 steps, the second
    compared with the first at each validation (a minimising study: val/bpb)."""
    result = run_volt_here(
        [
            "hparams_search=gpt_bytes_tiny_optuna",
            "name=gpt",
            "hydra.sweeper.n_trials=2",
            "hydra.sweeper.pruner={_target_:optuna.pruners.MedianPruner,n_startup_trials:1}",
            "trainer=cpu",
            "trainer.max_steps=60",  # past the longest warm-up searched (50)
            "data.steps_per_epoch=30",
            "trainer.limit_val_batches=2",
            "model.net.n_layer=1",
            "model.net.n_embd=32",
            "test=false",
            "callbacks.text_samples=null",
            "callbacks.progress_bar=null",
            "callbacks.model_summary=null",
        ]
    )
    assert result.returncode == 0, result.stderr[-3000:]
    sweep = tmp_path / "outputs" / "train" / "multiruns" / "gpt"
    study = optuna.load_study(study_name="gpt_bytes_tiny", storage=open_journal(sweep))
    assert study.direction == optuna.study.StudyDirection.MINIMIZE
    assert len(study.trials) == 2 and study.trials[0].state == TrialState.COMPLETE
    assert sorted(study.trials[0].intermediate_values) == [0, 1]  # after steps 30 and 60
    assert set(study.trials[0].params) == {
        "model.optimizer.lr",
        "model.weight_decay",
        "model.scheduler.warmup_steps",
    }
    best = yaml.safe_load((sweep / "best.yaml").read_text())
    assert best["objective"] == "val/bpb_best" and best["direction"] == "minimize"
    rows = (sweep / "summary.csv").read_text().splitlines()
    assert len(rows) == 3 and "val/bpb_best" in rows[0]
