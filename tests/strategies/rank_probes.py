"""Callbacks that DDP tests add to a run with `+callbacks.<name>={_target_: ...}`.

They travel in the run's config like any callback, so each rank builds its own: rank 0 from
Hydra's config, the ranks volt starts from the run's resolved config. (Importable as
`tests.strategies.rank_probes` from the project root, where the tests start every command.)
"""

import ctypes
import math
import os
import signal as signal_module
import threading
import time
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback
from torch.nn.modules.batchnorm import _BatchNorm


def note_the_failure(trainer: pl.Trainer) -> None:
    """<run dir>/failed_at.txt: when a probe made its rank fail (seconds since the epoch), so a
    test can tell how long the run took to end after it."""
    Path(trainer.default_root_dir, "failed_at.txt").write_text(repr(time.time()))


def rank_of_this_process() -> int:
    # Before the Trainer sets ranks up: torchrun sets RANK; volt's launcher sets LOCAL_RANK.
    return int(os.environ.get("RANK", os.environ.get("LOCAL_RANK", "0")))


class RecordLearningRate(Callback):
    """Writes the learning rate this rank's optimiser starts with to <run dir>/lr_rank<N>.txt."""

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        lr = trainer.optimizers[0].param_groups[0]["lr"]
        Path(trainer.default_root_dir, f"lr_rank{trainer.global_rank}.txt").write_text(repr(lr))


class FailOnRank(Callback):
    """Raises on rank `rank` only: when built (before any process group exists) or in training."""

    def __init__(self, rank: int, when: str) -> None:
        if when not in ("built", "training"):
            raise ValueError(f"when={when!r}: use built or training")
        self.rank = rank
        self.when = when
        if when == "built" and rank_of_this_process() == rank:
            raise RuntimeError(f"injected failure on rank {rank} ({when})")

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, *args: Any
    ) -> None:
        if (
            self.when == "training"
            and trainer.global_rank == self.rank
            and trainer.global_step == 3
        ):
            note_the_failure(trainer)
            raise RuntimeError(f"injected failure on rank {self.rank} ({self.when})")


class NaNInputOnRank(Callback):
    """Fills the inputs of global step `step` with NaN on rank `rank` only, so that this rank's
    loss (and, after DDP's all-reduce, every rank's gradients) turn NaN while the other ranks'
    losses stay finite (unless BatchNorm statistics are synchronised: keep sync_batchnorm off)."""

    def __init__(self, rank: int, step: int) -> None:
        self.rank = rank
        self.step = step

    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        if trainer.global_rank == self.rank and trainer.global_step == self.step:
            note_the_failure(trainer)
            batch[0].fill_(math.nan)


class RecordBatchNorm(Callback):
    """Writes this rank's BatchNorm layer classes and their running means at the end of training
    to <run dir>/batchnorm_rank<N>.pt: synchronised layers end with the same statistics."""

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        layers = [m for m in pl_module.modules() if isinstance(m, _BatchNorm)]
        record = {
            "classes": sorted({f"{type(m).__module__}.{type(m).__name__}" for m in layers}),
            "running_means": [m.running_mean.cpu() for m in layers],
        }
        torch.save(
            record, Path(trainer.default_root_dir, f"batchnorm_rank{trainer.global_rank}.pt")
        )


class SaveWhenTrainingStarts(Callback):
    """Every rank saves <run dir>/restored.ckpt as training starts, after any resume restored
    the state (all ranks: a sharded strategy gathers the full state from each of them)."""

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        trainer.save_checkpoint(Path(trainer.default_root_dir, "restored.ckpt"))


class OutOfMemoryOnRank(Callback):
    """Runs out of GPU memory on rank `rank` (-1: every rank) at global step 3: torch's error
    raised here, or with `real` a real one, asking the GPU for a petabyte. What the other ranks
    do then (`others`): `continue` (under gloo their next collective fails at once); `wait` at
    that step for good, as in an NCCL collective for a peer that is gone; `hang` there holding
    the interpreter's lock, as in a CUDA call blocked behind such a collective, where no other
    thread of the process runs again."""

    def __init__(self, rank: int, others: str = "continue", real: bool = False) -> None:
        if others not in ("continue", "wait", "hang"):
            raise ValueError(f"others={others!r}")
        self.rank = rank
        self.others = others
        self.real = real

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, *args: Any
    ) -> None:
        if trainer.global_step != 3:
            return
        if self.rank in (-1, trainer.global_rank):
            note_the_failure(trainer)
            if self.real:
                torch.empty(2**50, dtype=torch.uint8, device=pl_module.device)
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB")
        if self.others == "wait":
            threading.Event().wait()
        elif self.others == "hang":
            ctypes.PyDLL(None).sleep(3600)  # libc's sleep, called without releasing the GIL


class SignalAt(Callback):
    """Rank 0 sends `signal` at `moment` (setup, training, validation, checkpoint, test) to
    itself alone (`whom: rank0`, as `kill PID` does) or to every process of the run (`whom:
    all`, as Ctrl+C in a terminal or a scheduler does), once per run directory: it writes the
    time to <run dir>/signalled_at.txt, and a run that finds the file (a resumed one) sends none.
    """

    MOMENTS = ("setup", "training", "validation", "checkpoint", "test")

    def __init__(self, moment: str, whom: str, signal: str = "SIGTERM") -> None:
        if moment not in self.MOMENTS or whom not in ("rank0", "all"):
            raise ValueError(f"moment={moment!r} whom={whom!r}")
        self.moment, self.whom = moment, whom
        self.signum = getattr(signal_module, signal)

    def _send(self, trainer: pl.Trainer, moment: str) -> None:
        record = Path(trainer.default_root_dir, "signalled_at.txt")
        if moment != self.moment or trainer.global_rank != 0 or record.exists():
            return
        record.write_text(repr(time.time()))
        if self.whom == "all":
            os.killpg(os.getpgrp(), self.signum)
        else:
            os.kill(os.getpid(), self.signum)

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self._send(trainer, "setup" if stage == "fit" else "")

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, *args: Any
    ) -> None:
        self._send(trainer, "training" if trainer.global_step == 3 else "")

    def on_validation_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, *args: Any
    ) -> None:
        self._send(trainer, "" if trainer.sanity_checking else "validation")

    def on_save_checkpoint(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        self._send(trainer, "checkpoint")

    def on_test_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, *args: Any
    ) -> None:
        self._send(trainer, "test")


class RecordClipping(Callback):
    """Writes the function this rank's precision plugin clips gradients by norm with, and the one
    its optimiser steps with (module and name), to <run dir>/clip_rank<N>.txt and
    step_rank<N>.txt."""

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        clip = trainer.precision_plugin.clip_grad_by_norm
        clip = getattr(clip, "func", clip)  # a functools.partial's function
        step = trainer.optimizers[0].step
        step = getattr(step, "__func__", step)  # a bound method's function (torch's own step)
        for name, function in (("clip", clip), ("step", step)):
            text = f"{function.__module__}.{function.__qualname__}"
            Path(trainer.default_root_dir, f"{name}_rank{trainer.global_rank}.txt").write_text(text)
