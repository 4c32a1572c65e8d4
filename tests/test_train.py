"""A real (short) training run on CPU, its checkpoint, its evaluation and its TensorBoard events."""

import json
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from hydra.core.global_hydra import GlobalHydra
from omegaconf import DictConfig, OmegaConf
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from tests.in_process import FAST, compose_in
from volt.evaluation import evaluate
from volt.training import train


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    """One run for the four tests that read it (none writes into it)."""
    folder = tmp_path_factory.mktemp("trained")
    cfg = compose_in(folder, "train", [*FAST, "trainer.max_epochs=3", "logger=many"])
    GlobalHydra.instance().clear()
    metrics = train(cfg)
    return Path(cfg.paths.output_dir), metrics


def test_run_directory_holds_the_run(trained: tuple[Path, dict]) -> None:
    run_dir, metrics = trained
    assert metrics["test/acc"] > 0.9
    assert {"val/acc", "val/acc_best", "test/loss"} <= metrics.keys()
    record = json.loads((run_dir / "metrics.json").read_text())
    assert record["metrics"] == pytest.approx(metrics)
    assert (run_dir / "config_resolved.yaml").is_file()
    assert (run_dir / "checkpoints" / "last.ckpt").is_file()
    assert len(list((run_dir / "checkpoints").glob("epoch*.ckpt"))) == 1


def test_checkpoints_load_with_weights_only(trained: tuple[Path, dict]) -> None:
    run_dir, _ = trained
    for path in (run_dir / "checkpoints").glob("*.ckpt"):
        checkpoint = torch.load(path, map_location="cpu", weights_only=True)
        assert any(k.startswith("net.") for k in checkpoint["state_dict"])
        assert checkpoint["volt_config"]["model"]["net"]["_target_"] == "volt.nets.mlp.MLP"
    last = torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)
    assert last["epoch"] == 2  # rewritten after every epoch, not only when the best changes


def test_eval_reproduces_test_metrics_exactly(
    trained: tuple[Path, dict], compose_config: Callable[..., DictConfig]
) -> None:
    run_dir, metrics = trained
    best = json.loads((run_dir / "metrics.json").read_text())["best_checkpoint"]
    cfg = compose_config("eval", [f"ckpt_path={best}", "mode=predict"])
    evaluated = evaluate(cfg)
    assert evaluated["test/acc"] == metrics["test/acc"]
    assert evaluated["test/loss"] == metrics["test/loss"]
    rows = (Path(cfg.paths.output_dir) / "predictions.csv").read_text().splitlines()
    assert rows[0] == "index,pred,prob,target"  # the keys predict_step returns
    correct = sum(r.split(",")[1] == r.split(",")[3] for r in rows[1:])
    assert correct / (len(rows) - 1) == pytest.approx(metrics["test/acc"])


def test_tensorboard_has_scalars_and_final_hparams(trained: tuple[Path, dict]) -> None:
    run_dir, metrics = trained
    events = EventAccumulator(str(run_dir), size_guidance={"tensors": 0})
    events.Reload()
    scalars = set(events.Tags()["scalars"])
    assert {"train/loss", "train/acc", "val/acc", "val/loss", "val/acc_best", "test/acc"} <= scalars
    assert any(t.startswith("lr-") for t in scalars)
    # The hparams plugin's session record lists the run's real final metrics.
    plugin = events.PluginTagToContent("hparams")
    assert "_hparams_/session_start_info" in plugin
    from tensorboard.plugins.hparams import plugin_data_pb2

    start = plugin_data_pb2.HParamsPluginData.FromString(plugin["_hparams_/session_start_info"])
    assert start.session_start_info.hparams["model.optimizer.lr"].number_value == pytest.approx(
        0.003
    )
    assert start.session_start_info.hparams["status"].string_value == "completed"
    # The plugin reads the metrics from the run's scalars: test/acc once, at the last step.
    test_acc = events.Scalars("test/acc")
    assert [e.value for e in test_acc] == [pytest.approx(metrics["test/acc"])]
    last = torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)
    assert test_acc[0].step == last["global_step"]


def test_a_run_cut_short_by_max_steps_mid_epoch_ends_and_tests(
    compose_config: Callable[..., DictConfig], fast: list[str]
) -> None:
    """No validation runs at the end of an epoch cut short, so early stopping, judged there by
    Lightning's default, raised "conditioned on metric val/acc which is not available"."""
    cfg = compose_config("train", [*fast, "trainer.max_steps=3", "logger=none"])
    metrics = train(cfg)
    assert "test/acc" in metrics


def test_the_precision_used_is_recorded(
    compose_config: Callable[..., DictConfig], fast: list[str]
) -> None:
    """16-mixed on a CPU runs bf16-mixed (Lightning's choice): the records say what ran."""
    cfg = compose_config(
        "train", [*fast, "trainer.max_epochs=1", "precision=16-mixed", "test=false"]
    )
    if torch.cuda.is_available():
        pytest.skip("on a GPU 16-mixed runs as asked")
    train(cfg)
    run_dir = Path(cfg.paths.output_dir)
    recorded = OmegaConf.load(run_dir / "config_resolved.yaml")
    assert recorded.precision == recorded.trainer.precision == "bf16-mixed"
    stored = torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)
    assert stored["volt_config"]["precision"] == "bf16-mixed"
    assert stored["volt_config"]["trainer"]["precision"] == "bf16-mixed"
