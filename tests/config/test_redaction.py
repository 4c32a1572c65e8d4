"""No secret is written: values read with `${oc.env:...}` reach the training objects but every
file of the run holds only the interpolation; a key named like a secret given as a literal is
refused before anything is written."""

import hashlib
import json
import os
import re
import secrets
import subprocess
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest
import torch
import yaml
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.loggers import CSVLogger
from omegaconf import DictConfig, OmegaConf

from tests.in_process import RunHere
from volt.config import CONF_DIR, register_resolver
from volt.config.composition import VERSION_BASE
from volt.config.redaction import redacted_container, refuse_literal_secrets, says_secret
from volt.errors import ConfigError

Run = Callable[..., subprocess.CompletedProcess[str]]
HERE = "tests.config.test_redaction"


class KeyedLogger(CSVLogger):
    """A logger that needs an API key, as hosted trackers' loggers do. It leaves a digest of the
    key it was given outside the run directory, one file per process: proof that the run got the
    real value."""

    def __init__(self, api_key: str, receipts: str, **csv_logger: Any) -> None:
        super().__init__(**csv_logger)
        rank = os.environ.get("LOCAL_RANK", "0")
        digest = hashlib.sha256(api_key.encode()).hexdigest()
        (Path(receipts) / f"rank{rank}.sha256").write_text(digest)


class FailOnceInSecondEpoch(Callback):
    """Fails the run as its second epoch starts, the first time only: a run to resume."""

    def __init__(self, marker: str) -> None:
        self.marker = Path(marker)

    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.current_epoch == 1 and not self.marker.exists():
            self.marker.touch()
            raise RuntimeError("stopped on purpose, to be resumed")


# -- which names say secret ---------------------------------------------------------------------

SECRET_NAMES = ["api_key", "apiKey", "API_KEY", "key", "access_key", "secret_key", "apikey"]
SECRET_NAMES += ["token", "hf_token", "HF_TOKEN", "accessToken", "password", "db_password"]
SECRET_NAMES += ["passwd", "secret", "client_secret", "credentials"]
PLAIN_NAMES = ["monitor", "keys_to_ignore", "keys", "key_dim", "max_tokens", "tokens"]
PLAIN_NAMES += ["tokenizer", "token_dim", "eos_token", "pad_token", "password_file", "secrets"]


@pytest.mark.parametrize("name", SECRET_NAMES)
def test_names_that_say_secret(name: str) -> None:
    assert says_secret(name)


@pytest.mark.parametrize("name", PLAIN_NAMES)
def test_names_that_do_not(name: str) -> None:
    assert not says_secret(name)


# -- what is stored of values from the environment ---------------------------------------------


def test_values_from_the_environment_are_stored_as_their_interpolation(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    secret = f"volt-fake-secret-{secrets.token_hex(8)}"
    monkeypatch.setenv("VOLT_TEST_SECRET", secret)
    monkeypatch.setenv("VOLT_TEST_NUMBER", "8")
    monkeypatch.setenv("VOLT_TEST_LIST", "[1, 2]")
    cfg = OmegaConf.create(
        {
            "whole": "${oc.env:VOLT_TEST_SECRET}",
            "inside": "Bearer ${oc.env:VOLT_TEST_SECRET}",
            "through_key": "${whole}",
            "number": "${oc.decode:${oc.env:VOLT_TEST_NUMBER}}",
            "number_through_key": "${oc.decode:${number_text}}",
            "number_text": "${oc.env:VOLT_TEST_NUMBER}",
            "list": "${oc.decode:${oc.env:VOLT_TEST_LIST}}",
            "default": "${oc.env:VOLT_TEST_UNSET,${whole}}",
            "nested": {"api_key": "${oc.env:VOLT_TEST_SECRET}", "tags": ["x", "${whole}", 3]},
            "copy_of_nested": "${nested}",
            "escaped": "\\${oc.env:VOLT_TEST_SECRET}",  # a literal, not read from anywhere
            "plain": "kept",
            "count": 3,
        }
    )
    stored = redacted_container(cfg)
    assert secret not in yaml.safe_dump(stored)
    assert stored["whole"] == stored["through_key"] == "${oc.env:VOLT_TEST_SECRET}"
    assert stored["inside"] == "Bearer ${oc.env:VOLT_TEST_SECRET}"
    assert stored["nested"]["tags"] == ["x", "${oc.env:VOLT_TEST_SECRET}", 3]
    # decode made a number (a list) of the environment's string: stored decoded, as eval accepts.
    assert stored["number"] == "${oc.decode:${oc.env:VOLT_TEST_NUMBER}}"
    assert stored["number_through_key"] == "${oc.decode:${oc.env:VOLT_TEST_NUMBER}}"
    assert stored["list"] == "${oc.decode:${oc.env:VOLT_TEST_LIST}}"
    assert (stored["plain"], stored["count"]) == ("kept", 3)
    # Read back as a DDP rank or eval reads it (a file, OmegaConf, the same environment): the
    # values the run used, the escaped literal included.
    path_free = yaml.safe_load(yaml.safe_dump(stored))
    again = OmegaConf.to_container(OmegaConf.create(path_free), resolve=True)
    assert again == OmegaConf.to_container(cfg, resolve=True)
    assert again["escaped"] == "${oc.env:VOLT_TEST_SECRET}"


def test_a_value_no_text_reproduces_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = iter(range(100))
    register_resolver("volt_test_count", lambda _: next(calls))
    monkeypatch.setenv("VOLT_TEST_SECRET", "s")
    cfg = OmegaConf.create({"n": "${volt_test_count:${oc.env:VOLT_TEST_SECRET}}"})
    with pytest.raises(ConfigError, match=r"^n is built from an environment variable"):
        redacted_container(cfg)


@pytest.mark.parametrize(
    "node",
    [
        {"api_key": "abc"},
        {"api_key": 1234},
        {"api_key": "${.other}", "other": "abc"},
        {"token": ["${oc.env:VOLT_TEST_SECRET}", "abc"]},
        {"credentials": {"user": "me"}},
    ],
    ids=["literal", "number", "through-key", "list-item", "inside-mapping"],
)
def test_a_secret_named_literal_is_not_stored(
    node: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("VOLT_TEST_SECRET", "s")
    with pytest.raises(ConfigError, match="is given as a literal value, which volt would write"):
        redacted_container(OmegaConf.create({"logger": node}))


def test_unset_or_empty_secret_keys_are_fine() -> None:
    cfg = OmegaConf.create({"api_key": None, "password": "", "token": False})
    assert redacted_container(cfg) == {"api_key": None, "password": "", "token": False}


# -- the refusal before Hydra writes .hydra/ ---------------------------------------------------


def composed(*overrides: str) -> DictConfig:
    """The config as VoltCallback._validate receives it: with `hydra`, before the job runs."""
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(str(CONF_DIR), **VERSION_BASE):
            return compose("train", overrides=list(overrides), return_hydra_config=True)
    finally:
        GlobalHydra.instance().clear()


@pytest.mark.parametrize("overrides", [[], ["logger=many", "trainer=ddp", "experiment=digits_cnn"]])
def test_volts_own_configs_pass(overrides: list[str]) -> None:
    refuse_literal_secrets(composed(*overrides))


def test_secrets_from_the_environment_pass_unresolved() -> None:
    # The variable need not be set here: only what is written is looked at, not the value.
    refuse_literal_secrets(composed("+logger.x.api_key=${oc.env:VOLT_TEST_NEVER_SET}"))


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            ["+logger.x.api_key=abc"],
            re.escape(
                "logger.x.api_key is given as a literal value, which Hydra would write into "
                ".hydra/overrides.yaml: pass it from the environment instead, "
                "e.g. logger.x.api_key='${oc.env:API_KEY}'"
            ),
        ),
        (["+logger.x={api_key: abc}"], "logger.x.api_key .* into .hydra/overrides.yaml"),
        (["+mine=abc", "+logger.x.hfToken=${mine}"], r"hfToken='\$\{oc\.env:HF_TOKEN\}'$"),
        (["+hydra.job.env_set.WANDB_API_KEY=abc"], "hydra.job.env_set.WANDB_API_KEY is given"),
    ],
    ids=["command-line", "inside-a-mapping", "through-a-key", "hydra-env-set"],
)
def test_a_literal_secret_is_refused(overrides: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        refuse_literal_secrets(composed(*overrides))


def test_a_literal_secret_in_a_config_file_is_refused() -> None:
    cfg = OmegaConf.create({"logger": {"x": {"password": "abc"}}, "hydra": {"overrides": {}}})
    with pytest.raises(ConfigError, match=r"into \.hydra/config\.yaml: "):
        refuse_literal_secrets(cfg)


@pytest.mark.parametrize(
    ("sweep", "refused"),
    [
        ("+logger.x.api_key=a,b", True),
        ("+logger.x.api_key=${oc.env:A},b", True),
        ("+logger.x.api_key=${oc.env:A},${oc.env:B}", False),
    ],
)
def test_a_sweep_over_secrets_must_read_each_from_the_environment(
    sweep: str, refused: bool
) -> None:
    # In -m the swept values are only in the overrides, not in the composed config.
    cfg = OmegaConf.create({"hydra": {"overrides": {"task": [sweep]}}})
    if refused:
        with pytest.raises(ConfigError, match=r"^logger\.x\.api_key is given as a literal value"):
            refuse_literal_secrets(cfg)
    else:
        refuse_literal_secrets(cfg)


# -- real runs ---------------------------------------------------------------------------------


def found_in(value: Any, needle: str) -> bool:
    """Whether `needle` is in any string (key or value) of an unpickled checkpoint."""
    if isinstance(value, str | bytes):
        return needle in (value if isinstance(value, str) else value.decode(errors="replace"))
    if isinstance(value, dict):
        return any(found_in(k, needle) or found_in(v, needle) for k, v in value.items())
    if isinstance(value, list | tuple | set):
        return any(found_in(v, needle) for v in value)
    return needle in str(value) if not isinstance(value, torch.Tensor) else False


def assert_nowhere(needles: list[str], root: Path) -> int:
    """No needle in any file or directory name under root, in any file's bytes, in any member of
    a checkpoint's zip, or in any string of an unpickled checkpoint. Returns the files read."""
    files = [p for p in root.rglob("*") if p.is_file()]
    for path in root.rglob("*"):
        for needle in needles:
            assert needle not in str(path.relative_to(root)), path
    for path in files:
        data = path.read_bytes()
        for needle in needles:
            assert needle.encode() not in data, path
        if path.suffix == ".ckpt":
            with zipfile.ZipFile(path) as archive:
                for member in archive.namelist():
                    for needle in needles:
                        assert needle.encode() not in archive.read(member), (path, member)
            checkpoint = torch.load(path, map_location="cpu", weights_only=True)
            for needle in needles:
                assert not found_in(checkpoint, needle), path
    return len(files)


@pytest.fixture
def fake_secrets(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> tuple[str, str, list[str]]:
    """(secret, dropout, overrides): a random key in the environment, read by a logger's
    `api_key`, by a tag and (through oc.decode) by the net's dropout: a secret-named key, a
    string and a number that a real object uses."""
    secret = f"volt-fake-secret-{secrets.token_hex(8)}"
    dropout = str(float(f"0.1{secrets.randbelow(10**8):08d}3"))
    monkeypatch.setenv("VOLT_TEST_SECRET", secret)
    monkeypatch.setenv("VOLT_TEST_DROPOUT", dropout)
    (tmp_path / "receipts").mkdir()
    overrides = [
        "trusted_targets=[tests]",  # the logger and callback here are the tests' own
        "logger=many",
        f"+logger.keyed._target_={HERE}.KeyedLogger",
        "+logger.keyed.api_key=${oc.env:VOLT_TEST_SECRET}",
        f"+logger.keyed.receipts={tmp_path / 'receipts'}",
        f"+logger.keyed.save_dir={tmp_path / 'outputs' / 'keyed_logger'}",
        "+logger.keyed.name=keyed",
        "tags=[run-${oc.env:VOLT_TEST_SECRET}]",
        "model.net.dropout='${oc.decode:${oc.env:VOLT_TEST_DROPOUT}}'",
        "callbacks.progress_bar=null",
        "callbacks.model_summary=null",
        "trainer.limit_train_batches=4",
        "trainer.limit_val_batches=2",
        "trainer.limit_test_batches=2",
    ]
    return secret, dropout, overrides


def assert_run_got_the_secret(receipts: Path, secret: str, ranks: int) -> None:
    digest = hashlib.sha256(secret.encode()).hexdigest()
    found = {p.name: p.read_text() for p in receipts.iterdir()}
    assert found == {f"rank{r}.sha256": digest for r in range(ranks)}


def assert_stored_as_interpolation(run_dir: Path) -> None:
    """The records hold the interpolations, and they resolve again from the environment."""
    text = yaml.safe_load((run_dir / "config_resolved.yaml").read_text())
    assert text["logger"]["keyed"]["api_key"] == "${oc.env:VOLT_TEST_SECRET}"
    stored = OmegaConf.load(run_dir / "config_resolved.yaml")  # as a DDP rank loads it
    assert stored.logger.keyed.api_key == os.environ["VOLT_TEST_SECRET"]
    assert stored.model.net.dropout == float(os.environ["VOLT_TEST_DROPOUT"])
    events = b"".join(p.read_bytes() for p in run_dir.glob("events.*"))
    assert b"${oc.decode:${oc.env:VOLT_TEST_DROPOUT}}" in events  # the hparams tab's entry
    checkpoint = torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)
    assert checkpoint["volt_config"]["tags"] == ["run-${oc.env:VOLT_TEST_SECRET}"]


@pytest.mark.slow
def test_a_run_its_resume_and_eval_write_no_secret(
    run_volt_here: RunHere, tmp_path: Path, fake_secrets: tuple[str, str, list[str]]
) -> None:
    # In the test's process: what the runs write and say is the point, not a process of their own.
    secret, dropout, overrides = fake_secrets
    stop = f"+callbacks.fail_once={{_target_:{HERE}.FailOnceInSecondEpoch,marker:'{tmp_path}/x'}}"
    command = ["name=keyed", "trainer.max_epochs=2", stop, *overrides]
    first = run_volt_here(command)
    assert first.returncode == 1 and "stopped on purpose" in first.stderr, first.stderr[-3000:]
    resumed = run_volt_here(command)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    run_dir = tmp_path / "outputs" / "train" / "runs" / "keyed"
    assert "resuming run keyed from" in (run_dir / "train.log").read_text()
    assert json.loads((run_dir / "metrics.json").read_text())["status"] == "completed"
    assert_run_got_the_secret(tmp_path / "receipts", secret, ranks=1)
    assert_stored_as_interpolation(run_dir)
    # eval reads no variable a checkpoint names at an ordinary key (issue #31): the run's own
    # dropout, stored as its environment read, is refused with one line, the secret unread.
    last = run_dir / "checkpoints" / "last.ckpt"
    evaluated = run_volt_here([f"ckpt_path={last}", "trusted_targets=[tests]"], module="volt.eval")
    assert evaluated.returncode == 2, evaluated.stderr[-3000:]
    assert "model.net.dropout: '${oc.decode:${oc.env:VOLT_TEST_DROPOUT}}' is not allowed" in (
        evaluated.stderr
    )
    assert assert_nowhere([secret, dropout], tmp_path / "outputs") > 20
    for output in (first, resumed, evaluated):
        assert secret not in output.stdout + output.stderr


@pytest.mark.slow
def test_ddp_ranks_read_the_secret_from_the_environment(
    run_volt: Run, tmp_path: Path, fake_secrets: tuple[str, str, list[str]]
) -> None:
    # The extra ranks train from config_resolved.yaml, which holds only the interpolations: they
    # resolve them in the environment they inherit from rank 0.
    secret, dropout, overrides = fake_secrets
    result = run_volt(["trainer=ddp", "trainer.devices=2", "trainer.max_epochs=1", *overrides])
    assert result.returncode == 0, result.stderr[-3000:]
    (run_dir,) = (tmp_path / "outputs" / "train" / "runs").iterdir()
    assert (run_dir / "train_rank1.log").is_file()
    assert_run_got_the_secret(tmp_path / "receipts", secret, ranks=2)
    assert_stored_as_interpolation(run_dir)
    assert_nowhere([secret, dropout], tmp_path / "outputs")


def test_a_literal_secret_is_refused_before_anything_is_written(
    run_volt_here: RunHere, tmp_path: Path
) -> None:
    literal = f"volt-fake-secret-{secrets.token_hex(8)}"
    result = run_volt_here([f"+logger.keyed.api_key={literal}"])
    assert result.returncode == 2
    assert result.stderr.strip() == (
        "volt: config error: logger.keyed.api_key is given as a literal value, which Hydra would "
        "write into .hydra/overrides.yaml: pass it from the environment instead, "
        "e.g. logger.keyed.api_key='${oc.env:API_KEY}'"
    )
    assert not (tmp_path / "outputs").exists()
