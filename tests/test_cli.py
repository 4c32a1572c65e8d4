"""The commands a user types: the default run and bad input as subprocesses, a multirun through
train.py's entry in the test's process."""

import csv
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from tests.in_process import RunHere

Run = Callable[..., subprocess.CompletedProcess[str]]


def only_dir(parent: Path) -> Path:
    children = [p for p in parent.iterdir() if p.is_dir()]
    assert len(children) == 1, children
    return children[0]


def test_default_run_reaches_97_percent(run_volt: Run, tmp_path: Path) -> None:
    result = run_volt([])
    assert result.returncode == 0, result.stderr[-3000:]
    run_dir = only_dir(tmp_path / "outputs" / "train" / "runs")
    metrics = json.loads((run_dir / "metrics.json").read_text())["metrics"]
    assert metrics["test/acc"] >= 0.97
    assert f"Run directory: {run_dir}" in result.stdout.replace("\n", "")
    assert "accelerator=cpu (CPU) devices=1" in result.stdout.replace("\n", " ")
    assert (run_dir / "train.log").read_text().count("Seed set to 42") == 1
    assert (run_dir / ".hydra" / "overrides.yaml").is_file()


def test_multirun_has_one_directory_per_job_and_a_summary(
    run_volt_here: RunHere, tmp_path: Path
) -> None:
    # In this process: Hydra's basic launcher runs the jobs in the sweep's process anyway.
    result = run_volt_here(
        [
            "-m",
            "model.optimizer.lr=1e-3,1e-2",
            "data.batch_size=32,64",
            "trainer.max_epochs=1",
            "callbacks.progress_bar=null",
            "callbacks.model_summary=null",
        ]
    )
    assert result.returncode == 0, result.stderr[-3000:]
    sweep = only_dir(tmp_path / "outputs" / "train" / "multiruns")
    jobs = sorted(p.name for p in sweep.iterdir() if p.is_dir())
    # <job number>_<what the sweep varies>: a person can tell the jobs apart by name, with
    # nothing every job shares (trainer.max_epochs=1) in it
    assert jobs[0] == "0_data.batch_size=32,model.optimizer.lr=0.001"
    assert jobs[3] == "3_data.batch_size=64,model.optimizer.lr=0.01"
    with (sweep / "summary.csv").open() as f:
        rows = list(csv.DictReader(f))
    best_first = [float(r["val/acc_best"]) for r in rows]
    assert best_first == sorted(best_first, reverse=True)  # ranked by the watched metric
    rows.sort(key=lambda r: int(r["job"]))
    assert [r["job"] for r in rows] == ["0", "1", "2", "3"]
    assert {r["data.batch_size"] for r in rows} == {"32", "64"}
    assert all(r["status"] == "completed" and float(r["test/acc"]) > 0.5 for r in rows)
    for job, row in zip(jobs, rows, strict=True):
        assert any((sweep / job).glob("events.out.tfevents.*"))  # the job's TensorBoard run
        # Each job trained with its own values, not the config's defaults.
        resolved = yaml.safe_load((sweep / job / "config_resolved.yaml").read_text())
        assert str(resolved["data"]["batch_size"]) == row["data.batch_size"]
        assert f"data.batch_size={resolved['data']['batch_size']}" in job
        assert f"model.optimizer.lr={resolved['model']['optimizer']['lr']}" in job


# Each kind of override Hydra cannot compose, `model=nonexistent` among them, is run the same way
# in tests/config/test_composition_errors.py.
@pytest.mark.parametrize(
    ("override", "message"),
    [
        (
            "nonexistent_key=1",
            "nonexistent_key=1: the train config has no key or config group 'nonexistent_key';"
            " known: ",
        ),
        # Volt's value checks (a fresh interpreter imports torch for them): trainer=gpu here;
        # data.batch_size=many, precision=16 and the rest in tests/test_bad_inputs.py, through
        # train.py's entry in its process.
        ("trainer=gpu", "no CUDA GPU is visible"),
        ("compile=fast", "compile=fast: config group compile has no option 'fast'; options: "),
    ],
)
def test_bad_override_fails_early_and_clearly(
    override: str, message: str, run_volt: Run, tmp_path: Path
) -> None:
    """Whether Hydra cannot compose it or volt's checks refuse it: one line, exit status 2."""
    result = run_volt([override], timeout=60)
    assert result.returncode == 2, result.stderr
    assert len(result.stderr.splitlines()) == 1, result.stderr
    assert result.stderr.startswith("volt: config error: "), result.stderr
    assert message in result.stderr
    assert not (tmp_path / "outputs").exists()  # refused before any directory was made


# test_bad_inputs' `ckpt_path=missing.ckpt` makes the same check through volt.eval's entry in the
# test's process; this one sees a fresh interpreter print nothing else.
@pytest.mark.slow  # an interpreter that imports torch: 6-14 s on 2 cores
def test_eval_of_missing_checkpoint_is_one_clear_line(run_volt: Run, tmp_path: Path) -> None:
    result = run_volt(["ckpt_path=nowhere.ckpt"], module="volt.eval", timeout=60)
    assert result.returncode == 2
    assert "ckpt_path='nowhere.ckpt' is not valid: use an existing checkpoint file" in result.stderr
    assert "Traceback" not in result.stderr


def test_conf_is_found_from_any_directory(run_volt_here: RunHere, tmp_path: Path) -> None:
    """Hydra's config path is the project's conf/, not one relative to where the user stands:
    train.py's entry run from another folder (in this process; Hydra finds conf/ from the file
    that holds the entry, as in `python /path/to/train.py`)."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    result = run_volt_here(["debug=fdr", "callbacks.progress_bar=null"], cwd=elsewhere)
    assert result.returncode == 0, result.stderr[-2000:]
    run_dir = only_dir(tmp_path / "outputs" / "train" / "runs")
    # conf/debug/fdr.yaml was read: one batch of each loop, nothing saved.
    assert "Running in `fast_dev_run` mode" in (run_dir / "train.log").read_text()
    assert not (run_dir / "checkpoints").exists()
    assert not list(elsewhere.iterdir())  # nothing written where the user stood


@pytest.mark.parametrize(
    ("module", "args"),
    [
        (None, ["model=nope"]),  # an unknown option
        (None, ["trainer.max_epoch=3"]),  # an unknown key
        (None, ["+foo.bar=1"]),  # a key added to nothing
        (None, ["--cfg", "job"]),
        (None, ["--help"]),
        ("volt.eval", ["ckpt_path=x", "+foo=1"]),
        ("volt.eval", ["--help"]),
    ],
)
def test_what_needs_only_the_config_imports_no_torch(
    module: str | None, args: list[str], tmp_path: Path
) -> None:
    """Composition errors, --cfg and --help answer before torch and Lightning are imported
    (seconds on a small machine): `-X importtime` lists every module the process imported."""
    command = [sys.executable, "-X", "importtime"]
    command += ["-m", module] if module else ["train.py"]
    result = subprocess.run(
        [*command, *args, f"paths.outputs_dir={tmp_path}"],
        cwd=Path(__file__).parent.parent,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    imported = {line.rpartition("|")[2].strip() for line in result.stderr.splitlines()}
    assert "hydra" in imported and "volt.config.composition" in imported
    assert not {"torch", "lightning"} & imported, result.stderr[-2000:]
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("command", [["train.py"], ["-m", "volt.eval"]])
def test_help_into_a_closed_pipe_ends_quietly(command: list[str]) -> None:
    """`python train.py --help | head -3`: the reader may be gone before the help is written.
    Here it is gone from the start, so every write meets the closed pipe (EPIPE)."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        result = subprocess.run(
            [sys.executable, *command, "--help"],
            cwd=Path(__file__).parent.parent,
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            timeout=60,
        )
    finally:
        os.close(write_end)
    assert result.stderr == ""  # was BrokenPipeError's traceback
    assert result.returncode == 128 + signal.SIGPIPE  # as a shell reports `git log | head`


def test_eval_and_predict_say_nothing_that_does_not_concern_the_user(
    run_volt: Run, run_volt_here: RunHere, tmp_path: Path
) -> None:
    # The run to evaluate, in this process (it saves a fresh interpreter's torch import); the
    # command under test in its own, which shows what a user would see.
    trained = run_volt_here(["trainer.max_epochs=1", "name=t", "callbacks.progress_bar=null"])
    assert trained.returncode == 0, trained.stderr[-3000:]
    last = tmp_path / "outputs" / "train" / "runs" / "t" / "checkpoints" / "last.ckpt"
    predicted = run_volt([f"ckpt_path={last}", "mode=predict"], module="volt.eval")
    assert predicted.returncode == 0, predicted.stderr[-3000:]
    said = predicted.stdout + predicted.stderr
    # The training callbacks' states eval has no use for, its loader's indices, a torch API
    # Lightning calls: none of the user's business.
    for chatter in ("not restoring", "Couldn't infer the batch indices", "LeafSpec", "Test metric"):
        assert chatter not in said


def help_groups(*args: str) -> dict[str, list[str]]:
    """The "Configuration groups" of `python train.py --help`: group -> options."""
    result = subprocess.run(
        [sys.executable, "train.py", "--help", *args],
        cwd=Path(__file__).parent.parent,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    listed = result.stdout.split("(group=option)\n\n", 1)[1].split("\n\n", 1)[0]
    return {
        group: options.split(", ")
        for group, _, options in (line.partition(": ") for line in listed.splitlines())
    }


def test_help_lists_the_options_of_each_group() -> None:
    """Each file of a group is an option (`group=file`), but for conf/callbacks/: there the files
    that hold callbacks are entries that default, eval and experiments include."""
    conf = Path(__file__).parent.parent / "conf"
    groups = help_groups()
    assert groups.pop("callbacks") == ["default", "eval", "none"]
    for path in (conf / "callbacks").glob("*.yaml"):
        if path.stem not in ("default", "eval", "none"):  # each holds an entry of its own name
            assert next(iter(yaml.safe_load(path.read_text()))) == path.stem, path.name
    expected = {
        folder.name: sorted(p.stem for p in folder.glob("*.yaml"))
        for folder in conf.iterdir()
        if folder.is_dir() and folder.name not in ("callbacks", "hydra")
    }
    assert groups == {group: options for group, options in expected.items() if options}


def test_help_lists_the_options_of_an_added_config_dir(tmp_path: Path) -> None:
    """A user's config folder (--config-dir) adds options; a callbacks file of theirs is an
    entry, as volt's are. (Hydra 1.3.8's help lists no folder that hydra.searchpath adds.)"""
    (tmp_path / "callbacks").mkdir()
    (tmp_path / "model").mkdir()
    entry = {"timer": {"_target_": "lightning.pytorch.callbacks.Timer"}}
    (tmp_path / "callbacks" / "timer.yaml").write_text(yaml.safe_dump(entry))
    (tmp_path / "model" / "mine.yaml").write_text(yaml.safe_dump({"_target_": "mine.Model"}))
    groups = help_groups("--config-dir", str(tmp_path))
    assert groups["callbacks"] == ["default", "eval", "none"]
    assert "mine" in groups["model"] and "mlp" in groups["model"]


@pytest.mark.slow  # a run in a fresh interpreter: 20-40 s on 2 cores
def test_a_run_whose_console_reader_goes_away_stops_as_sigpipe_would(tmp_path: Path) -> None:
    """`python train.py | head`: once the run has its record, the reader goes away; the next
    print stops the run, recorded as interrupted by SIGPIPE, exit 141, no traceback (rich's
    own answer was exit 1, no word and no record)."""
    from volt.config import PROJECT_ROOT

    run_json = tmp_path / "outputs" / "train" / "runs" / "piped" / "run.json"
    command = [sys.executable, "train.py", "name=piped", "trainer.max_epochs=3"]
    with subprocess.Popen(
        [*command, f"paths.outputs_dir={tmp_path / 'outputs'}"],
        cwd=PROJECT_ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    ) as process:
        deadline = time.monotonic() + 180
        while not run_json.exists():
            assert process.poll() is None and time.monotonic() < deadline
            time.sleep(0.2)
        assert process.stdout is not None
        process.stdout.close()  # as `head` does once it has its lines
        _, err = process.communicate(timeout=240)
    assert process.returncode == 128 + signal.SIGPIPE, err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    record = json.loads(run_json.read_text())
    assert (record["status"], record["signal"]) == ("interrupted", "SIGPIPE"), record
