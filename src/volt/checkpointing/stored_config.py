"""The run's config as a checkpoint stores it, read back without running anything."""

from pathlib import Path
from typing import Any

import torch

from volt.checkpointing.sharded import (
    is_sharded_checkpoint,
    read_sharded_outline,
    read_sharded_weights,
)
from volt.checkpointing.tensor_sizes import check_expanded_size, check_tensor_sizes

CHECKPOINT_KEY = "volt_config"


def read_stored_config(path: Path) -> dict[str, Any]:
    """The config a volt checkpoint was trained with, as plain data. Loaded with weights_only=True:
    a pickled object in the file is refused, not run. Tensors go to the meta device: the file is
    parsed whole, but no weight is read (eval reads the config several times before testing).
    A sharded checkpoint (a folder) keeps it in its meta.pt, read the same way, after its DCP
    metadata is read without running code (`volt.checkpointing.dcp_reading`).

    The config is still data from a file: check it (`volt.config.stored`) before building
    anything from it."""
    if is_sharded_checkpoint(path):
        checkpoint, _ = read_sharded_outline(path)
    else:
        checkpoint = torch.load(path, map_location="meta", weights_only=True)
    return _stored_config(checkpoint, path)


def read_stored_checkpoint(path: Path) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """The stored config and the `state_dict` (names, shapes and dtypes; its values mapped from
    the file, not read; of a sharded checkpoint, meta tensors from its metadata), from one load
    with weights_only=True. Both are data from a file: check the config (`volt.config.stored`)
    and compare shapes before building anything from it."""
    if is_sharded_checkpoint(path):
        meta, weights = read_sharded_outline(path)  # sizes checked against its files
        return _stored_config(meta, path), weights
    # Mapped, not read: the tensors' bytes stay in the file until something touches them, and
    # their storages are the file's own, so what they claim is checked against what it holds.
    check_expanded_size(path)
    checkpoint = torch.load(path, map_location="cpu", mmap=True, weights_only=True)
    config = _stored_config(checkpoint, path)
    check_tensor_sizes(checkpoint, path)
    weights = checkpoint.get("state_dict")
    if not isinstance(weights, dict) or not all(
        isinstance(v, torch.Tensor) for v in weights.values()
    ):
        raise KeyError(f"{path} holds no state_dict of tensors")
    return config, weights


def read_trained_weights(path: Path) -> dict[str, torch.Tensor]:
    """The `state_dict` of a volt checkpoint, file or sharded folder, read with weights_only."""
    if is_sharded_checkpoint(path):
        return read_sharded_weights(path)
    check_expanded_size(path)
    return torch.load(path, map_location="cpu", weights_only=True)["state_dict"]


def _stored_config(checkpoint: dict[str, Any], path: Path) -> dict[str, Any]:
    if CHECKPOINT_KEY not in checkpoint:
        raise KeyError(f"{path} holds no '{CHECKPOINT_KEY}': it was not written by volt's training")
    return checkpoint[CHECKPOINT_KEY]
