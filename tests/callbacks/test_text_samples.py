"""TextSamples: continuations of validation prompts in a real TensorBoard event file, sampled
without touching the training run's random stream or recompiling a compiled net."""

from collections.abc import Iterator
from functools import partial
from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.loggers import TensorBoardLogger
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from torch._dynamo.testing import CompileCounter
from torch.utils.data import DataLoader, TensorDataset

from tests.tiny_regression import TinyRegression
from volt.callbacks.text_samples import TextSamples
from volt.data.text_bytes import TextBytesDataModule
from volt.models.language_model import LanguageModel
from volt.nets.gpt import GPT

BLOCK, STEPS, PROMPT, NEW = 32, 12, 16, 10


@pytest.fixture(autouse=True)
def one_thread() -> Iterator[None]:
    # On a loaded 2-core machine a second thread spins waiting for a core (tests/models).
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def fit(root: Path, samples: TextSamples | None, compiler: CompileCounter | None = None) -> dict:
    """STEPS steps with dropout on (so any draw from torch's global stream shows in the
    weights), validated twice; returns the final weights."""
    pl.seed_everything(0, verbose=False)
    data = TextBytesDataModule(
        cache_dir=root.parent / "cache", max_bytes=100_000, block_size=BLOCK, batch_size=8,
        steps_per_epoch=STEPS // 2,
    )  # fmt: skip
    net = GPT(block_size=BLOCK, n_layer=1, n_head=2, n_embd=16, dropout=0.2)
    if compiler is not None:
        net.compile(backend=compiler)
    model = LanguageModel(net, optimizer=partial(torch.optim.AdamW, lr=3e-3))
    trainer = pl.Trainer(
        accelerator="cpu",
        max_steps=STEPS,
        limit_val_batches=2,
        log_every_n_steps=STEPS // 2,
        callbacks=[samples] if samples else [],
        logger=TensorBoardLogger(root, name="", version=""),
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(model, datamodule=data)
    return {k: v.clone() for k, v in model.state_dict().items()}


def texts(root: Path) -> dict[str, list[tuple[int, str]]]:
    events = EventAccumulator(str(root), size_guidance={"tensors": 0})
    events.Reload()
    return {
        tag: [(e.step, e.tensor_proto.string_val[0].decode()) for e in events.Tensors(tag)]
        for tag in events.Tags()["tensors"]
        if tag.startswith("samples/")
    }


def test_samples_of_validation_prompts_reach_tensorboard_at_each_validation(
    tmp_path: Path,
) -> None:
    fit(tmp_path / "run", TextSamples(num_samples=3, prompt_bytes=PROMPT, max_new_tokens=NEW))
    written = texts(tmp_path / "run")
    assert sorted(written) == [
        "samples/0/text_summary",
        "samples/1/text_summary",
        "samples/2/text_summary",
    ]
    data = TextBytesDataModule(cache_dir=tmp_path / "cache", max_bytes=100_000, block_size=BLOCK)
    data.setup()
    first_batch = [data.val_set[i][0] for i in range(8)]  # the validation loader's first batch
    for i, rows in enumerate(sorted(written.items())):
        steps = [step for step, _ in rows[1]]
        assert steps == [STEPS // 2, STEPS]  # two validations during fit; none at the sanity check
        prompt = bytes(first_batch[[0, 3, 7][i]][:PROMPT].tolist()).decode(errors="replace")
        for _, text in rows[1]:
            assert text.startswith(f"```\n{prompt}\u2588") and text.endswith("\n```")


def test_sampling_leaves_training_as_it_was_and_compiles_nothing(tmp_path: Path) -> None:
    counted_with, counted_without = CompileCounter(), CompileCounter()
    with_samples = fit(tmp_path / "a", TextSamples(max_new_tokens=NEW), counted_with)
    without = fit(tmp_path / "b", None, counted_without)
    assert texts(tmp_path / "a") and not texts(tmp_path / "b")
    for name, tensor in without.items():
        assert torch.equal(with_samples[name], tensor), name
    # Each new length would be a new graph had sampling gone through the compiled net.
    assert counted_with.frame_count == counted_without.frame_count


def test_a_module_that_cannot_generate_is_refused_at_fit_start(tmp_path: Path) -> None:
    trainer = pl.Trainer(
        accelerator="cpu", max_steps=1, callbacks=[TextSamples()], logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
    )  # fmt: skip
    with pytest.raises(TypeError, match=r"callbacks\.text_samples: TinyRegression has no generate"):
        trainer.fit(
            TinyRegression(), DataLoader(TensorDataset(torch.randn(4, 4), torch.randn(4, 1)))
        )


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"num_samples": 0}, "num_samples=0 must be at least 1"),
        ({"temperature": 0.0}, "temperature=0.0 must be positive"),
    ],
)
def test_bad_settings_are_refused_with_the_key(arguments: dict, message: str) -> None:
    with pytest.raises(ValueError, match=f"callbacks.text_samples.{message}"):
        TextSamples(**arguments)
