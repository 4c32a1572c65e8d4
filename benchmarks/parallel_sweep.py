"""Wall time of one CPU sweep, its jobs side by side (`hydra/launcher=parallel`) against one at a
time (`hydra/launcher=basic`) (issue #21).

    python benchmarks/parallel_sweep.py                         # 4 jobs, 2 at a time
    python benchmarks/parallel_sweep.py --jobs 8 --n-jobs 4 --epochs 2
    python benchmarks/parallel_sweep.py -- data.batch_size=32   # more volt overrides

Each side is a fresh `python train.py -m experiment=digits_cnn seed=1,2,...`, every job for all
--epochs (no early stopping). Under `basic` the jobs run one after another in the sweep's own
process, torch using every core; under `parallel` --n-jobs run at once, each in a process of its
own (paying its own imports) with cores // n_jobs threads (`hydra.launcher.threads_per_job`). The
sides take turns going first over --repeats rounds, so that load drifting on a shared machine
favours neither; CPU time (user + system of the sweep and all its processes), which moves less
with that load, is reported beside wall time. A side whose sweep fails is an error, not a time.
"""

import argparse
import csv
import os
import statistics
import sys
import tempfile
from pathlib import Path

import harness  # benchmarks/, the folder of this script, is first on sys.path

SIDES = ("basic", "parallel")


def cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def run_sweep(launcher: str, args: argparse.Namespace) -> tuple[float, float]:
    """(wall s, CPU s) of one sweep; raises unless every job completed."""
    seeds = ",".join(str(seed) for seed in range(1, args.jobs + 1))
    with tempfile.TemporaryDirectory(prefix=f"sweep-{launcher}-") as tmp:
        outputs = Path(tmp) / "outputs"
        command = [sys.executable, "train.py", "-m", "experiment=digits_cnn", f"seed={seeds}"]
        command += [f"trainer.max_epochs={args.epochs}", "callbacks.early_stopping=null"]
        command += ["callbacks.progress_bar=null", "callbacks.model_summary=null"]
        command += [f"hydra/launcher={launcher}", f"paths.outputs_dir={outputs}"]
        command += [f"hydra.launcher.n_jobs={args.n_jobs}"] if launcher == "parallel" else []
        command += args.overrides
        log = Path(tmp) / "sweep.log"
        done = harness.run_fresh(command, log, cwd=harness.PROJECT).check(command)
        (sweep_dir,) = (outputs / "train" / "multiruns").iterdir()
        with (sweep_dir / "summary.csv").open() as f:
            statuses = [row["status"] for row in csv.DictReader(f)]
    if statuses != ["completed"] * args.jobs:
        raise RuntimeError(f"the {launcher} sweep's jobs ended {statuses}")
    return done.wall_s, done.cpu_s


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=4, help="jobs in the sweep")
    parser.add_argument("--n-jobs", type=int, default=2, help="jobs at once under parallel")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=1, help="rounds of both sides")
    parser.add_argument("overrides", nargs="*", help="more volt overrides, after --")
    args = parser.parse_args()

    times: dict[str, list[tuple[float, float]]] = {side: [] for side in SIDES}
    for round_ in range(args.repeats):
        for launcher in SIDES if round_ % 2 == 0 else SIDES[::-1]:
            times[launcher].append(took := run_sweep(launcher, args))
            print(f"round {round_ + 1}: {launcher:8s} {took[0]:7.1f} s wall, {took[1]:7.1f} s CPU")

    n = cores()
    threads = {"basic": f"torch's default ({n} cores)", "parallel": str(max(1, n // args.n_jobs))}
    at_once = {"basic": 1, "parallel": args.n_jobs}
    wall = {side: statistics.median(w for w, _ in runs) for side, runs in times.items()}
    cpu = {side: statistics.median(c for _, c in runs) for side, runs in times.items()}
    print(
        f"\n{args.jobs} jobs of experiment=digits_cnn, {args.epochs} epochs each, {n} cores,"
        f" median of {args.repeats}:\n"
    )
    rows = [
        [side, str(at_once[side]), threads[side], f"{wall[side]:.1f}", f"{cpu[side]:.1f}"]
        for side in SIDES
    ]
    columns = ["launcher", "jobs at once", "threads per job", "wall s", "CPU s"]
    print("\n".join(harness.markdown_table(columns, "lllll", rows)))
    print(f"\nbasic / parallel wall time: {wall['basic'] / wall['parallel']:.2f}x")


if __name__ == "__main__":
    main()
