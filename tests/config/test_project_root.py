"""conf/ and outputs/ come from the project whose train.py runs, not from the clone the package
was installed from (volt.config.find_project_root): one venv, two clones, each its own runs."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from volt.config import CONF_DIR, PACKAGE_DIR, PROJECT_ROOT, ROOT_VARIABLE


@pytest.fixture
def clone(tmp_path: Path) -> Path:
    """A second checkout without a package of its own: train.py and conf/, with seed changed so
    that reading this conf/ shows."""
    root = tmp_path / "clone"
    root.mkdir()
    shutil.copy(PROJECT_ROOT / "train.py", root)
    shutil.copytree(CONF_DIR, root / "conf", ignore=shutil.ignore_patterns("local"))
    train_yaml = root / "conf" / "train.yaml"
    train_yaml.write_text(train_yaml.read_text().replace("\nseed: 42\n", "\nseed: 7\n"))
    return root


def run(
    command: list[str], cwd: Path, root_variable: str | None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != ROOT_VARIABLE}
    if root_variable is not None:
        env[ROOT_VARIABLE] = root_variable
    return subprocess.run(
        [sys.executable, *command],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def composed(result: subprocess.CompletedProcess[str]) -> dict:
    assert result.returncode == 0, result.stderr[-2000:]
    return yaml.safe_load(result.stdout)


def test_train_py_of_a_clone_reads_its_own_conf(clone: Path, tmp_path: Path) -> None:
    # The variable names this checkout, as it would in a process a volt process started: the
    # script's own folder still wins.
    result = run(
        [str(clone / "train.py"), "--cfg", "job", "--resolve"], tmp_path, str(PROJECT_ROOT)
    )
    config = composed(result)
    assert config["paths"]["root_dir"] == str(clone)
    assert config["paths"]["outputs_dir"] == str(clone / "outputs")
    assert config["seed"] == 7
    warning = f"volt: warning: conf/ and outputs/ come from {clone} (script), but the volt package"
    assert warning in result.stderr
    assert f"imported from {PACKAGE_DIR}, not {clone / 'src' / 'volt'}" in result.stderr


def test_module_entry_reads_the_working_directory(clone: Path) -> None:
    """`python -m volt.eval` (and volt-train / volt-eval) have no train.py: the working directory
    holds the project if it has conf/."""
    config = composed(run(["-m", "volt.eval", "--cfg", "job", "--resolve"], clone, None))
    assert config["paths"]["root_dir"] == str(clone)


def test_processes_volt_starts_follow_the_variable(clone: Path) -> None:
    """A DDP rank (`python -m volt.rank`) or a submitit job inherits the
    variable its parent set at import, and uses it even where it starts in another project."""
    probe = "from volt.config import PROJECT_ROOT; print(PROJECT_ROOT)"
    result = run(["-c", probe], PROJECT_ROOT, str(clone))
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == str(clone)
    assert "volt: warning" not in result.stderr  # the parent warned already


def test_the_installed_checkout_gives_no_warning(tmp_path: Path) -> None:
    result = run([str(PROJECT_ROOT / "train.py"), "--cfg", "job", "--resolve"], tmp_path, None)
    assert composed(result)["paths"]["root_dir"] == str(PROJECT_ROOT)
    assert "volt: warning" not in result.stderr


@pytest.mark.slow
def test_a_run_in_a_clone_writes_into_the_clone(clone: Path, tmp_path: Path) -> None:
    result = run(
        [str(clone / "train.py"), "debug=fdr", "callbacks.progress_bar=null", "name=in-clone"],
        tmp_path,
        str(PROJECT_ROOT),
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    run_dir = clone / "outputs" / "train" / "runs" / "in-clone"
    resolved = yaml.safe_load((run_dir / "config_resolved.yaml").read_text())
    assert resolved["paths"]["output_dir"] == str(run_dir)
    assert resolved["seed"] == 7
    assert not (PROJECT_ROOT / "outputs" / "train" / "runs" / "in-clone").exists()
