"""`python -m volt.rank CONFIG SHA256 RANK [TRUSTED ...]`: one extra rank of a DDP run.

The launcher in `volt.strategies.ddp` starts it with Lightning's variables set (LOCAL_RANK,
NODE_RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT). CONFIG is the run's resolved config, so this
process trains exactly what rank 0 trains, with the same `volt.train.train`. No Hydra runs here:
no run directory of its own, and nothing written but `<run dir>/train_rank<RANK>.log`.
"""

import hashlib
import logging
import os
import sys
from pathlib import Path
from typing import NoReturn

import torch
from hydra.errors import InstantiationException
from omegaconf import DictConfig, OmegaConf

from volt.callbacks.finite_guard import NonFiniteLossError
from volt.config.targets import check_stored_config
from volt.console import exit_on_config_error, one_line
from volt.data.downloads import DataNotFoundError
from volt.errors import (
    ConfigError,
    TrainingInterrupted,
    TrainingOutOfMemoryError,
    VerdictOfAllRanksError,
)
from volt.strategies import stuck_rank_zero
from volt.strategies.launcher import (
    RANK_ZERO_GRACE_S,
    USER_ERROR_EXIT,
    rank_failed,
    rank_failure,
    rank_log_file,
)
from volt.training import train

log = logging.getLogger("volt")


def configure_logging(log_file: Path, rank: int) -> None:
    """Everything to the rank's own file; warnings and errors also to stderr, marked with the rank.

    Rank 0 already shows the run's progress on the console; a copy per rank would only repeat it.
    """
    to_file = logging.FileHandler(log_file)
    to_file.setFormatter(logging.Formatter("%(asctime)s %(levelname)-7s %(name)s: %(message)s"))
    to_console = logging.StreamHandler(sys.stderr)
    to_console.setLevel(logging.WARNING)
    to_console.setFormatter(logging.Formatter(f"[rank {rank}] %(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=logging.INFO, handlers=[to_file, to_console], force=True)


def read_run_config(config_file: Path, digest: str, trusted_targets: list[str]) -> DictConfig:
    """The run's resolved config as rank 0 wrote it for this run: its SHA-256 must be `digest`,
    which rank 0 computed as it started this process, so a file left in a run directory by
    someone else (a handed-over run being resumed) is never what a rank trains. Then checked as
    data all the same, unresolved (`volt.config.targets`): an interpolation is refused before a
    resolver runs.

    `trusted_targets` is rank 0's list, from this process's command line; the file's own list
    does not count (a file must not widen its own allow-list)."""
    text = config_file.read_bytes()
    if hashlib.sha256(text).hexdigest() != digest:
        raise ConfigError(
            f"{config_file} is not the config rank 0 started this rank with (its SHA-256"
            " differs): it changed after the run started; start the run again"
        )
    cfg = OmegaConf.create(text.decode())
    if not isinstance(cfg, DictConfig):
        raise ConfigError(f"{config_file} holds a {type(cfg).__name__}, not a run's config")
    stored = OmegaConf.to_container(cfg, resolve=False)
    check_stored_config(stored, trusted_targets)
    return cfg


def fail(
    run_dir: Path, rank: int, world: int, said: str, code: int, together: bool = False
) -> NoReturn:
    """Exit with `code`, leaving behind a process that ends the run if rank 0 cannot: under NCCL
    rank 0 may wait for this rank in C for good, where its own watcher of the ranks never runs
    (volt.strategies.stuck_rank_zero). It waits longer than that watcher would. Not for an error
    every rank raised `together` (a pooled verdict): rank 0 raised it too."""
    line = rank_failure(rank, world, said, rank_log_file(run_dir, rank))
    if not together:
        stuck_rank_zero.start(os.getppid(), run_dir / "run.json", RANK_ZERO_GRACE_S + 10, line)
    logging.shutdown()
    os._exit(code)


def main() -> None:
    config_file, digest, rank = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
    trusted = sys.argv[4:]
    # Set by volt's launcher (read now: Lightning's teardown removes it); 0 where unknown.
    world = int(os.environ.get("WORLD_SIZE", "0"))
    try:
        cfg = read_run_config(config_file, digest, trusted)
    except ConfigError as error:
        exit_on_config_error(error)
    configure_logging(rank_log_file(config_file.parent, rank), rank)
    log.info("Rank %d trains %s", rank, config_file)
    try:
        train(cfg)
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
    except TrainingInterrupted as stop:  # saved by rank 0; leave as quickly as on failure
        logging.shutdown()
        os._exit(int(stop.code or 1))
    except (
        ConfigError,
        DataNotFoundError,
        InstantiationException,
        TrainingOutOfMemoryError,
        NonFiniteLossError,
    ) as error:
        # Written for the user, as train.py reports them: one line, which rank 0 repeats.
        log.error("%s%s", rank_failed(rank), one_line(error))
        together = isinstance(error, VerdictOfAllRanksError)
        fail(config_file.parent, rank, world, one_line(error), USER_ERROR_EXIT, together)
    except Exception as error:
        # Logged rather than left to the interpreter so that the rank's own log holds it too. Then
        # out at once: rank 0 reads this exit code and line to tell what broke the run, and a
        # failed rank has nothing to save, so the interpreter's slow teardown would only delay
        # the report.
        log.exception("%s%s", rank_failed(rank), one_line(error))
        fail(config_file.parent, rank, world, one_line(error), 1)
    # The run is over and this rank writes nothing else: skip the interpreter's teardown, where
    # CUDA and NCCL finalisers can stall long enough for rank 0 to count the rank as hung.
    logging.shutdown()
    os._exit(0)


if __name__ == "__main__":
    main()
