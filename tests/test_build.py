"""The toggles a run's objects are built with (precision, channels_last, compile, the profiler)
take effect: what the training step ran is read back by probes (tests/step_probes.py), not the
config that asked for it. On the CPU where torch runs them there, on a GPU behind the `gpu` marker
(`pytest -m gpu`)."""

import json
import logging
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch
from omegaconf import DictConfig, OmegaConf

from tests.step_probes import read_record
from volt.build import apply_toggles, build_training
from volt.callbacks.progress_bar import RichProgressBar
from volt.config.validation import PRECISIONS
from volt.hook_dispatch import NoProfiler
from volt.training import train

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
Compose = Callable[..., DictConfig]

PROBES = "tests.step_probes"
FIRST_STEP = f"+callbacks.first_step={{_target_:{PROBES}.RecordFirstStep}}"
COMPILATION = f"+callbacks.compilation={{_target_:{PROBES}.RecordCompilation}}"
CHANNELS_LAST = "channels_last=true"
# precision -> (dtype of every parameter, dtype out of every Linear / Conv2d in the step)
DTYPES = {
    "64-true": ("torch.float64", "torch.float64"),
    "32-true": ("torch.float32", "torch.float32"),
    "16-mixed": ("torch.float32", "torch.float16"),
    "bf16-mixed": ("torch.float32", "torch.bfloat16"),
    "16-true": ("torch.float16", "torch.float16"),
    "bf16-true": ("torch.bfloat16", "torch.bfloat16"),
}
# Pure fp16 has no 1e-8: Adam's default eps rounds to 0 and the update divides by zero.
FP16_EPS = ["model.optimizer.eps=1e-4"]


def short(fast: list[str], *extra: str) -> list[str]:
    return [*fast, "trainer.max_epochs=1", "logger=csv", *extra]


def probed(*extra: str) -> list[str]:
    """Two training batches on the CPU and nothing else (no validation, test, callbacks or
    loggers but the probes, whose package is trusted): all a probe needs to see the step, and
    one graph for compile to build."""
    return [
        "trainer=cpu",
        "trainer.max_epochs=1",
        "trainer.limit_train_batches=2",
        "trainer.limit_val_batches=0",
        "trainer.num_sanity_val_steps=0",
        "test=false",
        "callbacks=none",
        "logger=none",
        "trusted_targets=[tests]",
        *extra,
    ]


def on_one_gpu(fast: list[str], *extra: str) -> list[str]:
    # trainer=gpu picks one device; named here too, so that no config change can make these
    # tests spread over every GPU of a bigger machine.
    return short(fast, "trainer=gpu", "trainer.devices=1", "trusted_targets=[tests]", *extra)


@pytest.fixture
def fresh_dynamo() -> Iterator[None]:
    """TorchDynamo's caches, counters and CUDA graph trees emptied before and after: a graph
    compiled by an earlier test is neither reused nor counted, and the recompile limit
    (torch._dynamo.config.cache_size_limit) is not reached across tests."""
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def assert_dtypes(run_dir: Path, precision: str) -> None:
    parameters, activations = DTYPES[precision]
    step = read_record(run_dir, "first_step")
    assert step["parameter_dtypes"] == [parameters]
    assert step["layers"], "no Linear or Conv2d ran in the step"
    for layer in step["layers"]:
        assert layer["output_dtype"] == activations, layer
        assert layer["autocast"] == precision.endswith("-mixed"), layer


def assert_channels_last(run_dir: Path, expected: bool) -> None:
    """Every convolution over more than one channel (with one, both layouts are the same
    strides) got its input and weight in the layout asked for."""
    convolutions = [
        layer
        for layer in read_record(run_dir, "first_step")["layers"]
        if layer["weight_channels_last"] is not None and layer["input_shape"][1] > 1
    ]
    assert convolutions, "no convolution over more than one channel ran"
    for layer in convolutions:
        assert layer["input_channels_last"] is expected, layer
        assert layer["weight_channels_last"] is expected, layer


# Not 16-mixed: on the CPU Lightning trains bf16-mixed instead (it warns); the GPU test has it.
@pytest.mark.parametrize("precision", [p for p in PRECISIONS if p != "16-mixed"])
def test_precision_sets_the_dtypes_inside_the_step(precision: str, compose_config: Compose) -> None:
    eps = FP16_EPS if precision == "16-true" else []
    cfg = compose_config("train", probed(f"precision={precision}", FIRST_STEP, *eps))
    train(cfg)
    assert_dtypes(Path(cfg.paths.output_dir), precision)


@pytest.mark.parametrize("channels_last", [True, False])
def test_channels_last_lays_out_the_convolutions(
    channels_last: bool, compose_config: Compose
) -> None:
    toggle = [CHANNELS_LAST] if channels_last else []
    cfg = compose_config("train", probed("model=cnn", FIRST_STEP, *toggle))
    train(cfg)
    assert_channels_last(Path(cfg.paths.output_dir), channels_last)


@pytest.mark.parametrize("mode", ["default", "off"])
def test_compile_compiles_the_net_that_trains(
    mode: str, compose_config: Compose, fresh_dynamo: None
) -> None:
    cfg = compose_config("train", probed(f"compile={mode}", COMPILATION))
    train(cfg)
    compilation = read_record(cfg.paths.output_dir, "compilation")
    if mode == "off":
        assert compilation["compiled_modules"] == []
        assert compilation["graphs"] == 0
    else:
        assert compilation["compiled_modules"] == ["net"]  # task.module: the net alone
        assert compilation["graphs"] > 0  # TorchDynamo traced the forward: it ran compiled


@pytest.mark.parametrize("channels_last", [False, True])
def test_a_model_without_the_tasks_submodule_is_said_only_where_a_toggle_acts(
    channels_last: bool, caplog: pytest.LogCaptureFixture
) -> None:
    """A module of the user's own under the default task (task.module=net) has no `net`: one
    line says that compile and channels_last act on the whole module, when one of them acts."""
    from tests.lightning_docs_task import LitRegressor

    compile_off = {"mode": None, "fullgraph": False, "dynamic": None}
    toggles = {"task": {"module": "net"}, "compile": compile_off, "channels_last": channels_last}
    with caplog.at_level(logging.INFO, logger="volt"):
        apply_toggles(OmegaConf.create(toggles), LitRegressor())
    assert ("LitRegressor has no such submodule" in caplog.text) is channels_last


def test_profiler_writes_a_trace(compose_config: Compose, fast: list[str]) -> None:
    cfg = compose_config("train", short(fast, "debug=profiler", "test=false"))
    train(cfg)
    traces = list((Path(cfg.paths.output_dir) / "tensorboard" / "profiler").glob("*.pt.trace.json"))
    assert traces, "no trace written"
    events = json.loads(traces[0].read_text())["traceEvents"]
    assert any("aten::addmm" in str(e.get("name")) for e in events)


def test_what_volt_adds_to_the_trainer_leaves_the_config_as_it_was(
    compose_config: Compose,
) -> None:
    # Without checkpoint callbacks volt switches Lightning's own off (enable_checkpointing), as an
    # argument: a key added to the config is refused inside Hydra 1.4's copy of the run's config.
    cfg = compose_config("train", ["callbacks=none", "logger=none"])
    before = OmegaConf.to_container(cfg)
    trainer = build_training(cfg, {}).trainer
    assert OmegaConf.to_container(cfg) == before
    assert trainer.checkpoint_callback is None
    # nor Lightning's own progress bar in place of volt's (callbacks.progress_bar=null)
    assert trainer.progress_bar_callback is None
    default = build_training(compose_config("train", ["logger=none"]), {}).trainer
    assert isinstance(default.progress_bar_callback, RichProgressBar)


def test_without_a_chosen_profiler_every_hook_shares_one_empty_context(
    compose_config: Compose,
) -> None:
    trainer = build_training(compose_config("train", ["callbacks=none", "logger=none"]), {}).trainer
    assert isinstance(trainer.profiler, NoProfiler)
    context = trainer.profiler.profile("[Callback]A.on_train_batch_end")
    assert context is trainer.profiler.profile("run_training_batch")
    with context, context:  # nested, as Lightning's hooks nest
        pass
    # The control: a profiler the config chooses is Lightning's, each context its own.
    chosen = compose_config("train", ["callbacks=none", "logger=none", "+trainer.profiler=simple"])
    profiler = build_training(chosen, {}).trainer.profiler
    assert not isinstance(profiler, NoProfiler)
    assert profiler.profile("a") is not profiler.profile("a")
    # Lightning's barebones mode refuses every profiler, so none is added there.
    barebones = [
        *("callbacks=none", "logger=none", "+trainer.barebones=true"),
        *("trainer.num_sanity_val_steps=0", "trainer.log_every_n_steps=null"),
        *("+trainer.enable_progress_bar=false", "+trainer.enable_model_summary=false"),
    ]
    assert build_training(compose_config("train", barebones), {}).trainer.barebones


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("precision", PRECISIONS)
def test_every_precision_trains_on_gpu(
    precision: str, compose_config: Compose, fast: list[str]
) -> None:
    if precision.startswith("bf16") and not torch.cuda.is_bf16_supported():
        pytest.skip("GPU without bf16")
    eps = FP16_EPS if precision == "16-true" else []
    cfg = compose_config(
        "train", [*on_one_gpu(fast, f"precision={precision}", "model=cnn", FIRST_STEP), *eps]
    )
    metrics = train(cfg)
    assert_dtypes(Path(cfg.paths.output_dir), precision)
    assert all(v == v for v in metrics.values())  # no NaN
    # Pure fp16 keeps no fp32 master weights: small updates round away and it learns slowly
    # (measured on an H100: test/acc 0.23 after 2 epochs); it must still beat chance (0.1).
    assert metrics["test/acc"] > (0.15 if precision == "16-true" else 0.5)


@pytest.mark.gpu
@needs_cuda
# Not max-autotune here: it is reduce-overhead plus torch's search for the fastest kernels, 128 s
# of the GPU suite on an H100 for this CNN; volt hands the mode to torch.compile as it does these
# (compile=max-autotune composes and reaches torch.compile in the CPU suite).
@pytest.mark.parametrize("mode", ["default", "reduce-overhead"])
def test_compile_modes_train_on_gpu(
    mode: str, compose_config: Compose, fast: list[str], fresh_dynamo: None
) -> None:
    cfg = compose_config(
        "train",
        on_one_gpu(fast, "precision=bf16-mixed", "model=cnn", f"compile={mode}", COMPILATION),
    )
    metrics = train(cfg)
    compilation = read_record(cfg.paths.output_dir, "compilation")
    assert compilation["compiled_modules"] == ["net"]
    assert compilation["graphs"] > 0
    # reduce-overhead replays the compiled step as CUDA graphs; default does not.
    assert compilation["cuda_graph_trees"] is (mode != "default"), compilation
    assert metrics["test/acc"] > 0.5


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
def test_channels_last_on_gpu(compose_config: Compose, fast: list[str]) -> None:
    cfg = compose_config(
        "train", on_one_gpu(fast, "precision=bf16-mixed", "model=cnn", CHANNELS_LAST, FIRST_STEP)
    )
    train(cfg)
    assert_channels_last(Path(cfg.paths.output_dir), True)
    assert_dtypes(Path(cfg.paths.output_dir), "bf16-mixed")
