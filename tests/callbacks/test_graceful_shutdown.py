"""SIGTERM and Ctrl+C while training: the step finishes, last.ckpt is saved, the exit status is
128 + the signal's number. Real signals to real training processes, and to this one."""

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.callbacks import Callback
from torch import Tensor, nn
from torch.utils.data import DataLoader, TensorDataset

from volt.callbacks.graceful_shutdown import FIRST_STEP, GracefulShutdown
from volt.config import PROJECT_ROOT
from volt.errors import TrainingInterrupted

pytestmark = pytest.mark.signals_itself  # SIGTERM to this process, in-process fits

# Trains until told to stop (or max_steps), printing each step's number as it starts it.
SCRIPT = """
import sys, time
import lightning.pytorch as pl
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from volt.callbacks.graceful_shutdown import GracefulShutdown
from volt.checkpointing import AtomicCheckpointIO

checkpoint_dir, max_steps, resume_from = sys.argv[1], int(sys.argv[2]), sys.argv[3:]

class Slow(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = nn.Linear(4, 1)

    def training_step(self, batch, batch_idx):
        print(f"step {self.global_step}", flush=True)
        time.sleep(0.01)
        x, y = batch
        return nn.functional.mse_loss(self.layer(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)

data = DataLoader(TensorDataset(torch.randn(64, 4), torch.randn(64, 1)), batch_size=8)
trainer = pl.Trainer(
    max_steps=max_steps, accelerator="cpu", logger=False, enable_progress_bar=False,
    enable_model_summary=False, enable_checkpointing=False,
    callbacks=[GracefulShutdown(checkpoint_dir)], plugins=[AtomicCheckpointIO()],
)
trainer.fit(Slow(), data, ckpt_path=resume_from[0] if resume_from else None)
"""


@pytest.fixture
def script(tmp_path: Path) -> Path:
    path = tmp_path / "train_slowly.py"
    path.write_text(textwrap.dedent(SCRIPT))
    return path


def steps_printed(process: subprocess.Popen[str]) -> Iterator[int]:
    assert process.stdout is not None
    for line in process.stdout:
        if line.startswith("step "):
            yield int(line.split()[1])


def test_sigterm_and_sigint_exit_with_128_plus_signal_after_saving(
    script: Path, tmp_path: Path
) -> None:
    for signum in (signal.SIGTERM, signal.SIGINT):
        checkpoints = tmp_path / signum.name
        process = subprocess.Popen(
            [sys.executable, script, checkpoints, "100000"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        seen = next(step for step in steps_printed(process) if step >= 3)
        process.send_signal(signum)
        _, stderr = process.communicate(timeout=60)

        assert process.returncode == 128 + signum, stderr
        saved = torch.load(checkpoints / "last.ckpt", weights_only=True)
        # The step under way when the signal came ran to its end, optimizer step included.
        assert saved["global_step"] > seen
        assert f"Stopped on {signum.name} at global step {saved['global_step']}" in stderr


class SignalAt(Callback):
    """Sends `signum` to this very process when `stage` reaches batch `batch`."""

    def __init__(self, signum: signal.Signals, stage: str, batch: int) -> None:
        self.signum, self.stage, self.batch = signum, stage, batch

    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: object, batch_idx: int
    ) -> None:
        self._maybe_signal("train", batch_idx)

    def on_validation_batch_start(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        batch: object,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        self._maybe_signal("sanity check" if trainer.sanity_checking else "validation", batch_idx)

    def _maybe_signal(self, stage: str, batch: int) -> None:
        if (stage, batch) == (self.stage, self.batch):
            os.kill(os.getpid(), self.signum)


class Regression(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(4, 1)
        self.steps_run: list[int] = []

    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        self.steps_run.append(self.global_step)
        x, y = batch
        return nn.functional.mse_loss(self.layer(x), y)

    def validation_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
        self.training_step(batch, batch_idx)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def eight_batches() -> DataLoader:
    return DataLoader(TensorDataset(torch.randn(64, 4), torch.randn(64, 1)), batch_size=8)


def quiet_trainer(callbacks: list[Callback], **trainer_args: object) -> pl.Trainer:
    return pl.Trainer(
        accelerator="cpu",
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        callbacks=callbacks,
        **trainer_args,  # type: ignore[arg-type]
    )


def fit_until_signalled(tmp_path: Path, signal_at: SignalAt, **trainer_args: object) -> int:
    """Fit with the signal sent from inside; returns the saved checkpoint's global step."""
    trainer = quiet_trainer([GracefulShutdown(tmp_path), signal_at], **trainer_args)
    handlers_before = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    with pytest.raises(TrainingInterrupted) as stopped:
        trainer.fit(Regression(), eight_batches(), eight_batches())

    assert stopped.value.code == 128 + signal_at.signum
    assert str(stopped.value) == (
        f"stopped on {signal_at.signum.name} while training; saved {tmp_path}/last.ckpt"
    )
    assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)) == handlers_before
    return torch.load(tmp_path / "last.ckpt", weights_only=True)["global_step"]


# The epoch's remaining batches are not skipped on resume: the test's loader keeps no position.
@pytest.mark.filterwarnings("ignore:You're resuming from a checkpoint that ended before the epoch")
def test_training_resumes_from_the_checkpoint_at_the_next_step(tmp_path: Path) -> None:
    stopped_at = fit_until_signalled(tmp_path, SignalAt(signal.SIGTERM, "train", 2), max_steps=20)
    assert stopped_at == 3

    model = Regression()
    trainer = quiet_trainer([], max_steps=stopped_at + 2, num_sanity_val_steps=0)
    trainer.fit(model, eight_batches(), eight_batches(), ckpt_path=tmp_path / "last.ckpt")
    assert model.steps_run == [stopped_at, stopped_at + 1]


def test_a_signal_inside_an_accumulation_window_waits_for_its_optimizer_step(
    tmp_path: Path,
) -> None:
    # Batches 4..7 make step 1: a signal at batch 5 lets 6 and 7 run, then step 1 is saved.
    signal_at = SignalAt(signal.SIGTERM, "train", 5)
    assert fit_until_signalled(tmp_path, signal_at, max_epochs=3, accumulate_grad_batches=4) == 2


def test_a_signal_during_validation_stops_at_the_next_training_step(tmp_path: Path) -> None:
    # Validation every 4 training batches; the signal at its second batch lets it finish.
    signal_at = SignalAt(signal.SIGINT, "validation", 1)
    assert fit_until_signalled(tmp_path, signal_at, max_epochs=3, val_check_interval=4) == 5


@pytest.mark.parametrize(
    "signal_at",
    [SignalAt(signal.SIGTERM, "sanity check", 0), SignalAt(signal.SIGINT, "train", 0)],
    ids=["sanity-check", "first-batch"],
)
def test_a_signal_before_the_first_step_stops_at_once_saving_nothing(
    signal_at: SignalAt, tmp_path: Path
) -> None:
    # Nothing is trained yet, and the first step may compile for minutes: waiting for it would
    # outlast a scheduler's notice. (Lightning's own SIGTERM handler would exit 0 here.)
    trainer = quiet_trainer([GracefulShutdown(tmp_path), signal_at], max_epochs=1)
    handlers_before = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    with pytest.raises(TrainingInterrupted) as stopped:
        trainer.fit(Regression(), eight_batches(), eight_batches())
    assert stopped.value.code == 128 + signal_at.signum
    assert stopped.value.checkpoint is None
    assert stopped.value.where == FIRST_STEP
    assert trainer.global_step == 0
    assert not (tmp_path / "last.ckpt").exists()
    assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)) == handlers_before


def test_a_signal_during_the_last_validation_still_saves_and_exits(tmp_path: Path) -> None:
    signal_at = SignalAt(signal.SIGTERM, "validation", 1)
    assert fit_until_signalled(tmp_path, signal_at, max_epochs=1) == 8


class SignalledWhileLoadingData(Regression):
    """Sends SIGTERM to this process from `train_dataloader`, which Lightning calls after its own
    handlers are in and, without a sanity check, before GracefulShutdown installs its own."""

    def train_dataloader(self) -> DataLoader:
        os.kill(os.getpid(), signal.SIGTERM)
        return eight_batches()


def test_a_sigterm_caught_by_lightning_before_the_fit_is_taken_over(tmp_path: Path) -> None:
    # Lightning would stop this process alone with its own exception, exit status 0.
    trainer = quiet_trainer([GracefulShutdown(tmp_path)], max_epochs=1, num_sanity_val_steps=0)
    with pytest.raises(TrainingInterrupted) as stopped:
        trainer.fit(SignalledWhileLoadingData())
    assert stopped.value.code == 143
    assert stopped.value.where == FIRST_STEP
    assert trainer.global_step == 0
    assert not (tmp_path / "last.ckpt").exists()


def start_volt(args: list[str], outputs: Path) -> subprocess.Popen[bytes]:
    """`python train.py ...` as run_volt starts it, but left running so it can be signalled.
    Its output goes to `outputs/console.txt`: a pipe nobody reads could fill and stall it."""
    outputs.mkdir()
    with open(outputs / "console.txt", "wb") as console:
        return subprocess.Popen(
            [sys.executable, "train.py", *args, f"paths.outputs_dir={outputs}"],
            cwd=PROJECT_ROOT,
            stdout=console,
            stderr=subprocess.STDOUT,
        )


def wait_for(pattern: str, outputs: Path, process: subprocess.Popen[bytes]) -> Path:
    deadline = time.monotonic() + 120
    while not (found := list(outputs.glob(pattern))):
        assert process.poll() is None, (outputs / "console.txt").read_text()
        assert time.monotonic() < deadline, f"no {pattern} after 120 s"
        time.sleep(0.1)
    return found[0]


# Both are `make test-slow`'s (three fresh interpreters). The default suite's tests below make
# the same checks but the stored max_epochs: one signals a single process's group (its data
# workers too), the other a DDP run's rank 1, which the ranks agree on as on rank 0's.
@pytest.mark.slow
@pytest.mark.parametrize("trainer", ["default", "ddp"])
def test_volt_saves_and_exits_143_on_sigterm(trainer: str, fast: list[str], tmp_path: Path) -> None:
    outputs = tmp_path / "volt"
    overrides = [o for o in fast if not o.startswith("trainer.max_epochs=")]
    process = start_volt([*overrides, f"trainer={trainer}", "trainer.max_epochs=1000"], outputs)
    # last.ckpt is first written at the end of epoch 0; training is then well under way.
    last = wait_for("train/runs/*/checkpoints/last.ckpt", outputs, process)
    before = torch.load(last, weights_only=True)["global_step"]  # written whole: atomic rename
    # Under DDP to rank 0 only: rank 1 learns of it from rank 0 and stops at the same step.
    process.send_signal(signal.SIGTERM)
    process.wait(timeout=120)

    assert process.returncode == 143, (outputs / "console.txt").read_text()
    saved = torch.load(last, weights_only=True)
    assert saved["global_step"] > before
    assert saved["volt_config"]["trainer"]["max_epochs"] == 1000
    if trainer == "ddp":  # the ranks agree to stop at steps that are multiples of 10 (the default)
        assert saved["global_step"] % 10 == 0


def command_lines() -> Iterator[tuple[int, bytes]]:
    """(pid, command line) of this machine's processes; those that end meanwhile are skipped."""
    for path in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            yield int(path.parent.name), path.read_bytes()
        except OSError:
            continue


def test_a_signal_to_another_ddp_rank_stops_every_rank_and_saves(
    fast: list[str], tmp_path: Path
) -> None:
    outputs = tmp_path / "volt"
    overrides = [o for o in fast if not o.startswith("trainer.max_epochs=")]
    process = start_volt([*overrides, "trainer=ddp", "trainer.max_epochs=1000"], outputs)
    last = wait_for("train/runs/*/checkpoints/last.ckpt", outputs, process)
    before = torch.load(last, weights_only=True)["global_step"]
    (rank1,) = [
        pid
        for pid, cmdline in command_lines()
        if b"volt.rank" in cmdline and str(outputs).encode() in cmdline
    ]
    os.kill(rank1, signal.SIGTERM)  # rank 0 learns of it through the queued all-reduce
    process.wait(timeout=120)

    console = (outputs / "console.txt").read_text()
    assert process.returncode == 143, console
    saved_at = torch.load(last, weights_only=True)["global_step"]
    assert saved_at > before
    assert saved_at % 10 == 0  # a step at which the ranks agree (trainer.log_every_n_steps=10)
    assert f"Stopped on SIGTERM at global step {saved_at}" in console


class RecordLightningSigtermCheck(Callback):
    """Whether Lightning's per-step SIGTERM broadcast is switched off, seen during training."""

    def __init__(self) -> None:
        self.switched_off: list[bool] = []

    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: object, batch_idx: int
    ) -> None:
        loop = trainer.fit_loop.epoch_loop
        self.switched_off.append("_broadcast_sigterm_tensor" in vars(loop))


def test_agree_every_n_steps_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match=r"agree_every_n_steps=0: must be 1 or more"):
        GracefulShutdown("unused", agree_every_n_steps=0)


def test_lightning_sigterm_broadcast_is_off_during_the_fit_only() -> None:
    record = RecordLightningSigtermCheck()
    trainer = quiet_trainer([GracefulShutdown("unused"), record], max_steps=3)
    trainer.fit(Regression(), eight_batches(), eight_batches())
    assert record.switched_off == [True, True, True]
    assert "_broadcast_sigterm_tensor" not in vars(trainer.fit_loop.epoch_loop)


def test_a_sigterm_to_the_whole_process_group_spares_the_data_workers(
    fast: list[str], tmp_path: Path
) -> None:
    # SLURM (pre-emption, scancel), `timeout` and Ctrl+C in a terminal signal every process of
    # the job's group, the DataLoader workers too; torch's workers die of it by themselves.
    outputs = tmp_path / "volt"
    outputs.mkdir()
    overrides = [o for o in fast if not o.startswith("trainer.max_epochs=")]
    overrides += ["trainer.max_epochs=1000", "data.on_device=false", "data.num_workers=2"]
    overrides += ["data.persistent_workers=true", f"paths.outputs_dir={outputs}"]
    with open(outputs / "console.txt", "wb") as console:
        process = subprocess.Popen(
            [sys.executable, "train.py", *overrides],
            cwd=PROJECT_ROOT,
            stdout=console,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # a group of its own, to signal as a scheduler does
        )
    try:
        last = wait_for("train/runs/*/checkpoints/last.ckpt", outputs, process)
        before = torch.load(last, weights_only=True)["global_step"]
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout=120)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)

    console_text = (outputs / "console.txt").read_text()
    assert process.returncode == 143, console_text
    assert "killed by signal" not in console_text
    assert torch.load(last, weights_only=True)["global_step"] > before
