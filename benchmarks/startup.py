"""Wall time of `python train.py` against a bare Lightning script of the same job (issue #19).

    python benchmarks/startup.py                          # the default job, 5 repeats
    python benchmarks/startup.py --accelerator gpu --repeats 7 --json startup.json
    python benchmarks/startup.py --epochs 1 -- callbacks.progress_bar=null   # volt overrides

Every run is a fresh process, started as a user starts it: (a) `python train.py` and (b)
`BARE_SCRIPT` below, the same job written with Lightning alone (volt's digits data module, MLP and
classifier, AdamW with the cosine schedule, seed 42, TensorBoard, a checkpoint callback keeping the
best and the last, a test of the best at the end). Each is also timed importing only what its
script imports (its top-level import statements, in a fresh process): what is left is the run.

volt runs without its early stopping (`callbacks.early_stopping=null`): on the default job it
stops after a number of epochs that changes from run to run with thread timing, so both sides run
exactly `--epochs`, which is checked after the runs. One untimed round of 1-epoch runs comes
first (`--warmup`), so that neither side pays for reading torch and the CUDA libraries from disk;
then the two sides take turns going first, so that load drifting on a shared machine favours
neither. CPU time (user + system, the process and its children) is reported beside wall time: on
a machine others are using, it moves much less. Medians, and the spread as min..max.
"""

import argparse
import ast
import json
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


def import_statements(source: str) -> str:
    """The top-level `import` / `from ... import` statements of a script, as one program."""
    tree = ast.parse(source)
    imports = [node for node in tree.body if isinstance(node, ast.Import | ast.ImportFrom)]
    return "\n".join(ast.unparse(node) for node in imports)


def timed(command: list[str], log: Path) -> harness.Finished:
    """Run `command` in the project to its end: its wall time, and the CPU time it and its
    children used. A failure raises, naming its log."""
    return harness.run_fresh(command, log, cwd=PROJECT).check(command)


def volt_epochs_run(run_dir: Path) -> int:
    """Epochs trained, from the last.ckpt volt rewrites after every epoch."""
    import torch  # only now: the parent's imports would otherwise sit in memory through the runs

    last = torch.load(run_dir / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)
    return int(last["epoch"]) + 1


def bare_epochs_run(run: harness.Finished) -> int:
    # The bare script's last.ckpt is rewritten only with a new best: it prints the count instead.
    return int(re.findall(r"^epochs run: (\d+)$", run.text(), re.MULTILINE)[-1])


def volt_command(args: argparse.Namespace, out_dir: Path, epochs: int) -> list[str]:
    return [
        sys.executable,
        str(PROJECT / "train.py"),
        f"paths.outputs_dir={out_dir}",
        *volt_overrides(args, epochs),
    ]


def volt_overrides(args: argparse.Namespace, epochs: int) -> list[str]:
    return [
        f"trainer.max_epochs={epochs}",
        "callbacks.early_stopping=null",
        *VOLT_TRAINER[args.accelerator],
        *args.overrides,
    ]


def bare_command(args: argparse.Namespace, script: Path, out_dir: Path, epochs: int) -> list[str]:
    return [sys.executable, str(script), str(out_dir), str(epochs), args.accelerator]


def measure(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    bare_script = work / "bare_job.py"
    bare_script.write_text(BARE_SCRIPT)
    imports = {
        "volt": [sys.executable, "-c", import_statements((PROJECT / "train.py").read_text())],
        "bare": [sys.executable, "-c", import_statements(BARE_SCRIPT)],
    }
    logs = work / "logs"
    for n in range(args.warmup):
        # Untimed, one epoch: the first process to load torch, the CUDA libraries and the data
        # reads them from disk, and whichever side came first would pay for both.
        timed(volt_command(args, work / f"warmup-volt-{n}", 1), logs / f"warmup-volt-{n}.log")
        timed(
            bare_command(args, bare_script, work / f"warmup-bare-{n}", 1),
            logs / f"warmup-bare-{n}.log",
        )
    samples: dict[str, dict[str, list[harness.Finished]]] = {
        side: {"run": [], "imports": []} for side in ("volt", "bare")
    }
    for repeat in range(args.repeats):
        runs = {
            "volt": volt_command(args, work / f"volt-{repeat}", args.epochs),
            "bare": bare_command(args, bare_script, work / f"bare-{repeat}", args.epochs),
        }
        for side in ["volt", "bare"] if repeat % 2 == 0 else ["bare", "volt"]:
            samples[side]["run"].append(timed(runs[side], logs / f"{side}-{repeat}.log"))
            imports_log = logs / f"{side}-{repeat}-imports.log"
            samples[side]["imports"].append(timed(imports[side], imports_log))
        print(
            f"repeat {repeat + 1}/{args.repeats}: "
            + ", ".join(f"{s} {samples[s]['run'][-1].wall_s:.2f} s" for s in ("volt", "bare")),
            file=sys.stderr,
        )
    check_same_epochs(work, samples["bare"]["run"], args.epochs)
    result: dict[str, Any] = {
        "accelerator": args.accelerator,
        "epochs": args.epochs,
        "repeats": args.repeats,
        "volt_command": ["python", "train.py", *volt_overrides(args, args.epochs)],
    }
    for side, by_kind in samples.items():
        wall = [s.wall_s for s in by_kind["run"]]
        imported = [s.wall_s for s in by_kind["imports"]]
        result[side] = {
            "wall_s": harness.summary(wall),
            "imports_s": harness.summary(imported),
            "after_imports_s": harness.summary(
                [w - i for w, i in zip(wall, imported, strict=True)]
            ),
            "cpu_s": harness.summary([s.cpu_s for s in by_kind["run"]]),
        }
    result["volt_minus_bare_s"] = {
        key: result["volt"][key]["median"] - result["bare"][key]["median"]
        for key in ("wall_s", "imports_s", "after_imports_s", "cpu_s")
    }
    return result


def check_same_epochs(work: Path, bare_runs: list[harness.Finished], epochs: int) -> None:
    counts = {
        "volt": [volt_epochs_run(d) for d in sorted(work.glob("volt-*/train/runs/*"))],
        "bare": [bare_epochs_run(run) for run in bare_runs],
    }
    if {*counts["volt"], *counts["bare"]} != {epochs}:
        raise RuntimeError(
            f"epochs run: volt {counts['volt']}, bare {counts['bare']}, not {epochs} each: the"
            " two sides did not run the same job; drop the override that changes the epochs"
        )


def report(result: dict[str, Any]) -> str:
    rows = [
        ("wall", "wall_s"),
        ("  imports", "imports_s"),
        ("  after imports", "after_imports_s"),
        ("CPU time", "cpu_s"),
    ]
    lines = [
        f"{result['epochs']} epochs, accelerator={result['accelerator']}, "
        f"median of {result['repeats']} (min..max), seconds",
        f"{'':16} {'volt':>22} {'bare Lightning':>22} {'volt - bare':>12}",
    ]
    for label, key in rows:
        cells = []
        for side in ("volt", "bare"):
            s = result[side][key]
            cells.append(f"{s['median']:7.2f} ({s['min']:.2f}..{s['max']:.2f})")
        lines.append(
            f"{label:16} {cells[0]:>22} {cells[1]:>22} {result['volt_minus_bare_s'][key]:+12.2f}"
        )
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
        "--accelerator",
        choices=sorted(VOLT_TRAINER),
        default="auto",
        help="auto: as a plain `python train.py`; gpu: volt's trainer=gpu, Lightning's 'gpu'",
    )
    parser.add_argument("--json", type=Path, help="also write the result, every sample, here")
    parser.add_argument(
        "--dir",
        type=Path,
        help="keep the runs in a new folder in DIR (e.g. on the file system your outputs/ is"
        " on); default: a temporary directory, removed at the end",
    )
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
        args.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
