"""The README's held-out bits-per-byte picture: val/bpb of one or more runs against minutes of
training, read from each run directory's TensorBoard event files.

    python benchmarks/bpb_curve.py outputs/train/runs/bpb10 --out docs/gpt_bpb.png \
        --title "experiment=gpt_bytes on one H200"

The clock starts at each run's first logged training step (after start-up and compilation).
"""

import argparse
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator


def scalars(run_dir: Path, tag: str) -> list[tuple[float, int, float]]:
    """(wall time, step, value) of `tag` across the run's event files, in step order."""
    points = []
    for events in sorted(run_dir.glob("events.out.tfevents.*")):
        accumulator = EventAccumulator(str(events), size_guidance={"scalars": 0})
        accumulator.Reload()
        if tag in accumulator.Tags()["scalars"]:
            points += [(e.wall_time, e.step, e.value) for e in accumulator.Scalars(tag)]
    return sorted(points, key=lambda point: point[1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("runs", nargs="+", type=Path, help="run directories")
    parser.add_argument("--out", type=Path, default=Path("docs/gpt_bpb.png"))
    parser.add_argument("--title", default="held-out bits per byte")
    args = parser.parse_args()
    figure, axes = plt.subplots(figsize=(7, 4), dpi=120)
    for run_dir in args.runs:
        train = scalars(run_dir, "train/loss")
        bpb = scalars(run_dir, "val/bpb")
        if not train or not bpb:
            raise SystemExit(f"{run_dir} has no train/loss or val/bpb in its event files")
        start = train[0][0]
        minutes = [(wall - start) / 60 for wall, _, _ in bpb]
        axes.plot(minutes, [v for *_, v in bpb], marker="o", markersize=3, label=run_dir.name)
        print(f"{run_dir.name}: {len(bpb)} points, {bpb[0][2]:.3f} -> {bpb[-1][2]:.3f} bpb")
    axes.set_xlabel("minutes of training")
    axes.set_ylabel("val/bpb (held-out bits per byte)")
    axes.set_title(args.title)
    axes.grid(alpha=0.3)
    if len(args.runs) > 1:
        axes.legend()
    figure.tight_layout()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(args.out)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
