"""What each of volt's callbacks costs a training step on the host, hook by hook.

    python benchmarks/hook_cost.py                                 # digits, on the GPU if any
    python benchmarks/hook_cost.py --every-step                    # every step a logging step
    python benchmarks/hook_cost.py experiment=cifar10_resnet data.root=/tmp/data   # any config
    python benchmarks/hook_cost.py experiment=gpt_bytes trainer=ddp trainer.devices=1  # world of 1

volt's training run as `python train.py` builds it, on the GPU where there is one, less
validation and checkpoints (perf.py's config for its volt side), with every per-batch and epoch
hook of every callback, the module's training_step, Lightning's logger connector and each
logger's writes wrapped in a host clock. After `--warmup` steps, whose first-time costs
(compilation, CUDA graphs' capture, each kernel's first launch) would swamp a hook's own, the
clock starts afresh for `--steps` more. Prints each one's microseconds a step (its total over
those steps, divided by them) and its calls a step, largest first, beside the fit's own
microseconds a step over them. Nothing waits for the GPU: a hook that queues
GPU work is charged only for queueing it, a hook that reads a GPU value for that wait. Where the
host bounds the step (small nets, CUDA graphs) these are what the step costs; compare them with
perf.py's host split (its `host` field) and docs/performance.md.
"""

import argparse
import cProfile
import pstats
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import perf  # benchmarks/, the folder of this script, is first on sys.path

EPOCH_HOOKS = ("on_train_epoch_start", "on_train_epoch_end")
LOGGER_CONNECTOR = ("on_batch_start", "update_train_step_metrics", "on_batch_end")


class HookClock:
    """Nanoseconds and calls per wrapped callable, by name."""

    def __init__(self) -> None:
        self.ns: Counter[str] = Counter()
        self.calls: Counter[str] = Counter()

    def wrap(self, owner: object, attribute: str, name: str) -> None:
        """Replaces `owner.attribute` (a callable) on the instance with a timed one."""
        inner: Callable[..., Any] = getattr(owner, attribute)

        def timed(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter_ns()
            try:
                return inner(*args, **kwargs)
            finally:
                self.ns[name] += time.perf_counter_ns() - start
                self.calls[name] += 1

        setattr(owner, attribute, timed)


def timed_fit(
    overrides: list[str], steps: int, warmup: int, profile: cProfile.Profile | None = None
) -> tuple[HookClock, float]:
    """Fits volt's config with `overrides` for `warmup` then `steps` optimizer steps; the hooks'
    clock, and the seconds, of the `steps` only (`profile` enabled over them too)."""
    from lightning.pytorch.callbacks import Callback, LambdaCallback

    from volt.build import build_training
    from volt.config.redaction import redacted_container
    from volt.hook_dispatch import PER_BATCH_HOOKS, skip_inherited_batch_hooks
    from volt.runs.records import save_resolved_config

    cfg = perf.compose_config(overrides, data_root="", steps=warmup + steps)  # perf.py's volt side
    # trainer=ddp's launcher reads the run's resolved config, written as train.py writes it
    resolved = redacted_container(cfg)
    save_resolved_config(resolved, Path(cfg.paths.output_dir))
    built = build_training(cfg, resolved)
    clock = HookClock()
    trainer = built.trainer
    for callback in trainer.callbacks:  # type: ignore[attr-defined]
        for hook in (*PER_BATCH_HOOKS, *EPOCH_HOOKS):
            fn = getattr(callback, hook, None)  # volt sets the inherited empty ones None
            if callable(fn) and getattr(fn, "__func__", None) is not getattr(Callback, hook):
                clock.wrap(callback, hook, f"{type(callback).__name__}.{hook}")
    clock.wrap(built.model, "training_step", "module.training_step (every side has it)")
    for method in LOGGER_CONNECTOR:
        clock.wrap(trainer._logger_connector, method, f"Lightning's logger connector.{method}")
    for logger in trainer.loggers:
        for method in ("log_metrics", "save"):
            clock.wrap(logger, method, f"{type(logger).__name__}.{method}")
    # The clock starts afresh as step warmup + 1 begins (its first micro-batch, under gradient
    # accumulation): compilation, CUDA graphs' capture and the first launch of each kernel (55 ms
    # for the logging ops' on an H200, perf.py) stay out. First of the callbacks; Lightning's
    # logger connector starts that step just before them, so it is counted one call short.
    times: dict[str, float] = {}

    def restart(trainer: Any, *args: Any) -> None:
        if "start" not in times and trainer.global_step == warmup:
            clock.ns.clear()
            clock.calls.clear()
            times["start"] = time.perf_counter()
            if profile:
                profile.enable()

    def stop(trainer: Any, *args: Any) -> None:
        if profile:
            profile.disable()
        times["end"] = time.perf_counter()
        times["steps"] = trainer.global_step

    watch = LambdaCallback(on_train_batch_start=restart, on_train_end=stop)
    skip_inherited_batch_hooks([watch])  # as volt's build does for every callback
    trainer.callbacks.insert(0, watch)  # type: ignore[attr-defined]
    trainer.fit(built.model, datamodule=built.datamodule)
    if "start" not in times or times.get("steps") != warmup + steps:
        raise SystemExit(
            f"hook_cost.py: the fit stopped at step {times.get('steps', trainer.global_step)} of"
            f" --warmup {warmup} + --steps {steps} (a limit of time or epochs, or a stop); its"
            " figures would not be per timed step: lift that limit or ask for fewer --steps"
        )
    return clock, times["end"] - times["start"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("overrides", nargs="*", help="config overrides, as for train.py")
    parser.add_argument("--steps", type=int, default=1000, help="optimizer steps timed")
    parser.add_argument(
        "--warmup", type=int, default=100, help="optimizer steps fitted before the timed ones"
    )
    parser.add_argument(
        "--every-step", action="store_true",
        help="log at every step (trainer.log_every_n_steps=1): what a logging step costs",
    )  # fmt: skip
    parser.add_argument(
        "--profile", metavar="FILE",
        help="also cProfile the timed steps: stats to FILE, the top printed (every figure printed"
        " then holds cProfile's own cost, often more than the step's)",
    )  # fmt: skip
    args = parser.parse_intermixed_args()  # overrides before and after the options
    every_step = ["trainer.log_every_n_steps=1"] if args.every_step else []
    profile = cProfile.Profile() if args.profile else None
    clock, seconds = timed_fit([*every_step, *args.overrides], args.steps, args.warmup, profile)
    print(
        f"the fit: {1e6 * seconds / args.steps:,.0f} µs a step over {args.steps} steps"
        f" after {args.warmup}" + (", cProfile on" if profile else "")
    )
    for name, ns in clock.ns.most_common():
        calls = clock.calls[name] / args.steps
        print(f"{ns / 1e3 / args.steps:9.1f} µs a step  {calls:5.2f} calls a step  {name}")
    if profile:
        profile.dump_stats(args.profile)
        pstats.Stats(args.profile).sort_stats("tottime").print_stats(40)


if __name__ == "__main__":
    main()
