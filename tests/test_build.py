"""Precision, compile (incl. CUDA graphs), profiler and finders: real runs, on CPU where they can
run there, on a GPU behind the `gpu` marker (`pytest -m gpu`)."""

import json
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import yaml
from omegaconf import DictConfig

from volt.config.validation import PRECISIONS
from volt.eval import evaluate
from volt.train import train

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
Compose = Callable[..., DictConfig]


def short(fast: list[str], *extra: str) -> list[str]:
    return [*fast, "trainer.max_epochs=1", "logger=csv", *extra]


def on_one_gpu(fast: list[str], *extra: str) -> list[str]:
    # trainer=gpu picks one device; named here too, so that no config change can make these
    # tests spread over every GPU of a bigger machine.
    return short(fast, "trainer=gpu", "trainer.devices=1", *extra)


def test_profiler_writes_a_trace(compose_config: Compose, fast: list[str]) -> None:
    cfg = compose_config("train", short(fast, "debug=profiler", "test=false"))
    train(cfg)
    traces = list((Path(cfg.paths.output_dir) / "tensorboard" / "profiler").glob("*.pt.trace.json"))
    assert traces, "no trace written"
    events = json.loads(traces[0].read_text())["traceEvents"]
    assert any("aten::addmm" in str(e.get("name")) for e in events)


@pytest.mark.parametrize("tune", ["batch_size", "lr"])
def test_finders_run_before_fit(tune: str, compose_config: Compose, fast: list[str]) -> None:
    # The LR finder needs its 100 steps within max_epochs: 19 batches an epoch here.
    epochs = "trainer.max_epochs=6" if tune == "lr" else "trainer.max_epochs=1"
    cfg = compose_config(
        "train", [*short(fast, f"tune={tune}", "test=false", "trainer=cpu"), epochs]
    )
    metrics = train(cfg)
    assert metrics["val/acc"] > 0.5
    run_dir = Path(cfg.paths.output_dir)
    recorded = yaml.safe_load((run_dir / "config_resolved.yaml").read_text())
    stored = torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)["volt_config"]
    if tune == "lr":
        assert (run_dir / "lr_find.png").stat().st_size > 0
        assert recorded["model"]["optimizer"]["lr"] != 0.003  # the finder's value, not the config's
        assert stored["model"]["optimizer"]["lr"] == recorded["model"]["optimizer"]["lr"]
    else:
        # doubled from 64 up to, not past, the 1,258 training samples
        assert 64 < recorded["data"]["batch_size"] <= 1258
        assert stored["data"]["batch_size"] == recorded["data"]["batch_size"]


@pytest.mark.slow
def test_compiled_checkpoint_has_plain_keys_and_evaluates_uncompiled(
    compose_config: Compose, fast: list[str]
) -> None:
    _compiled_round_trip(compose_config, short(fast, "compile=default", "trainer=cpu"))


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


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("precision", PRECISIONS)
def test_every_precision_trains_on_gpu(
    precision: str, compose_config: Compose, fast: list[str]
) -> None:
    if precision.startswith("bf16") and not torch.cuda.is_bf16_supported():
        pytest.skip("GPU without bf16")
    # Pure fp16 has no 1e-8: Adam's default eps rounds to 0 and the update divides by zero.
    eps = ["model.optimizer.eps=1e-4"] if precision == "16-true" else []
    cfg = compose_config("train", [*on_one_gpu(fast, f"precision={precision}", "model=cnn"), *eps])
    metrics = train(cfg)
    assert all(v == v for v in metrics.values())  # no NaN
    # Pure fp16 keeps no fp32 master weights: small updates round away and it learns slowly
    # (measured on an H100: test/acc 0.23 after 2 epochs); it must still beat chance (0.1).
    assert metrics["test/acc"] > (0.15 if precision == "16-true" else 0.5)


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("mode", ["default", "reduce-overhead", "max-autotune"])
def test_every_compile_mode_trains_on_gpu(
    mode: str, compose_config: Compose, fast: list[str]
) -> None:
    cfg = compose_config(
        "train", on_one_gpu(fast, "precision=bf16-mixed", "model=cnn", f"compile={mode}")
    )
    metrics = train(cfg)
    assert metrics["test/acc"] > 0.5


@pytest.mark.gpu
@needs_cuda
def test_compiled_checkpoint_round_trip_on_gpu(compose_config: Compose, fast: list[str]) -> None:
    _compiled_round_trip(
        compose_config,
        on_one_gpu(fast, "precision=bf16-mixed", "compile=reduce-overhead"),
    )


@pytest.mark.gpu
@needs_cuda
def test_profiler_trace_has_cuda_kernels(compose_config: Compose, fast: list[str]) -> None:
    cfg = compose_config("train", on_one_gpu(fast, "debug=profiler", "test=false"))
    train(cfg)
    traces = list((Path(cfg.paths.output_dir) / "tensorboard" / "profiler").glob("*.pt.trace.json"))
    events = json.loads(traces[0].read_text())["traceEvents"]
    assert any(e.get("cat") == "kernel" for e in events)


@pytest.mark.gpu
@needs_cuda
def test_channels_last_and_memory_metrics_on_gpu(compose_config: Compose, fast: list[str]) -> None:
    cfg = compose_config(
        "train",
        [
            *on_one_gpu(fast, "precision=bf16-mixed", "model=cnn", "model.channels_last=true"),
            "callbacks.gpu_memory.log_every_n_steps=5",
            "trainer.log_every_n_steps=5",
        ],
    )
    train(cfg)
    header = (Path(cfg.paths.output_dir) / "csv" / "metrics.csv").read_text().splitlines()[0]
    assert "gpu_mem/cuda0_peak_allocated_gib" in header
