"""Where a run directory may be, a sweep job's name, and removing only what this process made for a
refused run."""

from pathlib import Path

import pytest
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from volt.config import SWEPT_KEYS, job_dirname
from volt.config.run_dirs import check_run_dir, note_new_run_dir, remove_run_dir_made_here
from volt.errors import ConfigError


def sweep_config(outputs: Path, task: list[str], params: dict[str, str]) -> DictConfig:
    return OmegaConf.create(
        {
            "paths": {"outputs_dir": str(outputs)},
            "hydra": {
                "mode": RunMode.MULTIRUN,
                "sweep": {"dir": f"{outputs}/train/multiruns/grid"},
                "job": {"config": {"override_dirname": {"exclude_keys": ["data.root"]}}},
                "overrides": {"task": task},
                "sweeper": {"params": params},
            },
        }
    )


def test_a_search_space_value_with_a_slash_is_refused(tmp_path: Path) -> None:
    """Optuna's choices name the jobs' directories as the command line's do."""
    ok = sweep_config(tmp_path, ["seed=1,2", "data.root=/a/b"], {"model.optimizer.lr": "0.1"})
    check_run_dir(ok)  # data.root is excluded from the directory name
    bad = sweep_config(tmp_path, [], {"callbacks.model_checkpoint.filename": "choice(a, b/c)"})
    with pytest.raises(ConfigError, match=r"filename=b/c: a sweep job's directory"):
        check_run_dir(bad)


def test_a_sweep_job_is_named_by_what_the_sweep_varies(monkeypatch: pytest.MonkeyPatch) -> None:
    job = ["trainer.max_epochs=1", "model.optimizer.lr=0.01", "+tag=x", "data.batch_size=32"]
    every = "+tag=x,data.batch_size=32,model.optimizer.lr=0.01,trainer.max_epochs=1"
    monkeypatch.setenv(SWEPT_KEYS, "model.optimizer.lr,data.batch_size,tag")
    assert job_dirname(job, every) == "+tag=x,data.batch_size=32,model.optimizer.lr=0.01"
    monkeypatch.setenv(SWEPT_KEYS, "")  # a search's sweeper names its jobs itself
    assert job_dirname(job, every) == every
    # A job started without the environment of the command (sbatch --export=NONE): Hydra's name.
    monkeypatch.delenv(SWEPT_KEYS)
    assert job_dirname(job, every) == every


def test_only_what_this_process_made_is_removed(tmp_path: Path) -> None:
    outputs = tmp_path / "outputs"
    outputs.mkdir()
    run_dir = outputs / "train" / "runs" / "stamp"
    note_new_run_dir(run_dir)
    run_dir.mkdir(parents=True)
    (run_dir / "train.log").write_text("refused\n")
    # Another run made its own directory beside this one meanwhile: it and its parents stay.
    (outputs / "train" / "runs" / "other").mkdir()
    remove_run_dir_made_here(run_dir)
    assert sorted(p.relative_to(outputs) for p in outputs.rglob("*")) == [
        Path("train"),
        Path("train/runs"),
        Path("train/runs/other"),
    ]


def test_a_run_directory_that_existed_is_kept(tmp_path: Path) -> None:
    run_dir = tmp_path / "outputs" / "train" / "runs" / "named"
    run_dir.mkdir(parents=True)
    note_new_run_dir(run_dir)
    (run_dir / "train.log").write_text("written by the refused attempt\n")
    remove_run_dir_made_here(run_dir)
    assert (run_dir / "train.log").is_file()


def test_another_directory_is_never_removed(tmp_path: Path) -> None:
    made, other = tmp_path / "made", tmp_path / "other"
    note_new_run_dir(made)
    made.mkdir()
    other.mkdir()
    remove_run_dir_made_here(other)
    assert made.is_dir() and other.is_dir()
    remove_run_dir_made_here(made)
    assert not made.exists() and tmp_path.is_dir()
