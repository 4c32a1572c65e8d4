"""What a resumed checkpoint may say about files: only names inside the run's checkpoint folder.

A checkpoint restores each callback's state, and Lightning's ModelCheckpoint acts on the paths in
its state: at its next save it deletes the previous best (`best_model_path`, `best_k_models`,
`last_model_path`). Its guard, "only inside dirpath", holds for local paths only, and Lightning
2.6.6 does not see fsspec's `local://` as local, so a state naming `local:///home/you` makes it
remove that folder recursively (`ModelCheckpoint._should_remove_checkpoint` returns True for any
path `_is_local_file_protocol` rejects; `TorchCheckpointIO.remove_checkpoint` calls
`fs.rm(path, recursive=True)`). A run directory handed over by someone else would carry such a
state into your resume. Here every callback state is looked at before Lightning restores it: one
that names a place outside the run's checkpoint folder, or any URL, is dropped with one line, and
that callback starts afresh. The same skipped guard deletes a remote run's checkpoints outside
`dirpath` (Lightning issue #21813, fix proposed in PR #21867, open as of 2026-11-26); `local://`
is the case that reaches local disk. Keep this after a Lightning fix too: a state is data from a
file, and `AtomicCheckpointIO.remove_checkpoint` removes files only.
"""

import logging
import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback

from volt.errors import escaped

log = logging.getLogger(__name__)

# ModelCheckpoint's fields that name files (and the keys of `best_k_models`): checked even when
# relative, since Lightning resolves them from the working directory.
PATH_FIELDS = frozenset({"best_model_path", "kth_best_model_path", "last_model_path", "dirpath"})


class RestoredPathsCheck(Callback):
    """Drops a restored callback state that names a file outside the run's checkpoint folder."""

    def on_load_checkpoint(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        states = checkpoint.get("callbacks")
        if not isinstance(states, dict):
            return
        dirpaths = [getattr(callback, "dirpath", None) for callback in trainer.checkpoint_callbacks]
        folders = [Path(dirpath).resolve() for dirpath in dirpaths if dirpath]
        # A state no callback here takes (eval's, which has no checkpoint callback) is dropped
        # without a word: nothing starts afresh.
        taken = {callback.state_key for callback in trainer.callbacks}  # type: ignore[attr-defined]
        for key in list(states):
            outside = next(_places_outside(states[key], folders, key=""), None)
            if outside is not None:
                del states[key]
                where = ", ".join(map(str, folders)) or "none: no checkpoint callback"
                log.log(
                    logging.WARNING if key in taken else logging.DEBUG,
                    "not restoring %s from the checkpoint: its state names %r, outside the run's"
                    " checkpoint folder (%s); it starts afresh",
                    escaped(key),  # a crafted key forges no log line
                    outside,
                    where,
                )


def _places_outside(state: Any, folders: list[Path], key: str) -> Iterator[str]:
    """Every string in `state` (dict keys included) that names a place not inside `folders`."""
    if isinstance(state, dict):
        for k, value in state.items():
            if isinstance(k, str) and key == "best_k_models" and not _inside(k, folders):
                yield k
            yield from _places_outside(value, folders, str(k))
    elif isinstance(state, list | tuple):
        for value in state:
            yield from _places_outside(value, folders, key)
    elif isinstance(state, str) and _names_a_place(state, key) and not _inside(state, folders):
        yield state


def _names_a_place(value: str, key: str) -> bool:
    if key in PATH_FIELDS:
        return value != ""
    return (
        "://" in value or value.startswith("~") or os.path.isabs(value) or ".." in Path(value).parts
    )


def _inside(value: str, folders: Iterable[Path]) -> bool:
    """A plain local path (no URL, no `~`) at or below one of `folders`."""
    if "://" in value or value.startswith("~"):
        return False
    path = Path(value).resolve()
    return any(path == folder or path.is_relative_to(folder) for folder in folders)
