"""A real MLflow tracking server on a loopback port, and W&B's offline run files read back."""

import contextlib
import os
import signal
import socket
import struct
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

# A run of a few steps, each logged: enough for a metric history, seconds to train (with
# trainer.max_epochs).
TINY = [
    "trainer.limit_train_batches=4",
    "trainer.limit_val_batches=2",
    "trainer.limit_test_batches=2",
    "trainer.num_sanity_val_steps=0",
    "trainer.log_every_n_steps=1",
    "callbacks.progress_bar=null",
    "callbacks.model_summary=null",
]
SERVER_START_S = 90


@pytest.fixture(autouse=True)
def own_config_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The user's config folder, where volt keeps the key that stamps tracked runs: one of the
    test's own (the runs it starts inherit it), never the real home's."""
    home = tmp_path / "config_home"
    monkeypatch.setenv("XDG_CONFIG_HOME", str(home))
    return home


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def mlflow_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """`mlflow server` with a SQLite store in a temp dir, on 127.0.0.1; yields its URI."""
    store = tmp_path_factory.mktemp("mlflow_server")
    port = free_port()
    command = [
        *(sys.executable, "-m", "mlflow", "server"),
        *("--backend-store-uri", f"sqlite:///{store / 'mlflow.db'}"),
        *("--default-artifact-root", str(store / "artifacts")),
        *("--host", "127.0.0.1", "--port", str(port), "--workers", "1"),
    ]
    log = (store / "server.log").open("w")
    server = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    uri = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + SERVER_START_S
        while True:
            with (
                contextlib.suppress(OSError),
                urllib.request.urlopen(f"{uri}/health", timeout=2) as answer,
            ):
                if answer.status == 200:
                    break
            if server.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"mlflow server did not start: {(store / 'server.log').read_text()}")
            time.sleep(0.5)
        yield uri
    finally:
        # Killed, not asked to stop: its store is thrown away, and on SIGTERM the server took
        # 19 s to exit (mlflow 3.x, 2 cores), each time a test module used it.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(server.pid, signal.SIGKILL)
        server.wait(timeout=30)
        log.close()


def wandb_records(offline_run: Path) -> list[Any]:
    """The records of an offline W&B run's `run-<id>.wandb` file: W&B's transaction log, a
    LevelDB-style log (7-byte file header; 32 KiB blocks of chunks, each with a 7-byte header:
    CRC, length, kind) of `Record` protobufs."""
    from wandb.proto import wandb_internal_pb2

    (path,) = offline_run.glob("run-*.wandb")
    data, block = path.read_bytes(), 32 * 1024
    assert data[:4] == b":W&B"
    records, pending, pos = [], b"", 7
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # too little left in the block for a chunk header: padding
            pos += block - pos % block
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if kind == 0:  # zero padding to the end of the block
            pos += block - pos % block
            continue
        pending += data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # a whole record, or the last chunk of one
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            records.append(record)
            pending = b""
    return records


def wandb_values(items: Any) -> dict[str, str]:
    """{key: value as JSON text} of a W&B config update or history row."""
    return {item.key or "/".join(item.nested_key): item.value_json for item in items}
