"""A logger whose package is not installed: one line naming the pip command, before anything is
written."""

import importlib.util
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from omegaconf import DictConfig

from volt.config import PROJECT_ROOT
from volt.config.validation import check_config
from volt.errors import ConfigError

PIP = "pip install -e '.[loggers]'"


@pytest.mark.parametrize(
    ("logger", "package"), [("mlflow", "mlflow"), ("wandb", "wandb"), ("[many,wandb]", "wandb")]
)
def test_check_config_names_the_pip_command(
    logger: str,
    package: str,
    compose_config: Callable[..., DictConfig],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    cfg = compose_config("train", [f"logger={logger}"])
    check_config(cfg)  # installed here
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name == package else find_spec(name, *a),
    )
    with pytest.raises(ConfigError, match=rf"^logger\.{package} .* {package} package") as error:
        check_config(cfg)
    assert PIP in str(error.value)


@pytest.mark.slow  # a process of its own: 5 s alone, half a minute on a busy 2-core machine
def test_train_stops_with_one_line_and_writes_nothing(tmp_path: Path) -> None:
    # `import mlflow` fails and find_spec says it is not there, as without the package.
    code = (
        "import runpy, sys; sys.modules['mlflow'] = None; sys.argv[0] = 'train.py';"
        " runpy.run_path('train.py', run_name='__main__')"
    )
    outputs = tmp_path / "outputs"
    command = [sys.executable, "-c", code, "logger=mlflow", f"paths.outputs_dir={outputs}"]
    result = subprocess.run(
        command, cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 2, result.stderr[-2000:]
    assert result.stderr.strip().splitlines()[-1] == (
        "volt: config error: logger.mlflow (volt.loggers.mlflow.MLflowRunLogger) needs the mlflow"
        f" package, which is not installed: {PIP}, or choose another logger"
        " (e.g. logger=tensorboard)"
    )
    assert not outputs.exists()
