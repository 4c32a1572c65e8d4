"""Python's garbage collection at the same optimizer steps on every rank, instead of whenever.

Python runs a collection when allocations pass its thresholds, at whatever moment that happens
to be; a collection of the older generations walks every tracked object (Lightning's, torch's,
the data's: hundreds of thousands) and takes tens of milliseconds. Under DDP or FSDP each rank
reaches its thresholds at its own moments, and every collective then waits for the rank that is
collecting: one rank's pause stalls them all, again and again at different steps. Large-scale
trainers (torchtitan's `gc_freq`, Megatron-LM's manual GC) turn automatic collection off while
training and collect at chosen steps, on every rank at once, so the pauses coincide.

Only reference cycles wait for these collections: everything else is freed the moment its last
reference goes, as always. The callback puts collection back as it found it when training ends.
"""

import gc

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback

# Every 20th collection takes all generations (every 1,000 steps at the default interval), so
# that cycles which outlived two young collections are freed too, at the same steps on every
# rank; so does an epoch's end once the last full collection is `every_n_steps` steps old
# (objects of an epoch, a data loader's iterator say, go at its end). What is alive when training
# starts (the imports, the model, the data, the trainer, compiled graphs) is frozen then, so a
# full collection walks only what training made since. Unfrozen, each walked everything: on an
# H100 with torch 2.11 one took about 340 ms, every 57 steps of the digits run (its epochs are 19
# steps), and made volt's step 5.8 ms slower than bare Lightning's (issue #40, 2026-11-28).
# What outlives training's first full collection is frozen too: torch.compile builds its graphs in
# the first steps, after the freeze at the start, and each later full collection walked them
# (digits under compile=default on 2 CPU cores, torch 2.14: 23 ms each, at every third epoch's
# end; 0.2 ms with them frozen). Only that once: a cycle among what is alive at a freeze waits
# for the end of training to be freed, so freezing at every full collection could hold an
# epoch's garbage each time.
FULL_EVERY = 20


class GarbageCollection(Callback):
    """Automatic garbage collection off during the fit; generations 0 and 1 collected every
    `every_n_steps` optimizer steps (at global steps that are multiples of it, so at the same
    step on every rank); all of them once as training starts, every FULL_EVERY-th time, and at
    an epoch's end when the last such collection is at least `every_n_steps` steps old. What is
    alive as training starts, and what outlives its first full collection (compiled graphs), is
    frozen (`gc.freeze`) until it ends: no collection walks it.

    Args:
        every_n_steps: optimizer steps between collections; null: leave Python's automatic
            collection on (this callback does nothing).
    """

    def __init__(self, every_n_steps: int | None = 50) -> None:
        if every_n_steps is not None and (isinstance(every_n_steps, bool) or every_n_steps < 1):
            raise ValueError(
                f"callbacks.garbage_collection.every_n_steps={every_n_steps!r}: must be 1 or"
                " more, or null to leave Python's automatic collection on, e.g. every_n_steps=50"
            )
        self.every_n_steps = every_n_steps
        self._was_enabled: bool | None = None
        self._last_step = -1
        self._last_full_step = 0
        self._refrozen = False

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.every_n_steps is None:
            return
        self._was_enabled = gc.isenabled()
        gc.disable()
        # What an earlier fit in this process left (a sweep's jobs run one after another) was
        # frozen with it: unfreeze, free every cycle, then freeze what lives on.
        gc.unfreeze()
        gc.collect()
        gc.freeze()
        self._last_step = self._last_full_step = trainer.global_step
        self._refrozen = False

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, *args: object
    ) -> None:
        step = trainer.global_step
        if self._was_enabled is None or step == self._last_step:
            return  # off, or inside an accumulation window
        self._last_step = step
        interval: int = self.every_n_steps  # type: ignore[assignment]  # not None once started
        if step % (interval * FULL_EVERY) == 0:
            self._collect_all(step)
        elif step % interval == 0:
            gc.collect(1)

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._was_enabled is None:
            return
        step = trainer.global_step  # the same on every rank: they agree on collecting here
        interval: int = self.every_n_steps  # type: ignore[assignment]  # not None once started
        if step - self._last_full_step >= interval:
            self._collect_all(step)

    def _collect_all(self, step: int) -> None:
        gc.collect()
        self._last_full_step = step
        if not self._refrozen:  # training's first full collection: freeze what outlived it
            gc.freeze()
            self._refrozen = True

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._restore()

    def on_exception(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException
    ) -> None:
        self._restore()

    def _restore(self) -> None:
        if self._was_enabled is None:
            return
        gc.unfreeze()  # the fit's objects may be garbage from now on (test, the next sweep job)
        if self._was_enabled:
            gc.enable()
        self._was_enabled = None
