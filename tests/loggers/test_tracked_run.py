"""What a tracker learns from a run's directory: name, sweep, overrides, its own id."""

from pathlib import Path

from volt.loggers.tracked_run import tracked_run


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
