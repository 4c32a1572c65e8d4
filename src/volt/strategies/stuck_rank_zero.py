"""`python -m volt.strategies.stuck_rank_zero PID RUN_JSON GRACE_S LINE`: ends a run whose rank 0
is stuck after another rank failed.

A rank that fails (volt.rank) starts this as it exits. Rank 0's own watcher of the ranks
(`volt.strategies.launcher`) is a Python thread, and under NCCL rank 0 can wait for the dead
rank in C while holding the interpreter's lock: a CUDA call blocked behind a collective that
never ends (a full launch queue, a copy to the host), seen on 2 x H100 with torch 2.11. Then no
thread of rank 0 runs again, its watcher neither. This separate process waits GRACE_S for the
run to end (its run.json to leave "running"); if it has not, it says why the run ended (LINE,
the failed rank's one line), records the run as failed and kills rank 0 and its children.

Standard library and volt.folder_files only, so that it starts at once: run.json is read and
written as every file of a run folder is (no link followed, no FIFO waited on, replaced not
written through).
"""

import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

from volt.errors import on_one_line
from volt.folder_files import read_json_object, write_replacing


def run_is_running(run_json: Path) -> bool:
    try:
        return read_json_object(run_json, run_json.parent).get("status") == "running"
    except (OSError, ValueError):  # FolderFileError included: a file volt did not write
        return False


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"  # a zombie has ended: its parent has not read its status yet


def children_of(pid: int) -> list[int]:
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, IndexError, ValueError):
            if int(stat.read_text().rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(stat.parent.name))
    return found


def end_stuck_run(pid: int, run_json: Path, grace_s: float, line: str) -> bool:
    """Wait for the run; True if it had to be ended here. Leaves as soon as rank 0 exits (its
    pidfd wakes this process), so that nothing of the run outlives it for long."""
    try:
        exited = os.pidfd_open(pid)
    except OSError:  # gone already
        return False
    deadline = time.monotonic() + grace_s
    while (left := deadline - time.monotonic()) > 0:
        if select.select([exited], [], [], min(0.5, left))[0] or not run_is_running(run_json):
            return False
    if not alive(pid) or not run_is_running(run_json):
        return False
    print(
        f"volt: error: {on_one_line(line)}; rank 0 still waited for it after {grace_s:.0f} s"
        " (in a collective, where nothing else of it runs) and was killed",
        file=sys.stderr,
        flush=True,
    )
    record = read_json_object(run_json, run_json.parent)
    record.update(
        status="failed",
        error=f"RankFailedError: {line}",
        ended=datetime.now().isoformat(timespec="seconds"),
    )
    write_replacing(run_json, run_json.parent, json.dumps(record, indent=2) + "\n")
    for each in [*children_of(pid), pid]:
        with contextlib.suppress(ProcessLookupError):
            os.kill(each, signal.SIGKILL)
    return True


def start(pid: int, run_json: Path, grace_s: float, line: str) -> None:
    """Start this module in a process of its own, which outlives the caller."""
    command = [sys.executable, "-m", __name__, str(pid), str(run_json), str(grace_s), line]
    subprocess.Popen(command, stdin=subprocess.DEVNULL)


if __name__ == "__main__":
    end_stuck_run(int(sys.argv[1]), Path(sys.argv[2]), float(sys.argv[3]), sys.argv[4])
