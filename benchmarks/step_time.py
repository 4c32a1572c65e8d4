"""Training step time: volt as configured, and bare Lightning, against a plain PyTorch loop.

    python benchmarks/step_time.py --workload cifar --variants 32-true bf16-mixed bf16-mixed+default

Three sides train the same net with the same optimiser, batches, precision and compile mode, fed
by the same kind of DataLoader, one after the other in this process:

- plain:     a hand-written loop (autocast, GradScaler for fp16, zero_grad(set_to_none)).
- lightning: volt's Classifier in a bare Lightning Trainer (no callbacks, no logger).
- volt:      the Trainer and callbacks volt builds from `conf/` (`volt.build.build_training`):
             progress bar, TensorBoard, memory monitor, throughput meter, NaN guard, LR monitor.
             Only the callbacks that act at epoch ends (checkpoints, early stopping) are left out,
             as the timed steps lie inside one epoch.

Each side runs in a fresh process, as a user's run does (several compiled models in one
process crashed inductor's kernel launcher on torch 2.11: "CUDA driver error: invalid argument"),
and is timed over the same steps after a warm-up (which absorbs compilation). Sides alternate
within each repeat, so drift hits them alike; the result is the median over repeats of seconds
per step, and each side / plain as a ratio.
"""

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from collections import Counter
from collections.abc import Callable

import lightning.pytorch as pl
import torch
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig, OmegaConf
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from volt.build import build_datamodule, build_model, build_training
from volt.config import CONF_DIR
from volt.gpu import apply_compile, apply_matmul_precision
from volt.models.classifier import Classifier

# The default run (digits through an MLP: tiny steps, per-step overhead dominates) and the
# CIFAR-sized one (the shipped ResNet on 3x32x32, enough arithmetic to fill the GPU).
WORKLOADS = {
    "digits": ["data=digits", "model=mlp"],
    "cifar": ["data=cifar10", "model=resnet"],
}


def volt_config(workload: str, precision: str, compile_mode: str | None, steps: int) -> DictConfig:
    overrides = [
        *WORKLOADS[workload],
        "trainer=gpu",
        f"precision={precision}",
        f"compile={compile_mode or 'off'}",
        f"trainer.max_steps={steps}",
        "trainer.num_sanity_val_steps=0",
        "callbacks.model_checkpoint=null",
        "callbacks.last_checkpoint=null",
        "callbacks.early_stopping=null",
        "callbacks.model_summary=null",
        f"paths.output_dir={tempfile.mkdtemp(prefix='volt-bench-')}",
    ]
    with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
        return compose("train", overrides=overrides)


def make_loader(cfg: DictConfig, in_shape: tuple[int, ...], steps: int) -> DataLoader:
    generator = torch.Generator().manual_seed(0)
    batch_size = cfg.data.batch_size
    n = batch_size * steps
    images = torch.randn(n, *in_shape, generator=generator)
    labels = torch.randint(0, 10, (n,), generator=generator)
    return DataLoader(
        TensorDataset(images, labels),
        batch_size=batch_size,
        shuffle=True,
        drop_last=True,
        pin_memory=True,
    )


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


class SyncFinder(pl.Callback):
    """Turns on torch's sync debug mode for the timed steps: each op that makes the CPU wait for
    the GPU warns, and the warning names the Python line that called it."""

    def __init__(self, warmup: int, steps: int) -> None:
        self.warmup, self.steps = warmup, steps

    def on_train_batch_end(self, trainer: pl.Trainer, *args: object) -> None:
        if trainer.global_step == self.warmup:
            torch.cuda.set_sync_debug_mode("warn")
        elif trainer.global_step == self.warmup + self.steps:
            torch.cuda.set_sync_debug_mode("default")


def fit_volt(cfg: DictConfig, steps: int, probe: pl.Callback) -> None:
    """Train `steps` batches with the Trainer and callbacks volt builds from `cfg`, plus `probe`."""
    built = build_training(cfg, OmegaConf.to_container(cfg, resolve=True))
    built.trainer.callbacks.append(probe)
    loader = make_loader(cfg, built.datamodule.input_shape, steps)
    built.trainer.fit(built.model, train_dataloaders=loader)


def find_syncs(cfg: DictConfig, warmup: int, steps: int) -> dict[str, float]:
    """Where volt's training steps wait for the GPU: {file:line: waits per step}."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fit_volt(cfg, warmup + steps, SyncFinder(warmup, steps))
    where = Counter(
        f"{w.filename}:{w.lineno}" for w in caught if "synchroniz" in str(w.message).lower()
    )
    return {place: count / steps for place, count in where.most_common()}


def time_volt(cfg: DictConfig, warmup: int, steps: int) -> float:
    timer = StepTimer(warmup, steps)
    fit_volt(cfg, warmup + steps, timer)
    return (timer.end - timer.start) / steps


def time_lightning(cfg: DictConfig, warmup: int, steps: int) -> float:
    datamodule = build_datamodule(cfg.data)
    model = build_model(cfg.model, datamodule)
    apply_compile(model.net, cfg.compile.mode)
    timer = StepTimer(warmup, steps)
    trainer = pl.Trainer(
        accelerator="gpu",
        devices=1,
        precision=cfg.precision,
        max_steps=warmup + steps,
        limit_val_batches=0,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[timer],
    )
    trainer.fit(model, train_dataloaders=make_loader(cfg, datamodule.input_shape, warmup + steps))
    return (timer.end - timer.start) / steps


def time_plain(cfg: DictConfig, warmup: int, steps: int) -> float:
    device = torch.device("cuda")
    datamodule = build_datamodule(cfg.data)
    model: Classifier = build_model(cfg.model, datamodule)  # only for its net and optimizer
    net = model.net.to(device)
    apply_compile(net, cfg.compile.mode)
    optimizer = model.optimizer_factory(net.parameters())
    criterion = nn.CrossEntropyLoss(label_smoothing=cfg.model.label_smoothing)
    dtype = {"bf16-mixed": torch.bfloat16, "16-mixed": torch.float16}.get(cfg.precision)
    scaler = torch.amp.GradScaler(enabled=dtype == torch.float16)
    net.train()
    start = 0.0
    loader = make_loader(cfg, datamodule.input_shape, warmup + steps)
    for step, (x, y) in enumerate(loader, start=1):
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


SIDES: dict[str, Callable[[DictConfig, int, int], float]] = {
    "plain": time_plain,
    "lightning": time_lightning,
    "volt": time_volt,
}


def time_in_fresh_process(side: str, variant: str, args: argparse.Namespace) -> float:
    command = [sys.executable, __file__, "--workload", args.workload, "--variants", variant]
    command += ["--warmup", str(args.warmup), "--steps", str(args.steps), "--one-side", side]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"{side} {variant} failed:\n{done.stderr[-3000:]}")
    return float(done.stdout.strip().splitlines()[-1])


def time_one_side(side: str, args: argparse.Namespace) -> None:
    """In the child process: print seconds per step of one side and variant."""
    precision, _, compile_mode = args.variants[0].partition("+")
    cfg = volt_config(args.workload, precision, compile_mode or None, args.warmup + args.steps)
    torch.manual_seed(0)
    print(SIDES[side](cfg, args.warmup, args.steps))


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
    parser.add_argument("--one-side", choices=sorted(SIDES), help=argparse.SUPPRESS)
    parser.add_argument(
        "--find-syncs", action="store_true", help="only list where volt's steps wait for the GPU"
    )
    args = parser.parse_args()
    apply_matmul_precision(None)
    if args.one_side:
        time_one_side(args.one_side, args)
        return
    if args.find_syncs:
        for variant in args.variants:
            precision, _, mode = variant.partition("+")
            cfg = volt_config(args.workload, precision, mode or None, args.warmup + args.steps)
            print(f"{args.workload} {variant}: waits for the GPU per step, by caller")
            for place, per_step in find_syncs(cfg, args.warmup, args.steps).items():
                print(f"  {per_step:6.2f}  {place}")
        return
    rows = []
    for variant in args.variants:
        precision, _, compile_mode = variant.partition("+")
        cfg = volt_config(args.workload, precision, compile_mode or None, args.warmup + args.steps)
        times: dict[str, list[float]] = {side: [] for side in SIDES}
        for _ in range(args.repeats):
            for side in SIDES:
                times[side].append(time_in_fresh_process(side, variant, args))
        ms = {side: 1e3 * statistics.median(t) for side, t in times.items()}
        spread = {side: 1e3 * (max(t) - min(t)) for side, t in times.items()}
        rows.append(
            {
                "workload": args.workload,
                "batch_size": cfg.data.batch_size,
                "variant": variant,
                **{f"{side}_ms": ms[side] for side in SIDES},
                **{f"{side}_spread_ms": spread[side] for side in SIDES},
                "lightning_ratio": ms["lightning"] / ms["plain"],
                "volt_ratio": ms["volt"] / ms["plain"],
            }
        )
        print(json.dumps(rows[-1]), flush=True)  # a row at a time: a cut-off run keeps its rows
    print(f"\n{torch.cuda.get_device_name()}  torch {torch.__version__}  {args.workload}")
    header = f"{'variant':30} {'plain ms':>9} {'lightning ms':>12} {'volt ms':>9}"
    print(f"{header} {'lightning/plain':>15} {'volt/plain':>10}")
    for r in rows:
        print(
            f"{r['variant']:30} {r['plain_ms']:9.3f} {r['lightning_ms']:12.3f} {r['volt_ms']:9.3f}"
            f" {r['lightning_ratio']:15.3f} {r['volt_ratio']:10.3f}"
        )
    if args.json:
        with open(args.json, "w") as f:
            info = {"device": torch.cuda.get_device_name(), "torch": torch.__version__}
            json.dump({**info, "rows": rows}, f, indent=2)


if __name__ == "__main__":
    main()
