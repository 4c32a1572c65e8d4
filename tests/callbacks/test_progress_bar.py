"""volt's progress bar reads the logged metrics (a GPU sync each time) only after the batches at
which Lightning writes the logs, and at most every N seconds."""

import io
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.callbacks import RichProgressBar as LightningRichProgressBar
from lightning.pytorch.loggers import TensorBoardLogger
from omegaconf import DictConfig
from rich.console import Console
from rich.progress import Progress
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from torch import Tensor
from torch.utils.data import DataLoader, TensorDataset

from tests.tiny_regression import TinyRegression
from volt.build import build_datamodule, build_model
from volt.callbacks import progress_bar
from volt.callbacks.progress_bar import RichProgressBar
from volt.models.classifier import Classifier

STEPS = 12


class Regression(TinyRegression):
    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        loss = super().training_step(batch, batch_idx)
        self.log("train/loss", loss)  # not prog_bar: the bar reads it
        return loss


def reads_during_training(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    metrics_every_s: float,
    log_every_n_steps: int = 1,
) -> tuple[list[int], dict]:
    """The training batches after which the bar read the metrics, and what it shows at the end."""
    bar = RichProgressBar(metrics_every_s=metrics_every_s)
    reads = []
    parent = LightningRichProgressBar.get_metrics

    def counted(self: LightningRichProgressBar, trainer: pl.Trainer, *args: object) -> dict:
        if self._in_train_batch:  # type: ignore[attr-defined]
            reads.append(trainer.global_step - 1)
        return parent(self, trainer, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(LightningRichProgressBar, "get_metrics", counted)
    data = TensorDataset(torch.randn(STEPS * 4, 4), torch.randn(STEPS * 4, 1))
    trainer = pl.Trainer(
        max_epochs=1,
        accelerator="cpu",
        callbacks=[bar],
        logger=False,
        enable_checkpointing=False,
        enable_model_summary=False,
        default_root_dir=tmp_path,
        log_every_n_steps=log_every_n_steps,
    )
    trainer.fit(Regression(), DataLoader(data, batch_size=4))
    assert trainer.global_step == STEPS
    return reads, bar.get_metrics(trainer, trainer.lightning_module)


def test_metrics_are_read_once_per_interval_not_every_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    reads, shown = reads_during_training(tmp_path, monkeypatch, metrics_every_s=3600)
    assert reads == [0]  # the first batch; the next hour's batches reuse it
    assert "train/loss" in shown


def test_metrics_are_read_only_where_lightning_writes_the_logs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    reads, _ = reads_during_training(tmp_path, monkeypatch, metrics_every_s=0, log_every_n_steps=4)
    assert reads == [0, 3, 7, 11]  # the first batch, then the logging ones: (step + 1) % 4 == 0


def test_an_interval_of_zero_reads_every_logging_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    reads, _ = reads_during_training(tmp_path, monkeypatch, metrics_every_s=0)
    assert reads == list(range(STEPS))


class RecordTrainCounter(pl.Callback):
    """What the bar's training counter shows at each epoch's end (after the bar's own hook)."""

    def __init__(self, bar: RichProgressBar) -> None:
        self.bar = bar
        self.shown: list[float] = []

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        assert self.bar.progress is not None and self.bar.train_progress_bar_id is not None
        self.shown.append(self.bar.progress.tasks[self.bar.train_progress_bar_id].completed)


def counter_moves(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The batch index of every move of the bar's training counter from here on."""
    moves: list[int] = []
    parent = LightningRichProgressBar.on_train_batch_end

    def counted(self: LightningRichProgressBar, trainer: pl.Trainer, *args: object) -> None:
        moves.append(trainer.global_step - 1)
        parent(self, trainer, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(LightningRichProgressBar, "on_train_batch_end", counted)
    return moves


def test_the_counter_moves_at_most_every_interval_and_ends_at_the_epochs_batches(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(RichProgressBar, "MOVE_EVERY_S", 3600.0)
    moves = counter_moves(monkeypatch)
    bar = RichProgressBar(metrics_every_s=3600)
    record = RecordTrainCounter(bar)
    data = DataLoader(TensorDataset(torch.randn(STEPS * 4, 4), torch.randn(STEPS * 4, 1)), 4)
    trainer = pl.Trainer(
        max_epochs=2,
        accelerator="cpu",
        callbacks=[bar, record],
        logger=False,
        enable_checkpointing=False,
        enable_model_summary=False,
        default_root_dir=tmp_path,
    )
    trainer.fit(Regression(), data)
    assert moves == [0]  # the first batch; the next hour's batches leave the counter be
    assert record.shown == [STEPS, STEPS]  # caught up at each epoch's end


def test_the_first_batch_draws_on_a_machine_booted_a_second_ago(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # time.monotonic() counts from boot: a clock started at 0 would hold back every draw for the
    # first interval of the machine's uptime. Here the bar's clock reads 1 s at the start.
    booted = time.monotonic() - 1.0
    clock = SimpleNamespace(monotonic=lambda: time.monotonic() - booted)
    monkeypatch.setattr(progress_bar, "time", clock)
    monkeypatch.setattr(RichProgressBar, "MOVE_EVERY_S", 60.0)
    moves = counter_moves(monkeypatch)
    reads, shown = reads_during_training(tmp_path, monkeypatch, metrics_every_s=60)
    assert moves == [0]  # drawn at the first batch, then held for the interval
    assert reads == [0]
    assert "train/loss" in shown


def test_the_rate_shows_no_zero_before_rich_can_measure_one(tmp_path: Path) -> None:
    """Rich measures a rate between two moves of a counter: Lightning 2.6.6 showed 0.00it/s
    before that, at each epoch's start and all through a one-batch epoch (or a fast one, moved
    only at its first batch and its end)."""
    now = [0.0]
    trainer = pl.Trainer(accelerator="cpu", logger=False, default_root_dir=tmp_path)
    columns = RichProgressBar().configure_columns(trainer)
    progress = Progress(*columns, get_time=lambda: now[0])
    task = progress.add_task("Epoch 0", total=4)

    def rate() -> str:
        console = Console(file=io.StringIO(), width=200)
        console.print(progress.make_tasks_table(progress.tasks))
        return console.file.getvalue().split()[-1]  # type: ignore[attr-defined]

    assert rate() == "-.--it/s"  # no batch yet: unknown
    now[0] = 0.5
    progress.update(task, completed=1)
    assert rate() == "2.00it/s"  # one batch in the half second since the epoch began
    now[0] = 1.0
    progress.update(task, completed=4)
    assert rate() == "6.00it/s"  # rich's own, between its moves: 3 batches in 0.5 s


@pytest.mark.parametrize(
    ("max_epochs", "shown"), [(-1, ["Epoch 0", "Epoch 1"]), (2, ["Epoch 0/1", "Epoch 1/1"])]
)
def test_a_run_without_an_epoch_limit_shows_no_epoch_total(
    tmp_path: Path, max_epochs: int, shown: list[str]
) -> None:
    """Lightning 2.6.6 shows "Epoch 1/-2" under max_epochs=-1 (a run that ends at max_steps)."""
    descriptions = []

    class Recorded(RichProgressBar):
        def _get_train_description(self, current_epoch: int) -> str:
            descriptions.append(super()._get_train_description(current_epoch).rstrip())
            return descriptions[-1]

    data = TensorDataset(torch.randn(16, 4), torch.randn(16, 1))
    trainer = pl.Trainer(
        accelerator="cpu", max_epochs=max_epochs, max_steps=6, callbacks=[Recorded()],
        logger=False, enable_checkpointing=False, default_root_dir=tmp_path,
    )  # fmt: skip
    trainer.fit(Regression(), DataLoader(data, batch_size=4))
    assert sorted(set(descriptions)) == shown


class EveryStepLogging(Classifier):
    """The classifier as it logged before: `self.log` of the loss and the accuracy metric in every
    training step, whether Lightning writes the logs after it or not."""

    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        x, y = batch
        logits = self(x)
        loss = self.criterion(logits, y)
        self.train_acc(logits, y)
        self.log("train/loss", loss, on_step=True, on_epoch=False)
        self.log("train/acc", self.train_acc, on_step=False, on_epoch=True)
        return loss

    def on_train_epoch_end(self) -> None:
        pass


def tensorboard_curves(
    model_class: type[Classifier], cfg: DictConfig, log_dir: Path
) -> dict[str, list[tuple[int, float]]]:
    pl.seed_everything(0)
    datamodule = build_datamodule(cfg.data)
    model = build_model(cfg.model, datamodule, cfg.task.from_data)
    model.__class__ = model_class
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=1,
        max_epochs=2,
        log_every_n_steps=5,
        limit_val_batches=0,
        logger=TensorBoardLogger(log_dir, name="", version=""),
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(model, datamodule)
    events = EventAccumulator(str(log_dir))
    events.Reload()
    return {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in TRAIN_TAGS}


TRAIN_TAGS = ("train/loss", "train/acc")


def test_the_classifier_logs_the_same_training_curves_as_logging_every_step(
    tmp_path: Path, compose_config: Callable[..., DictConfig]
) -> None:
    cfg = compose_config("train", ["data.batch_size=128"])  # 9 batches an epoch
    logged = tensorboard_curves(Classifier, cfg, tmp_path / "now")
    before = tensorboard_curves(EveryStepLogging, cfg, tmp_path / "before")
    assert [step for step, _ in logged["train/loss"]] == [4, 9, 14]  # (step + 1) % 5 == 0
    assert [step for step, _ in logged["train/acc"]] == [8, 17]  # each epoch's end
    assert logged == before
