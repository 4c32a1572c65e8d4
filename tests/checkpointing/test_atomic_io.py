import os
import re
import signal
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from torch import Tensor
from torch.utils.data import DataLoader, TensorDataset

from tests.tiny_regression import TinyRegression
from volt.checkpointing import (
    AtomicCheckpointIO,
    CheckpointLoadError,
    find_latest_valid_checkpoint,
)
from volt.runs.resume import plan_resume

TEMP_PREFIX = ".volt-ckpt-tmp-"


class RegressionWithData(TinyRegression):
    def train_dataloader(self) -> DataLoader[tuple[Tensor, ...]]:
        generator = torch.Generator().manual_seed(0)
        x = torch.randn(16, 4, generator=generator)
        return DataLoader(TensorDataset(x, x.sum(dim=1, keepdim=True)), batch_size=4)


def fit(root: Path, max_epochs: int, ckpt_path: Path | None = None) -> pl.Trainer:
    trainer = pl.Trainer(
        default_root_dir=root,
        accelerator="cpu",
        devices=1,
        max_epochs=max_epochs,
        plugins=[AtomicCheckpointIO()],
        callbacks=[ModelCheckpoint(dirpath=root / "checkpoints", save_top_k=-1, save_last=True)],
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(RegressionWithData(lr=0.1), ckpt_path=ckpt_path)
    return trainer


def temporaries(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.name.startswith(TEMP_PREFIX))


# Resuming into the directory the first run filled is the point here, so its warning is expected.
@pytest.mark.filterwarnings("ignore:Checkpoint directory .* exists and is not empty")
def test_trainer_checkpoints_load_weights_only_and_resume(tmp_path: Path) -> None:
    trainer = fit(tmp_path, max_epochs=2)
    assert isinstance(trainer.strategy.checkpoint_io, AtomicCheckpointIO)
    directory = tmp_path / "checkpoints"
    names = sorted(p.name for p in directory.glob("*.ckpt"))
    assert names == ["epoch=0-step=4.ckpt", "epoch=1-step=8.ckpt", "last.ckpt"]
    assert temporaries(directory) == []
    # save_last=True re-serialises the state through the plugin: a real file, not a link
    assert not (directory / "last.ckpt").is_symlink()
    for name in names:
        checkpoint = torch.load(directory / name, weights_only=True)
        assert set(checkpoint["state_dict"]) == {"layer.weight", "layer.bias"}
    last = torch.load(directory / "last.ckpt", weights_only=True)
    assert last["global_step"] == 8
    trained = trainer.lightning_module.state_dict()
    assert all(torch.equal(last["state_dict"][k], v) for k, v in trained.items())
    assert find_latest_valid_checkpoint(directory) == (directory / "last.ckpt", [])

    # Resuming goes through AtomicCheckpointIO.load_checkpoint and carries on from step 8.
    resumed = fit(tmp_path, max_epochs=3, ckpt_path=directory / "last.ckpt")
    assert resumed.global_step == 12
    assert torch.load(directory / "last.ckpt", weights_only=True)["global_step"] == 12


# Serves slow saves to the test: it imports torch and volt once (seconds), then forks one writer
# per request, so each kill costs milliseconds. The writer's torch.save dribbles its bytes out
# in chunks with pauses, which gives the kill a wide mid-write window to land in.
WRITER_SERVER = textwrap.dedent(
    """
    import io, os, sys, time
    import torch
    from volt.checkpointing import AtomicCheckpointIO

    real_save = torch.save

    def slow_save(obj, file):
        buffer = io.BytesIO()
        real_save(obj, buffer)
        data = buffer.getvalue()
        for start in range(0, len(data), 512 * 1024):
            file.write(data[start : start + 512 * 1024])
            file.flush()
            time.sleep(0.04)

    print("ready", flush=True)
    for line in sys.stdin:
        pid = os.fork()
        if pid == 0:
            torch.save = slow_save
            # 4 MiB: 8 chunks, about 0.3 s of writing
            checkpoint = {"version": 2, "weights": torch.full((1 << 20,), 2.0)}
            AtomicCheckpointIO().save_checkpoint(checkpoint, line.strip())
            os._exit(0)
        print(pid, flush=True)
        # reaped before the test looks, so the killed writer's pid is no longer alive
        print(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]), flush=True)
    """
)


@pytest.fixture
def writer_server() -> Iterator[subprocess.Popen[str]]:
    server = subprocess.Popen(
        [sys.executable, "-c", WRITER_SERVER],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert server.stdout is not None and server.stdout.readline() == "ready\n"
    yield server
    server.kill()
    server.wait()


def save_version_1(path: Path) -> None:
    AtomicCheckpointIO().save_checkpoint(
        {"version": 1, "weights": torch.full((1 << 20,), 1.0)}, path
    )


def test_kill_mid_save_leaves_previous_checkpoint(
    tmp_path: Path, writer_server: subprocess.Popen[str]
) -> None:
    assert writer_server.stdin is not None and writer_server.stdout is not None
    target = tmp_path / "last.ckpt"
    save_version_1(target)
    killed_mid_write = 0
    # seconds from fork to SIGKILL; None lets the save finish
    for delay in (0.0, 0.01, 0.05, 0.1, 0.2, None):
        writer_server.stdin.write(f"{target}\n")
        writer_server.stdin.flush()
        pid = int(writer_server.stdout.readline())
        if delay is not None:
            time.sleep(delay)
            os.kill(pid, signal.SIGKILL)
        exit_code = int(writer_server.stdout.readline())

        assert [p.name for p in tmp_path.glob("*.ckpt")] == ["last.ckpt"]
        checkpoint = torch.load(target, weights_only=True)
        version = checkpoint["version"]
        assert torch.equal(checkpoint["weights"], torch.full((1 << 20,), float(version)))
        left = temporaries(tmp_path)
        if delay is None:
            assert (exit_code, version, left) == (0, 2, [])
        elif left:
            # the writer died before its rename: the target must still be the old file
            assert (exit_code, version) == (-signal.SIGKILL, 1)
            assert all(f"-{pid}-" in name for name in left)
            killed_mid_write += 1

        # The next save clears the dead writer's temporary and puts version 1 back.
        save_version_1(target)
        assert temporaries(tmp_path) == []
        assert torch.load(target, weights_only=True)["version"] == 1
    assert killed_mid_write >= 2, "too few kills landed mid-write; the test checked too little"


def test_save_keeps_live_and_foreign_temporaries(tmp_path: Path) -> None:
    host = socket.gethostname()
    finished = subprocess.Popen([sys.executable, "-c", "pass"])
    finished.wait()
    dead = f"{TEMP_PREFIX}{host}-{finished.pid}-0123abcd"
    live = f"{TEMP_PREFIX}{host}-{os.getppid()}-0123abcd"  # pytest's parent: alive
    foreign = f"{TEMP_PREFIX}{host}-elsewhere-{finished.pid}-0123abcd"  # another host's writer
    for name in (dead, live, foreign):
        (tmp_path / name).write_bytes(b"partial")
    save_version_1(tmp_path / "last.ckpt")
    assert temporaries(tmp_path) == sorted([live, foreign])


def test_failed_save_removes_its_temporary(tmp_path: Path) -> None:
    target = tmp_path / "last.ckpt"
    save_version_1(target)
    with pytest.raises(AttributeError, match="local object"):  # a lambda does not pickle
        AtomicCheckpointIO().save_checkpoint({"version": 2, "fn": lambda: None}, target)
    assert temporaries(tmp_path) == []
    assert torch.load(target, weights_only=True)["version"] == 1


def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def _empty(path: Path) -> None:
    path.write_bytes(b"")


def _garbage(path: Path) -> None:
    path.write_bytes(b"not a checkpoint at all" * 100)


def _list(path: Path) -> None:
    torch.save([1, 2, 3], path)


def _pickled_object(path: Path) -> None:
    torch.save({"state_dict": {}, "root": Path("/data")}, path)  # weights_only refuses Path


@pytest.mark.parametrize("damage", [_truncate, _empty, _garbage, _list, _pickled_object])
def test_damaged_checkpoint_raises_load_error_naming_file(
    tmp_path: Path, damage: Callable[[Path], None]
) -> None:
    path = tmp_path / "epoch=3.ckpt"
    save_version_1(path)
    damage(path)
    with pytest.raises(CheckpointLoadError, match=re.escape(str(path))):
        AtomicCheckpointIO().load_checkpoint(path)


def test_missing_checkpoint_raises_file_not_found(tmp_path: Path) -> None:
    path = tmp_path / "nothing.ckpt"
    with pytest.raises(FileNotFoundError, match=re.escape(str(path))):
        AtomicCheckpointIO().load_checkpoint(path)


def test_remote_path_is_refused() -> None:
    io = AtomicCheckpointIO()
    with pytest.raises(ValueError, match="local files only"):
        io.save_checkpoint({}, "s3://bucket/last.ckpt")
    with pytest.raises(ValueError, match="local files only"):
        io.load_checkpoint("s3://bucket/last.ckpt")


def write_checkpoints(directory: Path, names_oldest_first: list[str]) -> None:
    directory.mkdir(exist_ok=True)
    for age, name in enumerate(reversed(names_oldest_first)):
        save_version_1(directory / name)
        stamp = time.time() - 100 * (age + 1)
        os.utime(directory / name, (stamp, stamp))


def test_find_latest_skips_damaged_and_reports_them(tmp_path: Path) -> None:
    write_checkpoints(tmp_path, ["epoch=0.ckpt", "epoch=1.ckpt", "epoch=2.ckpt", "last.ckpt"])
    _truncate(tmp_path / "epoch=2.ckpt")
    _garbage(tmp_path / "last.ckpt")
    (tmp_path / "notes.txt").write_text("not matched by the pattern")

    latest, skipped = find_latest_valid_checkpoint(tmp_path)

    assert latest == tmp_path / "epoch=1.ckpt"
    # tried in order: last.ckpt, then the other files newest first
    assert [path.name for path, _ in skipped] == ["last.ckpt", "epoch=2.ckpt"]
    for path, reason in skipped:
        assert str(path) in reason


def test_find_latest_prefers_valid_last_over_newer_epoch(tmp_path: Path) -> None:
    write_checkpoints(tmp_path, ["last.ckpt", "epoch=5.ckpt"])
    assert find_latest_valid_checkpoint(tmp_path) == (tmp_path / "last.ckpt", [])


def test_find_latest_reports_dangling_last_link(tmp_path: Path) -> None:
    write_checkpoints(tmp_path, ["epoch=0.ckpt"])
    # what save_last="link" leaves if its target is removed
    (tmp_path / "last.ckpt").symlink_to("epoch=1.ckpt")

    latest, skipped = find_latest_valid_checkpoint(tmp_path)

    assert latest == tmp_path / "epoch=0.ckpt"
    assert [(path.name, "not found" in reason) for path, reason in skipped] == [("last.ckpt", True)]


def test_find_latest_with_nothing_usable(tmp_path: Path) -> None:
    assert find_latest_valid_checkpoint(tmp_path / "absent") == (None, [])
    write_checkpoints(tmp_path, ["epoch=0.ckpt"])
    _empty(tmp_path / "epoch=0.ckpt")
    latest, skipped = find_latest_valid_checkpoint(tmp_path)
    assert latest is None
    assert [path.name for path, _ in skipped] == ["epoch=0.ckpt"]


def test_a_name_with_a_newline_is_passed_over_and_logged_on_one_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A handed-over run's checkpoint named to forge a line of train.log is not resumed from,
    and the warning that names it stays one line."""
    run_dir = tmp_path / "run"
    forged = "last.ckpt\nvolt: resuming run other from elsewhere.ckpt"
    (run_dir / "checkpoints").mkdir(parents=True)
    write_checkpoints(run_dir / "checkpoints", ["epoch=1.ckpt", forged])
    latest, skipped = find_latest_valid_checkpoint(run_dir / "checkpoints")
    assert latest == run_dir / "checkpoints" / "epoch=1.ckpt"
    assert [(path.name, reason) for path, reason in skipped] == [
        (forged, "its name holds a control character, which volt never writes")
    ]
    with caplog.at_level("INFO"):
        assert plan_resume(run_dir, "run", None).checkpoint == latest
    assert all("\n" not in record.getMessage() for record in caplog.records)
    assert any("\\nvolt: resuming" in record.getMessage() for record in caplog.records)


def test_a_key_inside_a_damaged_checkpoint_forges_no_log_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The reason a checkpoint is passed over quotes what is inside it (here an expanded view's
    key); logged, it stays on one line."""
    run_dir = tmp_path / "run"
    (run_dir / "checkpoints").mkdir(parents=True)
    forged = "w\n[volt.runs.resume][INFO] - resuming run other from elsewhere.ckpt"
    torch.save(
        {"state_dict": {forged: torch.zeros(()).expand(64, 64)}},
        run_dir / "checkpoints" / "last.ckpt",
    )
    with caplog.at_level("INFO"):
        assert plan_resume(run_dir, "run", None).checkpoint is None
    (warning,) = [r.getMessage() for r in caplog.records if "skipping" in r.getMessage()]
    assert "\n" not in warning and "expanded view" in warning
