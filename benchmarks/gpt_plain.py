"""Training throughput of volt's byte-level GPT in a plain PyTorch loop: the reference that the
volt task (LanguageModel + TextBytesDataModule under Lightning) is measured against.

    python benchmarks/gpt_plain.py --n-layer 12 --n-head 12 --n-embd 768 --block-size 1024 \\
        --batch-size 16 --compile

The corpus (this Python's standard library sources, as volt.data.text_bytes reads them) sits on
the device as one uint8 tensor and every step draws its random windows there: no DataLoader, no
host-to-device copy. AdamW (fused on CUDA) over the net's two parameter groups; bf16 autocast by
default on CUDA. The timed steps follow the warm-up (compilation) without a host sync. MFU: the
net's training FLOPs per token times tokens/s over the device's peak, where volt knows it
(volt.callbacks.token_throughput.PEAK_TFLOPS). The last line printed is the result as JSON.
"""

import argparse
import json
from collections.abc import Callable
from pathlib import Path

import harness  # benchmarks/, the folder of this script, is first on sys.path
import torch
from torch import Tensor, nn
from torch.nn import functional as F

from volt.callbacks.token_throughput import peak_tflops
from volt.data.text_bytes import read_corpus, stdlib_sources
from volt.nets.gpt import GPT


def draw_batch(corpus: Tensor, batch_size: int, block_size: int) -> tuple[Tensor, Tensor]:
    """Random windows of the on-device corpus: inputs and targets, int64 (B, T)."""
    starts = torch.randint(len(corpus) - block_size, (batch_size, 1), device=corpus.device)
    offsets = torch.arange(block_size + 1, device=corpus.device)
    window = corpus[starts + offsets].long()  # (B, T + 1)
    return window[:, :-1], window[:, 1:]


TRACED_STEPS = 5


def train(
    model: nn.Module, optimizer: torch.optim.Optimizer, corpus: Tensor, batch_size: int,
    block_size: int, *, bf16: bool, clip: float, warmup: int, steps: int,
    after_step: Callable[[], object] | None = None,
) -> tuple[float, list[Tensor]]:  # fmt: skip
    """`warmup` untimed steps of `model` (the net, or DDP around it) on random windows of `corpus`,
    then `steps` timed ones, the device synchronised only at their edges: the timed steps'
    seconds, and every step's loss (left on the device). `after_step` is called after each step
    (a profiler's `step`)."""
    device = corpus.device
    windows = harness.Windows(warmup, steps, 1, lambda: harness.synchronize(device))
    windows.step_done(0)
    losses = []
    for n in range(1, windows.total + 1):
        x, y = draw_batch(corpus, batch_size, block_size)
        # The loss inside autocast too, as under Lightning's bf16-mixed (autocast runs
        # cross-entropy in float32).
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
            logits = model(x)  # (B, T, V)
            loss = F.cross_entropy(logits.flatten(0, 1), y.flatten())
        loss.backward()
        if clip > 0:
            nn.utils.clip_grad_norm_(model.parameters(), clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.detach())
        windows.step_done(n)
        if after_step is not None:
            after_step()
    return windows.seconds()[0], losses


def traced_steps(device: torch.device, skipped: int) -> torch.profiler.profile:
    """A started profiler (CPU, and CUDA on a GPU) that records steps skipped + 1 to skipped +
    TRACED_STEPS when its `step` is called after each: as volt's runs are traced by
    `gpu_checks.sh gpt-trace` (Lightning's profiler, `wait` 60 and `warmup` 2: skipped=62)."""
    if skipped < 1:
        raise ValueError(f"traced_steps: skipped={skipped}, must be 1 or more (a warm-up step)")
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    schedule = torch.profiler.schedule(
        wait=skipped - 1, warmup=1, active=TRACED_STEPS, repeat=1
    )  # fmt: skip
    profiler = torch.profiler.profile(activities=activities, schedule=schedule)
    profiler.start()
    return profiler


def write_trace(profiler: torch.profiler.profile, to: Path) -> None:
    """A stopped `traced_steps` profiler's op table (`to`.txt, by self CPU time) and Chrome trace
    (`to`.pt.trace.json)."""
    to.parent.mkdir(parents=True, exist_ok=True)
    table = profiler.key_averages().table(sort_by="self_cpu_time_total", row_limit=40)
    to.with_suffix(".txt").write_text(table)
    profiler.export_chrome_trace(str(to.with_suffix(".pt.trace.json")))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--n-layer", type=int, default=6)
    parser.add_argument("--n-head", type=int, default=6)
    parser.add_argument("--n-embd", type=int, default=384)
    parser.add_argument("--block-size", type=int, default=256)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--dropout", type=float, default=0.0)
    parser.add_argument("--steps", type=int, default=50, help="timed steps")
    parser.add_argument("--warmup-steps", type=int, default=10, help="untimed steps before")
    parser.add_argument("--lr", type=float, default=6e-4)
    parser.add_argument("--weight-decay", type=float, default=0.1)
    parser.add_argument("--grad-clip", type=float, default=0.0, help="max grad norm; 0: off")
    parser.add_argument("--compile", action="store_true", help="torch.compile the net")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument(
        "--precision",
        choices=["bf16", "tf32", "fp32"],
        help="bf16: autocast; tf32/fp32: float32 matmuls with/without tensor cores "
        "(default: bf16 on CUDA, fp32 on the CPU)",
    )
    parser.add_argument("--max-bytes", type=int, help="use only this much of the corpus")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if args.steps < 1:
        parser.error(f"--steps {args.steps}: time at least one step, e.g. --steps 50")

    device = torch.device(args.device)
    cuda = device.type == "cuda"
    precision = args.precision or ("bf16" if cuda else "fp32")
    torch.set_float32_matmul_precision("high" if precision == "tf32" else "highest")
    torch.manual_seed(args.seed)
    corpus_bytes = read_corpus(stdlib_sources(), args.max_bytes)
    corpus = torch.frombuffer(bytearray(corpus_bytes), dtype=torch.uint8).to(device)
    net = GPT(
        block_size=args.block_size, n_layer=args.n_layer, n_head=args.n_head,
        n_embd=args.n_embd, dropout=args.dropout,
    ).to(device)  # fmt: skip
    if args.compile:
        net.compile()
    optimizer = torch.optim.AdamW(
        net.param_groups(args.weight_decay), lr=args.lr, betas=(0.9, 0.95), fused=cuda
    )
    seconds, losses = train(
        net, optimizer, corpus, args.batch_size, args.block_size, bf16=precision == "bf16",
        clip=args.grad_clip, warmup=max(1, args.warmup_steps), steps=args.steps,
    )  # fmt: skip

    tokens_per_s = args.steps * args.batch_size * args.block_size / seconds
    peak = peak_tflops(device, precision)
    mfu = net.flops_per_token() * tokens_per_s / (peak * 1e12) if peak else None
    name = torch.cuda.get_device_name(device) if cuda else "cpu"
    result = {
        "device": name,
        "precision": precision,
        "compile": args.compile,
        "params": net.num_params(),
        "batch_size": args.batch_size,
        "block_size": args.block_size,
        "ms_per_step": 1000 * seconds / args.steps,
        "tokens_per_s": tokens_per_s,
        "mfu": mfu,
        "peak_tflops": peak,
        "loss_first": losses[0].item(),
        "loss_last": losses[-1].item(),
        "max_memory_gib": torch.cuda.max_memory_allocated(device) / 2**30 if cuda else None,
    }
    mfu_text = f"MFU {100 * mfu:.1f}% of {peak:.0f} TFLOP/s" if mfu is not None else "MFU n/a"
    print(
        f"{name}, {precision}{', compiled' if args.compile else ''}: {net.num_params() / 1e6:.2f}M "
        f"params, {result['ms_per_step']:.1f} ms/step, {tokens_per_s:,.0f} tokens/s, {mfu_text}; "
        f"loss {result['loss_first']:.3f} -> {result['loss_last']:.3f}"
    )
    print(json.dumps(result))


if __name__ == "__main__":
    main()
