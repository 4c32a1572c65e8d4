"""benchmarks/bpb_curve.py draws held-out bits per byte against minutes from real event files."""

import subprocess
import sys
from pathlib import Path

from torch.utils.tensorboard import SummaryWriter

from volt.config import PROJECT_ROOT


def a_run(run_dir: Path, start: float, bpb: list[float]) -> None:
    """Event files as a GPT run leaves them: train/loss every step, val/bpb every 10."""
    writer = SummaryWriter(str(run_dir))
    for step in range(30):
        writer.add_scalar("train/loss", 5.0 - step / 10, step, walltime=start + step)
        if step % 10 == 9:
            writer.add_scalar("val/bpb", bpb[step // 10], step, walltime=start + step)
    writer.close()


def test_the_curve_of_two_runs_is_drawn(tmp_path: Path) -> None:
    a_run(tmp_path / "bpb10", 1000.0, [4.0, 3.0, 2.5])
    a_run(tmp_path / "bpb20", 5000.0, [3.8, 2.9, 2.2])
    out = tmp_path / "docs" / "curve.png"
    command = [sys.executable, "benchmarks/bpb_curve.py", str(tmp_path / "bpb10")]
    command += [str(tmp_path / "bpb20"), "--out", str(out), "--title", "test"]
    done = subprocess.run(command, cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "bpb10: 3 points, 4.000 -> 2.500 bpb" in done.stdout
    assert "bpb20: 3 points, 3.800 -> 2.200 bpb" in done.stdout
    assert out.read_bytes().startswith(b"\x89PNG")


def test_a_run_without_bpb_is_one_clear_line(tmp_path: Path) -> None:
    writer = SummaryWriter(str(tmp_path / "plain"))
    writer.add_scalar("train/loss", 1.0, 0)
    writer.close()
    command = [sys.executable, "benchmarks/bpb_curve.py", str(tmp_path / "plain")]
    command += ["--out", str(tmp_path / "x.png")]
    done = subprocess.run(command, cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1
    assert done.stderr.strip().endswith("has no train/loss or val/bpb in its event files")
