"""Training tokens per second and model FLOPs utilisation (MFU), measured without a host sync
per step."""

import logging

import lightning.pytorch as pl
import torch

from volt.callbacks.throughput import TrainingClock

log = logging.getLogger("volt")

# Dense peak TFLOP/s from NVIDIA's datasheets, by the dtype matmuls run in (tf32: float32 storage
# on tensor cores, torch's matmul precision `high`; fp32: without them). The first key found in
# the device's name wins, so "H100 PCIe" and "H100 NVL" come before "H100" (the SXM part).
PEAK_TFLOPS: dict[str, dict[str, float]] = {
    "H100 PCIe": {"bf16": 756.0, "fp16": 756.0, "tf32": 378.0, "fp32": 51.2, "fp64": 51.2},
    "H100 NVL": {"bf16": 835.0, "fp16": 835.0, "tf32": 418.0, "fp32": 60.0, "fp64": 60.0},
    "H100": {"bf16": 989.0, "fp16": 989.0, "tf32": 495.0, "fp32": 67.0, "fp64": 67.0},
    "H200": {"bf16": 989.0, "fp16": 989.0, "tf32": 495.0, "fp32": 67.0, "fp64": 67.0},
    "A100": {"bf16": 312.0, "fp16": 312.0, "tf32": 156.0, "fp32": 19.5, "fp64": 19.5},
}


def matmul_dtype(precision: str) -> str:
    """The dtype a Lightning precision (`bf16-mixed`, `32-true`, ...) runs its matmuls in."""
    if precision.startswith("bf16"):
        return "bf16"
    if precision.startswith("16"):
        return "fp16"
    if precision.startswith("64"):
        return "fp64"
    return "fp32" if torch.get_float32_matmul_precision() == "highest" else "tf32"


def peak_tflops(device: torch.device, dtype: str) -> float | None:
    """The device's dense peak for matmuls in `dtype`; None on the CPU (its peak depends on cores,
    clocks and vector units) and on GPUs missing from PEAK_TFLOPS."""
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((peaks[dtype] for key, peaks in PEAK_TFLOPS.items() if key in name), None)


class TokenThroughput(TrainingClock):
    """Logs `perf/train_tokens_per_s` (all processes together) and, where the device's peak is
    known, `perf/mfu`: the module's `flops_per_token()` times tokens per second over the peak for
    the run's precision (PEAK_TFLOPS) of all its devices together.

    Tokens are counted from the shape of the first tensor of each batch, (B, T) token indices,
    which needs no sync. The clock is read, after one GPU sync, only at the steps where Lightning
    writes its logs (every `trainer.log_every_n_steps` optimizer steps, where it syncs to turn
    the logged values into numbers anyway) and at validation boundaries: validation, sampling
    and checkpointing inside it are not training time. The first window holds compilation and
    warm-up, so read the later ones.
    """

    def __init__(self) -> None:
        super().__init__()
        self.tokens = 0  # counted since the clock last started
        self.last_step = -1  # the optimizer step last measured at (accumulating batches share it)
        self.flops_per_token: int | None = None
        self.peak: float | None = None

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        count = getattr(pl_module, "flops_per_token", None)
        self.flops_per_token = count() if callable(count) else None
        device = trainer.strategy.root_device
        self.peak = peak_tflops(device, matmul_dtype(str(trainer.precision)))
        if trainer.is_global_zero and device.type == "cuda" and self.peak is None:
            name = torch.cuda.get_device_name(device)
            log.info("no MFU logged: the peak FLOP/s of %s is not in PEAK_TFLOPS", name)
        self.tokens, self.seconds = 0, 0.0
        self._start_clock(trainer)

    def on_train_batch_end(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        outputs: object,
        batch: object,
        batch_idx: int,
    ) -> None:
        self.tokens += batch[0].numel() * trainer.world_size  # type: ignore[index]
        step = trainer.global_step
        every: int = trainer.log_every_n_steps  # type: ignore[attr-defined]  # set by Lightning
        if every < 1 or step == self.last_step or step % every:
            return
        self.last_step = step
        self._stop_clock(trainer)
        rate = self.tokens / max(self.seconds, 1e-9)
        pl_module.log("perf/train_tokens_per_s", rate, rank_zero_only=True)
        if self.flops_per_token and self.peak:
            # Per device: the rate is every process's tokens (DDP, FSDP), the peak one GPU's.
            mfu = self.flops_per_token * rate / (self.peak * 1e12 * trainer.world_size)
            pl_module.log("perf/mfu", mfu, rank_zero_only=True)
        self.tokens, self.seconds = 0, 0.0
        self._start_clock(trainer)
