"""Sweep jobs as processes: start each in a session of its own, wait for them, stop them all.

A job is `python -m hydra_plugins.volt_parallel.worker`, a fresh non-daemonic process: its
environment is set before it imports anything (CUDA_VISIBLE_DEVICES before CUDA starts), and it
may start processes of its own (a DDP job's ranks), which a daemonic multiprocessing worker may
not. Its own session makes the job and everything it starts one process group, so a stop reaches
all of them, and the terminal's Ctrl+C reaches only the launcher, which passes it on.
"""

import logging
import os
import pickle
import signal
import subprocess
import sys
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from types import FrameType

from hydra.core.hydra_config import HydraConfig
from hydra.core.utils import JobReturn, JobStatus
from hydra.types import HydraContext
from omegaconf import DictConfig, OmegaConf

from hydra_plugins.volt_parallel.slots import SlotPlanner, Start

log = logging.getLogger(__name__)

# How often the launcher looks for jobs that ended.
POLL_S = 0.2
# After SIGINT or SIGTERM: how long the jobs have to stop by themselves (volt's save last.ckpt
# at their next step) before they are killed.
STOP_GRACE_S = 60
WORKER = "hydra_plugins.volt_parallel.worker"
# What a job prints (its console), in its directory next to the log Hydra's job logging writes.
OUTPUT_FILE = "console.log"


class JobProcessError(RuntimeError):
    """A job's process ended without sending back its result (killed, or it exited early)."""


@dataclass
class Job:
    index: int
    config: DictConfig  # the job's whole config, hydra.runtime.output_dir set
    directory: Path
    gpus_wanted: int


@dataclass
class Sweep:
    """What every job of one `launch` shares."""

    hydra_context: HydraContext
    task_function: tuple[str, str]  # module, qualified name
    task_name: str
    threads_per_job: int
    exchange_dir: Path  # the job and result files


class JobProcess:
    def __init__(self, job: Job, gpus: tuple[str, ...], sweep: Sweep) -> None:
        self.job = job
        self.result_file = sweep.exchange_dir / f"{job.index}.result"
        job_file = sweep.exchange_dir / f"{job.index}.job"
        # Hydra's callback objects as the sweep set them up (as Hydra's submitit launcher sends
        # them) and, with hydra-core 1.4, the execution whitelist the job's logging is configured
        # under; not the config loader: the job's config is composed.
        context = replace(sweep.hydra_context, config_loader=None)  # type: ignore[arg-type]
        job_file.write_bytes(
            pickle.dumps(
                {
                    "config": job.config,
                    "hydra_context": context,
                    "task_function": sweep.task_function,
                    "task_name": sweep.task_name,
                    "parent": os.getpid(),
                }
            )
        )
        job.directory.mkdir(parents=True, exist_ok=True)
        self.output_file = job.directory / OUTPUT_FILE
        with self.output_file.open("ab") as output:
            self.process = subprocess.Popen(
                [sys.executable, "-m", WORKER, job_file, self.result_file],
                env=job_environment(gpus, sweep.threads_per_job),
                stdin=subprocess.DEVNULL,
                stdout=output,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.started = time.monotonic()

    def signal(self, signum: int) -> bool:
        """Send `signum` to the job and every process it started; False if none was left."""
        try:
            os.killpg(self.process.pid, signum)
        except ProcessLookupError:
            return False
        return True

    def job_return(self) -> JobReturn:
        """Once the process ended: the JobReturn it sent, else a failed one saying how it ended."""
        if self.result_file.is_file():
            job_return: JobReturn = pickle.loads(self.result_file.read_bytes())
            return job_return
        code = self.process.returncode
        how = f"was killed by {signal.Signals(-code).name}" if code < 0 else f"exited with {code}"
        config = self.job.config
        task_config = OmegaConf.masked_copy(config, [str(k) for k in config if k != "hydra"])
        job_return = JobReturn(
            overrides=list(config.hydra.overrides.task),
            cfg=task_config,
            hydra_cfg=OmegaConf.masked_copy(config, ["hydra"]),
            working_dir=os.getcwd(),
            task_name=str(config.hydra.job.name),
            status=JobStatus.FAILED,
        )
        job_return.return_value = JobProcessError(
            f"job {self.job.index}'s process {how} before it could send back a result:"
            f" see {self.output_file}"
        )
        return job_return


def job_environment(gpus: tuple[str, ...], threads: int) -> dict[str, str]:
    environment = {
        **os.environ,
        "CUDA_VISIBLE_DEVICES": ",".join(gpus),  # "" for a job on the CPU: no GPU to touch
        "OMP_NUM_THREADS": str(threads),  # torch's CPU threads; Lightning keeps a value given
        "PYTHONUNBUFFERED": "1",  # its output file is current when it is killed
    }
    # The script's folder, which is on the launcher's sys.path: a task function defined next to
    # the script imports in the job as it did here.
    script_dir = os.path.abspath(sys.path[0] or os.curdir)
    environment["PYTHONPATH"] = os.pathsep.join(
        [script_dir, *filter(None, [os.environ.get("PYTHONPATH")])]
    )
    return environment


def run_jobs(jobs: list[Job], planner: SlotPlanner, sweep: Sweep) -> list[JobReturn]:
    """Run `jobs` as `planner` allows; every job's JobReturn, in job order. SIGINT or SIGTERM
    stops every running job and raises SystemExit(128 + signal)."""
    running: dict[int, JobProcess] = {}
    returns: dict[int, JobReturn] = {}
    with _signals_noted() as received:
        try:
            while not planner.done() and not received:
                for start in planner.starts():
                    running[start.job] = _start(jobs[start.job], start, sweep)
                time.sleep(POLL_S)
                for index, process in list(running.items()):
                    if process.process.poll() is not None:
                        del running[index]
                        planner.end(index)
                        returns[index] = _ended(process, sweep.hydra_context)
        finally:
            _stop(running.values(), received[0] if received else signal.SIGTERM, received)
    if received:
        raise SystemExit(128 + received[0])
    # By place in `jobs`, as the planner counts them: job.index is the job's number in the sweep,
    # past 0 for every batch but the first of a sweeper that launches in batches (volt_optuna).
    return [returns[place] for place in range(len(jobs))]


def _start(job: Job, start: Start, sweep: Sweep) -> JobProcess:
    process = JobProcess(job, start.gpus, sweep)
    where = (
        f"GPU {','.join(start.gpus)}" if start.gpus else f"CPU, {sweep.threads_per_job} thread(s)"
    )
    log.info("#%d started (pid %d, %s) -> %s", job.index, process.process.pid, where, job.directory)
    return process


def _ended(process: JobProcess, hydra_context: HydraContext) -> JobReturn:
    job = process.job
    if process.signal(signal.SIGKILL):
        log.warning("#%d left processes behind when it ended: killed them", job.index)
    job_return = process.job_return()
    took = time.monotonic() - process.started
    if job_return.status == JobStatus.COMPLETED:
        log.info("#%d completed in %.1f s, returned %s", job.index, took, job_return.return_value)
        return job_return
    error = job_return._return_value
    log.error("#%d failed in %.1f s: %s: %s", job.index, took, type(error).__name__, error)
    if isinstance(error, JobProcessError):
        # The job never reached Hydra's on_job_end: run it here, so that what a callback keeps
        # of each job (volt's sweep summary) has this one too.
        before = HydraConfig.instance().cfg
        HydraConfig.instance().set_config(job.config)
        try:
            hydra_context.callbacks.on_job_end(config=job.config, job_return=job_return)
        finally:
            HydraConfig.instance().cfg = before
    return job_return


def _stop(processes: Iterable[JobProcess], signum: int, received: list[int]) -> None:
    """Pass `signum` to every job, give them STOP_GRACE_S, then kill what is left (at once if
    another signal comes meanwhile)."""
    signalled = [p for p in processes if p.signal(signum)]
    if not signalled:
        return
    log.warning("Stopping %d running job(s) (%s)", len(signalled), signal.Signals(signum).name)
    deadline = time.monotonic() + STOP_GRACE_S
    asked = len(received)
    while time.monotonic() < deadline and len(received) == asked:
        if all(p.process.poll() is not None for p in signalled):
            break
        time.sleep(POLL_S)
    for process in signalled:
        process.signal(signal.SIGKILL)  # the job's leftovers too, if it ended by itself
        process.process.wait()


@contextmanager
def _signals_noted() -> Iterator[list[int]]:
    """SIGINT and SIGTERM are noted in the list yielded instead of raising where the launcher
    happens to be: it stops the jobs itself, with all its bookkeeping whole."""
    received: list[int] = []

    def note(signum: int, frame: FrameType | None) -> None:
        received.append(signum)

    previous = {s: signal.signal(s, note) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield received
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
