"""DataParallelStrategy: one process, each forward split across GPUs, the rest as on one device.

Without two GPUs (CI) these run the real Trainer through the one-device fallback, the merging of
replica outputs, and the split path itself with CPU stand-ins for the three CUDA-only transfers
(scatter, weight broadcast, threaded apply); the strategy's own code and torch's `replicate` run as
they do on GPUs. The `gpu` tests run the real thing on two GPUs against one.
"""

import logging
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import pytest
import torch
import torch.nn.functional as F
from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.strategies import ParallelStrategy, Strategy
from torch import Tensor, nn
from torch.utils.data import DataLoader, TensorDataset
from torchmetrics.classification import MulticlassAccuracy
from typing_extensions import override

import volt.strategies.data_parallel as data_parallel
from volt.strategies.data_parallel import DataParallelStrategy, gather_replica_outputs

FEATURES, CLASSES = 8, 4
STEPS, BATCH = 20, 16

two_gpus = pytest.mark.skipif(
    torch.cuda.device_count() < 2, reason="needs two or more CUDA devices"
)


class ForwardCall(NamedTuple):
    input_device: torch.device
    module_device: torch.device
    batch_size: int
    on_main_thread: bool
    inference_mode: bool


class TinyClassifier(LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(FEATURES, 32), nn.ReLU(), nn.Linear(32, CLASSES))
        self.train_acc = MulticlassAccuracy(CLASSES)
        self.val_acc = MulticlassAccuracy(CLASSES)
        # Replicas share these lists with the root (shallow copies) and append from their threads.
        self.forward_calls: list[ForwardCall] = []
        self.losses: list[float] = []
        self.logits_dtypes: list[torch.dtype] = []

    @override
    def forward(self, x: Tensor) -> Tensor:
        self.record_forward_call(x)
        return self.net(x)

    def record_forward_call(self, x: Tensor) -> None:
        on_main_thread = threading.current_thread() is threading.main_thread()
        call = ForwardCall(
            x.device, self.device, len(x), on_main_thread, torch.is_inference_mode_enabled()
        )
        self.forward_calls.append(call)

    def loss_and_logits(self, x: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
        logits = self(x)
        return F.cross_entropy(logits, y), logits

    @override
    def training_step(self, batch: list[Tensor], batch_idx: int) -> Tensor:
        x, y = batch
        loss, logits = self.loss_and_logits(x, y)
        self.train_acc(logits, y)
        self.log("train/loss", loss)
        self.log("train/acc", self.train_acc, on_step=False, on_epoch=True)
        self.losses.append(loss.item())
        self.logits_dtypes.append(logits.dtype)
        return loss

    @override
    def validation_step(self, batch: list[Tensor], batch_idx: int) -> None:
        x, y = batch
        loss, logits = self.loss_and_logits(x, y)
        self.val_acc(logits, y)
        self.log("val/loss", loss)
        self.log("val/acc", self.val_acc)

    @override
    def predict_step(self, batch: list[Tensor], batch_idx: int) -> Tensor:
        return self(batch[0])

    @override
    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


class LossInForward(TinyClassifier):
    """Computes the loss inside forward, so each replica returns the mean loss of its own chunk."""

    @override
    def forward(self, x: Tensor, y: Tensor | None = None) -> Any:
        self.record_forward_call(x)
        logits = self.net(x)
        if y is None:
            return logits
        return {"logits": logits, "loss": F.cross_entropy(logits, y)}

    @override
    def loss_and_logits(self, x: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
        out = self(x, y)
        return out["loss"], out["logits"]


class NetCalledDirectly(TinyClassifier):
    @override
    def loss_and_logits(self, x: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
        logits = self.net(x)
        return F.cross_entropy(logits, y), logits


class Run(NamedTuple):
    model: TinyClassifier
    device_ids: list[int]
    metrics: dict[str, float]
    state_dict: dict[str, Tensor]
    predictions: Tensor


def random_data(samples: int, seed: int) -> TensorDataset:
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(samples, FEATURES, generator=generator)
    y = torch.randint(0, CLASSES, (samples,), generator=generator)
    return TensorDataset(x, y)


def train(
    tmp_path: Path,
    strategy: Strategy | str,
    model_class: type[TinyClassifier] = TinyClassifier,
    batch_size: int = BATCH,
    **trainer_kwargs: Any,
) -> Run:
    """Fit one epoch of STEPS batches, validate, checkpoint and predict; same seed every call."""
    torch.manual_seed(0)
    model = model_class()
    trainer = Trainer(
        strategy=strategy,
        default_root_dir=tmp_path,
        max_epochs=1,
        num_sanity_val_steps=0,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        **trainer_kwargs,
    )
    train_data, val_data = random_data(STEPS * batch_size, seed=1), random_data(48, seed=2)
    trainer.fit(
        model, DataLoader(train_data, batch_size=batch_size), DataLoader(val_data, batch_size)
    )
    metrics = {name: value.item() for name, value in trainer.callback_metrics.items()}
    checkpoint = tmp_path / "model.ckpt"
    trainer.save_checkpoint(checkpoint)
    state_dict = torch.load(checkpoint, weights_only=True)["state_dict"]
    predictions = trainer.predict(model, DataLoader(val_data, batch_size=batch_size))
    assert predictions is not None
    return Run(
        model,
        trainer.device_ids,
        metrics,
        state_dict,
        torch.cat([batch.cpu() for batch in predictions]),
    )


def assert_same_training(run: Run, reference: Run, rtol: float, atol: float) -> None:
    """Same losses, logged values and metrics, checkpoint and predictions as the reference run."""
    assert len(run.model.losses) == len(reference.model.losses) == STEPS
    torch.testing.assert_close(run.model.losses, reference.model.losses, rtol=rtol, atol=atol)
    assert run.metrics.keys() == reference.metrics.keys() >= {"train/acc", "val/loss", "val/acc"}
    for name, value in run.metrics.items():
        assert value == pytest.approx(reference.metrics[name], rel=rtol, abs=atol), name
    # Same keys in the same order: the LightningModule was saved, not a wrapper around it.
    assert list(run.state_dict) == list(reference.state_dict)
    for name, tensor in run.state_dict.items():
        torch.testing.assert_close(
            tensor.cpu(), reference.state_dict[name].cpu(), rtol=rtol, atol=atol
        )
    torch.testing.assert_close(run.predictions, reference.predictions, rtol=rtol, atol=atol)


# --- the fallback to one device ------------------------------------------------------------------


@pytest.mark.parametrize("devices", [1, 2])
def test_without_two_gpus_trains_as_one_device_with_a_warning(
    tmp_path: Path, devices: int, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="volt.strategies.data_parallel"):
        run = train(tmp_path / "dp", DataParallelStrategy(), accelerator="cpu", devices=devices)
    reference = train(tmp_path / "single", "auto", accelerator="cpu", devices=1)

    # One line of the log (no UserWarning with its source line), once: not again for predict.
    said = [r.getMessage() for r in caplog.records if "needs two or more CUDA" in r.getMessage()]
    assert len(said) == 1 and "\n" not in said[0]
    assert run.device_ids == [0]
    assert all(call.on_main_thread for call in run.model.forward_calls)
    assert_same_training(run, reference, rtol=0, atol=0)


def test_the_one_process_reads_whole_batches() -> None:
    # Anything sharding data by `distributed_sampler_kwargs` must give the one process every sample.
    trainer = Trainer(strategy=DataParallelStrategy(), accelerator="cpu", devices=2, logger=False)

    assert trainer.distributed_sampler_kwargs == {"num_replicas": 1, "rank": 0}


# --- merging the replicas' outputs ---------------------------------------------------------------


class Prediction(NamedTuple):
    logits: Tensor
    loss: Tensor


def test_gather_concatenates_batch_tensors_in_replica_order() -> None:
    chunks = [torch.arange(6.0).view(3, 2), torch.arange(6.0, 10.0).view(2, 2)]

    merged = gather_replica_outputs(chunks, [3, 2], torch.device("cpu"))

    torch.testing.assert_close(merged, torch.arange(10.0).view(5, 2))


def test_gather_turns_per_replica_losses_into_the_whole_batch_mean() -> None:
    per_sample = torch.tensor([1.0, 2.0, 3.0, 10.0, 20.0])
    # torch.chunk splits 5 samples over 2 devices unevenly: the means of [1, 2, 3] and [10, 20].
    replica_means = [per_sample[:3].mean(), per_sample[3:].mean()]

    merged = gather_replica_outputs(replica_means, [3, 2], torch.device("cpu"))

    assert merged.dim() == 0
    torch.testing.assert_close(merged, per_sample.mean())
    equal_split = gather_replica_outputs(replica_means, [4, 4], torch.device("cpu"))
    torch.testing.assert_close(equal_split, torch.stack(replica_means).mean())


def test_gather_backpropagates_each_replica_its_share_of_the_loss() -> None:
    replica_losses = [torch.tensor(2.0, requires_grad=True), torch.tensor(4.0, requires_grad=True)]

    gather_replica_outputs(replica_losses, [3, 1], torch.device("cpu")).backward()

    assert [loss.grad for loss in replica_losses] == [torch.tensor(0.75), torch.tensor(0.25)]


def test_gather_averages_low_precision_losses_in_float32() -> None:
    replica_losses = [
        torch.tensor(1.0, dtype=torch.bfloat16),
        torch.tensor(2.0, dtype=torch.bfloat16),
    ]

    merged = gather_replica_outputs(replica_losses, [2, 1], torch.device("cpu"))

    assert merged.dtype == torch.float32
    torch.testing.assert_close(merged, torch.tensor(4.0 / 3.0))


@pytest.mark.parametrize(
    ("wrap", "unwrap"),
    [
        pytest.param(
            lambda logits, loss: {"loss": loss, "logits": logits},
            lambda out: (out["logits"], out["loss"]),
            id="dict",
        ),
        pytest.param(lambda logits, loss: (logits, loss), tuple, id="tuple"),
        pytest.param(lambda logits, loss: [logits, loss], tuple, id="list"),
        pytest.param(Prediction, tuple, id="namedtuple"),
    ],
)
def test_gather_merges_containers_entry_by_entry(
    wrap: Callable[[Tensor, Tensor], Any], unwrap: Callable[[Any], tuple[Tensor, Tensor]]
) -> None:
    replica_outputs = [
        wrap(torch.zeros(2, CLASSES), torch.tensor(3.0)),
        wrap(torch.ones(1, CLASSES), torch.tensor(6.0)),
    ]

    merged = gather_replica_outputs(replica_outputs, [2, 1], torch.device("cpu"))

    assert type(merged) is type(replica_outputs[0])
    logits, loss = unwrap(merged)
    torch.testing.assert_close(logits, torch.cat([torch.zeros(2, CLASSES), torch.ones(1, CLASSES)]))
    torch.testing.assert_close(loss, torch.tensor(4.0))


def test_gather_keeps_none_and_refuses_what_it_cannot_merge() -> None:
    cpu = torch.device("cpu")
    assert gather_replica_outputs([{"aux": None}, {"aux": None}], [1, 1], cpu) == {"aux": None}
    with pytest.raises(TypeError, match="forward returned a float"):
        gather_replica_outputs([0.5, 0.7], [1, 1], cpu)


# --- the split path, with CPU stand-ins for the CUDA transfers -----------------------------------


class SplitOnCPU(DataParallelStrategy):
    """Keeps the Trainer's several CPU devices, which DataParallelStrategy would collapse to one."""

    @override
    def setup_environment(self) -> None:
        ParallelStrategy.setup_environment(self)


def scatter_on_cpu(
    args: tuple[Any, ...], kwargs: dict[str, Any], devices: Sequence[torch.device]
) -> tuple[tuple[Any, ...], tuple[dict[str, Any], ...]]:
    """torch's scatter_kwargs without the copies: tensors chunked along dim 0, the rest shared."""

    def chunks(obj: Any) -> list[Any]:
        if isinstance(obj, Tensor):
            return list(obj.chunk(len(devices)))
        if isinstance(obj, dict):
            return [
                dict(zip(obj, values, strict=True))
                for values in zip(*map(chunks, obj.values()), strict=False)
            ]
        if isinstance(obj, tuple):
            return [tuple(values) for values in zip(*map(chunks, obj), strict=False)]
        return [obj] * len(devices)

    inputs = chunks(args)
    return tuple(inputs), tuple(chunks(kwargs) if kwargs else [{}] * len(inputs))


def broadcast_on_cpu(
    tensors: Sequence[Tensor], devices: Sequence[int], detach: bool = False
) -> list[list[Tensor]]:
    """Every replica gets views of the root's tensors, so their gradients add up in the root's."""
    return [
        [tensor.detach() if detach else tensor.view_as(tensor) for tensor in tensors]
        for _ in devices
    ]


def parallel_apply_on_cpu(
    modules: Sequence[nn.Module],
    inputs: Sequence[Any],
    kwargs_tup: Sequence[dict[str, Any]],
    devices: Sequence[torch.device],
) -> list[Any]:
    """torch's parallel_apply without CUDA streams: one new thread per replica, grad mode copied."""
    grad_enabled = torch.is_grad_enabled()
    results: dict[int, Any] = {}

    def work(i: int) -> None:
        torch.set_grad_enabled(grad_enabled)
        try:
            results[i] = modules[i](*inputs[i], **kwargs_tup[i])
        except Exception as error:
            results[i] = error

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(modules))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for result in results.values():
        if isinstance(result, Exception):
            raise result
    return [results[i] for i in range(len(modules))]


@pytest.fixture
def cpu_transfers(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(data_parallel, "scatter_kwargs", scatter_on_cpu)
    monkeypatch.setattr(data_parallel, "parallel_apply", parallel_apply_on_cpu)
    # `torch.nn.parallel.replicate` names the function; the module behind it is in sys.modules.
    replicate_module = sys.modules["torch.nn.parallel.replicate"]
    monkeypatch.setattr(replicate_module, "_broadcast_coalesced_reshape", broadcast_on_cpu)
    monkeypatch.setattr(replicate_module, "_get_device_index", lambda device, optional: 0)


@pytest.mark.usefixtures("cpu_transfers")
def test_split_forward_trains_as_one_device(tmp_path: Path) -> None:
    run = train(tmp_path / "dp", SplitOnCPU(), accelerator="cpu", devices=2)
    reference = train(tmp_path / "single", "auto", accelerator="cpu", devices=1)

    assert run.device_ids == [0, 1]
    replica_calls = [call for call in run.model.forward_calls if not call.on_main_thread]
    assert len(replica_calls) == len(run.model.forward_calls) > 0
    assert {call.batch_size for call in replica_calls} == {BATCH // 2}
    # Lightning validates and predicts under inference mode; replicas on other threads must too.
    assert any(call.inference_mode for call in replica_calls)
    assert "forward" not in vars(run.model), "the step's forward routing outlived the step"
    assert_same_training(run, reference, rtol=1e-5, atol=1e-6)


@pytest.mark.usefixtures("cpu_transfers")
def test_split_forward_averages_losses_by_chunk_size(tmp_path: Path) -> None:
    # 7 samples over 2 devices split 4 + 3; a plain mean of the two replica losses would be off.
    run = train(tmp_path / "dp", SplitOnCPU(), LossInForward, 7, accelerator="cpu", devices=2)
    reference = train(tmp_path / "single", "auto", LossInForward, 7, accelerator="cpu", devices=1)

    assert {call.batch_size for call in run.model.forward_calls} == {4, 3}
    assert_same_training(run, reference, rtol=1e-5, atol=1e-6)


@pytest.mark.usefixtures("cpu_transfers")
def test_split_warns_when_a_step_bypasses_forward(tmp_path: Path) -> None:
    with pytest.warns(UserWarning, match=r"training_step never called self\(...\)"):
        run = train(tmp_path, SplitOnCPU(), NetCalledDirectly, accelerator="cpu", devices=2)

    # Only predict_step called forward, and it was split.
    assert run.model.forward_calls
    assert not any(call.on_main_thread for call in run.model.forward_calls)


def compile_net(model: TinyClassifier) -> nn.Module:
    model.net = torch.compile(model.net)
    return model


def compile_net_in_place(model: TinyClassifier) -> nn.Module:
    model.net.compile()
    return model


@pytest.mark.parametrize("compile_model", [compile_net, compile_net_in_place])
@pytest.mark.usefixtures("cpu_transfers")
def test_split_refuses_compiled_modules(
    tmp_path: Path, compile_model: Callable[[TinyClassifier], nn.Module]
) -> None:
    compiled = compile_model(TinyClassifier())
    trainer = Trainer(
        strategy=SplitOnCPU(),
        accelerator="cpu",
        devices=2,
        max_steps=1,
        default_root_dir=tmp_path,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )

    with pytest.raises(ValueError, match="cannot split compiled modules"):
        trainer.fit(compiled, DataLoader(random_data(BATCH, seed=1), batch_size=BATCH))


# --- two real GPUs -------------------------------------------------------------------------------


@pytest.fixture
def exact_fp32_matmuls() -> Iterator[None]:
    """TF32 would round a matmul over a chunk differently from one over the whole batch."""
    previous = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")
    yield
    torch.set_float32_matmul_precision(previous)


@pytest.mark.gpu
@two_gpus
@pytest.mark.usefixtures("exact_fp32_matmuls")
def test_two_gpus_train_as_one_gpu(tmp_path: Path) -> None:
    run = train(tmp_path / "dp", DataParallelStrategy(), accelerator="gpu", devices=2)
    reference = train(tmp_path / "single", "auto", accelerator="gpu", devices=1)

    assert run.device_ids == [0, 1]
    replica_calls = [call for call in run.model.forward_calls if not call.on_main_thread]
    assert {call.input_device for call in replica_calls} == {
        torch.device("cuda", 0),
        torch.device("cuda", 1),
    }
    # A replica's `self.device` is its own GPU, so forward may allocate on it.
    assert all(call.module_device == call.input_device for call in replica_calls)
    # fp32 on both sides; the difference is only the order of float sums in smaller matmuls.
    assert_same_training(run, reference, rtol=1e-4, atol=1e-5)


@pytest.mark.gpu
@two_gpus
@pytest.mark.usefixtures("exact_fp32_matmuls")
def test_two_gpus_average_losses_by_chunk_size(tmp_path: Path) -> None:
    run = train(
        tmp_path / "dp", DataParallelStrategy(), LossInForward, 7, accelerator="gpu", devices=2
    )
    reference = train(tmp_path / "single", "auto", LossInForward, 7, accelerator="gpu", devices=1)

    assert {call.batch_size for call in run.model.forward_calls} == {4, 3}
    assert_same_training(run, reference, rtol=1e-4, atol=1e-5)


@pytest.mark.gpu
@two_gpus
@pytest.mark.parametrize(
    ("precision", "dtype"), [("16-mixed", torch.float16), ("bf16-mixed", torch.bfloat16)]
)
def test_two_gpus_run_replicas_in_the_autocast_dtype(
    tmp_path: Path, precision: str, dtype: torch.dtype
) -> None:
    run = train(
        tmp_path / "dp", DataParallelStrategy(), accelerator="gpu", devices=2, precision=precision
    )
    reference = train(
        tmp_path / "single", "auto", accelerator="gpu", devices=1, precision=precision
    )

    # parallel_apply alone would re-enter autocast in float16 whatever the precision.
    assert set(run.model.logits_dtypes) == {dtype}
    assert all(torch.isfinite(torch.tensor(run.model.losses)))
    # Half-precision matmuls over chunks round differently from one over the whole batch.
    torch.testing.assert_close(run.model.losses, reference.model.losses, rtol=2e-2, atol=2e-2)


@pytest.mark.gpu
@two_gpus
def test_two_gpus_refuse_sync_batchnorm(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="sync_batchnorm"):
        train(tmp_path, DataParallelStrategy(), accelerator="gpu", devices=2, sync_batchnorm=True)
