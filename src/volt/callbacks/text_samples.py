"""Continuations of fixed prompts from the validation data, written to TensorBoard at every
validation: what the language model has learnt, readable as it trains."""

from typing import Any, Protocol, runtime_checkable

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.loggers import TensorBoardLogger
from lightning.pytorch.trainer.states import TrainerFn
from torch import Tensor


@runtime_checkable
class ContinuesText(Protocol):
    def generate(
        self,
        idx: Tensor,
        max_new_tokens: int,
        temperature: float,
        top_k: int | None,
        generator: torch.Generator | None,
    ) -> Tensor: ...


def as_text(tokens: Tensor) -> str:
    """Byte tokens (T,) as text; a sampled byte sequence need not be valid UTF-8."""
    return bytes(tokens.tolist()).decode("utf-8", errors="replace")


class TextSamples(Callback):
    """After each validation during fit, every rank continues `num_samples` prompts (a sharded
    model's forward needs all ranks) and rank 0 writes each prompt and its continuation to
    TensorBoard (`add_text`, tags `samples/<i>`, at the global step).

    The prompts are the first `prompt_bytes` tokens of rows spread over the first validation
    batch (the validation loader does not shuffle, so they are the same every time). Tokens are
    drawn with `temperature` and `top_k` (top_k=1: greedy) from a generator seeded with `seed`
    at every validation: samples change only as the weights do, and torch's global random
    stream (dropout, data order) is left alone, so a run trains the same with or without them.
    Sampling runs the module eagerly, even if compiled (one token at a time would recompile for
    every length), under the run's precision. Without a TensorBoard logger nothing is sampled.
    """

    def __init__(
        self,
        num_samples: int = 2,
        prompt_bytes: int = 64,
        max_new_tokens: int = 128,
        temperature: float = 0.8,
        top_k: int | None = None,
        seed: int = 0,
    ) -> None:
        counts = dict(num_samples=num_samples, prompt_bytes=prompt_bytes)
        counts["max_new_tokens"] = max_new_tokens
        for name, value in counts.items():
            if value < 1:
                raise ValueError(f"callbacks.text_samples.{name}={value} must be at least 1")
        if temperature <= 0:
            raise ValueError(
                f"callbacks.text_samples.temperature={temperature} must be positive "
                "(for greedy sampling set callbacks.text_samples.top_k=1)"
            )
        self.num_samples = num_samples
        self.prompt_bytes = prompt_bytes
        self.max_new_tokens = max_new_tokens
        self.temperature = temperature
        self.top_k = top_k
        self.seed = seed
        self.prompts: Tensor | None = None  # (num_samples, prompt_bytes), on the module's device

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not isinstance(pl_module, ContinuesText):
            raise TypeError(
                f"callbacks.text_samples: {type(pl_module).__name__} has no generate(idx, "
                "max_new_tokens, temperature, top_k, generator): remove the callback "
                "(callbacks.text_samples=null) or train a language model"
            )

    def _samples(self, trainer: pl.Trainer) -> bool:
        # Every rank samples, though only rank 0 writes: under trainer=fsdp each forward gathers
        # weights from all ranks, so a rank that sampled alone would wait for the others forever.
        # Every rank has the same loggers, so every rank decides alike.
        return any(isinstance(x, TensorBoardLogger) for x in trainer.loggers)

    def on_validation_batch_end(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        if self.prompts is not None or batch_idx or dataloader_idx or not self._samples(trainer):
            return
        inputs = batch[0]  # (B, T)
        rows = torch.linspace(0, len(inputs) - 1, self.num_samples).long().unique()
        self.prompts = inputs[rows.to(inputs.device), : self.prompt_bytes].clone()

    def on_validation_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        fitting = trainer.state.fn == TrainerFn.FITTING and not trainer.sanity_checking
        if not (fitting and self._samples(trainer)) or self.prompts is None:
            return
        assert isinstance(pl_module, ContinuesText), "on_fit_start checked it"
        generator = torch.Generator(self.prompts.device).manual_seed(self.seed)
        with torch.compiler.set_stance("force_eager"), trainer.precision_plugin.forward_context():
            tokens = pl_module.generate(
                self.prompts, self.max_new_tokens, self.temperature, self.top_k, generator
            )
        if not trainer.is_global_zero:
            return
        writers = [x.experiment for x in trainer.loggers if isinstance(x, TensorBoardLogger)]
        prompt_length = self.prompts.size(1)
        for i, row in enumerate(tokens.cpu()):
            prompt, continuation = as_text(row[:prompt_length]), as_text(row[prompt_length:])
            # A fenced block keeps the code's indentation; the marker shows where sampling began.
            text = f"```\n{prompt}\u2588{continuation}\n```"
            for writer in writers:
                writer.add_text(f"samples/{i}", text, global_step=trainer.global_step)
