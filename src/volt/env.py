"""`python -m volt.env` (or `volt-env`): torch / CUDA / cuDNN / NCCL versions, CPUs and every
visible GPU, as a table (or JSON with --json; that is how a run collects it in a child process)."""

import argparse
import json

from volt.console import Terminal
from volt.device_report import collect_device_report, print_report


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="volt-env", description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    args = parser.parse_args(argv)
    report = collect_device_report()
    if args.json:
        print(json.dumps(report, indent=2))
        return
    print_report(Terminal(), report)


if __name__ == "__main__":
    main()
