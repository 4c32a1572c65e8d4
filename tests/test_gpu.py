"""volt.gpu: the float32 matmul setting, torch.compile in place (checkpoints keep plain keys and
load into an eager net), and what volt says after a CUDA out-of-memory."""

import json
import re
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from omegaconf import DictConfig

from volt import gpu
from volt.config import PROJECT_ROOT
from volt.evaluation import evaluate
from volt.training import train

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
Compose = Callable[..., DictConfig]
GIB = 1024**3


@pytest.fixture
def matmul_precision_kept() -> Iterator[None]:
    before = torch.get_float32_matmul_precision()
    yield
    torch.set_float32_matmul_precision(before)


@pytest.mark.usefixtures("matmul_precision_kept")
def test_matmul_precision_is_set_and_reported() -> None:
    assert gpu.apply_matmul_precision("medium") == "medium"
    assert torch.get_float32_matmul_precision() == "medium"
    torch.set_float32_matmul_precision("highest")
    # None picks TF32 where tensor cores have it, and leaves the setting alone elsewhere.
    expected = "high" if gpu.has_tensor_cores_for_tf32() else "highest"
    assert gpu.apply_matmul_precision(None) == expected
    assert torch.get_float32_matmul_precision() == expected


def test_oom_message_names_batch_peak_total_and_fixes(monkeypatch: pytest.MonkeyPatch) -> None:
    # The GPU's numbers, as torch would report them on an 80 GiB card (no GPU here).
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device: 70 * GIB)
    monkeypatch.setattr(
        torch.cuda, "get_device_properties", lambda device: SimpleNamespace(total_memory=80 * GIB)
    )
    message = gpu.explain_oom(512, torch.device("cuda", 0))
    assert "\n" not in message
    assert "data.batch_size=512" in message
    assert "peak 70.0 GiB allocated of 80.0 GiB" in message
    assert "data.batch_size=256" in message
    assert "precision=bf16-mixed" in message
    assert "tune=batch_size" in message


@pytest.mark.gpu
@needs_cuda
def test_oom_message_reads_the_gpus_real_numbers() -> None:
    device = torch.device("cuda", torch.cuda.current_device())
    torch.cuda.reset_peak_memory_stats(device)
    held = torch.empty(GIB, dtype=torch.uint8, device=device)
    message = gpu.explain_oom(64, device)
    del held
    found = re.search(r"peak ([\d.]+) GiB allocated of ([\d.]+) GiB", message)
    assert found, message
    assert float(found[1]) >= 1.0
    total = torch.cuda.get_device_properties(device).total_memory / GIB
    assert float(found[2]) == pytest.approx(total, abs=0.05)


def _compiled_round_trip(compose_config: Compose, overrides: list[str]) -> None:
    cfg = compose_config("train", overrides)
    metrics = train(cfg)
    best = json.loads((Path(cfg.paths.output_dir) / "metrics.json").read_text())["best_checkpoint"]
    state = torch.load(best, weights_only=True)["state_dict"]
    assert not [k for k in state if "_orig_mod" in k]
    # Evaluate with compile off: the stored config says compile, eval builds the net eagerly.
    evaluated = evaluate(compose_config("eval", [f"ckpt_path={best}"]))
    assert evaluated["test/acc"] == pytest.approx(metrics["test/acc"], abs=1 / 270)
    assert evaluated["test/loss"] == pytest.approx(metrics["test/loss"], rel=1e-3)


def short(fast: list[str], *extra: str) -> list[str]:
    return [*fast, "trainer.max_epochs=1", "logger=csv", *extra]


@pytest.mark.slow
def test_compiled_checkpoint_has_plain_keys_and_evaluates_uncompiled(
    compose_config: Compose, fast: list[str]
) -> None:
    _compiled_round_trip(compose_config, short(fast, "compile=default", "trainer=cpu"))


@pytest.mark.gpu
@needs_cuda
def test_compiled_checkpoint_round_trip_on_gpu(compose_config: Compose, fast: list[str]) -> None:
    _compiled_round_trip(
        compose_config,
        short(
            fast,
            "trainer=gpu",
            "trainer.devices=1",
            "precision=bf16-mixed",
            "compile=reduce-overhead",
        ),
    )


def on_two_gpus(*values: object) -> Any:
    return pytest.param(
        *values, marks=pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
    )


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize(
    ("devices", "sync_batchnorm", "extra"),
    [
        (1, "true", ["model=cnn"]),
        (1, "false", ["model=cnn"]),
        on_two_gpus(2, "true", ["model=cnn"]),
        # no BatchNorm layer: nothing synchronised, the fit's compiled code kept for the test
        on_two_gpus(
            2, "true", ["model=mlp", "model.net.hidden_sizes=[]", "model.optimizer.lr=0.02"]
        ),
        # two jobs in one process: the second compiles its own, not the first's dropped graphs
        on_two_gpus(2, "true", ["-m", "model=cnn", "model.optimizer.lr=0.002,0.003"]),
    ],
)
def test_reduce_overhead_trains_under_ddp(
    tmp_path: Path, devices: int, sync_batchnorm: str, extra: list[str]
) -> None:
    """CUDA graphs under trainer=ddp (the DDP wrapper, its reducer and volt's SyncBatchNorm all in
    the step; on two GPUs the layers' collectives captured too, and the run's process groups
    destroyed at its end, pytorch/pytorch#115388): each run trains, tests, keeps its accuracy and
    exits."""
    done = subprocess.run(
        [
            sys.executable,
            "train.py",
            *extra,  # -m first: Hydra takes its flags before the overrides
            "trainer=ddp",
            f"trainer.devices={devices}",
            f"trainer.sync_batchnorm={sync_batchnorm}",
            "compile=reduce-overhead",
            "precision=bf16-mixed",
            "trainer.max_epochs=3",
            "callbacks.progress_bar=null",
            "logger=csv",
            f"paths.outputs_dir={tmp_path}",
        ],
        cwd=PROJECT_ROOT,
        capture_output=True,
        text=True,
        timeout=360,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    runs = sorted(tmp_path.glob("train/**/metrics.json"))
    assert len(runs) == (2 if "-m" in extra else 1), runs
    for run in runs:
        metrics = json.loads(run.read_text())
        assert metrics["metrics"]["test/acc"] > 0.8, metrics
