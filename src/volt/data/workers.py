"""DataLoader workers that leave SIGTERM and Ctrl+C to the training process.

A scheduler or a shell signals every process of a job's process group: SLURM at pre-emption
(`--signal=TERM@120`) and on scancel, `timeout`, Ctrl+C in a terminal. torch's workers (seen with
torch 2.11 and 2.14) die of a SIGTERM that their parent did not send, and end at a Ctrl+C; the
training process then fails inside the step ("DataLoader worker (pid N) is killed by signal:
Terminated", seen on an H200 under `timeout -s TERM`), so GracefulShutdown never gets to save
`last.ckpt` and the run exits 1 instead of 143. Keep this while torch's workers act on signals
meant for the job (no upstream issue found).

Workers started with `worker_init_fn=signal_proof_workers()` ignore both signals. Normally the
training process stops them through their queues; where it does not (Lightning leaves persistent
workers running when a fit ends by an exception), Python's exit would send them a SIGTERM that
they ignore and then wait for them forever, so they are killed at exit instead.
"""

import atexit
import functools
import multiprocessing
import os
import signal
from collections.abc import Callable

from lightning.fabric.utilities.seed import pl_worker_init_function


def init_worker(worker_id: int) -> None:
    """In each worker: ignore SIGTERM and SIGINT, and seed it as Lightning would
    (`seed_everything(workers=True)` adds its own worker_init_fn only to loaders that have none)."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if os.environ.get("PL_SEED_WORKERS") == "1":
        pl_worker_init_function(worker_id)


def _kill_leftover_workers() -> None:
    # Runs before multiprocessing's own exit handler (registered earlier, run later), which would
    # terminate daemonic children with a SIGTERM these ignore, then join them.
    for child in multiprocessing.active_children():
        if child.daemon:
            child.kill()


@functools.cache  # one kill at exit however many loaders
def signal_proof_workers() -> Callable[[int], None]:
    """The worker_init_fn to give a DataLoader; the first call also sets up the kill at exit."""
    atexit.register(_kill_leftover_workers)
    return init_worker
