"""Where a run's directory may be, and taking it away when the run is refused after Hydra made it.

A run or sweep directory lies inside `paths.outputs_dir`; a sweep job's directory is one more
name, `<num>_<its overrides>`, so no override it is named by may hold a '/'. When a run is
refused after Hydra made its directory (what only the library can tell: a Trainer argument, a
data set's files), volt removes that directory, and the empty parents made with it, if this
process made them: never a directory, or anything in one, that existed when the run started.
"""

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Override, ValueType
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from volt.errors import ConfigError

# What note_new_run_dir saw: the run directory, and the outermost of it and its parents that did
# not exist. A module's state because Hydra's callback and the task function share nothing else.
_made_here: list[tuple[Path, Path]] = []


def check_run_dir(cfg: DictConfig) -> None:
    """The run's (or sweep's) directory lies inside paths.outputs_dir; in a sweep, no job's
    directory name holds a '/'."""
    multirun = cfg.hydra.mode == RunMode.MULTIRUN
    key = "hydra.sweep.dir" if multirun else "hydra.run.dir"
    outputs = _absolute(OmegaConf.select(cfg, "paths.outputs_dir"))
    run_dir = _absolute(OmegaConf.select(cfg, key))
    if run_dir == outputs or not run_dir.is_relative_to(outputs):
        raise ConfigError(
            f"{key}={run_dir} is not inside paths.outputs_dir={outputs}: keep name and task_name"
            " plain names, and set paths.outputs_dir=<folder> to write somewhere else"
        )
    if multirun:
        _check_job_names(cfg)


def _absolute(path: object) -> Path:
    # Lexical, as `..` is what escapes; resolving links would refuse an outputs/ that is a link.
    return Path(os.path.abspath(str(path)))


def _check_job_names(cfg: DictConfig) -> None:
    """Hydra names a sweep job's directory by its overrides (`0_model=cnn,seed=1`), but for
    hydra.job.config.override_dirname.exclude_keys."""
    excluded = set(cfg.hydra.job.config.override_dirname.exclude_keys)
    lines = list(cfg.hydra.overrides.task)
    params = OmegaConf.select(cfg, "hydra.sweeper.params")  # Optuna's search space
    if isinstance(params, DictConfig):
        lines += [f"{key!s}={value}" for key, value in params.items_ex(resolve=False)]
    for override in OverridesParser.create().parse_overrides(lines):
        if override.key_or_group in excluded:
            continue
        for line in _job_lines(override):
            if "/" in line:
                raise ConfigError(
                    f"{line}: a sweep job's directory is named by its overrides, and a '/' would"
                    " nest it (or, with '..', put it outside the sweep's): sweep over values"
                    f" without '/', or add {override.key_or_group} to"
                    " hydra.job.config.override_dirname.exclude_keys"
                )


def _job_lines(override: Override) -> Iterator[str]:
    """`key=value` as each job's directory name will hold it."""
    if not override.is_sweep_override():
        yield str(override.input_line)
    elif override.is_discrete_sweep() and override.value_type != ValueType.GLOB_CHOICE_SWEEP:
        key = override.get_key_element()
        yield from (f"{key}={value}" for value in override.sweep_string_iterator())


def note_new_run_dir(run_dir: Path) -> None:
    """Before Hydra makes `run_dir`: remember which of it and its parents do not exist yet."""
    run_dir = _absolute(run_dir)
    missing = [p for p in (run_dir, *run_dir.parents) if not p.exists()]
    _made_here[:] = [(run_dir, missing[-1])] if missing else []


def remove_run_dir_made_here(run_dir: Path) -> None:
    """Remove `run_dir` if note_new_run_dir found it missing, then its parents up to the
    outermost one that was missing, each only while empty (another run may have made its own
    directory in one meanwhile)."""
    run_dir = _absolute(run_dir)
    if not _made_here or _made_here[0][0] != run_dir:
        return
    outermost = _made_here.pop()[1]
    shutil.rmtree(run_dir, ignore_errors=True)
    for parent in run_dir.parents:
        if not parent.is_relative_to(outermost):
            break
        try:
            parent.rmdir()
        except OSError:
            break
