"""The options of `hydra/launcher=parallel` (`hydra.launcher.<option>=...`)."""

from dataclasses import dataclass

from hydra.core.config_store import ConfigStore


@dataclass
class ParallelLauncherConf:
    _target_: str = "hydra_plugins.volt_parallel.launcher.ParallelLauncher"
    # Jobs at once. null: one per GPU (or group of GPUs, for jobs with trainer.devices=N) where
    # there are GPUs; on the CPU, as many as the cores allow at threads_per_job each.
    n_jobs: int | None = None
    # torch's CPU threads in each job (OMP_NUM_THREADS). null: the cores divided among the jobs
    # running at once (2 each when n_jobs is null too).
    threads_per_job: int | None = None
    # The GPUs to use, as CUDA_VISIBLE_DEVICES names them. null: every GPU this process sees.
    gpus: list[str] | None = None
    # Jobs that share one GPU at a time (small models that leave most of a GPU idle).
    jobs_per_gpu: int = 1


ConfigStore.instance().store(
    group="hydra/launcher", name="parallel", node=ParallelLauncherConf, provider="volt"
)
