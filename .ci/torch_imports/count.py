"""The interpreters each test file started that imported torch, and the file's time.

usage: python .ci/torch_imports/count.py LOG [JUNIT_XML]
LOG is what sitecustomize.py here wrote (VOLT_TORCH_IMPORT_LOG); JUNIT_XML, pytest's --junitxml,
adds each file's tests and their summed time. The pytest processes themselves (the controller
and each xdist worker) are counted apart, under "(pytest)".
"""

import json
import sys
import xml.etree.ElementTree as ET
from collections import Counter, defaultdict
from pathlib import Path


def test_file(line: dict) -> str:
    # Outside any test: pytest itself and its xdist workers (each `python -c ...`).
    return line["test"].split("::")[0] if line["test"] else "(pytest)"


def times(junit: Path) -> dict[str, tuple[int, float]]:
    tests: dict[str, list[float]] = defaultdict(list)
    for case in ET.parse(junit).iter("testcase"):
        path = case.get("classname", "").split(".")
        # classname is tests.runs.test_resume (or ....TestClass): the module's path
        while path and not path[-1].startswith("test_"):
            path.pop()
        tests["/".join(path) + ".py"].append(float(case.get("time", 0)))
    return {name: (len(ts), sum(ts)) for name, ts in tests.items()}


def main() -> None:
    lines = [json.loads(line) for line in Path(sys.argv[1]).read_text().splitlines()]
    started = Counter(test_file(line) for line in lines)
    timed = times(Path(sys.argv[2])) if len(sys.argv) > 2 else {}
    rows = sorted(set(started) | set(timed), key=lambda f: -timed.get(f, (0, 0.0))[1])
    print(f"{'file':52} {'interpreters':>12} {'tests':>6} {'time s':>8}")
    for name in rows:
        count, seconds = timed.get(name, (0, 0.0))
        print(f"{name:52} {started.get(name, 0):>12} {count:>6} {seconds:>8.1f}")
    print(
        f"{'all':52} {len(lines):>12} {sum(c for c, _ in timed.values()):>6} "
        f"{sum(s for _, s in timed.values()):>8.1f}"
    )


if __name__ == "__main__":
    main()
