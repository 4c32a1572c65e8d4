"""Modules written as Lightning's docs write them (tests/lightning_docs_task.py) train, evaluate,
predict and sweep with their two YAML files (tests/lightning_docs_conf/) and nothing else typed:
no task, no test=false, no task.watch. What a module lacks turns the matching step off in one
line; what it logs is what volt watches. The tests run what `python train.py` and
`python -m volt.eval` run in the test's process (run_volt_here), the slow sweep too."""

import csv
import json
from pathlib import Path

import pytest

from tests.in_process import RunHere

CONF = Path(__file__).parent / "lightning_docs_conf"
QUICK = [
    f"hydra.searchpath=[file://{CONF}]",
    "data=line",
    "trusted_targets=[tests]",  # the user's package, outside volt
    "trainer.max_epochs=3",
    "callbacks.progress_bar=null",
]


def test_a_module_logging_val_loss_trains_evaluates_and_predicts(
    run_volt_here: RunHere, tmp_path: Path
) -> None:
    trained = run_volt_here([*QUICK, "model=lit", "name=lit", "logger=csv"])
    assert trained.returncode == 0, trained.stderr[-3000:]
    said = trained.stdout + trained.stderr
    run_dir = tmp_path / "outputs" / "train" / "runs" / "lit"
    log = (run_dir / "train.log").read_text()
    # The default task watches val/acc; the module logs val_loss: that is followed, lower better.
    assert "watching val_loss (lower is better): LitRegressor logs no 'val/acc'" in log
    assert "no test after training: LitRegressor has no test_step" in log
    for not_for_it in (
        "is off:",
        "could not find the monitored key",
        "test_step() method",
        "Traceback",
    ):
        assert not_for_it not in said
    record = json.loads((run_dir / "metrics.json").read_text())
    metrics = record["metrics"]
    assert metrics["val_loss_best"] == min(metrics["val_loss"], metrics["val_loss_best"]) < 0.5
    assert "train_loss" in metrics and not any(k.startswith("test") for k in metrics)
    best = Path(record["best_checkpoint"])
    assert best.name.startswith("epoch") and f"val_loss{metrics['val_loss_best']:.4f}" in best.name

    evaluated = run_volt_here(
        [f"ckpt_path={best}", "trusted_targets=[tests]", "name=e"], "volt.eval"
    )
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]
    eval_dir = tmp_path / "outputs" / "eval" / "runs" / "e"
    said = (eval_dir / "eval.log").read_text()
    assert "LitRegressor has no test_step: evaluated on the validation set" in said
    assert "LeafSpec" not in evaluated.stderr
    eval_metrics = json.loads((eval_dir / "metrics.json").read_text())["metrics"]
    assert eval_metrics["val_loss"] == pytest.approx(metrics["val_loss_best"], rel=1e-5)

    predicted = run_volt_here(
        [f"ckpt_path={best}", "trusted_targets=[tests]", "mode=predict", "name=p"], "volt.eval"
    )
    assert predicted.returncode == 0, predicted.stderr[-3000:]
    with (tmp_path / "outputs" / "eval" / "runs" / "p" / "predictions.csv").open() as f:
        assert len(list(csv.DictReader(f))) == 128


def test_a_module_that_logs_nothing_has_a_loss_curve(
    run_volt_here: RunHere, tmp_path: Path
) -> None:
    trained = run_volt_here([*QUICK, "model=silent", "name=silent", "logger=csv"])
    assert trained.returncode == 0, trained.stderr[-3000:]
    assert "You passed in a `val_dataloader`" not in trained.stderr
    run_dir = tmp_path / "outputs" / "train" / "runs" / "silent"
    log = (run_dir / "train.log").read_text()
    assert "SilentRegressor has no validation_step (last.ckpt is kept)" in log
    assert "SilentRegressor logs no training loss: volt logs the loss" in log
    assert "could not find the monitored key" not in trained.stderr
    with next(run_dir.glob("csv/**/metrics.csv")).open() as f:
        curve = [float(row["train/loss"]) for row in csv.DictReader(f) if row.get("train/loss")]
    assert len(curve) >= 3 and curve[-1] < curve[0]
    record = json.loads((run_dir / "metrics.json").read_text())
    assert record["metrics"]["train/loss"] < curve[0]  # the last step's, logged or not

    # Nothing to predict with (no forward, no predict_step): one line, exit 2, nothing left.
    last = run_dir / "checkpoints" / "last.ckpt"
    predicted = run_volt_here(
        [f"ckpt_path={last}", "trusted_targets=[tests]", "mode=predict", "name=p"], "volt.eval"
    )
    assert predicted.returncode == 2
    assert predicted.stderr.strip().splitlines()[-1] == (
        "volt: config error: mode=predict: SilentRegressor has neither predict_step nor forward;"
        " add one (predict_step(self, batch, batch_idx) returning the predictions), or mode=test"
    )
    assert not (tmp_path / "outputs" / "eval" / "runs" / "p").exists()


@pytest.mark.slow  # a two-job sweep, about 30 s on 2 cores
def test_a_sweep_ranks_by_what_the_module_logs(run_volt_here: RunHere, tmp_path: Path) -> None:
    # task=plain watches val/loss, which this module logs as val_loss: the summary ranks by it.
    swept = run_volt_here(
        ["-m", *QUICK, "model=lit", "model.lr=0.01,0.05", "task=plain", "name=s", "logger=none"]
    )
    assert swept.returncode == 0, swept.stderr[-3000:]
    sweep = tmp_path / "outputs" / "train" / "multiruns" / "s"
    assert sorted(p.name for p in sweep.iterdir() if p.is_dir()) == [
        "0_model.lr=0.01",
        "1_model.lr=0.05",
    ]
    with (sweep / "summary.csv").open() as f:
        rows = list(csv.DictReader(f))
    best = [float(r["val_loss_best"]) for r in rows]
    assert len(best) == 2 and best == sorted(best)  # lower is better, best first


def test_a_search_whose_module_logs_no_watched_metric_fails_in_one_line(
    run_volt_here: RunHere, tmp_path: Path
) -> None:
    """The study ranks trials by task.watch (val/acc here): a trial whose module never logs it
    fails, in one line, rather than hand the study no value (or the loss it fell back to) and
    call itself completed; a search whose every trial failed ends in one line, exit 2."""
    searched = run_volt_here(
        [
            *("-m", "hydra/sweeper=volt_optuna", "hydra.sweeper.n_trials=1", "name=s"),
            *(*QUICK, "model=silent", "model.lr=choice(0.01,0.05)", "logger=none"),
        ]
    )
    assert searched.returncode == 2, searched.stderr[-3000:]
    why = (
        "task.watch='val/acc' is what the search optimises, and SilentRegressor logs no such"
        " metric (logged: train/loss); set task.watch=<one of them> and task.mode=max|min"
    )
    (job,) = (tmp_path / "outputs" / "train" / "multiruns" / "s").glob("0_*")
    assert json.loads((job / "metrics.json").read_text()) == {
        "status": "failed",
        "error": f"ConfigError: {why}",
    }
    assert json.loads((job / "run.json").read_text())["status"] == "failed"
    last = searched.stderr.strip().splitlines()[-1]
    assert last.startswith("volt: config error: no trial of study search finished")
    assert "Traceback" not in searched.stderr and "returned None" not in searched.stderr


@pytest.mark.parametrize("traceback", [False, True])
def test_lightning_refusing_the_module_is_one_line(
    run_volt_here: RunHere, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, traceback: bool
) -> None:
    """Lightning's MisconfigurationException at the fit's start: one line, exit 2, no run
    directory; the traceback only with VOLT_TRACEBACK=1, and never Hydra's hint."""
    if traceback:
        monkeypatch.setenv("VOLT_TRACEBACK", "1")
    refused = run_volt_here([*QUICK, "model=plateau", "name=plateau"])
    assert refused.returncode == 2, refused.stderr[-3000:]
    assert (
        refused.stderr.strip()
        .splitlines()[-1]
        .startswith(
            "volt: error: MisconfigurationException: `configure_optimizers` must include a monitor"
        )
    )
    assert ("Traceback" in refused.stderr) == traceback
    assert "HYDRA_FULL_ERROR" not in refused.stderr
    assert not (tmp_path / "outputs" / "train" / "runs" / "plateau").exists()


def test_a_defect_shows_its_traceback_then_one_line(run_volt_here: RunHere, tmp_path: Path) -> None:
    """An error no config value causes: its traceback (the user needs it), volt's one line,
    exit 1; Hydra's HYDRA_FULL_ERROR hint never (VOLT_TRACEBACK is volt's switch)."""
    failed = run_volt_here([*QUICK, "model=buggy", "name=buggy"])
    assert failed.returncode == 1, failed.stderr[-3000:]
    assert "Traceback" in failed.stderr and "HYDRA_FULL_ERROR" not in failed.stderr
    last = failed.stderr.strip().splitlines()[-1]
    assert last == "volt: error: RuntimeError: a bug in training_step"
    # It failed at its first step: nothing trained, nothing left behind.
    assert not (tmp_path / "outputs" / "train" / "runs" / "buggy").exists()
