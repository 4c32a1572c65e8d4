"""`python train.py [overrides]`: Hydra composes the config, `volt.training.train` runs it, and
every error a user can fix ends as one line with exit status 2."""

import signal
import sys
from pathlib import Path

from hydra.errors import InstantiationException
from lightning.pytorch.utilities.exceptions import MisconfigurationException, SIGTERMException
from omegaconf import DictConfig

from volt.callbacks.finite_guard import NonFiniteLossError
from volt.config import in_multirun
from volt.config.composition import hydra_main
from volt.config.run_dirs import remove_run_dir_made_here
from volt.console import exit_on_config_error, exit_on_unexpected_error
from volt.data.downloads import DataNotFoundError
from volt.errors import ConfigError, RankFailedError, TrainingOutOfMemoryError
from volt.metric_names import find_watched
from volt.training import train

# What a user can cause and fix: one line, exit status 2 (volt.console.exit_on_config_error).
USER_ERRORS = (
    ConfigError,
    DataNotFoundError,
    InstantiationException,
    MisconfigurationException,
    TrainingOutOfMemoryError,
    NonFiniteLossError,
)


@hydra_main(config_name="train", on_config_error=exit_on_config_error)
def main(cfg: DictConfig) -> float | None:
    try:
        metrics = train(cfg)
    except SIGTERMException:
        # Lightning's own SIGTERM path (outside fit's steps, e.g. during test) exits 0: a
        # scheduler would count the job as done.
        sys.exit(128 + signal.SIGTERM)
    except Exception as error:
        if in_multirun():
            raise  # fail this job only; the sweep goes on and its summary lists the failure
        run_dir = Path(cfg.paths.output_dir)
        if not any(run_dir.glob("checkpoints/*")):  # nothing trained: nothing to keep
            remove_run_dir_made_here(run_dir)
        # Another rank's error written for the user (its out-of-memory) is one line too.
        user_caused = isinstance(error, USER_ERRORS) or (
            isinstance(error, RankFailedError) and error.user_facing
        )
        if user_caused:
            exit_on_config_error(error)
        exit_on_unexpected_error(error)
    # What a sweeper optimises: the watched metric's best value, else its last (under the name
    # the module logs it by: volt.metric_names).
    watch = find_watched(metrics, cfg.task.watch) or cfg.task.watch
    return metrics.get(f"{watch}_best", metrics.get(watch))
