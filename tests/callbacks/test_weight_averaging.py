"""`ema=<decay>`: validation, checkpoints, test and eval see the average of the weights; training
goes on from the trained weights; a resumed fit equals an unbroken one bit for bit, average too;
the decay warms up (`ema_warmup`), so that the default digits run gains from the average."""

import hashlib
import json
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from omegaconf import DictConfig
from torch import Tensor, nn
from torch.utils.data import DataLoader, TensorDataset

from tests.in_process import RunHere
from tests.sync_counter import SyncCounter, per_step, read_counts
from tests.tiny_regression import TinyRegression
from volt.callbacks.graceful_shutdown import GracefulShutdown
from volt.callbacks.weight_averaging import ExponentialMovingAverage
from volt.checkpointing import AtomicCheckpointIO
from volt.config.validation import check_config
from volt.errors import ConfigError, TrainingInterrupted
from volt.rebuild import load_trained_module

DECAY = 0.5  # large steps of the average, so that it differs visibly from the weights
STEPS_PER_EPOCH = 4


class Recorder(TinyRegression):
    """Validates and tests on the training data, noting the weights each stage ran with."""

    def __init__(self) -> None:
        super().__init__(lr=0.05)
        self.trained: list[Tensor] = []  # after each optimizer step
        self.validated: list[Tensor] = []  # at each validation
        self.tested: Tensor | None = None
        self.final: dict[str, Tensor] = {}  # the state when training ended

    def on_train_batch_end(self, outputs: object, batch: object, batch_idx: int) -> None:
        self.trained.append(self.layer.weight.detach().clone())

    def validation_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
        if batch_idx == 0:
            self.validated.append(self.layer.weight.detach().clone())
        x, y = batch
        self.log("val_loss", nn.functional.mse_loss(self.layer(x), y))

    def test_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
        self.tested = self.layer.weight.detach().clone()

    def on_train_end(self) -> None:
        self.final = {k: v.clone() for k, v in self.state_dict().items()}


def data() -> DataLoader[tuple[Tensor, ...]]:
    """The same batch STEPS_PER_EPOCH times: a fit resumed mid-epoch, which Lightning restarts
    at the epoch's first batch (this loader is not resumable), still sees the data it would."""
    x = torch.randn(8, 4, generator=torch.Generator().manual_seed(0)).repeat(STEPS_PER_EPOCH, 1)
    return DataLoader(TensorDataset(x, x @ torch.tensor([[1.0], [-2.0], [3.0], [0.5]])), 8)


def fit(
    root: Path,
    callbacks: list[Callback],
    epochs: int = 2,
    precision: str = "32-true",
    ckpt_path: Path | str | None = None,
) -> tuple[Recorder, pl.Trainer]:
    torch.manual_seed(0)
    model = Recorder()
    trainer = pl.Trainer(
        accelerator="cpu",
        max_epochs=epochs,
        precision=precision,  # type: ignore[arg-type]
        callbacks=callbacks,
        plugins=[AtomicCheckpointIO()],
        default_root_dir=root,
        enable_checkpointing=any(isinstance(c, ModelCheckpoint) for c in callbacks),
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
    )
    trainer.fit(model, data(), data(), ckpt_path=ckpt_path)
    return model, trainer


def ema_of(weights: list[Tensor], warmup: bool = True) -> Tensor:
    """The average as torch's EMA computes it: the first weights, then decay * avg + (1-d) * w,
    where under warm-up the decay after n updates is (1 + n) / (10 + n) while that is below DECAY
    (in float32, as the average's own arithmetic)."""
    average = weights[0]
    for n, w in enumerate(weights[1:], start=1):
        keep: Tensor | float = DECAY
        take: Tensor | float = 1 - DECAY
        if warmup and (1 + n) / (10 + n) < DECAY:
            count = torch.tensor(float(n))
            keep, take = (1 + count) / (10 + count), 9 / (10 + count)
        average = keep * average + take * w
    return average


def test_updates_never_wait_for_the_device(tmp_path: Path) -> None:
    # torch's AveragedModel.update_parameters reads its update count on the host at every step.
    counter = SyncCounter(str(tmp_path / "syncs.json"), start_step=0, steps=6)
    fit(tmp_path, [ExponentialMovingAverage(DECAY), counter])
    steps = per_step(read_counts(tmp_path / "syncs.json", rank=0), "syncs", "volt/callbacks/")
    assert len(steps) == 6 and not any(steps), steps


class Climber(pl.LightningModule):
    """One weight that rises by exactly 1 at every optimizer step (SGD, lr 1, loss -weight): the
    average after each update tells the decay that update took."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(()))

    def training_step(self, batch: object, batch_idx: int) -> Tensor:
        return -self.weight

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=1.0)


class AverageAfterEachStep(Callback):
    """The average as it stands after each optimizer step's update (placed after the EMA)."""

    def __init__(self, ema: ExponentialMovingAverage) -> None:
        self.ema = ema
        self.averages: list[Tensor] = []

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, *_: Any
    ) -> None:
        self.averages.append(self.ema._average().module.get_parameter("weight").detach().clone())


@pytest.mark.parametrize("warmup", [True, False], ids=["warmup", "fixed"])
def test_the_decay_warms_up_on_the_device(warmup: bool, tmp_path: Path) -> None:
    """With warm-up the first update copies the weights, the second keeps 2/11 of the average,
    and the decay rises as (1 + n) / (10 + n) to 0.9 at the 81st; without, it is 0.9 from the
    second on. The warm-up decay comes from the update count on the device: no step waits."""
    steps, decay = 90, 0.9
    ema = ExponentialMovingAverage(decay, warmup=warmup)
    recorder = AverageAfterEachStep(ema)
    counter = SyncCounter(str(tmp_path / "syncs.json"), start_step=0, steps=steps)
    trainer = pl.Trainer(
        accelerator="cpu",
        max_epochs=1,
        callbacks=[ema, recorder, counter],
        default_root_dir=tmp_path,
        enable_checkpointing=False,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(Climber(), DataLoader(TensorDataset(torch.zeros(steps)), batch_size=1))
    syncs = per_step(read_counts(tmp_path / "syncs.json", rank=0), "syncs", "volt/callbacks/")
    assert len(syncs) == steps and not any(syncs), syncs
    # a_k = d * a_(k-1) + (1 - d) * k, the weights after step k being k, and a_0 = 0.
    averages = [0.0, *(a.item() for a in recorder.averages)]
    taken = [(k - averages[k]) / (k - averages[k - 1]) for k in range(1, steps + 1)]
    expected = [0.0] + [min(decay, k / (k + 9)) if warmup else decay for k in range(2, steps + 1)]
    assert taken == pytest.approx(expected, abs=1e-5)
    if warmup:
        assert taken[1] == pytest.approx(2 / 11, abs=1e-5) and taken[79] < decay
        assert taken[80:] == pytest.approx([decay] * (steps - 80), abs=1e-5)


def best(tmp_path: Path) -> ModelCheckpoint:
    return ModelCheckpoint(tmp_path / "checkpoints", monitor="val_loss", save_top_k=1)


@pytest.mark.parametrize("warmup", [True, False], ids=["warmup", "fixed"])
def test_validation_and_checkpoints_see_the_average_and_training_goes_on(
    warmup: bool, tmp_path: Path
) -> None:
    """Without warm-up, bit for bit the fixed-decay average volt had before `ema_warmup`."""
    plain, _ = fit(tmp_path / "plain", [])
    model, trainer = fit(tmp_path, [ExponentialMovingAverage(DECAY, warmup), best(tmp_path)])
    # The swaps for validation leave the trained weights exactly as they were.
    assert all(torch.equal(a, b) for a, b in zip(plain.trained, model.trained, strict=True))
    for epoch, validated in enumerate(model.validated):
        steps = model.trained[: (epoch + 1) * STEPS_PER_EPOCH]
        assert torch.equal(validated, ema_of(steps, warmup))
        assert not torch.equal(validated, steps[-1])
    checkpoint = torch.load(trainer.checkpoint_callback.best_model_path, weights_only=True)  # type: ignore[union-attr]
    epoch = checkpoint["epoch"]
    assert torch.equal(checkpoint["state_dict"]["layer.weight"], model.validated[epoch])
    trained = model.trained[(epoch + 1) * STEPS_PER_EPOCH - 1]
    assert torch.equal(checkpoint["current_model_state"]["layer.weight"], trained)


def test_test_after_fit_evaluates_the_average(tmp_path: Path) -> None:
    """Lightning 2.6.6 alone loads `current_model_state` for the test: the trained weights."""
    model, trainer = fit(tmp_path, [ExponentialMovingAverage(DECAY), best(tmp_path)])
    trainer.test(model, data(), verbose=False)  # no checkpoint: the module as fit left it
    assert torch.equal(model.tested, ema_of(model.trained))  # type: ignore[arg-type]
    trainer.test(model, data(), ckpt_path="best", verbose=False)
    checkpoint = torch.load(trainer.checkpoint_callback.best_model_path, weights_only=True)  # type: ignore[union-attr]
    assert torch.equal(model.tested, checkpoint["state_dict"]["layer.weight"])  # type: ignore[arg-type]
    assert not torch.equal(model.tested, checkpoint["current_model_state"]["layer.weight"])  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("precision", "dtype"), [("bf16-true", torch.float32), ("64-true", torch.float64)]
)
def test_the_average_is_kept_wider_than_the_weights(
    precision: str, dtype: torch.dtype, tmp_path: Path
) -> None:
    ema = ExponentialMovingAverage(0.9)
    model, _ = fit(tmp_path, [ema], precision=precision)
    kept = ema._average_model.module.layer.weight  # type: ignore[union-attr]
    assert kept.dtype == dtype
    # Validation did not round it to the weights' bf16 (Lightning's swap did).
    assert not torch.equal(kept, kept.bfloat16().to(dtype))
    # Nor, under 64-true, the trained weights to float32.
    if precision == "64-true":
        assert not all(torch.equal(w, w.float().double()) for w in model.trained)


class SignalAt(Callback):
    """SIGTERM to this process as the given optimizer step starts."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_start(self, trainer: pl.Trainer, *args: object) -> None:
        if trainer.global_step == self.step:
            signal.raise_signal(signal.SIGTERM)


# 16-mixed is left out: Lightning runs it as bf16-mixed on the CPU.
PRECISIONS = ["32-true", "bf16-mixed", "64-true", "bf16-true", "16-true"]


# Expected: the data is built so that restarting the epoch changes nothing (`data`).
@pytest.mark.filterwarnings("ignore:You're resuming from a checkpoint that ended before the epoch")
@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.signals_itself
def test_stopped_and_resumed_equals_unbroken(precision: str, tmp_path: Path) -> None:
    """GracefulShutdown saves at the end of step 6, before the average's own update at that
    hook; the resumed fit ends with the weights and average of a fit never stopped."""
    stop_dir = tmp_path / "stopped"
    unbroken_ema = ExponentialMovingAverage(DECAY)
    unbroken, _ = fit(tmp_path / "a", [unbroken_ema], epochs=3, precision=precision)
    with pytest.raises(TrainingInterrupted):
        # volt's order: the config's callbacks, then the average
        callbacks = [SignalAt(6), GracefulShutdown(stop_dir), ExponentialMovingAverage(DECAY)]
        fit(tmp_path / "b", callbacks, epochs=3, precision=precision)
    resumed_ema = ExponentialMovingAverage(DECAY)
    resumed, _ = fit(
        tmp_path / "b",
        [resumed_ema],
        epochs=3,
        precision=precision,
        ckpt_path=stop_dir / "last.ckpt",
    )
    assert resumed.trained, "the resumed fit trained nothing"
    for key, value in unbroken.final.items():
        assert torch.equal(value, resumed.final[key]), key
    averages = (e._average_model.state_dict() for e in (unbroken_ema, resumed_ema))  # type: ignore[union-attr]
    for (key, value), (_, other) in zip(*(a.items() for a in averages), strict=True):
        assert torch.equal(value, other), key
    assert torch.equal(unbroken.layer.weight, resumed.layer.weight)  # the average, after fit


# ---- the `ema` key ----------------------------------------------------------------------------


def snapshot(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "/"
        for p in sorted(root.rglob("*"))
    }


@pytest.mark.parametrize("value", ["1.0", "0", "-0.5", "1", "1.5", "fast"])
def test_a_decay_outside_0_1_is_refused_before_anything_is_written(
    value: str, run_volt_here: RunHere, tmp_path: Path
) -> None:
    (tmp_path / "outputs").mkdir()
    before = snapshot(tmp_path / "outputs")
    refused = run_volt_here([f"ema={value}", "name=refused"])
    assert refused.returncode == 2, refused.stderr
    lines = [line for line in refused.stderr.splitlines() if "ema=" in line]
    assert len(lines) == 1, refused.stderr
    assert "is not valid: use null (off) or a decay strictly between 0 and 1" in lines[0]
    assert "(e.g. ema=0.999)" in lines[0]
    assert snapshot(tmp_path / "outputs") == before


@pytest.mark.parametrize("value", ["1", "yes", "null"])
def test_ema_warmup_is_true_or_false(value: str, compose_config: Callable[..., DictConfig]) -> None:
    check_config(compose_config("train", ["ema=0.999", "ema_warmup=false"]))
    with pytest.raises(ConfigError) as refused:
        check_config(compose_config("train", ["ema=0.999", f"ema_warmup={value}"]))
    assert str(refused.value).endswith("is not valid: use true or false (e.g. ema_warmup=false)"), (
        refused.value
    )
    assert str(refused.value).startswith("ema_warmup="), refused.value


def test_sharded_strategies_are_refused(compose_config: Callable[..., DictConfig]) -> None:
    check_config(compose_config("train", ["ema=0.999", "trainer=ddp"]))
    with pytest.raises(ConfigError, match=r"ema=0.999 with trainer.strategy=.*use trainer=ddp"):
        check_config(compose_config("train", ["ema=0.999", "trainer=fsdp"]))


# ---- real runs of train.py ---------------------------------------------------------------------


def run_dir(tmp_path: Path, name: str) -> Path:
    return tmp_path / "outputs" / "train" / "runs" / name


def checkpoints_equal(a: Path, b: Path) -> None:
    first, second = (torch.load(p, weights_only=True) for p in (a, b))
    assert first["global_step"] == second["global_step"]
    for part in ("state_dict", "current_model_state", "averaging_state"):
        assert first[part].keys() == second[part].keys()
        for key, value in first[part].items():
            assert torch.equal(value, second[part][key]), f"{part}.{key}"


QUICK = [
    "ema=0.9",
    "trainer.max_epochs=2",
    "trainer.limit_train_batches=5",
    "callbacks.progress_bar=null",
    "callbacks.model_summary=null",
    "logger=csv",
]


@pytest.mark.slow
def test_train_then_eval_use_the_average(run_volt_here: RunHere, tmp_path: Path) -> None:
    """The best checkpoint's `state_dict` is the average; test after training, `volt.eval` and
    `load_trained_module` all evaluate it, rebuilt from the config stored with it."""
    done = run_volt_here([*QUICK, "name=run"])
    assert done.returncode == 0, done.stderr[-3000:]
    record = json.loads((run_dir(tmp_path, "run") / "metrics.json").read_text())
    best_path = Path(record["best_checkpoint"])
    checkpoint = torch.load(best_path, weights_only=True)
    assert checkpoint["volt_config"]["ema"] == 0.9
    module, _ = load_trained_module(best_path)
    for key, value in module.state_dict().items():
        assert torch.equal(value, checkpoint["state_dict"][key]), key
    weights = next(k for k in checkpoint["state_dict"] if k.endswith("weight"))
    assert not torch.equal(
        checkpoint["state_dict"][weights], checkpoint["current_model_state"][weights]
    )
    evaluated = run_volt_here([f"ckpt_path={best_path}"], module="volt.eval")
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]
    eval_dir = next((tmp_path / "outputs" / "eval" / "runs").iterdir())
    metrics = json.loads((eval_dir / "metrics.json").read_text())["metrics"]
    assert metrics["test/acc"] == record["metrics"]["test/acc"]
    assert metrics["test/loss"] == record["metrics"]["test/loss"]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("extra", "stop_at"),
    [
        # No early stopping: a fit stopped by max_steps mid-epoch has no val metric for it.
        (["callbacks.last_checkpoint.every_n_train_steps=1", "callbacks.early_stopping=null"], 3),
        (["trainer=ddp"], 5),
        (["compile=default"], 5),
        (["trainer=dp", "trainer.accelerator=cpu"], 5),
    ],
    ids=["mid-epoch", "ddp", "compile", "dp"],
)
def test_resumed_equals_unbroken(
    extra: list[str],
    stop_at: int,
    run_volt_here: RunHere,
    run_volt: Callable[..., Any],
    tmp_path: Path,
) -> None:
    """Stopped after `stop_at` steps (5: the end of epoch 1; max_steps may change between
    attempts) and continued to 2 epochs, against one unbroken run: one process, two CPU ranks
    over gloo (exact at epoch ends only), a compiled net, DataParallel's one process. In this
    process (no interpreter start-up, a third of the time) except under DDP."""
    common = [*QUICK, "test=false", *extra]
    for name, args in [
        ("unbroken", []),
        ("resumed", [f"trainer.max_steps={stop_at}"]),
        ("resumed", []),
    ]:
        run = run_volt if "trainer=ddp" in extra else run_volt_here
        done = run([*common, f"name={name}", *args])
        assert done.returncode == 0, done.stderr[-3000:]
        if args:
            (run_dir(tmp_path, name) / "metrics.json").unlink()  # as if killed after the checkpoint
    assert "resuming run resumed" in (run_dir(tmp_path, "resumed") / "train.log").read_text()
    checkpoints_equal(
        run_dir(tmp_path, "unbroken") / "checkpoints" / "last.ckpt",
        run_dir(tmp_path, "resumed") / "checkpoints" / "last.ckpt",
    )


def accuracy_of(tmp_path: Path, name: str) -> float:
    return json.loads((run_dir(tmp_path, name) / "metrics.json").read_text())["metrics"]["test/acc"]


@pytest.mark.slow
def test_the_average_helps_the_default_run(run_volt_here: RunHere, tmp_path: Path) -> None:
    """`python train.py ema=0.999` (digits, 20 epochs of 19 steps at most, seed 42) tests at
    least as well as the same run without the average. The fixed decay, a control that this
    comparison can fail, does not: its average still holds the first steps' weights."""
    quiet = ["logger=none", "callbacks.progress_bar=null", "callbacks.model_summary=null"]
    runs = {
        "plain": ["ema=null"],
        "warmup": ["ema=0.999"],
        "fixed": ["ema=0.999", "ema_warmup=false"],
    }
    for name, args in runs.items():
        done = run_volt_here([*args, *quiet, f"name={name}"])
        assert done.returncode == 0, done.stderr[-3000:]
    plain, warmup, fixed = (accuracy_of(tmp_path, name) for name in runs)
    assert warmup >= plain > fixed, (warmup, plain, fixed)
