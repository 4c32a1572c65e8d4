"""logger=csv: a continued run appends to the metrics.csv of its earlier attempts."""

import csv
import warnings
from pathlib import Path

import lightning.pytorch as pl

from tests.lightning_docs_task import LineDataModule, LitRegressor
from volt.loggers.csv_log import CSVLogger


def fit(tmp_path: Path, epochs: int, ckpt_path: Path | None = None) -> None:
    trainer = pl.Trainer(
        max_epochs=epochs,
        logger=CSVLogger(tmp_path, name="csv", version=""),  # as conf/logger/csv.yaml
        default_root_dir=tmp_path,
        log_every_n_steps=4,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
    )
    trainer.fit(LitRegressor(), datamodule=LineDataModule(), ckpt_path=ckpt_path)
    trainer.save_checkpoint(tmp_path / "last.ckpt")


def test_a_resumed_run_keeps_the_rows_of_the_attempt_before(tmp_path: Path) -> None:
    fit(tmp_path, epochs=1)
    with warnings.catch_warnings():
        # Lightning 2.6.6's: "Previous log files in this directory will be deleted"
        warnings.filterwarnings("error", message="Experiment logs directory")
        fit(tmp_path, epochs=2, ckpt_path=tmp_path / "last.ckpt")
    with (tmp_path / "csv" / "metrics.csv").open() as file:
        rows = list(csv.DictReader(file))
    assert {row["epoch"] for row in rows if row["train_loss"]} == {"0", "1"}
    assert {row["epoch"] for row in rows if row["val_loss"]} == {"0", "1"}
