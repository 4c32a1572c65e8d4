"""A resumed checkpoint's callback states may name files inside the run's checkpoint folder only
(volt.callbacks.restored_paths): a state naming `local:///some/folder` made Lightning 2.6.6 delete
that folder at the next save. The control reproduces that defect with Lightning alone."""

import json
import logging
from pathlib import Path
from subprocess import CompletedProcess

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from torch.utils.data import DataLoader, TensorDataset

from tests.in_process import RunHere
from tests.named_runs import steps_overrides
from tests.tiny_regression import TinyRegression
from volt.callbacks.restored_paths import RestoredPathsCheck
from volt.checkpointing import AtomicCheckpointIO


def loader() -> DataLoader:
    x = torch.randn(16, 4, generator=torch.Generator().manual_seed(0))
    return DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=4)


def fit(folder: Path, epochs: int, callbacks: list[Callback], ckpt_path: Path | None) -> None:
    trainer = pl.Trainer(
        max_epochs=epochs,
        callbacks=[
            ModelCheckpoint(dirpath=folder),
            *callbacks,
        ],  # keeps the newest: removes the last
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        accelerator="cpu",
    )
    trainer.fit(TinyRegression(), train_dataloaders=loader(), ckpt_path=ckpt_path)


def dropped(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "volt.callbacks.restored_paths"]


def crafted_resume(tmp_path: Path) -> tuple[Path, Path, Path]:
    """A run's checkpoint whose ModelCheckpoint state names a victim folder by a `local://` URL
    (and a plain absolute path outside the run): (checkpoint folder, checkpoint, victim)."""
    folder = tmp_path / "run" / "checkpoints"
    fit(folder, 1, [], None)
    (checkpoint_path,) = folder.glob("*.ckpt")
    victim = tmp_path / "victim"
    (victim / "keep").mkdir(parents=True)
    (victim / "keep" / "work.txt").write_text("a user's files")
    checkpoint = torch.load(checkpoint_path, weights_only=True)
    (key,) = [k for k in checkpoint["callbacks"] if k.startswith("ModelCheckpoint")]
    state = checkpoint["callbacks"][key]
    state["best_model_path"] = f"local://{victim}"
    state["best_k_models"] = {f"local://{victim}": torch.tensor(1.0)}
    torch.save(checkpoint, checkpoint_path)
    return folder, checkpoint_path, victim


def test_lightning_alone_deletes_the_folder_a_resumed_state_names(tmp_path: Path) -> None:
    """The control, and the defect's reproduction: with Lightning's own ModelCheckpoint and
    TorchCheckpointIO, resuming from the crafted file removes the victim folder recursively."""
    folder, checkpoint, victim = crafted_resume(tmp_path)
    fit(folder, 2, [], checkpoint)
    assert not victim.exists()


def test_volt_drops_a_state_that_names_a_place_outside_the_run(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    folder, checkpoint, victim = crafted_resume(tmp_path)
    with caplog.at_level(logging.WARNING, logger="volt.callbacks.restored_paths"):
        fit(folder, 2, [RestoredPathsCheck()], checkpoint)
    assert (victim / "keep" / "work.txt").read_text() == "a user's files"
    (line,) = dropped(caplog)
    assert line.startswith("not restoring ModelCheckpoint{")
    assert f"local://{victim}" in line and str(folder) in line


def test_a_genuine_state_is_restored(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    folder = tmp_path / "checkpoints"
    fit(folder, 1, [], None)
    (checkpoint,) = folder.glob("*.ckpt")
    with caplog.at_level(logging.WARNING, logger="volt.callbacks.restored_paths"):
        fit(folder, 2, [RestoredPathsCheck()], checkpoint)
    assert dropped(caplog) == []


def test_volts_checkpoint_io_removes_files_only(tmp_path: Path) -> None:
    io = AtomicCheckpointIO()
    (tmp_path / "folder").mkdir()
    io.remove_checkpoint(tmp_path / "folder")
    assert (tmp_path / "folder").is_dir()
    with pytest.raises(ValueError, match="local files only"):
        io.remove_checkpoint(f"local://{tmp_path / 'folder'}")
    (tmp_path / "a.ckpt").write_bytes(b"")
    io.remove_checkpoint(tmp_path / "a.ckpt")
    assert not (tmp_path / "a.ckpt").exists()


def test_resuming_a_handed_over_run_keeps_the_users_files(
    run_volt_here: RunHere, tmp_path: Path
) -> None:
    """Through what `python train.py name=...` runs (in this process): a run directory someone
    handed over, its last.ckpt crafted, is resumed; the folder its state names survives, and one
    line says what was dropped."""
    outputs = tmp_path / "outputs"

    def train(steps: int) -> CompletedProcess[str]:
        return run_volt_here(steps_overrides("handed", steps))

    first = train(25)  # an epoch is 20 steps: last.ckpt holds the first
    assert first.returncode == 0, first.stderr[-3000:]
    run_dir = outputs / "train" / "runs" / "handed"
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "work.txt").write_text("a user's files")
    for path in (run_dir / "checkpoints").glob("*.ckpt"):
        checkpoint = torch.load(path, weights_only=True)
        for key, state in checkpoint["callbacks"].items():
            if key.startswith("ModelCheckpoint"):
                state["best_model_path"] = f"local://{victim}"
                state["best_k_models"] = {f"local://{victim}": torch.tensor(0.0)}
        torch.save(checkpoint, path)
    (run_dir / "metrics.json").unlink()  # as if it had been stopped
    second = train(60)  # two more epoch ends: each save removes the previous best
    assert second.returncode == 0, second.stderr[-3000:]
    assert (victim / "work.txt").read_text() == "a user's files"
    assert "not restoring ModelCheckpoint{" in second.stderr + second.stdout
    assert json.loads((run_dir / "metrics.json").read_text())["status"] == "completed"
