"""Early stopping and the best checkpoint follow the metric the module logs: `val_loss` for the
task's `val/loss`, else its validation loss; a resumed fit restores them under that name. They
are made anew for it, by their constructors (volt.build remakes them from their config entries)."""

from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest
from lightning.pytorch.callbacks import Callback, EarlyStopping, ModelCheckpoint

from tests.lightning_docs_task import LineDataModule, LitRegressor
from volt.callbacks.watched_metric import WatchedMetricCheck


class Made:
    """Callbacks and the arguments each was made with, to make one again with some changed."""

    def __init__(self) -> None:
        self.arguments: dict[Callback, tuple[type, dict[str, Any]]] = {}

    def __call__(self, kind: type, **arguments: Any) -> Any:
        callback = kind(**arguments)
        self.arguments[callback] = (kind, arguments)
        return callback

    def remake(self, old: Any, changes: dict[str, Any]) -> Any:
        kind, arguments = self.arguments[old]
        return self(kind, **{**arguments, **changes})


def fit(
    tmp_path: Path,
    watch: str,
    mode: str,
    epochs: int,
    ckpt_path: Path | None = None,
    follow_first: bool = True,
    **trainer_options: Any,
):
    made = Made()
    best = made(
        ModelCheckpoint,
        dirpath=tmp_path,
        filename="best-" + watch.replace("/", "_") + "{" + watch + ":.4f}",
        monitor=watch,
        mode=mode,
        auto_insert_metric_name=False,
    )
    last = made(ModelCheckpoint, dirpath=tmp_path, filename="last", monitor=None)
    stop = made(
        EarlyStopping, monitor=watch, mode=mode, patience=10, min_delta=0.001,
        check_on_train_epoch_end=False,  # as volt's config: at validation ends only
    )  # fmt: skip
    check = WatchedMetricCheck(watch, mode, made.remake)
    trainer = pl.Trainer(
        max_epochs=epochs,
        callbacks=[check, best, last, stop],
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        **trainer_options,
    )
    if ckpt_path is not None and follow_first:  # as volt.training does
        check.follow_checkpoint(trainer, ckpt_path)
    trainer.fit(LitRegressor(), datamodule=LineDataModule(), ckpt_path=ckpt_path)
    assert trainer.checkpoint_callbacks[-1] is last  # followed nothing: kept as it was
    return trainer, trainer.checkpoint_callback, trainer.early_stopping_callback


@pytest.mark.parametrize(("watch", "mode"), [("val/loss", "min"), ("val/acc", "max")])
def test_the_logged_validation_loss_is_followed_and_restored(
    tmp_path: Path, watch: str, mode: str, recwarn: pytest.WarningsRecorder
) -> None:
    trainer, best, stop = fit(tmp_path, watch, mode, epochs=2)
    assert (best.monitor, best.mode, stop.monitor, stop.mode) == ("val_loss", "min") * 2
    assert stop.min_delta == -0.001  # lower is better: the constructor turned it
    # Compared from its first validation on (min_delta apart at most).
    assert float(stop.best_score) == pytest.approx(float(best.best_model_score), abs=0.001)
    assert best.best_model_score == pytest.approx(float(trainer.callback_metrics["val_loss"]))
    assert Path(best.best_model_path).name.startswith("best-val_loss0.")
    score = float(best.best_model_score)

    _, best, stop = fit(tmp_path, watch, mode, epochs=3, ckpt_path=tmp_path / "last.ckpt")
    # Restored under the module's name: the best so far and early stopping's count carry on.
    assert best.monitor == "val_loss" and float(best.best_model_score) <= score
    assert stop.best_score <= score
    # Lightning lists states no callback takes before it restores any: none here.
    assert not [w for w in recwarn if "Please add the following callbacks" in str(w.message)]


def test_a_checkpoint_followed_as_the_fit_restores_it_is_restored(tmp_path: Path) -> None:
    """As a sharded checkpoint (a folder) is followed: in on_load_checkpoint, once Lightning has
    set the callbacks up; the followers made then are set up there, and take their states."""
    _, best, _ = fit(tmp_path, "val/acc", "max", epochs=2)
    score = float(best.best_model_score)
    _, best, stop = fit(
        tmp_path, "val/acc", "max", epochs=3, ckpt_path=tmp_path / "last.ckpt", follow_first=False
    )
    assert (best.monitor, stop.monitor, stop.mode) == ("val_loss", "val_loss", "min")
    assert float(best.best_model_score) <= score and stop.best_score <= score
    assert Path(best.best_model_path).parent == tmp_path


def test_a_metric_another_rank_did_not_log_is_not_followed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under DDP only what every rank logged counts (a metric rank 0 logs alone, with
    `rank_zero_only=True`, cannot be followed): ranks that judged apart waited on each other for
    ever. Here the other rank logged no val_loss (two real ranks: tests/strategies/test_ddp.py)."""
    import volt.callbacks.watched_metric as watched_metric

    every_rank = watched_metric.names_on_every_rank
    monkeypatch.setattr(
        watched_metric,
        "names_on_every_rank",
        lambda names: [n for n in every_rank(names) if n != "val_loss"],
    )
    trainer, best, stop = fit(tmp_path, "val/acc", "max", epochs=2)
    assert stop is None and best is trainer.checkpoint_callbacks[-1]  # only last.ckpt's is left


def test_a_fit_without_validation_keeps_last_ckpt_and_warns_of_nothing(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, recwarn: pytest.WarningsRecorder
) -> None:
    """trainer.limit_val_batches=0: Lightning 2.6.6 warned at every save that the best
    checkpoint's metric was missing; the followers go, with one line saying why."""
    caplog.set_level("INFO", logger="volt.callbacks.watched_metric")
    _, best, stop = fit(tmp_path, "val/loss", "min", 2, limit_val_batches=0)
    assert best is not None and best.monitor is None  # last.ckpt's callback alone
    assert stop is None
    assert (tmp_path / "last.ckpt").is_file()
    assert [
        r.getMessage() for r in caplog.records if r.name == "volt.callbacks.watched_metric"
    ] == [
        "no best checkpoint nor early stopping: trainer.limit_val_batches=0, no validation"
        " (last.ckpt is kept)"
    ]
    assert not [w for w in recwarn if "could not find the monitored key" in str(w.message)]


def test_a_run_resumed_without_validation_follows_nothing(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, recwarn: pytest.WarningsRecorder
) -> None:
    """Its first attempt followed val_loss (the module logs no val/loss); resumed with validation
    off, the followers it restores step aside too."""
    fit(tmp_path, "val/loss", "min", 2)
    caplog.set_level("INFO", logger="volt.callbacks.watched_metric")
    _, best, stop = fit(
        tmp_path, "val/loss", "min", 3, ckpt_path=tmp_path / "last.ckpt", limit_val_batches=0
    )
    assert best is not None and best.monitor is None and stop is None
    assert "trainer.limit_val_batches=0, no validation" in caplog.text
    assert not [w for w in recwarn if "could not find the monitored key" in str(w.message)]
