"""`python train.py name=NAME trainer.max_steps=N ...` as the resume tests run it: quiet, no
logger, no test; trainer.max_steps may change between attempts of one named run (conf/hydra)."""

import subprocess
import sys
from pathlib import Path

from volt.config import PROJECT_ROOT


def steps_overrides(name: str, steps: int, *extra: str) -> list[str]:
    """The overrides of such a run, for conftest's run_volt_here as for train_steps."""
    return [
        f"name={name}",
        f"trainer.max_steps={steps}",
        *extra,
        "callbacks.progress_bar=null",
        "callbacks.model_summary=null",
        "logger=none",
        "test=false",
    ]


def train_steps(
    outputs: Path, name: str, steps: int, *extra: str, timeout: float = 240
) -> subprocess.CompletedProcess[str]:
    command = [
        sys.executable,
        "train.py",
        *steps_overrides(name, steps, *extra),
        f"paths.outputs_dir={outputs}",
    ]
    return subprocess.run(
        command, cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=timeout, check=False
    )
