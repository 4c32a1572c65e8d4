"""The run's config as a checkpoint stores it, read back without running anything."""

from pathlib import Path
from typing import Any

import torch

CHECKPOINT_KEY = "volt_config"


def read_stored_config(path: Path) -> dict[str, Any]:
    """The config a volt checkpoint was trained with, as plain data. Loaded with weights_only=True:
    a pickled object in the file is refused, not run. Tensors go to the meta device: the file is
    parsed whole, but no weight is read (eval reads the config several times before testing).

    The config is still data from a file: check it (`volt.config.targets.check_stored_config`)
    before building anything from it."""
    checkpoint = torch.load(path, map_location="meta", weights_only=True)
    if CHECKPOINT_KEY not in checkpoint:
        raise KeyError(f"{path} holds no '{CHECKPOINT_KEY}': it was not written by volt's training")
    return checkpoint[CHECKPOINT_KEY]
