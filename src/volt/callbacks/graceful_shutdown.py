"""SIGTERM or Ctrl+C while training: finish the step, save last.ckpt, exit 143 or 130.

Lightning alone stops on SIGTERM with a `SIGTERMException`, a `SystemExit` with no code, so the
process exits 0 and a scheduler records a killed job as a success; it writes no checkpoint unless
asked to; and Ctrl+C raises KeyboardInterrupt wherever Python happens to be, even inside the
optimizer step, after which Lightning exits 1.

Why not Lightning's `OnExceptionCheckpoint` (Lightning 2.x up to 2.6.6): it saves on any
exception, wherever it is raised, so a Ctrl+C inside the optimizer step saves a half-updated
model, and it leaves the exit status as Lightning sets it (0 after SIGTERM). Lightning's own
SIGTERM handling broadcasts a flag tensor across ranks after every batch
(`_broadcast_sigterm_tensor`, a collective per step under DDP), which this callback switches off
while it is installed. Delete this callback when Lightning stops at a step boundary on SIGTERM
and SIGINT with a checkpoint and a non-zero exit, without a per-step collective.
"""

import logging
import signal
import threading
from pathlib import Path
from types import FrameType
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback

from volt.callbacks.intervals import FALLBACK_EVERY_N_STEPS, check_interval, steps_between_waits
from volt.collectives import all_reduce_queued
from volt.errors import TrainingInterrupted

log = logging.getLogger(__name__)

_SIGNALS = (signal.SIGTERM, signal.SIGINT)
# Where a signal that came before the fit's first optimizer step stopped it.
FIRST_STEP = "waiting for the first training step (setup, the sanity check, compile)"


class GracefulShutdown(Callback):
    """On SIGTERM or SIGINT: save `<checkpoint_dir>/last.ckpt` after the next optimizer step, stop.

    The signal handler only takes note; the training batch in flight runs to its end, including
    its optimizer step, then every rank saves (rank 0 writes) and raises `TrainingInterrupted`.
    With gradient accumulation that is the end of the accumulation window: gradients are not in
    checkpoints. A signal during validation takes effect at the next training batch, or when
    training ends, so a scheduler's grace period (SLURM's KillWait, Kubernetes'
    terminationGracePeriodSeconds) should outlast one validation pass.

    Under several processes any rank's signal stops all of them at the same step: every
    `agree_every_n_steps` optimizer steps (and when training ends) the ranks all-reduce the
    signals they have received, one small collective and one wait for the device; between those
    steps they neither talk nor wait. So there a signal stops training up to N steps later than
    on one process, where the signal is seen at the end of the very step: budget N steps within
    the scheduler's notice (SLURM's `--signal=TERM@120`). A second Ctrl+C stops at once,
    without saving. Handlers are installed for the fit (from the sanity check on, replacing
    Lightning's SIGTERM handler, whose early exit would skip the checkpoint) and restored when
    training ends, by an exception too, or when a fit with nothing to train ends. Meanwhile
    Lightning's own per-step check for that handler's flag (a broadcast read back on the host:
    one host sync per step) is switched off: the flag can no longer be set, and a SIGTERM that
    Lightning's handler took before the fit is taken over.

    Args:
        checkpoint_dir: where `last.ckpt` is saved.
        agree_every_n_steps: under several processes, how often (in optimizer steps, at global
            steps that are multiples of N) the ranks agree whether to stop. None (volt's
            default): the trainer's `log_every_n_steps`, at whose steps Lightning waits for the
            device anyway.
    """

    def __init__(self, checkpoint_dir: str | Path, agree_every_n_steps: int | None = None) -> None:
        self.every_n_steps = check_interval(
            "callbacks.graceful_shutdown.agree_every_n_steps", agree_every_n_steps
        )
        self.checkpoint_path = Path(checkpoint_dir) / "last.ckpt"
        self.agree_every_n_steps = FALLBACK_EVERY_N_STEPS  # decided at fit start
        self._signum: int | None = None
        self._previous_handlers: dict[int, Any] = {}
        self._steps_done = 0
        self._stepped = False  # an optimizer step ran in this fit: from then on, there is to save

    def on_sanity_check_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._install()

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._install()  # again, for fits without a sanity check; installs once per fit
        self.agree_every_n_steps = steps_between_waits(trainer, self.every_n_steps)
        self._steps_done = trainer.global_step
        self._stepped = False
        if not self._previous_handlers:
            return  # not installed: Lightning's handler and its check stay in charge
        if trainer.received_sigterm:
            # Lightning's handler took a SIGTERM before ours was installed. Its flag would stop
            # this rank alone at the next batch, saving nothing; nothing is trained yet: stop.
            trainer._signal_connector.received_sigterm = False
            self._stop_now(signal.SIGTERM, None)
        _skip_lightning_sigterm_check(trainer, skip=True)

    def on_train_batch_end(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
    ) -> None:
        if trainer.global_step == self._steps_done:
            return  # inside an accumulation window: no optimizer step yet
        self._steps_done = trainer.global_step
        self._stepped = True
        if trainer.world_size == 1:
            self._stop_if_signalled(trainer, self._signum or 0)
        elif trainer.global_step % self.agree_every_n_steps == 0:  # the same step on every rank
            self._stop_if_signalled(trainer, _signal_on_any_rank(self._signum or 0, pl_module))

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # A signal that came during the last validation has had no batch end to act on.
        signum = self._signum or 0
        if trainer.world_size > 1:
            signum = _signal_on_any_rank(signum, pl_module)
        self._stop_if_signalled(trainer, signum)
        self._end(trainer)

    def on_exception(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException
    ) -> None:
        self._end(trainer)

    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # After a sanity check with no training after it (limit_train_batches=0, or a resumed run
        # that had already finished) neither of the hooks above ran.
        self._end(trainer)

    def _end(self, trainer: pl.Trainer) -> None:
        self._uninstall()
        _skip_lightning_sigterm_check(trainer, skip=False)

    def _stop_if_signalled(self, trainer: pl.Trainer, signum: int) -> None:
        if not signum:
            return
        trainer.save_checkpoint(self.checkpoint_path, weights_only=False)  # optimizer too
        if trainer.is_global_zero:
            log.warning(
                "Stopped on %s at global step %d; saved %s",
                signal.Signals(signum).name,
                trainer.global_step,
                self.checkpoint_path,
            )
        raise TrainingInterrupted(signum, self.checkpoint_path)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        if not self._stepped:
            # Nothing trained in this fit yet (setup, the sanity check, the first step's
            # compile, which can take minutes): nothing to save, so stop now, as before the fit.
            self._stop_now(signum, frame)
        if self._signum is None:
            self._signum = signum
            log.warning(
                "Received %s: training stops after this step and saves %s (Ctrl+C again: stop"
                " now, without saving)",
                signal.Signals(signum).name,
                self.checkpoint_path,
            )
        elif signum == signal.SIGINT:
            raise KeyboardInterrupt

    def _stop_now(self, signum: int, frame: FrameType | None) -> None:
        """Hand the signal to the handler this one replaced (volt.runs.stop_signals' under
        train.py, which says where the run stopped and raises), or raise here."""
        previous = self._previous_handlers.get(signum)
        self._uninstall()
        # Python's own SIGINT handler would raise KeyboardInterrupt, which Lightning turns into
        # exit status 1.
        if callable(previous) and previous is not signal.default_int_handler:
            previous(signum, frame)
        raise TrainingInterrupted(signum, None, FIRST_STEP)

    def _install(self) -> None:
        if self._previous_handlers:
            return
        if threading.current_thread() is not threading.main_thread():
            log.warning("GracefulShutdown is off: signal handlers need the main thread")
            return
        self._signum = None
        self._stepped = False
        for signum in _SIGNALS:
            self._previous_handlers[signum] = signal.signal(signum, self._on_signal)

    def _uninstall(self) -> None:
        for signum, handler in self._previous_handlers.items():
            # Only where ours is still in place: by `on_fit_end` Lightning has already put back
            # the handlers it found before the fit. None: set outside Python, cannot be put back.
            if handler is not None and signal.getsignal(signum) == self._on_signal:
                signal.signal(signum, handler)
        self._previous_handlers = {}


def _signal_on_any_rank(signum: int, pl_module: pl.LightningModule) -> int:
    """The highest signal number any rank has received (0: none); every rank must call it."""
    # torch.full, not torch.tensor: a copy from pageable host memory would wait for the GPU.
    signals = torch.full((), signum, device=pl_module.device)
    return int(all_reduce_queued(signals, op="max").item())  # waits for the device


def _skip_lightning_sigterm_check(trainer: pl.Trainer, skip: bool) -> None:
    """Turn Lightning's per-step broadcast of its SIGTERM flag off (skip) or back on.

    Lightning 2.6's training loop broadcasts `trainer.received_sigterm` from rank 0 before every
    batch and reads it on the host. The flag is set only by Lightning's SIGTERM handler, which
    this callback replaces for the fit. A Lightning without that method is left as it is.
    """
    loop = trainer.fit_loop.epoch_loop
    if not hasattr(type(loop), "_broadcast_sigterm_tensor"):
        return
    if skip:
        loop._broadcast_sigterm_tensor = lambda: None  # type: ignore[method-assign]
    else:
        loop.__dict__.pop("_broadcast_sigterm_tensor", None)
