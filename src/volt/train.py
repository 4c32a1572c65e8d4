"""`python train.py [overrides]`: Hydra composes the config, `volt.training.train` runs it, and
every error a user can fix ends as one line with exit status 2."""

import signal
import sys
from pathlib import Path

from omegaconf import DictConfig

from volt.config import in_multirun
from volt.config.composition import hydra_main
from volt.config.run_dirs import remove_run_dir_made_here
from volt.console import exit_on_config_error, exit_on_unexpected_error
from volt.metric_names import watched_value


@hydra_main(config_name="train", on_config_error=exit_on_config_error)
def main(cfg: DictConfig) -> float | None:
    # Imported once the config composed: torch and Lightning take seconds to import, which a
    # composition error, --cfg and --help do not wait for.
    from lightning.pytorch.utilities.exceptions import SIGTERMException

    from volt.training import is_user_caused, nothing_to_keep, train

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
        if nothing_to_keep(error, run_dir):
            remove_run_dir_made_here(run_dir)
        if is_user_caused(error):
            exit_on_config_error(error)
        exit_on_unexpected_error(error)
    # What a sweeper optimises (a search's trial has one, or failed: volt.sweeps.pruning).
    return watched_value(metrics, cfg.task.watch)
