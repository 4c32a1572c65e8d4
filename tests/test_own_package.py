"""A newcomer's own model and data in their clone: `python train.py model=my data=my` trains,
evaluates and predicts with nothing else typed (the clone's packages are trusted: the user runs
them already), while the same package reached from outside the clone, or named by a checkpoint,
still needs `trusted_targets`. The clone here is a copy of this project's conf/ and train.py in a
temp folder, with the user's package in its src/ (on the path as `pip install -e` puts it)."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from volt.config import PROJECT_ROOT

QUICK = ["trainer.max_epochs=2", "logger=none", "callbacks.progress_bar=null", "name=mine"]


def make_clone(root: Path, with_package: bool) -> Path:
    clone = root / "clone"
    shutil.copytree(PROJECT_ROOT / "conf", clone / "conf", ignore=shutil.ignore_patterns("local"))
    shutil.copy(PROJECT_ROOT / "train.py", clone / "train.py")
    (clone / "conf" / "model" / "my.yaml").write_text("_target_: mylab.line.LineRegressor\n")
    (clone / "conf" / "data" / "my.yaml").write_text("_target_: mylab.line.LineData\n")
    if with_package:
        write_package(clone / "src")
    return clone


def write_package(folder: Path) -> None:
    """tests/user_task.py, plain Lightning, as the package `mylab`."""
    (folder / "mylab").mkdir(parents=True)
    (folder / "mylab" / "__init__.py").write_text("")
    shutil.copy(Path(__file__).parent / "user_task.py", folder / "mylab" / "line.py")


def run(
    clone: Path, args: list[str], module: str | None, path: Path
) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", module] if module else [sys.executable, "train.py"]
    environment = {**os.environ, "PYTHONPATH": str(path)}
    environment.pop("VOLT_PROJECT_ROOT", None)  # the clone is found from the script or cwd
    return subprocess.run(
        [*command, *args, f"paths.outputs_dir={clone / 'outputs'}"],
        cwd=clone,
        env=environment,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def test_a_package_in_the_clone_trains_evaluates_and_predicts_with_no_extra_key(
    tmp_path: Path,
) -> None:
    clone = make_clone(tmp_path, with_package=True)
    trained = run(clone, ["model=my", "data=my", *QUICK], None, clone / "src")
    assert trained.returncode == 0, trained.stderr[-3000:]
    run_dir = clone / "outputs" / "train" / "runs" / "mine"
    log = (run_dir / "train.log").read_text()  # the console wraps its lines
    # The default task watches val/acc, which this module does not log: its val/loss instead.
    assert "watching val/loss (lower is better): LineRegressor logs no 'val/acc'" in log
    assert "is off" not in log
    last = run_dir / "checkpoints" / "last.ckpt"
    predicted = run(
        clone, [f"ckpt_path={last}", "mode=predict", "name=p"], "volt.eval", clone / "src"
    )
    assert predicted.returncode == 0, predicted.stderr[-3000:]
    csv = clone / "outputs" / "eval" / "runs" / "p" / "predictions.csv"
    assert len(csv.read_text().splitlines()) > 10


@pytest.mark.slow  # three runs and an eval, about a minute on 2 cores
def test_the_same_package_from_outside_the_clone_needs_trusted_targets(tmp_path: Path) -> None:
    clone = make_clone(tmp_path, with_package=False)
    elsewhere = tmp_path / "site"
    write_package(elsewhere)
    refused = run(clone, ["model=my", "data=my", *QUICK], None, elsewhere)
    assert refused.returncode == 2, refused.stderr[-3000:]
    assert "data: _target_=mylab.line.LineData is not allowed" in refused.stderr
    assert "trusted_targets=[mylab]" in refused.stderr
    trusted = run(
        clone, ["model=my", "data=my", *QUICK, "trusted_targets=[mylab]"], None, elsewhere
    )
    assert trusted.returncode == 0, trusted.stderr[-3000:]
    # A checkpoint naming it is refused alike, and the command line, not the file, trusts it.
    last = clone / "outputs" / "train" / "runs" / "mine" / "checkpoints" / "last.ckpt"
    evaluated = run(clone, [f"ckpt_path={last}"], "volt.eval", elsewhere)
    assert evaluated.returncode == 2
    assert "model: _target_=mylab.line.LineRegressor is not allowed" in evaluated.stderr
    trusting = [f"ckpt_path={last}", "trusted_targets=[mylab]"]
    evaluated = run(clone, trusting, "volt.eval", elsewhere)
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]
