"""Named runs (`name=...`): a fixed directory, and re-running the same command continues the run
from its newest complete checkpoint instead of starting over."""

import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from volt.checkpointing import find_latest_valid_checkpoint
from volt.errors import ConfigError, escaped
from volt.folder_files import read_overrides
from volt.runs.records import METRICS_FILE, read_record

log = logging.getLogger("volt")


@dataclass(frozen=True)
class ResumePlan:
    checkpoint: Path | None  # continue from here; None: start from the beginning
    finished: dict[str, float] | None  # the final metrics when the run already completed


def _identity(overrides: list[str], neutral: Sequence[str]) -> list[str]:
    def changes_the_run(override: str) -> bool:
        key = override.split("=", 1)[0].lstrip("+~")
        return not any(key == n or key.startswith(f"{n}.") for n in neutral)

    return sorted(filter(changes_the_run, overrides))


def check_same_run(run_dir: Path, name: str, overrides: list[str], neutral: Sequence[str]) -> None:
    """A named run is its overrides: refuse to continue one under different ones (before Hydra
    rewrites anything in its directory). `neutral`: the keys (and what lies under them) that may
    change between attempts without making it another run, the list that also keeps them out of
    sweep job directory names (conf/hydra/default.yaml, `override_dirname.exclude_keys`)."""
    stored_file = run_dir / ".hydra" / "overrides.yaml"
    if not os.path.lexists(stored_file):
        return
    stored = _identity(read_overrides(stored_file, run_dir), neutral)
    given = _identity(overrides, neutral)
    if stored != given:
        raise ConfigError(
            f"name={name} already exists in {run_dir} with overrides {stored}, not {given}: "
            "re-run with the same overrides to continue it, or pick another name"
        )


def plan_resume(run_dir: Path, name: str | None, resume: bool | None) -> ResumePlan:
    """resume=null continues a named run if it exists; true requires one; false refuses one."""
    if name is None:
        if resume:
            raise ConfigError("resume=true needs a run name: add name=<the run's name>")
        return ResumePlan(None, None)
    metrics_file = run_dir / METRICS_FILE
    checkpoint, damaged = find_latest_valid_checkpoint(run_dir / "checkpoints")
    started = (
        os.path.lexists(metrics_file) or checkpoint is not None or (run_dir / "run.json").is_file()
    )
    if resume is False and started:
        raise ConfigError(
            f"name={name} already exists in {run_dir} and resume=false: pick another name, "
            "or drop resume=false to continue it"
        )
    if resume and not started:
        raise ConfigError(
            f"name={name} with resume=true, but {run_dir} holds no run to continue: "
            "drop resume=true to start it"
        )
    record = read_record(run_dir, run_dir)
    if record is not None and record.get("status") == "completed":
        return ResumePlan(None, record.get("metrics", {}))
    for path, reason in damaged:
        # A handed-over run's file name, or a key inside its checkpoint that the reason quotes,
        # may hold a newline, which would forge a log line: such text is shown escaped.
        log.warning("skipping damaged checkpoint %s: %s", escaped(str(path)), escaped(reason))
    if checkpoint is not None:
        log.info("resuming run %s from %s", name, checkpoint)
    elif started:
        log.info("run %s has no complete checkpoint yet: starting it from the beginning", name)
    return ResumePlan(checkpoint, None)
