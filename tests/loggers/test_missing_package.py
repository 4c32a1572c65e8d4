"""A logger whose package is not installed: one line naming the pip command, before anything is
written."""

import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from omegaconf import DictConfig

from tests.in_process import RunHere
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


def test_train_stops_with_one_line_and_writes_nothing(
    run_volt_here: RunHere, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # `import mlflow` fails and find_spec says it is not there, as without the package.
    monkeypatch.setitem(sys.modules, "mlflow", None)
    result = run_volt_here(["logger=mlflow"])
    assert result.returncode == 2, result.stderr[-2000:]
    assert result.stderr.strip().splitlines()[-1] == (
        "volt: config error: logger.mlflow (volt.loggers.mlflow.MLflowRunLogger) needs the mlflow"
        f" package, which is not installed: {PIP}, or choose another logger"
        " (e.g. logger=tensorboard)"
    )
    assert not (tmp_path / "outputs").exists()
