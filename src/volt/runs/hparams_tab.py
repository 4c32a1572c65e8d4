"""TensorBoard's hparams tab: every run listed from its start, with its config values and a
`status` (running, then completed, failed, interrupted or pruned), beside its metrics.

The hparams plugin reads a session's metrics from the run's own scalar tags (the last value of
`val/acc`, `test/acc`, ...), so nothing but the session record is written here: no metric is
written again at step 0, where it would add a false first point to its curve. No experiment
summary either: the plugin takes one run's at random and would then hide the hparams and metrics
of runs of other tasks under the same logdir; without one it lists the union over all runs.

TensorBoard keeps the first summary metadata of a tag in a run, in which the hparams plugin finds
a session's start record, so a second record in the same file would be ignored. The record is a
file of its own, replaced at the end by one with the final status: a TensorBoard started since
shows it; one already running keeps showing `running` until it is restarted, but picks up the
end record's Success / Failure (the plugin's own status filter, in the HPARAMS dashboard).
"""

import io
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from lightning.pytorch.loggers import Logger, TensorBoardLogger
from lightning.pytorch.utilities import rank_zero_only
from tensorboard.compat.proto.event_pb2 import Event
from tensorboard.compat.proto.summary_pb2 import Summary
from tensorboard.plugins.hparams import api_pb2, metadata, plugin_data_pb2
from tensorboard.summary.writer.record_writer import RecordWriter

from volt.folder_files import write_replacing
from volt.runs.records import read_metrics, run_status

HPARAM_GROUPS = ("data", "model", "trainer", "compile", "precision", "seed")
# Event files sort before Lightning's (`events.out.tfevents.<unix time>...`): TensorBoard's Python
# loader follows only the last file of a run, which must stay the one Lightning appends to.
STARTED_FILE = "events.out.tfevents.0.volt-hparams-started"
ENDED_FILE = "events.out.tfevents.0.volt-hparams-ended"
# The plugin's own four states; the `status` hparam says which of volt's it was.
PLUGIN_STATUS = {
    "completed": api_pb2.STATUS_SUCCESS,
    "failed": api_pb2.STATUS_FAILURE,
    "interrupted": api_pb2.STATUS_FAILURE,
    "pruned": api_pb2.STATUS_SUCCESS,  # stopped by the search on purpose, with valid metrics
}


def flat_hparams(
    config: Mapping[str, Any], groups: Sequence[str] | None = HPARAM_GROUPS
) -> dict[str, bool | int | float | str]:
    """`model.optimizer.lr: 0.003`, ...: scalars as they are, lists as text; the keys under
    `groups` (what the hparams tab shows as columns), or every key when None."""
    flat: dict[str, bool | int | float | str] = {}

    def walk(prefix: str, value: Any) -> None:
        if isinstance(value, Mapping):
            for k, v in value.items():
                walk(f"{prefix}.{k}" if prefix else str(k), v)
        elif value is None or isinstance(value, bool | int | float | str):
            flat[prefix] = value if value is not None else "null"
        else:
            flat[prefix] = str(value)

    if groups is None:
        walk("", config)
    for group in groups or ():
        if group in config:
            walk(group, config[group])
    return flat


@contextmanager
def hparams_session(
    loggers: Sequence[Logger], config: Mapping[str, Any], run_dir: Path
) -> Iterator[None]:
    """The run's hparams: in each TensorBoard logger's directory a
    session record with `status: running` when entered, replaced on leaving by one with the final
    status (`volt.runs.records.run_status`, or the status of the metrics.json written meanwhile,
    where a sweep may say `pruned`); every other logger gets all of `config` once, when entered."""
    if rank_zero_only.rank != 0:  # type: ignore[attr-defined]  # set by Lightning at import
        yield
        return
    params = flat_hparams(config)
    started = time.time()
    record_before = read_metrics(run_dir)  # an earlier attempt's, if this run is resumed
    directories = [Path(x.log_dir) for x in loggers if isinstance(x, TensorBoardLogger)]
    trial = _trial_name(run_dir, config)
    for directory in directories:
        directory.mkdir(parents=True, exist_ok=True)
        (directory / ENDED_FILE).unlink(missing_ok=True)  # an earlier attempt's, if resumed
        start = _session_start(params, "running", trial, started)
        _write_events(directory / STARTED_FILE, [start])
    # Other trackers (MLflow, W&B, CSV) get the whole resolved config: it is what they search.
    for logger in loggers:
        if not isinstance(logger, TensorBoardLogger):
            logger.log_hyperparams(flat_hparams(config, groups=None))
            logger.save()
    error: BaseException | None = None
    try:
        yield
    except BaseException as caught:
        error = caught
        raise
    finally:
        record = read_metrics(run_dir)
        # The metrics.json this run wrote has the last word: a sweep may say `pruned` there.
        written = record.get("status") if record and record != record_before else None
        status = written or run_status(error)
        for directory in directories:
            start = _session_start(params, status, trial, started)
            _write_events(directory / ENDED_FILE, [start, _session_end(status)])
            (directory / STARTED_FILE).unlink(missing_ok=True)


def _trial_name(run_dir: Path, config: Mapping[str, Any]) -> str:
    """The run's directory below the outputs folder (the run's name in `tensorboard --logdir
    outputs`): unique, so that runs with the same hparams stay apart in the table."""
    outputs = config.get("paths", {}).get("outputs_dir")
    if outputs and run_dir.resolve().is_relative_to(Path(outputs).resolve()):
        return run_dir.resolve().relative_to(Path(outputs).resolve()).as_posix()
    return str(run_dir)


def _session_start(
    params: Mapping[str, bool | int | float | str], status: str, trial: str, started: float
) -> Summary:
    info = plugin_data_pb2.SessionStartInfo(group_name=trial, start_time_secs=started)
    for name, value in {**params, "status": status}.items():
        if isinstance(value, bool):  # before int: a bool is an int to Python
            info.hparams[name].bool_value = value
        elif isinstance(value, int | float):
            info.hparams[name].number_value = value
        else:
            info.hparams[name].string_value = value
    data = plugin_data_pb2.HParamsPluginData(session_start_info=info)
    return _summary(metadata.SESSION_START_INFO_TAG, data)


def _session_end(status: str) -> Summary:
    plugin_status = PLUGIN_STATUS.get(status, api_pb2.STATUS_UNKNOWN)
    info = plugin_data_pb2.SessionEndInfo(status=plugin_status, end_time_secs=time.time())
    data = plugin_data_pb2.HParamsPluginData(session_end_info=info)
    return _summary(metadata.SESSION_END_INFO_TAG, data)


def _summary(tag: str, data: plugin_data_pb2.HParamsPluginData) -> Summary:
    value = Summary.Value(
        tag=tag, metadata=metadata.create_summary_metadata(data), tensor=metadata.NULL_TENSOR
    )
    return Summary(value=[value])


def _write_events(path: Path, summaries: Sequence[Summary]) -> None:
    """An event file written whole under a name TensorBoard skips (no `tfevents` in it), then
    renamed: a TensorBoard reading the directory meanwhile never sees half a file."""
    events = [Event(wall_time=time.time(), file_version="brain.Event:2")]
    events += [Event(wall_time=time.time(), summary=summary) for summary in summaries]
    file = io.BytesIO()
    records = RecordWriter(file)
    for event in events:
        records.write(event.SerializeToString())
    write_replacing(path, path.parent, file.getvalue())
