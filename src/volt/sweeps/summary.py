"""The table at the end of a multirun: one row per job, its overrides and its final metrics."""

import csv
import json
from pathlib import Path

import yaml
from rich.console import Console
from rich.table import Table

from volt.runs import METRICS_FILE


def collect_jobs(sweep_dir: Path) -> list[dict[str, str]]:
    """One row per job directory (those holding .hydra/overrides.yaml), in job order."""
    rows = []
    for overrides_file in sweep_dir.glob("*/.hydra/overrides.yaml"):
        job_dir = overrides_file.parent.parent
        overrides = yaml.safe_load(overrides_file.read_text()) or []
        row = {"job": job_dir.name.split("_", 1)[0], "dir": job_dir.name}
        row.update(o.split("=", 1) for o in overrides if "=" in o)
        metrics_file = job_dir / METRICS_FILE
        if metrics_file.is_file():
            record = json.loads(metrics_file.read_text())
            row["status"] = record.get("status", "completed")
            row.update({k: f"{v:.6g}" for k, v in record.get("metrics", {}).items()})
            if "error" in record:
                row["error"] = record["error"]
        else:
            row["status"] = "unfinished"  # running, or killed before it could say
        rows.append(row)
    return sorted(rows, key=lambda r: int(r["job"]) if r["job"].isdigit() else 0)


def write_sweep_summary(sweep_dir: Path) -> list[dict[str, str]]:
    """(Re)write summary.csv from the job directories; rewritten after every job, so a sweep that
    is killed or ends with a failed job still has one."""
    rows = collect_jobs(sweep_dir)
    if rows:
        columns = list(dict.fromkeys(k for row in rows for k in row))
        with (sweep_dir / "summary.csv").open("w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=columns)
            writer.writeheader()
            writer.writerows(rows)
    return rows


def print_sweep_summary(sweep_dir: Path, optimized_metric: str | None = None) -> None:
    rows = write_sweep_summary(sweep_dir)
    if not rows:
        return
    columns = list(dict.fromkeys(k for row in rows for k in row))
    shown = [
        c for c in columns if c not in ("dir", "error") and not c.startswith(("train/", "val/loss"))
    ]
    table = Table(title=f"Sweep summary ({len(rows)} jobs) -> {sweep_dir / 'summary.csv'}")
    for column in shown:
        table.add_column(column, style="bold" if column == optimized_metric else None)
    for row in rows:
        table.add_row(*(row.get(c, "") for c in shown))
    Console().print(table)
