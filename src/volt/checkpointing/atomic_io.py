"""Checkpoint files that survive a kill at any instant, and a resume lookup that skips damaged ones.

Lightning's own TorchCheckpointIO stages each file in the system temp directory and moves it
over the target. When that directory is on another filesystem than the checkpoints (a local /tmp,
checkpoints on NFS or Lustre) the move is a plain copy onto the target, so a kill mid-copy leaves
a truncated checkpoint; and nothing is fsynced, so a power loss can leave an empty one.
"""

import logging
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import torch
from lightning.pytorch.plugins.io import TorchCheckpointIO

from volt.checkpointing.load_errors import CheckpointLoadError
from volt.checkpointing.sharded import (
    is_sharded_checkpoint,
    read_sharded_checkpoint,
    read_sharded_outline,
)
from volt.checkpointing.temporaries import (
    fsync_directory,
    remove_dead_writers_temporaries,
    temp_name,
)
from volt.checkpointing.tensor_sizes import (
    OversizedTensorError,
    check_expanded_size,
    check_tensor_sizes,
)
from volt.errors import escaped

log = logging.getLogger(__name__)
T = TypeVar("T")

# the names Lightning's ModelCheckpoint gives its save_last file: last.ckpt, last-v1.ckpt, ...
_LAST_STEM = re.compile(r"last(-v\d+)?")


class AtomicCheckpointIO(TorchCheckpointIO):
    """Saves through a temporary file in the target's directory, fsynced, then renamed into place.

    A kill at any instant leaves the previous file or the new one under the target name, never a
    partial one. Loads use `torch.load(weights_only=True)` unless the caller asks otherwise, and a
    file that does not load raises `CheckpointLoadError` naming it. Local paths only.
    """

    def __init__(self) -> None:
        super().__init__()
        if os.name != "posix":
            raise RuntimeError(
                f"AtomicCheckpointIO needs POSIX rename and directory fsync (os.name={os.name!r}); "
                "remove it from trainer.plugins to use Lightning's default TorchCheckpointIO"
            )

    def save_checkpoint(
        self, checkpoint: dict[str, Any], path: str | Path, storage_options: Any | None = None
    ) -> None:
        if storage_options is not None:
            raise TypeError(
                f"AtomicCheckpointIO takes no storage_options, got {storage_options!r}; "
                "call Trainer.save_checkpoint without it"
            )
        target = _local_path(path)
        directory = target.parent
        directory.mkdir(parents=True, exist_ok=True)
        remove_dead_writers_temporaries(directory)
        temp = directory / temp_name()
        # O_EXCL: never write into a file that already exists. Mode 0o666 lets the umask decide
        # the permissions, as for any other file the run creates.
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        try:
            with os.fdopen(fd, "wb") as file:
                torch.save(checkpoint, file)
                file.flush()
                # without this the rename can reach the disk before the data does, and a power
                # loss leaves an empty file under the target name
                os.fsync(file.fileno())
            os.replace(temp, target)
        except BaseException:
            temp.unlink(missing_ok=True)
            raise
        # makes the rename itself survive a power loss; a killed process needs only os.replace
        fsync_directory(directory)

    def load_checkpoint(
        self, path: str | Path, map_location: Any = "cpu", weights_only: bool | None = None
    ) -> dict[str, Any]:
        # Lightning passes weights_only=None unless the user set it: volt's checkpoints hold only
        # tensors and plain values, so None means True here. A sharded checkpoint (a folder, of
        # trainer=fsdp) is read whole by this one process, its optimiser states left out: what
        # eval's Trainer needs; trainer=fsdp resumes one itself, each rank reading its shards.
        target = _local_path(path)
        if is_sharded_checkpoint(target):
            return _load_folder(target, read_sharded_checkpoint)
        return _load(target, map_location, weights_only is not False)

    def remove_checkpoint(self, path: str | Path) -> None:
        """Deletes one checkpoint file, never a folder: Lightning's own removes recursively
        whatever path it is given (`fs.rm(path, recursive=True)`), and the path can come from a
        restored callback state (volt.callbacks.restored_paths). Sharded checkpoints are
        removed by the strategy that writes them (volt.strategies.fsdp), file by file."""
        target = _local_path(path)
        if target.is_dir() and not target.is_symlink():
            log.warning("not removing %s: a checkpoint is a file, and this is a folder", target)
            return
        target.unlink(missing_ok=True)


def find_latest_valid_checkpoint(
    directory: Path, pattern: str = "*.ckpt"
) -> tuple[Path | None, list[tuple[Path, str]]]:
    """The checkpoint to resume from in `directory`, and the (file, reason) pairs passed over.

    `last.ckpt` (or Lightning's `last-vN.ckpt`) comes first, newest first, then every other match
    newest first: ModelCheckpoint rewrites last.ckpt after each save and at the end of training,
    while its top-k files are kept for their score, not their age. Times are those of the
    directory entries, so a `save_last="link"` symlink counts from when it was made.

    Each candidate is loaded onto the meta device: that parses the whole file (zip directory,
    pickled structure) but reads no tensor bytes, so a truncated or foreign file is caught in
    milliseconds even for a checkpoint of many GB. A sharded checkpoint (a folder) is checked
    likewise: its metadata against its shard files (present, long enough), its meta.pt parsed.
    A name with a control character (a newline, say) is passed over: volt never writes one, and
    logged as it is it would forge a line of train.log; so is a file whose state_dict holds such a
    key (`_load`). A missing directory gives (None, []).
    """
    if not directory.is_dir():
        return None, []
    candidates = sorted(
        directory.glob(pattern),
        key=lambda path: (_LAST_STEM.fullmatch(path.stem) is not None, path.lstat().st_mtime),
        reverse=True,
    )
    skipped: list[tuple[Path, str]] = []
    for path in candidates:
        if not path.name.isprintable():
            skipped.append((path, "its name holds a control character, which volt never writes"))
            continue
        try:
            if is_sharded_checkpoint(path):
                _load_folder(path, read_sharded_outline)
            else:
                _load(path, map_location="meta", weights_only=True)
        except (CheckpointLoadError, FileNotFoundError) as err:  # FileNotFoundError: dangling link
            skipped.append((path, str(err)))
            continue
        return path, skipped
    return None, skipped


def _load(path: Path, map_location: Any, weights_only: bool) -> dict[str, Any]:
    if not path.exists():
        raise FileNotFoundError(f"Checkpoint file not found: {path}")
    try:
        check_expanded_size(path)
        checkpoint = torch.load(path, map_location=map_location, weights_only=weights_only)
    except Exception as err:
        # torch.load reports damage through whatever its parser tripped on: RuntimeError (no zip
        # central directory: truncated), EOFError (empty file), OSError, KeyError or
        # UnpicklingError (garbage); no type is specific to damage, so every failure is reported.
        raise CheckpointLoadError(
            f"Cannot load checkpoint {path} ({path.stat().st_size} bytes): "
            f"{type(err).__name__}: {err}\nThe file is truncated or damaged (e.g. its writer was "
            f"killed mid-save), is not a torch checkpoint, or holds objects that "
            f"torch.load(weights_only={weights_only}) refuses."
        ) from err
    if not isinstance(checkpoint, dict):
        raise CheckpointLoadError(
            f"Cannot load checkpoint {path}: it holds a {type(checkpoint).__name__}, not the dict "
            "a checkpoint is"
        )
    try:
        check_tensor_sizes(checkpoint, path)
    except OversizedTensorError as err:
        raise CheckpointLoadError(f"Cannot load checkpoint {err}") from err
    _check_weight_names(checkpoint, path)
    return checkpoint


def _check_weight_names(checkpoint: dict[str, Any], path: Path) -> None:
    """No module names a weight with a control character; a handed-over file's extra key holding
    a newline and a log-formatted line would forge that line on stderr, in the traceback of
    torch's `load_state_dict`, which quotes unexpected keys as they are."""
    weights = checkpoint.get("state_dict")
    for key in weights if isinstance(weights, dict) else ():
        if not str(key).isprintable():
            raise CheckpointLoadError(
                f"Cannot load checkpoint {path}: its state_dict holds the key {escaped(str(key))},"
                " with a control character, which no module's weight is named with"
            )


def _load_folder(path: Path, read: Callable[[Path], T]) -> T:
    try:
        return read(path)
    except CheckpointLoadError:
        raise
    except Exception as err:  # a missing shard, a refused metadata global, a damaged file
        raise CheckpointLoadError(f"Cannot load sharded checkpoint {path}: {err}") from err


def _local_path(path: str | Path) -> Path:
    if "://" in str(path):
        raise ValueError(
            f"AtomicCheckpointIO reads and writes local files only, got {str(path)!r}; for remote "
            "storage remove it from trainer.plugins to use Lightning's TorchCheckpointIO (fsspec)"
        )
    return Path(path)
