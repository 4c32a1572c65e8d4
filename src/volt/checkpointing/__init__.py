"""Checkpoint files a kill cannot leave half-written; a resume lookup that skips damaged ones."""

from volt.checkpointing.atomic_io import (
    AtomicCheckpointIO,
    CheckpointLoadError,
    find_latest_valid_checkpoint,
)

__all__ = ["AtomicCheckpointIO", "CheckpointLoadError", "find_latest_valid_checkpoint"]
