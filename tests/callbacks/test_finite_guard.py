"""FiniteGuard stops a real Trainer at its first check after a step whose loss or gradient is NaN
or inf, names that step, reads nothing on the host between checks, and leaves the newest
checkpoint at the last finite step."""

import math
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.plugins.precision import MixedPrecision
from torch import Tensor, nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.data import DataLoader, TensorDataset

from tests.sync_counter import SyncCounter, per_step, read_counts
from volt.callbacks.finite_guard import FiniteGuard, NonFiniteLossError

BAD_STEP = 3


class TwoLayers(pl.LightningModule):
    """Regression whose loss turns NaN at global step `nan_loss_at` (in its first batch only,
    when it accumulates several), or whose second-layer gradient is all `grad_value` at step
    `grad_at`."""

    def __init__(
        self,
        nan_loss_at: int | None = None,
        grad_at: int | None = None,
        grad_value: float = math.inf,
    ) -> None:
        super().__init__()
        self.first = nn.Linear(4, 8)
        self.second = nn.Linear(8, 1)
        self.nan_loss_at = nan_loss_at
        self.second.weight.register_hook(self._set_gradient_at(grad_at, grad_value))

    def _set_gradient_at(self, step: int | None, value: float) -> Callable[[Tensor], Tensor]:
        def hook(grad: Tensor) -> Tensor:
            return torch.full_like(grad, value) if self.global_step == step else grad

        return hook

    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        x, y = batch
        loss = nn.functional.mse_loss(self.second(torch.relu(self.first(x))), y)
        if self.global_step == self.nan_loss_at:
            self.nan_loss_at = None
            return loss * math.nan
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def batches() -> DataLoader:
    generator = torch.Generator().manual_seed(0)
    x, y = torch.randn(64, 4, generator=generator), torch.randn(64, 1, generator=generator)
    return DataLoader(TensorDataset(x, y), batch_size=8)


def trainer(
    tmp_path: Path,
    max_steps: int = BAD_STEP + 5,
    guard: FiniteGuard | None = None,
    checkpoint_every_step: bool = True,
    **kwargs: object,
) -> pl.Trainer:
    callbacks: list[pl.Callback] = [guard or FiniteGuard()]
    if checkpoint_every_step:
        callbacks.append(
            ModelCheckpoint(
                tmp_path / "checkpoints", filename="{step}", every_n_train_steps=1, save_top_k=-1
            )
        )
    kwargs.setdefault("accelerator", "cpu")
    # One device, also where there are more: Lightning would otherwise start DDP over all of them
    # by re-running this test session's command line in a process per GPU.
    kwargs.setdefault("devices", 1)
    return pl.Trainer(
        max_steps=max_steps,
        callbacks=callbacks,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=tmp_path,
        **kwargs,  # type: ignore[arg-type]
    )


def newest_checkpoint(directory: Path) -> dict:
    checkpoints = [torch.load(p, weights_only=True) for p in directory.glob("*.ckpt")]
    return max(checkpoints, key=lambda c: c["global_step"])


@pytest.mark.parametrize(
    ("poison", "names"),
    [
        ({"nan_loss_at": BAD_STEP}, "non-finite loss"),
        ({"grad_at": BAD_STEP}, "gradient (NaN or inf) of parameter second.weight at"),
    ],
    ids=["nan-loss", "inf-gradient"],
)
def test_checking_every_step_stops_before_the_bad_step_changes_the_weights(
    poison: dict[str, int], names: str, tmp_path: Path
) -> None:
    model = TwoLayers(**poison)
    with pytest.raises(NonFiniteLossError) as raised:
        trainer(tmp_path, guard=FiniteGuard(check_every_n_steps=1)).fit(model, batches())

    message = str(raised.value)
    assert names in message
    assert f"global step {BAD_STEP};" in message
    assert "trainer.gradient_clip_val=1.0" in message and "model.optimizer.lr" in message
    assert "first.weight" not in message  # only the poisoned parameter is named
    # Saved after steps 0..BAD_STEP-1 ran: global_step counts the optimizer steps taken.
    newest = newest_checkpoint(tmp_path / "checkpoints")
    assert newest["global_step"] == BAD_STEP
    # The step that raised changed nothing: the model still holds the checkpoint's weights.
    for name, weights in model.state_dict().items():
        assert torch.isfinite(newest["state_dict"][name]).all()
        assert torch.equal(newest["state_dict"][name], weights), name


def test_large_finite_fp16_gradients_are_not_taken_for_overflow(tmp_path: Path) -> None:
    # 8 elements of 30000 are finite in fp16 (max 65504), their 2-norm (84853) is not.
    model = TwoLayers(grad_at=BAD_STEP, grad_value=30000.0)
    run = trainer(tmp_path, precision="16-true", max_steps=BAD_STEP + 1)
    run.fit(model, batches())

    assert run.global_step == BAD_STEP + 1
    assert model.second.weight.dtype == torch.float16


def test_a_gradscaler_skipping_overflowed_steps_is_left_alone(tmp_path: Path) -> None:
    # Lightning turns 16-mixed into bf16-mixed on the CPU; with its plugin built by hand, fp16
    # autocast and a real GradScaler run here. A scale of 2**40 overflows the fp16 activation
    # gradients: the scaler skips those steps and halves the scale until they fit.
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**40)
    amp = MixedPrecision("16-mixed", "cpu", scaler)
    run = trainer(tmp_path, plugins=[amp])
    run.fit(TwoLayers(), batches())

    assert run.global_step == run.max_steps  # no step raised
    assert scaler.get_scale() <= 2.0**36  # though at least four overflowed


def test_a_nan_loss_still_stops_training_under_a_gradscaler(tmp_path: Path) -> None:
    amp = MixedPrecision("16-mixed", "cpu", torch.amp.GradScaler("cpu"))
    with pytest.raises(NonFiniteLossError, match=f"non-finite loss .* at global step {BAD_STEP};"):
        trainer(tmp_path, plugins=[amp]).fit(TwoLayers(nan_loss_at=BAD_STEP), batches())


def test_a_nan_loss_in_any_accumulated_micro_batch_stops_training(tmp_path: Path) -> None:
    # Under a GradScaler only the loss is checked, so this needs every micro-batch's loss: here
    # the first of the step's four is NaN, the three after it finite.
    amp = MixedPrecision("16-mixed", "cpu", torch.amp.GradScaler("cpu"))
    model = TwoLayers(nan_loss_at=BAD_STEP)
    with pytest.raises(NonFiniteLossError, match=f"at global step {BAD_STEP};"):
        trainer(tmp_path, accumulate_grad_batches=4, plugins=[amp]).fit(model, batches())
    assert newest_checkpoint(tmp_path / "checkpoints")["global_step"] == BAD_STEP


def test_a_bad_step_between_checks_is_named_and_no_checkpoint_holds_it(tmp_path: Path) -> None:
    # The default check every 10 steps; the checkpoint after each step checks first.
    model = TwoLayers(nan_loss_at=BAD_STEP)
    with pytest.raises(NonFiniteLossError) as raised:
        trainer(tmp_path).fit(model, batches())

    message = str(raised.value)
    # Step BAD_STEP's update ran; the checkpoint after it was about to be written, and checked.
    assert f"at global step {BAD_STEP}; seen at global step {BAD_STEP + 1}" in message
    assert "weights in memory are spoiled" in message and "resume from the newest" in message
    newest = newest_checkpoint(tmp_path / "checkpoints")
    assert newest["global_step"] == BAD_STEP
    assert all(torch.isfinite(w).all() for w in newest["state_dict"].values())
    assert not torch.isfinite(model.second.weight).all()


# The interval given, or (volt's default) the trainer's log_every_n_steps.
@pytest.mark.parametrize(
    ("check_every_n_steps", "log_every_n_steps"), [(4, 50), (None, 4)], ids=["given", "logging"]
)
def test_the_host_reads_the_verdicts_only_at_checks(
    check_every_n_steps: int | None, log_every_n_steps: int, tmp_path: Path
) -> None:
    max_steps = 16
    counter = SyncCounter(str(tmp_path / "syncs.json"), start_step=0, steps=max_steps)
    model = TwoLayers(grad_at=11)  # an inf gradient at step 11, seen at the check of step 11
    run = trainer(
        tmp_path,
        max_steps=max_steps,
        guard=FiniteGuard(check_every_n_steps=check_every_n_steps),
        checkpoint_every_step=False,
        log_every_n_steps=log_every_n_steps,
    )
    run.callbacks.append(counter)
    with pytest.raises(NonFiniteLossError, match=r"of parameter second\.weight at global step 11;"):
        run.fit(model, batches())

    reads = per_step(read_counts(tmp_path / "syncs.json", rank=0), "syncs", "volt/callbacks/")
    checks = [step for step, read in enumerate(reads) if read]
    assert checks == [3, 7, 11]  # (step + 1) % 4 == 0; the last one raised
    # One read a check; the check that raised reads once more, for the parameters' names.
    assert [reads[step] for step in checks] == [{"tolist": 1}, {"tolist": 1}, {"tolist": 2}]
    # It raised before step 11's optimizer step: the inf never reached the weights.
    assert torch.isfinite(model.second.weight).all()


class SkipsSecondOnOddSteps(TwoLayers):
    """`second` gets no gradient on odd steps, so the steps between checks differ in width."""

    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        if self.global_step % 2:
            x, y = batch
            return nn.functional.mse_loss(self.first(x).sum(1, keepdim=True), y)
        return super().training_step(batch, batch_idx)


def test_steps_with_fewer_gradients_are_judged_with_the_others(tmp_path: Path) -> None:
    model = SkipsSecondOnOddSteps(grad_at=4)
    guard = FiniteGuard(check_every_n_steps=6)
    with pytest.raises(NonFiniteLossError) as raised:
        trainer(tmp_path, max_steps=12, guard=guard, checkpoint_every_step=False).fit(
            model, batches()
        )
    # Step 4's gradients are gone by the check at step 5: named by the weights they spoiled.
    message = str(raised.value)
    assert "gradient (NaN or inf), which made the weights of second.weight non-finite," in message
    assert "at global step 4; seen at global step 5" in message
    assert "first.weight" not in message


def test_check_every_n_steps_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match=r"check_every_n_steps=0: must be 1 or more"):
        FiniteGuard(check_every_n_steps=0)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("poison", [{"nan_loss_at": BAD_STEP}, {"grad_at": BAD_STEP}])
def test_on_a_gpu_training_stops_and_every_checkpoint_is_finite(
    poison: dict[str, int], tmp_path: Path
) -> None:
    model = TwoLayers(**poison)
    with pytest.raises(NonFiniteLossError, match=f"at global step {BAD_STEP};"):
        trainer(tmp_path, accelerator="cuda").fit(model, batches())
    newest = newest_checkpoint(tmp_path / "checkpoints")
    assert newest["global_step"] == BAD_STEP
    assert all(torch.isfinite(w).all() for w in newest["state_dict"].values())


class CountTensorsMade(TorchDispatchMode):
    """Counts the tensors that the torch operations run under it return: each costs the host an
    allocation and a Python object, a per-parameter list of them a per-parameter cost."""

    def __init__(self) -> None:
        super().__init__()
        self.made = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        out = func(*args, **(kwargs or {}))
        self.made += sum(
            isinstance(t, Tensor) for t in (out if isinstance(out, (list, tuple)) else [out])
        )
        return out


def tensors_made_in_a_step(layers: int) -> int:
    """The tensors FiniteGuard makes in a step (no check) of a model of `layers` linear layers."""
    model = nn.Sequential(*(nn.Linear(4, 4) for _ in range(layers)))
    model(torch.randn(2, 4)).sum().backward()
    guard = FiniteGuard(check_every_n_steps=100)
    guard.check_every_n_steps = 100
    step = SimpleNamespace(global_step=0)
    with CountTensorsMade() as counted:
        guard.on_before_backward(step, model, torch.tensor(1.0))  # type: ignore[arg-type]
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        guard.on_before_optimizer_step(step, model, optimizer)  # type: ignore[arg-type]
    return counted.made


def test_a_step_makes_the_same_few_tensors_whatever_the_number_of_parameters() -> None:
    # The inf-norm of each gradient that this check replaced made two tensors a parameter.
    assert tensors_made_in_a_step(2) == tensors_made_in_a_step(40) <= 6


@pytest.mark.parametrize("bad", [None, math.nan, math.inf, -math.inf])
@pytest.mark.parametrize("kernel", ["fused", "inf-norm"])
def test_each_kind_of_gradient_is_flagged_by_its_kernel(kernel: str, bad: float | None) -> None:
    """CUDA's fused check has no bfloat16 (torch 2.11): those gradients take an inf-norm each.
    Said to be on a GPU (the function trusts the kind it is given), they run on the CPU here."""
    from volt.callbacks.finite_guard import _flag_non_finite

    grads = [torch.ones(3, dtype=torch.bfloat16), torch.ones(2, 2, dtype=torch.bfloat16)]
    if bad is not None:
        grads[1][1, 0] = bad
    device = torch.device("cpu" if kernel == "fused" else "cuda")
    found = torch.zeros(1)
    _flag_non_finite(grads, device, torch.bfloat16, found, torch.ones(1))
    assert found.item() == (0.0 if bad is None else 1.0)
    assert torch.equal(grads[0], torch.ones(3, dtype=torch.bfloat16))  # x * 1.0 is x


def test_sharded_gradients_are_read_without_autograd_and_flagged(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """trainer=fsdp's gradients are DTensors: their shards are read with autograd off (DTensor's
    tracked to_local cost 18 µs a gradient), and a NaN in one is still flagged (a world of one)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import _api

    store = torch.distributed.HashStore()
    torch.distributed.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 2))
        fully_shard(model, mesh=init_device_mesh("cpu", (1,)))
        model(torch.randn(3, 4)).sum().backward()
        with torch.no_grad():  # the shard itself, written in place
            model[1].weight.grad.to_local()[0, 0] = math.nan
        guard = FiniteGuard(check_every_n_steps=100)
        guard.check_every_n_steps = 100
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        calls = []
        tracked = _api._ToTorchTensor.apply
        monkeypatch.setattr(_api._ToTorchTensor, "apply", lambda *a: calls.append(a) or tracked(*a))
        guard.on_before_backward(SimpleNamespace(), model, torch.tensor(1.0))  # type: ignore[arg-type]
        step = SimpleNamespace(global_step=0)
        guard.on_before_optimizer_step(step, model, optimizer)  # type: ignore[arg-type]
        assert not calls
        assert guard._steps[0].found is not None and guard._steps[0].found.item() == 1.0
    finally:
        torch.distributed.destroy_process_group()


class SecondLayerAddedLater(TwoLayers):
    """Its optimizer starts with the first layer; the second joins it as a group at step 1."""

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.first.parameters(), lr=0.01)

    def on_train_batch_start(self, batch: object, batch_idx: int) -> None:
        if self.global_step == 1:
            self.optimizers().optimizer.add_param_group({"params": self.second.parameters()})


def test_a_parameter_group_added_during_training_is_checked(tmp_path: Path) -> None:
    # FiniteGuard sorts an optimizer's parameters once; a group added later must be sorted in.
    model = SecondLayerAddedLater(grad_at=BAD_STEP)
    guard = FiniteGuard(check_every_n_steps=1)
    with pytest.raises(NonFiniteLossError) as raised:
        trainer(tmp_path, guard=guard, checkpoint_every_step=False).fit(model, batches())
    assert "gradient (NaN or inf) of parameter second.weight at" in str(raised.value)
    assert f"global step {BAD_STEP};" in str(raised.value)


def guarded_step(
    guard: FiniteGuard,
    model: nn.Linear,
    optimizer: torch.optim.Optimizer,
    step: int,
    bad: float | None = None,
) -> None:
    """One optimizer step's hooks of `guard` (no Trainer), its first weight's gradient `bad`."""
    model.zero_grad()
    model(torch.randn(2, 4)).sum().backward()
    if bad is not None:
        model.weight.grad[0, 0] = bad  # type: ignore[index]
    trainer_now = SimpleNamespace(global_step=step)
    guard.on_before_backward(trainer_now, model, torch.tensor(1.0))  # type: ignore[arg-type]
    guard.on_before_optimizer_step(trainer_now, model, optimizer)  # type: ignore[arg-type]


def test_the_steps_of_one_interval_flag_into_one_buffer_each_its_own_element() -> None:
    model = nn.Linear(4, 4)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    guard = FiniteGuard(check_every_n_steps=3)
    guard.check_every_n_steps = 3
    for step in range(2):  # two steps of the interval; the check comes at the third
        guarded_step(guard, model, optimizer, step, bad=math.nan if step == 1 else None)
    flags = [s.found for s in guard._steps]
    assert [f.item() for f in flags] == [0.0, 1.0]  # type: ignore[union-attr]
    assert len({f.untyped_storage().data_ptr() for f in flags}) == 1  # type: ignore[union-attr]
    guard._steps = []  # as a check leaves them: the next interval gets a fresh, zeroed buffer
    guarded_step(guard, model, optimizer, 3)  # no check at step 3
    assert guard._steps[0].found.item() == 0.0  # type: ignore[union-attr]


def test_the_flags_stay_float32_under_a_float64_default_dtype() -> None:
    # precision=64-true makes float64 the default around the training step, where a manual
    # optimizer step calls this hook; the fused check takes a float32 flag only.
    model = nn.Linear(4, 4).double()
    model(torch.randn(2, 4, dtype=torch.float64)).sum().backward()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    guard = FiniteGuard(check_every_n_steps=2)
    guard.check_every_n_steps = 2
    step = SimpleNamespace(global_step=0)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        guard.on_before_backward(step, model, torch.tensor(1.0))  # type: ignore[arg-type]
        guard.on_before_optimizer_step(step, model, optimizer)  # type: ignore[arg-type]
    finally:
        torch.set_default_dtype(previous)
    assert guard._steps[0].found.dtype == torch.float32  # type: ignore[union-attr]


def test_a_long_interval_takes_its_flags_a_bounded_buffer_at_a_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from volt.callbacks import finite_guard

    monkeypatch.setattr(finite_guard, "FLAGS_AT_ONCE", 2)
    model = nn.Linear(4, 4)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    guard = FiniteGuard(check_every_n_steps=10**9)
    guard.check_every_n_steps = 10**9  # as on_fit_start sets it
    for step in range(5):
        guarded_step(guard, model, optimizer, step, bad=math.inf if step == 3 else None)
    flags = [s.found for s in guard._steps]
    assert [f.item() for f in flags] == [0.0, 0.0, 0.0, 1.0, 0.0]  # type: ignore[union-attr]
    buffers = [f.untyped_storage() for f in flags]  # type: ignore[union-attr]
    assert {b.nbytes() for b in buffers} == {8}  # two float32 flags each, not 10**9
    assert len({b.data_ptr() for b in buffers}) == 3
