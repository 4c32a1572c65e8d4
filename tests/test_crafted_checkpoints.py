"""A checkpoint is data: eval rebuilds a run from the config stored in it, and a crafted one must
not run code. Each case takes the checkpoint of a real training run, puts a payload into its
config that would write a sentinel file if it ran, and expects one line, exit status 2, no
sentinel and outputs/ untouched. A control shows every payload does run through volt's build path
once the check is taken out (and Hydra's execution whitelist, its second line where Hydra has one),
so each case can fail."""

import contextlib
import copy
import hashlib
import os
import pickle
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import hydra.utils
import pytest
import torch
import yaml
from hydra.core.global_hydra import GlobalHydra
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf
from torch.distributed.checkpoint import FileSystemReader

import volt.console
import volt.runs.lock
from tests.named_runs import train_steps
from volt import eval as volt_eval
from volt import rank as rank_entry
from volt import rebuild
from volt.checkpointing import (
    CHECKPOINT_KEY,
    AtomicCheckpointIO,
    CheckpointLoadError,
    begin_sharded_save,
    find_latest_valid_checkpoint,
    finish_sharded_save,
    write_sharded,
)
from volt.config import PROJECT_ROOT
from volt.console import one_line
from volt.errors import ConfigError
from volt.runs import lock_run_dir

Payload = Callable[[dict[str, Any], Path], None]
# instantiate's arguments that take Hydra's execution whitelist out (hydra-core 1.4); none on 1.3.
UNSAFE = getattr(hydra.utils, "UNSAFE_DISABLE_EXECUTION_CHECKS", None)
NO_WHITELIST = {} if UNSAFE is None else {"_execution_whitelist_": UNSAFE}


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
    """Calls torch.save(0, sentinel) when built: a callable that does harm with plain kwargs."""
    return {"_target_": "torch.save", "obj": 0, "f": str(sentinel)}


def hub_repo(sentinel: Path) -> str:
    """A local torch.hub repository whose hubconf.py writes the sentinel when imported."""
    repo = sentinel.parent / f"hub_{sentinel.name}"
    repo.mkdir()
    (repo / "hubconf.py").write_text(
        f"open({str(sentinel)!r}, 'w').close()\n\n\ndef entry(*args, **kwargs):\n    return None\n"
    )
    return str(repo)


def setter(path: str, value: Callable[[Path], Any]) -> Payload:
    """A payload that sets the key at dotted `path` to value(sentinel)."""

    def payload(config: dict[str, Any], sentinel: Path) -> None:
        *parents, last = path.split(".")
        node = config
        for key in parents:
            node = node[key]
        node[last] = value(sentinel)

    return payload


def calls(target: str, **arguments: Any) -> Callable[[Path], Any]:
    """A `_target_` node for `target` whose arguments hold a sentinel-writing payload: built
    recursively, the payload runs whether or not `target` would do harm itself."""
    return lambda sentinel: {"_target_": target, **arguments, "payload": saves_sentinel(sentinel)}


def created(sentinel: Path) -> str:
    # oc.create makes a node of its text when resolved: a `_target_` no walk of the file sees.
    return f"${{oc.create:{{_target_: torch.save, obj: 0, f: '{sentinel}'}}}}"


def widening(config: dict[str, Any], sentinel: Path) -> None:
    config["trusted_targets"] = ["torch", "a_payload"]  # if eval listened to the file's own list
    config["model"]["net"]["dropout"] = saves_sentinel(sentinel)


def hub_model(config: dict[str, Any], sentinel: Path) -> None:
    repo = hub_repo(sentinel)
    config["model"] = {"_target_": "torch.hub.load", "repo_or_dir": repo, "model": "entry"}
    config["model"]["source"] = "local"


def copies_a_secret(config: dict[str, Any], sentinel: Path) -> None:
    """The text data module reading a file the user keeps private into a cache of the file's
    choosing (the sentinel is that cache folder)."""
    secret = sentinel.parent / "id_rsa"
    secret.write_text("-----BEGIN PRIVATE KEY-----\n")
    config["data"] = {
        "_target_": "volt.data.text_bytes.TextBytesDataModule",
        "files": [str(secret)],
        "cache_dir": str(sentinel),
        "block_size": 4,
    }


def a_function(config: dict[str, Any], sentinel: Path) -> None:
    config["model"]["net"]["dropout"] = {"_target_": "a_payload.write", "path": str(sentinel)}


def not_a_module(config: dict[str, Any], sentinel: Path) -> None:
    config["model"]["net"] = {"_target_": "a_payload.Writer", "path": str(sentinel)}


VOLT_FUNCTIONS = [
    "volt.build.build_model",
    "volt.build.build_datamodule",
    "volt.build.instantiate_checked",
    "volt.rebuild.load_trained_module",
    "volt.training.train",
    "volt.evaluation.evaluate",
    "volt.checkpointing.read_stored_config",
    "volt.console.print_config_tree",
    "volt.runs.records.write_metrics",
    "volt.strategies.launcher.reserve_rendezvous_port",
]
CASES: list[tuple[str, Payload, str]] = [
    # (id, payload, start of the refusal after "volt: config error: ")
    # 1. code: a target of the file's choosing
    ("torch.save in net", setter("model.net.dropout", saves_sentinel), "model.net.dropout: _targ"),
    ("unused argument", setter("model.net.unused", saves_sentinel), "model.net.unused: _target_"),
    ("in optimizer", setter("model.optimizer.lr", saves_sentinel), "model.optimizer.lr: _target_"),
    ("in scheduler", setter("model.scheduler.T_max", saves_sentinel), "model.scheduler.T_max:"),
    ("in data", setter("data.split_seed", saves_sentinel), "data.split_seed: _target_=torch.save"),
    (
        "in a list",
        setter("model.net.hidden_sizes", lambda s: [8, saves_sentinel(s)]),
        "model.net.hidden_sizes[1]: _target_=torch.save is not allowed",
    ),
    ("torch.hub.load", hub_model, "model: _target_=torch.hub.load is not allowed"),
    *(
        (
            function,
            setter("model.net", calls(function)),
            f"model.net: _target_={function} is not allowed",
        )
        for function in VOLT_FUNCTIONS
    ),
    (
        "ddp strategy as net",
        setter("model.net", calls("volt.strategies.ddp.DDPStrategy", rank_config="x")),
        "model.net: _target_=volt.strategies.ddp.DDPStrategy is not allowed",
    ),
    (
        "attribute chain",
        setter("model.net.dropout", calls("torch.nn.modules.linear.torch.save", obj=0, f="x")),
        "model.net.dropout: _target_=torch.nn.modules.linear.torch.save is not allowed: it is",
    ),
    (
        "torch.nn outside its layers",
        setter("model.net", calls("torch.nn.parallel.DataParallel")),
        "model.net: _target_=torch.nn.parallel.DataParallel is not allowed: it is defined in",
    ),
    ("trusted function", a_function, "model.net.dropout: _target_=a_payload.write is not allowed"),
    ("not a module", not_a_module, "model.net: _target_=a_payload.Writer is not allowed: a stor"),
    ("stored trust", widening, "model.net.dropout: _target_=torch.save is not allowed"),
    (
        "_args_",
        setter(
            "model.net", lambda s: {"_target_": "torch.nn.Linear", "_args_": [saves_sentinel(s)]}
        ),
        "model.net._args_ is not allowed",
    ),
    (
        "_recursive_",
        setter("model.net", lambda s: {**calls("torch.nn.Identity")(s), "_recursive_": True}),
        "model.net._recursive_ is not allowed",
    ),
    ("interpolation", setter("model.net.dropout", created), 'model.net.dropout: "${oc.create:'),
    # 3. places: a data module reading and writing where the file says
    ("copies a secret", copies_a_secret, "data.cache_dir="),
]
IDS = [case[0] for case in CASES]
# Cases whose target the command line trusts (a_payload), so that only the narrow rebuild rules
# (classes of a buildable kind) stand between the file and the payload.
TRUSTING = {"trusted function", "not a module", "stored trust"}


@pytest.fixture(autouse=True)
def a_payload(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """A package `a_payload` of the user's, trusted on the command line in TRUSTING cases: a
    function and a plain class, each writing the file it is given."""
    package = tmp_path / "pkg" / "a_payload"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(
        "from pathlib import Path\n\n\ndef write(path):\n    Path(path).touch()\n\n\n"
        "class Writer:\n    def __init__(self, path):\n        Path(path).touch()\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path / "pkg"))
    yield
    sys.modules.pop("a_payload", None)


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


def trust_for(case: str) -> list[str]:
    return ["trusted_targets=[a_payload]"] if case in TRUSTING else []


@pytest.mark.parametrize(("case", "payload", "message"), CASES, ids=IDS)
def test_crafted_checkpoint_is_refused(
    case: str,
    payload: Payload,
    message: str,
    run_dir: Path,
    outputs: Path,
    tmp_path: Path,
    run_eval: Callable[..., tuple[int, str]],
) -> None:
    crafted, sentinel = craft(run_dir / "checkpoints" / "last.ckpt", payload, tmp_path)
    before = snapshot(outputs)
    code, err = run_eval([f"ckpt_path={crafted}", *trust_for(case)])
    assert_refused(code, err, message, sentinel)
    assert snapshot(outputs) == before
    assert not (outputs / "eval").exists()


@pytest.mark.parametrize(("case", "payload"), [c[:2] for c in CASES], ids=IDS)
def test_payload_runs_without_the_check(
    case: str,
    payload: Payload,
    run_dir: Path,
    tmp_path: Path,
    compose_config: Callable[..., DictConfig],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The control: with the stored-config check taken out of volt.rebuild, volt's own rebuild
    runs each payload (and usually fails after it, on the value the payload returned)."""
    crafted, sentinel = craft(run_dir / "checkpoints" / "last.ckpt", payload, tmp_path / "c")
    monkeypatch.setattr(rebuild, "check_stored_sections", lambda *args, **kwargs: None)
    monkeypatch.setattr(rebuild, "instantiate_whitelist", lambda prefixes: NO_WHITELIST)
    cfg = compose_config("eval", [f"ckpt_path={crafted}", *trust_for(case)])
    # What a payload returns is no valid argument: the build fails, after the payload ran.
    with contextlib.suppress(Exception):
        run = rebuild.build_evaluation(cfg, rebuild.read_evaluated_run(cfg))
        run.datamodule.prepare_data()  # where a data module reads and caches its files
    assert sentinel.exists()


@pytest.mark.skipif(UNSAFE is None, reason="this Hydra takes no execution whitelist (< 1.4)")
def test_hydras_whitelist_stops_a_payload_without_volts_check(
    run_dir: Path,
    tmp_path: Path,
    compose_config: Callable[..., DictConfig],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The second line: with volt's check taken out, Hydra's whitelist (the stored prefixes)
    still refuses a target outside them."""
    payload = setter("model.net.dropout", saves_sentinel)
    crafted, sentinel = craft(run_dir / "checkpoints" / "last.ckpt", payload, tmp_path / "c")
    monkeypatch.setattr(rebuild, "check_stored_sections", lambda *args, **kwargs: None)
    cfg = compose_config("eval", [f"ckpt_path={crafted}"])
    # Hydra's refusal, as volt reports the model a stored config does not build.
    with pytest.raises(ConfigError, match="not in the Hydra execution whitelist"):
        rebuild.build_evaluation(cfg, rebuild.read_evaluated_run(cfg))
    assert not sentinel.exists()


def test_trusted_targets_on_the_command_line_widen_the_list(
    run_dir: Path, tmp_path: Path, run_eval: Callable[..., tuple[int, str]]
) -> None:
    """What the checkpoint's own list cannot do, the command line can (so the check above is what
    stopped the payload, not an accident of the payload): a trusted package's nn.Module class."""
    sentinel = tmp_path / "w" / "sentinel"
    module = tmp_path / "pkg" / "a_payload" / "__init__.py"
    module.write_text(
        module.read_text()
        + "\n\nimport torch\n\n\nclass Net(torch.nn.Identity):\n"
        + "    def __init__(self, **kwargs):\n        super().__init__()\n"
        + f"        Path({str(sentinel)!r}).touch()\n"
    )

    def trusted_net(config: dict[str, Any], sentinel: Path) -> None:
        config["model"]["net"]["dropout"] = {"_target_": "a_payload.Net"}

    crafted, _ = craft(run_dir / "checkpoints" / "last.ckpt", trusted_net, tmp_path / "w")
    run_eval([f"ckpt_path={crafted}", "trusted_targets=[a_payload]"])
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
    run = rebuild.build_evaluation(cfg, rebuild.read_evaluated_run(cfg))
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


REAL_PROCESS_CASES = ["torch.hub.load", "attribute chain", "interpolation"]


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


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        (setter("model.net.dropout", saves_sentinel), "model.net.dropout: _target_=torch.save is"),
        (setter("trainer.max_epochs", saves_sentinel), "trainer.max_epochs: _target_=torch.save"),
        (setter("model.net.dropout", created), 'model.net.dropout: "${oc.create:'),
        (hub_model, "model: _target_=torch.hub.load is not allowed"),
        (setter("model.net", calls("volt.training.train")), "model.net: _target_=volt.training"),
    ],
    ids=["net", "trainer", "interpolation", "model target", "volt function"],
)
def test_ddp_rank_refuses_a_tampered_run_config(
    payload: Payload,
    message: str,
    run_dir: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Even a file with the digest rank 0 gave (a tampered config rank 0 itself read) is checked
    as data before anything is built."""
    sentinel = tmp_path / "sentinel"
    rank_config = tamper(run_dir, tmp_path / "run", lambda config: payload(config, sentinel))
    argv = ["rank_entry", str(rank_config), digest(rank_config), "1"]
    monkeypatch.setattr(sys, "argv", argv)
    with pytest.raises(SystemExit) as exit:
        rank_entry.main()
    assert_refused(int(exit.value.code or 0), capsys.readouterr().err, message, sentinel)
    assert sorted(p.name for p in rank_config.parent.iterdir()) == ["config_resolved.yaml"]


def test_ddp_rank_trains_only_the_file_rank_0_started_it_with(
    run_dir: Path, tmp_path: Path
) -> None:
    rank_config = tamper(run_dir, tmp_path / "run", lambda config: None)
    expected = digest(rank_config)
    cfg = rank_entry.read_run_config(rank_config, expected, [])
    assert OmegaConf.select(cfg, "model.net._target_") == "volt.nets.mlp.MLP"
    rank_config.write_text(rank_config.read_text().replace("dropout: 0.1", "dropout: 0.2"))
    with pytest.raises(ConfigError, match="not the config rank 0 started this rank with"):
        rank_entry.read_run_config(rank_config, expected, [])


def test_ddp_rank_ignores_the_files_own_trusted_targets(run_dir: Path, tmp_path: Path) -> None:
    sentinel = tmp_path / "sentinel"

    def widen(config: dict[str, Any]) -> None:
        config["trusted_targets"] = ["torch"]
        config["model"]["net"]["dropout"] = saves_sentinel(sentinel)

    rank_config = tamper(run_dir, tmp_path / "run", widen)
    with pytest.raises(ConfigError, match=r"torch\.save is not allowed"):
        rank_entry.read_run_config(rank_config, digest(rank_config), [])
    assert not sentinel.exists()


IGNORED_SECTIONS = ["trainer", "callbacks", "logger", "paths", "task", "hydra", "tune"]


def test_what_volt_does_not_rebuild_is_never_read(
    run_dir: Path, outputs: Path, tmp_path: Path, run_eval: Callable[..., tuple[int, str]]
) -> None:
    """Payloads in every section but model and data (a nested training run, a logger posting to
    a server of the file's choosing, a task whose from_data writes `_target_`, an environment
    read, paths): the eval runs as with the genuine file, and none of them runs."""
    sentinels = {section: tmp_path / f"sentinel_{section}" for section in IGNORED_SECTIONS}

    def everywhere(config: dict[str, Any], _: Path) -> None:
        for section, sentinel in sentinels.items():
            config[section] = {"payload": saves_sentinel(sentinel), "home": "${oc.env:HOME}"}
        config["task"]["from_data"] = {"net._target_": "train_set", "_target_": "val_set"}
        config["task"]["module"] = "no.such.submodule"
        config["trusted_targets"] = ["torch", "os"]

    crafted, _ = craft(run_dir / "checkpoints" / "last.ckpt", everywhere, tmp_path / "c")
    code, err = run_eval([f"ckpt_path={crafted}", "name=ignored"])
    assert code == 0, err
    assert not any(sentinel.exists() for sentinel in sentinels.values())
    files = (outputs / "eval" / "runs" / "ignored").rglob("*")
    written = "".join(p.read_text(errors="replace") for p in files if p.is_file())
    assert str(Path.home()) not in written
    # The control: each payload is live, built on its own.
    checkpoint = torch.load(crafted, weights_only=True)
    instantiate(checkpoint[CHECKPOINT_KEY]["trainer"]["payload"], **NO_WHITELIST)
    assert sentinels["trainer"].exists()


def test_a_net_far_larger_than_its_weights_is_refused_before_memory_is_taken(
    run_dir: Path, tmp_path: Path, run_eval: Callable[..., tuple[int, str]]
) -> None:
    """2 x 200,000 hidden units: 160 GB of float32 weights, refused from shapes alone."""
    crafted, _ = craft(
        run_dir / "checkpoints" / "last.ckpt",
        setter("model.net.hidden_sizes", lambda _: [200_000, 200_000]),
        tmp_path,
    )
    started = time.monotonic()
    code, err = run_eval([f"ckpt_path={crafted}"])
    assert code == 2, err
    assert "model: the checkpoint's config builds a module its weights do not fit" in err
    assert "net.layers.1.weight (256, 64) in the file, (200000, 64) in the model" in err
    assert time.monotonic() - started < 60  # the import and compose of one eval, no allocation


def test_a_module_asking_for_more_memory_than_its_weights_is_refused(
    run_dir: Path, tmp_path: Path, compose_config: Callable[..., DictConfig]
) -> None:
    """Same names and shapes, but a buffer the weights do not hold (non-persistent)."""
    genuine = run_dir / "checkpoints" / "last.ckpt"
    cfg = compose_config("eval", [f"ckpt_path={genuine}"])
    stored = rebuild.read_evaluated_run(cfg)
    twin = torch.nn.Module()
    for name, tensor in stored.weights.items():
        *parents, last = name.split(".")
        owner = twin
        for part in parents:
            if not hasattr(owner, part):
                owner.add_module(part, torch.nn.Module())
            owner = getattr(owner, part)
        owner.register_buffer(last, torch.empty(tensor.shape, device="meta"))
    twin.register_buffer("scratch", torch.empty(2**30, device="meta"), persistent=False)  # 4 GiB
    with pytest.raises(ConfigError, match=r"builds a module of 4,096 MiB, its weights hold"):
        rebuild._check_against_weights(twin, stored.weights)


def test_load_trained_module_checks_the_file_like_eval(run_dir: Path, tmp_path: Path) -> None:
    genuine = run_dir / "checkpoints" / "last.ckpt"
    module, _ = rebuild.load_trained_module(genuine)
    weights = torch.load(genuine, weights_only=True)["state_dict"]
    assert all(torch.equal(v, weights[k]) for k, v in module.state_dict().items())
    crafted, sentinel = craft(genuine, setter("model.net.unused", saves_sentinel), tmp_path)
    with pytest.raises(ConfigError, match=r"model\.net\.unused: _target_=torch\.save is not"):
        rebuild.load_trained_module(crafted)
    assert not sentinel.exists()


def test_an_environment_read_in_the_model_needs_allow_env(
    run_dir: Path,
    tmp_path: Path,
    run_eval: Callable[..., tuple[int, str]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("VOLT_TEST_SECRET", "hunter2")
    crafted, _ = craft(
        run_dir / "checkpoints" / "last.ckpt",
        setter("model.net.dropout", lambda _: "${oc.env:VOLT_TEST_SECRET}"),
        tmp_path / "plain",
    )
    code, err = run_eval([f"ckpt_path={crafted}", "allow_env=[VOLT_TEST_SECRET]"])
    assert code == 2 and "model.net.dropout: '${oc.env:VOLT_TEST_SECRET}' is not allowed" in err
    crafted, _ = craft(
        run_dir / "checkpoints" / "last.ckpt",
        setter("model.net.api_key", lambda _: "${oc.env:VOLT_TEST_SECRET}"),
        tmp_path / "secret",
    )
    code, err = run_eval([f"ckpt_path={crafted}"])
    assert code == 2 and "add allow_env=[VOLT_TEST_SECRET] to your command" in err
    assert "hunter2" not in err


@pytest.mark.slow  # a DDP run over two gloo processes, twice: about a minute on 2 cores
def test_ddp_ranks_of_a_resumed_handed_over_run_train_rank_0s_config(tmp_path: Path) -> None:
    """A run directory someone handed over holds a crafted config_resolved.yaml: resuming it under
    trainer=ddp, rank 0 writes its own before the ranks start, and they read only that one."""
    outputs = tmp_path / "outputs"

    def train(steps: int) -> subprocess.CompletedProcess[str]:
        ddp = ("trainer=ddp", "trainer.devices=2")
        return train_steps(outputs, "handed", steps, *ddp, timeout=300)

    first = train(12)
    assert first.returncode == 0, first.stderr[-3000:]
    run_dir = outputs / "train" / "runs" / "handed"
    sentinel = tmp_path / "sentinel"
    config = yaml.safe_load((run_dir / "config_resolved.yaml").read_text())
    config["model"]["net"]["dropout"] = saves_sentinel(sentinel)
    (run_dir / "config_resolved.yaml").write_text(yaml.safe_dump(config))
    (run_dir / "metrics.json").unlink()
    second = train(24)
    assert second.returncode == 0, second.stderr[-3000:]
    assert not sentinel.exists()
    assert "torch.save" not in (run_dir / "config_resolved.yaml").read_text()


def test_a_checkpoint_from_before_2026_11_26_is_evaluated_with_its_task(
    run_dir: Path, tmp_path: Path, run_eval: Callable[..., tuple[int, str]]
) -> None:
    """Such a checkpoint's model config lacks what the task took from the data module: eval says
    to name the task, and with it (from the command line, never the file) evaluates."""

    def older(config: dict[str, Any], _: Path) -> None:
        for key in ("in_shape", "num_classes"):
            del config["model"]["net"][key]
        del config["model"]["num_classes"]

    crafted, _ = craft(run_dir / "checkpoints" / "last.ckpt", older, tmp_path)
    code, err = run_eval([f"ckpt_path={crafted}"])
    assert code == 2 and "needs the task it was trained with: task=classification" in err, err
    code, err = run_eval([f"ckpt_path={crafted}", "task=classification", "name=older"])
    assert code == 0, err


def test_weights_that_claim_more_memory_than_the_file_holds_are_refused(
    run_dir: Path, tmp_path: Path, run_eval: Callable[..., tuple[int, str]]
) -> None:
    """A 16384 x 16384 weight saved as an expanded view of one number: a few bytes in the file,
    a gigabyte once loading copies it (found by a red-team review)."""
    genuine = run_dir / "checkpoints" / "last.ckpt"
    checkpoint = torch.load(genuine, weights_only=True)
    big = torch.zeros(()).expand(16384, 16384)
    checkpoint["state_dict"] = {"net.layers.1.weight": big}
    torch.save(checkpoint, tmp_path / "expanded.ckpt")
    code, err = run_eval([f"ckpt_path={tmp_path / 'expanded.ckpt'}"])
    assert code == 2 and "is larger than its storage" in err, err
    # The control: what the file holds becomes a full matrix at the first copy.
    loaded = torch.load(tmp_path / "expanded.ckpt", weights_only=True)["state_dict"]
    assert loaded["net.layers.1.weight"].clone().untyped_storage().nbytes() == 16384**2 * 4


def test_storages_larger_than_the_file_are_refused(tmp_path: Path) -> None:
    from volt.checkpointing.tensor_sizes import OversizedTensorError, check_tensor_sizes

    (tmp_path / "small").write_bytes(b"x" * 1000)
    with pytest.raises(OversizedTensorError, match="declare 4,000 bytes, the file holds 1,000"):
        check_tensor_sizes({"w": torch.empty(1000)}, tmp_path / "small")
    tied = torch.empty(200)
    check_tensor_sizes({"w": tied, "tied": tied}, tmp_path / "small")  # one storage, counted once


def test_a_net_of_far_more_layers_than_its_weights_is_refused_while_it_is_built(
    run_dir: Path, tmp_path: Path, run_eval: Callable[..., tuple[int, str]]
) -> None:
    """`n_layer: 10**7` would build for hours even on the meta device: the count of submodules
    stops the build at its budget (20,000 layers here, to keep the file small)."""
    crafted, _ = craft(
        run_dir / "checkpoints" / "last.ckpt",
        setter("model.net.hidden_sizes", lambda _: [4] * 20_000),
        tmp_path,
    )
    started = time.monotonic()
    code, err = run_eval([f"ckpt_path={crafted}"])
    assert code == 2 and "builds more than 10,0" in err and "submodules" in err, err
    assert time.monotonic() - started < 60


def test_tests_and_benchmarks_are_not_trusted_as_the_checkouts_code() -> None:
    from volt.config.targets import checkout_packages

    assert not {"tests", "benchmarks", "volt"} & set(checkout_packages())


def test_a_handed_over_run_directory_with_a_link_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Volt writes into a run it continues (the lock, run.json, train.log): through a link it
    would write wherever the link points (found by a red-team review)."""
    outputs = tmp_path / "outputs"
    run_dir = outputs / "train" / "runs" / "handed"
    run_dir.mkdir(parents=True)
    victim = tmp_path / "victim.txt"
    victim.write_text("a user's file")
    (run_dir / "run.json").symlink_to(victim)
    done = subprocess.run(
        [sys.executable, "train.py", "name=handed", f"paths.outputs_dir={outputs}"],
        cwd=PROJECT_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 2, done.stderr[-3000:]
    assert f"name=handed: {run_dir / 'run.json'} is a symbolic link to {victim}" in done.stderr
    assert victim.read_text() == "a user's file"
    assert sorted(p.name for p in run_dir.iterdir()) == ["run.json"]
    # The control: the first write volt makes there, the lock, opened as before, goes through
    # a link.
    (run_dir / ".lock").symlink_to(victim)
    monkeypatch.setattr(volt.runs.lock, "open_regular", lambda p, _, f: os.open(p, f, 0o666))
    lock_run_dir(run_dir).release()  # type: ignore[union-attr]
    assert victim.read_text() != "a user's file"


# Sharded checkpoints (trainer=fsdp's default: a folder of DCP shards, `.metadata`, `meta.pt`):
# the same rules for the config in meta.pt, and DCP's pickled metadata read without running code.
# The config cases go through what `python -m volt.eval ckpt_path=<folder>` and the Hydra callback
# call, `rebuild.read_evaluated_run` and `rebuild.build_evaluation`; the pickle cases through eval.
SHARDED_CASES = ["torch.save in net", "in data", "torch.hub.load", "interpolation",
                 "copies a secret", "stored trust"]  # fmt: skip


@pytest.fixture(scope="module")
def sharded(run_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The genuine checkpoint as trainer=fsdp saves it, written by one process as one rank."""
    checkpoint = torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)
    target = tmp_path_factory.mktemp("sharded") / "last.ckpt"
    folder = begin_sharded_save(target)
    write_sharded(checkpoint, folder, coordinator=True)
    finish_sharded_save(folder, target)
    return target


def craft_sharded(genuine: Path, payload: Payload, directory: Path) -> tuple[Path, Path]:
    """A copy of the genuine folder, `payload` applied to the config in its meta.pt."""
    crafted = directory / "crafted.ckpt"
    shutil.copytree(genuine, crafted)
    sentinel = directory / "sentinel"
    meta = torch.load(crafted / "meta.pt", weights_only=True)
    payload(meta[CHECKPOINT_KEY], sentinel)
    torch.save(meta, crafted / "meta.pt")
    return crafted, sentinel


# As volt.eval does: the training callbacks the checkpoint names are not needed to test. Both
# evaluations write to the one run directory compose_config gives.
@pytest.mark.filterwarnings("ignore:Be aware that when using `ckpt_path`, callbacks")
@pytest.mark.filterwarnings("ignore:Experiment logs directory .* exists and is not empty")
def test_a_sharded_checkpoint_evaluates_as_its_single_file(
    run_dir: Path, sharded: Path, compose_config: Callable[..., DictConfig]
) -> None:
    genuine = run_dir / "checkpoints" / "last.ckpt"
    metrics = []
    for checkpoint in (genuine, sharded):
        cfg = compose_config("eval", [f"ckpt_path={checkpoint}", "callbacks.progress_bar=null"])
        run = rebuild.build_evaluation(cfg, rebuild.read_evaluated_run(cfg))
        (result,) = run.trainer.test(run.model, datamodule=run.datamodule, ckpt_path=checkpoint)
        metrics.append(result)
    assert metrics[0] == metrics[1]
    assert metrics[1]["test/acc"] > 0.5
    module, _ = rebuild.load_trained_module(sharded)
    weights = torch.load(genuine, weights_only=True)["state_dict"]
    assert all(torch.equal(v, weights[k]) for k, v in module.state_dict().items())


@pytest.mark.parametrize(
    ("case", "payload", "message"), [CASES[IDS.index(c)] for c in SHARDED_CASES], ids=SHARDED_CASES
)
def test_a_crafted_config_in_a_sharded_checkpoint_is_refused(
    case: str,
    payload: Payload,
    message: str,
    sharded: Path,
    tmp_path: Path,
    compose_config: Callable[..., DictConfig],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    crafted, sentinel = craft_sharded(sharded, payload, tmp_path)
    cfg = compose_config("eval", [f"ckpt_path={crafted}", *trust_for(case)])
    with pytest.raises(ConfigError) as caught:
        rebuild.read_evaluated_run(cfg)
    assert str(caught.value).startswith(message), caught.value
    with pytest.raises(ConfigError, match=re.escape(message)):
        rebuild.load_trained_module(crafted, trusted=["a_payload"] if case in TRUSTING else [])
    assert not sentinel.exists()
    # The control: with the check taken out, volt's rebuild runs the payload from the folder.
    monkeypatch.setattr(rebuild, "check_stored_sections", lambda *args, **kwargs: None)
    monkeypatch.setattr(rebuild, "instantiate_whitelist", lambda prefixes: NO_WHITELIST)
    with contextlib.suppress(Exception):
        run = rebuild.build_evaluation(cfg, rebuild.read_evaluated_run(cfg))
        run.datamodule.prepare_data()
    assert sentinel.exists()


@pytest.mark.parametrize("part", [".metadata", "meta.pt"])
def test_a_sharded_checkpoint_whose_pickle_runs_code_is_refused(
    part: str,
    sharded: Path,
    outputs: Path,
    tmp_path: Path,
    compose_config: Callable[..., DictConfig],
    run_eval: Callable[..., tuple[int, str]],
) -> None:
    """DCP's `.metadata` is a plain pickle, which torch's own reader unpickles as it is; meta.pt
    a torch.save file. Either, made to open a file when unpickled, is refused in one line."""
    crafted = tmp_path / "crafted.ckpt"
    shutil.copytree(sharded, crafted)
    sentinel = tmp_path / "sentinel"
    if part == ".metadata":
        (crafted / part).write_bytes(pickle.dumps(OpensFile(str(sentinel))))
        refusal = "io.open is not allowed: DCP metadata is made of its own classes"
    else:
        meta = torch.load(crafted / part, weights_only=True)
        torch.save({**meta, "payload": OpensFile(str(sentinel))}, crafted / part)
        refusal = "torch.load(weights_only=True) refuses"
    cfg = compose_config("eval", [f"ckpt_path={crafted}"])
    with pytest.raises(ConfigError) as caught:
        rebuild.read_evaluated_run(cfg)
    assert one_line(caught.value).startswith(f"ckpt_path={str(crafted)!r} cannot be used: ")
    assert refusal in one_line(caught.value)
    with pytest.raises(ConfigError, match=re.escape(refusal)):
        rebuild.load_trained_module(crafted)
    with pytest.raises(CheckpointLoadError, match=re.escape(refusal)):
        AtomicCheckpointIO().load_checkpoint(crafted)  # eval's Trainer, at trainer.test
    assert find_latest_valid_checkpoint(tmp_path)[0] is None  # resume passes it over
    # The command itself: one line, exit status 2, nothing run, outputs/ untouched.
    before = snapshot(outputs)
    code, err = run_eval([f"ckpt_path={crafted}"])
    assert code == 2 and err.startswith(f"volt: config error: ckpt_path={str(crafted)!r}"), err
    assert err.strip().splitlines() == [err.strip()]
    assert snapshot(outputs) == before
    assert not sentinel.exists()
    # The control: torch's own readers unpickle it, and the file opens.
    if part == ".metadata":
        FileSystemReader(crafted).read_metadata()
    else:
        torch.load(crafted / part, weights_only=False)
    assert sentinel.exists()


# Text of a checkpoint put into the one line eval ends with (issue #41): a terminal escape in a
# stored key, which would erase the refusal and print a green "passed".
ERASES_AND_PASSES = "\x1b[1A\x1b[2K\x1b[32mvolt: evaluation passed"


def escape_in_a_key(config: dict[str, Any], sentinel: Path) -> None:
    config["model"][ERASES_AND_PASSES] = {"_target_": "torch.hub.load"}


def test_a_terminal_escape_in_a_stored_key_is_escaped_in_the_refusal(
    run_dir: Path,
    tmp_path: Path,
    run_eval: Callable[..., tuple[int, str]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    crafted, _ = craft(run_dir / "checkpoints" / "last.ckpt", escape_in_a_key, tmp_path)
    code, err = run_eval([f"ckpt_path={crafted}"])
    assert code == 2 and err.count("\n") == 1, err
    assert err.startswith("volt: config error: model.\\x1b[1A\\x1b[2K"), err
    # the control: the refusal as it was, the escape raw on the terminal
    monkeypatch.setattr(volt.console, "on_one_line", lambda text: text)
    code, err = run_eval([f"ckpt_path={crafted}"])
    assert code == 2 and err.startswith(f"volt: config error: model.{ERASES_AND_PASSES}"), err


def zero_padded(checkpoint: dict[str, Any]) -> None:
    """The issue's 24 KB checkpoint: a net of one padding layer, no weights for it to be
    measured by; 600 pixels a side make a 373 MB first output for a batch of 8x8 digits."""
    checkpoint[CHECKPOINT_KEY]["model"]["net"] = {"_target_": "torch.nn.ZeroPad2d", "padding": 600}
    checkpoint["state_dict"] = {
        k: v for k, v in checkpoint["state_dict"].items() if not k.startswith("net.")
    }


def test_a_padding_net_is_refused_at_its_first_forward_before_the_memory_is_taken(
    run_dir: Path,
    tmp_path: Path,
    run_eval: Callable[..., tuple[int, str]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    checkpoint = torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)
    zero_padded(checkpoint)
    torch.save(checkpoint, tmp_path / "padded.ckpt")
    made: list[int] = []
    recording = torch.nn.modules.module.register_module_forward_hook(
        lambda module, args, output: made.append(output.nbytes)
    )
    try:
        code, err = run_eval([f"ckpt_path={tmp_path / 'padded.ckpt'}"])
        assert code == 2 and err.count("\n") == 1, err
        assert "makes net (ZeroPad2d) an output of 356 MiB" in err, err
        assert made == []  # no layer ran
        # the control: without the bound, the first forward takes the memory (then fails)
        monkeypatch.setattr(rebuild, "bound_first_forward", lambda model, budget: None)
        with contextlib.suppress(BaseException):
            run_eval([f"ckpt_path={tmp_path / 'padded.ckpt'}"])
        assert max(made) > 300 * 2**20
    finally:
        recording.remove()
