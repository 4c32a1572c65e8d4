"""`logger=mlflow`: Lightning's MLFlowLogger, told where the run sits.

One volt run is one MLflow run, named after the run's directory: in the experiment given
(`task_name` by default), or, for a job of a sweep, in one experiment named after the sweep's
directory. Tags: the run directory, the job's overrides, and the best checkpoint once one is
saved. Params are what volt gives every logger at the run's start (`volt.runs.hparams_tab`: the
resolved, redacted config); metrics go through Lightning's own `log_metrics`. The MLflow run's
id is kept in the run directory: a named run that is continued logs into the same MLflow run.

Only rank 0 writes: Lightning calls `experiment` (which creates or reopens the run) on rank 0
alone, and every method here that writes goes through it.
"""

import fcntl
import logging
import os
import re
from argparse import Namespace
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.loggers import MLFlowLogger
from lightning.pytorch.loggers.logger import rank_zero_experiment
from lightning.pytorch.utilities import rank_zero_only

from volt.errors import ConfigError
from volt.loggers.tracked_run import tracked_run

log = logging.getLogger(__name__)

TRACKER = "mlflow"
RUN_DIR_TAG = "volt.run_dir"
BEST_CHECKPOINT_TAG = "volt.best_checkpoint"
SQLITE = "sqlite:///"
# What MLflow accepts in a tag's name (`mlflow.utils.validation`); `+`, `~`, `@`, `[` are not.
NOT_IN_TAG_NAME = re.compile(r"[^\w./\- :]")


def override_tags(overrides: tuple[str, ...]) -> dict[str, str]:
    """`model.optimizer.lr=0.01` -> {"model.optimizer.lr": "0.01"}; `+x=1` -> {"x": "1"}."""
    tags = {}
    for override in overrides:
        key, _, value = override.partition("=")
        tags[NOT_IN_TAG_NAME.sub("_", key.lstrip("+"))] = value
    return tags


@contextmanager
def first_use_of(tracking_uri: str) -> Iterator[None]:
    """MLflow creates a new SQLite file's tables on first use, which two jobs of a parallel sweep
    must not do at once: they take turns, holding a lock on the file's directory (no lock file
    is left behind); a tracking server serialises its own writes."""
    if not tracking_uri.startswith(SQLITE):
        yield
        return
    database = Path(tracking_uri.removeprefix(SQLITE))
    database.parent.mkdir(parents=True, exist_ok=True)
    directory = os.open(database.parent, os.O_RDONLY)
    try:
        fcntl.flock(directory, fcntl.LOCK_EX)
        yield
    finally:
        os.close(directory)  # which releases the lock


class MLflowRunLogger(MLFlowLogger):
    def __init__(
        self,
        run_dir: str,
        sweep_dir: str,
        tracking_uri: str,
        experiment_name: str = "volt",
        artifact_location: str | None = None,
        **kwargs: Any,
    ) -> None:
        run = tracked_run(run_dir, sweep_dir)
        if artifact_location is None and tracking_uri.startswith(SQLITE):
            # MLflow's own default is ./mlruns in whatever directory the command started in.
            database = Path(tracking_uri.removeprefix(SQLITE))
            artifact_location = str(database.parent.absolute() / "mlartifacts")
        with first_use_of(tracking_uri):  # Lightning opens the store here, on every rank
            super().__init__(
                experiment_name=run.sweep or experiment_name,
                run_name=run.name,
                tracking_uri=tracking_uri,
                tags={**override_tags(run.overrides), RUN_DIR_TAG: str(run.directory)},
                artifact_location=artifact_location,
                run_id=run.stored_id(TRACKER, unstamped_ok=True),  # checked: _run_is_ours
                **kwargs,
            )
        self._tracked = run
        self._best_tagged = ""

    @property
    @rank_zero_experiment
    def experiment(self) -> Any:
        """The MLflow client, once this run's MLflow run exists: created, or reopened when the
        run directory holds the id of one from an earlier attempt."""
        if self._initialized:
            return self._mlflow_client
        if self._run_id is not None and not self._run_is_ours(self._run_id):
            log.warning(
                "MLflow run %s (from %s) is not in %s, or another run directory started it:"
                " starting a new MLflow run",
                self._run_id,
                self._tracked.directory,
                self._tracking_uri,
            )
            self._run_id = None
        continued = self._run_id is not None
        if not continued:
            self._experiment_id = self._experiment_by_name()
        client = super().experiment
        if continued:
            client.update_run(self._run_id, status="RUNNING")
        else:
            self._tracked.store_id(TRACKER, self._run_id)  # type: ignore[arg-type]  # just made
        return client

    def _run_is_ours(self, run_id: str) -> bool:
        """The run is in the store, not deleted, and was started from this run directory."""
        from mlflow.exceptions import MlflowException

        try:
            run = self._mlflow_client.get_run(run_id)
        except MlflowException as error:
            if error.error_code != "RESOURCE_DOES_NOT_EXIST":
                raise
            return False
        tag = run.data.tags.get(RUN_DIR_TAG)
        started_here = tag is not None and Path(tag).resolve() == self._tracked.directory.resolve()
        return run.info.lifecycle_stage != "deleted" and started_here

    def _experiment_by_name(self) -> str:
        """The experiment's id, made if missing; a job of a parallel sweep may make it first."""
        from mlflow.exceptions import MlflowException

        client, name = self._mlflow_client, self._experiment_name
        found = client.get_experiment_by_name(name)
        if found is None:
            try:
                return str(client.create_experiment(name, self._artifact_location))
            except MlflowException as error:
                if error.error_code != "RESOURCE_ALREADY_EXISTS":
                    raise
                found = client.get_experiment_by_name(name)
        if found is None or found.lifecycle_stage == "deleted":
            raise ConfigError(
                f"MLflow experiment {name!r} in {self._tracking_uri} is deleted: restore it"
                f" (mlflow experiments restore --experiment-id ID) or delete it for good"
                " (mlflow gc)"
            )
        return str(found.experiment_id)

    @rank_zero_only
    def log_hyperparams(self, params: Mapping[str, Any] | Namespace) -> None:
        """MLflow refuses to change a param: a continued run keeps the values its first attempt
        logged (only run-neutral keys, such as trainer.devices, may differ between attempts)."""
        given = vars(params) if isinstance(params, Namespace) else dict(params)
        logged = self.experiment.get_run(self.run_id).data.params
        # Lightning's MLFlowLogger stores a value's first 250 characters.
        changed = sorted(k for k, v in given.items() if k in logged and logged[k] != str(v)[:250])
        if changed:
            log.warning("MLflow keeps the first attempt's value of %s", ", ".join(changed))
        super().log_hyperparams({k: v for k, v in given.items() if k not in logged})

    @rank_zero_only
    def after_save_checkpoint(self, checkpoint_callback: ModelCheckpoint) -> None:
        super().after_save_checkpoint(checkpoint_callback)
        best = checkpoint_callback.best_model_path
        # The callback that follows the watched metric (last.ckpt's has no monitor).
        if checkpoint_callback.monitor is not None and best and best != self._best_tagged:
            self.experiment.set_tag(self.run_id, BEST_CHECKPOINT_TAG, best)
            self._best_tagged = best
