"""volt's performance table: step time of volt against a plain PyTorch loop and the GPU's limit.

    python benchmarks/perf.py --readme      # on a GPU: measure, print, rewrite README's table
    python benchmarks/perf.py --tiny        # on the CPU, toy sizes, a minute: CI runs this

Each row is a workload in one precision and compile mode. Each side trains the same net with the
same optimiser and batch size, in a fresh process of its own (several compiled models in one
process crashed inductor's kernel launcher on torch 2.11: "CUDA driver error: invalid argument"):

- synthetic:        a plain loop on one batch already on the device: the limit.
- plain DataLoader: a plain loop fed as most hand-written ones are: a Dataset that augments and
                    normalises a sample at a time, a DataLoader with workers and pinned memory.
- plain, volt data: a plain loop fed by volt's batches (on a GPU: the data set held there and
                    augmented whole batches at a time, as `data.on_device` picks).
- bare Lightning:   volt's modules in a Trainer with no callbacks, logger or checkpoints, at
                    volt's logging interval (`trainer.log_every_n_steps`: the modules `self.log`
                    their loss on those steps, so they do the same work on both sides; with no
                    logger Lightning never reads the values, which volt's logger does).
- volt:             the Trainer, callbacks and logger volt builds from `conf/`, as `python
                    train.py` runs it, less validation, checkpoints and early stopping (no other
                    side saves or validates; digits' epochs are 19 steps).

After a warm-up (which absorbs compilation) each side times `--repeats` windows of `--steps`
steps, synchronising the device only at the windows' edges. The table shows the median ms per
step ± the spread over windows, samples/s as a share of the synthetic side's, and peak GPU memory.
"""

import argparse
import cProfile
import io
import itertools
import json
import math
import os
import pstats
import re
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
from lightning.pytorch.callbacks import LambdaCallback
from omegaconf import DictConfig, OmegaConf
from torch import Tensor, nn
from torch.utils.data import DataLoader, Dataset

REPO = Path(__file__).resolve().parents[1]
README = REPO / "docs" / "performance.md"
MARKERS = {  # the README's two tables, each between its pair of markers
    "images": ("<!-- perf-table:begin -->", "<!-- perf-table:end -->"),
    "gpt": ("<!-- perf-gpt:begin -->", "<!-- perf-gpt:end -->"),
}
SIDE_NAMES = {
    "synthetic": "synthetic (limit)",
    "plain_dataloader": "plain, DataLoader",
    "plain_volt_data": "plain, volt data",
    "lightning": "bare Lightning",
    "volt": "volt",
}
SIDES = tuple(SIDE_NAMES)
GPT_SIDES = ("synthetic", "plain_volt_data", "lightning", "volt")  # its data is one byte array
COLUMNS = {
    "images": [
        *("workload", "variant", *(SIDE_NAMES[s] for s in SIDES)),
        *("volt / plain, volt data", "volt / plain DataLoader"),
        "volt's share of the synthetic side: same mode / fastest mode",
        "peak MiB, volt / plain (volt data / DataLoader)",
        "targets missed",
    ],
    "gpt": [
        *("workload", "variant", *(SIDE_NAMES[s] for s in GPT_SIDES)),
        *("volt / plain, volt data (tokens/s)", "peak MiB, volt / plain"),
    ],
}


def row(workload: str, variant: str, overrides: list[str], warmup: int, workers: int = 0) -> dict:
    """A row: overrides of `conf/train.yaml`, warm-up steps, the plain DataLoader's workers."""
    keys = ("workload", "variant", "overrides", "warmup", "plain_workers")
    return dict(zip(keys, (workload, variant, overrides, warmup, workers), strict=True))


# variant, compile mode, warm-up steps: they absorb compilation, CUDA graphs' capture, and volt's
# first logging step (cifar10_resnet and gpt_bytes log every 50): that step's first use of the
# logging ops' kernels took 55 ms of host time once per process on an H200 (torch.profiler,
# 2026-11-29), which had landed in the first timed window.
CIFAR_MODES = (
    ("bf16-mixed", "off", 60),
    ("bf16-mixed + compile", "default", 60),
    ("bf16-mixed + CUDA graphs", "reduce-overhead", 60),
)


def rows_to_run(workload: str, tiny: bool, gpt_batches: list[int]) -> list[dict[str, Any]]:
    """Tiny: the same code paths at sizes a 2-core CPU runs in seconds, eager, without workers."""
    files = ["data=cifar10", "data.root={data_root}", "data.download=false"]
    if workload == "gpt" and tiny:
        gpt = ["experiment=gpt_bytes_tiny", "data.batch_size=8", "data.block_size=64"]
        gpt.append("model.scheduler.warmup_steps=0")  # the run is a few steps long
        return [row("gpt_bytes_tiny", "32-true", gpt, 2)]
    if workload == "gpt":  # 12 layers, width 768, context 1024
        variant = "bf16-mixed + compile"
        gpt_rows = [["experiment=gpt_bytes", f"data.batch_size={batch}"] for batch in gpt_batches]
        return [row("gpt_bytes", variant, overrides, 60) for overrides in gpt_rows]
    if tiny:
        cnn = [*files, "model=cnn", "data.batch_size=16", "precision=bf16-mixed"]
        return [
            row("digits", "32-true", ["data.num_workers=0"], 2),
            row("cifar10, cnn", "bf16-mixed", [*cnn, "data.num_workers=0"], 2),
        ]
    cifar = ["experiment=cifar10_resnet", *files, "precision=bf16-mixed"]
    workers = min(8, os.cpu_count() or 1)  # the plain DataLoader's, as cifar10.yaml's are few
    return [
        row("digits", "32-true", [], 50),
        *(
            row("cifar10_resnet", variant, [*cifar, f"compile={mode}"], warmup, workers)
            for variant, mode, warmup in CIFAR_MODES
        ),
    ]


# ----------------------------------------------------------------------- in the child process


def compose_config(overrides: list[str], data_root: str, steps: int) -> DictConfig:
    return harness.compose(
        [
            "trainer=gpu" if torch.cuda.is_available() else "trainer=cpu",
            *(o.replace("{data_root}", data_root) for o in overrides),  # ${...} left alone
            f"trainer.max_steps={steps}",
            "trainer.max_epochs=1000",  # max_steps ends it (an LR schedule may read this)
            "trainer.limit_val_batches=0",
            "trainer.num_sanity_val_steps=0",
            "callbacks.model_checkpoint=null",
            "callbacks.last_checkpoint=null",  # a save per epoch: timed apart from steps
            "callbacks.early_stopping=null",
            f"paths.output_dir={tempfile.mkdtemp(prefix='volt-perf-')}",
        ]
    )


class Clock(harness.Windows):
    """The windows of a side's steps; with --profile, cProfile on for the timed steps; with
    --trace, torch.profiler (CPU and CUDA) on for them."""

    def __init__(self, device: torch.device, warmup: int, steps: int, repeats: int) -> None:
        super().__init__(warmup, steps, repeats, lambda: harness.synchronize(device))
        self.profiler: cProfile.Profile | None = None
        self.tracer: torch.profiler.profile | None = None
        self.ticks: dict[int, float] = {}  # host clock once each timed step is wholly done

    def tick(self, step: int) -> None:
        """The host's clock once `step` steps are done, all their work included: a Trainer's
        side calls it as the next batch starts, after Lightning has read and written the logged
        values (that comes after every on_train_batch_end)."""
        if self.first <= step <= self.last:
            self.ticks[step] = time.perf_counter()

    def step_done(self, step: int) -> bool:
        marked = super().step_done(step)
        if marked and self.profiler is not None and step in (self.first, self.last):
            (self.profiler.enable if step == self.first else self.profiler.disable)()
        if marked and self.tracer is not None and step in (self.first, self.last):
            (self.tracer.start if step == self.first else self.tracer.stop)()
        return marked


def clock_callback(clock: Clock) -> pl.Callback:
    return LambdaCallback(
        on_train_batch_start=lambda trainer, *_: clock.tick(trainer.global_step),
        on_train_batch_end=lambda trainer, *_: clock.step_done(trainer.global_step),
    )


class SyncFinder(pl.Callback):
    """torch's sync debug mode on for the timed steps: each op that makes the CPU wait for the
    GPU warns, and the warning names the Python line that called it."""

    def __init__(self, clock: Clock) -> None:
        self.modes = {clock.last: "default", clock.first: "warn"}

    def on_train_batch_end(self, trainer: pl.Trainer, *args: object) -> None:
        if trainer.global_step in self.modes:
            torch.cuda.set_sync_debug_mode(self.modes[trainer.global_step])


class PerSampleImages(Dataset[tuple[Tensor, Tensor]]):
    """A hand-written loop's usual data set: a sample at a time, augmented and normalised in the
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
    mean, std = torch.tensor(transform.mean), torch.tensor(transform.std)
    dataset = PerSampleImages(split.images, split.labels, mean, std, transform.crop_padding)
    return DataLoader(
        dataset, batch_size=datamodule.batch_size, shuffle=True, drop_last=True,
        num_workers=workers, pin_memory=device.type == "cuda", persistent_workers=workers > 0,
    )  # fmt: skip


def forever(batches: Iterable[Any], trainer: Any = None) -> Iterator[tuple[Tensor, Tensor]]:
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
    datamodule.trainer = harness.trainer_stand_in(device)
    model: Any = build_model(cfg.model, datamodule, cfg.task.from_data).to(device)
    apply_compile(model.net, cfg.compile.mode)
    configured = model.configure_optimizers()  # as Lightning would get it (fused, groups)
    optimizer = configured["optimizer"] if isinstance(configured, dict) else configured
    smoothing, clip = cfg.model.get("label_smoothing", 0.0), cfg.trainer.get("gradient_clip_val")
    step = harness.plain_step(model.net, optimizer, device, cfg.precision, smoothing, clip)
    if side == "synthetic":  # one of the data's batches, on the device, again and again
        x, y = (t.to(device) for t in next(iter(datamodule.train_dataloader())))
        batches: Iterator[tuple[Tensor, Tensor]] = iter(lambda: (x, y), None)
    elif side == "plain_dataloader":
        batches = forever(per_sample_loader(datamodule, device, workers))
    else:  # volt's batches, on the device when data.on_device says so
        batches = forever(datamodule.train_dataloader(), datamodule.trainer)
    model.net.train()
    clock.step_done(0)
    for n in range(1, clock.total + 1):
        step(*next(batches))
        clock.tick(n)
        clock.step_done(n)
    return model


def volt_fit(cfg: DictConfig, probe: pl.Callback) -> pl.LightningModule:
    from volt.build import build_training

    built = build_training(cfg, OmegaConf.to_container(cfg, resolve=True))  # type: ignore[arg-type]
    built.trainer.callbacks.append(probe)  # type: ignore[attr-defined]
    built.trainer.fit(built.model, datamodule=built.datamodule)
    return built.model


def bare_fit(cfg: DictConfig, clock: Clock, device: torch.device) -> pl.LightningModule:
    from volt.build import build_datamodule, build_model
    from volt.gpu import apply_compile

    datamodule = build_datamodule(cfg.data)
    model: Any = build_model(cfg.model, datamodule, cfg.task.from_data)
    apply_compile(model.net, cfg.compile.mode)
    trainer = pl.Trainer(
        accelerator=device.type if device.type == "cpu" else "gpu", devices=1,
        precision=cfg.precision, gradient_clip_val=cfg.trainer.get("gradient_clip_val"),
        max_steps=clock.total, max_epochs=1000, limit_val_batches=0, num_sanity_val_steps=0,
        log_every_n_steps=cfg.trainer.log_every_n_steps, logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        callbacks=[clock_callback(clock)],
    )  # fmt: skip
    trainer.fit(model, datamodule=datamodule)
    return model


def find_syncs(args: argparse.Namespace) -> None:
    """Where volt's training steps make the CPU wait for the GPU: waits per step, by caller."""
    for row in rows_to_run(args.workload, args.tiny, args.gpt_batches):
        if args.only and args.only != f"{row['workload']} {row['variant']}":
            continue
        clock = Clock(torch.device("cuda"), row["warmup"], args.steps, 1)
        cfg = compose_config([*row["overrides"], *args.extra], args.data_root, clock.total)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            volt_fit(cfg, SyncFinder(clock))
        waits = Counter(
            f"{w.filename}:{w.lineno}" for w in caught if "synchroniz" in str(w.message).lower()
        )
        print(f"{row['workload']} {row['variant']}: waits for the GPU per step, by caller")
        for place, count in waits.most_common():
            print(f"  {count / args.steps:6.2f}  {place}")


def run_side(args: argparse.Namespace) -> None:
    """In the child: train one side of one row and print its measurements as one result line."""
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
    if args.trace:
        activities = [torch.profiler.ProfilerActivity.CPU]
        if device.type == "cuda":
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        clock.tracer = torch.profiler.profile(activities=activities)
    if args.side == "volt":
        model = volt_fit(cfg, clock_callback(clock))
    elif args.side == "lightning":
        model = bare_fit(cfg, clock, device)
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
    if clock.tracer is not None:
        print_trace(clock.tracer, args.steps * args.repeats, Path(args.trace))
    result = {"ms": clock.ms_per_step(), "peak_mib": peak, "batch": cfg.data.batch_size}
    result["host"] = host_steps(clock, cfg.trainer.log_every_n_steps)
    result |= {"tokens_per_step": tokens, "flops_per_token": flops, "peak_tflops": peak_tf}
    print(harness.result_line(result))


def host_steps(clock: Clock, log_every: int | None) -> dict[str, Any]:
    """The host's time per timed step, read without waiting for the device: where the host is
    what bounds a step (CUDA graphs, small nets), the step's own time; elsewhere how far ahead the
    host runs. Split into volt's logging steps (every `log_every`, where Lightning reads the logged
    values and the callbacks do their periodic work) and the others, whose median is also given
    window by window; the five slowest steps. The
    steps at and after each window's edge are left out: the clock's wait for the device is there."""
    edges = range(clock.first, clock.last + 1, clock.steps)
    skipped = {*edges, *(edge + 1 for edge in edges)}
    steps = sorted(clock.ticks)
    ms = {
        b: 1e3 * (clock.ticks[b] - clock.ticks[a])
        for a, b in itertools.pairwise(steps)
        if b not in skipped
    }
    every = log_every or 0  # 0 or None: volt logs nothing, no step is a logging step
    logging = [t for s, t in ms.items() if every and s % every == 0]
    others = {s: t for s, t in ms.items() if not every or s % every}
    slowest = sorted(ms.items(), key=lambda item: -item[1])[:5]
    # Window by window: whether a side's ordinary step gets slower as training goes on (volt's
    # third CUDA-graphs window was its slowest in three rounds of three, 2026-11-29).
    by_window = [
        [t for s, t in others.items() if edge < s <= edge + clock.steps] for edge in edges[:-1]
    ]
    return {
        "median_ms": statistics.median(others.values()) if others else None,
        "window_median_ms": [round(statistics.median(w), 3) if w else None for w in by_window],
        "logging_step_ms": statistics.median(logging) if logging else None,
        "logging_steps": len(logging),
        "slowest": [[s, round(t, 2)] for s, t in slowest],
    }


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


# Runtime calls after which the host waits for the device (a copy to the host is one too).
HOST_WAITS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize")


def print_trace(tracer: torch.profiler.profile, steps: int, to: Path) -> None:
    """torch.profiler's view of the timed steps: a Chrome trace (chrome://tracing, Perfetto) and
    a table of the ops and runtime calls by self CPU time, with the host's waits per step."""
    to.parent.mkdir(parents=True, exist_ok=True)
    tracer.export_chrome_trace(str(to.with_suffix(".json")))
    events = tracer.key_averages()
    waits = {e.key: e.count / steps for e in events if e.key in HOST_WAITS and e.count}
    copies = sum(e.count for e in events if e.key in ("cudaMemcpyAsync", "cudaMemcpy")) / steps
    launches = sum(e.count for e in events if e.key.startswith("cudaLaunch")) / steps
    summary = (
        f"{to.name}: per step {launches:.1f} kernel launches, {copies:.1f} memcpy calls,"
        f" host waits {waits or 'none'}"
    )
    table = events.table(sort_by="self_cpu_time_total", row_limit=45, max_name_column_width=70)
    gaps = "\n".join(longest_gaps(tracer.events()))
    to.with_suffix(".txt").write_text(f"{summary}\n\n{gaps}\n\n{table}\n")
    print(summary, file=sys.stderr)


def longest_gaps(events: Any, count: int = 4, shortest_op_ms: float = 0.15) -> list[str]:
    """The host's longest stretches between one optimizer step and the next (an epoch's end and
    start, a logging step), each with the ops of at least `shortest_op_ms` that ran on the
    stepping thread in it, outermost only. In a Trainer the forward and backward run inside the
    optimizer's step (its closure), so a gap there is the loop's own work; in a plain loop it
    holds them too. Time in a gap that no op covers is Python's (a hook, a collection, logging)."""
    steps = sorted(
        (e for e in events if e.name.startswith("Optimizer.step#")),
        key=lambda e: e.time_range.start,
    )
    gaps = sorted(
        itertools.pairwise(steps),
        key=lambda pair: pair[1].time_range.start - pair[0].time_range.end,
        reverse=True,
    )
    lines = [f"the {min(count, len(gaps))} longest gaps between optimizer steps (ms):"]
    for done, next_step in gaps[:count]:
        start, end = done.time_range.end, next_step.time_range.start
        ops = [
            e
            for e in events
            if e.thread == done.thread
            and e.cpu_parent is None
            and start <= e.time_range.start < end
            and e.time_range.elapsed_us() >= 1e3 * shortest_op_ms
        ]
        listed = ", ".join(f"{e.name} {e.time_range.elapsed_us() / 1e3:.2f}" for e in ops)
        lines.append(f"  {(end - start) / 1e3:.2f}: {listed or 'no op that long'}")
    return lines


# ---------------------------------------------------------------------- in the parent process


def measure(
    row: dict[str, Any], side: str, args: argparse.Namespace, turn: int = 0
) -> dict[str, Any]:
    # letters, digits, '.', '_' and '-' alone: files with a '+' did not come back from the GPU
    # machine (2026-11-28)
    name = re.sub(r"[^A-Za-z0-9._-]+", "_", f"{row['workload']}_{row['variant']}_{side}")
    name += f"_round{turn + 1}" if args.rounds > 1 else ""  # each round's profile kept
    command = [sys.executable, __file__, "--side", side, "--row", json.dumps(row)]
    command += ["--steps", str(args.steps), "--repeats", str(args.repeats)]
    command += ["--data-root", args.data_root]
    if args.profile:
        command += ["--profile", str(Path(args.profile) / f"{name}.prof")]
    if args.trace:
        command += ["--trace", str(Path(args.trace) / f"{name}.trace")]
    done = harness.run_fresh(command, Path(args.logs, f"{name}.log"), cwd=REPO).check(command)
    if (result := done.result()) is None:
        raise RuntimeError(f"{side} on {row['workload']} printed no result: see {done.log}")
    return result | {"wall_s": done.wall_s}


def measure_rounds(row: dict[str, Any], sides: list[str], args: argparse.Namespace) -> dict:
    """Each side `--rounds` times, in turn forwards and backwards (A B C, C B A, ...): where the
    host bounds a step, its speed drifts over minutes (one H200's host: a side's windows 8.9 to
    13.3 ms in one run, 2026-11-29), so sides measured minutes apart differ by more than volt's
    cost. A side's windows are pooled over the rounds; `paired` has volt's step over each other
    side's within each round, which the drift between rounds leaves out."""
    runs = []
    for turn in range(args.rounds):
        order = sides if turn % 2 == 0 else sides[::-1]
        runs.append({side: measure(row, side, args, turn) for side in order})
    pooled = {
        side: runs[0][side]
        | {
            "ms": [ms for run in runs for ms in run[side]["ms"]],
            "host": [run[side]["host"] for run in runs],
            "wall_s": sum(run[side]["wall_s"] for run in runs),
        }
        for side in sides
    }
    if "volt" in sides and args.rounds > 1:
        medians = [{side: statistics.median(run[side]["ms"]) for side in sides} for run in runs]
        pooled["volt"]["paired"] = {
            side: [m["volt"] / m[side] for m in medians] for side in sides if side != "volt"
        }
    return pooled


def summarise(row: dict[str, Any], results: dict[str, dict[str, Any]]) -> dict[str, Any]:
    ms = {side: statistics.median(r["ms"]) for side, r in results.items()}
    first = next(iter(results.values()))
    paired = results["volt"].get("paired")
    summary = {
        "workload": row["workload"],
        "variant": row["variant"],
        "batch": first["batch"],
        "ms": ms,
        "spread": {side: harness.spread(r["ms"]) for side, r in results.items()},
        "share_of_limit": {side: ms["synthetic"] / ms[side] for side in ms},
        "volt_over_plain_volt_data": ms["volt"] / ms["plain_volt_data"],
        # within each round where there were several (the host's drift left out), else pooled
        "volt_over_lightning": statistics.median(paired["lightning"])
        if paired
        else ms["volt"] / ms["lightning"],
        "volt_over_plain_dataloader": (
            ms["volt"] / ms["plain_dataloader"] if "plain_dataloader" in ms else None
        ),
        "peak_mib": {side: r["peak_mib"] for side, r in results.items()},
        "host": {side: r["host"] for side, r in results.items()},
        "paired": paired,
        "wall_s": sum(r["wall_s"] for r in results.values()),
    }
    if first["tokens_per_step"]:
        tokens_per_s = {side: 1e3 * first["tokens_per_step"] / ms[side] for side in ms}
        summary["tokens_per_s"] = tokens_per_s
        if first["peak_tflops"]:
            flops = first["flops_per_token"] / (first["peak_tflops"] * 1e12)
            summary["mfu"] = {side: flops * t for side, t in tokens_per_s.items()}
    return summary


SHARE_TARGET = 0.95  # volt's samples/s as a share of the synthetic side's in the same mode


def with_targets(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each image row's share of its workload's limit (the fastest synthetic side over its compile
    modes) and the targets it misses: volt at 95% of the synthetic side in the same mode, and
    volt's step no slower than bare Lightning's on the default (digits) run."""
    limit: dict[str, float] = {}
    for r in rows:
        fastest = min(limit.get(r["workload"], math.inf), r["ms"]["synthetic"])
        limit[r["workload"]] = fastest
    for r in rows:
        r["share_of_workload_limit"] = limit[r["workload"]] / r["ms"]["volt"]
        r["misses"] = []
        if r["share_of_limit"]["volt"] < SHARE_TARGET:
            r["misses"].append(f"volt < {100 * SHARE_TARGET:.0f}% of synthetic")
        if r["workload"] == "digits" and r["volt_over_lightning"] > 1:
            r["misses"].append("volt slower than bare Lightning")
    return rows


def peaks(r: dict[str, Any], sides: list[str]) -> str:
    if r["peak_mib"]["volt"] is None:
        return "n/a (CPU)"
    return " / ".join(f"{r['peak_mib'][s]:.0f}" for s in sides)


def image_cells(r: dict[str, Any]) -> list[str]:
    cells = [f"{r['workload']}, batch {r['batch']}", r["variant"]]
    cells += [f"{r['ms'][s]:.2f} ±{100 * r['spread'][s]:.0f}%" for s in SIDES]
    cells += [f"{r['volt_over_plain_volt_data']:.3f}", f"{r['volt_over_plain_dataloader']:.3f}"]
    peak = peaks(r, ["volt", "plain_volt_data", "plain_dataloader"])
    shares = f"{100 * r['share_of_limit']['volt']:.1f}% / {100 * r['share_of_workload_limit']:.1f}%"
    return [*cells, shares, peak, "; ".join(r["misses"]) or "none"]


def gpt_cells(r: dict[str, Any]) -> list[str]:
    cells = [f"{r['workload']}, batch {r['batch']}", r["variant"]]
    mfu, tokens = r.get("mfu") or {}, r["tokens_per_s"]
    for s in GPT_SIDES:
        share = f", {100 * mfu[s]:.1f}% MFU" if s in mfu else ""
        cells.append(f"{tokens[s] / 1e3:.0f}k{share} ±{100 * r['spread'][s]:.0f}%")
    ratio = tokens["volt"] / tokens["plain_volt_data"]
    return [*cells, f"{ratio:.3f}", peaks(r, ["volt", "plain_volt_data"])]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--tiny", action="store_true", help="toy sizes for the CPU (CI)")
    parser.add_argument(
        "--workload", choices=MARKERS, default="images",
        help="images: digits and CIFAR-10 (step time); gpt: the GPT task (tokens/s and MFU)",
    )  # fmt: skip
    parser.add_argument(
        "--gpt-batches", type=int, nargs="+", default=[16, 64], help="batch sizes of the gpt rows"
    )
    parser.add_argument("--steps", type=int, help="steps per timed window (100; tiny: 4)")
    parser.add_argument("--repeats", type=int, default=3, help="timed windows per side")
    parser.add_argument(
        "--rounds", type=int, default=1,
        help="measure every side this many times, in alternating order; the table pools their"
        " windows, and the JSON adds volt over each side within each round (`paired`)",
    )  # fmt: skip
    parser.add_argument(
        "--readme", nargs="?", const=str(README), help="rewrite this README's table"
    )
    parser.add_argument("--json", help="also write the rows here")
    parser.add_argument("--data-root", help="where fake CIFAR-10 files are written (a temp dir)")
    parser.add_argument(
        "--find-syncs", action="store_true", help="only list where volt's steps wait for the GPU"
    )
    parser.add_argument(
        "--profile", metavar="DIR",
        help="cProfile the timed steps of the bare Lightning and volt sides into DIR (a .prof and"
        " a .txt per side): where each spends its CPU time per step",
    )  # fmt: skip
    parser.add_argument(
        "--trace", metavar="DIR",
        help="torch.profiler (CPU and CUDA) over the timed steps of the bare Lightning and volt"
        " sides into DIR: a Chrome trace and a table per side, with host waits per step",
    )  # fmt: skip
    parser.add_argument(
        "--sides", nargs="+", choices=SIDES, help="measure only these (no table; rows printed)"
    )
    parser.add_argument(
        "--extra", nargs="+", default=[], metavar="OVERRIDE",
        help="config overrides added to every row, e.g. callbacks.finite_guard=null: what one"
        " part of volt's default setup costs",
    )  # fmt: skip
    parser.add_argument("--only", help="only the row '<workload> <variant>'")
    parser.add_argument("--side", choices=SIDES, help=argparse.SUPPRESS)
    parser.add_argument("--row", help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.steps = args.steps or (4 if args.tiny else 100)
    if args.rounds < 1:
        parser.error(f"--rounds {args.rounds}: measure every side at least once, e.g. --rounds 3")
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
    console, rows, gpt = harness.Console(), [], args.workload == "gpt"
    for row in rows_to_run(args.workload, args.tiny, args.gpt_batches):
        if args.only and args.only != f"{row['workload']} {row['variant']}":
            continue
        row["overrides"] = [*row["overrides"], *args.extra]
        traced = args.profile or args.trace
        sides = ("lightning", "volt") if traced else GPT_SIDES if gpt else SIDES
        results = measure_rounds(row, list(args.sides or sides), args)
        if traced or args.sides:
            print(json.dumps({"row": row, "results": results}), flush=True)
            continue
        rows.append(summarise(row, results))
        print(json.dumps(rows[-1]), flush=True)  # a row at a time: a cut-off run keeps its rows
        if args.json:
            harness.save_json(Path(args.json), {"device": harness.device_name(), "rows": rows})
    if args.profile or args.trace or args.sides:
        return
    # The device is asked only now: the parent's CUDA is not started before the first side.
    about = harness.versions() | {"device": harness.device_name()}
    header = (
        f"Measured {about['date']} on {about['device']}, torch {about['torch']}, Lightning"
        f" {about['lightning']}, by `python benchmarks/perf.py{' --tiny' if args.tiny else ''}`"
        f"{' --workload gpt' if gpt else ''} ({console.elapsed():.0f} s): "
        + ("training tokens/s (MFU: of the GPU's dense bf16 peak)" if gpt else "ms per step")
        + f", median of {args.repeats * args.rounds} windows of {args.steps} steps"
        + (f" ({args.rounds} rounds of the sides in turn)" if args.rounds > 1 else "")
        + ", ± their spread."
    )
    columns, align = COLUMNS[args.workload], "ll" + "r" * (len(COLUMNS[args.workload]) - 2)
    if not gpt:
        with_targets(rows)
        if args.json:  # the rows again, with their shares of the limit and their misses
            harness.save_json(Path(args.json), {"device": about["device"], "rows": rows})
    cells = [gpt_cells(r) for r in rows] if gpt else [image_cells(r) for r in rows]
    table = "\n".join([header, "", *harness.markdown_table(columns, align, cells)])
    print(f"\n{table}")
    if page:
        page.write(table)


if __name__ == "__main__":
    main()
