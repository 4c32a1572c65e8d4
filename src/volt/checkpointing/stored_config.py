"""The run's config as a checkpoint stores it, read back without running anything."""

from pathlib import Path
from typing import Any

import torch

from volt.checkpointing.tensor_sizes import check_tensor_sizes

CHECKPOINT_KEY = "volt_config"


def read_stored_config(path: Path) -> dict[str, Any]:
    """The config a volt checkpoint was trained with, as plain data. Loaded with weights_only=True:
    a pickled object in the file is refused, not run. Tensors go to the meta device: the file is
    parsed whole, but no weight is read (eval reads the config several times before testing).

    The config is still data from a file: check it (`volt.config.stored`) before building
    anything from it."""
    checkpoint = torch.load(path, map_location="meta", weights_only=True)
    if CHECKPOINT_KEY not in checkpoint:
        raise KeyError(f"{path} holds no '{CHECKPOINT_KEY}': it was not written by volt's training")
    return checkpoint[CHECKPOINT_KEY]


def read_stored_checkpoint(path: Path) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """The stored config and the `state_dict` on the meta device (names, shapes and dtypes, no
    values), from one read with weights_only=True. Both are data from a file: check the config
    (`volt.config.stored`) and compare shapes before building anything from it."""
    checkpoint = torch.load(path, map_location="meta", weights_only=True)
    if CHECKPOINT_KEY not in checkpoint:
        raise KeyError(f"{path} holds no '{CHECKPOINT_KEY}': it was not written by volt's training")
    check_tensor_sizes(checkpoint, path)
    weights = checkpoint.get("state_dict")
    if not isinstance(weights, dict) or not all(
        isinstance(v, torch.Tensor) for v in weights.values()
    ):
        raise KeyError(f"{path} holds no state_dict of tensors")
    return checkpoint[CHECKPOINT_KEY], weights
