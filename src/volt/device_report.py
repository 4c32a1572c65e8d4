"""What this machine offers a training run: library versions, CPUs, and each visible GPU.

`save_device_report` files it with every run; `python -m volt.env` (or `volt-env`) prints it.
"""

import io
import json
import os
import platform
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import lightning
import torch
from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from volt.console import Terminal

_GIB = 1024**3


def collect_device_report() -> dict[str, Any]:
    """Everything the report shows, as JSON-serialisable data (memory in bytes)."""
    gpu_count = torch.cuda.device_count()
    gpus = [_gpu_info(index) for index in range(gpu_count)]
    # peer_access[i][j]: can GPU i read GPU j's memory directly (NVLink or PCIe P2P);
    # None on the diagonal, where the question does not arise.
    peer_access = [
        [
            None if src == dst else torch.cuda.can_device_access_peer(src, dst)
            for dst in range(gpu_count)
        ]
        for src in range(gpu_count)
    ]
    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "lightning": lightning.__version__,
        "cuda": torch.version.cuda,
        "hip": torch.version.hip,
        "cudnn": _cudnn_version(),
        "nccl": _nccl_version(),
        "cpu_count": os.cpu_count(),
        # A scheduler (SLURM, a container's cpuset) may pin us to fewer cores than the
        # machine has; the pinned count is the one that bounds DataLoader workers.
        "cpu_usable": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "gpus": gpus,
        "peer_access": peer_access,
        "no_gpu_reason": None if gpus else _no_gpu_reason(),
    }


def _gpu_info(index: int) -> dict[str, Any]:
    props = torch.cuda.get_device_properties(index)
    # cudaMemGetInfo opens a CUDA context on the device, which this process then holds
    # (a few hundred MiB) until it exits; see save_device_report.
    free, total = torch.cuda.mem_get_info(index)
    # bf16 and TF32 tensor cores arrived with Ampere (sm_80); older parts only emulate bf16, slowly.
    ampere_or_newer = props.major >= 8
    return {
        "index": index,
        "name": props.name,
        "compute_capability": f"{props.major}.{props.minor}",
        "sm_count": props.multi_processor_count,
        "total_bytes": total,
        "free_bytes": free,
        "bf16": ampere_or_newer or torch.version.hip is not None,
        "tf32": ampere_or_newer and torch.version.hip is None,
    }


def _cudnn_version() -> str | None:
    raw = torch.backends.cudnn.version()
    if raw is None:  # torch built without cuDNN
        return None
    # cuDNN 9 encodes major*10000 + minor*100 + patch; cuDNN 8 used major*1000.
    major, rest = divmod(raw, 10000 if raw >= 90000 else 1000)
    return f"{major}.{rest // 100}.{rest % 100}"


def _nccl_version() -> str | None:
    if not (torch.distributed.is_available() and torch.distributed.is_nccl_available()):
        return None
    return ".".join(str(part) for part in torch.cuda.nccl.version())


def _no_gpu_reason() -> str:
    if torch.version.cuda is None and torch.version.hip is None:
        return f"torch {torch.__version__} was built without CUDA"
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None and visible.strip() in ("", "-1"):
        return f"CUDA_VISIBLE_DEVICES={visible!r} hides every device"
    try:
        torch.cuda.init()
    except RuntimeError as err:
        # torch's message names the cause: no driver, a driver too old for this build, ...
        return str(err)
    return "the CUDA runtime started but reports no device"


def headline(report: dict[str, Any]) -> str:
    """One line naming torch, the CUDA build and the GPUs, for logs and run names."""
    parts = [f"torch {report['torch']}"]
    if report["cuda"]:
        parts.append(f"CUDA {report['cuda']}")
    elif report["hip"]:
        parts.append(f"ROCm {report['hip']}")
    gpus = report["gpus"]
    if not gpus:
        cores = report["cpu_usable"] or report["cpu_count"]
        return " | ".join([*parts, f"no CUDA GPU (CPU only, {cores} cores)"])
    kinds = Counter(
        f"{gpu['name']} ({_arch(gpu)}, {gpu['total_bytes'] / _GIB:.1f} GiB)" for gpu in gpus
    )
    parts.append(" + ".join(f"{count} x {kind}" for kind, count in kinds.items()))
    parts.append(f"bf16 {_yes_no(all(gpu['bf16'] for gpu in gpus))}")
    return " | ".join(parts)


def _arch(gpu: dict[str, Any]) -> str:
    return "sm_" + gpu["compute_capability"].replace(".", "")


def _yes_no(flag: bool) -> str:
    return "yes" if flag else "no"


_SOFTWARE_ROWS = {
    "Python": "python",
    "torch": "torch",
    "Lightning": "lightning",
    "CUDA (build)": "cuda",
    "ROCm (build)": "hip",
    "cuDNN": "cudnn",
    "NCCL": "nccl",
    "CPUs (machine)": "cpu_count",
    "CPUs (usable here)": "cpu_usable",
}


def print_report(console: Console, report: dict[str, Any]) -> None:
    # markup=False: "[...]" in GPU names or error messages is text, not rich markup;
    # soft_wrap: the headline stays one greppable line however narrow the terminal.
    console.print(headline(report), soft_wrap=True, markup=False, highlight=False)
    software = Table(box=box.SIMPLE_HEAD, show_header=False, title="Software and host")
    for label, key in _SOFTWARE_ROWS.items():
        software.add_row(label, "-" if report[key] is None else str(report[key]))
    console.print(software)
    gpus = report["gpus"]
    if not gpus:
        reason = f"No CUDA GPU visible: {report['no_gpu_reason']}."
        console.print(reason, soft_wrap=True, markup=False, highlight=False)
        return

    devices = Table(box=box.SIMPLE_HEAD, title="GPUs")
    for column in ["#", "name", "arch", "SMs", "total GiB", "free GiB", "bf16", "TF32"]:
        devices.add_column(column, no_wrap=column == "name")
    for gpu in gpus:
        devices.add_row(
            str(gpu["index"]),
            Text(gpu["name"]),
            _arch(gpu),
            str(gpu["sm_count"]),
            f"{gpu['total_bytes'] / _GIB:.1f}",
            f"{gpu['free_bytes'] / _GIB:.1f}",
            _yes_no(gpu["bf16"]),
            _yes_no(gpu["tf32"]),
        )
    console.print(devices)
    if len(gpus) > 1:
        peers = Table(box=box.SIMPLE_HEAD, title="Peer access")
        for column in ["from \\ to", *(str(gpu["index"]) for gpu in gpus)]:
            peers.add_column(column)
        for index, row in enumerate(report["peer_access"]):
            peers.add_row(str(index), *("-" if ok is None else _yes_no(ok) for ok in row))
        console.print(peers)


def format_device_report(report: dict[str, Any]) -> str:
    """The report as plain multi-line text (no colour codes), as `python -m volt.env` shows it."""
    buffer = io.StringIO()
    print_report(Terminal(file=buffer, width=100, color_system=None, force_terminal=False), report)
    return buffer.getvalue()


def save_device_report(run_dir: Path) -> dict[str, Any]:
    """Write `device.json` and `device.txt` into `run_dir`; return the report."""
    # One GPU or none: this process opens that GPU's context anyway, so collect here (a child
    # costs ~10 s of imports). Several: a child, so this process keeps no context on the others.
    in_process = torch.cuda.device_count() <= 1
    report = collect_device_report() if in_process else _report_from_child()
    run_dir.mkdir(parents=True, exist_ok=True)
    json_path = run_dir / "device.json"
    json_path.write_text(json.dumps(report, indent=2) + "\n")
    (run_dir / "device.txt").write_text(format_device_report(report))
    return report


def _report_from_child() -> dict[str, Any]:
    # With GPUs, collect in a child process: measuring free memory opens a CUDA context on every
    # visible GPU, which the training process would otherwise keep (eating memory on other ranks'
    # GPUs) and which makes fork-based launchers (ddp_fork) refuse to start.
    command = [sys.executable, "-m", "volt.env", "--json"]
    child = subprocess.run(command, capture_output=True, text=True)
    if child.returncode != 0:
        raise RuntimeError(
            f"`{' '.join(command)}` exited with {child.returncode}; its stderr:\n{child.stderr}"
        )
    report: dict[str, Any] = json.loads(child.stdout)
    return report
