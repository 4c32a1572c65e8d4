"""The table at the end of a multirun: one row per job, its overrides and its final metrics."""

import csv
import json
from pathlib import Path

import yaml
from rich.console import Console
from rich.table import Table

METRICS_FILE = "metrics.json"


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
        else:
            row["status"] = "failed"
        rows.append(row)
    return sorted(rows, key=lambda r: int(r["job"]) if r["job"].isdigit() else 0)


def write_sweep_summary(sweep_dir: Path, optimized_metric: str | None = None) -> Path | None:
    rows = collect_jobs(sweep_dir)
    if not rows:
        return None
    columns = list(dict.fromkeys(k for row in rows for k in row))
    path = sweep_dir / "summary.csv"
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns)
        writer.writeheader()
        writer.writerows(rows)
    shown = [c for c in columns if c != "dir" and not c.startswith(("train/", "val/loss"))]
    table = Table(title=f"Sweep summary ({len(rows)} jobs) -> {path}")
    for column in shown:
        table.add_column(column, style="bold" if column == optimized_metric else None)
    for row in rows:
        table.add_row(*(row.get(c, "") for c in shown))
    Console().print(table)
    return path
