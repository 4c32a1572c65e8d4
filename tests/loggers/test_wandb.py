"""logger=wandb: offline (no network), its run files read back."""

import json
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
from lightning.pytorch.utilities import rank_zero_only

from tests.loggers.conftest import TINY, wandb_records, wandb_values
from volt.loggers.wandb import WandbRunLogger, wandb_mode

Run = Callable[..., subprocess.CompletedProcess[str]]
API_KEY = "0123456789abcdef0123456789abcdefvoltkey"  # 40 characters, like a real key


@pytest.fixture
def wandb_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """No W&B login and no mode chosen; a home of its own (W&B keeps its service logs there)."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    for variable in ("WANDB_API_KEY", "WANDB_MODE", "WANDB_BASE_URL", "NETRC", "WANDB_DIR"):
        monkeypatch.delenv(variable, raising=False)
    return home


def test_offline_unless_wandb_can_log_in(
    wandb_env: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert wandb_mode(None) == "offline"
    (wandb_env / ".netrc").write_text("machine example.com login user password other\n")
    assert wandb_mode(None) == "offline"  # a login, but for another host
    (wandb_env / ".netrc").write_text("machine api.wandb.ai login user password key\n")
    (wandb_env / ".netrc").chmod(0o600)
    assert wandb_mode(None) is None  # W&B logs in and goes online
    monkeypatch.setenv("NETRC", str(tmp_path / "missing"))
    assert wandb_mode(None) == "offline"
    monkeypatch.setenv("WANDB_API_KEY", API_KEY)
    assert wandb_mode(None) is None
    monkeypatch.delenv("WANDB_API_KEY")
    monkeypatch.setenv("WANDB_MODE", "disabled")
    assert wandb_mode(None) is None  # the user's own choice stands
    assert wandb_mode(True) == "offline"
    assert wandb_mode(False) == "online"


def test_other_ranks_write_nothing(
    wandb_env: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    monkeypatch.setattr(rank_zero_only, "rank", 1)
    logger = WandbRunLogger(str(run_dir), str(tmp_path / "sweep"), project="volt")
    logger.log_hyperparams({"seed": 1})
    logger.log_metrics({"train/loss": 1.0}, step=1)
    logger.finalize("failed")
    assert list(run_dir.iterdir()) == []


def offline_runs(run_dir: Path) -> list[Path]:
    return sorted((run_dir / "wandb").glob("offline-run-*"))


def the_run(records: list) -> object:
    (run,) = [r.run for r in records if r.WhichOneof("record_type") == "run"]
    return run


def config_of(records: list) -> dict[str, str]:
    config: dict[str, str] = {}
    for record in records:
        if record.WhichOneof("record_type") == "config":
            config.update(wandb_values(record.config.update))
    return config


def steps_of(records: list, metric: str) -> list[int]:
    rows = [
        wandb_values(r.history.item) for r in records if r.WhichOneof("record_type") == "history"
    ]
    return [int(row["trainer/global_step"]) for row in rows if metric in row]


@pytest.mark.slow
def test_an_offline_run_continues_the_same_wandb_run_and_never_holds_the_key(
    wandb_env: Path, run_volt: Run, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WANDB_API_KEY", API_KEY)
    monkeypatch.setenv("WANDB_MODE", "offline")  # a key, but the user said offline
    args = ["logger=wandb", "name=wb", *TINY, "trainer.max_epochs=2"]
    first = run_volt([*args, "trainer.max_steps=4"])  # stops at the end of epoch 0
    assert first.returncode == 0, first.stderr[-3000:]
    run_dir = tmp_path / "outputs" / "train" / "runs" / "wb"
    run_id = (run_dir / "wandb_run_id.txt").read_text().split()[0]
    (offline,) = offline_runs(run_dir)
    records = wandb_records(offline)
    run = the_run(records)
    assert run.run_id == run_id
    assert run.display_name == "wb"
    assert run.project == "volt"
    assert run.job_type == "train"
    assert not run.run_group  # a single run
    assert "name=wb" in run.tags
    config = config_of(records)
    assert json.loads(config["data.batch_size"]) == 64
    assert json.loads(config["model.optimizer.lr"]) == 0.003
    assert steps_of(records, "train/loss") == [0, 1, 2, 3]

    (run_dir / "metrics.json").unlink()  # as if killed after its first epoch
    second = run_volt([*args, "trainer.max_steps=-1"])
    assert second.returncode == 0, second.stderr[-3000:]
    assert (run_dir / "wandb_run_id.txt").read_text().split()[0] == run_id
    continued = offline_runs(run_dir)[-1]
    assert continued != offline
    records = wandb_records(continued)
    assert the_run(records).run_id == run_id
    assert steps_of(records, "train/loss") == [4, 5, 6, 7]

    for root in (tmp_path / "outputs", wandb_env):
        for path in root.rglob("*"):
            if path.is_file():
                assert API_KEY.encode() not in path.read_bytes(), path


@pytest.mark.slow
def test_the_jobs_of_a_sweep_are_one_group_of_offline_runs(
    wandb_env: Path, run_volt: Run, tmp_path: Path
) -> None:
    result = run_volt(
        [
            "-m",
            "name=wbgrid",
            "logger=wandb",
            "data.batch_size=32,64",
            *TINY,
            "trainer.max_epochs=1",
        ]
    )
    assert result.returncode == 0, result.stderr[-3000:]
    sweep = tmp_path / "outputs" / "train" / "multiruns" / "wbgrid"
    jobs = sorted(p for p in sweep.iterdir() if p.is_dir())
    runs = []
    for job in jobs:
        (offline,) = offline_runs(job)  # offline: no key, no netrc, no WANDB_MODE
        records = wandb_records(offline)
        runs.append((the_run(records), config_of(records)))
    assert [run.run_group for run, _ in runs] == ["wbgrid", "wbgrid"]
    assert [run.display_name for run, _ in runs] == [job.name for job in jobs]
    assert [(job / "wandb_run_id.txt").read_text().split()[0] for job in jobs] == [
        run.run_id for run, _ in runs
    ]
    assert runs[0][0].run_id != runs[1][0].run_id
    assert ["data.batch_size=32" in run.tags for run, _ in runs] == [True, False]
    assert [json.loads(config["data.batch_size"]) for _, config in runs] == [32, 64]
