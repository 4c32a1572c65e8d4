"""The run's config and weights as a checkpoint stores them, read back without running
anything; and whether a module fits those weights."""

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from volt.checkpointing.sharded import (
    is_sharded_checkpoint,
    read_sharded_outline,
    read_sharded_weights,
)
from volt.checkpointing.tensor_sizes import check_expanded_size, check_tensor_sizes
from volt.errors import escaped

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


# Weight entries a checkpoint may hold: the module's, and under ema= the trained weights beside
# the average (volt.callbacks.weight_averaging).
WEIGHT_ENTRIES = ("state_dict", "current_model_state")
NAMES_SHOWN = 3  # of each kind of disagreement, each cut to NAME_CHARS
NAME_CHARS = 80


def read_weight_outline(path: Path) -> dict[str, Any]:
    """A checkpoint's WEIGHT_ENTRIES (`state_dict` always, {} where the file lacks it), names
    and shapes as meta tensors: no weight read. A sharded checkpoint's from its metadata."""
    if is_sharded_checkpoint(path):
        return {"state_dict": read_sharded_outline(path)[1]}
    check_expanded_size(path)
    checkpoint = torch.load(path, map_location="meta", weights_only=True)
    return {
        k: checkpoint.get(k, {}) for k in WEIGHT_ENTRIES if k == "state_dict" or k in checkpoint
    }


def weights_disagreement(module: torch.nn.Module, weights: Any, strict: bool = True) -> str:
    """What `module.load_state_dict(weights, strict)` would refuse, said in a few names (escaped,
    cut short), or "" where it would load them: names one side lacks (unless not `strict`),
    shapes that differ. The module's state that is no tensor (extra state) is not compared."""
    built = {k: v for k, v in module.state_dict().items() if isinstance(v, torch.Tensor)}
    stored = weights if isinstance(weights, Mapping) else {}
    missing = sorted(built.keys() - stored.keys()) if strict else []
    unexpected = sorted(map(str, stored.keys() - built.keys())) if strict else []
    reshaped = sorted(k for k, v in built.items() if k in stored and _shape(stored[k]) != v.shape)
    said = [f"not in the file: {_names(missing)}"] if missing else []
    said += [f"not in the model: {_names(unexpected)}"] if unexpected else []
    if reshaped:
        both = {
            k: f" {_shape(stored[k])} in the file, {_shape(built[k])} in the model"
            for k in reshaped
        }
        said.append(f"other shapes: {_names(reshaped, both)}")
    return "; ".join(said)


def _shape(value: Any) -> tuple[int, ...] | str:
    return tuple(value.shape) if isinstance(value, torch.Tensor) else type(value).__name__


def _names(names: list[str], after: Mapping[str, str] | None = None) -> str:
    """The first NAMES_SHOWN of `names`, each escaped and cut to NAME_CHARS, then how many more."""
    shown = [escaped(n) for n in names[:NAMES_SHOWN]]
    shown = [n if len(n) <= NAME_CHARS else f"{n[: NAME_CHARS - 3]}..." for n in shown]
    said = ", ".join(n + (after or {}).get(name, "") for n, name in zip(shown, names, strict=False))
    more = len(names) - NAMES_SHOWN
    return said + (f" and {more:,} more" if more > 0 else "")


def _stored_config(checkpoint: dict[str, Any], path: Path) -> dict[str, Any]:
    if CHECKPOINT_KEY not in checkpoint:
        raise KeyError(f"{path} holds no '{CHECKPOINT_KEY}': it was not written by volt's training")
    return checkpoint[CHECKPOINT_KEY]
