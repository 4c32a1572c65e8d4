"""tune=batch_size and tune=lr: Lightning's finders run before fit, and what they found is what
the run, its record and its checkpoints use."""

import logging
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import yaml
from omegaconf import DictConfig

from volt.training import train

Compose = Callable[..., DictConfig]


@pytest.mark.parametrize("tune", ["batch_size", "lr"])
def test_finders_run_before_fit(
    tune: str, compose_config: Compose, fast: list[str], caplog: pytest.LogCaptureFixture
) -> None:
    # The LR finder needs its 100 steps within max_epochs: 19 batches an epoch here.
    epochs = "trainer.max_epochs=6" if tune == "lr" else "trainer.max_epochs=1"
    cfg = compose_config(
        "train", [*fast, "logger=csv", f"tune={tune}", "test=false", "trainer=cpu", epochs]
    )
    metrics = train(cfg)
    assert metrics["val/acc"] > 0.5
    # The finder's short fits each end in Lightning's "`Trainer.fit` stopped: `max_steps=...`
    # reached." (one per batch size tried): train.log's, at DEBUG. The console (INFO) has the
    # fit's own end, and volt's line with what the finder found.
    by_lightning = [
        r.getMessage()
        for r in caplog.records
        if r.name.startswith("lightning") and r.levelno >= logging.INFO
    ]
    assert by_lightning == [f"`Trainer.fit` stopped: `{epochs.removeprefix('trainer.')}` reached."]
    run_dir = Path(cfg.paths.output_dir)
    recorded = yaml.safe_load((run_dir / "config_resolved.yaml").read_text())
    stored = torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)["volt_config"]
    if tune == "lr":
        assert (run_dir / "lr_find.png").stat().st_size > 0
        assert recorded["model"]["optimizer"]["lr"] != 0.003  # the finder's value, not the config's
        assert stored["model"]["optimizer"]["lr"] == recorded["model"]["optimizer"]["lr"]
        # Lightning's note as the finder restores its own checkpoint: for train.log only.
        (note,) = [r for r in caplog.records if "`weights_only` was not set" in r.getMessage()]
        assert note.levelno == logging.DEBUG
    else:
        # doubled from 64 up to, not past, the 1,258 training samples
        assert 64 < recorded["data"]["batch_size"] <= 1258
        assert stored["data"]["batch_size"] == recorded["data"]["batch_size"]
