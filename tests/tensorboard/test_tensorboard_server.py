"""`tensorboard --logdir outputs` over real runs, read through its HTTP data API as the web page
reads it: a small sweep's jobs under readable names, their curves, the hparams tab with every job's
status and final metrics, the images; a run listed as running from its start, then interrupted.
Optionally, a headless Chromium's screenshots of the hparams and images pages."""

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from volt.config import PROJECT_ROOT

EPOCHS, BATCHES = 2, 4
QUICK = [
    f"trainer.max_epochs={EPOCHS}",
    f"trainer.limit_train_batches={BATCHES}",
    "trainer.limit_val_batches=2",
    "trainer.limit_test_batches=2",
    "trainer.log_every_n_steps=2",
    "callbacks.progress_bar=null",
    "callbacks.model_summary=null",
]
STATUSES = ["STATUS_UNKNOWN", "STATUS_SUCCESS", "STATUS_FAILURE", "STATUS_RUNNING"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class TensorBoard:
    """A `tensorboard` process on a free local port, and requests to its data API."""

    def __init__(self, logdir: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        command = [sys.executable, "-m", "tensorboard.main", "--logdir", str(logdir)]
        command += ["--port", str(self.port), "--host", "127.0.0.1", "--reload_interval", "1"]
        self.process = subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )

    def get(self, path: str, body: dict[str, Any] | None = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(
            self.url + path, data=data, headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(request, timeout=20) as response:
            raw = response.read()
        return raw if response.headers.get_content_type().startswith("image/") else json.loads(raw)

    def session_groups(self) -> dict[str, dict[str, Any]]:
        """The hparams tab's rows by run name, as its page asks for them (metrics included)."""
        body = {
            "experimentName": "",
            "allowedStatuses": STATUSES,
            "colParams": [],
            "startIndex": 0,
            "sliceSize": 100,
            "includeMetrics": True,
        }
        groups = self.get("/data/plugin/hparams/session_groups", body)["sessionGroups"]
        return {g["sessions"][0]["name"]: g for g in groups}

    def wait_for(self, ready: Callable[[], bool], seconds: float = 90) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise AssertionError(f"tensorboard exited: {self.process.communicate()[0]}")
            with contextlib.suppress(OSError, ValueError, KeyError):
                if ready():
                    return
            time.sleep(0.5)
        raise AssertionError(f"tensorboard at {self.url} was not ready in {seconds} s")

    def stop(self) -> None:
        self.process.terminate()
        self.process.communicate(timeout=30)


@contextlib.contextmanager
def tensorboard(logdir: Path) -> Iterator[TensorBoard]:
    server = TensorBoard(logdir)
    try:
        yield server
    finally:
        server.stop()


def train_command(outputs: Path, *args: str) -> list[str]:
    return [sys.executable, "train.py", *args, f"paths.outputs_dir={outputs}"]


@pytest.fixture(scope="module")
def sweep(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, TensorBoard]]:
    """Two jobs that train and one that fails as fit starts (a negative weight decay, which
    AdamW refuses), then a TensorBoard over all of `outputs` that has read them."""
    outputs = tmp_path_factory.mktemp("tb") / "outputs"
    decays = "model.optimizer.weight_decay=0.01,0,-1"
    command = train_command(outputs, "-m", "name=grid", decays, *QUICK)
    done = subprocess.run(
        command, cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode != 0, "the job with weight_decay=-1 fails, and with it the sweep"
    assert "Invalid weight_decay value" in done.stderr, done.stderr[-3000:]
    with tensorboard(outputs) as server:
        server.wait_for(lambda: len(server.session_groups()) == 3)
        yield outputs, server


@pytest.mark.slow
def test_a_sweep_reads_in_tensorboard_job_by_job(sweep: tuple[Path, TensorBoard]) -> None:
    outputs, server = sweep
    jobs = sorted(p for p in (outputs / "train" / "multiruns" / "grid").iterdir() if p.is_dir())
    names = [f"train/multiruns/grid/{job.name}" for job in jobs]
    assert [n.split("/")[-1].split(",")[0] for n in names] == [
        "0_model.optimizer.weight_decay=0.01",
        "1_model.optimizer.weight_decay=0",
        "2_model.optimizer.weight_decay=-1",
    ]
    assert sorted(server.get("/data/runs")) == names
    trained, failed = names[:2], names[2]

    tags = server.get("/data/plugin/scalars/tags")
    expected = {"train/loss", "train/grad_norm", "val/acc", "val/loss", "test/acc", "lr-AdamW"}
    for run in trained:
        assert expected | {"perf/train_samples_per_s"} <= set(tags[run]), run
        for tag in ("val/acc", "test/acc", "lr-AdamW"):
            query = urllib.parse.urlencode({"run": run, "tag": tag})
            steps = [step for _, step, _ in server.get(f"/data/plugin/scalars/scalars?{query}")]
            # In step order: no final value again at step 0.
            assert steps == sorted(steps) and len(steps) == len(set(steps)), (run, tag, steps)
            if tag == "val/acc":
                assert steps == [BATCHES - 1, 2 * BATCHES - 1]
            if tag == "test/acc":
                assert steps == [EPOCHS * BATCHES]

    experiment = server.get("/data/plugin/hparams/experiment", {"experimentName": ""})
    hparams = {h["name"]: h for h in experiment["hparamInfos"]}
    assert sorted(hparams["status"]["domainDiscrete"]) == ["completed", "failed"]
    assert hparams["model.optimizer.weight_decay"]["domainInterval"] == {
        "minValue": -1.0,
        "maxValue": 0.01,
    }
    metrics = {m["name"]["tag"] for m in experiment["metricInfos"]}
    assert {"val/acc", "val/acc_best", "test/acc", "train/grad_norm"} <= metrics

    groups = server.session_groups()
    assert sorted(groups) == names
    for run, decay in zip(trained, [0.01, 0.0], strict=True):
        group = groups[run]
        assert group["hparams"]["status"] == "completed"
        assert group["hparams"]["model.optimizer.weight_decay"] == pytest.approx(decay)
        assert group["sessions"][0]["status"] == "STATUS_SUCCESS"
        values = {m["name"]["tag"]: m for m in group["metricValues"]}
        record = json.loads((outputs / run / "metrics.json").read_text())["metrics"]
        assert values["test/acc"]["value"] == pytest.approx(record["test/acc"])
        assert values["test/acc"]["trainingStep"] == EPOCHS * BATCHES
        assert values["val/acc"]["value"] == pytest.approx(record["val/acc"])
    assert groups[failed]["hparams"]["status"] == "failed"
    assert groups[failed]["sessions"][0]["status"] == "STATUS_FAILURE"
    assert "test/acc" not in {m["name"]["tag"] for m in groups[failed].get("metricValues", [])}

    images = server.get("/data/plugin/images/tags")
    for run in trained:
        assert set(images[run]) == {"val/confusion_matrix", "val/predictions"}
        query = urllib.parse.urlencode({"run": run, "tag": "val/confusion_matrix"})
        shown = server.get(f"/data/plugin/images/images?{query}")
        assert [image["step"] for image in shown] == [BATCHES - 1, 2 * BATCHES - 1]
        png = server.get(f"/data/plugin/images/individualImage?{shown[-1]['query']}")
        assert png.startswith(b"\x89PNG")


@pytest.mark.slow
def test_a_run_is_listed_running_from_its_start_then_interrupted(tmp_path: Path) -> None:
    outputs = tmp_path / "outputs"
    # No end but the signal: a bounded run (1,000 tiny epochs, or early stopping) once finished
    # before TensorBoard listed it.
    endless = ["trainer.max_epochs=-1", "callbacks.early_stopping=null"]
    command = train_command(outputs, "name=long", *endless, *QUICK[1:])
    run = subprocess.Popen(
        command, cwd=PROJECT_ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    run_dir = outputs / "train" / "runs" / "long"
    try:
        with tensorboard(outputs) as server:
            # Listed while it trains, before any metric is written at its end.
            server.wait_for(lambda: "train/runs/long" in server.session_groups())
            live = server.session_groups()["train/runs/long"]
            assert live["hparams"]["status"] == "running"
            assert live["sessions"][0]["status"] == "STATUS_UNKNOWN"
            assert run.poll() is None
            assert not (run_dir / "metrics.json").exists()
            run.send_signal(signal.SIGTERM)
            assert run.wait(timeout=120) == 128 + signal.SIGTERM
            # A TensorBoard that was running sees the end record; its hparams stay as first read.
            server.wait_for(
                lambda: (
                    server.session_groups()["train/runs/long"]["sessions"][0]["status"]
                    == "STATUS_FAILURE"
                )
            )
    finally:
        if run.poll() is None:
            run.kill()
        run.communicate()
    with tensorboard(outputs) as server:
        server.wait_for(lambda: "train/runs/long" in server.session_groups())
        group = server.session_groups()["train/runs/long"]
        assert group["hparams"]["status"] == "interrupted"
        assert json.loads((run_dir / "run.json").read_text())["status"] == "interrupted"


CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.mark.slow
@pytest.mark.skipif(CHROMIUM is None, reason="no chromium (Debian: apt-get install chromium)")
@pytest.mark.parametrize("page", ["hparams", "images"])
def test_a_browser_draws_the_pages(
    page: str, sweep: tuple[Path, TensorBoard], tmp_path: Path
) -> None:
    """The pages render in a real browser; the screenshots are kept for a person to look at."""
    _, server = sweep
    shot = tmp_path / f"{page}.png"
    command = [
        str(CHROMIUM), "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
        "--window-size=1600,1000", "--virtual-time-budget=20000", f"--screenshot={shot}",
        f"{server.url}/#{page}",
    ]  # fmt: skip
    env = {**os.environ, "HOME": str(tmp_path)}  # chromium writes its profile under HOME
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    picture = shot.read_bytes()
    assert picture.startswith(b"\x89PNG") and len(picture) > 20_000  # more than a blank page
    keep = os.environ.get("VOLT_SCREENSHOTS")
    if keep:
        shutil.copy(shot, Path(keep) / shot.name)
