"""A sharded checkpoint's folder (torch.distributed.checkpoint, DCP) read as data a stranger may
have written: nothing in it decides which code runs, and what it declares is checked against
what the folder holds before anything is read or allocated.

torch's own reading runs code from the folder, in torch 2.11 and 2.14 alike:
`FileSystemReader.read_metadata` unpickles `.metadata` with plain `pickle.load`, and
`DefaultLoadPlanner.load_bytes` unpickles every entry that is not a tensor (an optimiser's
`param_groups`) with `torch.load(weights_only=False)`; only tensors are read with weights_only.
(pytorch/pytorch#189308 asks for a restricted unpickler; torch's SECURITY.md counts DCP among the
features for trusted files only.) Here instead:

- `.metadata` is unpickled with only the classes DCP's metadata is made of (METADATA_CLASSES,
  torch's dtypes by name, and nothing else: no function, no module's other names);
- entries that are not tensors are read with `torch.load(weights_only=True)`;
- the metadata is checked against the folder (`check_metadata`): each part of a tensor lies in
  a plain file of the folder (no path, no link, no compression) and within its size, and the
  tensors together declare no more bytes than the folder's shard files hold, as a single-file
  checkpoint's storages may not claim more than its size (`volt.checkpointing.tensor_sizes`).

Keep this after a torch fix too: volt's rule is that a checkpoint is data.
"""

import io
import pickle
import stat
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint import DefaultLoadPlanner, FileSystemReader, ReadItem
from torch.distributed.checkpoint.metadata import (
    BytesStorageMetadata,
    ChunkStorageMetadata,
    Metadata,
    MetadataIndex,
    TensorStorageMetadata,
)

from volt.checkpointing.load_errors import CheckpointLoadError, UnsafeCheckpointError
from volt.checkpointing.tensor_sizes import bytes_on_disk

METADATA_FILE = ".metadata"
_DCP_METADATA = "torch.distributed.checkpoint.metadata"
# Every global a `.metadata` of torch 2.11-2.14 names, found by unpickling real ones. Classes are
# called (REDUCE, NEWOBJ) with the file's arguments: each here only stores them.
METADATA_CLASSES = frozenset(
    {
        (_DCP_METADATA, "Metadata"),
        (_DCP_METADATA, "MetadataIndex"),
        (_DCP_METADATA, "StorageMeta"),
        (_DCP_METADATA, "TensorStorageMetadata"),
        (_DCP_METADATA, "BytesStorageMetadata"),
        (_DCP_METADATA, "ChunkStorageMetadata"),
        (_DCP_METADATA, "TensorProperties"),
        (_DCP_METADATA, "_MEM_FORMAT_ENCODING"),  # an Enum: TensorProperties' memory format
        ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),  # file, offset, length
        ("torch", "Size"),
        ("torch.serialization", "_get_layout"),  # a layout by its name ("torch.strided")
        ("pathlib", "PosixPath"),  # StorageMeta.checkpoint_id: where the folder was written
    }
)
# torch.float32 and the like, pickled as globals: values, looked up in torch's own namespace
# (never through getattr, whose module __getattr__ imports submodules by name).
_DTYPES = {name: value for name, value in vars(torch).items() if isinstance(value, torch.dtype)}


class _MetadataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in METADATA_CLASSES:
            return super().find_class(module, name)
        if module == "torch" and name in _DTYPES:
            return _DTYPES[name]
        raise pickle.UnpicklingError(
            f"{module}.{name} is not allowed: DCP metadata is made of its own classes, torch.Size"
            " and dtypes only"
        )


def read_metadata(folder: Path) -> Metadata:
    """`folder/.metadata`, unpickled with METADATA_CLASSES only and checked against the folder."""
    path = folder / METADATA_FILE
    size = plain_file_size(folder, METADATA_FILE)
    try:
        with path.open("rb") as file:
            metadata = _MetadataUnpickler(file).load()
    except Exception as error:  # the refusal above, or damage (EOFError, UnpicklingError, ...)
        raise UnsafeCheckpointError(f"{path}: {type(error).__name__}: {error}") from error
    return check_metadata(metadata, folder, size)


def check_metadata(metadata: Any, folder: Path, metadata_bytes: int) -> Metadata:
    """`metadata` once it is DCP's Metadata whose every part lies in a shard file of `folder`,
    within its size, and whose tensors declare no more bytes than those files hold. Counts are
    bounded by the size of the metadata file: a chunk takes bytes in it, unless the pickle
    repeats one object many times over (its memo), which would make the loops here run forever."""
    if not isinstance(metadata, Metadata):
        raise UnsafeCheckpointError(f"{folder}: {METADATA_FILE} holds no DCP Metadata")
    entries, storage = metadata.state_dict_metadata, metadata.storage_data
    if not isinstance(entries, dict) or not isinstance(storage, dict):
        raise UnsafeCheckpointError(f"{folder}: {METADATA_FILE} lists no entries and storage")
    tensors = {k: v for k, v in entries.items() if isinstance(v, TensorStorageMetadata)}
    chunks = sum(len(v.chunks) for v in tensors.values() if isinstance(v.chunks, list))
    if len(entries) + chunks + len(storage) > metadata_bytes:
        raise UnsafeCheckpointError(
            f"{folder}: {METADATA_FILE} lists {len(entries) + chunks + len(storage):,} parts in"
            f" {metadata_bytes:,} bytes: it repeats objects, as only a crafted file does"
        )
    declared = 0
    for key, entry in entries.items():
        if not isinstance(key, str) or not isinstance(
            entry, TensorStorageMetadata | BytesStorageMetadata
        ):
            raise UnsafeCheckpointError(f"{folder}: entry {key!r} is not a tensor or bytes")
        if isinstance(entry, TensorStorageMetadata):
            declared += _tensor_bytes(folder, key, entry)
    sizes: dict[str, int] = {}
    for index, info in storage.items():
        if not isinstance(index, MetadataIndex) or not isinstance(index.fqn, str):
            raise UnsafeCheckpointError(f"{folder}: a storage key is not DCP's MetadataIndex")
        name, offset, length = _where(folder, index.fqn, info)
        if name not in sizes:
            sizes[name] = plain_file_size(folder, name)
        if offset + length > sizes[name]:
            raise UnsafeCheckpointError(
                f"{folder}: {index.fqn} lies at bytes {offset:,}-{offset + length:,} of {name},"
                f" which holds {sizes[name]:,}: a shard is truncated"
            )
    on_disk = sum(bytes_on_disk(folder / name) for name in sizes)
    if declared > on_disk:
        raise UnsafeCheckpointError(
            f"{folder}: its tensors declare {declared:,} bytes, its shard files hold"
            f" {on_disk:,} on disk: it is truncated or crafted"
        )
    return metadata


class CheckedReader(FileSystemReader):
    """torch's FileSystemReader, its `.metadata` read by `read_metadata` (restricted, checked).
    The metadata is volt's one global file: DCP's fallback to a rank-local `__<rank>.metadata`
    (tried with `rank=` after a failed read) reads the same file again, and fails again."""

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        return read_metadata(Path(self.path))


class WeightsOnlyLoadPlanner(DefaultLoadPlanner):
    """DCP's default load planner, its entries that are not tensors read with weights_only=True
    (its own reads them with weights_only=False)."""

    def load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
        loaded = torch.load(value, weights_only=True)
        key = read_item.dest_index.fqn
        if self.flatten_state_dict:
            # where the flattened key sits in the nested state dict the caller gave (its mapping
            # was made from that state dict, not from the file)
            _put(self.original_state_dict, self.mappings[key], loaded)
        else:
            self.state_dict[key] = loaded


def _put(tree: Any, path: Sequence[str | int], value: Any) -> None:
    for step in path[:-1]:
        tree = tree[step]
    tree[path[-1]] = value


def _tensor_bytes(folder: Path, key: str, entry: TensorStorageMetadata) -> int:
    """The bytes `entry` declares, once its shape, dtype and chunks are well formed."""
    dtype = getattr(entry.properties, "dtype", None)
    shape = entry.size
    if not isinstance(dtype, torch.dtype) or not _is_shape(shape):
        raise UnsafeCheckpointError(f"{folder}: {key} has no dtype or shape")
    if not isinstance(entry.chunks, list):
        raise UnsafeCheckpointError(f"{folder}: {key} lists no chunks")
    for chunk in entry.chunks:
        if not (
            isinstance(chunk, ChunkStorageMetadata)
            and _is_shape(chunk.offsets, len(shape))
            and _is_shape(chunk.sizes, len(shape))
            and all(o + s <= n for o, s, n in zip(chunk.offsets, chunk.sizes, shape, strict=True))
        ):
            raise UnsafeCheckpointError(f"{folder}: {key} has a chunk outside its shape {shape}")
    return torch.Size(shape).numel() * dtype.itemsize


def _is_shape(value: Any, dims: int | None = None) -> bool:
    return (
        isinstance(value, torch.Size)
        and (dims is None or len(value) == dims)
        and all(isinstance(n, int) and n >= 0 for n in value)
    )


def _where(folder: Path, key: str, info: Any) -> tuple[str, int, int]:
    """(file name, offset, length) of one part, once the name is a plain file name, the numbers
    are numbers and no transform (compression, which can expand without bound) applies."""
    name = getattr(info, "relative_path", None)
    offset, length = getattr(info, "offset", None), getattr(info, "length", None)
    if not isinstance(name, str) or Path(name).name != name or name in ("", ".", ".."):
        raise UnsafeCheckpointError(
            f"{folder}: {key} is stored at {name!r}, not in a file of the checkpoint's folder"
        )
    if not (isinstance(offset, int) and isinstance(length, int) and offset >= 0 and length >= 0):
        raise UnsafeCheckpointError(f"{folder}: {key} has no offset and length in {name}")
    if getattr(info, "transform_descriptors", None):
        raise UnsafeCheckpointError(
            f"{folder}: {key} is stored transformed ({info.transform_descriptors}): volt writes"
            " and reads plain shards only"
        )
    return name, offset, length


def plain_file_size(folder: Path, name: str) -> int:
    """The size of `folder/name` once it is a plain file there: a link would have the folder's
    reader read a file elsewhere."""
    try:
        status = (folder / name).lstat()
    except FileNotFoundError:
        raise CheckpointLoadError(f"{folder} holds no {name}: it is incomplete") from None
    if not stat.S_ISREG(status.st_mode):
        raise UnsafeCheckpointError(f"{folder}: its {name} is not a plain file (a link?)")
    return status.st_size
