"""A checkpoint's tensors may not claim more memory than the file holds.

torch.load builds what a file declares: a tensor saved as a stride-0 view of one number
(`torch.zeros(()).expand(16384, 16384)`) is a few bytes on disk and a full matrix once anything
copies it (an optimiser's `load_state_dict` casts its state; a module's `load_state_dict` copies
into its weights); storages declared larger than their bytes in the file are read as sized on the
meta device, where volt compares shapes. Both made a file of kilobytes ask for gigabytes. Honest
checkpoints hold contiguous tensors whose storages are written whole, so the storages add up to
less than the file's size.
"""

from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import torch


class OversizedTensorError(ValueError):
    """A tensor in the file claims memory that the file does not hold."""


def check_tensor_sizes(checkpoint: Any, path: Path) -> None:
    """Raise OversizedTensorError for a tensor larger than its storage, or (for tensors loaded
    off the meta device) storages that add up to more bytes than the file at `path` has."""
    storages: dict[int, int] = {}
    for key, tensor in _tensors(checkpoint, ""):
        storage = tensor.untyped_storage()
        if tensor.numel() * tensor.element_size() > storage.nbytes():
            raise OversizedTensorError(
                f"{path}: {key or 'the checkpoint'} of shape {tuple(tensor.shape)} is larger than"
                f" its storage ({storage.nbytes()} bytes): an expanded view, which loading copies"
                " to full size"
            )
        # Storages are told apart by where their bytes are: tied weights share theirs. On the
        # meta device every tensor gets a storage of its own (torch 2.14), so there the sum
        # would count a tied weight twice: it is checked where the bytes are loaded (or mapped).
        if tensor.device.type != "meta":
            storages[storage.data_ptr()] = storage.nbytes()
    declared, size = sum(storages.values()), path.stat().st_size
    if declared > size:
        raise OversizedTensorError(
            f"{path}: its tensors declare {declared:,} bytes, the file holds {size:,}: it is"
            " truncated or crafted"
        )


def _tensors(node: Any, key: str) -> Iterator[tuple[str, torch.Tensor]]:
    if isinstance(node, torch.Tensor):
        yield key, node
    elif isinstance(node, Mapping):
        for k, value in node.items():
            yield from _tensors(value, f"{key}.{k}" if key else str(k))
    elif isinstance(node, list | tuple):
        for i, value in enumerate(node):
            yield from _tensors(value, f"{key}[{i}]")
