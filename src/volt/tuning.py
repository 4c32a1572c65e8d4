"""`tune=batch_size` and `tune=lr`: Lightning's finders, run before fit, results in the run dir.

Both work on any LightningModule / LightningDataModule pair that Lightning's Tuner accepts: the
batch-size finder needs a `batch_size` attribute on the data module (or the model), the LR finder
an `lr` or `learning_rate` it can read, or, as volt's tasks have, an `optimizer_factory` partial
that this module completes with the value found.
"""

import contextlib
import functools
import logging
import math
import sys
from collections.abc import Iterator, Sized
from pathlib import Path

import lightning.pytorch as pl
from lightning.pytorch.tuner import Tuner, lr_finder
from lightning.pytorch.utilities.parsing import lightning_getattr, lightning_hasattr

from volt.console import lightning_info_for_the_log_file
from volt.errors import ConfigError

log = logging.getLogger("volt")
DEFAULT_BATCH_TRIALS = 25  # Lightning's own default


def _doublings_until_data_runs_out(datamodule: pl.LightningDataModule, batch_size: int) -> int:
    """How often the batch can double before one batch holds the whole training set (a larger
    batch would only repeat one step); Lightning's default when the set has no length."""
    datamodule.setup("fit")
    dataset = getattr(datamodule.train_dataloader(), "dataset", None)
    if not isinstance(dataset, Sized) or len(dataset) <= batch_size:
        return DEFAULT_BATCH_TRIALS if not isinstance(dataset, Sized) else 1
    return max(1, int(math.log2(len(dataset) / batch_size)))


def find_batch_size(
    trainer: pl.Trainer, model: pl.LightningModule, datamodule: pl.LightningDataModule
) -> int:
    """Double the batch until it no longer fits (or the data runs out), then keep the largest that
    did; sets the `batch_size` attribute Lightning found (data module first, then model)."""
    # The Tuner looks on the data module first, then the model (the model meets the data
    # module through its trainer, which it has only once the Tuner runs).
    on_data = hasattr(datamodule, "batch_size")
    if not (on_data or lightning_hasattr(model, "batch_size")):
        raise ConfigError(
            f"tune=batch_size needs a `batch_size` attribute on {type(datamodule).__name__} or "
            f"{type(model).__name__} (Lightning's finder changes it): add one, or drop tune"
        )
    start = getattr(datamodule, "batch_size", None) or lightning_getattr(model, "batch_size")
    assert isinstance(start, int), f"batch_size={start!r} is not an integer"
    with lightning_info_for_the_log_file():
        found = Tuner(trainer).scale_batch_size(
            model,
            datamodule=datamodule,
            mode="power",
            init_val=start,
            max_trials=_doublings_until_data_runs_out(datamodule, start),
        )
    log.info("batch-size finder: data.batch_size=%s fits", found)
    return int(found or start)


def find_learning_rate(
    trainer: pl.Trainer,
    model: pl.LightningModule,
    datamodule: pl.LightningDataModule,
    run_dir: Path,
) -> float:
    """Sweep the learning rate over a short run, take Lightning's suggestion, plot lr_find.png."""
    steps = 100
    with _finder_bar_where_bars_show(trainer), lightning_info_for_the_log_file():
        finder = Tuner(trainer).lr_find(
            model, datamodule=datamodule, update_attr=False, num_training=steps
        )
    ran = len(finder.results.get("lr", [])) if finder is not None else steps
    # Fewer steps: max_epochs ended the finder, or (Lightning's own early stop) the loss diverged,
    # after which its suggestion stands.
    epochs = trainer.max_epochs if trainer.max_epochs not in (None, -1) else math.inf
    if ran < steps and ran >= epochs * trainer.num_training_batches:
        raise ConfigError(
            f"tune=lr: the learning-rate finder ran {ran} of its {steps} steps"
            " (max_epochs ended it): raise trainer.max_epochs, or set model.optimizer.lr"
        )
    suggestion = finder.suggestion() if finder is not None else None
    if finder is None or suggestion is None:
        raise ConfigError("tune=lr: the learning-rate finder found no suggestion; run without tune")
    lr = float(suggestion)
    figure = finder.plot(suggest=True)
    figure.savefig(run_dir / "lr_find.png")  # type: ignore[union-attr]
    _use_learning_rate(model, lr)
    log.info(
        "learning-rate finder: model.optimizer.lr=%.3g (plot: %s)", lr, run_dir / "lr_find.png"
    )
    return lr


@contextlib.contextmanager
def _finder_bar_where_bars_show(trainer: pl.Trainer) -> Iterator[None]:
    """Lightning 2.6.6's finder draws a tqdm bar of its own (lr_finder.tqdm), whatever the
    trainer's progress bar; redrawn into a log file or a pipe, it floods it. Off there, and with
    the trainer's bar off. Remove once Lightning's finder follows the trainer's bar."""
    shows = trainer.progress_bar_callback is not None and sys.stderr.isatty()
    drawn = lr_finder.tqdm
    if not shows:
        lr_finder.tqdm = functools.partial(drawn, disable=True)
    try:
        yield
    finally:
        lr_finder.tqdm = drawn


def _use_learning_rate(model: pl.LightningModule, lr: float) -> None:
    """Where the model takes its learning rate from: volt's optimizer partial, else the
    attribute Lightning's finder reads (`lr` or `learning_rate`)."""
    factory = getattr(model, "optimizer_factory", None)
    if isinstance(factory, functools.partial):
        setattr(model, "optimizer_factory", functools.partial(factory, lr=lr))  # noqa: B010
        return
    for name in ("lr", "learning_rate"):
        if lightning_hasattr(model, name):
            setattr(model, name, lr)
            return
    raise ConfigError(
        f"tune=lr found lr={lr:.3g} but {type(model).__name__} has no optimizer_factory partial "
        "and no `lr` / `learning_rate` attribute to put it in: add one, or drop tune"
    )
