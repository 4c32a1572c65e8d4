"""The hparams tab's session record over a run's life, written to real event files and read back
with TensorBoard's own EventAccumulator: `running` from the start, then how the run ended."""

import json
import signal
from collections.abc import Callable
from pathlib import Path

import pytest
from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger
from lightning.pytorch.utilities import rank_zero_only
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.plugins.hparams import api_pb2, metadata

from volt.errors import TrainingInterrupted
from volt.runs import hparams_session, write_metrics
from volt.runs.hparams_tab import flat_hparams

CONFIG = {
    "model": {"optimizer": {"lr": 0.01}, "net": {"hidden_sizes": [8, 8], "dropout": None}},
    "trainer": {"deterministic": True},
    "seed": 3,
    "tags": ["not", "an", "hparam"],
}


def session(run_dir: Path) -> tuple[dict[str, object], int | None, str]:
    """(hparams, the plugin's end status or None, group name) as TensorBoard reads the run."""
    events = EventAccumulator(str(run_dir), size_guidance={"tensors": 0})
    events.Reload()
    content = events.PluginTagToContent(metadata.PLUGIN_NAME)
    start = metadata.parse_session_start_info_plugin_data(content[metadata.SESSION_START_INFO_TAG])
    hparams = {}
    for name, value in start.hparams.items():
        hparams[name] = getattr(value, value.WhichOneof("kind"))
    end = content.get(metadata.SESSION_END_INFO_TAG)
    status = metadata.parse_session_end_info_plugin_data(end).status if end else None
    return hparams, status, start.group_name


def hparams_files(run_dir: Path) -> list[str]:
    return sorted(p.name for p in run_dir.glob("events.out.tfevents.0.*"))


def tensorboard(run_dir: Path) -> TensorBoardLogger:
    return TensorBoardLogger(run_dir, name="", version="")


def test_a_run_is_listed_from_its_start_and_completed_at_its_end(tmp_path: Path) -> None:
    run_dir = tmp_path / "outputs" / "train" / "runs" / "one"
    config = {**CONFIG, "paths": {"outputs_dir": str(tmp_path / "outputs")}}
    with hparams_session([tensorboard(run_dir)], config, run_dir):
        hparams, status, group = session(run_dir)
        assert hparams["status"] == "running" and status is None
    assert hparams["model.optimizer.lr"] == pytest.approx(0.01)
    assert hparams["model.net.hidden_sizes"] == "[8, 8]"
    assert hparams["model.net.dropout"] == "null"
    assert hparams["trainer.deterministic"] is True
    assert hparams["seed"] == 3 and "tags" not in hparams
    # Unique per run, so runs with the same values are not averaged together: its TensorBoard name.
    assert group == "train/runs/one"

    ended, status, _ = session(run_dir)
    assert ended == {**hparams, "status": "completed"}
    events = EventAccumulator(str(run_dir), size_guidance={"tensors": 0})
    events.Reload()
    # No experiment record: TensorBoard would take one run's and hide the other runs' columns.
    assert set(events.PluginTagToContent(metadata.PLUGIN_NAME)) == {
        metadata.SESSION_START_INFO_TAG,
        metadata.SESSION_END_INFO_TAG,
    }
    assert status == api_pb2.STATUS_SUCCESS
    assert hparams_files(run_dir) == ["events.out.tfevents.0.volt-hparams-ended"]
    assert not list(run_dir.glob("*.partial"))


class Failure(RuntimeError):
    pass


def ctrl_c_in_fit() -> None:
    """What Lightning 2.x does on Ctrl+C inside fit: sys.exit(1) while handling it."""
    try:
        raise KeyboardInterrupt
    except KeyboardInterrupt:
        raise SystemExit(1) from None


def sigterm() -> None:
    raise TrainingInterrupted(signal.SIGTERM, Path("last.ckpt"))


def fail() -> None:
    raise Failure("diverged")


@pytest.mark.parametrize(
    ("end", "expected", "plugin_status"),
    [
        (fail, "failed", api_pb2.STATUS_FAILURE),
        (sigterm, "interrupted", api_pb2.STATUS_FAILURE),
        (ctrl_c_in_fit, "interrupted", api_pb2.STATUS_FAILURE),
    ],
    ids=["error", "SIGTERM", "Ctrl+C"],
)
def test_a_run_that_does_not_finish_says_how_it_ended(
    end: Callable[[], None], expected: str, plugin_status: int, tmp_path: Path
) -> None:
    # TrainingInterrupted is a SystemExit.
    ended = pytest.raises((Failure, SystemExit))
    with ended, hparams_session([tensorboard(tmp_path)], CONFIG, tmp_path):
        end()
    hparams, status, _ = session(tmp_path)
    assert hparams["status"] == expected
    assert status == plugin_status


def test_the_status_the_run_wrote_to_metrics_json_wins(tmp_path: Path) -> None:
    """A sweep that prunes the run says so in metrics.json; the run itself ends normally."""
    with hparams_session([tensorboard(tmp_path)], CONFIG, tmp_path):
        write_metrics(tmp_path, {"val/acc": 0.5}, status="pruned")
    assert session(tmp_path)[0]["status"] == "pruned"


def test_a_resumed_run_gets_a_new_record_and_ignores_the_old_metrics(tmp_path: Path) -> None:
    (tmp_path / "metrics.json").write_text(json.dumps({"status": "failed", "error": "x"}))
    with pytest.raises(Failure), hparams_session([tensorboard(tmp_path)], CONFIG, tmp_path):
        fail()
    assert session(tmp_path)[0]["status"] == "failed"
    with hparams_session([tensorboard(tmp_path)], CONFIG, tmp_path):
        assert hparams_files(tmp_path) == ["events.out.tfevents.0.volt-hparams-started"]
        assert session(tmp_path)[0]["status"] == "running"
    assert session(tmp_path)[0]["status"] == "completed"
    assert hparams_files(tmp_path) == ["events.out.tfevents.0.volt-hparams-ended"]


def test_other_loggers_get_the_hparams_at_the_start(tmp_path: Path) -> None:
    csv = CSVLogger(tmp_path, name="csv", version="")
    with hparams_session([csv], CONFIG, tmp_path):
        saved = (tmp_path / "csv" / "hparams.yaml").read_text()
        assert "model.optimizer.lr: 0.01" in saved
    assert not hparams_files(tmp_path)


def test_nothing_is_written_by_other_ranks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(rank_zero_only, "rank", 1)
    with hparams_session([tensorboard(tmp_path)], CONFIG, tmp_path):
        pass
    assert not hparams_files(tmp_path)


def test_flat_hparams_keeps_the_tab_groups_or_every_key() -> None:
    config = {"model": {"optimizer": {"lr": 0.003}}, "task": {"watch": "val/acc"}, "tags": [1, 2]}
    assert flat_hparams(config) == {"model.optimizer.lr": 0.003}
    assert flat_hparams(config, groups=None) == {
        "model.optimizer.lr": 0.003,
        "task.watch": "val/acc",
        "tags": "[1, 2]",
    }
