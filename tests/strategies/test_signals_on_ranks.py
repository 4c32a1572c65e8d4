"""SIGTERM and Ctrl+C at every moment of a DDP or FSDP run end every rank within 30 s, exit
128 + the signal, with one line on rank 0 saying where the run stopped; the same command then
resumes. Over two gloo ranks on the CPU (slow), and over two GPUs (gpu)."""

import json
import re
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from tests.strategies.test_ddp import PROBES, QUICK, processes_mentioning

Run = Callable[..., subprocess.CompletedProcess[str]]

# What rank 0's log says for each moment: before the first training step, and in test, the run
# stops where it is (volt.runs.stop_signals, GracefulShutdown's first-step rule); once a step
# was trained, after the step, with last.ckpt saved (GracefulShutdown).
SAYS = {
    "setup": r"Stopped on (SIGTERM|SIGINT) while starting the fit",
    "training": r"Stopped on (SIGTERM|SIGINT) at global step \d+; saved .*last\.ckpt",
    "validation": r"Stopped on (SIGTERM|SIGINT) at global step \d+; saved .*last\.ckpt",
    "checkpoint": r"Stopped on (SIGTERM|SIGINT) at global step \d+; saved .*last\.ckpt",
    "test": r"Stopped on (SIGTERM|SIGINT) while testing",
}


def stop_and_resume(
    run_volt: Run,
    tmp_path: Path,
    strategy: str,
    moment: str,
    whom: str,
    signum: int,
    extra: list[str],
    resume: bool = True,
) -> None:
    name = signal.Signals(signum).name
    at = f"moment:{moment},whom:{whom},signal:{name}"
    probe = f"+callbacks.signal_at={{_target_:{PROBES}.SignalAt,{at}}}"
    sharding = ["trainer.strategy.wrap=[]"] if strategy == "fsdp" else []  # the digits MLP
    command = [*QUICK, f"trainer={strategy}", *sharding, "name=signalled", probe, *extra]
    stopped = run_volt(command)
    ended_at = time.time()
    assert stopped.returncode == 128 + signum, stopped.stderr[-3000:]
    run_dir = tmp_path / "outputs" / "train" / "runs" / "signalled"
    signalled_at = float((run_dir / "signalled_at.txt").read_text())
    assert ended_at - signalled_at < 30
    said = re.findall(SAYS[moment], (run_dir / "train.log").read_text())
    assert len(said) == 1, (run_dir / "train.log").read_text()[-3000:]
    assert "Traceback" not in stopped.stderr
    assert json.loads((run_dir / "run.json").read_text())["status"] == "interrupted"
    assert not processes_mentioning(str(tmp_path))
    saved = (run_dir / "checkpoints" / "last.ckpt").exists()  # a folder when sharded
    assert saved == (moment not in ("setup",))

    if not resume:
        return
    resumed = run_volt(command)  # the probe sends nothing twice
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert json.loads((run_dir / "metrics.json").read_text())["status"] == "completed"
    if saved and moment != "test":
        assert "Restoring states from the checkpoint" in (run_dir / "train.log").read_text()


@pytest.mark.slow  # ten runs of two gloo ranks: about 5 minutes on 2 cores
@pytest.mark.parametrize(
    ("strategy", "moment", "whom", "signum"),
    [
        ("ddp", "setup", "all", signal.SIGTERM),
        ("ddp", "training", "rank0", signal.SIGTERM),
        ("ddp", "validation", "all", signal.SIGINT),
        ("fsdp", "checkpoint", "rank0", signal.SIGTERM),
        ("fsdp", "test", "all", signal.SIGTERM),
    ],
)
def test_a_signal_at_any_moment_ends_every_rank_and_the_run_resumes(
    strategy: str, moment: str, whom: str, signum: int, run_volt: Run, tmp_path: Path
) -> None:
    stop_and_resume(run_volt, tmp_path, strategy, moment, whom, signum, [])


two_gpus = pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA devices")


@pytest.mark.gpu
@two_gpus
@pytest.mark.parametrize(
    ("strategy", "moment", "whom"),
    [("ddp", "setup", "all"), ("ddp", "training", "rank0"), ("fsdp", "validation", "all")],
)
def test_a_signal_on_two_gpus_ends_every_rank_and_the_run_resumes(
    strategy: str, moment: str, whom: str, run_volt: Run, tmp_path: Path
) -> None:
    gpus = ["trainer.accelerator=gpu", "trainer.devices=2", "precision=bf16-mixed"]
    # Resumed once (the CPU suite resumes after every moment): each run is a minute of the suite.
    resume = moment == "training"
    stop_and_resume(run_volt, tmp_path, strategy, moment, whom, signal.SIGTERM, gpus, resume)
