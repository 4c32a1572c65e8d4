"""What an experiment tracker (MLflow, W&B) is told about a volt run, read from the run's
directory: its name, the sweep it is a job of, the overrides it was started with; and the
tracker's own id for it, kept in that directory, so that continuing a named run (`name=...`)
continues the same tracked run instead of starting another.

The id file carries a stamp, an HMAC of the tracker, the id and the run's directory under a key
that never leaves this user's home (made on first use, mode 0600): a run directory handed over
from elsewhere, or an id written by hand, would otherwise make a resume log into a tracked run
of the stranger's choosing. A path alone is no such check: the same path is on every machine of
a team."""

import hashlib
import hmac
import logging
import os
import re
import secrets
import stat
from dataclasses import dataclass
from pathlib import Path

from volt.errors import ConfigError
from volt.folder_files import FolderFileError, read_overrides, read_text, write_replacing

log = logging.getLogger(__name__)
TRACKER_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")  # MLflow's 32 hex digits, W&B's 8 characters
ID_FILE_LIMIT = 4096  # bytes read of an id file: an id and its stamp
KEY_FILE = "run_key"
KEY_LIMIT = 4096


@dataclass(frozen=True)
class TrackedRun:
    directory: Path
    sweep: str | None  # the sweep's directory name when the run is a job of a sweep
    # As typed on the command line: a value read from the environment is its `${oc.env:NAME}`
    # text, never the value (volt refuses a secret given literally before Hydra starts).
    overrides: tuple[str, ...]

    @property
    def name(self) -> str:
        return self.directory.name

    def _id_file(self, tracker: str) -> Path:
        return self.directory / f"{tracker}_run_id.txt"

    def _stamp(self, tracker: str, run_id: str) -> str:
        message = f"{tracker}\0{run_id}\0{self.directory.resolve()}".encode()
        return "stamp: " + hmac.new(user_key(), message, hashlib.sha256).hexdigest()

    def stored_id(self, tracker: str, unstamped_ok: bool = False) -> str | None:
        """The id `tracker` gave this run in an earlier attempt here; None if there is none, or
        if the file was not written for this directory (then the tracker starts a new run).
        `unstamped_ok`: also an id alone, as volt wrote it before 2026-11-26, for a tracker that
        checks on its server that the run it names was started from this directory (MLflow)."""
        path = self._id_file(tracker)
        if not os.path.lexists(path):
            return None
        try:  # a link is never followed: a handed-over one points anywhere
            lines = read_text(path, self.directory, ID_FILE_LIMIT).splitlines()
        except FolderFileError:
            lines = []
        if lines and TRACKER_ID.fullmatch(lines[0]):
            stamp = self._stamp(tracker, lines[0])
            stamped = len(lines) == 2 and hmac.compare_digest(lines[1], stamp)
            if stamped or (unstamped_ok and len(lines) == 1):
                return lines[0]
        log.warning(
            "%s was not written for this run directory (moved, handed over or edited): "
            "starting a new %s run instead of continuing the one it names",
            path,
            tracker,
        )
        return None

    def store_id(self, tracker: str, run_id: str) -> None:
        """Written beside and renamed over the id file: a link in its place (a handed-over run
        directory's) is replaced, never written through."""
        stamped = f"{run_id}\n{self._stamp(tracker, run_id)}\n"
        write_replacing(self._id_file(tracker), self.directory, stamped)


def user_key() -> bytes:
    """This user's key for the stamps of tracked runs ($XDG_CONFIG_HOME/volt/run_key, else
    ~/.config/volt/run_key): 32 random bytes, made on first use, readable by this user alone."""
    config = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    path = Path(config) / "volt" / KEY_FILE
    if not os.path.lexists(path):
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        staged = path.with_name(f".{KEY_FILE}.{os.getpid()}-{secrets.token_hex(4)}")
        fd = os.open(staged, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w") as file:
            file.write(secrets.token_hex(32) + "\n")
        try:
            os.link(staged, path)  # never over a key another process made meanwhile
        except FileExistsError:
            pass
        finally:
            staged.unlink()
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    with os.fdopen(fd, "rb") as file:
        status = os.fstat(file.fileno())
        if (
            not stat.S_ISREG(status.st_mode)
            or status.st_uid != os.getuid()
            or status.st_mode & 0o077
        ):
            raise ConfigError(
                f"{path}: volt's key for tracked runs must be a file of yours that only you can"
                f" read: chmod 600 {path} (or remove it: volt makes a new one, and runs stamped"
                " with the old one start new tracked runs)"
            )
        key = file.read(KEY_LIMIT).strip()
    if len(key) < 32:
        raise ConfigError(f"{path}: volt's key for tracked runs is too short: remove it")
    return key


def tracked_run(run_dir: str, sweep_dir: str) -> TrackedRun:
    """`run_dir` is the run's own directory, `sweep_dir` Hydra's `hydra.sweep.dir`: a sweep's job
    lies directly in it, a single run never does (outputs/<task>/runs/ against .../multiruns/)."""
    directory = Path(run_dir)
    sweep = Path(sweep_dir).name if directory.parent == Path(sweep_dir) else None
    # Hydra writes the job's overrides here before the job starts (the swept values included).
    overrides_file = directory / ".hydra" / "overrides.yaml"
    overrides = read_overrides(overrides_file, directory) if os.path.lexists(overrides_file) else []
    return TrackedRun(directory, sweep, tuple(overrides))
