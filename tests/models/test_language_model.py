import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from volt.build import allow_clipping_fused_optimizers
from volt.data.text_bytes import TextBytesDataModule
from volt.models.language_model import LanguageModel
from volt.models.schedules import WarmupCosine
from volt.nets.gpt import GPT

BLOCK, STEPS, LR = 64, 30, 3e-3


def small_gpt() -> GPT:
    return GPT(block_size=BLOCK, n_layer=2, n_head=4, n_embd=64)


def language_model(net: nn.Module | None = None) -> LanguageModel:
    return LanguageModel(
        net if net is not None else small_gpt(),
        optimizer=partial(torch.optim.AdamW, lr=LR, betas=(0.9, 0.95)),
        scheduler=partial(WarmupCosine, warmup_steps=5, max_steps=STEPS, min_lr_ratio=0.1),
        weight_decay=0.1,
        max_new_tokens=8,
    )


@dataclass
class Trained:
    trainer: pl.Trainer
    model: LanguageModel
    checkpoint: Path
    metrics: dict[str, float]  # logged by fit, then by test


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Trained]:
    """30 steps on the first 200 kB of the standard library's sources, validated at the end,
    then tested."""
    root = tmp_path_factory.mktemp("lm")
    # One thread: on a loaded 2-core machine a second one spins waiting for a core, and tiny
    # matrix products gain nothing from it (measured: 1.7 s a step with two, 0.1 s with one).
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    pl.seed_everything(0, verbose=False)
    data = TextBytesDataModule(
        cache_dir=root / "cache", max_bytes=200_000, block_size=BLOCK, batch_size=16,
        steps_per_epoch=STEPS,
    )  # fmt: skip
    model = language_model()
    trainer = pl.Trainer(
        accelerator="cpu",
        max_steps=STEPS,
        log_every_n_steps=10,  # train/loss is logged on the steps Lightning writes logs at
        logger=False,
        callbacks=[ModelCheckpoint(root / "checkpoints", save_last=True)],
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(model, datamodule=data)
    metrics = {name: value.item() for name, value in trainer.callback_metrics.items()}
    trainer.test(model, datamodule=data, verbose=False)
    metrics |= {name: value.item() for name, value in trainer.callback_metrics.items()}
    yield Trained(trainer, model, root / "checkpoints" / "last.ckpt", metrics)
    torch.set_num_threads(threads)


def test_training_brings_validation_bits_per_byte_well_below_uniform(
    trained: Trained,
) -> None:
    metrics = trained.metrics
    assert metrics["val/bpb"] < 5.5  # 8 bits: every byte equally likely; ~4.3 here
    assert metrics["val/bpb"] == pytest.approx(metrics["val/loss"] / math.log(2))
    # one validation during training: the sanity check before it did not count
    assert metrics["val/bpb_best"] == pytest.approx(metrics["val/bpb"])
    assert metrics["test/bpb"] == pytest.approx(metrics["test/loss"] / math.log(2))
    assert metrics["test/bpb"] < 5.5
    assert "train/loss" in metrics


def test_optimizer_decays_matrices_only_and_follows_the_schedule_per_step(
    trained: Trained,
) -> None:
    decay, no_decay = trained.trainer.optimizers[0].param_groups
    assert (decay["weight_decay"], no_decay["weight_decay"]) == (0.1, 0.0)
    assert any(p is trained.model.net.tok_emb.weight for p in decay["params"])
    # stepped once per optimiser step: after max_steps the rate sits at the floor
    assert decay["lr"] == pytest.approx(0.1 * LR)


def test_checkpoint_loads_with_weights_only_and_restores_the_net(
    trained: Trained,
) -> None:
    model = trained.model
    checkpoint = torch.load(trained.checkpoint, weights_only=True)
    assert checkpoint["hyper_parameters"]["weight_decay"] == 0.1
    assert "net" not in checkpoint["hyper_parameters"]
    restored = language_model()
    restored.load_state_dict(checkpoint["state_dict"])
    # the best bpb so far is part of the state: a resumed run goes on comparing with it
    assert restored.val_bpb_best.min_value.item() == pytest.approx(trained.metrics["val/bpb"])
    idx = torch.randint(256, (2, BLOCK))
    model.eval()
    restored.eval()
    torch.testing.assert_close(restored(idx), model(idx))


def test_predict_continues_each_prompt(trained: Trained) -> None:
    prompts = torch.tensor([list(b"def __init__(self"), list(b"import os\nimport ")])
    loader = DataLoader(TensorDataset(prompts), batch_size=2)
    (out,) = trained.trainer.predict(trained.model, loader)
    assert out["continuation"].shape == (2, 8)
    assert torch.equal(out["prompt"], prompts)
    assert [len(text.encode()) >= 1 for text in out["text"]] == [True, True]


@pytest.mark.parametrize(("fused", "expected"), [(None, False), (True, True), (False, False)])
def test_fused_optimizer_on_the_cpu_only_when_asked(fused: bool | None, expected: bool) -> None:
    model = LanguageModel(small_gpt(), partial(torch.optim.AdamW, lr=1e-3), fused_optimizer=fused)
    optimizer = model.configure_optimizers()
    assert isinstance(optimizer, torch.optim.AdamW)
    assert bool(optimizer.defaults["fused"]) is expected


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_fused_optimizer_by_default_on_cuda() -> None:
    model = LanguageModel(small_gpt(), partial(torch.optim.AdamW, lr=1e-3)).cuda()
    optimizer = model.configure_optimizers()
    assert isinstance(optimizer, torch.optim.AdamW)
    assert optimizer.defaults["fused"] is True


def test_an_optimizer_without_a_fused_step_is_built_as_given() -> None:
    def sgd(params: Iterable[Any]) -> torch.optim.Optimizer:
        return torch.optim.SGD(params, lr=0.1)

    assert isinstance(LanguageModel(small_gpt(), sgd).configure_optimizers(), torch.optim.SGD)
    with pytest.raises(ValueError, match=r"model.fused_optimizer=true, but .*sgd.* has no fused"):
        LanguageModel(small_gpt(), sgd, fused_optimizer=True)
    with pytest.raises(ValueError, match=r"model.optimizer.fused=True would be overridden"):
        LanguageModel(small_gpt(), partial(torch.optim.AdamW, fused=True))


def test_an_optimizer_decay_that_the_groups_would_override_is_refused() -> None:
    with pytest.raises(ValueError, match=r"model.optimizer.weight_decay=0.05 would be overridden"):
        LanguageModel(small_gpt(), optimizer=partial(torch.optim.AdamW, weight_decay=0.05))


def test_a_net_without_groups_or_sampling_trains_on_all_parameters_but_cannot_predict() -> None:
    net = nn.Sequential(nn.Embedding(256, 16), nn.Linear(16, 256))
    model = LanguageModel(net, optimizer=partial(torch.optim.AdamW, lr=1e-3, weight_decay=0.05))
    optimizer = model.configure_optimizers()
    assert isinstance(optimizer, torch.optim.AdamW)
    assert optimizer.param_groups[0]["weight_decay"] == 0.05
    assert len(optimizer.param_groups[0]["params"]) == 3
    with pytest.raises(TypeError, match="Sequential has no generate"):
        model.predict_step((torch.zeros(1, 4, dtype=torch.long),), 0)


class GradNorms(pl.Callback):
    """The gradients' total norm as the optimiser step sees it (after any clipping)."""

    def __init__(self) -> None:
        self.norms: list[float] = []

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: Any, *args: Any) -> None:
        grads = [p.grad for p in pl_module.parameters() if p.grad is not None]
        self.norms.append(torch.linalg.vector_norm(torch.stack([g.norm() for g in grads])).item())


def test_clips_with_a_fused_optimizer_under_bf16_mixed() -> None:
    """Lightning 2.6.6 refuses this pair although bf16 has no grad scaler (its #21435): volt's
    build_trainer lets it through, and the clipping takes effect."""
    pl.seed_everything(0, verbose=False)
    x = torch.randint(0, 256, (8, BLOCK))
    data = DataLoader(TensorDataset(x, x.roll(-1, dims=1)), batch_size=4)
    model = LanguageModel(
        small_gpt(), partial(torch.optim.AdamW, lr=1e-3), fused_optimizer=True, weight_decay=0.0
    )
    norms = GradNorms()
    trainer = pl.Trainer(
        accelerator="cpu",
        precision="bf16-mixed",
        gradient_clip_val=1e-3,  # far below the gradients' own norm, so clipping shows
        max_steps=2,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[norms],
    )
    allow_clipping_fused_optimizers(trainer)  # as volt's build_trainer does
    trainer.fit(model, data)
    optimizer = trainer.optimizers[0]
    assert optimizer.defaults["fused"] is True
    assert len(norms.norms) == 2 and all(n <= 1e-3 * 1.01 for n in norms.norms), norms.norms
