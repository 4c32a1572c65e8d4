"""Write random images in CIFAR-10's on-disk format (same sizes as the real set), for timing runs
on machines that cannot download it:  python benchmarks/fake_cifar10.py /tmp/data"""

import pickle
import sys
from pathlib import Path

import numpy as np


def main(root: Path) -> None:
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    for name, n in [*((f"data_batch_{i}", 10_000) for i in range(1, 6)), ("test_batch", 10_000)]:
        batch = {
            b"data": rng.integers(0, 256, (n, 3072), dtype=np.uint8),
            b"labels": rng.integers(0, 10, n).tolist(),
        }
        with open(folder / name, "wb") as f:
            pickle.dump(batch, f)
    print(f"fake CIFAR-10 written to {folder}")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
