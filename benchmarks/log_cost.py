"""What `self.log` costs a training step: Lightning's own against volt's trainers.

    python benchmarks/log_cost.py              # on the CPU, a minute
    python benchmarks/log_cost.py --values 10 --device cuda

A one-layer module whose training_step logs N values every step, in a bare Trainer (no logger,
no progress bar), each case in a fresh process: none logged, N with Lightning as it is, N with
volt's short cut for the move of each logged name's record (`volt.loggers.logged_values`, which
volt's trainers turn on). Prints µs a step (the median of --repeats windows) and the cost of one
logged value, so the difference is the host time `self.log` takes.
"""

import argparse
import statistics
import subprocess
import sys

import harness  # benchmarks/, the folder of this script, is first on sys.path
import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import LambdaCallback
from torch.utils.data import DataLoader, TensorDataset


class Logs(pl.LightningModule):
    def __init__(self, values: int) -> None:
        super().__init__()
        self.values = values
        self.layer = torch.nn.Linear(8, 1)

    def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
        loss = self.layer(batch[0]).pow(2).mean()
        for k in range(self.values):
            self.log(f"value_{k}", loss, on_step=True, on_epoch=False)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def one_case(values: int, volt: bool, device: str, steps: int, repeats: int) -> float:
    if volt:
        from volt.loggers.logged_values import skip_needless_moves

        skip_needless_moves()
    windows = harness.Windows(
        100, steps, repeats, lambda: harness.synchronize(torch.device(device))
    )
    clock = LambdaCallback(
        on_train_batch_end=lambda trainer, *_: windows.step_done(trainer.global_step)
    )
    data = DataLoader(TensorDataset(torch.randn(64, 8)), batch_size=1)
    trainer = pl.Trainer(
        accelerator=device, devices=1, max_steps=windows.total, logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        callbacks=[clock],
    )  # fmt: skip
    trainer.fit(Logs(values), data)
    return 1e3 * statistics.median(windows.ms_per_step())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--values", type=int, default=5, help="values logged each step")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--steps", type=int, default=500)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--case", help=argparse.SUPPRESS)  # one case, in its own process
    args = parser.parse_args()
    if args.case:
        values, volt = args.case.split(":")
        print(one_case(int(values), volt == "volt", args.device, args.steps, args.repeats))
        return
    common = ["--device", args.device, "--steps", str(args.steps), "--repeats", str(args.repeats)]
    cases = {"none logged": "0:lightning", "Lightning": f"{args.values}:lightning"}
    cases["volt's trainers"] = f"{args.values}:volt"
    us = {}
    for name, case in cases.items():
        done = subprocess.run(
            [sys.executable, __file__, "--case", case, *common],
            capture_output=True, text=True, check=True,
        )  # fmt: skip
        us[name] = float(done.stdout.split()[-1])
    for name, value in us.items():
        per_value = (value - us["none logged"]) / args.values if name != "none logged" else 0
        extra = f", {per_value:.0f} µs a logged value" if per_value else ""
        print(f"{name:>16}: {value:7.0f} µs a step{extra}")


if __name__ == "__main__":
    main()
