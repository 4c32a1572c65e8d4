"""logger=tensorboard: no flush of the event file at each logging step, every point in it once the
fit ends, hparams.yaml written as Lightning writes it, one event per log_metrics call."""

import math
import re
from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.loggers import TensorBoardLogger as LightningTensorBoardLogger
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.backend.event_processing.event_file_loader import EventFileLoader
from torch.utils.tensorboard import SummaryWriter

from tests.lightning_docs_task import LineDataModule, LitRegressor
from volt.loggers.tensorboard import TensorBoardLogger


def fit_counting_flushes(
    tmp_path: Path, logger_class: type[LightningTensorBoardLogger], monkeypatch: pytest.MonkeyPatch
) -> tuple[int, Path]:
    """(flushes of the event writer before the fit's end, the run's log folder)."""
    flushes = []
    real_flush = SummaryWriter.flush
    monkeypatch.setattr(SummaryWriter, "flush", lambda w: (flushes.append(1), real_flush(w))[1])
    logger = logger_class(tmp_path, name="", version="", default_hp_metric=False)
    trainer = pl.Trainer(
        max_epochs=2, logger=logger, log_every_n_steps=1, limit_val_batches=0,
        enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False,
    )  # fmt: skip
    seen: list[int] = []
    trainer.callbacks.append(  # type: ignore[attr-defined]
        pl.callbacks.LambdaCallback(on_train_end=lambda *_: seen.append(len(flushes)))
    )
    trainer.fit(LitRegressor(), datamodule=LineDataModule())
    return seen[0], Path(logger.log_dir)


def test_the_event_file_is_not_flushed_at_each_logging_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    flushes, log_dir = fit_counting_flushes(tmp_path / "volt", TensorBoardLogger, monkeypatch)
    assert flushes == 0
    events = EventAccumulator(str(log_dir))
    events.Reload()
    steps = [point.step for point in events.Scalars("train_loss")]
    assert len(steps) == len(set(steps)) > 10  # every logging step's point, once
    assert (log_dir / "hparams.yaml").is_file()
    # Control: Lightning's logger flushes at every logging step.
    lightning = LightningTensorBoardLogger
    flushes, _ = fit_counting_flushes(tmp_path / "lightning", lightning, monkeypatch)
    assert flushes >= len(steps)


def events_with_values(log_dir: Path) -> list[dict[str, float]]:
    """Each event of the run's event files that holds scalars: its values by tag (the loader
    turns each `simple_value` into a one-element tensor, as TensorBoard reads it)."""
    events = []
    for path in sorted(log_dir.glob("events.out.tfevents.*")):
        for event in EventFileLoader(str(path)).Load():
            values = {v.tag: v.tensor.float_val[0] for v in event.summary.value}
            if values:
                events.append(values)
    return events


def log_two_calls(logger: LightningTensorBoardLogger) -> list[dict[str, float]]:
    logger.log_metrics({"a": 1.5, "b": torch.tensor(2.0), "c": 3}, step=7)
    logger.log_metrics({"a": float("nan")}, step=8)
    logger.finalize("success")
    return events_with_values(Path(logger.log_dir))


def test_the_numbers_of_one_call_are_one_event(tmp_path: Path) -> None:
    logger = TensorBoardLogger(tmp_path, name="", version="", prefix="fit", default_hp_metric=False)
    events = log_two_calls(logger)
    assert len(events) == 2
    assert events[0] == {"fit-a": 1.5, "fit-b": 2.0, "fit-c": 3.0}
    assert list(events[1]) == ["fit-a"] and math.isnan(events[1]["fit-a"])
    accumulator = EventAccumulator(str(logger.log_dir))
    accumulator.Reload()
    assert [(p.step, p.value) for p in accumulator.Scalars("fit-b")] == [(7, 2.0)]


def test_lightnings_logger_writes_an_event_per_number(tmp_path: Path) -> None:
    # The control for the test above: what volt's logger changes.
    logger = LightningTensorBoardLogger(
        tmp_path, name="", version="", prefix="fit", default_hp_metric=False
    )
    assert [sorted(e) for e in log_two_calls(logger)] == [
        ["fit-a"],
        ["fit-b"],
        ["fit-c"],
        ["fit-a"],
    ]


def test_a_dict_of_numbers_is_written_as_lightning_writes_it(tmp_path: Path) -> None:
    logger = TensorBoardLogger(tmp_path, name="", version="", default_hp_metric=False)
    logger.log_metrics({"loss": {"train": 1.0, "val": 2.0}, "lr": 0.1}, step=3)
    logger.finalize("success")
    log_dir = Path(logger.log_dir)
    assert events_with_values(log_dir) == [{"lr": pytest.approx(0.1)}]
    # add_scalars writes each of a dict's numbers under a folder of its own
    groups = sorted(p.name for p in log_dir.iterdir() if p.is_dir())
    assert groups == ["loss_train", "loss_val"]


@pytest.mark.parametrize(
    ("value", "shown"), [("high", "'high'"), (torch.ones(2), "tensor([1., 1.])"), (None, "None")]
)
def test_a_value_that_is_no_number_is_refused_in_one_line(
    tmp_path: Path, value: object, shown: str
) -> None:
    logger = TensorBoardLogger(tmp_path, name="", version="", default_hp_metric=False)
    refusal = rf"^logger=tensorboard cannot write note={re.escape(shown)}: log a number"
    with pytest.raises(ValueError, match=refusal):
        logger.log_metrics({"note": value}, step=1)
