"""A checkpoint is data: eval rebuilds a run from the config stored in it, and a crafted one must
not run code. Each case takes the checkpoint of a real training run, puts a payload into its
config that would write a sentinel file if it ran, and expects one line, exit status 2, no
sentinel and outputs/ untouched. A control shows every payload does run through volt's build path
once the check is taken out, so each case can fail."""

import contextlib
import copy
import hashlib
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from hydra.core.global_hydra import GlobalHydra
from omegaconf import DictConfig, OmegaConf

from volt import build
from volt import eval as volt_eval
from volt import rank as rank_entry
from volt.checkpointing import CHECKPOINT_KEY, AtomicCheckpointIO, CheckpointLoadError
from volt.config import PROJECT_ROOT
from volt.errors import ConfigError

Payload = Callable[[dict[str, Any], Path], None]


def snapshot(root: Path) -> dict[str, str]:
    """Every file under root with a hash of its bytes, and every directory: any change shows."""
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "/"
        for p in sorted(root.rglob("*"))
    }


@pytest.fixture(scope="module")
def outputs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """outputs/ holding one real (one-epoch) training run."""
    outputs = tmp_path_factory.mktemp("crafted") / "outputs"
    done = subprocess.run(
        [
            sys.executable,
            "train.py",
            "trainer.max_epochs=1",
            "callbacks.progress_bar=null",
            "callbacks.model_summary=null",
            "logger=none",
            "test=false",
            f"paths.outputs_dir={outputs}",
        ],
        cwd=PROJECT_ROOT,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stderr
    return outputs


@pytest.fixture(scope="module")
def run_dir(outputs: Path) -> Path:
    (run_dir,) = (outputs / "train" / "runs").iterdir()
    return run_dir


def saves_sentinel(sentinel: Path) -> dict[str, Any]:
    """Calls torch.save(0, sentinel): a callable neither volt nor Hydra's own policy refuses."""
    return {"_target_": "torch.save", "_args_": [0, str(sentinel)]}


def hub_repo(sentinel: Path) -> str:
    """A local torch.hub repository whose hubconf.py writes the sentinel when imported."""
    repo = sentinel.parent / f"hub_{sentinel.name}"
    repo.mkdir()
    (repo / "hubconf.py").write_text(
        f"open({str(sentinel)!r}, 'w').close()\n\n\ndef entry(*args, **kwargs):\n    return None\n"
    )
    return str(repo)


def model_target(config: dict[str, Any], sentinel: Path) -> None:
    config["model"].update(
        {"_target_": "torch.hub.load", "_args_": [hub_repo(sentinel), "entry"], "source": "local"}
    )


def data_hub(config: dict[str, Any], sentinel: Path) -> None:
    config["data"] = {
        "_target_": "torch.hub.load",
        "_args_": [hub_repo(sentinel), "entry"],
        "source": "local",
    }


def setter(path: str, value: Callable[[Path], Any]) -> Payload:
    """A payload that sets the key at dotted `path` to value(sentinel)."""

    def payload(config: dict[str, Any], sentinel: Path) -> None:
        *parents, last = path.split(".")
        node = config
        for key in parents:
            node = node[key]
        node[last] = value(sentinel)

    return payload


def chain(target: str) -> Callable[[Path], Any]:
    return lambda sentinel: {"_target_": target, "_args_": [0, str(sentinel)]}


def created(sentinel: Path) -> str:
    # oc.create makes a node of its text when resolved: a `_target_` no walk of the file sees.
    return f"${{oc.create:{{_target_: torch.save, _args_: [0, '{sentinel}']}}}}"


def reference(config: dict[str, Any], sentinel: Path) -> None:
    config["payload"] = saves_sentinel(sentinel)
    config["model"]["net"]["dropout"] = "${payload}"  # resolved, a copy of the payload


def widening(config: dict[str, Any], sentinel: Path) -> None:
    config["trusted_targets"] = ["torch"]  # would allow torch.save, if eval listened to it
    config["model"]["net"]["dropout"] = saves_sentinel(sentinel)


CASES: list[tuple[str, Payload, str]] = [
    # (id, payload, start of the refusal after "volt: config error: ")
    ("model target", model_target, "model: _target_=torch.hub.load is not allowed"),
    ("nested in net", setter("model.net.dropout", saves_sentinel), "model.net.dropout: _target_"),
    ("in optimizer", setter("model.optimizer.lr", saves_sentinel), "model.optimizer.lr: _target_"),
    ("in scheduler", setter("model.scheduler.T_max", saves_sentinel), "model.scheduler.T_max:"),
    ("in data", setter("data.split_seed", saves_sentinel), "data.split_seed: _target_=torch.save"),
    ("in _args_", setter("model.net._args_", lambda s: [saves_sentinel(s)]), "model.net._args_[0]"),
    (
        "in a list",
        setter("model.net.hidden_sizes", lambda s: [8, saves_sentinel(s)]),
        "model.net.hidden_sizes[1]: _target_=torch.save is not allowed",
    ),
    (
        "attribute chain",
        setter("model.net.dropout", chain("torch.optim.optimizer.torch.save")),
        "model.net.dropout: _target_=torch.optim.optimizer.torch.save is not allowed: it is torch.",
    ),
    (
        "chain through volt",
        setter("model.net.dropout", chain("volt.checkpointing.stored_config.torch.save")),
        "model.net.dropout: _target_=volt.checkpointing.stored_config.torch.save is not",
    ),
    ("torch.hub.load", data_hub, "data: _target_=torch.hub.load is not allowed"),
    ("interpolation", setter("model.net.dropout", created), 'model.net.dropout: "${oc.create:'),
    ("reference", reference, "model.net.dropout: '${payload}' is not allowed"),
    ("stored trust", widening, "model.net.dropout: _target_=torch.save is not allowed"),
]
IDS = [case[0] for case in CASES]


def craft(genuine: Path, payload: Payload, directory: Path) -> tuple[Path, Path]:
    """A copy of the genuine checkpoint with `payload` applied to its config; and its sentinel."""
    directory.mkdir(parents=True, exist_ok=True)
    sentinel = directory / "sentinel"
    checkpoint = torch.load(genuine, map_location="cpu", weights_only=True)
    config = copy.deepcopy(checkpoint[CHECKPOINT_KEY])
    payload(config, sentinel)
    checkpoint[CHECKPOINT_KEY] = config
    torch.save(checkpoint, directory / "crafted.ckpt")
    return directory / "crafted.ckpt", sentinel


@pytest.fixture
def run_eval(
    outputs: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> Iterator[Callable[..., tuple[int, str]]]:
    """`python -m volt.eval ARGS` in this process: (exit status, stderr)."""

    def _run(args: list[str]) -> tuple[int, str]:
        GlobalHydra.instance().clear()
        monkeypatch.setattr(sys, "argv", ["eval", *args, f"paths.outputs_dir={outputs}"])
        code: int | str | None = 0
        try:
            volt_eval.main()
        except SystemExit as exit:
            code = exit.code
        return (code if isinstance(code, int) else 1), capsys.readouterr().err

    yield _run
    GlobalHydra.instance().clear()


def assert_refused(code: int, err: str, message: str, sentinel: Path) -> None:
    assert code == 2, err
    assert err.strip().splitlines() == [err.strip()], err  # one line, no traceback
    assert err.startswith(f"volt: config error: {message}"), err
    assert "is not allowed" in err
    assert not sentinel.exists()


@pytest.mark.parametrize(("payload", "message"), [c[1:] for c in CASES], ids=IDS)
def test_crafted_checkpoint_is_refused(
    payload: Payload,
    message: str,
    run_dir: Path,
    outputs: Path,
    tmp_path: Path,
    run_eval: Callable[..., tuple[int, str]],
) -> None:
    crafted, sentinel = craft(run_dir / "checkpoints" / "last.ckpt", payload, tmp_path)
    before = snapshot(outputs)
    code, err = run_eval([f"ckpt_path={crafted}"])
    assert_refused(code, err, message, sentinel)
    assert snapshot(outputs) == before
    assert not (outputs / "eval").exists()


@pytest.mark.parametrize("payload", [c[1] for c in CASES], ids=IDS)
def test_payload_runs_without_the_check(
    payload: Payload,
    run_dir: Path,
    tmp_path: Path,
    compose_config: Callable[..., DictConfig],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The control: with the allow-list taken out of build.py, volt's own rebuild runs each
    payload (and usually fails after it, on the value the payload returned)."""
    crafted, sentinel = craft(run_dir / "checkpoints" / "last.ckpt", payload, tmp_path / "c")
    monkeypatch.setattr(build, "check_stored_config", lambda config, trusted: None)
    monkeypatch.setattr(build, "check_targets", lambda config, trusted: None)
    cfg = compose_config("eval", [f"ckpt_path={crafted}"])
    stored = volt_eval.load_run_config(str(crafted))
    # What a payload returns is no valid argument: the build fails, after the payload ran.
    with contextlib.suppress(Exception):
        build.build_evaluation(cfg, stored)
    assert sentinel.exists()


def test_trusted_targets_on_the_command_line_widen_the_list(
    run_dir: Path, tmp_path: Path, run_eval: Callable[..., tuple[int, str]]
) -> None:
    """What the checkpoint's own list cannot do, the command line can (so the check above is what
    stopped the payload, not an accident of the payload)."""
    crafted, sentinel = craft(run_dir / "checkpoints" / "last.ckpt", widening, tmp_path)
    run_eval([f"ckpt_path={crafted}", "trusted_targets=[torch]"])
    assert sentinel.exists()


def test_genuine_checkpoint_evaluates(
    run_dir: Path, outputs: Path, run_eval: Callable[..., tuple[int, str]]
) -> None:
    code, err = run_eval([f"ckpt_path={run_dir / 'checkpoints' / 'last.ckpt'}", "name=genuine"])
    assert code == 0, err
    metrics = yaml.safe_load((outputs / "eval" / "runs" / "genuine" / "metrics.json").read_text())
    assert metrics["metrics"]["test/acc"] > 0.5


def test_eval_trainer_loads_weights_only(
    run_dir: Path, tmp_path: Path, compose_config: Callable[..., DictConfig]
) -> None:
    """trainer.test(ckpt_path=...) loads through eval's Trainer: a pickled payload is refused."""
    genuine = run_dir / "checkpoints" / "last.ckpt"
    cfg = compose_config("eval", [f"ckpt_path={genuine}"])
    run = build.build_evaluation(cfg, volt_eval.load_run_config(str(genuine)))
    checkpoint_io = run.trainer.strategy.checkpoint_io
    assert isinstance(checkpoint_io, AtomicCheckpointIO)
    sentinel = tmp_path / "sentinel"
    pickled = tmp_path / "pickled.ckpt"
    torch.save({"state_dict": {}, "payload": OpensFile(str(sentinel))}, pickled)
    with pytest.raises(CheckpointLoadError, match="weights_only=True"):
        checkpoint_io.load_checkpoint(pickled)
    assert not sentinel.exists()
    torch.load(pickled, weights_only=False)  # the control: unpickled, it does write
    assert sentinel.exists()


class OpensFile:
    """Unpickling this opens (creates) `path`: what any pickled object could do instead."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self) -> tuple[Any, ...]:
        return (open, (self.path, "w"))


REAL_PROCESS_CASES = ["model target", "attribute chain", "interpolation"]


@pytest.mark.slow  # three interpreters importing torch and Lightning: 30-90 s on 2 cores
def test_crafted_checkpoints_refused_by_real_eval(
    run_dir: Path, outputs: Path, tmp_path: Path
) -> None:
    """A few cases through `python -m volt.eval` itself, the processes side by side."""
    before = snapshot(outputs)
    running = []
    for name in REAL_PROCESS_CASES:
        _, payload, message = CASES[IDS.index(name)]
        crafted, sentinel = craft(run_dir / "checkpoints" / "last.ckpt", payload, tmp_path / name)
        command = [sys.executable, "-m", "volt.eval", f"ckpt_path={crafted}"]
        process = subprocess.Popen(
            [*command, f"paths.outputs_dir={outputs}"],
            cwd=PROJECT_ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        running.append((process, message, sentinel))
    for process, message, sentinel in running:
        _, err = process.communicate(timeout=240)
        assert_refused(process.returncode, err, message, sentinel)
    assert snapshot(outputs) == before


def tamper(run_dir: Path, directory: Path, change: Callable[[dict[str, Any]], None]) -> Path:
    """A copy of the run's config_resolved.yaml, changed, in a run directory of its own."""
    config = yaml.safe_load((run_dir / "config_resolved.yaml").read_text())
    change(config)
    directory.mkdir()
    (directory / "config_resolved.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    return directory / "config_resolved.yaml"


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        (setter("model.net.dropout", saves_sentinel), "model.net.dropout: _target_=torch.save is"),
        (setter("trainer.max_epochs", saves_sentinel), "trainer.max_epochs: _target_=torch.save"),
        (setter("model.net.dropout", created), 'model.net.dropout: "${oc.create:'),
        (model_target, "model: _target_=torch.hub.load is not allowed"),
    ],
    ids=["net", "trainer", "interpolation", "model target"],
)
def test_ddp_rank_refuses_a_tampered_run_config(
    payload: Payload,
    message: str,
    run_dir: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    sentinel = tmp_path / "sentinel"
    rank_config = tamper(run_dir, tmp_path / "run", lambda config: payload(config, sentinel))
    monkeypatch.setattr(sys, "argv", ["rank_entry", str(rank_config), "1"])
    with pytest.raises(SystemExit) as exit:
        rank_entry.main()
    assert_refused(int(exit.value.code or 0), capsys.readouterr().err, message, sentinel)
    assert sorted(p.name for p in rank_config.parent.iterdir()) == ["config_resolved.yaml"]


def test_ddp_rank_reads_a_genuine_run_config(run_dir: Path) -> None:
    cfg = rank_entry.read_run_config(run_dir / "config_resolved.yaml", [])
    assert OmegaConf.select(cfg, "model.net._target_") == "volt.nets.mlp.MLP"


def test_ddp_rank_ignores_the_files_own_trusted_targets(
    run_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    sentinel = tmp_path / "sentinel"

    def widen(config: dict[str, Any]) -> None:
        config["trusted_targets"] = ["torch"]
        config["model"]["net"]["dropout"] = {"_target_": "torch.save", "obj": 1, "f": str(sentinel)}

    rank_config = tamper(run_dir, tmp_path / "run", widen)
    with pytest.raises(ConfigError, match=r"torch\.save is not allowed"):
        rank_entry.read_run_config(rank_config, [])
    assert not sentinel.exists()
