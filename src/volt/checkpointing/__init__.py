"""Checkpoint files a kill cannot leave half-written; a resume lookup that skips damaged ones."""

from volt.checkpointing.atomic_io import (
    AtomicCheckpointIO,
    CheckpointLoadError,
    find_latest_valid_checkpoint,
)
from volt.checkpointing.stored_config import (
    CHECKPOINT_KEY,
    read_stored_checkpoint,
    read_stored_config,
)

__all__ = [
    "CHECKPOINT_KEY",
    "AtomicCheckpointIO",
    "CheckpointLoadError",
    "find_latest_valid_checkpoint",
    "read_stored_checkpoint",
    "read_stored_config",
]
