"""The sweep summary read from job directories as a sweep leaves them, while it runs and after."""

import csv
import io
import json
import sys
from pathlib import Path

import optuna
import pytest
from optuna.distributions import CategoricalDistribution, FloatDistribution, distribution_to_json

from volt.runs import lock_run_dir
from volt.sweeps.plots import PLOT_FILE, plot_search
from volt.sweeps.pruning import open_journal
from volt.sweeps.summary import (
    CSV_FILE,
    MARKDOWN_FILE,
    main,
    objective,
    print_sweep_summary,
    rank_rows,
    write_sweep_summary,
)

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def make_job(sweep: Path, number: int, lr: str, record: dict | None) -> Path:
    job = sweep / f"{number}_model.optimizer.lr={lr}"
    (job / ".hydra").mkdir(parents=True)
    (job / ".hydra" / "overrides.yaml").write_text(f"- model.optimizer.lr={lr}\n- name=s\n")
    if record is not None:
        (job / "metrics.json").write_text(json.dumps(record))
    return job


def done(status: str, best: float) -> dict:
    return {"status": status, "metrics": {"val/acc": best - 0.01, "val/acc_best": best}}


@pytest.fixture
def sweep(tmp_path: Path) -> Path:
    """Six jobs, one in each state; job 4's lock held by this process, as a running job's is."""
    sweep = tmp_path / "sweep"
    sweep.mkdir()
    (sweep / "multirun.yaml").write_text("task:\n  watch: val/acc\n  mode: max\n")
    make_job(sweep, 0, "0.001", done("completed", 0.5))
    make_job(sweep, 1, "0.01", done("completed", 0.9))
    make_job(sweep, 2, "1e-06", done("pruned", 0.1))
    make_job(sweep, 3, "10", {"status": "failed", "error": "ValueError: lr | too big"})
    make_job(sweep, 4, "0.02", None)
    make_job(sweep, 5, "0.03", None)
    return sweep


def test_jobs_are_ranked_by_the_objective_with_how_each_ended(sweep: Path) -> None:
    running = lock_run_dir(next(sweep.glob("4_*")))
    rows = write_sweep_summary(sweep)
    assert running is not None
    running.release()
    with (sweep / CSV_FILE).open() as f:
        table = list(csv.DictReader(f))
    assert [r["job"] for r in table] == [r["job"] for r in rows]
    assert [(r["job"], r["status"]) for r in table] == [
        ("1", "completed"),
        ("0", "completed"),
        ("2", "pruned"),
        ("3", "failed"),
        ("4", "running"),
        ("5", "interrupted"),
    ]
    assert table[0]["model.optimizer.lr"] == "0.01" and table[0]["val/acc_best"] == "0.9"
    assert table[3]["error"] == "ValueError: lr | too big"
    assert table[0]["dir"] == str(next(sweep.glob("1_*")))
    lines = (sweep / MARKDOWN_FILE).read_text().splitlines()
    # name=s, which every job shares, is said once under the table, not in a column.
    assert lines[0].startswith("| job | status | model.optimizer.lr | val/acc |")
    assert lines[0].endswith("| dir |") and lines[1].startswith("|---|")
    assert lines[2].startswith("| 1 | completed | 0.01 | 0.89 |")
    assert lines[-1] == "Every job: name=s"
    assert "lr \\| too big" in lines[5]  # a | inside a cell does not split the row
    assert not list(sweep.glob("*.partial"))


def test_a_lower_is_better_metric_ranks_the_other_way(sweep: Path) -> None:
    (sweep / "multirun.yaml").write_text("task:\n  watch: val/acc\n  mode: min\n")
    rows = write_sweep_summary(sweep)
    assert [r["job"] for r in rows] == ["2", "0", "1", "3", "4", "5"]


def test_the_summary_on_demand(sweep: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([str(sweep)]) == 0
    out = capsys.readouterr().out
    assert "interrupted" in out and "pruned" in out
    assert (sweep / CSV_FILE).is_file() and (sweep / MARKDOWN_FILE).is_file()
    assert not (sweep / PLOT_FILE).exists()  # a grid sweep: no study to plot
    assert main([str(sweep / "missing")]) == 2
    assert main([str(sweep / "0_model.optimizer.lr=0.001")]) == 2


def test_the_summary_prints_on_an_ascii_console(
    sweep: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A narrow console that is no terminal (a log file): the table keeps its width, so no cell
    # is cut ("comple..."), and nothing needs a character ASCII lacks.
    out = io.BytesIO()
    monkeypatch.setattr(sys, "stdout", io.TextIOWrapper(out, encoding="ascii"))
    monkeypatch.setenv("COLUMNS", "40")
    print_sweep_summary(sweep)
    sys.stdout.flush()
    text = out.getvalue().decode("ascii")
    assert "| interrupted |" in text and "| model.optimizer.lr |" in text
    assert "\\u" not in text


def test_a_search_plots_its_objective_against_each_parameter(tmp_path: Path) -> None:
    space = {
        "model.optimizer.lr": FloatDistribution(1e-5, 1e-1, log=True),
        "data.batch_size": CategoricalDistribution([32, 64]),
    }
    study = optuna.create_study(
        storage=open_journal(tmp_path), study_name="s", direction="maximize"
    )
    study.set_user_attr("search_space", {k: distribution_to_json(d) for k, d in space.items()})
    for value in (0.2, 0.5, 0.9):
        trial = study.ask(space)
        study.tell(trial, value)
    trial = study.ask(space)
    trial.report(0.1, 0)
    study.tell(trial, state=optuna.trial.TrialState.PRUNED)
    study.ask(space)  # still running: not drawn
    path = plot_search(tmp_path)
    assert path == tmp_path / PLOT_FILE
    assert path.read_bytes()[:8] == PNG_SIGNATURE
    import matplotlib.image

    height, width, _ = matplotlib.image.imread(path).shape
    assert width > height  # one panel per parameter, side by side


def test_a_handed_over_sweeps_config_reads_no_environment(
    sweep: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """multirun.yaml is data: an interpolation in it is not resolved (it would put the reader's
    variable into the table); the sweep is then listed in job order."""
    monkeypatch.setenv("VOLT_TEST_SECRET", "hunter2")
    (sweep / "multirun.yaml").write_text("task:\n  watch: ${oc.env:VOLT_TEST_SECRET}\n")
    rows = write_sweep_summary(sweep)
    assert objective(sweep, rows) == (None, "max")  # resolved, the column would be "hunter2"
    assert [row["job"] for row in rows] == ["0", "1", "2", "3", "4", "5"]
    written = (sweep / CSV_FILE).read_text() + (sweep / MARKDOWN_FILE).read_text()
    assert "hunter2" not in written


def test_the_watched_metric_is_found_under_the_name_the_jobs_log(tmp_path: Path) -> None:
    """task.watch=val/loss, the jobs' module logs val_loss: ranked by val_loss_best."""
    (tmp_path / "multirun.yaml").write_text("task:\n  watch: val/loss\n  mode: min\n")
    rows = [{"job": "0", "val_loss": "0.3", "val_loss_best": "0.2"}]
    assert objective(tmp_path, rows) == ("val_loss_best", "min")


def test_jobs_whose_module_logs_only_a_validation_loss_rank_by_it(tmp_path: Path) -> None:
    """The default task watches val/acc (higher is better); the jobs' best checkpoints followed
    the val_loss their module logs instead, lower is better: so does the summary."""
    (tmp_path / "multirun.yaml").write_text("task:\n  watch: val/acc\n  mode: max\n")
    rows = [{"job": "0", "val_loss_best": "0.08"}, {"job": "1", "val_loss_best": "0.02"}]
    for row in rows:
        row["val_loss"] = row["val_loss_best"]
    column, mode = objective(tmp_path, rows)
    assert (column, mode) == ("val_loss_best", "min")
    assert [row["job"] for row in rank_rows(rows, column, mode)] == ["1", "0"]


def test_summary_md_says_once_what_every_job_shares(sweep: Path) -> None:
    for job in sweep.iterdir():
        if job.is_dir():
            overrides = job / ".hydra" / "overrides.yaml"
            overrides.write_text(overrides.read_text() + "- trainer.max_epochs=3\n")
    write_sweep_summary(sweep)
    markdown = (sweep / MARKDOWN_FILE).read_text().splitlines()
    assert "trainer.max_epochs" not in markdown[0]  # not a column of the table
    assert markdown[-1].startswith("Every job: ") and "trainer.max_epochs=3" in markdown[-1]
    assert "trainer.max_epochs" in (sweep / CSV_FILE).read_text().splitlines()[0]


def test_a_sampled_value_reads_as_its_job_folder_names_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """summary.md and the console show a search's sampled float to 4 significant digits;
    summary.csv keeps it whole, and a value someone typed stays as typed. Without a watched
    metric the title ranks by none (it said 'best max None first')."""
    make_job(tmp_path, 0, "0.0006573214670265974", done("completed", 0.5))
    make_job(tmp_path, 1, "0.12345", done("completed", 0.9))
    print_sweep_summary(tmp_path)
    printed, markdown = capsys.readouterr().out, (tmp_path / MARKDOWN_FILE).read_text()
    assert "│ 0.0006573 " in printed and "0.00065732" not in printed and "│ 0.12345 " in printed
    assert "| 0.0006573 |" in markdown and "| 0.12345 |" in markdown
    assert "0.0006573214670265974" in (tmp_path / CSV_FILE).read_text()
    assert "Sweep summary (2 jobs) " in printed  # no watched metric: ranked by none
