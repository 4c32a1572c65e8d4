"""The ranks of a volt DDP or FSDP run: started from the run's resolved config, ended with the run.

Lightning's DDP launcher starts ranks 1..N-1 by running `sys.argv` again. Under Hydra that runs
Hydra again: inside `-m`, every rank starts a sweep of its own (a sweep directory each; Optuna
samples different parameters per rank). Here rank 0 is still the job's own process, but the other
ranks of this node run `python -m volt.rank <run dir>/config_resolved.yaml RANK`:
the config this job resolved before building its Trainer, trained by the same `volt.train.train`.
They make no directory and write nothing but their own log, `<run dir>/train_rank<RANK>.log`.

A run's ranks live exactly as long as the run (`ranks_end_with_run`): after it, rank 0 waits for
them, closes its process group and restores the environment, so the next job of a sweep starts
clean; if it raised, the ranks are killed first. (In the ranks themselves, and under torchrun,
the same block only closes the process group.)

When a rank fails, Lightning's observer kills the other ranks at once and then kills rank 0 too,
which would end a whole sweep. Here rank 0 gets `RANK_ZERO_GRACE_S` to end the run itself: under
gloo its next collective fails at once ("Connection closed by peer"), the run raises, and a sweep
goes on with its next job. NCCL collectives wait for a dead peer until their timeout instead (the
main thread waits in C, where no exception or signal handler reaches it), and neither backend
notices a rank that dies before joining the process group: after the grace period the watcher
ends rank 0's process itself, as Lightning's would with SIGKILL, but first says what the failed
rank said and records the run as failed in run.json. A failed rank logs its error's one line;
it exits 2 when that error was written for the user (out of memory, a config value), and the run
then ends with that line as train.py ends on its own such errors; 1 for any other. An error that
every rank raises at the same step from a verdict they pooled (`VerdictOfAllRanksError`:
FiniteGuard's NaN), or rank 0's own out-of-memory, is rank 0's own to report;
the other ranks' exits with it blame no one.

Under torchrun or SLURM's srun the ranks exist already and nothing is launched (Lightning asks its
cluster environment, as its own DDP does).

Why a launcher of volt's own: Lightning's `_SubprocessScriptLauncher` re-runs the command line,
which under Hydra's multirun starts a sweep per rank (Lightning-AI/pytorch-lightning#11300 and
#2727; the Hydra-aware command of #11617 still re-runs the sweep, and its follow-up #18175 is
unmerged; seen on Lightning 2.4-2.6.6). Delete this module when Lightning starts ranks from the
resolved config of the job, not the command line.
"""

import datetime
import hashlib
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.fabric.plugins import ClusterEnvironment
from lightning.fabric.strategies.launchers.subprocess_script import _ChildProcessObserver
from lightning.fabric.utilities.distributed import _set_num_threads_if_needed
from lightning.pytorch.strategies import DDPStrategy, ModelParallelStrategy
from lightning.pytorch.strategies.launchers import _SubprocessScriptLauncher
from lightning.pytorch.utilities import rank_zero_info
from typing_extensions import override

from volt.config import PROJECT_ROOT
from volt.errors import (
    RankFailedError,
    TrainingOutOfMemoryError,
    VerdictOfAllRanksError,
    on_one_line,
)
from volt.runs import end_open_records

log = logging.getLogger(__name__)

# After another rank failed: how long rank 0 has to end the run by itself before it is killed.
RANK_ZERO_GRACE_S = 20
# After rank 0's run raised: how long the other ranks have to exit on their own before the kill.
CRASHED_RANK_EXIT_S = 5
# After a failure, with the other ranks gone: how long closing the process group may take.
RELEASE_AFTER_FAILURE_S = 10
# After rank 0 ended the run well: how long the other ranks may take to exit.
RANK_EXIT_TIMEOUT_S = 60
# How a rank that did not fail by itself ends: killed here, or stopped by a signal it was sent
# (exit 128 + the signal, volt.errors.TrainingInterrupted).
_STOPPED_NOT_FAILED = {-signal.SIGKILL, 128 + signal.SIGTERM, 128 + signal.SIGINT}
# Set by the launcher in rank 0 for the process group; restored when the run ends.
_RENDEZVOUS_VARIABLES = ("MASTER_ADDR", "MASTER_PORT")
# Before torch 2.8 TCPStore's libuv server takes over a listening socket handed to it but never
# accepts on it (pytorch/pytorch#150215): the ranks would wait out the rendezvous timeout. There
# the older server, which always could. Delete once torch>=2.8 is the floor.
_LIBUV_SERVES_A_SOCKET = torch.__version__ >= "2.8"


# A rank > 0 that fails exits with this code when its error was written for the user (out of
# memory, a config value: `volt.rank`), 1 for any other; its log then holds `rank_failed(rank)`
# followed by the error's one line, which rank 0 repeats as the run's error.
USER_ERROR_EXIT = 2


def rank_log_file(run_dir: Path, rank: int) -> Path:
    """Where rank `rank` (> 0) logs: next to rank 0's `train.log`."""
    return run_dir / f"train_rank{rank}.log"


def rank_failed(rank: int) -> str:
    """How a failed rank's log line starts, before its error's one line."""
    return f"Rank {rank} failed: "


def rank_failure(rank: int, world: int, said: str, log_file: Path) -> str:
    """The run's one line for rank `rank` failing with the one line `said`."""
    of = f" of {world}" if world else ""
    return f"rank {rank}{of} failed: {said} (its log: {log_file})"


def said_by_failed_rank(log_file: Path, rank: int) -> str | None:
    """The one line of error that rank `rank` logged as it failed, if it did."""
    marker = rank_failed(rank)
    try:
        with log_file.open(encoding="utf-8", errors="replace") as lines:
            said = [line.split(marker, 1)[1].strip() for line in lines if marker in line]
    except OSError:
        return None
    return said[-1] if said else None


def reserve_rendezvous_port(address: str) -> "torch.distributed.TCPStore":
    """The rendezvous server of this run, already listening on `address` (the run's MASTER_ADDR)
    at a port the system picked.

    Lightning picks a free port and opens it only later, in `init_process_group`; meanwhile
    another run on the machine (a sweep under submitit_local starts all its jobs at once) can
    take it, or a rank's outgoing connection can be given it, and the run fails with EADDRINUSE.
    Holding the port from the start closes that window. The store is multi-tenant, so rank 0's
    `init_process_group` serves from this same listening socket instead of binding the port again.

    Given a host name, TCPStore listens on every interface of the machine (seen in torch 2.11
    and 2.14, with and without libuv), and anyone who reaches the port can write to the store
    the ranks meet in. Handed a socket bound to `address` instead, it listens there alone: on
    127.0.0.1, Lightning's default, only this machine can connect.
    """
    family, kind, protocol, _, where = socket.getaddrinfo(address, 0, type=socket.SOCK_STREAM)[0]
    with socket.socket(family, kind, protocol) as listener:
        try:
            listener.bind(where)
        except OSError as error:
            raise OSError(
                error.errno,
                f"MASTER_ADDR={address}: the DDP rendezvous cannot listen there ({error.strerror});"
                " unset MASTER_ADDR for a run on this machine, or set it to an address of it",
            ) from error
        listener.listen()
        return torch.distributed.TCPStore(
            address,
            listener.getsockname()[1],
            is_master=True,
            wait_for_workers=False,
            multi_tenant=True,
            timeout=datetime.timedelta(seconds=60),
            master_listen_fd=listener.detach(),  # the store closes it when it goes
            use_libuv=_LIBUV_SERVES_A_SOCKET,
        )


def run_config_launcher(
    strategy: DDPStrategy | ModelParallelStrategy,
    name: str,
    rank_config: Path,
    trusted_targets: list[str],
) -> "RunConfigLauncher":
    """The launcher of volt's DDP or FSDP strategy `name`, for the devices the Trainer gave it.
    On the CPU one line (rank 0's) says how many processes run over gloo."""
    assert strategy.cluster_environment is not None
    if strategy.root_device.type == "cpu":
        reason = "accelerator=cpu" if torch.cuda.is_available() else "no GPU visible"
        processes = strategy.num_nodes * strategy.num_processes
        rank_zero_info(f"{name} on the CPU ({reason}): {processes} processes over gloo")
    return RunConfigLauncher(
        strategy.cluster_environment,
        strategy.num_processes,
        strategy.num_nodes,
        rank_config,
        trusted_targets,
    )


class RunConfigLauncher(_SubprocessScriptLauncher):
    """Starts ranks 1..N-1 of this node from the run's config file, once per run."""

    def __init__(
        self,
        cluster_environment: ClusterEnvironment,
        num_processes: int,
        num_nodes: int,
        rank_config: Path,
        trusted_targets: list[str],
    ) -> None:
        super().__init__(cluster_environment, num_processes, num_nodes)
        self.rank_config = rank_config
        self.trusted_targets = trusted_targets
        self._observer: _RankObserver | None = None
        self._run_ended = threading.Event()
        self._store: torch.distributed.TCPStore | None = None
        self._environment_before = {k: os.environ.get(k) for k in _RENDEZVOUS_VARIABLES}

    @override
    def launch(
        self, function: Callable, *args: Any, trainer: pl.Trainer | None = None, **kwargs: Any
    ) -> Any:
        self.cluster_environment.validate_settings(
            num_devices=self.num_processes, num_nodes=self.num_nodes
        )
        # fit and test of one run share its ranks: they start with the first stage.
        if self._observer is None and not self.cluster_environment.creates_processes_externally:
            self._start_ranks()
        _set_num_threads_if_needed(num_processes=self.num_processes)
        return function(*args, **kwargs)

    def _start_ranks(self) -> None:
        if not self.rank_config.is_file():
            raise FileNotFoundError(
                f"DDP starts its ranks from the run's resolved config, but {self.rank_config} does"
                " not exist: volt.train.train writes it before building the Trainer; a Trainer"
                " built elsewhere must write it first (OmegaConf.save(cfg, path, resolve=True))."
            )
        environment = self.cluster_environment
        if "MASTER_PORT" not in os.environ and environment.node_rank() == 0:
            self._store = reserve_rendezvous_port(environment.main_address)
            os.environ["MASTER_PORT"] = str(self._store.port)
            if environment.main_port != self._store.port:
                raise RuntimeError(
                    f"{type(environment).__name__} chose port {environment.main_port} before"
                    f" volt reserved port {self._store.port}; set MASTER_PORT to choose one"
                )
        node_rank = environment.node_rank()
        # The ranks train the file only as rank 0 wrote it (volt.rank.read_run_config).
        digest = hashlib.sha256(self.rank_config.read_bytes()).hexdigest()
        # The ranks import what rank 0 imports: `python -m volt.rank` puts its working
        # directory first on sys.path where `python train.py` put the checkout.
        python_path = os.pathsep.join(
            filter(None, [str(PROJECT_ROOT), os.environ.get("PYTHONPATH")])
        )
        shared = {
            **os.environ,
            "PYTHONPATH": python_path,
            "MASTER_ADDR": environment.main_address,
            "MASTER_PORT": str(environment.main_port),
            "NODE_RANK": str(node_rank),
            "WORLD_SIZE": str(self.num_processes * self.num_nodes),
        }
        started = []
        for local_rank in range(1, self.num_processes):
            rank = node_rank * self.num_processes + local_rank
            command = [
                sys.executable,
                "-m",
                "volt.rank",
                str(self.rank_config),
                digest,
                str(rank),
                *self.trusted_targets,
            ]
            self.procs.append(
                subprocess.Popen(command, env={**shared, "LOCAL_RANK": str(local_rank)})
            )
            started.append(f"rank {rank} (pid {self.procs[-1].pid})")
        if started:
            log.info("Started %s from %s", ", ".join(started), self.rank_config)
        self._observer = _RankObserver(
            os.getpid(), self.procs, self._run_ended, self._describe_failure
        )
        self._observer.start()

    def wait_for_ranks(self) -> RankFailedError | None:
        """After rank 0 ended the run well: wait for the other ranks; say which failed, if any."""
        self._run_ended.set()
        # Close the process group first: every rank does so as its run ends, and a rank whose
        # peers keep theirs open can wait at exit in the NCCL teardown (seen on 2 x H200).
        self._release_rendezvous()
        for proc in self.procs:
            try:
                proc.wait(timeout=RANK_EXIT_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        failed = self._ranks_that_failed()
        return RankFailedError(*self._describe(failed)) if failed else None

    def stop_ranks(self) -> RankFailedError | None:
        """After rank 0's run raised: stop the other ranks; say which of them failed first, if any.

        A rank whose crash broke rank 0's collective may still be exiting: it gets a moment to
        finish, so that its own exit code, not the kill, tells what happened. The others wait on
        rank 0 in a collective, where only SIGKILL reaches them.
        """
        self._run_ended.set()
        deadline = time.monotonic() + CRASHED_RANK_EXIT_S
        for proc in self.procs:
            try:
                proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if self._observer is None:
            # One of the ranks this launcher did not start, about to exit on its error: closing
            # the process group would wait for rank 0 to close it too (NCCL's shutdown can be a
            # collective), and rank 0 may be waiting in a collective for this rank. A real CUDA
            # out-of-memory on rank 1 hung here for good (2 x H100, torch 2.11).
            return None
        self._release_rendezvous_within(RELEASE_AFTER_FAILURE_S)
        crashed = self._ranks_that_crashed()
        return RankFailedError(*self._describe(crashed)) if crashed else None

    def _ranks_that_crashed(self) -> dict[int, subprocess.Popen]:
        """The ranks that failed by themselves: not killed here, not stopped by a signal."""
        return {
            rank: proc
            for rank, proc in self._ranks_that_failed().items()
            if proc.returncode not in _STOPPED_NOT_FAILED
        }

    def _ranks_that_failed(self) -> dict[int, subprocess.Popen]:
        node_rank = self.cluster_environment.node_rank()
        return {
            node_rank * self.num_processes + local_rank: proc
            for local_rank, proc in enumerate(self.procs, start=1)
            if proc.returncode
        }

    def _describe(self, failed: dict[int, subprocess.Popen]) -> tuple[str, bool]:
        """What the failed ranks said (or their exit codes), and whether each failed with an
        error written for the user."""
        run_dir = self.rank_config.parent
        world = self.num_processes * self.num_nodes
        lines = []
        for rank, proc in failed.items():
            log_file = rank_log_file(run_dir, rank)
            said = said_by_failed_rank(log_file, rank)
            if said:
                lines.append(rank_failure(rank, world, said, log_file))
            else:
                lines.append(
                    f"rank {rank} of {world} exited with code {proc.returncode} (its error is"
                    f" above, and in {log_file})"
                )
        user_facing = all(proc.returncode == USER_ERROR_EXIT for proc in failed.values())
        return "; ".join(lines), user_facing

    def _describe_failure(self) -> tuple[str, bool]:
        for proc in self.procs:
            proc.poll()
        crashed = self._ranks_that_crashed()
        return self._describe(crashed) if crashed else ("a rank was killed", False)

    def _release_rendezvous_within(self, seconds: float) -> None:
        """Release as `_release_rendezvous` does, after a failure: the other ranks are gone, and
        NCCL's shutdown of a communicator whose peers died mid-collective may never return. It
        gets `seconds` in a thread of its own; the process group is left as it is after that
        (a sweep's next job in this process then fails to start its own, saying so)."""
        releasing = threading.Thread(
            target=self._release_rendezvous, name="volt-release-rendezvous", daemon=True
        )
        releasing.start()
        releasing.join(seconds)
        if releasing.is_alive():
            log.warning(
                "The process group of the failed run did not close within %.0f s (NCCL waits"
                " for ranks that are gone); leaving it open",
                seconds,
            )

    def _release_rendezvous(self) -> None:
        # The next job of a sweep runs in this process: it must find no process group and no
        # address or port of this one.
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
        self._store = None  # frees the port
        for key, value in self._environment_before.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


class _RankObserver(_ChildProcessObserver):
    """Lightning's watcher of the ranks it started, but rank 0 may end the run itself first, and
    when it cannot, the watcher ends it with the failed rank's words rather than a bare kill."""

    def __init__(
        self,
        main_pid: int,
        child_processes: list[subprocess.Popen],
        run_ended: threading.Event,
        describe_failure: Callable[[], tuple[str, bool]],
    ) -> None:
        super().__init__(main_pid, child_processes, sleep_period=1)
        self._run_ended = run_ended
        self._describe_failure = describe_failure

    @override
    def _run(self) -> bool:
        # Once rank 0 ends the run, it waits for or stops the ranks itself.
        return self._run_ended.is_set() or super()._run()

    @override
    def _terminate_all(self) -> None:
        for proc in self._child_processes:
            proc.send_signal(self._termination_signal)
        if self._run_ended.wait(RANK_ZERO_GRACE_S):
            return
        # Rank 0 waits in C (an NCCL collective, the rendezvous), where neither an exception
        # nor a signal handler reaches it: this thread ends the process, as Lightning's
        # watcher would with SIGKILL, but first says why and records the run as failed.
        said, user_facing = self._describe_failure()
        log.error(
            "%s; rank 0 still waited for it after %d s (in a collective or in the rendezvous)"
            " and is ended",
            said,
            RANK_ZERO_GRACE_S,
        )
        end_open_records("failed", error=f"RankFailedError: {said}")
        print(f"volt: error: {on_one_line(said)}", file=sys.stderr, flush=True)
        logging.shutdown()
        os._exit(USER_ERROR_EXIT if user_facing else 1)


@contextmanager
def ranks_end_with_run(trainer: pl.Trainer) -> Iterator[None]:
    """The ranks `trainer` starts inside this block end with it; see the module docstring."""
    launcher = trainer.strategy.launcher
    if not isinstance(launcher, RunConfigLauncher):
        yield
        return
    try:
        yield
    except (VerdictOfAllRanksError, TrainingOutOfMemoryError):
        # Every rank raised it too (a pooled verdict), or rank 0's own out-of-memory, which says
        # as much as another rank's: rank 0's own message is the run's.
        launcher.stop_ranks()
        raise
    except Exception as error:
        crashed = launcher.stop_ranks()
        if crashed:
            raise crashed from error
        raise
    except BaseException:  # Ctrl-C, sys.exit: every rank got or caused it; no one to blame
        launcher.stop_ranks()
        raise
    failed = launcher.wait_for_ranks()
    if failed:
        raise failed
