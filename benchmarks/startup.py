"""Wall time of `python train.py` against a bare Lightning script of the same job (issue #19).

    python benchmarks/startup.py                          # the default job, 5 repeats
    python benchmarks/startup.py --accelerator gpu --repeats 7 --json startup.json
    python benchmarks/startup.py --epochs 1 -- callbacks.progress_bar=null   # volt overrides

Every run is a fresh process, started as a user starts it: `python train.py`, and `BARE_SCRIPT`
below, the same job with Lightning alone. Each is also timed importing only what its script
imports at the top: what is left is the run. volt runs without early stopping (where it stops
varies with thread timing), so both sides run exactly `--epochs`, checked after the runs. An
untimed round of 1-epoch runs comes first (`--warmup`: neither side pays for reading torch from
disk), then the sides take turns going first, so that drifting load favours neither. CPU time
(user + system, with children) moves much less than wall time on a shared machine. Medians, and
the spread as min..max.
"""

import argparse
import ast
import re
import sys
import tempfile
from pathlib import Path
from typing import Any

import harness  # benchmarks/, the folder of this script, is first on sys.path

PROJECT = Path(__file__).resolve().parents[1]

BARE_SCRIPT = '''\
"""volt's default job written with Lightning alone: python bare_job.py OUT_DIR EPOCHS ACCELERATOR"""

import sys
from functools import partial

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.loggers import TensorBoardLogger

from volt.data.digits import DigitsDataModule
from volt.models.classifier import Classifier
from volt.nets.mlp import MLP

out_dir, epochs, accelerator = sys.argv[1], int(sys.argv[2]), sys.argv[3]
pl.seed_everything(42, workers=True)
data = DigitsDataModule(batch_size=64, val_fraction=0.15, test_fraction=0.15, split_seed=1234)
net = MLP(DigitsDataModule.input_shape, num_classes=10, hidden_sizes=[256, 256], dropout=0.1)
model = Classifier(
    net,
    num_classes=10,
    optimizer=partial(torch.optim.AdamW, lr=3e-3, weight_decay=0.01, eps=1e-8),
    scheduler=partial(torch.optim.lr_scheduler.CosineAnnealingLR, T_max=epochs),
)
checkpoint = ModelCheckpoint(
    f"{out_dir}/checkpoints", monitor="val/acc", mode="max", save_last=True
)
trainer = pl.Trainer(
    accelerator=accelerator,
    devices=1,
    max_epochs=epochs,
    log_every_n_steps=10,
    default_root_dir=out_dir,
    logger=TensorBoardLogger(out_dir, name="tensorboard", version=""),
    callbacks=[checkpoint],
)
trainer.fit(model, datamodule=data)
trainer.test(model, datamodule=data, ckpt_path="best")
print(f"epochs run: {trainer.current_epoch}")
'''

# What `python train.py` runs on each kind of machine: accelerator=auto is its default.
VOLT_TRAINER = {"auto": [], "cpu": ["trainer=cpu"], "gpu": ["trainer=gpu"]}
SIDES = ("volt", "bare")
KEYS = {  # the report's rows: label, key
    "wall": "wall_s",
    "  imports": "imports_s",
    "  after imports": "after_imports_s",
    "CPU time": "cpu_s",
}


def import_statements(source: str) -> str:
    """The top-level `import` / `from ... import` statements of a script, as one program."""
    tree = ast.parse(source)
    imports = [node for node in tree.body if isinstance(node, ast.Import | ast.ImportFrom)]
    return "\n".join(ast.unparse(node) for node in imports)


def volt_overrides(args: argparse.Namespace, epochs: int) -> list[str]:
    trainer = VOLT_TRAINER[args.accelerator]
    return [
        f"trainer.max_epochs={epochs}",
        "callbacks.early_stopping=null",
        *trainer,
        *args.overrides,
    ]


def commands(args: argparse.Namespace, work: Path, name: str, epochs: int) -> dict[str, list[str]]:
    """Each side's job, run into `work`/`name` (its `{side}` filled in)."""
    out = {side: work / name.format(side=side) for side in SIDES}
    train = [sys.executable, str(PROJECT / "train.py"), f"paths.outputs_dir={out['volt']}"]
    bare = [sys.executable, str(work / "bare_job.py"), str(out["bare"]), str(epochs)]
    return {"volt": train + volt_overrides(args, epochs), "bare": [*bare, args.accelerator]}


def measure(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    (work / "bare_job.py").write_text(BARE_SCRIPT)
    imports = {
        "volt": [sys.executable, "-c", import_statements((PROJECT / "train.py").read_text())],
        "bare": [sys.executable, "-c", import_statements(BARE_SCRIPT)],
    }

    def timed(command: list[str], log: str) -> harness.Finished:
        return harness.run_fresh(command, work / "logs" / log, cwd=PROJECT).check(command)

    for n in range(args.warmup):
        # Untimed, one epoch: the first process to load torch, the CUDA libraries and the data
        # reads them from disk, and whichever side came first would pay for both.
        for side, command in commands(args, work, f"warmup-{{side}}-{n}", 1).items():
            timed(command, f"warmup-{side}-{n}.log")
    runs: dict[str, list[harness.Finished]] = {side: [] for side in SIDES}
    imported: dict[str, list[harness.Finished]] = {side: [] for side in SIDES}
    for repeat in range(args.repeats):
        jobs = commands(args, work, f"{{side}}-{repeat}", args.epochs)
        for side in SIDES if repeat % 2 == 0 else SIDES[::-1]:
            runs[side].append(timed(jobs[side], f"{side}-{repeat}.log"))
            imported[side].append(timed(imports[side], f"{side}-{repeat}-imports.log"))
        times = ", ".join(f"{side} {runs[side][-1].wall_s:.2f} s" for side in SIDES)
        print(f"repeat {repeat + 1}/{args.repeats}: {times}", file=sys.stderr)
    check_same_epochs(work, runs["bare"], args.epochs)
    result: dict[str, Any] = {
        "accelerator": args.accelerator,
        "epochs": args.epochs,
        "repeats": args.repeats,
        "volt_command": ["python", "train.py", *volt_overrides(args, args.epochs)],
    }
    for side in SIDES:
        wall, imports_s = [r.wall_s for r in runs[side]], [r.wall_s for r in imported[side]]
        result[side] = {
            "wall_s": harness.summary(wall),
            "imports_s": harness.summary(imports_s),
            "after_imports_s": harness.summary(
                [w - i for w, i in zip(wall, imports_s, strict=True)]
            ),
            "cpu_s": harness.summary([r.cpu_s for r in runs[side]]),
        }
    result["volt_minus_bare_s"] = {
        key: result["volt"][key]["median"] - result["bare"][key]["median"] for key in KEYS.values()
    }
    return result


def check_same_epochs(work: Path, bare_runs: list[harness.Finished], epochs: int) -> None:
    import torch  # only now: the parent's imports would otherwise sit in memory through the runs

    # volt rewrites last.ckpt after every epoch; the bare script's only with a new best, so it
    # prints its count instead.
    lasts = [run / "checkpoints" / "last.ckpt" for run in sorted(work.glob("volt-*/train/runs/*"))]
    volt = [  # Lightning counts epochs from 0
        int(torch.load(last, map_location="cpu", weights_only=True)["epoch"]) + 1 for last in lasts
    ]
    bare = [int(re.findall(r"^epochs run: (\d+)$", r.text(), re.M)[-1]) for r in bare_runs]
    if {*volt, *bare} != {epochs}:
        raise RuntimeError(
            f"epochs run: volt {volt}, bare {bare}, not {epochs} each: the two sides did not run"
            " the same job; drop the override that changes the epochs"
        )


def report(result: dict[str, Any]) -> str:
    lines = [
        f"{result['epochs']} epochs, accelerator={result['accelerator']}, "
        f"median of {result['repeats']} (min..max), seconds",
        f"{'':16} {'volt':>22} {'bare Lightning':>22} {'volt - bare':>12}",
    ]
    for label, key in KEYS.items():
        cells = [result[side][key] for side in SIDES]
        volt, bare = (f"{s['median']:7.2f} ({s['min']:.2f}..{s['max']:.2f})" for s in cells)
        lines.append(f"{label:16} {volt:>22} {bare:>22} {result['volt_minus_bare_s'][key]:+12.2f}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--epochs", type=int, default=20, help="as conf/trainer/default.yaml")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument(
        "--warmup", type=int, default=1, help="untimed 1-epoch runs of each side before (0: none)"
    )
    parser.add_argument(
        "--accelerator", choices=sorted(VOLT_TRAINER), default="auto",
        help="auto: as a plain `python train.py`; gpu: volt's trainer=gpu, Lightning's 'gpu'",
    )  # fmt: skip
    parser.add_argument("--json", type=Path, help="also write the result, every sample, here")
    parser.add_argument(
        "--dir", type=Path,
        help="keep the runs in a new folder in DIR (e.g. on the file system your outputs/ is"
        " on); default: a temporary directory, removed at the end",
    )  # fmt: skip
    parser.add_argument("overrides", nargs="*", help="more overrides for volt's side only")
    args = parser.parse_args()
    if args.epochs < 1 or args.repeats < 1 or args.warmup < 0:
        parser.error(
            f"--epochs {args.epochs} --repeats {args.repeats} --warmup {args.warmup}: epochs and"
            " repeats must be at least 1, warmup at least 0"
        )
    if args.dir is not None:
        args.dir.mkdir(parents=True, exist_ok=True)
        result = measure(args, Path(tempfile.mkdtemp(prefix="startup-", dir=args.dir)))
    else:
        with tempfile.TemporaryDirectory(prefix="volt-startup-") as work:
            result = measure(args, Path(work))
    print(report(result))
    if args.json is not None:
        harness.save_json(args.json, result)


if __name__ == "__main__":
    main()
