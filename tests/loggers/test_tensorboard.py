"""logger=tensorboard: no flush of the event file at each logging step, every point in it once the
fit ends, hparams.yaml written as Lightning writes it."""

from pathlib import Path

import lightning.pytorch as pl
import pytest
from lightning.pytorch.loggers import TensorBoardLogger as LightningTensorBoardLogger
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
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
