"""Callbacks that DDP tests add to a run with `+callbacks.<name>={_target_: ...}`.

They travel in the run's config like any callback, so each rank builds its own: rank 0 from
Hydra's config, the ranks volt starts from the run's resolved config. (Importable as
`tests.strategies.rank_probes` from the project root, where the tests start every command.)
"""

import os
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback


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
            raise RuntimeError(f"injected failure on rank {self.rank} ({self.when})")
