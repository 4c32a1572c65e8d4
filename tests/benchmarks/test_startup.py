import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest
import torch

from volt.config import PROJECT_ROOT


@pytest.fixture(scope="module")
def startup(load_benchmark: Callable[[str], ModuleType]) -> ModuleType:
    return load_benchmark("startup")


def test_import_statements_are_the_top_level_imports_only(startup: ModuleType) -> None:
    source = "import os\nfrom a.b import c as d\nx = 1\nif x:\n    import json\nimport sys\n"
    assert startup.import_statements(source) == "import os\nfrom a.b import c as d\nimport sys"
    assert startup.import_statements((PROJECT_ROOT / "train.py").read_text()) == (
        "from volt.train import main"
    )


def test_sides_that_ran_different_epochs_are_refused(startup: ModuleType, tmp_path: Path) -> None:
    run = tmp_path / "volt-0" / "train" / "runs" / "x" / "checkpoints"
    run.mkdir(parents=True)
    torch.save({"epoch": 1}, run / "last.ckpt")  # Lightning counts from 0: two epochs
    log = tmp_path / "bare.log"
    log.write_text("Testing...\nepochs run: 2\n")
    bare = startup.harness.Finished(status=0, wall_s=1.0, cpu_s=1.0, log=log, timeout_s=None)
    startup.check_same_epochs(tmp_path, [bare], 2)
    with pytest.raises(RuntimeError, match=r"volt \[2\], bare \[2\], not 3 each"):
        startup.check_same_epochs(tmp_path, [bare], 3)
    torch.save({"epoch": 0}, run / "last.ckpt")
    with pytest.raises(RuntimeError, match=r"volt \[1\], bare \[2\]"):
        startup.check_same_epochs(tmp_path, [bare], 2)


@pytest.mark.slow  # four fresh interpreters importing torch and Lightning, two of them training
def test_times_train_py_and_the_bare_script_on_the_cpu(tmp_path: Path) -> None:
    command = [sys.executable, "benchmarks/startup.py", "--epochs", "1", "--repeats", "1"]
    command += ["--warmup", "0", "--accelerator", "cpu", "--dir", str(tmp_path)]
    command += ["--json", str(tmp_path / "startup.json")]
    result = subprocess.run(
        command,
        cwd=PROJECT_ROOT,
        # One thread: on a loaded 2-core machine a second one spins waiting for a core.
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    report = json.loads((tmp_path / "startup.json").read_text())
    assert report["volt_command"][:2] == ["python", "train.py"]
    for side in ("volt", "bare"):
        wall, imports = report[side]["wall_s"]["median"], report[side]["imports_s"]["median"]
        # Measured, not how long: a fast machine imports torch and Lightning in under a second.
        # (Not `imports < wall`: they are two processes, and on a loaded machine the one that
        # only imports can take the longer.)
        assert imports > 0 and wall > 0
        assert report[side]["after_imports_s"]["median"] == pytest.approx(wall - imports)
        assert report[side]["cpu_s"]["median"] > 0
    difference = report["volt"]["wall_s"]["median"] - report["bare"]["wall_s"]["median"]
    assert report["volt_minus_bare_s"]["wall_s"] == pytest.approx(difference)
    # Each side really ran its job, into the folder it was given.
    (work,) = tmp_path.glob("startup-*")
    (volt_run,) = work.glob("volt-0/train/runs/*")
    assert json.loads((volt_run / "metrics.json").read_text())["status"] == "completed"
    assert (work / "bare-0" / "checkpoints" / "last.ckpt").is_file()
    assert any((work / "bare-0" / "tensorboard").iterdir())
    assert "volt - bare" in result.stdout and "after imports" in result.stdout
