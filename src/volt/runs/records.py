"""What a run leaves in its directory besides checkpoints: resolved config, metrics.json and
run.json (command, git state, outcome); TensorBoard's hparams tab is `volt.runs.hparams_tab`."""

import datetime
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from importlib import metadata
from pathlib import Path
from typing import Any

import yaml
from lightning.pytorch.utilities import rank_zero_only
from lightning.pytorch.utilities.exceptions import SIGTERMException

from volt.config import PROJECT_ROOT
from volt.errors import TrainingInterrupted, escaped
from volt.folder_files import FolderFileError, read_json_object, write_replacing

METRICS_FILE = "metrics.json"
# How a run ended by a signal (GracefulShutdown, Lightning's own SIGTERM handling, a second Ctrl+C).
INTERRUPTIONS = (TrainingInterrupted, SIGTERMException, KeyboardInterrupt)


@rank_zero_only
def save_resolved_config(config: Mapping[str, Any], run_dir: Path) -> None:
    """.hydra/config.yaml keeps interpolations; this copy shows the values the run really used,
    but for those read from the environment, which `config` (volt.config.redaction) holds as their
    `${oc.env:...}`: DDP ranks train from this file and read them from the environment again."""
    text = yaml.safe_dump(dict(config), sort_keys=False)
    write_replacing(run_dir / "config_resolved.yaml", run_dir, text)


@rank_zero_only
def write_metrics(run_dir: Path, metrics: Mapping[str, float], **details: Any) -> None:
    record = {"status": "completed", "metrics": dict(metrics), **details}
    write_replacing(run_dir / METRICS_FILE, run_dir, json.dumps(record, indent=2) + "\n")


def record_failure(run_dir: Path, error: str) -> None:
    """metrics.json for a run that ended in an error, so a sweep summary can say why."""
    record = json.dumps({"status": "failed", "error": error}) + "\n"
    write_replacing(run_dir / METRICS_FILE, run_dir, record)


def run_status(error: BaseException | None) -> str:
    """How a run ended, as run.json and the hparams tab say: completed, interrupted or failed."""
    if error is None:
        return "completed"
    # Lightning 2.x turns a Ctrl+C inside fit into `sys.exit(1)`, raised while it handles the
    # KeyboardInterrupt (lightning/pytorch/trainer/call.py), which is left as its context.
    if isinstance(error, INTERRUPTIONS) or isinstance(error.__context__, KeyboardInterrupt):
        return "interrupted"
    return "failed"


def read_record(run_dir: Path, within: Path) -> dict[str, Any] | None:
    """The run's metrics.json record, None if there is none; `within`: the run's folder, or the
    sweep's that holds it. A file that is not the object volt writes, its metrics a mapping of
    names to values, is refused (FolderFileError): a handed-over folder may hold anything."""
    path = run_dir / METRICS_FILE
    if not os.path.lexists(path):
        return None
    record = read_json_object(path, within)
    if not isinstance(record.get("metrics", {}), dict):
        raise FolderFileError(
            f"{escaped(str(path))}: its metrics are a {type(record['metrics']).__name__}, not"
            " the names and values volt writes; remove the file to run again"
        )
    return record


def read_metrics(run_dir: Path) -> dict[str, Any] | None:
    """The run's metrics.json record; None if there is none (or a torn one)."""
    try:
        return read_record(run_dir, run_dir)
    except (OSError, ValueError):  # FolderFileError is a ValueError too
        return None


def _git(*args: str) -> str | None:
    """Output of a git command in the project, or None outside a git checkout / without git.

    Git writes the files' own bytes (a diff of a UTF-8 README, say), whatever the locale: read
    in the locale's encoding (ASCII under LANG=C with UTF-8 mode off) they raised
    UnicodeDecodeError. Bytes that are not UTF-8 survive as surrogates, written back unchanged.
    """
    try:
        done = subprocess.run(
            ["git", *args],
            cwd=PROJECT_ROOT,
            capture_output=True,
            encoding="utf-8",
            errors="surrogateescape",
            timeout=10,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout if done.returncode == 0 else None


def installed_packages() -> list[str]:
    """`name==version` of every installed distribution, sorted, read from the header of its core
    metadata: `Distribution.metadata` parses the whole file, long description included, and
    `.version` parses it a second time (0.4 s for 115 packages, against 0.03 s for the headers)."""
    packages = []
    for dist in metadata.distributions():
        # The files importlib.metadata itself tries, in its order ("": an egg-info file).
        text = dist.read_text("METADATA") or dist.read_text("PKG-INFO") or dist.read_text("")
        header: dict[str, str] = {}
        for field, value in _metadata_header(text or ""):
            header.setdefault(field, value)  # the first, as the email parser reads a field
        packages.append(f"{header.get('Name')}=={header.get('Version')}")
    return sorted(packages)


def _metadata_header(text: str) -> Iterator[tuple[str, str]]:
    """The `Field: value` lines before the first blank line, where the description begins; a
    line that starts with white space continues the field before it."""
    for line in text.splitlines():
        if not line.strip():
            return
        field, colon, value = line.partition(":")
        if colon and not line[0].isspace():
            yield field, value.strip()


# The run.json records of runs in progress in this process, by path: what `end_open_records`
# completes when a thread must end the process while the main thread cannot (os._exit).
_open_records: dict[Path, dict[str, Any]] = {}


def end_open_records(status: str, **details: Any) -> None:
    """Write how the run ended into every run.json still open in this process, from a thread
    that is about to end the process with `os._exit` (the main thread waits in C: a collective,
    the rendezvous), where run_record's own ending would never run."""
    for path, record in list(_open_records.items()):
        record.update(status=status, **details)
        record["ended"] = datetime.datetime.now().isoformat(timespec="seconds")
        write_replacing(path, path.parent, json.dumps(record, indent=2) + "\n")


def _earlier_attempts(path: Path, run_dir: Path) -> list[Any]:
    """A resumed run's earlier records, oldest first: each attempt's command, start, end and how
    it ended (a killed one's still says running), so that resuming loses none of them."""
    if not os.path.lexists(path):
        return []
    previous = read_json_object(path, run_dir)
    attempts = previous.pop("attempts", [])
    return [*(attempts if isinstance(attempts, list) else [attempts]), previous]


@contextmanager
def run_record(run_dir: Path) -> Iterator[None]:
    """run.json: command line, git commit, start/end time and how the run ended; beside it the
    uncommitted diff (git.diff) and installed packages (packages.txt). Written at start, so a
    killed run still has one, and rewritten at the end with the outcome."""
    if rank_zero_only.rank != 0:  # type: ignore[attr-defined]  # set by Lightning at import
        yield
        return
    commit = _git("rev-parse", "HEAD")
    diff = _git("diff", "HEAD")
    record: dict[str, Any] = {
        "command": [sys.executable, *sys.argv],
        "cwd": os.getcwd(),
        "git_commit": commit.strip() if commit else None,
        "git_dirty": bool(diff),
        "started": datetime.datetime.now().isoformat(timespec="seconds"),
        "status": "running",
    }
    if diff:
        write_replacing(run_dir / "git.diff", run_dir, diff.encode("utf-8", "surrogateescape"))
    write_replacing(run_dir / "packages.txt", run_dir, "\n".join(installed_packages()) + "\n")
    path = run_dir / "run.json"
    earlier = _earlier_attempts(path, run_dir)
    if earlier:
        record["attempts"] = earlier
    write_replacing(path, run_dir, json.dumps(record, indent=2) + "\n")
    _open_records[path] = record
    try:
        yield
        record["status"] = run_status(None)
    except TrainingInterrupted as stop:
        record["status"] = run_status(stop)
        record["signal"] = signal.Signals(stop.signum).name
        raise
    except BaseException as error:
        record["status"] = run_status(error)
        if record["status"] == "failed":
            record["error"] = f"{type(error).__name__}: {error}"
        raise
    finally:
        _open_records.pop(path, None)
        record["ended"] = datetime.datetime.now().isoformat(timespec="seconds")
        write_replacing(path, run_dir, json.dumps(record, indent=2) + "\n")
