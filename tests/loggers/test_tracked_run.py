"""What a tracker learns from a run's directory: name, sweep, overrides, its own id."""

import shutil
from pathlib import Path

import pytest

from volt.errors import ConfigError
from volt.loggers.tracked_run import TrackedRun, tracked_run, user_key


def test_a_sweep_job_knows_its_sweep_and_a_single_run_has_none(tmp_path: Path) -> None:
    sweep = tmp_path / "train" / "multiruns" / "grid"
    job = sweep / "1_data.batch_size=64"
    (job / ".hydra").mkdir(parents=True)
    (job / ".hydra" / "overrides.yaml").write_text("- data.batch_size=64\n- name=grid\n")
    run = tracked_run(str(job), str(sweep))
    assert (run.name, run.sweep, run.overrides) == (
        job.name,
        "grid",
        ("data.batch_size=64", "name=grid"),
    )
    single = tmp_path / "train" / "runs" / "stamp"
    # Hydra's sweep dir resolves in a single run too, to a multiruns/ directory of the same id.
    alone = tracked_run(str(single), str(tmp_path / "train" / "multiruns" / "stamp"))
    assert (alone.name, alone.sweep, alone.overrides) == ("stamp", None, ())


def test_the_tracker_id_is_kept_in_the_run_directory(tmp_path: Path) -> None:
    run = tracked_run(str(tmp_path), str(tmp_path.parent / "elsewhere"))
    assert run.stored_id("mlflow") is None
    run.store_id("mlflow", "abc123")
    assert tracked_run(str(tmp_path), "x").stored_id("mlflow") == "abc123"
    assert run.stored_id("wandb") is None


@pytest.mark.parametrize(
    "text",
    [
        "abc123\n",  # an id alone: by hand, or an older volt
        "abc123\ndirectory: /elsewhere/outputs/train/runs/r1\n",  # handed over
        "../../x\ndirectory: {here}\n",  # not an id
        "abc123\ndirectory: {here}\nmore\n",
    ],
)
def test_an_id_not_stored_for_this_directory_is_not_continued(
    text: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    (tmp_path / "mlflow_run_id.txt").write_text(text.format(here=tmp_path.resolve()))
    assert tracked_run(str(tmp_path), "x").stored_id("mlflow") is None
    assert "was not written for this run directory" in caplog.text


def test_a_moved_run_directory_starts_a_new_tracked_run(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    tracked_run(str(tmp_path / "a"), "x").store_id("wandb", "k3x9a2b1")
    assert tracked_run(str(tmp_path / "a"), "x").stored_id("wandb") == "k3x9a2b1"
    shutil.move(tmp_path / "a", tmp_path / "b")
    assert tracked_run(str(tmp_path / "b"), "x").stored_id("wandb") is None


def test_an_id_file_that_is_a_link_is_neither_read_nor_written_through(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    precious = tmp_path / "train.py"
    precious.write_text("print('mine')\n")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "wandb_run_id.txt").symlink_to(precious)
    run = tracked_run(str(run_dir), "x")
    assert run.stored_id("wandb") is None
    assert "was not written for this run directory" in caplog.text
    run.store_id("wandb", "k3x9a2b1")
    assert precious.read_text() == "print('mine')\n"
    assert not (run_dir / "wandb_run_id.txt").is_symlink()
    assert run.stored_id("wandb") == "k3x9a2b1"


def test_an_id_alone_counts_only_where_the_tracker_checks_the_run_itself(tmp_path: Path) -> None:
    (tmp_path / "mlflow_run_id.txt").write_text("0123456789abcdef0123456789abcdef\n")  # before
    run = tracked_run(str(tmp_path), "x")
    assert run.stored_id("mlflow") is None
    assert run.stored_id("mlflow", unstamped_ok=True) == "0123456789abcdef0123456789abcdef"


def test_an_id_naming_this_directory_without_this_users_stamp_is_not_continued(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The issue's takeover: the victim's own path, guessable (the same on every machine of a
    team), beside the attacker's W&B run id."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    forged = f"k3x9a2b1\ndirectory: {run_dir.resolve()}\n"
    (run_dir / "wandb_run_id.txt").write_text(forged)
    assert tracked_run(str(run_dir), "x").stored_id("wandb") is None
    assert "was not written for this run directory" in caplog.text
    # the control: checked by the path alone, as before, the attacker's run is continued
    path_only = lambda self, tracker, run_id: f"directory: {self.directory.resolve()}"  # noqa: E731
    monkeypatch.setattr(TrackedRun, "_stamp", path_only)
    assert tracked_run(str(run_dir), "x").stored_id("wandb") == "k3x9a2b1"


def test_a_stamp_made_with_another_users_key_is_not_continued(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tracked_run(str(tmp_path), "x").store_id("wandb", "k3x9a2b1")
    assert tracked_run(str(tmp_path), "x").stored_id("wandb") == "k3x9a2b1"  # the same user
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "another_users_config"))
    assert tracked_run(str(tmp_path), "x").stored_id("wandb") is None


def test_the_key_is_made_once_for_this_user_alone(tmp_path: Path, own_config_home: Path) -> None:
    key = user_key()
    path = own_config_home / "volt" / "run_key"
    assert path.stat().st_mode & 0o777 == 0o600 and user_key() == key
    path.chmod(0o644)
    with pytest.raises(ConfigError, match=f"chmod 600 {path}"):
        user_key()
