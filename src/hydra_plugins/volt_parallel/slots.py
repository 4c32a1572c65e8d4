"""Which sweep job runs when, and on which GPUs: pure decisions, no processes (see launcher.py).

Jobs start in sweep order, each as soon as its GPUs and a free slot allow; a job that ends,
failed or not, gives its GPUs back. A job never jumps the queue, so a job that wants more GPUs
than are free waits and the ones behind it wait too: the order in the summary is the order of
starts.
"""

from collections.abc import Sequence
from dataclasses import dataclass

# CPU threads per job when neither hydra.launcher.n_jobs nor threads_per_job is given: a small
# model gains little from more threads, and a job per thread would multiply the memory in use.
DEFAULT_THREADS_PER_JOB = 2


@dataclass(frozen=True)
class Start:
    job: int
    gpus: tuple[str, ...]  # as CUDA_VISIBLE_DEVICES names them; () for a job on the CPU


def gpus_wanted(accelerator: object, devices: object, gpus_here: int) -> int:
    """How many GPUs a job takes, from its `trainer.accelerator` and `trainer.devices` (None when
    the config has no trainer: one GPU where there are any)."""
    if gpus_here == 0 or str(accelerator) == "cpu":
        return 0
    if devices is None:
        return 1
    if isinstance(devices, int):
        return gpus_here if devices == -1 else devices
    if isinstance(devices, Sequence) and not isinstance(devices, str):
        return len(devices)  # device indices, as Lightning takes them
    text = str(devices).strip()
    if text in ("auto", "-1"):
        return gpus_here
    if text.isdigit():
        return int(text)
    return len([part for part in text.split(",") if part.strip()])  # "0,1": indices


def share_cores(cores: int, n_jobs: int | None, threads_per_job: int | None) -> tuple[int, int]:
    """(jobs at once, threads each) on `cores`: give one and the other fills the cores; give
    neither and each job gets DEFAULT_THREADS_PER_JOB threads."""
    if n_jobs is None:
        threads = threads_per_job or min(DEFAULT_THREADS_PER_JOB, cores)
        return max(1, cores // threads), threads
    return n_jobs, threads_per_job or max(1, cores // n_jobs)


class SlotPlanner:
    """Hands out GPUs to jobs in order. Each GPU takes `jobs_per_gpu` jobs at once; at most
    `max_running` jobs run at once in all. Jobs that want no GPU (`needs` 0) only take a slot."""

    def __init__(
        self, needs: Sequence[int], gpus: Sequence[str], jobs_per_gpu: int, max_running: int
    ) -> None:
        if jobs_per_gpu < 1:
            raise ValueError(f"hydra.launcher.jobs_per_gpu={jobs_per_gpu}: use 1 or more")
        if max_running < 1:
            raise ValueError(f"hydra.launcher.n_jobs={max_running}: use 1 or more")
        for job, need in enumerate(needs):
            if need > len(gpus):
                raise ValueError(
                    f"sweep job {job} wants {need} GPUs but the launcher has {len(gpus)}"
                    f" ({','.join(gpus) or 'none'}): lower trainer.devices, or list more in"
                    " hydra.launcher.gpus"
                )
        self._needs = list(needs)
        self._free = dict.fromkeys(gpus, jobs_per_gpu)  # GPU -> jobs it can still take
        self._max_running = max_running
        self._next = 0
        self._running: dict[int, tuple[str, ...]] = {}

    def starts(self) -> list[Start]:
        """The jobs that can start now, in order, each with the GPUs it takes."""
        started = []
        while self._next < len(self._needs) and len(self._running) < self._max_running:
            gpus = self._take(self._needs[self._next])
            if gpus is None:
                break
            self._running[self._next] = gpus
            started.append(Start(self._next, gpus))
            self._next += 1
        return started

    def end(self, job: int) -> None:
        """`job` ended, whatever its outcome: its GPUs and slot go to the jobs waiting."""
        for gpu in self._running.pop(job):
            self._free[gpu] += 1

    def done(self) -> bool:
        return self._next == len(self._needs) and not self._running

    def _take(self, need: int) -> tuple[str, ...] | None:
        # The GPUs with the most room first (then in the order given): with jobs_per_gpu > 1
        # jobs spread over the GPUs before they double up.
        room = [gpu for gpu, free in self._free.items() if free]
        room.sort(key=lambda gpu: -self._free[gpu])  # stable: ties keep the order given
        if len(room) < need:
            return None
        taken = tuple(sorted(room[:need], key=list(self._free).index))
        for gpu in taken:
            self._free[gpu] -= 1
        return taken
