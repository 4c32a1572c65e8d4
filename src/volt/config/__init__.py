"""Where volt's configs live, and the resolvers they use (registered on import)."""

import datetime
import inspect
import os
import secrets
import sys
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Any

from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import OmegaConf

from volt.config.help import config_groups
from volt.config.torchrun import launched_by_torchrun, stamp_of_rank_zero

# Processes a volt process starts (DDP ranks, submitit jobs) read the project from here, so they
# use the conf/ and outputs/ of the process that started them whatever their own script and
# working directory are. Set below once the project is known; a user may set it too.
ROOT_VARIABLE = "VOLT_PROJECT_ROOT"
# The package lives in <project>/src/volt when installed editable from <project>.
PACKAGE_DIR = Path(__file__).resolve().parents[1]


def _holds_conf(folder: Path) -> bool:
    return (folder / "conf").is_dir()


def find_project_root() -> tuple[Path, str]:
    """The project (the folder holding conf/; outputs/ goes beside it) and how it was found.

    In this order: the folder of the script being run (`python <clone>/train.py`: the clone you
    run is the clone you use, whichever clone the package was installed from); $VOLT_PROJECT_ROOT;
    the working directory (`python -m volt.eval`, `volt-train` started in a clone); the project the
    package was installed from. `@hydra.main` reads CONF_DIR at import, so this runs at import.
    """
    script = Path(sys.argv[0]) if sys.argv else None
    if script is not None and script.is_file() and _holds_conf(script.resolve().parent):
        return script.resolve().parent, "script"
    if os.environ.get(ROOT_VARIABLE):
        return Path(os.environ[ROOT_VARIABLE]).resolve(), ROOT_VARIABLE
    if _holds_conf(Path.cwd()):
        return Path.cwd().resolve(), "working directory"
    return PACKAGE_DIR.parents[1], "package"


def warn_if_package_elsewhere(root: Path, found_by: str) -> None:
    """One line on stderr when the volt code that runs is not the code in this project: with one
    venv and two clones, edits under the clone you run would silently not count."""
    if found_by in (ROOT_VARIABLE, "package") or root / "src" / "volt" == PACKAGE_DIR:
        return  # the process that set the variable has warned already
    print(
        f"volt: warning: conf/ and outputs/ come from {root} ({found_by}), but the volt package"
        f" is imported from {PACKAGE_DIR}, not {root / 'src' / 'volt'}: code changes in this"
        f" project are not used; run `pip install -e {root}` to use them",
        file=sys.stderr,
    )


PROJECT_ROOT, _FOUND_BY = find_project_root()
CONF_DIR = PROJECT_ROOT / "conf"
warn_if_package_elsewhere(PROJECT_ROOT, _FOUND_BY)
os.environ[ROOT_VARIABLE] = str(PROJECT_ROOT)


@cache
def run_stamp() -> str:
    """`2026-11-22_01-49-46_3fa9c1`: start time plus a per-process random tag.

    Cached so every job of one multirun, and every re-resolution of the same config, gets the
    same value; the random tag keeps two runs started in the same second apart.
    """
    now = datetime.datetime.now().strftime("%Y-%m-%d_%H-%M-%S")
    stamp = f"{now}_{secrets.token_hex(3)}"
    # Under torchrun every rank runs Hydra: all take rank 0's stamp and so share one run directory.
    return stamp_of_rank_zero(stamp) if launched_by_torchrun() else stamp


def devices_per_node(without_gpu: int) -> int:
    """torchrun's processes per node where it started this one, else every visible GPU, else
    `without_gpu` (processes or devices on the CPU)."""
    if "LOCAL_WORLD_SIZE" in os.environ:
        return int(os.environ["LOCAL_WORLD_SIZE"])
    import torch

    return torch.cuda.device_count() or without_gpu


def rank_log_suffix() -> str:
    """'_rank3' in rank 3 of a run whose ranks each run Hydra (torchrun, srun); '' in rank 0."""
    rank = int(os.environ.get("RANK", os.environ.get("SLURM_PROCID", "0")))
    return f"_rank{rank}" if rank else ""


# Where volt.config.composition leaves the keys a command line's sweep varies, for job_dirname:
# internal, set by every volt entry point (a value of the user's own is replaced). Hydra resolves a
# job's directory in the process that runs the job, which inherits the variable: the launcher's
# own process or thread, volt's parallel launcher, submitit's local executor, and a SLURM job
# (sbatch passes the submitting environment on by default). A job started without it
# (`sbatch --export=NONE`) is named by all its overrides, as Hydra names them.
SWEPT_KEYS = "VOLT_SWEPT_KEYS"


def job_dirname(overrides: Any, every: str) -> str:
    """A sweep job's directory name: its overrides of the keys the sweep varies (`lr=0.01`), not
    those every job shares; `every` (Hydra's override_dirname, all but the run-neutral ones)
    where the sweep varies none on the command line (a search's sweeper names its own)."""
    swept = set(filter(None, os.environ.get(SWEPT_KEYS, "").split(",")))
    varied = sorted(str(o) for o in overrides if str(o).lstrip("+~").partition("=")[0] in swept)
    return ",".join(varied) or every


# OmegaConf 2.4 deprecates register_new_resolver (a multi-line UserWarning at every call) in
# favour of register_resolver, a name that 2.3 still gives to its legacy API (string arguments
# only, no `replace` or `use_cache`, deprecated there): so the choice goes by what the function
# takes, not by its name or the version string. Seen: 2.3.1 (old API), 2.4.0 and 2.4.1rc1 (new).
# Delete the register_new_resolver branch once volt requires omegaconf>=2.4 (hydra-core 1.4 does).
if "use_cache" in inspect.signature(OmegaConf.register_resolver).parameters:
    _register: Callable[..., None] = OmegaConf.register_resolver
else:
    _register = OmegaConf.register_new_resolver


def register_resolver(name: str, resolver: Callable[..., Any], *, use_cache: bool = False) -> None:
    """The one place volt registers an OmegaConf resolver; one of the same name is replaced, so
    importing this module again is harmless."""
    _register(name, resolver, replace=True, use_cache=use_cache)


register_resolver("volt.project_root", lambda: str(PROJECT_ROOT))
# A named run's directory is its name; an unnamed one's is the stamp. use_cache: the value is
# kept in the config, so a sweep job that Hydra's submitit launcher runs in another process (a
# SLURM task) resolves the sweep directory its launcher made.
register_resolver("volt.run_id", lambda name: str(name) if name else run_stamp(), use_cache=True)
register_resolver("volt.devices_per_node", devices_per_node)
register_resolver("volt.rank_log_suffix", rank_log_suffix)
# `val/acc` -> `val_acc`: a metric's name inside a file name (the best checkpoint's).
register_resolver("volt.slug", lambda name: str(name).replace("/", "_"))
# A sweep job's directory name: conf/hydra/default.yaml.
register_resolver("volt.job_dirname", job_dirname)
# --help's groups and their options: conf/hydra/default.yaml.
register_resolver("volt.config_groups", config_groups)
# task.mode (max|min) -> an Optuna study direction.
register_resolver("volt.direction", lambda mode: {"max": "maximize", "min": "minimize"}[mode])


def in_multirun() -> bool:
    return HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN
