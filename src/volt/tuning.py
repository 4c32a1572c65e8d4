"""`tune=batch_size` and `tune=lr`: Lightning's finders, run before fit, results in the run dir."""

import functools
import logging
import math
from pathlib import Path

import lightning.pytorch as pl
from lightning.pytorch.tuner import Tuner

from volt.data.classification import ImageClassificationDataModule
from volt.models.classifier import Classifier

log = logging.getLogger("volt")


def find_batch_size(
    trainer: pl.Trainer, model: Classifier, datamodule: ImageClassificationDataModule
) -> int:
    """Double the batch until it no longer fits (or the data runs out), then keep the largest that
    did; sets datamodule.batch_size."""
    # Doubling stops at the training set's size: a larger batch would only repeat one step.
    datamodule.setup("fit")
    assert datamodule.train_set is not None
    trials = max(1, int(math.log2(len(datamodule.train_set) / datamodule.batch_size)))  # type: ignore[arg-type]
    found = Tuner(trainer).scale_batch_size(
        model,
        datamodule=datamodule,
        mode="power",
        init_val=datamodule.batch_size,
        max_trials=trials,
    )
    log.info("batch-size finder: data.batch_size=%s fits", found)
    return int(found or datamodule.batch_size)


def find_learning_rate(
    trainer: pl.Trainer, model: Classifier, datamodule: ImageClassificationDataModule, run_dir: Path
) -> float:
    """Sweep the learning rate over a short run, take Lightning's suggestion, plot lr_find.png."""
    steps = 100
    finder = Tuner(trainer).lr_find(
        model, datamodule=datamodule, update_attr=False, num_training=steps
    )
    if finder is not None and len(finder.results.get("lr", [])) < steps:
        raise RuntimeError(
            f"the learning-rate finder ran {len(finder.results.get('lr', []))} of its {steps} "
            "steps (max_epochs ended it): raise trainer.max_epochs, or set model.optimizer.lr"
        )
    suggestion = finder.suggestion() if finder is not None else None
    if finder is None or suggestion is None:
        raise RuntimeError("the learning-rate finder found no suggestion; run without tune=lr")
    lr = float(suggestion)
    figure = finder.plot(suggest=True)
    figure.savefig(run_dir / "lr_find.png")  # type: ignore[union-attr]
    model.optimizer_factory = functools.partial(model.optimizer_factory, lr=lr)  # type: ignore[call-arg]
    log.info(
        "learning-rate finder: model.optimizer.lr=%.3g (plot: %s)", lr, run_dir / "lr_find.png"
    )
    return lr
