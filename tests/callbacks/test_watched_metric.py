"""Early stopping and the best checkpoint follow the metric the module logs: `val_loss` for the
task's `val/loss`, else its validation loss; a resumed fit restores them under that name."""

from pathlib import Path

import lightning.pytorch as pl
import pytest
from lightning.pytorch.callbacks import EarlyStopping, ModelCheckpoint

from tests.lightning_docs_task import LineDataModule, LitRegressor
from volt.callbacks.watched_metric import WatchedMetricCheck


def fit(tmp_path: Path, watch: str, mode: str, epochs: int, ckpt_path: Path | None = None):
    best = ModelCheckpoint(
        dirpath=tmp_path,
        filename="best-" + watch.replace("/", "_") + "{" + watch + ":.4f}",
        monitor=watch,
        mode=mode,
        auto_insert_metric_name=False,
    )
    last = ModelCheckpoint(dirpath=tmp_path, filename="last", monitor=None)
    stop = EarlyStopping(monitor=watch, mode=mode, patience=10)
    check = WatchedMetricCheck(watch, mode)
    trainer = pl.Trainer(
        max_epochs=epochs,
        callbacks=[check, best, last, stop],
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    if ckpt_path is not None:  # as volt.training does
        check.follow_checkpoint(trainer, ckpt_path)
    trainer.fit(LitRegressor(), datamodule=LineDataModule(), ckpt_path=ckpt_path)
    return trainer, best, stop


@pytest.mark.parametrize(("watch", "mode"), [("val/loss", "min"), ("val/acc", "max")])
def test_the_logged_validation_loss_is_followed_and_restored(
    tmp_path: Path, watch: str, mode: str, recwarn: pytest.WarningsRecorder
) -> None:
    trainer, best, stop = fit(tmp_path, watch, mode, epochs=2)
    assert (best.monitor, best.mode, stop.monitor, stop.mode) == ("val_loss", "min") * 2
    assert best.best_model_score == pytest.approx(float(trainer.callback_metrics["val_loss"]))
    assert Path(best.best_model_path).name.startswith("best-val_loss0.")
    score = float(best.best_model_score)

    _, best, stop = fit(tmp_path, watch, mode, epochs=3, ckpt_path=tmp_path / "last.ckpt")
    # Restored under the module's name: the best so far and early stopping's count carry on.
    assert best.monitor == "val_loss" and float(best.best_model_score) <= score
    assert stop.best_score <= score
    # Lightning lists states no callback takes before it restores any: none here.
    assert not [w for w in recwarn if "Please add the following callbacks" in str(w.message)]
