"""`python -m hydra_plugins.volt_parallel.worker JOB_FILE RESULT_FILE`: one sweep job, in a
process of its own (started by `jobs.JobProcess`).

JOB_FILE holds the job's config and what else `hydra.core.utils.run_job` needs; the job runs
through `run_job` as under Hydra's own launcher, Hydra's callbacks included, and its JobReturn
goes to RESULT_FILE. Everything the job prints goes where the launcher pointed stdout and stderr.
"""

import ctypes
import importlib
import inspect
import os
import pickle
import signal
import sys
import traceback
from pathlib import Path
from typing import Any

from hydra.core.utils import JobReturn, JobRuntime, JobStatus, run_job, setup_globals
from hydra.types import TaskFunction

# <linux/prctl.h>
_PR_SET_PDEATHSIG = 1


class JobFailedError(RuntimeError):
    """A job's error that could not be sent back as itself (its type does not pickle)."""


def find_task_function(module: str, qualname: str) -> TaskFunction:
    """The function `@hydra.main` decorates, by where it is defined (the module attribute is the
    decorated wrapper)."""
    found: Any = importlib.import_module(module)
    for name in qualname.split("."):
        found = getattr(found, name)
    return inspect.unwrap(found)


def end_with_parent(parent: int) -> None:
    """SIGTERM to this job if the sweep's process dies without stopping it (SIGKILL, the OOM
    killer): no job outlives its sweep. Linux only; elsewhere the launcher's own stop remains."""
    if sys.platform != "linux":
        return
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != parent:  # it died before prctl took
        sys.exit(128 + signal.SIGTERM)


def sendable(job_return: JobReturn) -> JobReturn:
    """`job_return` with a value that survives pickling: an error whose type cannot be rebuilt
    from its arguments goes back as JobFailedError with its text."""
    value = job_return._return_value
    try:
        pickle.loads(pickle.dumps(value))
    except Exception as error:
        if job_return.status == JobStatus.FAILED:
            job_return.return_value = JobFailedError(f"{type(value).__name__}: {value}")
        else:
            job_return.status = JobStatus.FAILED
            job_return.return_value = JobFailedError(
                f"the task function returned a {type(value).__name__}, which cannot be sent back"
                f" to the sweep ({error}): return a number, a string or a dict of them"
            )
    return job_return


def main() -> None:
    job_file, result_file = Path(sys.argv[1]), Path(sys.argv[2])
    job = pickle.loads(job_file.read_bytes())
    end_with_parent(job["parent"])
    setup_globals()
    # Hydra's other process-wide state stays behind: the job's config is composed already, and
    # the resolvers it needs register on import, with the task function's module.
    JobRuntime.instance().set("name", job["task_name"])
    task_function = find_task_function(*job["task_function"])
    # The sweep's context without its config loader: the job's config came composed.
    job_return = run_job(
        hydra_context=job["hydra_context"],
        task_function=task_function,
        config=job["config"],
        job_dir_key="hydra.sweep.dir",
        job_subdir_key="hydra.sweep.subdir",
    )
    if job_return.status == JobStatus.FAILED:
        # Hydra keeps the traceback in the exception, which does not travel: print it here, in
        # the job's own output.
        traceback.print_exception(job_return._return_value, file=sys.stderr)
    partial = result_file.with_suffix(".partial")
    partial.write_bytes(pickle.dumps(sendable(job_return)))
    partial.replace(result_file)  # whole or absent: the launcher reads it once this process ends


if __name__ == "__main__":
    main()
