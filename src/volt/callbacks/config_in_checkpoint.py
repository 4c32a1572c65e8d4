"""The run's config in every checkpoint, so `volt.eval` can rebuild the run from the file."""

from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback

from volt.checkpointing import CHECKPOINT_KEY


class ConfigInCheckpoint(Callback):
    """Writes the run's resolved config (plain dicts and lists only) into every checkpoint."""

    def __init__(self, config: dict[str, Any]) -> None:
        self.config = config

    def on_save_checkpoint(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        checkpoint[CHECKPOINT_KEY] = self.config
