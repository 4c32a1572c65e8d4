"""A run's directory over its life: the records it leaves (records, and TensorBoard's hparams tab:
hparams_tab), one writer at a time (lock), and continuing a named run where it stopped (resume)."""

from volt.runs.hparams_tab import hparams_session
from volt.runs.lock import RunLock, RunLockedError, lock_run_dir
from volt.runs.records import (
    METRICS_FILE,
    end_open_records,
    read_record,
    record_failure,
    run_record,
    save_resolved_config,
    write_metrics,
)
from volt.runs.resume import (
    ResumePlan,
    check_resumed_weights,
    check_same_run,
    find_resume,
    plan_resume,
)

__all__ = [
    "METRICS_FILE",
    "ResumePlan",
    "RunLock",
    "RunLockedError",
    "check_resumed_weights",
    "check_same_run",
    "end_open_records",
    "find_resume",
    "hparams_session",
    "lock_run_dir",
    "plan_resume",
    "read_record",
    "record_failure",
    "run_record",
    "save_resolved_config",
    "write_metrics",
]
