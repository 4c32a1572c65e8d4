"""What a save leaves beside the checkpoints while it runs: a temporary file (a single-file
checkpoint) or folder (a sharded one) that becomes the checkpoint by one rename, and how the
leftovers of a killed writer are told apart and cleared.

Temporaries are named for the writer (host, pid) so a later save can tell a killed writer's
leftovers from a live writer's work in progress, even with another job sharing the directory.
The name leaves out the target's name on purpose: Lightning's SLURM auto-resume takes the highest
number from every file in default_root_dir whose name contains "hpc_ckpt_", so a leftover
".hpc_ckpt_3.ckpt.tmp-..." would send it after a checkpoint that does not exist. Starting with "."
and not ending in ".ckpt", temporaries match neither a `*.ckpt` glob nor Lightning's `last*.ckpt`
lookup for ckpt_path="last".
"""

import logging
import os
import re
import secrets
import socket
from pathlib import Path

log = logging.getLogger(__name__)

TEMP_PREFIX = ".volt-ckpt-tmp-"
_TEMP_NAME = re.compile(re.escape(TEMP_PREFIX) + r"(?P<host>.+)-(?P<pid>\d+)-[0-9a-f]{8}")
# The files a sharded checkpoint folder holds, and nothing else is ever deleted from one: DCP's
# shards (`__<rank>_<n>.distcp`), its metadata (`.metadata`, staged as `.metadata.tmp`; a
# rank-local `__<rank>.metadata` where collectives are off) and the rest of the checkpoint
# (`meta.pt`, Lightning's name).
SHARDED_FILES = re.compile(r"__\d+_\d+\.distcp|(__\d+)?\.metadata(\.tmp)?|meta\.pt")


def temp_name() -> str:
    # the token keeps apart two saves that one process runs at once, from two threads
    return f"{TEMP_PREFIX}{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(4)}"


def remove_dead_writers_temporaries(directory: Path) -> None:
    """Delete temporaries left in `directory` by writers on this host that no longer run."""
    host = socket.gethostname()
    for entry in directory.iterdir():
        match = _TEMP_NAME.fullmatch(entry.name)
        # another host's pid means nothing here; our own pid may be another thread's save
        if match is None or match["host"] != host or int(match["pid"]) == os.getpid():
            continue
        if not _process_alive(int(match["pid"])):
            remove_temporary(entry)


def remove_temporary(path: Path) -> None:
    """A temporary file, or a sharded checkpoint's folder: see `remove_sharded_folder`."""
    if path.is_dir() and not path.is_symlink():
        remove_sharded_folder(path)
    else:
        path.unlink(missing_ok=True)  # missing_ok: another writer may clean up too


def remove_sharded_folder(folder: Path) -> None:
    """Deletes the files a sharded checkpoint is made of (SHARDED_FILES), then the folder; never
    recursively, never what a link points to (a link is removed itself). A folder that holds
    anything else is left, with what it holds, and one warning: someone put it there."""
    for entry in folder.iterdir():
        if SHARDED_FILES.fullmatch(entry.name) and (entry.is_symlink() or entry.is_file()):
            entry.unlink(missing_ok=True)
    try:
        folder.rmdir()
    except FileNotFoundError:
        pass  # another writer cleaned up too
    except OSError:
        others = sorted(p.name for p in folder.iterdir())
        log.warning(
            "left %s in place: it holds %s, which no checkpoint volt writes holds", folder, others
        )


def fsync_directory(directory: Path) -> None:
    """Makes the entries of `directory` (a rename into it) survive a power loss."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)  # signal 0 sends nothing: only checks that the process exists
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by another user
        return True
    return True
