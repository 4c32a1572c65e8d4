"""Hydra hooks: refuse a bad config before any directory exists; one process per run directory;
summarise a sweep at its end."""

import copy
import functools
import logging
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from hydra.core.hydra_config import HydraConfig
from hydra.core.utils import JobReturn, JobStatus
from hydra.experimental.callback import Callback
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf, open_dict, read_write

from volt.build import build_model_outline
from volt.config import in_multirun
from volt.config.keys import check_added_keys, check_target_arguments
from volt.config.redaction import refuse_literal_secrets, typed_overrides
from volt.config.run_dirs import check_run_dir, note_new_run_dir
from volt.config.validation import check_config, check_machine
from volt.console import exit_on_config_error
from volt.errors import ConfigError
from volt.folder_files import check_folder
from volt.rebuild import read_evaluated_run
from volt.runs.lock import RunLock, RunLockedError, lock_run_dir
from volt.runs.records import read_record, record_failure
from volt.runs.resume import check_resumed_weights, check_same_run, find_resume
from volt.sweeps.summary import collect_jobs, print_sweep_summary, write_sweep_summary

log = logging.getLogger(__name__)


def _exits_on_error(hook: Callable[..., None]) -> Callable[..., None]:
    """Hydra turns an exception in a callback into a warning and goes on to make the run's
    directory; volt's hooks end the process instead, with the one line."""

    @functools.wraps(hook)
    def guarded(*args: Any, **kwargs: Any) -> None:
        try:
            hook(*args, **kwargs)
        except Exception as error:
            exit_on_config_error(error)

    return guarded


def owns_run_dir() -> bool:
    """Only rank 0 locks: under torchrun and srun every rank runs Hydra in one run directory."""
    return int(os.environ.get("RANK", os.environ.get("SLURM_PROCID", "0"))) == 0


def hold_run_dir(directory: Path) -> RunLock | None:
    """Lock `directory` for this process (see volt.runs.lock); while another holds it: one line,
    exit status 2, nothing written. Taken before Hydra writes into the directory."""
    if not owns_run_dir():
        return None
    try:
        return lock_run_dir(directory)
    except RunLockedError as error:
        exit_on_config_error(error)


@contextmanager
def as_the_job_sees_it(config: DictConfig, run_dir: Path) -> Iterator[DictConfig]:
    """`config` with the runtime Hydra gives its job (`${hydra:runtime.output_dir}`, which
    `paths.output_dir` reads), before Hydra's run_job sets it: a model or data section may name
    the run's folder. Hydra's global config is put back after."""
    job = copy.deepcopy(config)
    with read_write(job.hydra.runtime), open_dict(job.hydra.runtime):
        job.hydra.runtime.output_dir = os.path.abspath(run_dir)  # as run_job sets it
    hydra_config = HydraConfig.instance()
    before = hydra_config.cfg
    hydra_config.set_config(job)
    try:
        yield job
    finally:
        hydra_config.cfg = before


def check_resume(config: DictConfig, run_dir: Path) -> None:
    """The checkpoint a named run would continue from, against the model built on the meta
    device: refused here, the resume leaves the run's folder as it was (the run checks its
    built model again; a sweep's job is checked only there, once Hydra wrote into its folder)."""
    resume = config.resume if owns_run_dir() else None  # rank 0 enforces it
    plan = find_resume(run_dir, config.name, resume)
    if plan.checkpoint is None:
        return
    with as_the_job_sees_it(config, run_dir) as job:
        try:
            outline = build_model_outline(job)
        except ConfigError:
            raise
        except Exception:
            # A user's module that cannot be built on the meta device (its __init__ reads a
            # value, say): the run builds it for real and checks it there, once Hydra has
            # written the run's records.
            log.debug("resume check: the model does not build on the meta device", exc_info=True)
            return
        check_resumed_weights(outline, plan.checkpoint)


class VoltCallback(Callback):
    def __init__(self) -> None:
        # The run's or the whole sweep's directory, held until this process ends it; and the
        # directory of the sweep job under way.
        self._dir_lock: RunLock | None = None
        self._job_lock: RunLock | None = None

    def __getstate__(self) -> dict[str, Any]:
        # Submitit pickles this object into every job process; a lock stays with its process.
        return {**self.__dict__, "_dir_lock": None, "_job_lock": None}

    @_exits_on_error
    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        self._validate(config)
        if owns_run_dir():  # torchrun's ranks share it: rank 0's to make, and to take away
            note_new_run_dir(Path(config.hydra.run.dir))  # before the lock makes it
        self._dir_lock = hold_run_dir(Path(config.hydra.run.dir))

    @_exits_on_error
    def on_run_end(self, config: DictConfig, **kwargs: Any) -> None:
        if self._dir_lock is not None:
            self._dir_lock.release()

    @_exits_on_error
    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        self._validate(config)
        self._dir_lock = hold_run_dir(Path(config.hydra.sweep.dir))

    @_exits_on_error
    def on_job_start(self, config: DictConfig, **kwargs: Any) -> None:
        # A sweep job holds its own directory too: under submitit it runs in a process of its own,
        # where Hydra has made the directory, written .hydra/ and opened the log before this hook.
        if in_multirun():
            self._job_lock = hold_run_dir(Path(config.hydra.runtime.output_dir))

    @_exits_on_error
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
        if self._job_lock is not None:
            self._job_lock.release()

    @_exits_on_error
    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        print_sweep_summary(Path(config.hydra.sweep.dir))
        if self._dir_lock is not None:
            self._dir_lock.release()

    @staticmethod
    def _validate(config: DictConfig) -> None:
        # HydraConfig is set only once the job runs: the mode comes from the config here.
        multirun = config.hydra.mode == RunMode.MULTIRUN
        try:
            refuse_literal_secrets(config)  # before Hydra writes .hydra/
            check_target_arguments(config)  # the allow-list first: both import targets
            check_added_keys(config)
            check_config(config)
            check_run_dir(config)
            check_machine(config)
            if config.get("name"):  # an existing directory may have come from someone else
                # A named sweep's folder holds its jobs' folders, checked with it: Hydra opens a
                # job's train.log and writes its .hydra/ before any hook of the job runs.
                named = Path(config.hydra.sweep.dir if multirun else config.hydra.run.dir)
                check_folder(named, f"name={config.name}")
                # Its records are read now as well: a malformed one ends in one line before
                # Hydra writes there, not once the run (or a job) reads it.
                if multirun:
                    collect_jobs(named)
                else:
                    read_record(named, named)
            if "ckpt_path" in config:  # eval
                # The checkpoint's config is data: refused here before Hydra makes the run
                # directory, against this command's trusted_targets, never the checkpoint's own.
                read_evaluated_run(config)
            elif config.get("name") and not multirun:
                run_dir = Path(config.hydra.run.dir)
                neutral = config.hydra.job.config.override_dirname.exclude_keys
                check_same_run(run_dir, config.name, typed_overrides(config), list(neutral))
                check_resume(config, run_dir)
        except ConfigError as error:
            exit_on_config_error(error)
