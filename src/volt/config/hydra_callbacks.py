"""Hydra hooks: refuse a bad config before any directory exists; summarise a sweep at its end."""

import logging
import os
import sys
from pathlib import Path
from typing import Any

from hydra.core.hydra_config import HydraConfig
from hydra.core.utils import JobReturn, JobStatus
from hydra.experimental.callback import Callback
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from volt.config.validation import ConfigError, check_checkpoint, check_config, check_machine
from volt.resume import check_same_run
from volt.run_records import record_failure
from volt.sweeps.summary import print_sweep_summary, write_sweep_summary

log = logging.getLogger(__name__)


def exit_on_config_error(error: Exception) -> None:
    """One line, no traceback (set VOLT_TRACEBACK=1 for it), exit status 2."""
    if os.environ.get("VOLT_TRACEBACK"):
        raise error
    kind = "config error" if isinstance(error, ConfigError) else "error"
    print(f"volt: {kind}: {error}", file=sys.stderr)
    sys.exit(2)


def in_multirun() -> bool:
    return HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN


class VoltCallback(Callback):
    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        self._validate(config)

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        self._validate(config)

    def on_job_end(self, config: DictConfig, job_return: JobReturn, **kwargs: Any) -> None:
        # Hydra keeps a failed sweep job's exception to itself; say which job failed and why.
        if not in_multirun():
            return
        if job_return.status == JobStatus.FAILED:
            error = job_return._return_value
            job = OmegaConf.select(config, "hydra.job.num", default="")
            log.error("job %s failed: %s: %s", job, type(error).__name__, error)
            job_dir = Path(config.hydra.runtime.output_dir)
            record_failure(job_dir, f"{type(error).__name__}: {error}")
        # Hydra skips on_multirun_end when a job failed, so the table is kept current here.
        write_sweep_summary(Path(config.hydra.sweep.dir))

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        print_sweep_summary(Path(config.hydra.sweep.dir), str(config.get("optimized_metric")))

    @staticmethod
    def _validate(config: DictConfig) -> None:
        try:
            check_config(config)
            check_machine(config)
            if config.get("task_name") == "eval":
                check_checkpoint(config)
            elif config.get("name") and not in_multirun():
                run_dir = Path(config.hydra.run.dir)
                check_same_run(run_dir, config.name, list(config.hydra.overrides.task))
        except ConfigError as error:
            exit_on_config_error(error)
