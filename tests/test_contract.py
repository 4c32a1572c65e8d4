"""The build contract: a LightningModule and LightningDataModule of the user's own, plain Lightning
(tests/user_task.py), train, resume, evaluate and predict through volt's entry points with nothing
volt-specific but their config files (tests/user_task_conf/) and `task=plain`. The default
suite's run what `python train.py` and `python -m volt.eval` run in the test's process
(run_volt_here), as do the toggles' (slow), but for DDP's ranks, which are processes."""

import csv
import json
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.in_process import RunHere
from volt.rebuild import load_trained_module

Run = Callable[..., subprocess.CompletedProcess[str]]
USER_CONF = Path(__file__).parent / "user_task_conf"
USER_TASK = [
    f"hydra.searchpath=[file://{USER_CONF}]",  # where a user's own conf/ files would be
    "model=line",
    "data=line",
    "task=plain",
    "trusted_targets=[tests]",  # the user's package
    "trainer.max_epochs=3",
    "callbacks.progress_bar=null",
    "callbacks.model_summary=null",
]


def only(directory: Path) -> Path:
    (child,) = directory.iterdir()
    return child


def test_a_plain_task_clips_gradients_with_a_fused_optimiser_under_bf16_mixed(
    run_volt_here: RunHere, tmp_path: Path
) -> None:
    # Lightning 2.6.6 alone refuses this pair though bf16 has no grad scaler (its issue #21435);
    # volt's build_trainer lets any module through, not only volt's own.
    overrides = ["model.fused=true", "precision=bf16-mixed", "trainer.gradient_clip_val=0.5"]
    trained = run_volt_here([*USER_TASK, *overrides, "trainer.max_epochs=1", "test=false"])
    assert trained.returncode == 0, trained.stderr[-3000:]
    assert "does not allow for gradient clipping" not in trained.stderr


def test_a_plain_lightning_task_trains_evaluates_and_predicts(
    run_volt_here: RunHere, tmp_path: Path
) -> None:
    trained = run_volt_here([*USER_TASK, "name=line"])
    assert trained.returncode == 0, trained.stderr[-3000:]
    run_dir = tmp_path / "outputs" / "train" / "runs" / "line"
    record = json.loads((run_dir / "metrics.json").read_text())
    metrics = record["metrics"]
    # The watched metric (task=plain: val/loss, min) names the best checkpoint and its best value.
    assert metrics["val/loss_best"] == min(metrics["val/loss_best"], metrics["val/loss"])
    assert metrics["test/loss"] < 0.5  # y = 3x - 1 learnt: the variance of y is 3
    best = Path(record["best_checkpoint"])
    assert best.name.startswith("epoch") and "val_loss" in best.name
    stored = torch.load(best, map_location="cpu", weights_only=True)
    assert stored["volt_config"]["model"]["_target_"] == "tests.user_task.LineRegressor"

    again = run_volt_here([*USER_TASK, "name=line"])  # a finished named run is not trained again
    assert again.returncode == 0 and "already finished" in again.stdout + again.stderr

    evaluated = run_volt_here(
        [f"ckpt_path={best}", "trusted_targets=[tests]", "mode=predict"], module="volt.eval"
    )
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]
    eval_dir = only(tmp_path / "outputs" / "eval" / "runs")
    eval_metrics = json.loads((eval_dir / "metrics.json").read_text())["metrics"]
    assert eval_metrics["test/loss"] == pytest.approx(metrics["test/loss"], rel=1e-6)
    with (eval_dir / "predictions.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 128 and set(rows[0]) == {"index", "prediction"}
    assert sorted(int(r["index"]) for r in rows) == list(range(128))

    # The module alone, rebuilt from the checkpoint, predicts what eval wrote.
    module, datamodule = load_trained_module(best, trusted=["tests"])
    datamodule.setup("predict")
    x = next(iter(datamodule.predict_dataloader()))[0]
    expected = [float(r["prediction"]) for r in rows[: len(x)]]
    assert module(x).squeeze(-1).tolist() == pytest.approx(expected, rel=1e-5)

    # New data named on the command line: predicted on, not tested (it may have no labels).
    named = run_volt_here(
        [
            f"hydra.searchpath=[file://{USER_CONF}]",
            f"ckpt_path={best}",
            "trusted_targets=[tests]",
            "mode=predict",
            "data=line",
            "data.size=64",
            "name=named-data",
        ],
        module="volt.eval",
    )
    assert named.returncode == 0, named.stderr[-3000:]
    named_dir = tmp_path / "outputs" / "eval" / "runs" / "named-data"
    assert json.loads((named_dir / "metrics.json").read_text())["metrics"] == {}
    assert len((named_dir / "predictions.csv").read_text().splitlines()) == 1 + 16


def test_volt_refuses_a_from_data_attribute_the_data_module_lacks(run_volt_here: RunHere) -> None:
    """An entry for an argument the model takes (LineRegressor's `hidden`, left out of its config:
    a config that sets what from_data fills is refused before this): the data module must have
    the attribute."""
    result = run_volt_here([*USER_TASK, "+task.from_data={hidden:num_classes}", "~model.hidden"])
    assert result.returncode == 2
    assert "task.from_data.hidden='num_classes': LineData has no attribute" in result.stderr


def test_from_data_skips_what_the_model_does_not_take(compose_config: Callable[..., Any]) -> None:
    """The default task's entries (net.in_shape, num_classes) against a model of the user's own
    without them: left out, so the model builds as configured."""
    from tests.user_task import LineData
    from volt.build import arguments_from_data

    cfg = compose_config("train", [f"hydra.searchpath=[file://{USER_CONF}]", "model=line"])
    wanted = {"net.in_shape": "input_shape", "num_classes": "num_classes", "width": "size"}
    assert arguments_from_data(wanted, LineData(), cfg.model) == {}
    assert arguments_from_data({"hidden": "size"}, LineData(size=7), cfg.model) == {"hidden": 7}


@pytest.mark.slow
@pytest.mark.parametrize(
    "toggles",
    [
        ["trainer=ddp", "trainer.devices=2"],  # two gloo processes on the CPU
        ["trainer=cpu", "precision=bf16-mixed", "compile=default"],
        ["trainer=cpu", "tune=batch_size"],
        ["trainer=dp"],  # one process; on the CPU, or with fewer than two GPUs, one device
    ],
    ids=["ddp", "bf16-compiled", "tune", "dp"],
)
def test_a_plain_lightning_task_takes_every_toggle(
    toggles: list[str], run_volt: Run, run_volt_here: RunHere, tmp_path: Path
) -> None:
    args = [*USER_TASK, "trainer.max_epochs=1", *toggles]
    result = run_volt(args, timeout=400) if "trainer=ddp" in toggles else run_volt_here(args)
    assert result.returncode == 0, result.stderr[-3000:]
    run_dir = only(tmp_path / "outputs" / "train" / "runs")
    assert json.loads((run_dir / "metrics.json").read_text())["metrics"]["test/loss"] < 3.0
