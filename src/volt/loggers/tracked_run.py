"""What an experiment tracker (MLflow, W&B) is told about a volt run, read from the run's
directory: its name, the sweep it is a job of, the overrides it was started with; and the
tracker's own id for it, kept in that directory, so that continuing a named run (`name=...`)
continues the same tracked run instead of starting another.

The id file names the directory it was written for: a run directory handed over from elsewhere
(or an id written by hand) would otherwise make a resume log into someone else's tracked run."""

import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path

from volt.folder_files import FolderFileError, read_overrides, read_text, write_replacing

log = logging.getLogger(__name__)
TRACKER_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")  # MLflow's 32 hex digits, W&B's 8 characters
ID_FILE_LIMIT = 4096  # bytes read of an id file: an id and a path


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

    def _stamp(self) -> str:
        return f"directory: {self.directory.resolve()}"

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
        stamped = lines[1:] == [self._stamp()] or (unstamped_ok and len(lines) == 1)
        if lines and TRACKER_ID.fullmatch(lines[0]) and stamped:
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
        write_replacing(self._id_file(tracker), self.directory, f"{run_id}\n{self._stamp()}\n")


def tracked_run(run_dir: str, sweep_dir: str) -> TrackedRun:
    """`run_dir` is the run's own directory, `sweep_dir` Hydra's `hydra.sweep.dir`: a sweep's job
    lies directly in it, a single run never does (outputs/<task>/runs/ against .../multiruns/)."""
    directory = Path(run_dir)
    sweep = Path(sweep_dir).name if directory.parent == Path(sweep_dir) else None
    # Hydra writes the job's overrides here before the job starts (the swept values included).
    overrides_file = directory / ".hydra" / "overrides.yaml"
    overrides = read_overrides(overrides_file, directory) if os.path.lexists(overrides_file) else []
    return TrackedRun(directory, sweep, tuple(overrides))
