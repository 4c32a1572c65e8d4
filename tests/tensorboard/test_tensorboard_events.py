"""A real (tiny) training run's TensorBoard event files, read back with TensorBoard's own
EventAccumulator: where they lie, every curve without a false point, the hparams record, the
images, the gradient norm, the learning rate and the throughput."""

from collections.abc import Callable
from pathlib import Path

import pytest
from omegaconf import DictConfig
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.plugins.hparams import api_pb2, metadata

from volt.training import train

EPOCHS, BATCHES = 2, 6
SHORT = [
    f"trainer.max_epochs={EPOCHS}",
    f"trainer.limit_train_batches={BATCHES}",
    "trainer.limit_val_batches=2",
    "trainer.limit_test_batches=2",
    "trainer.log_every_n_steps=2",
    "callbacks.progress_bar=null",
    "callbacks.model_summary=null",
]


@pytest.fixture
def run(compose_config: Callable[..., DictConfig]) -> tuple[Path, dict[str, float]]:
    cfg = compose_config("train", SHORT)
    metrics = train(cfg)
    return Path(cfg.paths.output_dir), metrics


def test_a_run_reads_in_tensorboard_as_it_happened(run: tuple[Path, dict[str, float]]) -> None:
    run_dir, metrics = run
    # The run's own directory is the TensorBoard run: named by it under `--logdir outputs`.
    assert list(run_dir.glob("events.out.tfevents.*"))
    assert not (run_dir / "tensorboard").exists()
    events = EventAccumulator(str(run_dir), size_guidance={"tensors": 0, "images": 0})
    events.Reload()
    scalars = {tag: events.Scalars(tag) for tag in events.Tags()["scalars"]}
    last_step = EPOCHS * BATCHES

    # Each curve is its logged points in step order: no final value again at step 0.
    for tag, points in scalars.items():
        steps = [p.step for p in points]
        assert steps == sorted(steps), (tag, steps)
    val_steps = [p.step for p in scalars["val/acc"]]
    assert val_steps == [BATCHES - 1, 2 * BATCHES - 1]
    assert scalars["val/acc"][-1].value == pytest.approx(metrics["val/acc"])
    # Test metrics once, at the last global step, where the hparams tab reads them.
    assert [(p.step, p.value) for p in scalars["test/acc"]] == [
        (last_step, pytest.approx(metrics["test/acc"]))
    ]

    # The gradient norm on the steps Lightning writes the logs, like the loss; positive, finite.
    grad_steps = [p.step for p in scalars["train/grad_norm"]]
    assert grad_steps == [p.step for p in scalars["train/loss"]] == list(range(1, last_step, 2))
    assert all(0 < p.value < 1e3 for p in scalars["train/grad_norm"])
    assert [p.step for p in scalars["lr-AdamW"]] == [0, BATCHES]
    assert len(scalars["perf/train_samples_per_s"]) == EPOCHS

    # Pictures of each validation, at its scalars' step.
    for tag in ("val/confusion_matrix", "val/predictions"):
        pictures = events.Images(tag)
        assert [p.step for p in pictures] == val_steps, tag
        assert pictures[-1].encoded_image_string.startswith(b"\x89PNG")

    content = events.PluginTagToContent(metadata.PLUGIN_NAME)
    start = metadata.parse_session_start_info_plugin_data(content[metadata.SESSION_START_INFO_TAG])
    assert start.hparams["status"].string_value == "completed"
    assert start.hparams["model.optimizer.lr"].number_value == pytest.approx(0.003)
    assert start.hparams["trainer.max_epochs"].number_value == EPOCHS
    end = metadata.parse_session_end_info_plugin_data(content[metadata.SESSION_END_INFO_TAG])
    assert end.status == api_pb2.STATUS_SUCCESS
