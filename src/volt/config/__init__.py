"""Where volt's configs live, and the resolvers they use (registered on import)."""

import datetime
import secrets
from functools import cache
from pathlib import Path

from omegaconf import OmegaConf

# src/volt/config/__init__.py -> the project root holding conf/. The package is installed
# editable (or put on PYTHONPATH), so this is the clone the user works in.
PROJECT_ROOT = Path(__file__).resolve().parents[3]
CONF_DIR = PROJECT_ROOT / "conf"


@cache
def run_stamp() -> str:
    """`2026-11-22_01-49-46_3fa9c1`: start time plus a per-process random tag.

    Cached so every job of one multirun, and every re-resolution of the same config, gets the
    same value; the random tag keeps two runs started in the same second apart.
    """
    now = datetime.datetime.now().strftime("%Y-%m-%d_%H-%M-%S")
    return f"{now}_{secrets.token_hex(3)}"


OmegaConf.register_new_resolver("volt.project_root", lambda: str(PROJECT_ROOT), replace=True)
OmegaConf.register_new_resolver("volt.stamp", run_stamp, replace=True)
