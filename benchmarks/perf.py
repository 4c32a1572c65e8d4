"""volt's performance table: step time of volt against a plain PyTorch loop and the GPU's limit.

    python benchmarks/perf.py --readme      # on a GPU: measure, print, rewrite README's table
    python benchmarks/perf.py --tiny        # on the CPU, toy sizes, a minute: CI runs this

Each row is a workload (the default digits run; `experiment=cifar10_resnet`) in one precision and
compile mode. Each side trains the same net with the same optimiser and batch size, in a fresh
process of its own (several compiled models in one process crashed inductor's kernel launcher on
torch 2.11: "CUDA driver error: invalid argument"):

- synthetic:        a plain loop on one batch that is already on the device: the limit.
- plain DataLoader: a plain loop fed the way most hand-written loops are: a Dataset that
                    augments and normalises one sample at a time, a DataLoader with workers and
                    pinned memory, non-blocking copies.
- plain, volt data: a plain loop fed by volt's batches (`volt.data.batches`, as `data.on_device`
                    picks them: on a GPU, the data set held there and augmented whole batches
                    at a time).
- bare Lightning:   volt's LightningModule and data module in a Trainer with no callbacks, no
                    logger, no checkpoints.
- volt:             the Trainer, callbacks and logger volt builds from `conf/` (progress bar,
                    TensorBoard, memory monitor, throughput, NaN guard, LR monitor, graceful
                    shutdown), as `python train.py` runs it; validation, checkpoints and early
                    stopping are off (no other side saves or validates; digits' epochs are 19
                    steps, so a save per epoch would dominate its step time).

After a warm-up (which absorbs compilation) each side times `--repeats` windows of `--steps`
steps, synchronising the device only at the windows' edges. The table shows the median
milliseconds per step, the spread over windows ((max - min) / median), samples per second as a
share of the synthetic side's, and each side's peak GPU memory (allocated, whole run).
"""

import argparse
import cProfile
import io
import json
import os
import pstats
import statistics
import sys
import tempfile
import time
import warnings
from collections import Counter
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import fake_cifar10
import harness  # benchmarks/, the folder of this script, is first on sys.path
import lightning.pytorch as pl
import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf
from torch import Tensor, nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, Dataset

REPO = Path(__file__).resolve().parents[1]
README = REPO / "docs" / "performance.md"
MARKERS = {  # the README's two tables, each between its pair of markers
    "images": ("<!-- perf-table:begin -->", "<!-- perf-table:end -->"),
    "gpt": ("<!-- perf-gpt:begin -->", "<!-- perf-gpt:end -->"),
}
SIDES = ("synthetic", "plain_dataloader", "plain_volt_data", "lightning", "volt")
GPT_SIDES = ("synthetic", "plain_volt_data", "lightning", "volt")  # its data is one byte array
SIDE_NAMES = {
    "synthetic": "synthetic (limit)",
    "plain_dataloader": "plain, DataLoader",
    "plain_volt_data": "plain, volt data",
    "lightning": "bare Lightning",
    "volt": "volt",
}


CIFAR_FILES = ["data=cifar10", "data.root={data_root}", "data.download=false"]


def gpt_rows(tiny: bool, batches: list[int]) -> list[dict[str, Any]]:
    """The GPT task's rows: experiment=gpt_bytes (12 layers, width 768, context 1024, bf16-mixed,
    compiled) at each batch size; tiny: experiment=gpt_bytes_tiny, eager, on the CPU."""
    if tiny:
        overrides = ["experiment=gpt_bytes_tiny", "data.batch_size=8", "data.block_size=64"]
        overrides.append("model.scheduler.warmup_steps=0")  # the run is a few steps long
        tiny_row = {"workload": "gpt_bytes_tiny", "variant": "32-true", "overrides": overrides}
        return [tiny_row | {"warmup": 2}]
    return [
        {
            "workload": "gpt_bytes",
            "variant": "bf16-mixed + compile",
            "overrides": ["experiment=gpt_bytes", f"data.batch_size={batch}"],
            "warmup": 30,
        }
        for batch in batches
    ]


def rows_to_run(tiny: bool) -> list[dict[str, Any]]:
    """(workload, variant) rows: overrides of `conf/train.yaml`, warm-up steps, timed steps."""
    if tiny:  # the same code paths at sizes a 2-core CPU runs in seconds, without workers
        return [
            {**row, "plain_workers": 0, "overrides": [*row["overrides"], "data.num_workers=0"]}
            for row in [
                {"workload": "digits", "variant": "32-true", "overrides": [], "warmup": 2},
                {
                    "workload": "cifar10, cnn",
                    "variant": "bf16-mixed",
                    "overrides": [
                        *CIFAR_FILES,
                        "model=cnn",
                        "data.batch_size=16",
                        "precision=bf16-mixed",
                    ],
                    "warmup": 2,
                },
            ]
        ]
    cifar = ["experiment=cifar10_resnet", *CIFAR_FILES, "precision=bf16-mixed"]
    workers = min(8, os.cpu_count() or 1)  # the plain DataLoader's, as cifar10.yaml's are few
    rows = [
        {"workload": "digits", "variant": "32-true", "overrides": [], "warmup": 50},
        {"workload": "cifar10_resnet", "variant": "bf16-mixed", "overrides": cifar, "warmup": 30},
        {
            "workload": "cifar10_resnet",
            "variant": "bf16-mixed + compile",
            "overrides": [*cifar, "compile=default"],
            "warmup": 30,
        },
    ]
    return [{"plain_workers": 0, **rows[0]}, *({"plain_workers": workers, **r} for r in rows[1:])]


# ----------------------------------------------------------------------- in the child process


def compose_config(overrides: list[str], data_root: str, steps: int) -> DictConfig:
    from hydra import compose, initialize_config_dir

    from volt.config import CONF_DIR

    accelerator = "trainer=gpu" if torch.cuda.is_available() else "trainer=cpu"
    with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
        return compose(
            "train",
            overrides=[
                accelerator,
                *(o.format(data_root=data_root) for o in overrides),
                f"trainer.max_steps={steps}",
                "trainer.max_epochs=1000",  # max_steps ends it (an LR schedule may read this)
                "trainer.limit_val_batches=0",
                "trainer.num_sanity_val_steps=0",
                "callbacks.model_checkpoint=null",
                "callbacks.last_checkpoint=null",  # a save per epoch: timed apart from steps
                "callbacks.early_stopping=null",
                f"paths.output_dir={tempfile.mkdtemp(prefix='volt-perf-')}",
            ],
        )


class Clock(harness.Windows):
    """The windows of a side's steps; with --profile, cProfile on for the timed steps."""

    def __init__(self, device: torch.device, warmup: int, steps: int, repeats: int) -> None:
        super().__init__(warmup, steps, repeats, lambda: synchronize(device))
        self.profiler: cProfile.Profile | None = None  # --profile: the CPU's work in timed steps

    def step_done(self, step: int) -> bool:
        marked = super().step_done(step)
        if marked and self.profiler is not None and step in (self.first, self.last):
            (self.profiler.enable if step == self.first else self.profiler.disable)()
        return marked


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class SyncFinder(pl.Callback):
    """Turns torch's sync debug mode on for the timed steps: each op that makes the CPU wait for
    the GPU warns, and the warning names the Python line that called it."""

    def __init__(self, clock: Clock) -> None:
        self.first, self.last = clock.first, clock.last

    def on_train_batch_end(self, trainer: pl.Trainer, *args: object) -> None:
        if trainer.global_step == self.first:
            torch.cuda.set_sync_debug_mode("warn")
        elif trainer.global_step == self.last:
            torch.cuda.set_sync_debug_mode("default")


class ClockCallback(pl.Callback):
    def __init__(self, clock: Clock) -> None:
        self.clock = clock

    def on_train_batch_end(self, trainer: pl.Trainer, *args: object) -> None:
        self.clock.step_done(trainer.global_step)


class PerSampleImages(Dataset[tuple[Tensor, Tensor]]):
    """A hand-written loop's usual data set: one sample at a time, augmented and normalised in the
    DataLoader's workers (the same random crop and flip as volt's, torchvision-style)."""

    def __init__(self, images: Tensor, labels: Tensor, mean: Tensor, std: Tensor, pad: int) -> None:
        self.images, self.labels, self.pad = images, labels, pad
        self.mean, self.std = mean.view(-1, 1, 1), std.view(-1, 1, 1)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> tuple[Tensor, Tensor]:
        image = self.images[index]
        if self.pad:
            height, width = image.shape[-2:]
            padded = nn.functional.pad(image, (self.pad,) * 4)
            top, left = np.random.randint(0, 2 * self.pad + 1, size=2)
            image = padded[:, top : top + height, left : left + width]
            if np.random.rand() < 0.5:
                image = image.flip(-1)
        scale = 1 / 255 if image.dtype == torch.uint8 else 1.0
        return (image.float() * scale - self.mean) / self.std, self.labels[index]


def per_sample_loader(datamodule: Any, device: torch.device, workers: int) -> DataLoader[Any]:
    split, transform = datamodule.train_set, datamodule.transform(train=True)
    dataset = PerSampleImages(
        split.images,
        split.labels,
        torch.tensor(transform.mean),
        torch.tensor(transform.std),
        transform.crop_padding,
    )
    return DataLoader(
        dataset,
        batch_size=datamodule.batch_size,
        shuffle=True,
        drop_last=True,
        num_workers=workers,
        pin_memory=device.type == "cuda",
        persistent_workers=workers > 0,
    )


def forever(
    batches: Iterable[tuple[Tensor, Tensor]], trainer: "FakeTrainer | None" = None
) -> Iterator[tuple[Tensor, Tensor]]:
    """Epoch after epoch, each with a fresh shuffle: a DataLoader reshuffles by itself, volt's
    batches read the epoch from their trainer."""
    for epoch in range(1_000_000):
        if trainer is not None:
            trainer.current_epoch = epoch
        yield from batches
    raise AssertionError("unreachable: the steps run out first")


def plain_loop(
    cfg: DictConfig, side: str, clock: Clock, device: torch.device, workers: int
) -> pl.LightningModule:
    """The hand-written loop: the module's net and optimiser, the same loss, autocast and
    gradient clipping as the config asks, no Trainer."""
    from volt.build import build_datamodule, build_model
    from volt.gpu import apply_compile

    datamodule: Any = build_datamodule(cfg.data)
    datamodule.prepare_data()
    datamodule.setup("fit")
    datamodule.trainer = FakeTrainer(device)
    model: Any = build_model(cfg.model, datamodule, cfg.task.from_data).to(device)
    net = model.net
    apply_compile(net, cfg.compile.mode)
    configured = model.configure_optimizers()  # as Lightning would get it (fused, groups)
    optimizer = configured["optimizer"] if isinstance(configured, dict) else configured
    smoothing = cfg.model.get("label_smoothing", 0.0)
    clip = cfg.trainer.get("gradient_clip_val")
    dtype = {"bf16-mixed": torch.bfloat16, "16-mixed": torch.float16}.get(cfg.precision)
    scaler = torch.amp.GradScaler(device.type, enabled=dtype == torch.float16)
    if side == "synthetic":  # one of the data's batches, on the device, again and again
        x, y = (t.to(device) for t in next(iter(datamodule.train_dataloader())))
        batches: Iterator[tuple[Tensor, Tensor]] = iter(lambda: (x, y), None)
    elif side == "plain_dataloader":
        batches = forever(per_sample_loader(datamodule, device, workers))
    else:  # volt's batches, on the device when data.on_device says so
        batches = forever(datamodule.train_dataloader(), datamodule.trainer)
    net.train()
    clock.step_done(0)
    for step in range(1, clock.total + 1):
        x, y = next(batches)
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        with torch.autocast(device.type, dtype=dtype or torch.float32, enabled=dtype is not None):
            logits = net(x)  # (B, classes) or (B, T, vocabulary)
            loss = F.cross_entropy(logits.flatten(0, -2), y.flatten(), label_smoothing=smoothing)
        optimizer.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()
        if clip:
            scaler.unscale_(optimizer)
            nn.utils.clip_grad_norm_(net.parameters(), clip)
        scaler.step(optimizer)
        scaler.update()
        clock.step_done(step)
    return model


class FakeTrainer:
    """What volt's data modules ask of a trainer, for the plain loop that has none."""

    def __init__(self, device: torch.device) -> None:
        self.world_size, self.global_rank, self.overfit_batches, self.current_epoch = 1, 0, 0, 0
        self.strategy = type("Strategy", (), {"root_device": device})()


def lightning_fit(
    cfg: DictConfig, side: str, clock: Clock, device: torch.device, find_syncs: bool = False
) -> pl.LightningModule:
    from volt.build import build_datamodule, build_model, build_training

    if side == "volt":
        built = build_training(cfg, OmegaConf.to_container(cfg, resolve=True))  # type: ignore[arg-type]
        probe = SyncFinder(clock) if find_syncs else ClockCallback(clock)
        built.trainer.callbacks.append(probe)  # type: ignore[attr-defined]
        built.trainer.fit(built.model, datamodule=built.datamodule)
        return built.model
    from volt.gpu import apply_compile

    datamodule = build_datamodule(cfg.data)
    model: Any = build_model(cfg.model, datamodule, cfg.task.from_data)
    apply_compile(model.net, cfg.compile.mode)
    trainer = pl.Trainer(
        accelerator=device.type if device.type == "cpu" else "gpu",
        devices=1,
        precision=cfg.precision,
        gradient_clip_val=cfg.trainer.get("gradient_clip_val"),
        max_steps=clock.total,
        max_epochs=1000,
        limit_val_batches=0,
        num_sanity_val_steps=0,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[ClockCallback(clock)],
    )
    trainer.fit(model, datamodule=datamodule)
    return model


def find_syncs(args: argparse.Namespace) -> None:
    """Where volt's training steps make the CPU wait for the GPU: waits per step, by caller."""
    device = torch.device("cuda")
    gpt = args.workload == "gpt"
    for row in gpt_rows(args.tiny, args.gpt_batches) if gpt else rows_to_run(args.tiny):
        clock = Clock(device, row["warmup"], args.steps, 1)
        cfg = compose_config(row["overrides"], args.data_root, clock.total)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            lightning_fit(cfg, "volt", clock, device, find_syncs=True)
        waits = Counter(
            f"{w.filename}:{w.lineno}" for w in caught if "synchroniz" in str(w.message).lower()
        )
        print(f"{row['workload']} {row['variant']}: waits for the GPU per step, by caller")
        for place, count in waits.most_common():
            print(f"  {count / args.steps:6.2f}  {place}")


def run_side(args: argparse.Namespace) -> None:
    """In the child: train one side of one row and print its measurements as one JSON line."""
    from volt.callbacks.token_throughput import matmul_dtype, peak_tflops
    from volt.gpu import apply_matmul_precision

    row = json.loads(args.row)
    apply_matmul_precision(None)
    pl.seed_everything(0, verbose=False)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    clock = Clock(device, row["warmup"], args.steps, args.repeats)
    cfg = compose_config(row["overrides"], args.data_root, clock.total)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    if args.profile:
        clock.profiler = cProfile.Profile()
    if args.side in ("lightning", "volt"):
        model = lightning_fit(cfg, args.side, clock, device)
    else:
        model = plain_loop(cfg, args.side, clock, device, row["plain_workers"])
    peak = torch.cuda.max_memory_allocated() / 2**20 if device.type == "cuda" else None
    # A language model's tokens per step (batch x context) and training FLOPs per token, for
    # tokens/s and MFU; None for the image workloads.
    flops = getattr(model, "flops_per_token", lambda: None)()
    tokens = cfg.data.batch_size * cfg.data.block_size if flops else None
    peak_tf = peak_tflops(device, matmul_dtype(cfg.precision)) if flops else None
    if clock.profiler is not None:
        print_profile(clock.profiler, args.steps * args.repeats, Path(args.profile))
    result = {"ms": clock.ms_per_step(), "peak_mib": peak, "batch": cfg.data.batch_size}
    result |= {"tokens_per_step": tokens, "flops_per_token": flops, "peak_tflops": peak_tf}
    print(harness.result_line(result))


def print_profile(profiler: cProfile.Profile, steps: int, to: Path) -> None:
    """The CPU's time per step by function (cProfile's own cost inflates Python-heavy parts, so
    read it side against side): the 40 largest cumulative entries outside torch's internals."""
    to.parent.mkdir(parents=True, exist_ok=True)
    profiler.dump_stats(to)
    text = io.StringIO()
    stats = pstats.Stats(profiler, stream=text).sort_stats("cumulative")
    stats.print_stats(r"volt|lightning|perf\.py", 40)
    total_ms = 1e3 * sum(row[2] for row in stats.stats.values()) / steps  # type: ignore[attr-defined]
    summary = f"{to.name}: {total_ms:.2f} ms of CPU self time per step under cProfile\n"
    to.with_suffix(".txt").write_text(summary + text.getvalue())
    print(summary, file=sys.stderr)


# ---------------------------------------------------------------------- in the parent process


def measure(row: dict[str, Any], side: str, args: argparse.Namespace) -> dict[str, Any]:
    name = f"{row['workload']}_{row['variant']}_{side}".replace(" ", "").replace(",", "_")
    command = [sys.executable, __file__, "--side", side, "--row", json.dumps(row)]
    command += ["--steps", str(args.steps), "--repeats", str(args.repeats)]
    command += ["--data-root", args.data_root]
    if args.profile:
        command += ["--profile", str(Path(args.profile) / f"{name}.prof")]
    done = harness.run_fresh(command, Path(args.logs, f"{name}.log"), cwd=REPO).check(command)
    if (result := done.result()) is None:
        raise RuntimeError(f"{side} on {row['workload']} printed no result: see {done.log}")
    return result | {"wall_s": done.wall_s}


def summarise(row: dict[str, Any], results: dict[str, dict[str, Any]]) -> dict[str, Any]:
    ms = {side: statistics.median(r["ms"]) for side, r in results.items()}
    spread = {side: harness.spread(r["ms"]) for side, r in results.items()}
    first = next(iter(results.values()))
    summary = {
        "workload": row["workload"],
        "variant": row["variant"],
        "batch": first["batch"],
        "ms": ms,
        "spread": spread,
        "share_of_limit": {side: ms["synthetic"] / ms[side] for side in ms},
        "volt_over_plain_volt_data": ms["volt"] / ms["plain_volt_data"],
        "volt_over_plain_dataloader": (
            ms["volt"] / ms["plain_dataloader"] if "plain_dataloader" in ms else None
        ),
        "peak_mib": {side: r["peak_mib"] for side, r in results.items()},
        "wall_s": sum(r["wall_s"] for r in results.values()),
    }
    if first["tokens_per_step"]:
        tokens_per_s = {side: 1e3 * first["tokens_per_step"] / ms[side] for side in ms}
        summary["tokens_per_s"] = tokens_per_s
        if first["peak_tflops"]:
            flops = first["flops_per_token"] / (first["peak_tflops"] * 1e12)
            summary["mfu"] = {side: flops * t for side, t in tokens_per_s.items()}
    return summary


def markdown(rows: list[dict[str, Any]], header: str) -> str:
    columns = ["workload", "variant", *(SIDE_NAMES[s] for s in SIDES)]
    columns += ["volt / plain, volt data", "volt / plain DataLoader", "volt's share of the limit"]
    columns.append("peak MiB, volt / plain (volt data / DataLoader)")
    lines = [header, "", *harness.markdown_table(columns, "ll" + "r" * (len(SIDES) + 4), [])]
    for r in rows:
        peak = r["peak_mib"]
        peaks = (
            f"{peak['volt']:.0f} / {peak['plain_volt_data']:.0f} / {peak['plain_dataloader']:.0f}"
            if peak["volt"] is not None
            else "n/a (CPU)"
        )
        cells = [f"{r['workload']}, batch {r['batch']}", r["variant"]]
        cells += [f"{r['ms'][s]:.2f} ±{100 * r['spread'][s]:.0f}%" for s in SIDES]
        cells += [f"{r['volt_over_plain_volt_data']:.3f}", f"{r['volt_over_plain_dataloader']:.3f}"]
        lines.append(harness.row_line([*cells, f"{100 * r['share_of_limit']['volt']:.1f}%", peaks]))
    return "\n".join(lines)


def markdown_gpt(rows: list[dict[str, Any]], header: str) -> str:
    columns = ["workload", "variant", *(SIDE_NAMES[s] for s in GPT_SIDES)]
    columns += ["volt / plain, volt data (tokens/s)", "peak MiB, volt / plain"]
    lines = [header, "", *harness.markdown_table(columns, "ll" + "r" * (len(GPT_SIDES) + 2), [])]
    for r in rows:
        mfu, peak, tokens = r.get("mfu") or {}, r["peak_mib"], r["tokens_per_s"]
        cells = [f"{r['workload']}, batch {r['batch']}", r["variant"]]
        cells += [
            f"{tokens[s] / 1e3:.0f}k"
            + (f", {100 * mfu[s]:.1f}% MFU" if s in mfu else "")
            + f" ±{100 * r['spread'][s]:.0f}%"
            for s in GPT_SIDES
        ]
        cells.append(f"{tokens['volt'] / tokens['plain_volt_data']:.3f}")
        peaks = "n/a (CPU)"
        if peak["volt"] is not None:
            peaks = f"{peak['volt']:.0f} / {peak['plain_volt_data']:.0f}"
        lines.append(harness.row_line([*cells, peaks]))
    return "\n".join(lines)


def device_name() -> str:
    # Asked only once a row is measured: the parent's CUDA is not started before the first side.
    return torch.cuda.get_device_name() if torch.cuda.is_available() else "CPU"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--tiny", action="store_true", help="toy sizes for the CPU (CI)")
    parser.add_argument(
        "--workload",
        choices=MARKERS,
        default="images",
        help="images: digits and CIFAR-10 (step time); gpt: the GPT task (tokens/s and MFU)",
    )
    parser.add_argument(
        "--gpt-batches", type=int, nargs="+", default=[16, 64], help="batch sizes of the gpt rows"
    )
    parser.add_argument("--steps", type=int, help="steps per timed window (100; tiny: 4)")
    parser.add_argument("--repeats", type=int, default=3, help="timed windows per side")
    parser.add_argument(
        "--readme", nargs="?", const=str(README), help="rewrite this README's table"
    )
    parser.add_argument("--json", help="also write the rows here")
    parser.add_argument("--data-root", help="where fake CIFAR-10 files are written (a temp dir)")
    parser.add_argument(
        "--find-syncs", action="store_true", help="only list where volt's steps wait for the GPU"
    )
    parser.add_argument(
        "--profile",
        metavar="DIR",
        help="cProfile the timed steps of the bare Lightning and volt sides into DIR (a .prof and"
        " a .txt per side): where each spends its CPU time per step",
    )
    parser.add_argument(
        "--sides", nargs="+", choices=SIDES, help="measure only these (no table; rows printed)"
    )
    parser.add_argument(
        "--extra",
        nargs="+",
        default=[],
        metavar="OVERRIDE",
        help="config overrides added to every row, e.g. callbacks.finite_guard=null: what one"
        " part of volt's default setup costs",
    )
    parser.add_argument("--only", help="only the row '<workload> <variant>'")
    parser.add_argument("--side", choices=SIDES, help=argparse.SUPPRESS)
    parser.add_argument("--row", help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.steps = args.steps or (4 if args.tiny else 100)
    if args.side:
        run_side(args)
        return
    page = harness.Page(Path(args.readme), *MARKERS[args.workload]) if args.readme else None
    if page:  # before minutes are spent measuring
        page.check("perf")
    if args.data_root is None:
        args.data_root = tempfile.mkdtemp(prefix="volt-perf-data-")
        fake_cifar10.write(Path(args.data_root), per_file=200 if args.tiny else 10_000)
    args.logs = tempfile.mkdtemp(prefix="volt-perf-logs-")  # each side's output
    if args.find_syncs:
        find_syncs(args)
        return
    started = time.perf_counter()
    rows = []
    gpt = args.workload == "gpt"
    for row in gpt_rows(args.tiny, args.gpt_batches) if gpt else rows_to_run(args.tiny):
        row.setdefault("plain_workers", 0)
        if args.only and args.only != f"{row['workload']} {row['variant']}":
            continue
        row["overrides"] = [*row["overrides"], *args.extra]
        sides = ("lightning", "volt") if args.profile else GPT_SIDES if gpt else SIDES
        results = {side: measure(row, side, args) for side in args.sides or sides}
        if args.profile or args.sides:
            print(json.dumps({"row": row, "results": results}), flush=True)
            continue
        rows.append(summarise(row, results))
        print(json.dumps(rows[-1]), flush=True)  # a row at a time: a cut-off run keeps its rows
        if args.json:
            harness.save_json(Path(args.json), {"device": device_name(), "rows": rows})
    if args.profile or args.sides:
        return
    device = device_name()
    header = (
        f"Measured {time.strftime('%Y-%m-%d')} on {device}, torch {torch.__version__}, Lightning"
        f" {pl.__version__}, by `python benchmarks/perf.py{' --tiny' if args.tiny else ''}`"
        f"{' --workload gpt' if gpt else ''} ({time.perf_counter() - started:.0f} s): "
        + ("training tokens/s (MFU: of the GPU's dense bf16 peak)" if gpt else "ms per step")
        + f", median of {args.repeats} windows of {args.steps} steps, ± their spread."
    )
    table = (markdown_gpt if gpt else markdown)(rows, header)
    print(f"\n{table}")
    if page:
        page.write(table)


if __name__ == "__main__":
    main()
