"""`hydra/launcher=parallel`: the jobs of a sweep side by side, each in a fresh Python process.

Each job's config is composed here, as Hydra's basic launcher does; `slots.SlotPlanner` decides
when each starts and on which GPUs, and `jobs.run_jobs` runs them. Hydra's job callbacks run in
the job's process (`worker.py`), around the task function, as they would in-process.
"""

import logging
import os
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path

from hydra.core.hydra_config import HydraConfig
from hydra.core.utils import JobReturn, JobRuntime, configure_log, filter_overrides, setup_globals
from hydra.plugins.launcher import Launcher
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, OmegaConf, open_dict, read_write

from hydra_plugins.volt_parallel.jobs import Job, Sweep, run_jobs
from hydra_plugins.volt_parallel.slots import SlotPlanner, gpus_wanted, share_cores
from hydra_plugins.volt_parallel.worker import find_task_function

log = logging.getLogger(__name__)


class ParallelLauncher(Launcher):
    def __init__(
        self,
        n_jobs: int | None = None,
        threads_per_job: int | None = None,
        gpus: Sequence[str] | None = None,
        jobs_per_gpu: int = 1,
    ) -> None:
        self.n_jobs = n_jobs
        self.threads_per_job = threads_per_job
        self.gpus = None if gpus is None else [str(gpu) for gpu in gpus]
        self.jobs_per_gpu = jobs_per_gpu
        self.config: DictConfig | None = None
        self.hydra_context: HydraContext | None = None
        self.task_function: TaskFunction | None = None

    def setup(
        self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig
    ) -> None:
        self.config = config
        self.hydra_context = hydra_context
        self.task_function = task_function

    def launch(
        self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int
    ) -> Sequence[JobReturn]:
        assert self.config is not None and self.hydra_context is not None
        assert self.task_function is not None
        setup_globals()
        configure_log(self.config.hydra.hydra_logging, self.config.hydra.verbose)
        task_function = importable(self.task_function)
        gpus = visible_gpus() if self.gpus is None else self.gpus
        # Resolved once here: a job's process would resolve a time stamp of its own.
        sweep_dir = str(self.config.hydra.sweep.dir)
        jobs = [
            self._job(initial_job_idx + i, list(overrides), sweep_dir, len(gpus))
            for i, overrides in enumerate(job_overrides)
        ]
        slots = len(gpus) * self.jobs_per_gpu
        n_jobs = self.n_jobs if self.n_jobs is not None or not gpus else slots
        n_jobs, threads = share_cores(cpu_cores(), n_jobs, self.threads_per_job)
        planner = SlotPlanner([job.gpus_wanted for job in jobs], gpus, self.jobs_per_gpu, n_jobs)
        where = f"GPUs {','.join(gpus)}, {self.jobs_per_gpu} job(s) per GPU" if gpus else "the CPU"
        log.info(
            "Launching %d jobs, up to %d at once on %s (%d CPU thread(s) each)",
            len(jobs),
            n_jobs,
            where,
            threads,
        )
        for job, overrides in zip(jobs, job_overrides, strict=True):
            log.info("\t#%d : %s", job.index, " ".join(filter_overrides(overrides)))
        # Private to this user (mkdtemp's 0700): the job files are pickles, which the jobs load.
        exchange_dir = Path(tempfile.mkdtemp(prefix="volt-parallel-"))
        try:
            sweep = Sweep(
                hydra_context=self.hydra_context,
                task_function=task_function,
                task_name=JobRuntime.instance().get("name"),
                threads_per_job=threads,
                exchange_dir=exchange_dir,
            )
            return run_jobs(jobs, planner, sweep)
        finally:
            shutil.rmtree(exchange_dir, ignore_errors=True)

    def _job(self, index: int, overrides: list[str], sweep_dir: str, gpus_here: int) -> Job:
        assert self.config is not None and self.hydra_context is not None
        config = self.hydra_context.config_loader.load_sweep_config(self.config, overrides)
        with read_write(config.hydra), open_dict(config.hydra):
            config.hydra.job.id = str(index)  # a str field (OmegaConf 2.4 warns at an int)
            config.hydra.job.num = index
            config.hydra.sweep.dir = sweep_dir
        # As hydra.core.utils.run_job names it (the job's process does the same again), with the
        # job's Hydra config in force: the sub-directory may read it through ${hydra:...}.
        before = HydraConfig.instance().cfg
        HydraConfig.instance().set_config(config)
        try:
            directory = Path(sweep_dir, str(OmegaConf.select(config, "hydra.sweep.subdir")))
            # Unresolvable here (an environment variable only the job sets): one GPU.
            trainer = {
                key: OmegaConf.select(config, f"trainer.{key}", throw_on_resolution_failure=False)
                for key in ("accelerator", "devices")
            }
        finally:
            HydraConfig.instance().cfg = before
        with read_write(config.hydra.runtime), open_dict(config.hydra.runtime):
            config.hydra.runtime.output_dir = os.path.abspath(directory)
        wanted = gpus_wanted(trainer["accelerator"], trainer["devices"], gpus_here)
        return Job(index, config, directory.absolute(), wanted)


def importable(task_function: TaskFunction) -> tuple[str, str]:
    """Where a job's process finds the task function: its module and qualified name."""
    module, name = task_function.__module__, task_function.__qualname__
    try:
        found = find_task_function(module, name)
    except (ImportError, AttributeError):
        found = None
    if module == "__main__" or found is not task_function:
        raise ValueError(
            f"hydra/launcher=parallel imports the task function {module}.{name} in each job's"
            " process, and cannot from the script being run or a nested function: define it in"
            " a module the script imports (as train.py does volt.train.main), or use"
            " hydra/launcher=basic"
        )
    return module, name


def visible_gpus() -> list[str]:
    """The GPUs this process sees, named as CUDA_VISIBLE_DEVICES names them. Counting makes no
    CUDA context (torch.cuda stays uninitialised): no GPU memory goes to the sweep's process."""
    import torch  # here: Hydra imports every plugin module at start, GPUs or not

    count = torch.cuda.device_count()
    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    if listed is None:
        return [str(i) for i in range(count)]
    return [gpu.strip() for gpu in listed.split(",")][:count]


def cpu_cores() -> int:
    """The cores this process may run on (a cgroup's cpuset or taskset narrows them)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
