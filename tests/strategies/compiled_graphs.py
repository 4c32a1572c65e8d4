"""Run by tests/strategies/test_compiled_graphs.py in a process of its own: volt's GPT, compiled,
fitted for a few steps under a trainer; prints one JSON line: the compiled graphs each step ran,
forward and backward, and each step's loss.

    python tests/strategies/compiled_graphs.py OUTPUT_DIR OVERRIDE...

Each compiled graph is a call of inductor's compiled code, which costs host time every step, so
their number is what a host-bound step pays for (DDP splits the net at each gradient bucket).
"""

import json
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import torch
from hydra import compose, initialize_config_dir
from lightning.pytorch.callbacks import LambdaCallback
from torch._inductor.output_code import CompiledFxGraph

from volt.build import build_training
from volt.config import CONF_DIR
from volt.config.redaction import redacted_container
from volt.hook_dispatch import skip_inherited_batch_hooks
from volt.runs.records import save_resolved_config

calls: Counter[str] = Counter()
compiled_call = CompiledFxGraph.__call__


def counted(self: CompiledFxGraph, inputs: Any) -> Any:
    # The autograd engine runs backward graphs inside a graph task of its own.
    calls["backward" if torch._C._current_graph_task_id() != -1 else "forward"] += 1
    return compiled_call(self, inputs)


def main() -> None:
    output_dir, overrides = Path(sys.argv[1]), sys.argv[2:]
    with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
        cfg = compose("train", overrides=[*overrides, f"paths.output_dir={output_dir}"])
    output_dir.mkdir(parents=True, exist_ok=True)
    resolved = redacted_container(cfg)  # as train.py writes it: DDP's and FSDP's ranks read it
    save_resolved_config(resolved, output_dir)
    built = build_training(cfg, resolved)
    steps: list[dict[str, Any]] = []

    def start(*args: Any) -> None:
        calls.clear()

    def end(trainer: Any, module: Any, outputs: Any, *args: Any) -> None:
        loss = outputs["loss"] if isinstance(outputs, dict) else outputs
        steps.append({**calls, "loss": float(loss)})

    watch = LambdaCallback(on_train_batch_start=start, on_train_batch_end=end)
    skip_inherited_batch_hooks([watch])
    built.trainer.callbacks.insert(0, watch)  # type: ignore[attr-defined]
    CompiledFxGraph.__call__ = counted  # type: ignore[method-assign]
    built.trainer.fit(built.model, datamodule=built.datamodule)
    print("STEPS " + json.dumps(steps), flush=True)


if __name__ == "__main__":
    main()
