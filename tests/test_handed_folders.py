"""A run or sweep folder someone handed over is data (issue #41): links, FIFOs and oversized or
malformed files in it are refused in one line before volt writes anything, and every write
replaces a file rather than following what stands at its name. Each case has a control that
shows the route firing with volt's check taken out, so each case can fail."""

import ast
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import BinaryIO

import pytest
import torch
from lightning.pytorch.loggers import CSVLogger
from rich.console import Console

import volt.callbacks.prediction_writer
import volt.console
import volt.errors
import volt.folder_files
import volt.runs.lock
import volt.runs.records
from tests.in_process import RunHere
from tests.named_runs import steps_overrides
from volt.callbacks.prediction_writer import CSVPredictionWriter
from volt.checkpointing import find_latest_valid_checkpoint
from volt.config import PROJECT_ROOT
from volt.console import (
    Terminal,
    config_tree,
    exit_on_config_error,
    print_result,
    save_config_tree,
)
from volt.errors import ConfigError
from volt.folder_files import FolderFileError, check_folder, read_json_object, read_yaml
from volt.loggers.tracked_run import tracked_run
from volt.runs import lock_run_dir
from volt.runs.resume import check_same_run, plan_resume
from volt.strategies import stuck_rank_zero
from volt.sweeps import summary
from volt.sweeps.summary import CSV_FILE, MARKDOWN_FILE, write_sweep_summary

AUTHORIZED_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAA attacker"


@pytest.fixture
def victim(tmp_path: Path) -> Path:
    victim = tmp_path / "authorized_keys"
    victim.write_text("a user's file\n")
    return victim


def make_sweep(
    root: Path, overrides: str = "- seed=1\n", name: str = "sweep", job: str = "0_seed=1"
) -> Path:
    sweep = root / name
    (sweep / job / ".hydra").mkdir(parents=True)
    (sweep / job / ".hydra" / "overrides.yaml").write_text(overrides)
    (sweep / job / "metrics.json").write_text('{"status": "completed", "metrics": {}}')
    return sweep


def old_partial_writer(path: Path, within: Path, data: str | bytes) -> None:
    """How the summary wrote before: into `<name>.partial`, through whatever stood there."""
    partial = path.with_name(f"{path.name}.partial")
    with partial.open("w") as file:
        file.write(data if isinstance(data, str) else data.decode())
    partial.replace(path)


@pytest.mark.parametrize("name", [CSV_FILE, MARKDOWN_FILE])
def test_a_summary_partial_link_is_replaced_not_written_through(
    name: str, tmp_path: Path, victim: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sweep = make_sweep(tmp_path, f"- 'seed=1\n\n  {AUTHORIZED_KEY}\n\n  '\n")
    (sweep / f"{name}.partial").symlink_to(victim)
    write_sweep_summary(sweep)
    assert victim.read_text() == "a user's file\n"
    assert AUTHORIZED_KEY in (sweep / name).read_text()
    # the control: written as before, through the link
    monkeypatch.setattr(summary, "write_replacing", old_partial_writer)
    write_sweep_summary(sweep)
    assert AUTHORIZED_KEY in victim.read_text()  # on a line of its own in the CSV


def opened_as_before(path: Path, within: Path, flags: int) -> int:
    return os.open(path, flags, 0o666)


def read_in_thread(read: Callable[[], object]) -> threading.Thread:
    reading = threading.Thread(target=read, daemon=True)
    reading.start()
    reading.join(timeout=2)
    return reading


def release(fifo: Path) -> None:
    """Let a reader blocked on `fifo` go: a writer opens it (and closes it at once)."""
    os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))


def test_a_fifo_overrides_file_ends_the_summary_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    sweep = make_sweep(tmp_path)
    fifo = sweep / "0_seed=1" / ".hydra" / "overrides.yaml"
    fifo.unlink()
    os.mkfifo(fifo)
    with pytest.raises(SystemExit) as stopped:
        summary.main([str(sweep)])
    err = capsys.readouterr().err
    assert stopped.value.code == 2 and err.count("\n") == 1, err
    assert f"volt: config error: {fifo} is not a regular file (FIFO)" in err
    assert not (sweep / CSV_FILE).exists()
    # the control: opened as any file is, the summary waits for a writer that never comes
    monkeypatch.setattr(volt.folder_files, "open_regular", opened_as_before)
    reading = read_in_thread(lambda: summary.collect_jobs(sweep))
    assert reading.is_alive()
    release(fifo)
    reading.join(timeout=10)


# What Hydra, volt and Lightning's CSVLogger write in a sweep job's or a run's folder: each
# would write through a link there (Hydra's .hydra/config.yaml, volt's config_resolved.yaml and
# .lock, the logger's hparams.yaml), or wait on a FIFO (Hydra's train.log, resume's last.ckpt).
WRITTEN = [".hydra/config.yaml", "config_resolved.yaml", ".lock", "csv/hparams.yaml"]


@pytest.mark.parametrize("name", WRITTEN)
def test_a_link_out_of_a_sweep_job_or_its_logger_folder_is_refused(
    name: str, tmp_path: Path, victim: Path
) -> None:
    sweep = make_sweep(tmp_path)
    link = sweep / "0_seed=1" / name
    link.parent.mkdir(exist_ok=True)
    link.symlink_to(victim)
    with pytest.raises(FolderFileError, match=f"name=s: {link} is a symbolic link to {victim}"):
        check_folder(sweep, "name=s")
    with pytest.raises(FolderFileError, match=f"name=r: {link} is a symbolic link to {victim}"):
        check_folder(sweep / "0_seed=1", "name=r")


@pytest.mark.parametrize("name", ["train.log", "checkpoints/last.ckpt", ".hydra/overrides.yaml"])
def test_a_fifo_in_a_run_folder_is_refused(name: str, tmp_path: Path) -> None:
    fifo = tmp_path / "run" / name
    fifo.parent.mkdir(parents=True)
    os.mkfifo(fifo)
    with pytest.raises(FolderFileError, match=f"name=run: {fifo} is a FIFO"):
        check_folder(tmp_path / "run", "name=run")


def test_a_fifo_checkpoint_hangs_the_resume_lookup_without_the_folder_check(
    tmp_path: Path,
) -> None:
    """The control for checkpoints/last.ckpt (train.log: the slow test below): what resume does
    with it once the folder check is passed over, wait for a writer that never comes."""
    fifo = tmp_path / "checkpoints" / "last.ckpt"
    fifo.parent.mkdir()
    os.mkfifo(fifo)
    looking = read_in_thread(lambda: find_latest_valid_checkpoint(fifo.parent))
    assert looking.is_alive()
    release(fifo)
    looking.join(timeout=10)


def train_named(outputs: Path, *patch: str, timeout: float) -> subprocess.CompletedProcess[str]:
    start = "; ".join([*patch, "import runpy", "runpy.run_path('train.py', run_name='__main__')"])
    return subprocess.run(
        [sys.executable, "-c", start, "name=run", "logger=none", f"paths.outputs_dir={outputs}"],
        cwd=PROJECT_ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def test_a_fifo_train_log_is_refused_in_one_line(tmp_path: Path) -> None:
    run_dir = tmp_path / "outputs" / "train" / "runs" / "run"
    run_dir.mkdir(parents=True)
    os.mkfifo(run_dir / "train.log")
    done = train_named(tmp_path / "outputs", timeout=120)
    assert done.returncode == 2, done.stderr[-3000:]
    assert done.stderr.strip().splitlines() == [
        f"volt: config error: name=run: {run_dir / 'train.log'} is a FIFO: volt opens only regular"
        " files of a run or sweep folder, which may come from someone else; remove it, or use a"
        " folder volt wrote"
    ]


@pytest.mark.slow  # waits a minute for a run that never starts
def test_a_fifo_train_log_hangs_the_run_without_the_folder_check(tmp_path: Path) -> None:
    run_dir = tmp_path / "outputs" / "train" / "runs" / "run"
    run_dir.mkdir(parents=True)
    os.mkfifo(run_dir / "train.log")
    patch = "import volt.folder_files as f", "f.check_folder = lambda *a: None"
    with pytest.raises(subprocess.TimeoutExpired):
        train_named(tmp_path / "outputs", *patch, timeout=60)


# the logger warns that it will replace what its folder holds: the point of the case
@pytest.mark.filterwarnings("ignore:Experiment logs directory .* exists and is not empty")
def test_the_csv_loggers_hparams_file_is_written_through_a_link(
    tmp_path: Path, victim: Path
) -> None:
    """The control for csv/hparams.yaml: Lightning's CSVLogger, which volt cannot route through
    its own writer, writes through the link; the folder check is what keeps it out."""
    (tmp_path / "run" / "csv").mkdir(parents=True)
    (tmp_path / "run" / "csv" / "hparams.yaml").symlink_to(victim)
    logger = CSVLogger(save_dir=tmp_path / "run", name="csv", version="")
    logger.log_hyperparams({"lr": 0.1})
    logger.save()
    assert "lr: 0.1" in victim.read_text()


@pytest.mark.parametrize("kind", ["link", "fifo"])
def test_a_lock_file_that_is_no_regular_file_is_refused(
    kind: str, tmp_path: Path, victim: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    lock = tmp_path / ".lock"
    lock.symlink_to(victim) if kind == "link" else os.mkfifo(lock)
    with pytest.raises(FolderFileError, match=f"{lock} is "):
        lock_run_dir(tmp_path)
    if kind == "link":  # the control: opened as before, the lock writes through the link
        monkeypatch.setattr(volt.runs.lock, "open_regular", opened_as_before)
        lock_run_dir(tmp_path).release()  # type: ignore[union-attr]
        assert "pid" in victim.read_text()


class OldWrite:
    """A file opened at its name, as the writers below did before: through what stands there."""

    def __init__(self, path: Path, within: Path) -> None:
        self.file = path.open("wb")

    def __enter__(self) -> BinaryIO:
        return self.file

    def __exit__(self, *error: object) -> None:
        self.file.close()


def old_write(path: Path, within: Path, data: str | bytes) -> None:
    with OldWrite(path, within) as file:
        file.write(data.encode() if isinstance(data, str) else data)


def test_the_config_tree_file_replaces_a_link(
    tmp_path: Path, victim: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "config_tree.txt").symlink_to(victim)
    save_config_tree(config_tree({"seed": 1}), tmp_path / "config_tree.txt")
    assert victim.read_text() == "a user's file\n"
    assert "seed" in (tmp_path / "config_tree.txt").read_text()
    # the control: written as before, at its name, through the link
    (tmp_path / "config_tree.txt").unlink()
    (tmp_path / "config_tree.txt").symlink_to(victim)
    monkeypatch.setattr(volt.console, "write_replacing", old_write)
    save_config_tree(config_tree({"seed": 1}), tmp_path / "config_tree.txt")
    assert "seed" in victim.read_text()


def predict_two_rows(output_dir: Path) -> None:
    writer = CSVPredictionWriter(output_dir)
    trainer = SimpleNamespace(global_rank=0, world_size=1)
    writer.on_predict_start(trainer, None)  # type: ignore[arg-type]  # the two fields it reads
    writer.write_on_batch_end(trainer, None, torch.tensor([3, 4]), [0, 1], None, 0, 0)  # type: ignore[arg-type]
    writer.on_predict_end(trainer, None)  # type: ignore[arg-type]


def test_predictions_replace_a_link_and_a_failed_prediction_leaves_no_file(
    tmp_path: Path, victim: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "predictions.csv").symlink_to(victim)
    predict_two_rows(tmp_path)
    assert victim.read_text() == "a user's file\n"
    assert (tmp_path / "predictions.csv").read_bytes() == b"index,prediction\r\n0,3\r\n1,4\r\n"
    writer = CSVPredictionWriter(tmp_path / "stopped")
    trainer = SimpleNamespace(global_rank=0, world_size=1)
    writer.on_predict_start(trainer, None)  # type: ignore[arg-type]
    writer.on_exception(trainer, None, KeyboardInterrupt())  # type: ignore[arg-type]
    assert list((tmp_path / "stopped").iterdir()) == []
    # the control: opened as before, at its name, through the link
    (tmp_path / "predictions.csv").unlink()
    (tmp_path / "predictions.csv").symlink_to(victim)
    monkeypatch.setattr(volt.callbacks.prediction_writer, "replacing", OldWrite)
    predict_two_rows(tmp_path)
    assert victim.read_bytes() == b"index,prediction\r\n0,3\r\n1,4\r\n"


def test_the_watchdog_of_a_stuck_rank_zero_follows_no_run_json_link(
    tmp_path: Path, victim: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """volt.strategies.stuck_rank_zero reads run.json until the run leaves "running", then
    records the failure there and kills rank 0: a link at run.json is no run of volt's."""
    victim.write_text('{"status": "running"}\n')
    (tmp_path / "run.json").symlink_to(victim)
    with subprocess.Popen(["sleep", "60"]) as rank_zero:  # what the watchdog would kill
        assert not stuck_rank_zero.end_stuck_run(rank_zero.pid, tmp_path / "run.json", 0.2, "x")
        assert rank_zero.poll() is None and victim.read_text() == '{"status": "running"}\n'
        # the control: read and written as before, through the link
        monkeypatch.setattr(
            stuck_rank_zero, "read_json_object", lambda path, within: json.loads(path.read_text())
        )
        monkeypatch.setattr(stuck_rank_zero, "write_replacing", old_write)
        assert stuck_rank_zero.end_stuck_run(rank_zero.pid, tmp_path / "run.json", 0.2, "x")
        assert rank_zero.wait(timeout=10) == -signal.SIGKILL
    assert json.loads(victim.read_text())["status"] == "failed"


def test_a_rank_logs_line_reaches_stderr_escaped(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The line a failed rank logged, as the watchdog of a stuck rank 0 prints it: read from
    train_rank1.log, which a handed-over run folder may bring already written."""
    from volt.strategies.launcher import rank_failure, rank_log_file, said_by_failed_rank

    log_file = rank_log_file(tmp_path, 1)
    log_file.write_text(f"Rank 1 failed: {ERASES_AND_PASSES}\n")
    line = rank_failure(1, 2, str(said_by_failed_rank(log_file, 1)), log_file)

    def end_stuck_run() -> str:
        (tmp_path / "run.json").write_text('{"status": "running"}\n')
        with subprocess.Popen(["sleep", "60"]) as rank_zero:  # what the watchdog kills
            assert stuck_rank_zero.end_stuck_run(rank_zero.pid, tmp_path / "run.json", 0.2, line)
        return capsys.readouterr().err

    err = end_stuck_run()
    assert "\x1b" not in err and ascii(ERASES_AND_PASSES)[1:-1] in err, err
    # the control: printed as it was read
    monkeypatch.setattr(stuck_rank_zero, "on_one_line", lambda text: text)
    assert ERASES_AND_PASSES in end_stuck_run()


def test_resume_reads_no_fifo_overrides_and_no_bomb(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    stored = tmp_path / ".hydra" / "overrides.yaml"
    stored.parent.mkdir()
    os.mkfifo(stored)
    with pytest.raises(FolderFileError, match="is not a regular file"):
        check_same_run(tmp_path, "run", [], [])
    with pytest.raises(FolderFileError, match="is not a regular file"):
        tracked_run(str(tmp_path), "x")
    stored.unlink()
    # 1,000 aliases to one 10 kB string: 10 MB once expanded; the 50,000 of 100 kB, 5 GB
    stored.write_text(f"- &a seed={'1' * 10_000}\n" + "- *a\n" * 1000)
    with pytest.raises(FolderFileError, match=r"is not plain YAML \(.*alias"):
        check_same_run(tmp_path, "run", [], [])
    # the control: YAML's own safe loader expands every alias
    monkeypatch.setattr(volt.folder_files, "_NoAliasLoader", __import__("yaml").SafeLoader)
    assert len(read_yaml(stored, tmp_path)) == 1001


def test_an_oversized_file_is_refused_without_reading_it_whole(tmp_path: Path) -> None:
    record = tmp_path / "metrics.json"
    record.write_text(json.dumps({"status": "completed", "pad": "x" * 200}))
    with pytest.raises(FolderFileError, match="holds more than 100 bytes"):
        read_json_object(record, tmp_path, limit=100)
    assert read_json_object(record, tmp_path, limit=1000)["status"] == "completed"


@pytest.mark.parametrize(
    "text", ["[]", "[" * 200_000, "{", '{"status": "completed", "metrics": 1}']
)
def test_a_malformed_metrics_file_ends_resume_and_summary_in_one_line(
    text: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    sweep = make_sweep(tmp_path)
    job = sweep / "0_seed=1"
    (job / "metrics.json").write_text(text)
    with pytest.raises(ConfigError, match=f"{job / 'metrics.json'}"):
        plan_resume(job, "run", None)
    with pytest.raises(SystemExit) as stopped:
        summary.main([str(sweep)])
    err = capsys.readouterr().err
    assert stopped.value.code == 2 and err.count("\n") == 1, err
    assert not (sweep / CSV_FILE).exists()


def read_as_before(path: Path, within: Path, limit: int = 0) -> object:
    return json.loads(path.read_text())


@pytest.mark.parametrize(
    ("text", "failure"), [("[]", AttributeError), ("[" * 200_000, RecursionError)]
)
def test_the_old_reader_fails_on_these_files_with_a_traceback(
    text: str, failure: type[Exception], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The control for the malformed cases: read as before, the resume's own traceback."""
    (tmp_path / "metrics.json").write_text(text)
    monkeypatch.setattr(volt.runs.records, "read_json_object", read_as_before)
    with pytest.raises(failure):
        plan_resume(tmp_path, "run", None)


def test_a_non_number_metric_is_shown_as_text(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sweep = make_sweep(tmp_path)
    (sweep / "0_seed=1" / "metrics.json").write_text(
        json.dumps({"status": "completed", "metrics": {"val/acc": "\x1b[32mgreat"}})
    )
    (row,) = write_sweep_summary(sweep)
    assert row["val/acc"] == ascii("\x1b[32mgreat")
    # the control: formatted as a number, as before
    monkeypatch.setattr(summary, "_number", lambda value: f"{value:.6g}")
    with pytest.raises(ValueError, match="Unknown format code"):
        write_sweep_summary(sweep)


# The folder Hydra gives the job of sweep_command: named by the overrides that are not excluded
# from it (conf/hydra/default.yaml).
SWEEP_JOB = "0_logger=none,seed=1,test=False,trainer.limit_val_batches=1"


# `python train.py -m name=sw seed=1 ...`: a named sweep of one short job
SWEEP_ARGS = [
    *("-m", "name=sw", "seed=1", "trainer.max_steps=1", "trainer.limit_val_batches=1"),
    *("callbacks.progress_bar=null", "callbacks.model_summary=null", "logger=none", "test=false"),
]


def sweep_command(outputs: Path, *patch: str) -> list[str]:
    """SWEEP_ARGS' command, after `patch` (Python lines) ran in the process."""
    start = "; ".join([*patch, "import runpy", "runpy.run_path('train.py', run_name='__main__')"])
    return [sys.executable, "-c", start, *SWEEP_ARGS, f"paths.outputs_dir={outputs}"]


def continue_sweep(outputs: Path, *patch: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        sweep_command(outputs, *patch),
        cwd=PROJECT_ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def test_continuing_a_named_sweep_with_a_linked_job_file_is_refused(
    tmp_path: Path, victim: Path, run_volt_here: RunHere
) -> None:
    outputs = tmp_path / "outputs"
    sweep = make_sweep(outputs / "train" / "multiruns", name="sw", job=SWEEP_JOB)
    (sweep / SWEEP_JOB / ".hydra" / "config.yaml").symlink_to(victim)
    done = run_volt_here(SWEEP_ARGS)  # train.py's entry, in this process
    assert done.returncode == 2, done.stderr[-3000:]
    assert done.stderr.strip().splitlines()[-1].startswith("volt: config error: name=sw: ")
    assert victim.read_text() == "a user's file\n"


@pytest.mark.slow  # a real sweep job trains: about 30 s on 2 cores
def test_continuing_a_named_sweep_writes_through_a_link_without_the_check(
    tmp_path: Path, victim: Path
) -> None:
    outputs = tmp_path / "outputs"
    sweep = make_sweep(outputs / "train" / "multiruns", name="sw", job=SWEEP_JOB)
    (sweep / SWEEP_JOB / ".hydra" / "config.yaml").symlink_to(victim)
    patch = "import volt.folder_files as f", "f.check_folder = lambda *a: None"
    continue_sweep(outputs, *patch)
    assert victim.read_text() != "a user's file\n"  # Hydra wrote the job's config there


# Requirement 4: text from a file is escaped before a terminal or the log shows it, by one filter
# on the handlers of volt's log, and in the one line an error ends with.
ERASES_AND_PASSES = "\x1b[1A\x1b[2K\x1b[32mvolt: evaluation passed"
FORGED_LINE = "key\n2026-11-28 01:00:00 INFO    volt: evaluation passed"


def log_through_volts_handlers(tmp_path: Path, *args: object) -> str:
    """`args` logged by volt's own logging config (conf/hydra/job_logging), its file handler
    writing to tmp_path; the lines the file and the console got."""
    import logging.config

    from omegaconf import OmegaConf

    config = OmegaConf.to_container(
        OmegaConf.load(PROJECT_ROOT / "conf" / "hydra" / "job_logging" / "console_and_file.yaml")
    )
    assert isinstance(config, dict)
    tmp_path.mkdir()
    config["handlers"]["file"]["filename"] = str(tmp_path / "train.log")
    config["loggers"] = {"handed": {"handlers": ["console", "file"], "propagate": False}}
    config["root"] = {"level": "INFO", "handlers": []}
    logging.config.dictConfig(config)
    logging.getLogger("handed").warning("skipping damaged checkpoint %s: %s", *args)
    logging.getLogger("handed").warning(f"a message formatted by its caller: {args[1]}")
    for handler in logging.getLogger("handed").handlers:
        handler.close()
    return (tmp_path / "train.log").read_text()


def test_file_text_is_escaped_by_the_log_filter(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    text = log_through_volts_handlers(tmp_path / "a", FORGED_LINE, ERASES_AND_PASSES)
    assert "\x1b" not in text and len(text.splitlines()) == 2, text
    assert ascii(FORGED_LINE) in text
    # the control: without the filter the file gets the escape and the forged line
    monkeypatch.setattr(volt.errors.EscapedText, "filter", lambda self, record: True)
    text = log_through_volts_handlers(tmp_path / "b", FORGED_LINE, ERASES_AND_PASSES)
    assert "\x1b[1A" in text and "\n2026-11-28 01:00:00 INFO    volt: evaluation passed" in text


def test_an_error_quoting_file_text_ends_in_one_escaped_line(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    error = ConfigError(f"model: unexpected key {FORGED_LINE}{ERASES_AND_PASSES}")
    with pytest.raises(SystemExit):
        exit_on_config_error(error)
    err = capsys.readouterr().err
    assert "\x1b" not in err and err.count("\n") == 1, err
    assert "\\x1b[1A\\x1b[2K\\x1b[32mvolt: evaluation passed" in err
    # the control: without the escaping the terminal gets the sequence that erases the line
    monkeypatch.setattr(volt.console, "on_one_line", lambda text: text)
    with pytest.raises(SystemExit):
        exit_on_config_error(error)
    assert "\x1b[1A" in capsys.readouterr().err


def test_a_traceback_quoting_file_text_shows_it_escaped(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """An error volt did not foresee prints its traceback: a message quoting a file's text
    (a library's, say) shows the escape sequence inert."""
    try:
        raise RuntimeError(f"unexpected key {ERASES_AND_PASSES}")
    except RuntimeError as error:
        with pytest.raises(SystemExit):
            volt.console.exit_on_unexpected_error(error)
        assert "\x1b" not in capsys.readouterr().err
        # the control: printed as the traceback module writes it
        monkeypatch.setattr(volt.console, "controls_escaped", lambda text: text)
        with pytest.raises(SystemExit):
            volt.console.exit_on_unexpected_error(error)
        assert ERASES_AND_PASSES in capsys.readouterr().err


def consoles_not_through_the_terminal() -> list[str]:
    """Where src/volt makes a rich Console of its own, or takes rich's global one."""
    made = []
    for path in sorted((PROJECT_ROOT / "src" / "volt").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call):
                name = getattr(node.func, "id", getattr(node.func, "attr", None))
                if name in ("Console", "get_console"):
                    made.append(f"{path.relative_to(PROJECT_ROOT)}:{node.lineno}")
    return made


def test_every_console_of_volts_is_a_terminal() -> None:
    """One mechanism escapes what the console prints (volt.console.Terminal): a Console made
    anywhere else would print a file's escape sequences raw."""
    assert consoles_not_through_the_terminal() == []


# A cell from a file: an escape sequence, and a line break that starts a forged log line.
IN_A_CELL = ERASES_AND_PASSES + FORGED_LINE


def print_a_result(folder: Path) -> None:
    print_result({IN_A_CELL: 1.0}, folder)


def print_a_sweep_summary(folder: Path) -> None:
    # \e and \n: YAML's escapes, in a double-quoted string
    escape = IN_A_CELL.replace("\x1b", "\\e").replace("\n", "\\n")
    summary.print_sweep_summary(make_sweep(folder, f'- "seed={escape}"\n'))


@pytest.mark.parametrize("print_it", [print_a_result, print_a_sweep_summary])
def test_a_terminal_escape_from_a_file_reaches_no_console_raw(
    print_it: Callable[[Path], None],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("COLUMNS", "300")
    print_it(tmp_path / "a")
    out = capsys.readouterr().out
    # escaped before the table is laid out, the line break too: the column as wide as the
    # escaped text, on one line
    assert "\x1b" not in out and f"│ {ascii(IN_A_CELL)[1:-1]} │" in out, out
    assert not any(forges_a_line(line.strip("│ ")) for line in out.splitlines()), out
    # the control: a plain rich Console, the sequence raw on the terminal, the line forged
    monkeypatch.setattr(Terminal, "render", Console.render)
    print_it(tmp_path / "b")
    out = capsys.readouterr().out
    assert ERASES_AND_PASSES in out
    assert any(forges_a_line(line.strip("│ ")) for line in out.splitlines()), out


@pytest.mark.parametrize("value", [{1, 2}, torch.zeros(2)], ids=["set", "tensor"])
def test_a_stored_value_no_config_holds_is_refused_in_one_line(
    value: object, tmp_path: Path
) -> None:
    from omegaconf import OmegaConf
    from omegaconf.errors import UnsupportedValueType

    from volt.config.stored import check_stored_sections

    model = {"_target_": "volt.models.classifier.Classifier", "num_classes": value}
    with pytest.raises(ConfigError, match=r"model\.num_classes: the checkpoint's config holds a"):
        check_stored_sections({"model": model}, [], [], tmp_path, ["model"])
    # the control: what the rebuild did with it next, a traceback
    with pytest.raises(UnsupportedValueType):
        OmegaConf.create(model)


def test_the_summary_table_shows_a_jobs_text_escaped_and_as_no_markup(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    sweep = make_sweep(tmp_path, '- "seed=[red]x\\e[2K"\n')  # \e: YAML's escape character
    (sweep / "1_seed=2" / ".hydra").mkdir(parents=True)
    (sweep / "1_seed=2" / ".hydra" / "overrides.yaml").write_text("- seed=2\n")
    monkeypatch.setenv("COLUMNS", "300")
    summary.print_sweep_summary(sweep)
    out = capsys.readouterr().out
    assert "[red]x\\x1b[2K" in out and "\x1b" not in out, out
    # the control: the cells as they were, plain strings
    monkeypatch.setattr(summary, "Text", lambda text: text.replace("\\x1b", "\x1b"))
    summary.print_sweep_summary(sweep)
    assert "[red]x" not in capsys.readouterr().out  # read as markup


def test_wandbs_own_links_are_left_but_a_wandb_folder_that_is_a_link_out_is_refused(
    tmp_path: Path, victim: Path
) -> None:
    job = make_sweep(tmp_path) / "0_seed=1"
    (job / "wandb" / "run-1" / "logs").mkdir(parents=True)
    (job / "wandb" / "run-1" / "logs" / "core.log").symlink_to(tmp_path / "cache.log")
    check_folder(job.parent, "name=s")  # W&B links its logs to its cache: W&B's business
    shutil.rmtree(job / "wandb")
    (job / "wandb").symlink_to(victim.parent)
    with pytest.raises(FolderFileError, match=f"{job / 'wandb'} is a symbolic link to"):
        check_folder(job.parent, "name=s")


def snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def with_a_malformed_record(outputs: Path, named: str) -> Path:
    if named == "run":
        folder = outputs / "train" / "runs" / "run"
        folder.mkdir(parents=True)
        (folder / "metrics.json").write_text("[]")
        return folder
    folder = make_sweep(outputs / "train" / "multiruns", name="sw", job=SWEEP_JOB)
    (folder / SWEEP_JOB / "metrics.json").write_text("[" * 200_000)
    return folder


@pytest.mark.parametrize("named", ["run", "sweep"])
def test_a_malformed_record_is_refused_before_hydra_writes_into_the_folder(
    named: str, tmp_path: Path, run_volt_here: RunHere
) -> None:
    outputs = tmp_path / "outputs"
    folder = with_a_malformed_record(outputs, named)
    before = snapshot(folder)
    # train.py's entry in this process, with what `train_named` and `continue_sweep` run
    done = run_volt_here(SWEEP_ARGS if named == "sweep" else ["name=run", "logger=none"])
    assert done.returncode == 2, done.stderr[-3000:]
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("volt: config error: ") and "metrics.json" in line, line
    assert snapshot(folder) == before


@pytest.mark.slow  # a run that starts, to be refused later
def test_a_malformed_record_read_by_the_run_alone_is_refused_after_hydra_wrote(
    tmp_path: Path,
) -> None:
    """The control: with the checks before Hydra taken out (the record's, and the resume's,
    which reads the record too), the run's own reading refuses the file, once Hydra has written
    its .hydra/ and train.log into the folder."""
    outputs = tmp_path / "outputs"
    folder = with_a_malformed_record(outputs, "run")
    before = snapshot(folder)
    patch = (
        "import volt.hydra_callbacks as h",
        "h.read_record = lambda *a: None",
        "h.check_resume = lambda *a: None",
    )
    done = train_named(outputs, *patch, timeout=120)
    assert done.returncode == 2, done.stderr[-3000:]
    assert snapshot(folder) != before


# An extra state_dict key holding a newline and a log-formatted line (issue #41): torch's
# load_state_dict quotes unexpected keys as they are, and a resume printed its traceback.
FORGED_KEY = "w\n2026-11-28 01:00:00 INFO    volt: evaluation passed"


def forges_a_line(line: str) -> bool:
    # (rich's console wraps at spaces, and the escaped key's "'w\\n2026-11-28" holds none)
    return line.lstrip().startswith("2026-11-28 01:00:00")


def resume_with_a_forged_key(
    outputs: Path, train_here: RunHere, *patch: str
) -> subprocess.CompletedProcess[str]:
    """A named run of one step (trained in this process: only the resume is under test),
    FORGED_KEY put into each of its checkpoints, continued to two steps in a fresh interpreter;
    `patch`: Python lines run there before train.py."""
    trained = train_here(steps_overrides("handed", 1))
    assert trained.returncode == 0, trained.stderr[-3000:]
    for path in (outputs / "train" / "runs" / "handed" / "checkpoints").glob("*.ckpt"):
        checkpoint = torch.load(path, weights_only=True)
        checkpoint["state_dict"][FORGED_KEY] = torch.zeros(())
        torch.save(checkpoint, path)
    (outputs / "train" / "runs" / "handed" / "metrics.json").unlink()  # as if it was stopped
    start = "; ".join([*patch, "import runpy", "runpy.run_path('train.py', run_name='__main__')"])
    command = [sys.executable, "-c", start, "name=handed", "trainer.max_steps=2"]
    command += ["callbacks.progress_bar=null", "callbacks.model_summary=null", "logger=none"]
    command += ["test=false", f"paths.outputs_dir={outputs}"]
    return subprocess.run(
        command, cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=240, check=False
    )


def test_a_state_dict_key_with_a_newline_forges_no_line_on_resume(
    tmp_path: Path, run_volt_here: RunHere
) -> None:
    """Such a checkpoint is passed over as damaged, in one escaped line; the run starts again."""
    done = resume_with_a_forged_key(tmp_path / "outputs", run_volt_here)
    assert done.returncode == 0, done.stderr[-3000:]
    said = (done.stdout + done.stderr).splitlines()
    assert not any(forges_a_line(line) for line in said), said
    log = (tmp_path / "outputs" / "train" / "runs" / "handed" / "train.log").read_text()
    skipped = [line for line in log.splitlines() if "skipping damaged checkpoint" in line]
    assert skipped and all(ascii(FORGED_KEY) in line for line in skipped), log
    assert "\n2026-11-28 01:00:00" not in log


@pytest.mark.slow  # two runs that start: about 20 s on 2 cores
def test_a_state_dict_key_with_a_newline_forges_a_line_without_the_check(
    tmp_path: Path, run_volt_here: RunHere
) -> None:
    # Both checks off: the names' control characters, and the resume's check of names against
    # the model (which also refuses the extra key, escaped).
    patch = (
        "import volt.checkpointing.atomic_io as a",
        "a._check_weight_names = lambda *x: None",
        "import volt.runs.resume as r",
        "r.weights_disagreement = lambda *x, **k: ''",
    )
    done = resume_with_a_forged_key(tmp_path / "outputs", run_volt_here, *patch)
    assert done.returncode == 1, done.stderr[-3000:]
    assert any(forges_a_line(line) for line in done.stderr.splitlines()), done.stderr[-3000:]
