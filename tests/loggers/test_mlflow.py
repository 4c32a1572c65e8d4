"""logger=mlflow: against a real MLflow tracking server (slow; volt's runs in the test's process,
run_volt_here) and a SQLite store (fast), read back through MlflowClient."""

import json
import logging
from pathlib import Path

import pytest
from lightning.pytorch.utilities import rank_zero_only
from mlflow.tracking import MlflowClient

from tests.in_process import RunHere
from tests.loggers.conftest import TINY
from volt.loggers.mlflow import BEST_CHECKPOINT_TAG, RUN_DIR_TAG, MLflowRunLogger, override_tags
from volt.loggers.tracked_run import tracked_run

SECRET = "s3cret-4f9a1c"


def a_run_dir(root: Path, overrides: list[str]) -> Path:
    """A run directory as Hydra leaves it before the job starts."""
    run_dir = root / "outputs" / "train" / "runs" / "r1"
    (run_dir / ".hydra").mkdir(parents=True)
    (run_dir / ".hydra" / "overrides.yaml").write_text(json.dumps(overrides))
    return run_dir


def local_logger(run_dir: Path, uri: str) -> MLflowRunLogger:
    sweep_dir = run_dir.parents[1] / "multiruns" / "stamp"
    return MLflowRunLogger(str(run_dir), str(sweep_dir), uri, experiment_name="train")


def test_override_tags_are_valid_mlflow_tag_names() -> None:
    tags = override_tags(("model=cnn", "+trainer.foo=1", "~callbacks.x", "a@b=[1,2]"))
    assert tags == {"model": "cnn", "trainer.foo": "1", "_callbacks.x": "", "a_b": "[1,2]"}


def test_a_continued_run_logs_into_the_same_mlflow_run_and_keeps_its_first_params(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    uri = f"sqlite:///{tmp_path / 'outputs' / 'mlflow.db'}"
    run_dir = a_run_dir(tmp_path, ["model=cnn", "name=r1"])
    first = local_logger(run_dir, uri)
    first.log_hyperparams({"trainer.devices": 1, "seed": 42})
    first.log_metrics({"train/loss": 2.0}, step=1)
    first.finalize("success")
    run_id = (run_dir / "mlflow_run_id.txt").read_text().split()[0]
    assert run_id == first.run_id

    again = local_logger(run_dir, uri)  # the next attempt of the named run
    assert again.run_id == run_id
    client = MlflowClient(uri)
    assert client.get_run(run_id).info.status == "RUNNING"
    with caplog.at_level(logging.WARNING, logger="volt.loggers.mlflow"):
        again.log_hyperparams({"trainer.devices": 2, "seed": 42, "model.lr": 0.1})
    assert "first attempt's value of trainer.devices" in caplog.text
    again.log_metrics({"train/loss": 1.0}, step=2)
    again.finalize("success")

    run = client.get_run(run_id)
    assert run.info.status == "FINISHED"
    assert run.info.run_name == "r1"
    assert run.data.params == {"trainer.devices": "1", "seed": "42", "model.lr": "0.1"}
    assert run.data.tags["model"] == "cnn"
    assert run.data.tags[RUN_DIR_TAG] == str(run_dir)
    history = client.get_metric_history(run_id, "train/loss")
    assert [(m.step, m.value) for m in history] == [(1, 2.0), (2, 1.0)]
    (experiment,) = [e for e in client.search_experiments() if e.name == "train"]
    assert len(client.search_runs([experiment.experiment_id])) == 1
    # Artifacts beside the store, not in whatever directory the command started from.
    assert experiment.artifact_location == str(tmp_path / "outputs" / "mlartifacts")


def test_a_run_gone_from_the_store_starts_a_new_one(tmp_path: Path) -> None:
    run_dir = a_run_dir(tmp_path, [])
    tracked_run(str(run_dir), "x").store_id("mlflow", "0123456789abcdef0123456789abcdef")
    logger = local_logger(run_dir, f"sqlite:///{tmp_path / 'mlflow.db'}")
    assert logger.run_id != "0123456789abcdef0123456789abcdef"
    assert (run_dir / "mlflow_run_id.txt").read_text().split()[0] == logger.run_id


def test_an_id_file_from_before_the_stamp_still_continues_its_own_mlflow_run(
    tmp_path: Path,
) -> None:
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    run_dir = a_run_dir(tmp_path, [])
    first = local_logger(run_dir, uri)
    first.log_metrics({"train/loss": 2.0}, step=1)
    first.finalize("success")
    (run_dir / "mlflow_run_id.txt").write_text(f"{first.run_id}\n")  # as volt wrote it before
    assert local_logger(run_dir, uri).run_id == first.run_id


def test_a_handed_over_run_directory_never_logs_into_another_directorys_mlflow_run(
    tmp_path: Path,
) -> None:
    """A run directory from elsewhere whose id file names a run on this store (another
    directory's, on a shared server) starts a new MLflow run, whether the file names this
    directory (forged) or not (copied)."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    theirs = local_logger(a_run_dir(tmp_path / "colleague", []), uri)
    theirs.log_metrics({"train/loss": 2.0}, step=1)
    theirs.finalize("success")
    run_dir = a_run_dir(tmp_path / "mine", [])
    copied = tmp_path / "colleague" / "outputs" / "train" / "runs" / "r1" / "mlflow_run_id.txt"
    forged = f"{theirs.run_id}\ndirectory: {run_dir.resolve()}\n"
    for id_file in (copied.read_text(), forged, f"{theirs.run_id}\n"):
        (run_dir / "mlflow_run_id.txt").write_text(id_file)
        mine = local_logger(run_dir, uri)
        mine.log_metrics({"train/loss": 9.0}, step=2)
        mine.finalize("success")
        assert mine.run_id != theirs.run_id
    history = MlflowClient(uri).get_metric_history(theirs.run_id, "train/loss")
    assert [(m.step, m.value) for m in history] == [(1, 2.0)]


def test_other_ranks_write_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    MlflowClient(uri)  # rank 0 made the store before the other ranks started
    run_dir = a_run_dir(tmp_path, ["model=cnn"])
    before = {p: p.stat().st_mtime_ns for p in tmp_path.rglob("*")}
    monkeypatch.setattr(rank_zero_only, "rank", 1)
    logger = local_logger(run_dir, uri)
    logger.log_hyperparams({"seed": 1})
    logger.log_metrics({"train/loss": 1.0}, step=1)
    logger.finalize("success")
    assert {p: p.stat().st_mtime_ns for p in tmp_path.rglob("*")} == before
    client = MlflowClient(uri)
    assert client.search_runs([e.experiment_id for e in client.search_experiments()]) == []


def runs_of(client: MlflowClient, experiment_name: str) -> list:
    experiment = client.get_experiment_by_name(experiment_name)
    assert experiment is not None, f"no MLflow experiment {experiment_name!r}"
    return client.search_runs([experiment.experiment_id], order_by=["attributes.run_name"])


@pytest.mark.slow
def test_a_named_run_and_its_continuation_are_one_mlflow_run(
    mlflow_server: str, run_volt_here: RunHere, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A value read from the environment: params and tags hold where it came from, not the value.
    monkeypatch.setenv("VOLT_TEST_SECRET", str(tmp_path / SECRET))
    args = [
        "logger=mlflow",
        f"logger.mlflow.tracking_uri={mlflow_server}",
        "name=tracked",
        "trainer.default_root_dir=${oc.env:VOLT_TEST_SECRET}",
        *TINY,
        "trainer.max_epochs=2",
    ]
    first = run_volt_here([*args, "trainer.max_steps=4"])  # stops at the end of epoch 0
    assert first.returncode == 0, first.stderr[-3000:]
    run_dir = tmp_path / "outputs" / "train" / "runs" / "tracked"
    run_id = (run_dir / "mlflow_run_id.txt").read_text().split()[0]
    client = MlflowClient(mlflow_server)
    (run,) = runs_of(client, "train")
    assert run.info.run_id == run_id
    assert run.info.run_name == "tracked"
    assert run.info.status == "FINISHED"
    params = run.data.params
    assert params["model.optimizer.lr"] == "0.003"
    assert params["data.batch_size"] == "64"
    assert params["trainer.default_root_dir"] == "${oc.env:VOLT_TEST_SECRET}"
    # The whole resolved config, not only the hparams tab's groups.
    assert params["task.watch"] == "val/acc"
    assert params["callbacks.early_stopping.patience"] == "10"
    tags = run.data.tags
    assert not [v for v in [*params.values(), *tags.values()] if SECRET in v]
    assert tags[RUN_DIR_TAG] == str(run_dir)
    assert tags["name"] == "tracked"
    assert tags["trainer.max_steps"] == "4"
    best = json.loads((run_dir / "metrics.json").read_text())["best_checkpoint"]
    assert tags[BEST_CHECKPOINT_TAG] == best and Path(best).is_file()
    steps = [m.step for m in client.get_metric_history(run_id, "train/loss")]
    assert steps == [0, 1, 2, 3]
    assert {"val/acc", "test/acc", "test/loss"} <= set(run.data.metrics)

    # As if the run had been killed after its first epoch: continued for a second one.
    (run_dir / "metrics.json").unlink()
    second = run_volt_here([*args, "trainer.max_steps=-1"])  # run-neutral: the same named run
    assert second.returncode == 0, second.stderr[-3000:]
    assert "resuming run tracked" in second.stdout + second.stderr
    assert (run_dir / "mlflow_run_id.txt").read_text().split()[0] == run_id
    (run,) = runs_of(client, "train")  # still one run
    assert run.info.run_id == run_id
    assert run.info.status == "FINISHED"
    assert run.data.params["trainer.max_steps"] == "4"  # MLflow keeps a param's first value
    steps = [m.step for m in client.get_metric_history(run_id, "train/loss")]
    assert steps == [0, 1, 2, 3, 4, 5, 6, 7]


@pytest.mark.slow
def test_the_jobs_of_a_sweep_are_runs_of_one_experiment(
    mlflow_server: str, run_volt_here: RunHere, tmp_path: Path
) -> None:
    args = ["-m", "name=mlgrid", "logger=mlflow", f"logger.mlflow.tracking_uri={mlflow_server}"]
    result = run_volt_here([*args, "data.batch_size=32,64", *TINY, "trainer.max_epochs=1"])
    assert result.returncode == 0, result.stderr[-3000:]
    sweep = tmp_path / "outputs" / "train" / "multiruns" / "mlgrid"
    jobs = sorted(p for p in sweep.iterdir() if p.is_dir())
    runs = runs_of(MlflowClient(mlflow_server), "mlgrid")
    assert [r.info.run_name for r in runs] == [job.name for job in jobs]
    assert [r.data.tags["data.batch_size"] for r in runs] == ["32", "64"]
    assert [r.data.params["data.batch_size"] for r in runs] == ["32", "64"]
    assert [r.data.tags[RUN_DIR_TAG] for r in runs] == [str(job) for job in jobs]
    assert [(job / "mlflow_run_id.txt").read_text().split()[0] for job in jobs] == [
        r.info.run_id for r in runs
    ]
    assert all(r.info.status == "FINISHED" for r in runs)
