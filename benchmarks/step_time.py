"""Training step time: volt (Lightning + volt's Classifier) against a plain PyTorch loop.

    python benchmarks/step_time.py --workload cifar --variants 32-true bf16-mixed bf16-mixed+default

Both sides train the same net with the same optimiser, batches, precision and compile mode, fed by
the same DataLoader; each is timed over the same steps after a warm-up (which absorbs compilation).
The result is the median over repeats of (seconds per step), and volt/plain as a ratio.
"""

import argparse
import json
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import lightning.pytorch as pl
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from volt.gpu import apply_compile, apply_matmul_precision
from volt.models.classifier import Classifier
from volt.nets.mlp import MLP
from volt.nets.resnet import ResNet


@dataclass(frozen=True)
class Workload:
    name: str
    in_shape: tuple[int, int, int]
    batch_size: int
    make_net: Callable[[], nn.Module]
    make_optimizer: Callable[..., torch.optim.Optimizer]


WORKLOADS = {
    # The default run: 8x8 digits through an MLP; tiny steps, so per-step overhead dominates.
    "digits": Workload(
        "digits (MLP 256-256, batch 64)",
        (1, 8, 8),
        64,
        lambda: MLP((1, 8, 8), 10, [256, 256], dropout=0.1),
        lambda params: torch.optim.AdamW(params, lr=3e-3, weight_decay=0.01),
    ),
    # CIFAR-sized: 3x32x32 through the shipped ResNet; enough arithmetic to fill the GPU.
    "cifar": Workload(
        "CIFAR-sized (ResNet 64-128-256, batch 256)",
        (3, 32, 32),
        256,
        lambda: ResNet((3, 32, 32), 10, [64, 128, 256], [2, 2, 2]),
        lambda params: torch.optim.SGD(params, lr=0.1, momentum=0.9, nesterov=True),
    ),
}


def make_loader(workload: Workload, steps: int) -> DataLoader[tuple[torch.Tensor, ...]]:
    generator = torch.Generator().manual_seed(0)
    n = workload.batch_size * steps
    images = torch.randn(n, *workload.in_shape, generator=generator)
    labels = torch.randint(0, 10, (n,), generator=generator)
    return DataLoader(
        TensorDataset(images, labels),
        batch_size=workload.batch_size,
        shuffle=True,
        drop_last=True,
        pin_memory=True,
    )


def precision_dtype(precision: str) -> torch.dtype | None:
    return {"bf16-mixed": torch.bfloat16, "16-mixed": torch.float16}.get(precision)


class StepTimer(pl.Callback):
    """Wall time between the end of step `warmup` and the end of the last step (GPU synced)."""

    def __init__(self, warmup: int, steps: int) -> None:
        self.warmup, self.steps = warmup, steps
        self.start = self.end = 0.0

    def on_train_batch_end(self, trainer: pl.Trainer, *args: object) -> None:
        step = trainer.global_step
        if step == self.warmup:
            torch.cuda.synchronize()
            self.start = time.perf_counter()
        elif step == self.warmup + self.steps:
            torch.cuda.synchronize()
            self.end = time.perf_counter()


def time_volt(
    workload: Workload, precision: str, compile_mode: str | None, warmup: int, steps: int
) -> float:
    net = workload.make_net()
    apply_compile(net, compile_mode)
    model = Classifier(net, num_classes=10, optimizer=workload.make_optimizer)
    timer = StepTimer(warmup, steps)
    trainer = pl.Trainer(
        accelerator="gpu",
        devices=1,
        precision=precision,  # type: ignore[arg-type]
        max_steps=warmup + steps,
        limit_val_batches=0,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[timer],
    )
    trainer.fit(model, train_dataloaders=make_loader(workload, warmup + steps))
    return (timer.end - timer.start) / steps


def time_plain(
    workload: Workload, precision: str, compile_mode: str | None, warmup: int, steps: int
) -> float:
    device = torch.device("cuda")
    net = workload.make_net().to(device)
    apply_compile(net, compile_mode)
    optimizer = workload.make_optimizer(net.parameters())
    criterion = nn.CrossEntropyLoss()
    dtype = precision_dtype(precision)
    scaler = torch.amp.GradScaler(enabled=dtype == torch.float16)
    net.train()
    start = 0.0
    for step, (x, y) in enumerate(make_loader(workload, warmup + steps), start=1):
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        with torch.autocast("cuda", dtype=dtype or torch.float32, enabled=dtype is not None):
            loss = criterion(net(x), y)
        optimizer.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        if step == warmup:
            torch.cuda.synchronize()
            start = time.perf_counter()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / steps


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--workload", choices=sorted(WORKLOADS), default="cifar")
    parser.add_argument(
        "--variants",
        nargs="+",
        default=["32-true", "bf16-mixed", "bf16-mixed+default", "bf16-mixed+reduce-overhead"],
    )
    parser.add_argument("--warmup", type=int, default=30)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args()
    apply_matmul_precision(None)
    workload = WORKLOADS[args.workload]
    rows = []
    for variant in args.variants:
        precision, _, compile_mode = variant.partition("+")
        mode = compile_mode or None
        volt_times, plain_times = [], []
        for _ in range(args.repeats):  # interleaved, so drift hits both sides alike
            plain_times.append(time_plain(workload, precision, mode, args.warmup, args.steps))
            volt_times.append(time_volt(workload, precision, mode, args.warmup, args.steps))
        volt_ms, plain_ms = (
            1e3 * statistics.median(volt_times),
            1e3 * statistics.median(plain_times),
        )
        rows.append(
            {
                "workload": workload.name,
                "variant": variant,
                "volt_ms": volt_ms,
                "plain_ms": plain_ms,
                "ratio": volt_ms / plain_ms,
                "volt_spread_ms": 1e3 * (max(volt_times) - min(volt_times)),
                "plain_spread_ms": 1e3 * (max(plain_times) - min(plain_times)),
            }
        )
    print(f"\n{torch.cuda.get_device_name()}  torch {torch.__version__}  {workload.name}")
    print(f"{'variant':32} {'volt ms/step':>12} {'plain ms/step':>13} {'volt/plain':>10}")
    for r in rows:
        print(f"{r['variant']:32} {r['volt_ms']:12.3f} {r['plain_ms']:13.3f} {r['ratio']:10.3f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows},
                f,
                indent=2,
            )


if __name__ == "__main__":
    main()
