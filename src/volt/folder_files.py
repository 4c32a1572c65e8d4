"""How volt opens the files of a run or sweep folder: one way, since such a folder may have been
handed over by someone else and is data.

- no link is followed: the file is opened with O_NOFOLLOW and no folder between the run's (or
  sweep's) folder and the file may be a link; `check_folder` refuses, before anything is
  written, a folder holding a link out of it;
- regular files only: a FIFO, device or socket is refused without blocking (opened with
  O_NONBLOCK, then looked at with fstat);
- every read has a size cap, and YAML is read without aliases, so what it expands to stays
  within the cap;
- a write goes to a new file beside the target, then replaces it: a link (or anything else) at
  the target's name is replaced, never written through.

A leaf: the rooms that read and write run folders (runs, sweeps, loggers, checkpointing) all
come here."""

import json
import os
import secrets
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, BinaryIO

import yaml

from volt.errors import ConfigError, escaped

# Bytes read at most from one small file of a run folder (overrides.yaml, metrics.json, an id
# file): volt writes each in kilobytes; a file this size was made to take memory.
READ_LIMIT = 8 * 2**20
# Folders under a run folder that belong to a library which makes links out of them itself
# (W&B links its debug logs to ~/.cache/wandb): not looked into, and volt writes nothing there.
LIBRARY_FOLDERS = ("wandb",)


class FolderFileError(ConfigError):
    """A file of a run or sweep folder volt will not open; str(error) is the one line."""


def open_regular(path: Path, within: Path, flags: int) -> int:
    """A descriptor of `path`, a regular file inside `within` (the run's or sweep's folder),
    opened with `flags` (os.O_RDONLY, or os.O_WRONLY | os.O_CREAT | os.O_EXCL for a new one):
    never through a link, never blocking on a FIFO."""
    _refuse_linked_parents(path, within)
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o666)
    except OSError:
        if path.is_symlink():  # ELOOP from O_NOFOLLOW
            raise FolderFileError(_refusal(path, "is a symbolic link")) from None
        raise
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise FolderFileError(_refusal(path, f"is not a regular file ({_kind(mode)})"))
    os.set_blocking(fd, True)
    return fd


def read_bytes(path: Path, within: Path, limit: int = READ_LIMIT) -> bytes:
    with os.fdopen(open_regular(path, within, os.O_RDONLY), "rb") as file:
        data = file.read(limit + 1)
    if len(data) > limit:
        raise FolderFileError(
            _refusal(path, f"holds more than {limit} bytes, more than volt ever writes there")
        )
    return data


def read_text(path: Path, within: Path, limit: int = READ_LIMIT) -> str:
    return read_bytes(path, within, limit).decode("utf-8", errors="replace")


def read_yaml(path: Path, within: Path, limit: int = READ_LIMIT) -> Any:
    """Plain YAML, no alias: a few kilobytes of aliases to one string expand to gigabytes
    (volt, Hydra and OmegaConf write none)."""
    try:
        return yaml.load(read_text(path, within, limit), Loader=_NoAliasLoader)
    except yaml.YAMLError as error:
        reason = " ".join(str(error).split())
        raise FolderFileError(_refusal(path, f"is not plain YAML ({reason})")) from None


def read_json(path: Path, within: Path, limit: int = READ_LIMIT) -> Any:
    try:
        return json.loads(read_text(path, within, limit))
    except (ValueError, RecursionError) as error:  # RecursionError: thousands of nested '['
        reason = escaped(" ".join(str(error).split())[:200])
        raise FolderFileError(_refusal(path, f"is not JSON ({reason})")) from None


def read_json_object(path: Path, within: Path, limit: int = READ_LIMIT) -> dict[str, Any]:
    """A JSON file whose top level must be an object (metrics.json, run.json)."""
    record = read_json(path, within, limit)
    if not isinstance(record, dict):
        raise FolderFileError(_refusal(path, f"holds a {type(record).__name__}, not an object"))
    return record


def read_overrides(path: Path, within: Path) -> list[str]:
    """A job's .hydra/overrides.yaml: the command line's `key=value` strings, as Hydra wrote."""
    overrides = read_yaml(path, within) or []
    if not isinstance(overrides, list) or not all(isinstance(o, str) for o in overrides):
        raise FolderFileError(_refusal(path, "is not a list of key=value strings, as Hydra writes"))
    return overrides


def write_replacing(path: Path, within: Path, data: str | bytes) -> None:
    """`data` into `path`, as `replacing` writes."""
    with replacing(path, within) as file:
        file.write(data.encode() if isinstance(data, str) else data)


@contextmanager
def replacing(path: Path, within: Path) -> Iterator[BinaryIO]:
    """A new file beside `path` to write into, renamed over `path` when the block ends: a reader
    sees the old file or the whole new one, and whatever stood at `path` (a link included) is
    replaced, not followed. On an error the new file is removed and `path` left as it was. For
    a file written piece by piece (predictions.csv); `write_replacing` for one written at once."""
    # The target's name stays out of the staged one: TensorBoard reads any name holding
    # `tfevents`, a sweep summary reader any `summary.csv*`.
    staged = path.with_name(f".volt-{os.getpid()}-{secrets.token_hex(4)}.tmp")
    fd = open_regular(staged, within, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
    try:
        with os.fdopen(fd, "wb") as file:
            yield file
        os.replace(staged, path)
    except BaseException:
        staged.unlink(missing_ok=True)
        raise


def check_folder(directory: Path, key: str) -> None:
    """A run or sweep folder volt continues (and every folder in it, but LIBRARY_FOLDERS) holds
    no link out of it and nothing but folders and regular files: volt, Hydra, Lightning and its
    loggers write there and would write wherever a link points, or wait forever on a FIFO.
    Links that stay inside (Lightning's save_last="link") are kept."""
    if directory.is_symlink():
        raise FolderFileError(_refusal(directory, f"({key}) is a symbolic link"))
    if not directory.is_dir():
        return
    inside = directory.resolve()
    for path in _entries(directory):
        mode = path.lstat().st_mode
        if stat.S_ISLNK(mode) and not path.resolve().is_relative_to(inside):
            raise FolderFileError(
                f"{key}: {escaped(str(path))} is a symbolic link to"
                f" {escaped(str(path.resolve()))}, outside the folder: volt writes into a run it"
                " continues and would write there; remove the link or pick another name"
            )
        if not (stat.S_ISLNK(mode) or stat.S_ISDIR(mode) or stat.S_ISREG(mode)):
            raise FolderFileError(f"{key}: {_refusal(path, f'is a {_kind(mode)}')}")


def _entries(directory: Path) -> Iterator[Path]:
    for folder, folders, files in os.walk(directory):  # links to folders are not entered
        yield from (Path(folder) / name for name in (*folders, *files))
        folders[:] = [f for f in folders if f not in LIBRARY_FOLDERS]  # a sweep job's too


def _refuse_linked_parents(path: Path, within: Path) -> None:
    """No folder from `within` (excluded: the user named it) down to `path`'s is a link."""
    if not path.is_relative_to(within):
        raise ValueError(f"{path} is not inside {within}")
    for parent in path.parents:
        if parent == within:
            return
        if parent.is_symlink():
            raise FolderFileError(_refusal(parent, "is a symbolic link"))


def _refusal(path: Path, what: str) -> str:
    return (
        f"{escaped(str(path))} {what}: volt opens only regular files of a run or sweep folder,"
        " which may come from someone else; remove it, or use a folder volt wrote"
    )


def _kind(mode: int) -> str:
    if stat.S_ISFIFO(mode):
        return "FIFO"
    if stat.S_ISSOCK(mode):
        return "socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "device"
    return "folder" if stat.S_ISDIR(mode) else "special file"


class _NoAliasLoader(yaml.SafeLoader):
    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise yaml.composer.ComposerError(
                None, None, "holds an alias (*name), which volt never writes", event.start_mark
            )
        return super().compose_node(parent, index)
