"""A checkpoint's tensors may not claim more memory than the file holds.

torch.load builds what a file declares: a tensor saved as a stride-0 view of one number
(`torch.zeros(()).expand(16384, 16384)`) is a few bytes on disk and a full matrix once anything
copies it (an optimiser's `load_state_dict` casts its state; a module's `load_state_dict` copies
into its weights); storages declared larger than their bytes in the file are read as sized on the
meta device, where volt compares shapes. Both made a file of kilobytes ask for gigabytes. Honest
checkpoints hold contiguous tensors whose storages are written whole, so the storages add up to
less than the file's size. A checkpoint is a zip, and torch.save stores its entries
uncompressed: a pickle re-zipped with DEFLATE around a 1.5 GB string is a 2.5 MB file that
torch.load expands whole, so what the entries expand to is checked against the file first.
"""

import zipfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import torch

# What a checkpoint's zip entries may expand to beyond the file's own size (zip headers aside,
# torch.save's entries take as many bytes in the file as out of it).
EXPANSION_ALLOWED = 64 * 2**20


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
    declared, size = sum(storages.values()), bytes_on_disk(path)
    if declared > size:
        raise OversizedTensorError(
            f"{path}: its tensors declare {declared:,} bytes, the file holds {size:,} on disk: it"
            " is truncated or crafted"
        )


# How `bytes_on_disk` measures a file in this process (`measure_checkpoint_files`).
_BY_APPARENT_SIZE = False


def measure_checkpoint_files(by: str) -> None:
    """The command line's `checkpoint_bytes`, for this process: "allocated" (the blocks a file
    takes on disk) or "apparent" (its size). For a compressing file system (ZFS, or btrfs with
    compression on), where a genuine checkpoint takes fewer blocks than the bytes it holds and
    would be refused; a sparse crafted file then passes, and loading it allocates what it
    declares."""
    global _BY_APPARENT_SIZE
    _BY_APPARENT_SIZE = by == "apparent"


def bytes_on_disk(path: Path) -> int:
    """What `path` really takes on disk, at most its size: its allocated blocks (512 bytes each,
    whatever the file system's block size). A sparse file (a hole where its tensors should be)
    has an apparent size of gigabytes and holds nothing, and reading it allocates all of them."""
    status = path.stat()
    if _BY_APPARENT_SIZE:
        return status.st_size
    return min(status.st_size, status.st_blocks * 512)


def check_expanded_size(path: Path) -> None:
    """Raise OversizedTensorError where the entries of the zip at `path` expand to more than
    the file holds (and EXPANSION_ALLOWED): before torch.load, which reads an entry into a
    buffer of the size its zip directory declares. A file that is no zip is left to it."""
    try:
        with zipfile.ZipFile(path) as archive:
            expanded = sum(entry.file_size for entry in archive.infolist())
    except (zipfile.BadZipFile, OSError):
        return
    size = path.stat().st_size
    if expanded > size + EXPANSION_ALLOWED:
        raise OversizedTensorError(
            f"{path}: its entries expand to {expanded:,} bytes from a file of {size:,}:"
            " torch.save stores them uncompressed, so it is crafted"
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
