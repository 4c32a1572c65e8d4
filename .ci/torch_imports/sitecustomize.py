"""Counts the Python interpreters that import torch, and can make each import slower: on
PYTHONPATH only for a measurement (docs/development.md, "What the suite's time is made of").

VOLT_TORCH_IMPORT_LOG=FILE  appends one JSON line per interpreter as it first imports torch: its
                            pid, its command line and the test it ran under (PYTEST_CURRENT_TEST,
                            which pytest sets and every child inherits).
VOLT_TORCH_IMPORT_SPIN_S=S  keeps the CPU busy for S seconds before that import, once per
                            interpreter: a machine whose import takes S seconds longer. Busy, not
                            asleep, as the import itself is CPU work that competes for the cores.
"""

import json
import os
import sys
import time


class _FirstTorchImport:
    def find_spec(self, name: str, path: object = None, target: object = None) -> None:
        if name != "torch":
            return None
        sys.meta_path.remove(self)  # once per interpreter
        log = os.environ.get("VOLT_TORCH_IMPORT_LOG")
        if log:
            line = {
                "pid": os.getpid(),
                "argv": sys.argv,
                "test": os.environ.get("PYTEST_CURRENT_TEST", ""),
                "time": time.time(),
            }
            with open(log, "a") as out:  # one short write a line: safe from many processes
                out.write(json.dumps(line) + "\n")
        spin = float(os.environ.get("VOLT_TORCH_IMPORT_SPIN_S", "0"))
        end = time.process_time() + spin
        while time.process_time() < end:
            pass
        return None  # the normal finders import it


if os.environ.get("VOLT_TORCH_IMPORT_LOG") or os.environ.get("VOLT_TORCH_IMPORT_SPIN_S"):
    sys.meta_path.insert(0, _FirstTorchImport())
