"""Sharded checkpoints: one folder that every rank of `trainer=fsdp` writes its own part of,
read back by any number of ranks, or by one process with no process group (eval).

    checkpoints/epoch003-step=120.ckpt/   (a folder: `*.ckpt`, as Lightning's sharded ones)
        __0_0.distcp  __1_0.distcp ...  each rank's shards of the weights and optimiser states,
                                        written by that rank (torch.distributed.checkpoint, DCP)
        .metadata                       which file holds which part of which tensor (DCP's;
                                        rank 0 writes it once every rank has written)
        meta.pt                         the rest of the checkpoint: loops, callbacks, schedulers,
                                        hyperparameters, volt's config (rank 0; torch.save of
                                        plain values and small tensors, read with weights_only)

The layout and names are those of Lightning's ModelParallelStrategy (`state_dict`,
`optimizer_<i>` inside DCP, `meta.pt` beside it); volt reads them through
`volt.checkpointing.dcp_reading`, where nothing in the folder runs code.

A save writes into a temporary folder beside the target (`.volt-ckpt-tmp-...`, invisible to
resume and to Lightning's lookups) and renames it into place once every rank wrote and the
files are fsynced. A target that exists already (last.ckpt) is first renamed away, then
deleted: a kill between the two renames leaves no `last.ckpt` (resume takes the newest other
checkpoint), never a partial one.
"""

import contextlib
import logging
import os
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemWriter
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.metadata import TensorStorageMetadata

from volt.checkpointing.dcp_reading import (
    CheckedReader,
    WeightsOnlyLoadPlanner,
    plain_file_size,
    read_metadata,
)
from volt.checkpointing.load_errors import CheckpointLoadError
from volt.checkpointing.temporaries import (
    fsync_directory,
    remove_dead_writers_temporaries,
    remove_sharded_folder,
    remove_temporary,
    temp_name,
)
from volt.checkpointing.tensor_sizes import (
    OversizedTensorError,
    check_expanded_size,
    check_tensor_sizes,
)

log = logging.getLogger(__name__)

META_FILE = "meta.pt"  # Lightning's name (lightning.fabric.utilities.load._METADATA_FILENAME)
WEIGHTS = "state_dict"  # the model's entries in DCP: "state_dict.<parameter name>"


def is_sharded_checkpoint(path: Path) -> bool:
    """A checkpoint given as a folder is a sharded one (complete or not: reading it tells)."""
    return path.is_dir()


def begin_sharded_save(target: Path) -> Path:
    """Rank 0: an empty temporary folder beside `target` to write into (leftovers of killed
    writers there deleted first)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    remove_dead_writers_temporaries(target.parent)
    folder = target.parent / temp_name()
    folder.mkdir()
    return folder


def write_sharded(checkpoint: dict[str, Any], folder: Path, coordinator: bool) -> None:
    """Every rank at once (DCP's collectives): this rank's shards of `checkpoint`'s state_dict and
    optimizer_states into `folder`, then, by the coordinator, the rest into meta.pt. Those two
    entries are taken out of `checkpoint`. Without a process group, one process writes all."""
    tensors = {WEIGHTS: checkpoint.pop(WEIGHTS)}
    for i, state in enumerate(checkpoint.pop("optimizer_states", [])):
        tensors[f"optimizer_{i}"] = state
    writer = FileSystemWriter(folder, overwrite=False)  # fsyncs each file it writes
    with _quiet_without_group():
        dcp.save(tensors, storage_writer=writer, no_dist=not dist.is_initialized())
    if coordinator:
        with (folder / META_FILE).open("xb") as file:
            torch.save(checkpoint, file)
            file.flush()
            os.fsync(file.fileno())


def finish_sharded_save(folder: Path, target: Path) -> None:
    """Rank 0, once every rank wrote: `folder` becomes `target` by a rename (see the module
    docstring for a target that exists already)."""
    fsync_directory(folder)  # its files' names before the folder's own
    if target.exists() or target.is_symlink():
        old = target.parent / temp_name()
        os.rename(target, old)
        os.rename(folder, target)
        fsync_directory(target.parent)
        remove_temporary(old)
    else:
        os.rename(folder, target)
        fsync_directory(target.parent)


def remove_sharded_checkpoint(path: Path, inside: Sequence[Path]) -> None:
    """Deletes the sharded checkpoint at `path` if it lies in one of the folders `inside` (a
    ModelCheckpoint's dirpath; the path may come from a restored callback state) and is no link.
    Renamed out of the `*.ckpt` names first, so that resume never finds it half deleted; then
    its files, never recursively (`volt.checkpointing.temporaries.remove_sharded_folder`)."""
    folders = [folder.resolve() for folder in inside]
    if path.is_symlink() or not any(path.resolve().is_relative_to(f) for f in folders):
        log.warning(
            "not removing %s: a sharded checkpoint is removed only inside %s, never through a link",
            path,
            ", ".join(map(str, folders)) or "a checkpoint callback's folder",
        )
        return
    trash = path.parent / temp_name()
    os.rename(path, trash)
    remove_sharded_folder(trash)


def read_sharded_into(state: dict[str, Any], folder: Path, strict: bool) -> dict[str, Any]:
    """Every rank at once: `state` ({"state_dict": ..., "optimizer_0": ...} of this rank's
    DTensors) filled in place from `folder`, each rank reading only the parts of the files its
    shards overlap, whatever the number of ranks that wrote them. Returns the rest (meta.pt)."""
    planner = WeightsOnlyLoadPlanner(allow_partial_load=not strict)
    _load(state, folder, planner, no_dist=False)
    return _read_meta(folder, "cpu")


def read_sharded_weights(folder: Path) -> dict[str, torch.Tensor]:
    """The model's full state_dict, read by one process without a process group: one copy of
    the weights in memory, none of the optimiser states."""
    entries = read_metadata(folder).state_dict_metadata
    prefix = f"{WEIGHTS}."
    state: dict[str, Any] = {
        key: torch.empty(entry.size, dtype=entry.properties.dtype)
        if isinstance(entry, TensorStorageMetadata)
        else None  # bytes: replaced by what they hold
        for key, entry in entries.items()
        if key.startswith(prefix)
    }
    _load(state, folder, WeightsOnlyLoadPlanner(flatten_state_dict=False), no_dist=True)
    return {key.removeprefix(prefix): value for key, value in state.items()}


def read_sharded_checkpoint(folder: Path) -> dict[str, Any]:
    """What a single-file checkpoint loads as, less the optimiser states: meta.pt's contents and
    the full `state_dict`, read by one process (eval's Trainer, through AtomicCheckpointIO)."""
    return {**_read_meta(folder, "cpu"), WEIGHTS: read_sharded_weights(folder)}


def read_sharded_outline(folder: Path) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """meta.pt's contents, its tensors on the meta device, and the state_dict's names, shapes
    and dtypes as meta tensors: the whole checkpoint checked (`read_metadata`) and parsed, no
    weight read. What resume's lookup and eval's first look need."""
    weights = {
        key.removeprefix(f"{WEIGHTS}."): torch.empty(
            entry.size, dtype=entry.properties.dtype, device="meta"
        )
        for key, entry in read_metadata(folder).state_dict_metadata.items()
        if key.startswith(f"{WEIGHTS}.") and isinstance(entry, TensorStorageMetadata)
    }
    return _read_meta(folder, "meta"), weights


def _load(state: dict[str, Any], folder: Path, planner: Any, no_dist: bool) -> None:
    read_metadata(folder)  # its refusal, on its own: DCP would wrap it in a traceback per rank
    try:
        with _quiet_without_group():
            dcp.load(state, storage_reader=CheckedReader(folder), planner=planner, no_dist=no_dist)
    # DCP gathers each rank's error into one CheckpointException (a BaseException, so that no
    # `except Exception` takes it for an ordinary one); the first rank's says what went wrong.
    except CheckpointException as error:
        rank, (cause, _) = min(error.failures.items(), key=lambda item: item[0])
        raise CheckpointLoadError(
            f"Cannot load checkpoint {folder} (rank {rank}): {type(cause).__name__}: {cause}"
        ) from cause


def _read_meta(folder: Path, map_location: str) -> dict[str, Any]:
    path = folder / META_FILE
    plain_file_size(folder, META_FILE)
    try:
        check_expanded_size(path)
        meta = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as error:  # as AtomicCheckpointIO reports a single file that does not load
        raise CheckpointLoadError(
            f"Cannot load {path}: {type(error).__name__}: {error}; it is damaged, or holds"
            " objects that torch.load(weights_only=True) refuses"
        ) from error
    if not isinstance(meta, dict):
        raise CheckpointLoadError(f"{path} holds a {type(meta).__name__}, not a dict")
    try:
        check_tensor_sizes(meta, path)
    except OversizedTensorError as error:
        raise CheckpointLoadError(f"Cannot load checkpoint {error}") from error
    return meta


@contextlib.contextmanager
def _quiet_without_group() -> Iterator[None]:
    # DCP warns that it "assumes the intent" to work in one process whenever it has no process
    # group; here that is the intent (eval, tests), and the warning only misleads.
    with warnings.catch_warnings():
        warnings.filterwarnings(
            "ignore", message="torch.distributed is disabled, unavailable or uninitialized"
        )
        yield
