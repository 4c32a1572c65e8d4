"""Early stopping and the best checkpoint follow one watched metric (`task.watch`); a module of the
user's own may log it under another name (`val_loss` for `val/loss`), log only a validation loss,
or log nothing. Lightning then ends the fit with a multi-line RuntimeError (EarlyStopping,
strict) or MisconfigurationException (ModelCheckpoint). Here, after the first validation, both
follow the metric the module logs (on every rank) under the watched metric's meaning
(volt.metric_names), else its validation loss (lower is better), else step aside; one line says
which. A fit that validates nothing (no `validation_step`, `trainer.limit_val_batches=0`) has
them step aside as it starts. last.ckpt (a checkpoint callback without a monitor) is kept, so
eval, predict and resume still work. (Other ways of never validating, a data module without a
val_dataloader or a `val_check_interval` past `max_steps`, still leave them in place, and
Lightning warns at each save that the metric is missing.)

To follow another metric, each is made anew by its constructor (from its config entry: volt.build)
with that monitor, mode and file name, and takes the old one's place: Lightning 2.6.6 has no
public way to change what a made callback monitors, and its constructors derive several fields
from it (the comparison, the best score so far, early stopping's sign of min_delta, the state key).

A module that logs no training loss gets the loss its `training_step` returns logged as
`train/loss`, so every run has a loss curve.
"""

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback, EarlyStopping, ModelCheckpoint
from lightning.pytorch.utilities.model_helpers import is_overridden

from volt.collectives import names_on_every_rank
from volt.metric_names import followed

log = logging.getLogger(__name__)

Follower = EarlyStopping | ModelCheckpoint
# A follower made anew, as it was made but for the given constructor arguments (volt.build: its
# config entry, built again).
Remake = Callable[[Follower, dict[str, Any]], Follower]


class WatchedMetricCheck(Callback):
    """Retargets or removes the EarlyStopping and monitoring ModelCheckpoint callbacks by what the
    first validation logged. Must come before them in the Trainer's callbacks (volt.build puts it
    first; Lightning runs checkpoint callbacks last, and restores callbacks in list order)."""

    def __init__(self, watch: str, mode: str, remake: Remake) -> None:
        self.remake = remake
        self.watch, self.mode = watch, mode  # after the first validation: what is followed
        self.judged = False  # after the first validation: later ones log the same names
        self.log_loss: bool | None = None  # judged at the first training batch

    def on_train_batch_end(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
    ) -> None:
        # Only on the steps whose logs are written (as volt's own modules log their loss): a
        # module that logs its loss has logged it there, and the curve is the same.
        if not trainer._logger_connector.should_update_logs:
            return
        loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
        if self.log_loss is None:
            # What training_step logged, on_step or on_epoch: Lightning 2.6.6 keeps it in its
            # result collection under "training_step.<name>" (callback_metrics holds an
            # on_epoch value only once the epoch ends).
            logged = trainer._results.keys() if trainer._results is not None else ()
            self.log_loss = not any(k.startswith("training_step.") and "loss" in k for k in logged)
            if self.log_loss and isinstance(loss, torch.Tensor):
                log.info(
                    "%s logs no training loss: volt logs the loss training_step returns as"
                    " train/loss",
                    type(pl_module).__name__,
                )
        if self.log_loss and isinstance(loss, torch.Tensor):
            pl_module.log("train/loss", loss.detach())

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # Whatever an earlier validation judged (a run resumed with validation off follows what
        # its first attempt logged): this fit validates nothing, so nothing is followed.
        if not is_overridden("validation_step", pl_module):
            why = f"{type(pl_module).__name__} has no validation_step"
        elif trainer.limit_val_batches == 0:  # (Lightning warned at every save, 2.6.6)
            why = f"trainer.limit_val_batches={trainer.limit_val_batches}, no validation"
        else:
            return
        self.judged = True
        if not (followers := self._followers(trainer)):
            return
        for callback in followers:
            trainer.callbacks.remove(callback)  # type: ignore[attr-defined]
        log.info("no best checkpoint nor early stopping: %s (last.ckpt is kept)", why)

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.sanity_checking or self.judged:
            return
        self.judged = True
        # What every rank logged: all ranks decide alike, or they wait on each other (a remade
        # checkpoint's setup broadcasts its folder; saving and stopping decide together). A
        # metric logged by rank 0 alone (`rank_zero_only=True`) cannot be followed.
        logged = names_on_every_rank(trainer.callback_metrics)
        found = followed(logged, self.watch, self.mode)
        if found is not None and found != (self.watch, self.mode):
            watched, mode = found
            log.info(
                "watching %s (%s is better): %s logs no %r",
                watched,
                "lower" if mode == "min" else "higher",
                type(pl_module).__name__,
                self.watch,
            )
            for callback in self._retarget(trainer, watched, mode):
                # Joining a fit under way, mid-epoch as a callback of a run resumed there does
                # (no on_train_epoch_start), with the hooks each fit calls before its first step.
                callback.setup(trainer, pl_module, "fit")
                callback.on_fit_start(trainer, pl_module)
                callback.on_train_start(trainer, pl_module)
            return
        if found is not None:
            return
        for callback in self._followers(trainer):
            # They come after this callback: Lightning's loop over the list, now at this one,
            # goes on to the next that remains.
            trainer.callbacks.remove(callback)  # type: ignore[attr-defined]
            if not trainer.is_global_zero:
                continue  # every rank decided alike: one says so
            role = "early stopping" if isinstance(callback, EarlyStopping) else "best checkpoint"
            log.warning(
                "%s is off: %s logged no %r in validation (logged%s: %s); set task.watch=<one"
                " of them> and task.mode=max|min",
                role,
                type(pl_module).__name__,
                self.watch,
                " on every rank" if trainer.world_size > 1 else "",
                ", ".join(logged) or "nothing",
            )

    def _followers(self, trainer: pl.Trainer) -> list[Follower]:
        return [
            callback
            for callback in trainer.callbacks  # type: ignore[attr-defined]
            if isinstance(callback, EarlyStopping | ModelCheckpoint)
            and callback.monitor == self.watch
        ]

    def _retarget(self, trainer: pl.Trainer, watch: str, mode: str) -> list[Follower]:
        """Each follower made anew to follow `watch` in `mode`, in the place of the old one in the
        Trainer's list (the order Lightning calls them in): its constructor derives from them
        what it compares, its best-so-far and the state key a checkpoint keeps it under. Made
        before a fit, Lightning sets them up; during one, the caller does. Returns them."""
        made = []
        callbacks = trainer.callbacks  # type: ignore[attr-defined]
        for old in self._followers(trainer):
            changes: dict[str, Any] = {"monitor": watch, "mode": mode}
            if isinstance(old, ModelCheckpoint) and old.filename:
                # volt's: "epoch{epoch:03d}-val_acc{val/acc:.4f}"
                changes["filename"] = old.filename.replace(
                    "{" + self.watch + ":", "{" + watch + ":"
                ).replace(self.watch.replace("/", "_"), watch.replace("/", "_"))
            new = self.remake(old, changes)
            callbacks[callbacks.index(old)] = new
            made.append(new)
        self.watch, self.mode = watch, mode
        return made

    def state_dict(self) -> dict[str, Any]:
        return {"watch": self.watch, "mode": self.mode}

    def follow_checkpoint(self, trainer: pl.Trainer, path: Path) -> None:
        """Before a fit resumed from `path`: follow what it followed. Lightning 2.6.6 lists the
        states no callback takes before it calls on_load_checkpoint (a warning to add the
        callbacks that wrote them); retargeted first, the followers' state keys are those the
        checkpoint stored them under. mmap: the weights are not read. A sharded checkpoint (a
        folder) is followed in on_load_checkpoint, after that warning."""
        if path.is_file():
            stored = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
            self._take_state(trainer, stored)

    def on_load_checkpoint(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        # Lightning calls this for every callback before any load_state_dict, after setup.
        for callback in self._take_state(trainer, checkpoint):
            callback.setup(trainer, pl_module, "fit")

    def _take_state(self, trainer: pl.Trainer, checkpoint: dict[str, Any]) -> list[Follower]:
        """Follows what the checkpoint's run followed; returns the followers made anew."""
        state = checkpoint.get("callbacks", {}).get(self.state_key)
        if state is None or (state["watch"], state["mode"]) == (self.watch, self.mode):
            return []
        self.judged = True
        return self._retarget(trainer, state["watch"], state["mode"])
