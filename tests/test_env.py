import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from volt.device_report import (
    collect_device_report,
    format_device_report,
    headline,
    save_device_report,
)

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
without_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU report")

_GIB = 1024**3

# What collect_device_report returns on a machine with two NVLinked H100s, so the GPU half of
# the formatting is tested on CPU machines too.
TWO_H100 = {
    "python": "3.11.7",
    "torch": "2.11.0+cu130",
    "lightning": "2.6.6",
    "cuda": "13.0",
    "hip": None,
    "cudnn": "9.10.2",
    "nccl": "2.27.3",
    "cpu_count": 224,
    "cpu_usable": 16,
    "gpus": [
        {
            "index": index,
            "name": "NVIDIA H100 80GB HBM3",
            "compute_capability": "9.0",
            "sm_count": 132,
            "total_bytes": 85_045_379_072,
            "free_bytes": 84_506_279_936,
            "bf16": True,
            "tf32": True,
        }
        for index in range(2)
    ],
    "peer_access": [[None, True], [False, None]],
    "no_gpu_reason": None,
}


def run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "volt.env", *args],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        check=False,
    )


def test_report_matches_this_machine() -> None:
    report = collect_device_report()

    assert report["torch"] == torch.__version__
    assert report["cuda"] == torch.version.cuda
    assert len(report["gpus"]) == torch.cuda.device_count()
    assert report["cpu_count"] == os.cpu_count()
    assert 1 <= report["cpu_usable"] <= report["cpu_count"]
    assert json.loads(json.dumps(report)) == report


@without_cuda
def test_report_without_gpu_says_why() -> None:
    report = collect_device_report()
    text = format_device_report(report)

    assert report["gpus"] == [] and report["peer_access"] == []
    assert report["no_gpu_reason"]
    assert f"No CUDA GPU visible: {report['no_gpu_reason']}" in text
    assert headline(report) == (
        f"torch {torch.__version__} | "
        + (f"CUDA {torch.version.cuda} | " if torch.version.cuda else "")
        + f"no CUDA GPU (CPU only, {report['cpu_usable']} cores)"
    )


@pytest.mark.skipif(torch.version.cuda is None, reason="torch built without CUDA says so instead")
def test_hidden_devices_are_named_as_the_reason() -> None:
    result = run_cli("--json", env={"CUDA_VISIBLE_DEVICES": ""})

    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["gpus"] == []
    assert report["no_gpu_reason"] == "CUDA_VISIBLE_DEVICES='' hides every device"


def test_headline_names_gpus_compactly() -> None:
    assert headline(TWO_H100) == (
        "torch 2.11.0+cu130 | CUDA 13.0 | 2 x NVIDIA H100 80GB HBM3 (sm_90, 79.2 GiB) | bf16 yes"
    )
    mixed = {**TWO_H100, "gpus": [TWO_H100["gpus"][0], {**TWO_H100["gpus"][1], "bf16": False}]}
    assert headline(mixed).endswith("| bf16 no")


def test_format_shows_every_gpu_and_the_peer_matrix() -> None:
    lines = format_device_report(TWO_H100).splitlines()

    assert lines[0] == headline(TWO_H100)
    gpu_rows = [line.split() for line in lines[1:] if "NVIDIA H100 80GB HBM3" in line]
    # index, the name's 4 words, arch, SMs, total GiB, free GiB, bf16, TF32
    assert gpu_rows == [
        [str(i), "NVIDIA", "H100", "80GB", "HBM3", "sm_90", "132", "79.2", "78.7", "yes", "yes"]
        for i in range(2)
    ]
    header = next(i for i, line in enumerate(lines) if "from \\ to" in line)
    assert lines[header].split() == ["from", "\\", "to", "0", "1"]
    # lines[header + 1] is the rule under the header
    assert [line.split() for line in lines[header + 2 : header + 4]] == [
        ["0", "-", "yes"],
        ["1", "no", "-"],
    ]
    assert "No CUDA GPU visible" not in "\n".join(lines)


def test_save_writes_json_and_text(tmp_path: Path) -> None:
    run_dir = tmp_path / "runs" / "first"

    report = save_device_report(run_dir)

    saved = json.loads((run_dir / "device.json").read_text())
    assert saved == report
    assert saved["torch"] == torch.__version__
    assert len(saved["gpus"]) == torch.cuda.device_count()
    assert (run_dir / "device.txt").read_text() == format_device_report(saved)


def test_cli_prints_the_report() -> None:
    result = run_cli()

    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[0].startswith(f"torch {torch.__version__} | ")
    assert "Lightning" in result.stdout


@pytest.mark.gpu
@needs_cuda
def test_cli_lists_the_gpu() -> None:
    result = run_cli()

    assert result.returncode == 0, result.stderr
    name = torch.cuda.get_device_name(0)
    headline_line, *table = result.stdout.splitlines()
    assert name in headline_line
    assert any(line.split()[:1] == ["0"] and name in line for line in table)


@pytest.mark.gpu
@needs_cuda
def test_report_measures_the_gpu() -> None:
    gpu = collect_device_report()["gpus"][0]
    major, minor = torch.cuda.get_device_capability(0)

    assert gpu["compute_capability"] == f"{major}.{minor}"
    assert gpu["sm_count"] > 0
    assert 0 < gpu["free_bytes"] <= gpu["total_bytes"]
    assert gpu["tf32"] == (major >= 8)
