"""Write random images in CIFAR-10's on-disk format (same sizes as the real set), for timing runs
on machines that cannot download it:  python benchmarks/fake_cifar10.py /tmp/data"""

import pickle
import sys
from pathlib import Path

import numpy as np


def write(root: Path, per_file: int = 10_000) -> Path:
    """Five training files and a test file of `per_file` random images each: the folder."""
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    for name in [*(f"data_batch_{i}" for i in range(1, 6)), "test_batch"]:
        batch = {
            b"data": rng.integers(0, 256, (per_file, 3072), dtype=np.uint8),
            b"labels": rng.integers(0, 10, per_file).tolist(),
        }
        (folder / name).write_bytes(pickle.dumps(batch))
    return folder


if __name__ == "__main__":
    print(f"fake CIFAR-10 written to {write(Path(sys.argv[1]))}")
