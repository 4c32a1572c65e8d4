"""One process per run directory: a second `python train.py name=x` started while the first still
works on `outputs/train/runs/x` is refused, instead of both writing into it.

The lock is an `flock` on `<dir>/.lock`, so the kernel lets go of it however its holder ends
(SIGKILL and the OOM killer included): a killed run never blocks its own resume. The file also says
who holds it (pid, host, start, command), for the refused process's message; it stays after the
run and the next holder overwrites it. Nothing else in volt reads it: resume looks for run.json,
metrics.json and checkpoints, a sweep summary for job directories.

On NFS, Linux sends an flock to the server as a lock on the whole file, so runs on different nodes
see each other's. A node that is lost holds its locks until the server gives up on it: under NFSv4
when the node's lease runs out (90 s by default on a Linux server); under NFSv3 only when the node
boots again, or an administrator clears them. A mount without network locks (NFS `nolock`, Lustre
`localflock`) only keeps out processes on the same node. Where flock is refused outright (ENOLCK,
ENOSYS, EOPNOTSUPP) the run goes on without a lock, after a warning.
"""

import datetime
import errno
import fcntl
import json
import logging
import os
import shlex
import socket
import sys
import time
import weakref
from pathlib import Path
from typing import TextIO

from volt.folder_files import open_regular

log = logging.getLogger(__name__)

LOCK_FILE = ".lock"
# A refused process can look between its holder's flock and the holder's write of who it is.
HOLDER_WRITE_WAIT_S = 1.0
_NO_LOCKS_HERE = (errno.ENOLCK, errno.ENOSYS, errno.EOPNOTSUPP)


class RunLockedError(RuntimeError):
    """Another live process holds the directory; str(error) names it."""


class RunLock:
    """This process's hold on a directory, from `lock_run_dir` until `release()` or exit."""

    def __init__(self, directory: Path, file: TextIO) -> None:
        self.directory = directory
        self._file = file
        # A run that ends in sys.exit skips Hydra's end hooks, so nobody calls release(): the lock
        # then goes with this object (quietly: an open file collected would warn).
        self._close = weakref.finalize(self, file.close)

    def release(self) -> None:
        if self._file.closed:
            return
        # Unlock before closing: processes forked meanwhile (DataLoader workers) share this open
        # file, and a close alone would leave the lock held until the last of them exits.
        fcntl.flock(self._file, fcntl.LOCK_UN)
        self._close()


def lock_run_dir(directory: Path) -> RunLock | None:
    """Hold `directory` (made if missing) for this process. Raises RunLockedError, having written
    nothing, while another process holds it; None, with a warning, where the file system has no
    locks."""
    directory.mkdir(parents=True, exist_ok=True)
    # Made if missing, never truncated on open (the refused process only reads it); a link or
    # a FIFO in its place (a handed-over folder's) is refused, not followed or waited on.
    fd = open_regular(directory / LOCK_FILE, directory, os.O_RDWR | os.O_CREAT)
    file = os.fdopen(fd, "r+", encoding="utf-8")  # RunLock closes it
    try:
        fcntl.flock(file, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = _read_holder(file)
        file.close()
        raise RunLockedError(
            f"{directory} is in use by {holder}: wait for it to end or stop it (a process that"
            " died lets go by itself), or give this run another name"
        ) from None
    except OSError as error:
        file.close()
        if error.errno not in _NO_LOCKS_HERE:
            raise
        log.warning(
            "%s is on a file system without file locks (%s): this run is not locked, so nothing"
            " stops a second process from writing into it at the same time",
            directory,
            os.strerror(error.errno),
        )
        return None
    file.seek(0)
    file.truncate()
    file.write(json.dumps(_this_process()) + "\n")
    file.flush()
    return RunLock(directory, file)


def _this_process() -> dict[str, object]:
    return {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "started": datetime.datetime.now().isoformat(timespec="seconds"),
        "command": shlex.join(sys.argv),
        # What to scancel; a submitit job's command line only names submitit.
        "slurm_job": os.environ.get("SLURM_JOB_ID"),
    }


def _read_holder(file: TextIO) -> str:
    """'pid 4242 on node7 since 2026-05-01T10:00:00 (train.py name=x)', as the holder wrote it."""
    deadline = time.monotonic() + HOLDER_WRITE_WAIT_S
    while True:
        file.seek(0)
        try:
            holder = json.loads(file.read())
            slurm = f", SLURM job {holder['slurm_job']}" if holder.get("slurm_job") else ""
            return (
                f"pid {holder['pid']} on {holder['host']} since {holder['started']}"
                f" ({holder['command']}{slurm})"
            )
        except (ValueError, KeyError, TypeError):
            if time.monotonic() > deadline:
                return "another process (which has not said who it is)"
        time.sleep(0.05)
