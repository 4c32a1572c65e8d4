"""Training throughput on one GPU and under DDP: volt's trainers against a plain PyTorch loop.

    python benchmarks/fake_cifar10.py /tmp/data      # CIFAR-10's files, random pixels
    python benchmarks/ddp_scaling.py --root /tmp/data --batch-per-gpu 256 --readme
    python benchmarks/ddp_scaling.py --root /tmp/data --runs plain:off volt:default --gpus 2

The workload is `experiment=cifar10_resnet` (ResNet 64-128-256, bf16-mixed, SGD), read by every
side through volt's batches for its rank, one process per GPU:

- plain:     a hand-written DDP loop started with torch.multiprocessing; BatchNorm synchronised by
             torch's `nn.SyncBatchNorm` (--sync-bn torch), volt's (volt: as `trainer=ddp`) or not.
- volt:      `python train.py experiment=cifar10_resnet trainer=gpu|ddp ...` as a user runs it;
             volt_syncbn with `trainer.sync_batchnorm=true`, dp with `trainer=dp`.
- synthetic: the plain loop on random batches already on the GPU: the limit.

The global batch is the experiment's 256 on any number of GPUs (strong scaling), or
--batch-per-gpu B on each (weak scaling). Each side reports training samples/s (all GPUs) per
epoch, validation not counted; scaling is N GPUs over one, per side, in the last epoch. Each side
runs eager or compiled (`--runs side:mode`: `compile=mode` for volt, the net compiled in place for
the plain loops). Without a GPU, the same runs on the CPU (gloo, `trainer=cpu`), for tests.
"""

import argparse
import datetime
import json
import os
import re
import socket
import sys
import tempfile
import time
from pathlib import Path

import harness  # benchmarks/, the folder of this script, is first on sys.path
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from gpt_plain import TRACED_STEPS, traced_steps, write_trace
from torch import nn
from torch.nn.parallel import DistributedDataParallel

REPO = Path(__file__).resolve().parents[1]
README = REPO / "docs" / "many_gpus.md"
MARKERS = ("<!-- perf-ddp:begin -->", "<!-- perf-ddp:end -->")
THROUGHPUT_LINE = re.compile(r"epoch (\d+): (\d+) training samples/s")
# The README's table: each side eager and compiled, on 1 and N GPUs; volt's trainer=ddp with
# SyncBatchNorm, CUDA graphs under DDP and trainer=dp on N only (nothing new to see on one).
PLAN = ["synthetic:off", "plain:off", "volt:off", "synthetic:default", "volt:default"]
PLAN += ["volt_syncbn:off", "volt:reduce-overhead", "dp:off"]
ON_N_ONLY = {"volt_syncbn", "dp", "volt:reduce-overhead"}
SIDE_NAMES = {
    "synthetic": "synthetic (the limit)",
    "plain": "plain DDP loop",
    "volt": "volt `trainer=ddp`",
    "volt_syncbn": "volt `trainer=ddp trainer.sync_batchnorm=true`",
    "dp": "volt `trainer=dp`",
}


def batch_override(args: argparse.Namespace, gpus: int) -> list[str]:
    """The global batch: the experiment's own, or --batch-per-gpu on each of `gpus`."""
    return [f"data.batch_size={args.batch_per_gpu * gpus}"] if args.batch_per_gpu else []


def plain_rank(
    rank: int, world: int, args: argparse.Namespace, run: tuple[str, bool, int, Path]
) -> None:
    """One process of the plain loop; rank 0 writes the per-epoch rates to `results`."""
    from volt.build import build_datamodule, build_model
    from volt.strategies.sync_batchnorm import SyncBatchNormLayers

    compile_mode, synthetic, port, results = run
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    cuda = torch.cuda.is_available()
    device = torch.device("cuda", rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(rank)
    dist.init_process_group(
        "nccl" if cuda else "gloo", rank=rank, world_size=world,
        timeout=datetime.timedelta(seconds=120),
    )  # fmt: skip
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    overrides = [f"data.root={args.root}", f"data.num_workers={args.workers}"]
    cfg = harness.compose(["experiment=cifar10_resnet", *overrides, *batch_override(args, world)])
    datamodule = build_datamodule(cfg.data)
    datamodule.setup()
    model = build_model(cfg.model, datamodule, cfg.task.from_data)  # its net and optimiser
    net: nn.Module = model.net.to(device)
    if args.channels_last:  # as volt's channels_last=true lays out the weights
        net = net.to(memory_format=torch.channels_last)
    layers, volt_layers = SyncBatchNormLayers(), args.sync_bn == "volt" and world > 1
    if args.sync_bn == "torch" and world > 1:
        net = nn.SyncBatchNorm.convert_sync_batchnorm(net)
    elif volt_layers:
        net = layers.apply(net)  # as trainer=ddp does
    if compile_mode != "off":
        net.compile(mode=compile_mode)  # in place, under DDP's wrapper: as volt's compile= does
    if world > 1:
        net = DistributedDataParallel(net, device_ids=[rank] if cuda else None)
    # Fused on CUDA, as volt's model.fused_optimizer=null makes the ResNet's SGD there.
    optimizer = model.optimizer_factory(net.parameters(), fused=cuda)
    smoothing = cfg.model.label_smoothing
    step = harness.plain_step(net, optimizer, device, "bf16-mixed", smoothing, clip=None)
    # volt's batches for this rank (data.on_device decides where they are gathered), as the
    # volt side gets them: the plain loop differs from volt only in its training loop.
    datamodule.trainer = harness.trainer_stand_in(device, world, rank)
    loader = datamodule.train_dataloader()
    if synthetic:
        batch = cfg.data.batch_size // world
        x = torch.randn(batch, 3, 32, 32, device=device)
        y = torch.randint(0, 10, (batch,), device=device)
        loader = [(x, y)] * len(loader)  # type: ignore[assignment]
    rates = []
    net.train()
    for epoch in range(args.epochs):
        datamodule.trainer.current_epoch = epoch
        harness.synchronize(device)
        start, samples = time.perf_counter(), 0
        for images, labels in loader:
            step(images, labels)
            samples += len(labels) * world
        harness.synchronize(device)
        rates.append(samples / (time.perf_counter() - start))
    if args.trace:  # after the timed epochs: every rank, as each waits on the other's collectives
        profiler = traced_steps(device, skipped=20)
        steps = 21 + TRACED_STEPS
        batches = (batch for _ in range(steps) for batch in loader)  # over epochs if need be
        for _, (images, labels) in zip(range(steps), batches, strict=False):
            step(images, labels)
            profiler.step()
        profiler.stop()
        side = "synthetic" if synthetic else "plain"
        write_trace(profiler, Path(args.trace, f"{side}-{compile_mode}-{world}gpu-rank{rank}"))
    if rank == 0:
        results.write_text(json.dumps(rates))
    if volt_layers:
        layers.revert(net)  # as a fit's end does: frees CUDA graphs holding the layers' collectives
    dist.destroy_process_group()


def run_plain(args: argparse.Namespace, gpus: int, compile_mode: str, synthetic: bool) -> list:
    results = Path(args.logs, f"plain-{compile_mode}-{synthetic}-{gpus}.json")
    with socket.socket() as sock:  # a port free now; the ranks bind it a moment later
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    run = (compile_mode, synthetic, port, results)
    mp.start_processes(plain_rank, args=(gpus, args, run), nprocs=gpus, start_method="spawn")
    return json.loads(results.read_text())


def run_volt(
    args: argparse.Namespace, gpus: int, compile_mode: str, strategy: str, sync_bn: str
) -> list[float]:
    one = "trainer=gpu" if torch.cuda.is_available() else "trainer=cpu"
    trainer = one if gpus == 1 else f"trainer={strategy} trainer.devices={gpus}"
    if gpus > 1 and strategy == "ddp":  # "torch" is not on offer in volt
        trainer += f" trainer.sync_batchnorm={str(sync_bn == 'volt').lower()}"
    command = [
        sys.executable, str(REPO / "train.py"), "experiment=cifar10_resnet", *trainer.split(),
        f"data.root={args.root}", "precision=bf16-mixed", f"data.num_workers={args.workers}",
        *batch_override(args, gpus), f"trainer.max_epochs={args.epochs}",
        f"compile={compile_mode}", "test=false", "callbacks.progress_bar=null",
        f"paths.outputs_dir={args.outputs}", f"channels_last={str(args.channels_last).lower()}",
        *args.volt_overrides,
    ]  # fmt: skip
    log = Path(args.logs, f"volt-{strategy}-{compile_mode}-{gpus}.log")
    harness.run_fresh(command, log, cwd=REPO).check(command)
    # Each epoch's throughput line is in the run's train.log, not on the console (#42): the
    # newest under --outputs is this run's (the console wraps a long run directory's line)
    logs = sorted(
        Path(args.outputs).glob("train/runs/*/train.log"), key=lambda p: p.stat().st_mtime
    )
    text = logs[-1].read_text() if logs else ""
    if not (found := THROUGHPUT_LINE.findall(text)):
        raise RuntimeError(f"{' '.join(command)}: no training samples/s in {log}")
    return [float(rate) for _, rate in found]


def measure(args: argparse.Namespace, side: str, compile_mode: str, gpus: int) -> list[float]:
    if side in ("synthetic", "plain"):
        return run_plain(args, gpus, compile_mode, synthetic=side == "synthetic")
    if side == "volt_syncbn":
        return run_volt(args, gpus, compile_mode, "ddp", sync_bn="volt")
    return run_volt(args, gpus, compile_mode, "dp" if side == "dp" else "ddp", args.sync_bn)


def markdown(rows: list[dict], gpus: int, header: str) -> str:
    """One line per side and compile mode: samples/s on 1 and N GPUs (last epoch), scaling, and
    N GPUs as a share of the synthetic side's N GPUs in the same compile mode."""
    last = {(r["side"], r["compile"], r["gpus"]): r["samples_per_s"][-1] for r in rows}
    lines = []
    for side, compile_mode in dict.fromkeys((r["side"], r["compile"]) for r in rows):
        one, many = last.get((side, compile_mode, 1)), last.get((side, compile_mode, gpus))
        limit = last.get(("synthetic", compile_mode, gpus))
        lines.append(
            [
                *(SIDE_NAMES[side], compile_mode),
                f"{one:,.0f}" if one else "",
                f"{many:,.0f}" if many else "",
                f"{many / one:.2f}x" if one and many else "",
                f"{many / limit:.0%}" if limit and many else "",
            ]
        )
    columns = ["side", "compile", "1 GPU", f"{gpus} GPUs", "scaling", f"of synthetic on {gpus}"]
    return "\n".join([header, "", *harness.markdown_table(columns, "llrrrr", lines)])


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--root", required=True, help="folder holding cifar-10-batches-py")
    parser.add_argument(
        "--runs", nargs="+", default=PLAN,
        help="side:compile pairs; sides synthetic, plain, volt, volt_syncbn, dp; compile off,"
        " default, reduce-overhead, max-autotune (default: the README's plan)",
    )  # fmt: skip
    parser.add_argument("--gpus", type=int, default=torch.cuda.device_count(), help="N")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--n-only", action="store_true", help="N GPUs only, not also one")
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument(
        "--sync-bn", choices=["torch", "volt", "none"], default="none",
        help="BatchNorm in the plain/synthetic loops and volt's ddp (volt_syncbn: always on)",
    )  # fmt: skip
    parser.add_argument("--batch-per-gpu", type=int, help="weak scaling; default: global 256")
    parser.add_argument(
        "--channels-last", action="store_true",
        help="the net's weights in channels-last layout on every side (volt: channels_last=true):"
        " inductor lays compiled convolutions out so, and DDP's buckets follow the weights",
    )  # fmt: skip
    parser.add_argument("--outputs", default="/tmp/outputs")
    parser.add_argument(
        "--trace", help="the plain and synthetic loops: torch.profiler over steps 21 to 25 after"
        " the timed epochs, each rank's op table and Chrome trace in this folder"
        " (read them with benchmarks/trace_steps.py)",
    )  # fmt: skip
    parser.add_argument("--json", help="also write the results here, after each run")
    parser.add_argument("--readme", action="store_true", help="rewrite README.md's table")
    parser.add_argument(
        "--volt-overrides", nargs="*", default=[], help="more overrides for the volt side"
    )
    args = parser.parse_args()
    page = harness.Page(README, *MARKERS) if args.readme else None
    if page:  # before minutes are spent measuring
        page.check("ddp_scaling")
    args.logs = tempfile.mkdtemp(prefix="ddp-scaling-logs-")  # each run's output
    rows: list[dict] = []
    for run in args.runs:
        side, compile_mode = run.split(":")
        for gpus in dict.fromkeys((args.gpus,) if args.n_only else (1, args.gpus)):
            if gpus == 1 and (side in ON_N_ONLY or run in ON_N_ONLY):
                continue
            try:
                rates = measure(args, side, compile_mode, gpus)
            except RuntimeError as error:  # one failed run leaves the others' results
                print(f"{run} on {gpus} GPU(s) failed: {str(error)[-1500:]}", flush=True)
                continue
            row = {"side": side, "compile": compile_mode, "gpus": gpus, "samples_per_s": rates}
            rows.append(row)
            print(json.dumps(rows[-1]), flush=True)
            if args.json:
                harness.save_json(Path(args.json), {"device": harness.device_name(), "rows": rows})
    batch = f"{args.batch_per_gpu} per GPU" if args.batch_per_gpu else "256 global"
    about = harness.versions() | {"device": harness.device_name()}  # CUDA in this process only now
    header = (
        f"{about['device']} x {args.gpus}, torch {about['torch']}, {about['date']}:"
        f" `experiment=cifar10_resnet precision=bf16-mixed"
        f"{' channels_last=true' if args.channels_last else ''}`, batch {batch}, BatchNorm"
        f" {'synchronised' if args.sync_bn != 'none' else 'per GPU'} unless the row says so;"
        f" training samples/s in the last of {args.epochs} epochs"
        f" (`python benchmarks/ddp_scaling.py --root DATA"
        f"{f' --batch-per-gpu {args.batch_per_gpu}' if args.batch_per_gpu else ''}"
        f"{' --channels-last' if args.channels_last else ''} --readme`)"
    )
    table = markdown(rows, args.gpus, header)
    print("\n" + table, flush=True)
    if page:
        page.write(table)


if __name__ == "__main__":
    main()
