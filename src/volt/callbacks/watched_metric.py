"""Early stopping and the best checkpoint follow one watched metric (`task.watch`); a module of the
user's own may log another one, or none. Lightning then ends the fit with a multi-line
RuntimeError (EarlyStopping, strict) or MisconfigurationException (ModelCheckpoint). Here both
step aside after the first validation that lacks their metric, with one line saying why; last.ckpt
(a checkpoint callback without a monitor) is kept, so eval, predict and resume still work.
"""

import logging

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback, EarlyStopping, ModelCheckpoint

log = logging.getLogger(__name__)


class WatchedMetricCheck(Callback):
    """Removes the EarlyStopping and monitoring ModelCheckpoint callbacks whose metric the first
    validation did not log. Must come before them in the Trainer's callbacks (volt.build puts it
    first; Lightning runs checkpoint callbacks last)."""

    def __init__(self) -> None:
        self.judged = False  # after the first validation: later ones log the same names

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.sanity_checking or self.judged:
            return
        self.judged = True
        logged = trainer.callback_metrics
        missing = [
            callback
            for callback in trainer.callbacks  # type: ignore[attr-defined]
            if isinstance(callback, EarlyStopping | ModelCheckpoint)
            and callback.monitor is not None
            and callback.monitor not in logged
        ]
        for callback in missing:
            # They come after this callback: Lightning's loop over the list, now at this one,
            # goes on to the next that remains.
            trainer.callbacks.remove(callback)  # type: ignore[attr-defined]
            role = "early stopping" if isinstance(callback, EarlyStopping) else "best checkpoint"
            log.warning(
                "%s is off: %s logged no %r in validation (logged: %s); set task.watch=<a metric"
                " it logs>, or task=plain to watch val/loss",
                role,
                type(pl_module).__name__,
                callback.monitor,
                ", ".join(sorted(logged)) or "nothing",
            )
