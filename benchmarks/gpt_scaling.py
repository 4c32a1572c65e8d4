"""The GPT task on several GPUs of one host: volt's trainer=ddp and trainer=fsdp beside a plain
DistributedDataParallel loop of the same model, and the largest GPT each of them trains.

    python benchmarks/gpt_scaling.py --json a.json                    # throughput on all GPUs
    python benchmarks/gpt_scaling.py --runs --largest --json b.json   # the largest GPT of each
    python benchmarks/gpt_scaling.py --report a.json b.json --readme  # the page's tables of both
    python benchmarks/gpt_scaling.py --tiny --largest                 # all of it, toy sizes, CPU

Throughput: `--batch-per-gpu` windows of 1024 bytes on every GPU (weak scaling), `--warmup` steps
(compilation) then `--steps` timed ones, each run a fresh group of processes, ended at `--timeout`.
plain-1 and plain-ddp are gpt_plain.py's loop of volt's model and optimiser (bf16 autocast,
torch.compile, fused AdamW, clipping at 1.0) on one GPU and under DistributedDataParallel on all
(NCCL, gloo on the CPU; gradient buckets of trainer=ddp's `bucket_cap_mb`), timed as one window.
volt-gpu, volt-ddp and volt-fsdp are `train.py experiment=gpt_bytes trainer=gpu|ddp|fsdp` (global
data.batch_size) less validation, test, checkpoints and the LR decay, read back from its CSV log:
TokenThroughput's tokens/s and MFU over the timed windows of gcd(warmup, steps) steps,
GPUMemoryMonitor's peak. MFU is per GPU, of its dense bf16 peak; scaling is over the same side's
run on one GPU.

--largest: trainer=ddp, then trainer=fsdp from the first rung DDP failed (the top if none), climbs
a ladder of GPT shapes (n_layer x n_embd, heads of 128) on all GPUs: `train.py` for
`--probe-steps` steps a rung (8 x 1024 bytes per GPU, bf16-mixed, eager), up to the first that
fails or passes `--probe-timeout`. A rung whose weights, gradients and AdamW state alone (16 bytes
a parameter, over N GPUs under FSDP) exceed a GPU is out of memory unrun.

--rounds R: the runs R times, every other round in reverse order, each record marked with its
round; volt over the plain loop is also given per round and as their median (sides measured
minutes apart drift with the machine: the ddp ratio moved from 0.86x to 1.00x between calls).

--gpus 1: the DDP runs (and FSDP's) in a world of one on one GPU: DDP's host work with no
communication, to study on one GPU what DDP adds to a step. --bucket-mb MB: DDP's gradient
buckets on both DDP sides (under torch.compile, one graph a bucket).

--trace DIR: every rank of each plain run traces the TRACED_STEPS (5) steps after the warm-up with
torch.profiler: its op table and Chrome trace in DIR, named by run, world size and rank; those steps
are slower, and count in the run's tokens/s (`gpu_checks.sh gpt-trace` sets it beside volt's
own traces; refused with --readme).

Results go to `--json` after each run; the tables are printed, and with --readme written between
the page's markers.
"""

import argparse
import csv
import datetime
import json
import math
import multiprocessing
import os
import signal
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from statistics import median
from typing import Any

import harness  # benchmarks/, the folder of this script, is first on sys.path
import numpy as np
import torch
import torch.distributed as dist
from gpt_plain import TRACED_STEPS, traced_steps, train, write_trace
from torch.nn.parallel import DistributedDataParallel

from volt.build import build_datamodule, build_model
from volt.callbacks.token_throughput import matmul_dtype, peak_tflops
from volt.gpu import apply_compile, apply_matmul_precision
from volt.nets.gpt import GPT

REPO = Path(__file__).resolve().parents[1]
README = REPO / "docs" / "many_gpus.md"
MARKERS = ("<!-- perf-gpt-multi:begin -->", "<!-- perf-gpt-multi:end -->")
# 4.5B, 9.7B, 12.9B parameters, guessed for H200s (140 GiB) to need three rungs: DDP trains
# 40x3072, FSDP 48x4096 and 64x4096. Per GPU, DDP holds about 18 bytes a parameter (weights,
# gradient buckets, AdamW's moments, bf16 copies), FSDP on 2 GPUs about 6, the activations about
# 37 bytes a token per layer per unit of width (2.5B parameters at 8 x 1024: 55.9 GiB on an H100).
# Building the model on the CPU, as volt does, takes most of a rung: about 5-10 ns a parameter.
LADDER = ("40x3072", "48x4096", "64x4096")
TINY_LADDER = ("2x128",)
RUNS = {
    "plain-1": "plain PyTorch loop",
    "plain-ddp": "plain PyTorch loop, DistributedDataParallel",
    "volt-gpu": "volt, `trainer=gpu`",
    "volt-ddp": "volt, `trainer=ddp`",
    "volt-fsdp": "volt, `trainer=fsdp`",
}
# What a volt run here spends no time on (nor does the plain loop).
NOT_TRAINING = [
    "trainer.limit_val_batches=0",
    "trainer.num_sanity_val_steps=0",
    "test=false",
    "callbacks.model_checkpoint=null",
    "callbacks.last_checkpoint=null",
    "callbacks.early_stopping=null",  # it watches a validation metric
    "model.scheduler.max_steps=-1",  # warm-up, no decay: the run ends long before a decay would
    "logger=csv",  # read back here; like TensorBoard, written every log_every_n_steps steps
]


@dataclass(frozen=True)
class Shape:
    """A GPT of n_layer blocks of width n_embd, in heads of 128."""

    n_layer: int
    n_embd: int

    @property
    def n_head(self) -> int:
        return self.n_embd // 128

    def __str__(self) -> str:
        return f"{self.n_layer}x{self.n_embd}"

    def params(self, block_size: int) -> int:
        with torch.device("meta"):  # counted, never allocated
            net = GPT(
                block_size=block_size, n_layer=self.n_layer, n_head=self.n_head, n_embd=self.n_embd
            )
        return net.num_params(non_embedding=False)


def parse_shape(text: str) -> Shape:
    """`40x3072` -> Shape(40, 3072); argparse's type for --largest."""
    layers, _, width = text.partition("x")
    if not (layers.isdigit() and width.isdigit()) or int(layers) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not n_layer x n_embd: write e.g. 40x3072")
    if int(width) < 128 or int(width) % 128:
        fits = max(128, round(int(width) / 128) * 128)
        raise argparse.ArgumentTypeError(
            f"{text}: n_embd={width} is no whole number of heads of 128: e.g. {layers}x{fits}"
        )
    return Shape(int(layers), int(width))


@dataclass(frozen=True)
class Plan:
    """What every run trains, and where it runs."""

    experiment: str  # gpt_bytes, or gpt_bytes_tiny on the CPU
    variant: str  # its precision and compile mode, in words
    block_size: int
    batch_per_gpu: int
    warmup: int
    steps: int
    gpus: int  # the processes of a multi-GPU run
    device: str  # the GPU's name, or CPU
    gpu_bytes: int | None  # the memory of one GPU
    one_device: str  # the trainer option of volt's one-GPU run
    timeout_s: float
    probe_batch_per_gpu: int
    probe_precision: str
    probe_steps: int
    probe_timeout_s: float
    work: Path  # logs and run directories
    # cold: each run compiles into an empty cache of its own, in its warm-up (a fresh machine);
    # shared: all runs use one cache, so a graph an earlier run compiled is read back
    compile_cache: str = "cold"
    extra: tuple[str, ...] = ()  # more overrides of volt's runs (e.g. an FSDP setting), reported
    bucket_mb: float | None = None  # DDP's gradient buckets on both sides (None: trainer=ddp's)
    trace: Path | None = None  # the plain runs' traces go here (gpt_plain.traced_steps)

    def cache_env(self, run: str) -> dict[str, str]:
        """The environment of a run: torch.compile's and Triton's caches as `compile_cache` says."""
        folder = self.work / ("compile-cache" if self.compile_cache == "shared" else f"cache-{run}")
        cache = {"TORCHINDUCTOR_CACHE_DIR": folder, "TRITON_CACHE_DIR": folder / "triton"}
        return os.environ | {name: str(path) for name, path in cache.items()}

    @property
    def window(self) -> int:
        """Steps per TokenThroughput window: volt's log_every_n_steps here."""
        return math.gcd(self.warmup, self.steps)

    def model_overrides(self, gpus: int, batch_per_gpu: int) -> list[str]:
        return [
            f"experiment={self.experiment}",
            f"data.block_size={self.block_size}",
            f"data.batch_size={batch_per_gpu * gpus}",  # global
        ]


# ------------------------------------------------------------------- the plain loop, per rank


def plain_rank(
    rank: int, world: int, ddp: bool, overrides: list[str], warmup: int, steps: int,
    rendezvous: str, trace: str | None = None,
) -> None:  # fmt: skip
    """One process of the plain loop (ddp: DistributedDataParallel, also in a world of one);
    rank 0 prints the result line."""
    cuda = torch.cuda.is_available()
    device = torch.device("cuda", rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    else:
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))  # the ranks share the cores
    if ddp:
        backend, timeout = "nccl" if cuda else "gloo", datetime.timedelta(seconds=120)
        dist.init_process_group(
            backend,
            init_method=f"file://{rendezvous}",
            rank=rank,
            world_size=world,
            timeout=timeout,
        )
    apply_matmul_precision(None)  # as volt's runs: TF32 where there are tensor cores for it
    torch.manual_seed(rank)  # each rank its own windows
    # Under DDP its gradients go in buckets of the size volt's trainer=ddp sets (--bucket-mb
    # reaches both sides, --extra volt's alone): under torch.compile each bucket is a graph a
    # step, with host time of its own (docs/many_gpus.md).
    cfg = harness.compose([*overrides, "trainer=ddp"] if ddp else overrides)
    datamodule: Any = build_datamodule(cfg.data)
    datamodule.prepare_data()  # the corpus file volt's runs read
    model: Any = build_model(cfg.model, datamodule, cfg.task.from_data).to(device)
    net: GPT = model.net
    apply_compile(net, cfg.compile.mode)
    configured = model.configure_optimizers()  # fused AdamW over the net's groups, as volt's
    optimizer = configured["optimizer"] if isinstance(configured, dict) else configured
    trained = (
        DistributedDataParallel(
            net,
            device_ids=[rank] if cuda else None,
            bucket_cap_mb=cfg.trainer.strategy.get("bucket_cap_mb"),  # None: torch's default
        )
        if ddp
        else net
    )
    corpus = torch.from_numpy(np.fromfile(datamodule.corpus_path(), dtype=np.uint8)).to(device)
    batch, block = cfg.data.batch_size // world, cfg.data.block_size
    # Every rank traced, as Lightning's profiler traces volt's: an untraced rank would reach each
    # all-reduce early and shorten the traced one's waits there.
    profiler = traced_steps(device, warmup) if trace else None
    seconds, _ = train(
        trained, optimizer, corpus, batch, block, bf16=cfg.precision == "bf16-mixed",
        clip=cfg.trainer.gradient_clip_val or 0.0, warmup=warmup, steps=steps,
        after_step=profiler.step if profiler else None,
    )  # fmt: skip
    if profiler and trace:
        profiler.stop()
        name = f"plain-ddp-{world}-rank{rank}" if ddp else f"plain-1-rank{rank}"  # the run's own
        write_trace(profiler, Path(trace) / name)
    peak = torch.cuda.max_memory_allocated(device) / 2**30 if cuda else None
    ranks: list[dict[str, Any]] = [{"seconds": seconds, "peak_gib": peak}]
    if ddp:
        mine, ranks = ranks[0], [{}] * world
        dist.all_gather_object(ranks, mine)
        dist.destroy_process_group()
    if rank:
        return
    tokens_per_s = world * batch * block * steps / max(r["seconds"] for r in ranks)
    peak_tf = peak_tflops(device, matmul_dtype(cfg.precision))
    result = {
        "tokens_per_s": tokens_per_s,
        "mfu": net.flops_per_token() * tokens_per_s / (peak_tf * 1e12 * world) if peak_tf else None,
        "peak_gib": max(r["peak_gib"] for r in ranks) if cuda else None,
        "params": net.num_params(),
    }
    print(harness.result_line(result), flush=True)


def plain_processes(
    world: int, ddp: bool, overrides: list[str], warmup: int, steps: int, trace: str | None
) -> None:
    """The plain loop's ranks, in the process --plain-child starts: rank 0 is that process."""
    # The ranks meet in an empty file (torch's FileStore): no port that another run could take.
    fd, rendezvous = tempfile.mkstemp(prefix="gpt-scaling-rendezvous-")
    os.close(fd)
    options = (world, ddp, overrides, warmup, steps, rendezvous, trace)
    spawn = multiprocessing.get_context("spawn")
    others = [spawn.Process(target=plain_rank, args=(r, *options)) for r in range(1, world)]
    for process in others:
        process.start()
    try:
        plain_rank(0, *options)
    except BaseException:
        for process in others:
            process.kill()  # they would wait for rank 0 in a collective until its timeout
        raise
    finally:
        for process in others:
            process.join()
        Path(rendezvous).unlink(missing_ok=True)  # the store removes it too, but not on a crash
    if any(process.exitcode for process in others):
        raise RuntimeError(f"plain ranks: exit codes {[p.exitcode for p in others]}")


# -------------------------------------------------------------------------------- in the parent


def volt_command(trainer: str, gpus: int, outputs: Path, overrides: list[str]) -> list[str]:
    devices = [] if trainer in ("gpu", "cpu") else [f"trainer.devices={gpus}"]
    return [
        *(sys.executable, "train.py", f"trainer={trainer}", *devices, *overrides),
        *NOT_TRAINING,
        f"paths.outputs_dir={outputs}",
    ]


def logged(outputs: Path) -> list[dict[str, str]]:
    """The rows of the run's CSV log, in the order they were logged (none if it wrote none)."""
    rows = []
    for path in outputs.glob("**/csv/metrics.csv"):  # one: each run has outputs of its own
        with path.open() as file:
            rows += list(csv.DictReader(file))
    return rows


def peak_gib(rows: list[dict[str, str]]) -> float | None:
    """GPUMemoryMonitor's highest peak allocated on any GPU; None on the CPU, where it logs none."""
    peaks = [
        float(v) for r in rows for k, v in r.items() if k.endswith("_peak_allocated_gib") and v
    ]
    return max(peaks) if peaks else None


def volt_throughput(outputs: Path, plan: Plan) -> dict[str, Any]:
    """TokenThroughput's tokens/s and MFU over the windows after the warm-up, from the CSV log."""
    rows = logged(outputs)
    windows = [r for r in rows if r.get("perf/train_tokens_per_s")]
    expected = (plan.warmup + plan.steps) // plan.window
    if len(windows) != expected:
        return {
            "error": f"{len(windows)} TokenThroughput windows in the log, not {expected}:"
            f" see {outputs}"
        }
    timed = windows[plan.warmup // plan.window :]
    rates = [float(r["perf/train_tokens_per_s"]) for r in timed]
    # Every window holds the same tokens, so the rate over all of them is the harmonic mean.
    tokens_per_s = len(rates) / sum(1 / rate for rate in rates)
    mfu = timed[0].get("perf/mfu")  # tokens/s times a constant: scaled alike
    return {
        "tokens_per_s": tokens_per_s,
        "mfu": float(mfu) * tokens_per_s / rates[0] if mfu else None,
        "peak_gib": peak_gib(rows),
        "window_tokens_per_s": rates,
    }


def fresh(work: Path, name: str, suffix: str) -> Path:
    """work/name+suffix, or name-2, name-3, ... where an earlier run in the same --work left
    its log or outputs (read back by glob, they would mix with this run's: 2026-11-28)."""
    for n in range(1, 1000):
        stem = name if n == 1 else f"{name}-{n}"
        if not (work / stem).exists() and not (work / f"{stem}{suffix}").exists():
            return work / f"{stem}{suffix}"
    raise RuntimeError(f"{work} holds 999 runs named {name}: give a new --work")


def measure(run: str, plan: Plan) -> dict[str, Any]:
    """One throughput run: tokens/s of all GPUs, MFU per GPU, peak GiB of the fullest GPU."""
    gpus = 1 if run in ("plain-1", "volt-gpu") else plan.gpus
    log = fresh(plan.work, run, ".log")
    outputs = log.with_suffix("")
    overrides = plan.model_overrides(gpus, plan.batch_per_gpu)
    if plan.bucket_mb is not None and run in ("plain-ddp", "volt-ddp"):
        overrides.append(f"trainer.strategy.bucket_cap_mb={plan.bucket_mb}")
    if run.startswith("plain"):
        command = [sys.executable, __file__, "--plain-child", str(gpus)]
        command += ["--plain-ddp"] if run == "plain-ddp" else []
        command += ["--warmup", str(plan.warmup), "--steps", str(plan.steps)]
        command += ["--trace", str(plan.trace)] if plan.trace else []
        command += ["--overrides", *overrides]
    else:
        trainer = plan.one_device if run == "volt-gpu" else run.removeprefix("volt-")
        overrides.append(f"trainer.max_steps={plan.warmup + plan.steps}")
        overrides.append(f"trainer.log_every_n_steps={plan.window}")
        overrides += plan.extra
        command = volt_command(trainer, gpus, outputs, overrides)
    # The cache named as the run's outputs: a later round's run of the same side (volt-ddp-2)
    # compiles from an empty cache too, as the report says of "cold".
    env = plan.cache_env(outputs.name)
    done = harness.run_fresh(command, log, plan.timeout_s, cwd=REPO, env=env)
    if failed := done.failure():
        result = {"error": failed}
    elif run.startswith("plain"):
        result = done.result() or {"error": f"no result line in {log}"}
    else:
        result = volt_throughput(outputs, plan)
    return {"run": run, "gpus": gpus, **result, "wall_s": done.wall_s}


def beyond_memory(strategy: str, params: int, plan: Plan) -> str | None:
    """Why a GPT of `params` parameters cannot fit, whatever its activations: its fp32 weights and
    gradients and AdamW's two moments, 16 bytes a parameter (sharded over the GPUs under FSDP),
    are more than a GPU holds. None if they are not, or on the CPU."""
    need = 16 * params / (plan.gpus if strategy == "fsdp" else 1)
    if plan.gpu_bytes is None or need <= plan.gpu_bytes:
        return None
    return (
        f"out of memory, by arithmetic (not run): {need / 2**30:.0f} GiB per GPU for weights,"
        f" gradients and AdamW state alone, of {plan.gpu_bytes / 2**30:.0f} GiB"
    )


def probe(strategy: str, shape: Shape, plan: Plan) -> dict[str, Any]:
    """`shape` trained for a few steps by volt's trainer=`strategy` on all GPUs: did it fit, in
    how much memory."""
    params = shape.params(plan.block_size)
    record = {"largest": strategy, "shape": str(shape), "params": params}
    if surely := beyond_memory(strategy, params, plan):
        return {**record, "outcome": surely, "peak_gib": None, "wall_s": 0.0}
    log = fresh(plan.work, f"largest-{strategy}-{shape}", ".log")
    overrides = [
        *plan.model_overrides(plan.gpus, plan.probe_batch_per_gpu),
        f"model.net.n_layer={shape.n_layer}",
        f"model.net.n_embd={shape.n_embd}",
        f"model.net.n_head={shape.n_head}",
        "compile=off",
        f"precision={plan.probe_precision}",
        f"trainer.max_steps={plan.probe_steps}",
        "trainer.log_every_n_steps=1",  # GPUMemoryMonitor's peak after every step
    ]
    command = volt_command(strategy, plan.gpus, log.with_suffix(""), overrides)
    done = harness.run_fresh(command, log, plan.probe_timeout_s, cwd=REPO)
    failed = done.failure()
    return {
        **record,
        "outcome": failed or "trained",
        "peak_gib": None if failed else peak_gib(logged(log.with_suffix(""))),
        "wall_s": done.wall_s,
    }


def combined(
    earlier: dict[str, Any], about: dict[str, Any], runs: list[str], largest: bool
) -> dict[str, Any]:
    """Earlier results with `about` over theirs, less their records of what is measured again:
    the throughput runs named in `runs`, and the largest GPTs if `largest`."""
    records = earlier.get("records", [])
    kept = [r for r in records if r.get("run") not in runs and not ("largest" in r and largest)]
    return {"about": {**earlier.get("about", {}), **about}, "records": kept}


class Results(harness.Console):
    """What was measured, saved to `path` after each record and told on the console as it comes.
    A file that exists already is added to: its records of the parts measured again (throughput
    runs, the largest GPTs) are replaced."""

    def __init__(self, path: Path, about: dict[str, Any], runs: list[str], largest: bool) -> None:
        super().__init__()
        earlier = json.loads(path.read_text()) if path.exists() else {}
        start = combined(earlier, about, runs, largest)
        self.path, self.about, self.records = path, start["about"], start["records"]

    def add(self, record: dict[str, Any]) -> None:
        self.records.append(record)
        harness.save_json(self.path, {"about": self.about, "records": self.records})
        self.say(describe(record))


def climb(strategy: str, ladder: list[Shape], plan: Plan, results: Results) -> int | None:
    """Probe the rungs in order up to the first that fails: its index; None if all trained."""
    for index, shape in enumerate(ladder):
        results.add(probe(strategy, shape, plan))
        if results.records[-1]["outcome"] != "trained":
            return index
    return None


def describe(record: dict[str, Any]) -> str:
    """One line for the console."""
    took = f"({record['wall_s']:.0f} s)"
    peak = optional(record.get("peak_gib"), ", peak {:.1f} GiB per GPU", "")
    if "largest" in record:
        name = f"trainer={record['largest']}, {record['shape']} ({billions(record['params'])})"
        return f"{name}: {record['outcome']}{peak} {took}"
    name = f"{record['run']} on {record['gpus']}"
    if "round" in record:
        name += f", round {record['round'] + 1}"
    if "error" in record:
        return f"{name}: {record['error']} {took}"
    mfu = optional(record["mfu"] and 100 * record["mfu"], ", MFU {:.1f}%", "")
    return f"{name}: {record['tokens_per_s']:,.0f} tokens/s{mfu}{peak} {took}"


# ------------------------------------------------------------------ the report, from the records


def billions(params: int) -> str:
    return f"{params / 1e9:.2f}B" if params >= 1e9 else f"{params / 1e6:.1f}M"


def optional(value: float | None, form: str, missing: str = "n/a") -> str:
    return missing if value is None else form.format(value)


Side = tuple[str, int]  # a run and its GPUs: DDP's runs may be a world of one (--gpus 1)


def plain_side(run: str, gpus: int) -> Side:
    """The plain run a volt run is compared with: the loop on one GPU for volt-gpu, else the
    plain DDP loop in a world of as many GPUs (none for FSDP in a world of one)."""
    return ("plain-1", 1) if run == "volt-gpu" else ("plain-ddp", gpus)


def throughput_row(record: dict[str, Any], rate: dict[Side, float | None]) -> list[str]:
    """A run's tokens/s, MFU and peak memory; its scaling over the same side's one-GPU run;
    volt's tokens/s over the plain loop's on as many GPUs."""
    run, gpus = record["run"], record["gpus"]
    name = RUNS[run] + (f" (round {record['round'] + 1})" if "round" in record else "")
    if "error" in record:  # the row's other cells empty, as the page has always shown them
        return [name, str(gpus), f"failed: {record['error'].splitlines()[0]} | | | |"]
    tokens = record["tokens_per_s"]
    one = rate.get(("plain-1", 1) if run.startswith("plain") else ("volt-gpu", 1))
    plain = rate.get(plain_side(run, gpus))
    return [
        *(name, str(gpus), f"{tokens:,.0f}"),
        optional(record["mfu"] and 100 * record["mfu"], "{:.1f}%"),
        optional(record["peak_gib"], "{:.1f}"),
        f"{tokens / one:.2f}x" if gpus > 1 and one else "",
        f"{tokens / plain:.3f}" if run.startswith("volt") and plain else "",
    ]


Round = tuple[str | None, int]  # the call that measured it (--rounds only), and its round


def by_round(rates: dict[Round, dict[Side, float | None]]) -> list[str]:
    """With --rounds: each volt run's tokens/s over the plain loop's of the same round of the
    same call ("failed" where either failed), and the median of those measured."""
    rounds = sorted(key for key in rates if key[0] is not None)
    if len(rounds) < 2:
        return []
    lines = ["", "Rounds (each a run of every side, the order reversed every other round):"]
    sides = sorted(
        {side for key in rounds for side in rates[key] if side[0].startswith("volt")},
        key=lambda side: (list(RUNS).index(side[0]), side[1]),
    )
    for run, gpus in sides:
        plain = plain_side(run, gpus)
        cells, ratios = [], []
        for rate in (rates[key] for key in rounds if (run, gpus) in rates[key]):
            volt, base = rate[(run, gpus)], rate.get(plain)
            if plain not in rate:
                cells.append("no plain run")
            elif volt and base:
                ratios.append(volt / base)
                cells.append(f"{volt / base:.3f}")
            else:
                cells.append("failed")
        if cells:
            middle = f"median of {len(ratios)}: {median(ratios):.3f}" if ratios else "none"
            alone = " (a world of one)" if gpus == 1 and run != "volt-gpu" else ""
            lines.append(f"- {RUNS[run]}{alone} / plain, by round: {', '.join(cells)}; {middle}")
    return lines


def window_lines(runs: list[dict[str, Any]]) -> list[str]:
    """Each volt run's tokens/s window by window (TokenThroughput's), and how far its slowest
    falls below its fastest: a stall inside the run against a run slow throughout (the GPT under
    trainer=fsdp measured 1.03M and 1.25M tokens/s in runs minutes apart on one pair of H200s,
    2026-11-29)."""
    lines = []
    for r in sorted(runs, key=lambda r: (r.get("run", ""), r.get("round", 0))):
        rates = r.get("window_tokens_per_s")
        if rates and len(rates) > 1:
            name = f"{RUNS[r['run']]} on {r['gpus']}"
            name += f" (round {r['round'] + 1})" if "round" in r else ""
            each = ", ".join(f"{rate:,.0f}" for rate in rates)
            lines.append(f"- {name}: {each} tokens/s ({1 - min(rates) / max(rates):.1%} apart)")
    if not lines:
        return []
    return ["", "Each volt run's windows, and how far the slowest fell below the fastest:", *lines]


def round_of(record: dict[str, Any]) -> Round:
    return record.get("call"), record.get("round", 0)


def largest_row(strategy: str, tried: list[dict[str, Any]]) -> list[str]:
    """Per strategy, the largest rung that trained, and what stopped the climb."""
    trained = [r for r in tried if r["outcome"] == "trained"]
    stop = next((r for r in tried if r["outcome"] != "trained"), None)
    above = "not tried: the ladder's top"
    if stop:
        above = f"{stop['shape']} ({billions(stop['params'])}): {stop['outcome'].splitlines()[0]}"
    if not trained:
        return [f"volt, `trainer={strategy}`", "none of the ladder | | ", above]
    best = trained[-1]
    peak = optional(best["peak_gib"], "{:.1f}")
    return [f"volt, `trainer={strategy}`", best["shape"], billions(best["params"]), peak, above]


def report(about: dict[str, Any], records: list[dict[str, Any]]) -> str:
    """The markdown the page shows: where and how it was measured, then the tables."""
    machine = about["machine"]
    where = f"{machine['gpus']} x {machine['device']}"
    if machine["device"] == "CPU":
        where = f"the CPU ({machine['gpus']} processes)"
    lines = [
        f"Measured {machine['date']} on {where}, torch {machine['torch']}, Lightning"
        f" {machine['lightning']}, by `python benchmarks/gpt_scaling.py` (its docstring says how)."
    ]
    runs = sorted(
        (r for r in records if "run" in r),
        key=lambda r: (list(RUNS).index(r["run"]), r.get("round", 0)),
    )
    if runs:
        plan = about["throughput"]
        params = next((r["params"] for r in runs if "params" in r), None)
        model = f" ({billions(params)} parameters)" if params else ""
        rates: dict[Round, dict[Side, float | None]] = {}  # round -> (run, GPUs) -> tokens/s
        for r in runs:
            rates.setdefault(round_of(r), {})[(r["run"], r["gpus"])] = r.get("tokens_per_s")
        columns = ["run", "GPUs", "tokens/s", "MFU per GPU", "peak GiB per GPU", "scaling"]
        extra = f"; volt's runs with {' '.join(plan['extra'])}" if plan.get("extra") else ""
        if plan.get("bucket_mb") is not None:
            extra += f"; DDP's gradient buckets {plan['bucket_mb']:g} MB on both sides"
        lines += [
            "",
            f"experiment={plan['experiment']}{model}, {plan['batch_per_gpu']} windows of"
            f" {plan['block_size']} bytes per GPU, {plan['variant']}: tokens/s of all GPUs over"
            f" {plan['steps']} steps after {plan['warmup']} warm-up steps (compile caches:"
            f" {plan.get('compile_cache', 'not recorded')}{extra}), MFU of each GPU's dense"
            " bf16 peak, peak memory allocated on the fullest GPU, scaling over the same side on"
            f" one GPU ({sum(r['wall_s'] for r in runs):.0f} s for the {len(runs)} runs).",
            "",
            *harness.markdown_table(
                [*columns, "volt / plain"],
                "lrrrrrr",
                (throughput_row(r, rates[round_of(r)]) for r in runs),
            ),
            *by_round(rates),
        ]
    probes = [r for r in records if "largest" in r]
    if probes:
        plan = about["largest"]
        tried = {s: [r for r in probes if r["largest"] == s] for s in ("ddp", "fsdp")}
        columns = ["strategy", "largest trained", "parameters", "peak GiB per GPU"]
        lines += [
            "",
            f"The largest GPT trained, climbing {' '.join(plan['ladder'])} (n_layer x n_embd,"
            f" heads of 128) up to the first that fails: {plan['batch_per_gpu']} windows of"
            f" {plan['block_size']} bytes per GPU, {plan['precision']}, eager, AdamW,"
            f" {plan['steps']} steps; FSDP from the first rung DDP could not train"
            f" ({sum(r['wall_s'] for r in probes):.0f} s for {len(probes)} rungs).",
            "",
            *harness.markdown_table(
                [*columns, "the rung above"],
                "llrrl",
                (largest_row(s, rs) for s, rs in tried.items() if rs),
            ),
        ]
    return "\n".join(lines)


# ------------------------------------------------------------------------------------- the CLI


def make_plan(args: argparse.Namespace) -> Plan:
    tiny = args.tiny
    visible = 2 if tiny else torch.cuda.device_count()
    if visible < 1:
        sys.exit("gpt_scaling: no GPU visible: --tiny runs toy sizes on the CPU")
    if args.gpus is not None and not 1 <= args.gpus <= visible:
        sys.exit(f"gpt_scaling: --gpus {args.gpus}, {visible} GPU(s) visible: give 1 to {visible}")
    gpus = args.gpus or visible
    # One GPU unasked: its own runs alone (a check of the script on a one-GPU machine). With
    # --gpus 1 the DDP runs wrap the model in a world of one: DDP's host work, no communication.
    several = {"plain-ddp", "volt-ddp"} & set(args.runs) or args.largest is not None
    if gpus == 1 and not args.gpus and several:
        sys.exit(
            f"gpt_scaling: {gpus} GPU(s) visible, the runs need 2 or more: --tiny on a CPU,"
            " --runs plain-1 volt-gpu volt-fsdp on one GPU, or --gpus 1 for DDP in a world of one"
        )
    # Asked here, once: a query of its properties starts nothing on the GPU.
    gpu = None if tiny else torch.cuda.get_device_properties(0)
    return Plan(
        experiment="gpt_bytes_tiny" if tiny else "gpt_bytes",
        variant="32-true, eager" if tiny else "bf16-mixed, torch.compile",
        block_size=64 if tiny else 1024,
        batch_per_gpu=args.batch_per_gpu or (4 if tiny else 16),
        # The windows are 50 steps, gpt_bytes' log_every_n_steps: volt waits for the GPU at each
        # (its loss, the NaN check; under DDP their all-reduces), as often as a real run does.
        warmup=args.warmup or (2 if tiny else 50),
        steps=args.steps or (4 if tiny else 100),
        gpus=gpus,
        device=gpu.name if gpu else "CPU",
        gpu_bytes=gpu.total_memory if gpu else None,
        one_device="cpu" if tiny else "gpu",
        timeout_s=args.timeout,
        probe_batch_per_gpu=2 if tiny else 8,
        probe_precision="32-true" if tiny else "bf16-mixed",
        probe_steps=args.probe_steps,
        probe_timeout_s=args.probe_timeout,
        work=Path(args.work or tempfile.mkdtemp(prefix="gpt-scaling-")),
        compile_cache=args.compile_cache,
        extra=tuple(args.extra),
        bucket_mb=args.bucket_mb,
        trace=Path(args.trace).resolve() if args.trace else None,
    )


def about_this(plan: Plan, ladder: list[Shape], args: argparse.Namespace) -> dict[str, Any]:
    """What the report says of this benchmark's runs, beside their records."""
    about: dict[str, Any] = {
        "machine": {"device": plan.device, "gpus": plan.gpus, **harness.versions()}
    }
    if args.runs:
        keys: tuple[str, ...] = ("experiment", "variant", "block_size", "batch_per_gpu")
        keys += ("warmup", "steps", "compile_cache", "extra", "bucket_mb")
        about["throughput"] = {key: getattr(plan, key) for key in keys}
        if plan.trace:  # the plain runs' traced steps are slower, and in their tokens/s
            about["throughput"]["traced"] = str(plan.trace)
    if args.largest is not None:
        about["largest"] = {
            "ladder": [str(shape) for shape in ladder],
            "batch_per_gpu": plan.probe_batch_per_gpu,
            "block_size": plan.block_size,
            "precision": plan.probe_precision,
            "steps": plan.probe_steps,
        }
    return about


def saved_results(names: list[str]) -> dict[str, Any]:
    """The --json files' about and records, a later file's parts replacing an earlier one's."""
    saved: dict[str, Any] = {}
    for name in names:
        later = json.loads(Path(name).read_text())
        runs = [r["run"] for r in later["records"] if "run" in r]
        largest = any("largest" in r for r in later["records"])
        saved = combined(saved, later["about"], runs, largest)
        saved["records"] += later["records"]
    return saved


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--tiny", action="store_true", help="toy sizes, 2 processes on the CPU")
    runs = "the throughput runs (default: all of them; --runs alone: none)"
    parser.add_argument("--runs", nargs="*", choices=RUNS, default=list(RUNS), help=runs)
    parser.add_argument(
        "--gpus", type=int,
        help="processes of the DDP and FSDP runs (default: every visible GPU; 1: DDP's and"
        " FSDP's wrapping without communication, on one GPU)",
    )  # fmt: skip
    parser.add_argument("--batch-per-gpu", type=int, help="windows per GPU (16; tiny: 4)")
    parser.add_argument("--warmup", type=int, help="untimed steps first (50; tiny: 2)")
    parser.add_argument("--steps", type=int, help="timed steps (100; tiny: 4)")
    parser.add_argument(
        "--compile-cache", choices=("cold", "shared"), default="cold",
        help="cold: every run compiles from an empty cache in its warm-up, as on a fresh machine"
        " (default); shared: one cache for all runs, so later runs read what earlier compiled",
    )  # fmt: skip
    parser.add_argument(
        "--extra", nargs="+", default=[], metavar="OVERRIDE",
        help="more overrides of volt's runs, e.g. trainer.strategy.reshard_after_forward=false",
    )  # fmt: skip
    parser.add_argument(
        "--bucket-mb", type=float, metavar="MB",
        help="DDP's gradient buckets of both DDP sides (default: trainer=ddp's bucket_cap_mb)",
    )  # fmt: skip
    ladder = "find the largest GPT that trains under DDP and under FSDP on this ladder"
    ladder += f" (default: {' '.join(LADDER)}; tiny: {' '.join(TINY_LADDER)})"
    parser.add_argument(
        "--largest", nargs="*", type=parse_shape, metavar="LAYERSxWIDTH", help=ladder
    )
    parser.add_argument("--probe-steps", type=int, default=3, help="steps per rung (3)")
    parser.add_argument(
        "--rounds", type=int, default=1,
        help="measure the runs this many times, every other round in reverse order; volt over"
        " the plain loop is reported per round (1)",
    )  # fmt: skip
    parser.add_argument("--timeout", type=float, default=240, help="seconds per run (240)")
    parser.add_argument("--probe-timeout", type=float, default=240, help="seconds per rung (240)")
    parser.add_argument("--json", help="the results, after each run; added to if it exists")
    parser.add_argument("--work", help="the runs' logs and outputs (default: a new temp folder)")
    parser.add_argument("--readme", nargs="?", const=str(README), help="write the tables here")
    reports = "measure nothing: the tables of these --json files, a later one's parts replacing"
    parser.add_argument("--report", nargs="+", metavar="JSON", help=reports + " an earlier one's")
    parser.add_argument(
        "--trace", help=f"folder: torch.profiler over {TRACED_STEPS} steps after the warm-up of"
        " each plain run (every rank: op table, Chrome trace; slower steps, in its tokens/s)",
    )  # fmt: skip
    parser.add_argument("--plain-child", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--plain-ddp", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--overrides", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.plain_child:
        if args.plain_child > 1 and not args.plain_ddp:  # ranks that would never meet
            parser.error(f"--plain-child {args.plain_child} without --plain-ddp")
        options = (args.overrides, args.warmup, args.steps, args.trace)
        plain_processes(args.plain_child, args.plain_ddp, *options)
        return
    if args.gpus == 1 and (args.largest is not None or args.readme):
        parser.error(
            "--gpus 1 measures DDP's host work in a world of one: no climb (--largest) and no"
            " several-GPU tables (--readme) from it"
        )
    if args.trace and args.rounds > 1:
        parser.error("--trace with --rounds: each round's traces would replace the last's")
    if args.trace and args.readme:
        parser.error(
            "--trace slows the plain runs' traced steps: their tokens/s is no table's; leave out"
            " --readme (or --trace)"
        )
    page = harness.Page(Path(args.readme), *MARKERS) if args.readme else None
    if page:  # before minutes are spent measuring
        page.check("gpt_scaling")
    if args.report:
        saved = saved_results(args.report)
        table, records = report(saved["about"], saved["records"]), saved["records"]
    else:
        if args.rounds < 1:
            parser.error(f"--rounds {args.rounds}: give 1 or more, e.g. --rounds 3")
        for name, value in (("--warmup", args.warmup), ("--steps", args.steps)):
            if value is not None and value < 1:
                parser.error(
                    f"{name} {value}: give at least 1 (the warm-up compiles), e.g. {name} 20"
                )
        # A timeout's SIGTERM ends this process through its `finally`s: each run's process
        # group is stopped (harness.run_fresh), not left holding the GPUs.
        signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
        table, records = measured(args)
    print(f"\n{table}", flush=True)
    for line in window_lines(records):  # for whoever measures: not the page's
        print(line, flush=True)
    if page:
        page.write(table)


def measured(args: argparse.Namespace) -> tuple[str, list[dict[str, Any]]]:
    """The throughput runs asked for, then the climbs: the report of all the results, and the
    results themselves."""
    plan = make_plan(args)
    ladder = args.largest or [parse_shape(s) for s in (TINY_LADDER if args.tiny else LADDER)]
    plan.work.mkdir(parents=True, exist_ok=True)
    json_path = Path(args.json) if args.json else plan.work / "gpt_scaling.json"
    results = Results(
        json_path, about_this(plan, ladder, args), args.runs, args.largest is not None
    )
    results.say(
        f"{plan.gpus} x {plan.device}, experiment={plan.experiment},"
        f" {plan.batch_per_gpu} x {plan.block_size} tokens per GPU, {plan.warmup} + {plan.steps}"
        f" steps; logs in {plan.work}, results in {json_path}"
    )
    call = datetime.datetime.now().isoformat(timespec="seconds")
    for round_ in range(args.rounds):
        # Every other round in reverse: a machine that drifts in speed over the minutes of a
        # call favours no side (the ratio is taken within each round of this call).
        for run in args.runs if round_ % 2 == 0 else args.runs[::-1]:
            marks = {"call": call, "round": round_} if args.rounds > 1 else {}
            results.say(f"{run} ..." if args.rounds == 1 else f"{run}, round {round_ + 1} ...")
            results.add(measure(run, plan) | marks)
    if args.largest is not None:
        failed = climb("ddp", ladder, plan, results)
        climb("fsdp", ladder[failed:] if failed is not None else ladder[-1:], plan, results)
    return report(results.about, results.records), results.records


if __name__ == "__main__":
    main()
