"""Named runs (`name=...`): a fixed directory, and re-running the same command continues the run
from its newest complete checkpoint instead of starting over, once the model fits its weights."""

import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import lightning.pytorch as pl
from lightning.pytorch.utilities.model_helpers import is_overridden

from volt.checkpointing import (
    find_latest_valid_checkpoint,
    read_weight_outline,
    weights_disagreement,
)
from volt.errors import ConfigError, escaped
from volt.folder_files import read_overrides
from volt.runs.records import METRICS_FILE, read_record

log = logging.getLogger("volt")


@dataclass(frozen=True)
class ResumePlan:
    checkpoint: Path | None  # continue from here; None: start from the beginning
    finished: dict[str, float] | None  # the final metrics when the run already completed
    damaged: tuple[tuple[Path, str], ...] = ()  # checkpoints passed over, and why
    started: bool = False  # an earlier attempt left a record or a checkpoint


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


def find_resume(run_dir: Path, name: str | None, resume: bool | None) -> ResumePlan:
    """resume=null continues a named run if it exists; true requires one; false refuses one.
    Says nothing: plan_resume logs the plan; Hydra's callback finds it first, to check the
    checkpoint before Hydra writes into the run's directory."""
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
        return ResumePlan(None, record.get("metrics", {}), started=True)
    return ResumePlan(checkpoint, None, tuple(damaged), started)


def plan_resume(run_dir: Path, name: str | None, resume: bool | None) -> ResumePlan:
    """find_resume's plan, said in the log: the checkpoint it continues from, those passed over."""
    plan = find_resume(run_dir, name, resume)
    for path, reason in plan.damaged:
        # A handed-over run's file name, or a key inside its checkpoint that the reason quotes,
        # may hold a newline, which would forge a log line: such text is shown escaped.
        log.warning("skipping damaged checkpoint %s: %s", escaped(str(path)), escaped(reason))
    if plan.checkpoint is not None:
        log.info("resuming run %s from %s", name, plan.checkpoint)
    elif plan.started and plan.finished is None:
        log.info("run %s has no complete checkpoint yet: starting it from the beginning", name)
    return plan


def check_resumed_weights(model: pl.LightningModule, checkpoint: Path) -> None:
    """Weights the module would not load (its code changed since the checkpoint, or the file
    did) are refused in one line, not in torch's traceback once the fit started. A module that
    changes what it loads (its own on_load_checkpoint or load_state_dict) is left to do so.
    `model` may be on the meta device: only names and shapes are compared."""
    hooks = ("on_load_checkpoint", "load_state_dict")
    if any(is_overridden(hook, model, pl.LightningModule) for hook in hooks):
        return
    for entry, weights in read_weight_outline(checkpoint).items():
        disagreement = weights_disagreement(model, weights, strict=model.strict_loading)
        if disagreement:
            raise ConfigError(
                f"{checkpoint}: its {entry} does not fit {type(model).__name__}"
                f" ({disagreement}): the model changed since it was saved; resume with the code"
                " it was trained with, or start afresh under another name=..."
            )
