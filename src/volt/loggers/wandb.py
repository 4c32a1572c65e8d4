"""`logger=wandb`: Lightning's WandbLogger, told where the run sits, offline unless logged in.

One volt run is one W&B run, named after the run's directory, its files under `<run dir>/wandb/`;
a sweep's jobs share a group named after the sweep's directory, and carry their overrides as
tags. The W&B run id is kept in the run directory: a named run that is continued logs into the
same W&B run. volt never reads or writes the API key: W&B takes it from WANDB_API_KEY or
`wandb login`'s netrc entry itself.

Only rank 0 writes: Lightning calls `experiment` (which starts the W&B run) on rank 0 alone.
"""

import netrc
import os
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from lightning.pytorch.loggers import WandbLogger
from lightning.pytorch.loggers.logger import rank_zero_experiment
from lightning.pytorch.utilities import rank_zero_only

from volt.loggers.tracked_run import tracked_run

TRACKER = "wandb"
TAG_LENGTH = 64  # W&B refuses longer tags


def logged_in() -> bool:
    """Whether W&B has an API key to go online with: WANDB_API_KEY, or a netrc entry for its
    host (what `wandb login` writes; NETRC names another file, as for W&B itself)."""
    if os.environ.get("WANDB_API_KEY"):
        return True
    host = urlparse(os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai")).hostname
    path = Path(os.environ.get("NETRC") or Path.home() / ".netrc").expanduser()
    if not path.is_file():
        return False
    try:
        return netrc.netrc(path).authenticators(host or "") is not None
    except netrc.NetrcParseError:
        return False  # W&B cannot read a login from it either


def wandb_mode(offline: bool | None) -> str | None:
    """What wandb.init gets as `mode`: None leaves it to W&B (and WANDB_MODE)."""
    if offline is None:
        if os.environ.get("WANDB_MODE"):
            return None  # the user's own choice
        return None if logged_in() else "offline"
    return "offline" if offline else "online"


class WandbRunLogger(WandbLogger):
    def __init__(
        self, run_dir: str, sweep_dir: str, offline: bool | None = None, **kwargs: Any
    ) -> None:
        """offline: None for offline unless W&B can log in (or WANDB_MODE says otherwise)."""
        run = tracked_run(run_dir, sweep_dir)
        super().__init__(
            name=run.name,
            save_dir=run_dir,
            id=run.stored_id(TRACKER),
            group=run.sweep,
            tags=[override[:TAG_LENGTH] for override in run.overrides],
            mode=wandb_mode(offline),
            **kwargs,
        )
        self._tracked = run

    @property
    @rank_zero_experiment
    def experiment(self) -> Any:
        import wandb

        starting = self._experiment is None
        if starting and wandb.run is not None and wandb.run.id != self._id:
            # The run of the sweep's previous job, in this same process (Hydra's basic launcher
            # runs jobs one after another): Lightning would log this job into it.
            wandb.run.finish()
        run = super().experiment
        if starting:
            self._tracked.store_id(TRACKER, run.id)
        return run

    @rank_zero_only
    def finalize(self, status: str) -> None:
        super().finalize(status)
        # A run that succeeded stays open for the test and the final hparams after fit; W&B
        # finishes it when the process exits, or the next job of a sweep does (`experiment`).
        if status == "failed" and self._experiment is not None:
            self._experiment.finish(exit_code=1)
