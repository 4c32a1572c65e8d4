"""Checkpoints a kill cannot leave half-written, single files and sharded folders; a resume
lookup that skips damaged ones; what a checkpoint stores, read back as data."""

from volt.checkpointing.atomic_io import AtomicCheckpointIO, find_latest_valid_checkpoint
from volt.checkpointing.load_errors import CheckpointLoadError, UnsafeCheckpointError
from volt.checkpointing.sharded import (
    begin_sharded_save,
    finish_sharded_save,
    is_sharded_checkpoint,
    read_sharded_checkpoint,
    read_sharded_into,
    read_sharded_weights,
    remove_sharded_checkpoint,
    write_sharded,
)
from volt.checkpointing.stored_config import (
    CHECKPOINT_KEY,
    read_stored_checkpoint,
    read_stored_config,
    read_trained_weights,
    read_weight_outline,
    weights_disagreement,
)
from volt.checkpointing.tensor_sizes import measure_checkpoint_files

__all__ = [
    "CHECKPOINT_KEY",
    "AtomicCheckpointIO",
    "CheckpointLoadError",
    "UnsafeCheckpointError",
    "begin_sharded_save",
    "find_latest_valid_checkpoint",
    "finish_sharded_save",
    "is_sharded_checkpoint",
    "measure_checkpoint_files",
    "read_sharded_checkpoint",
    "read_sharded_into",
    "read_sharded_weights",
    "read_stored_checkpoint",
    "read_stored_config",
    "read_trained_weights",
    "read_weight_outline",
    "remove_sharded_checkpoint",
    "weights_disagreement",
    "write_sharded",
]
