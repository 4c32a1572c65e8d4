"""The sweeper's settings, registered as `hydra/sweeper=volt_optuna`. Hydra imports every module
of `hydra_plugins` at start-up, in every run: nothing here imports Optuna."""

from dataclasses import dataclass, field
from typing import Any

from hydra.core.config_store import ConfigStore


@dataclass
class VoltOptunaSweeperConf:
    _target_: str = "hydra_plugins.volt_optuna.sweeper.VoltOptunaSweeper"
    # Sampler and pruner reach the sweeper as configs: it seeds the sampler anew when a search
    # continues, and the pruner is built in each trial's job (volt.build), not here.
    _recursive_: bool = False
    study_name: str = "search"
    # The task's watched metric decides; a study's direction cannot change once it exists.
    direction: str = "${volt.direction:${task.mode}}"
    n_trials: int = 20  # in the whole study, across continuations: raise it to add trials
    n_jobs: int = 1  # trials handed to the launcher at once
    # null: TPESampler; else a config, e.g. {_target_: optuna.samplers.TPESampler, seed: 1234}
    sampler: Any = None
    # null: volt.sweeps.pruning.default_pruner() (median, after a warm-up); no pruning:
    # {_target_: optuna.pruners.NopPruner}. Validations are the pruner's steps (0, 1, ...).
    # null defaults rather than default dicts: a config given here replaces the default whole,
    # where it would be merged into a default dict (keys of another pruner included).
    pruner: Any = None
    # key: interval(a, b) | tag(log, interval(a, b)) | tag(int, interval(a, b)) | choice(...) |
    # range(a, b, step)
    params: dict[str, str] = field(default_factory=dict)


ConfigStore.instance().store(
    group="hydra/sweeper", name="volt_optuna", node=VoltOptunaSweeperConf, provider="volt"
)
