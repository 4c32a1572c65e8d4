"""Bad input, table-driven: each case exits with one clear line naming the key, the value and the
fix (status 2, an override Hydra cannot compose too), and outputs/ is exactly as it was: no
file changed, no file or directory added, whether volt refused before Hydra made the run
directory or removed the directory it had made."""

import hashlib
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch
from hydra.core.global_hydra import GlobalHydra
from lightning.pytorch.accelerators import AcceleratorRegistry

from volt import eval as volt_eval
from volt import train as volt_train


def snapshot(root: Path) -> dict[str, str]:
    """Every file under root with a hash of its bytes, and every directory: any change shows."""
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "/"
        for p in sorted(root.rglob("*"))
    }


@pytest.fixture
def outputs(tmp_path: Path) -> Path:
    """An outputs/ that already holds a user's earlier run."""
    earlier = tmp_path / "outputs" / "train" / "runs" / "earlier"
    (earlier / "checkpoints").mkdir(parents=True)
    (earlier / "checkpoints" / "last.ckpt").write_bytes(b"the user's checkpoint")
    (earlier / "train.log").write_text("the user's log\n")
    return tmp_path / "outputs"


@pytest.fixture
def run_main(
    outputs: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> Iterator[Callable[..., tuple[int, str]]]:
    """Runs an entry point in this process as the command line would; returns (exit code, stderr).
    In-process so that 30 cases cost seconds, not the import time of 30 interpreters."""

    def _run(args: list[str], entry: Callable[[], object] = volt_train.main) -> tuple[int, str]:
        GlobalHydra.instance().clear()
        monkeypatch.setattr(sys, "argv", ["train.py", *args, f"paths.outputs_dir={outputs}"])
        code: int | str | None = 0
        try:
            entry()
        except SystemExit as exit:
            code = exit.code
        return (code if isinstance(code, int) else 1), capsys.readouterr().err

    yield _run
    GlobalHydra.instance().clear()


def write(path: Path, content: bytes) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content)
    return str(path)


# Hydra cannot compose these: volt's line names the override as typed, then what is wrong with it
# and the fix (the close matches, else the options or keys there are). Option lists are checked by
# a few names, so that a new file in conf/ does not break them.
HYDRA_CASES: list[tuple[str, list[str], tuple[str, ...]]] = [
    (
        "unknown key",
        ["nonexistent=1"],
        ("the train config has no key or config group 'nonexistent'; known: ", " model,"),
    ),
    (
        "unknown nested key",
        ["data.batchsize=3"],
        (
            "data has no key 'batchsize'; did you mean data.batch_size=3?",
            "(to add a key that conf/ does not set: +data.batchsize=3)",
        ),
    ),
    ("unknown group", ["modle=mlp"], ("no key or config group 'modle'; did you mean model=mlp?",)),
    (
        "unknown model",
        ["model=transformer"],
        ("config group model has no option 'transformer'; options: ", "cnn", "mlp"),
    ),
    (
        "unknown data",
        ["data=imagenet"],
        ("config group data has no option 'imagenet'; options: ", "digits", "mnist"),
    ),
    (
        "unknown trainer",
        ["trainer=tpu9"],
        ("config group trainer has no option 'tpu9'; options: ", "cpu", "ddp"),
    ),
    (
        "trainer typo",
        ["trainer=dpp"],
        ("trainer has no option 'dpp'; did you mean trainer=dp or trainer=ddp? (options: ",),
    ),
    (
        "unknown compile",
        ["compile=fast"],
        ("config group compile has no option 'fast'; options: ", "max-autotune"),
    ),
    (
        "unknown experiment",
        ["experiment=nope"],
        ("config group experiment has no option 'nope'; options: ", "digits_cnn"),
    ),
    (
        "unknown debug",
        ["debug=nope"],
        ("config group debug has no option 'nope'; options: ", "fdr"),
    ),
    ("added but set", ["+seed=1"], ("seed is set already; write seed=1 to change it",)),
    (
        "removed but absent",
        ["~trainer.max_epoch"],
        ("trainer has no key 'max_epoch'; did you mean ~trainer.max_epochs",),
    ),
    (
        "bad override syntax",
        ["model.optimizer.lr=[1,"],
        ("Hydra cannot read this override (no viable alternative at input '[1,')", "key=[a,b]"),
    ),
    (
        "sweep without -m",
        ["seed=1,2"],
        ("several values make a sweep, which runs only with -m", "a list is seed=[1,2]"),
    ),
]
CASES: list[tuple[str, list[str], str]] = [
    # (id, overrides, expected text in stderr)
    ("batch size text", ["data.batch_size=many"], "data.batch_size='many' is not valid"),
    ("batch size zero", ["data.batch_size=0"], "data.batch_size=0 is not valid: use a positive"),
    ("batch size negative", ["data.batch_size=-8"], "data.batch_size=-8 is not valid"),
    ("batch size float", ["data.batch_size=1.5"], "data.batch_size=1.5 is not valid"),
    ("workers negative", ["data.num_workers=-1"], "data.num_workers=-1 is not valid"),
    ("val fraction one", ["data.val_fraction=1.0"], "data.val_fraction=1.0 is not valid"),
    ("precision short", ["precision=16"], "precision=16 is not valid: use one of 64-true"),
    ("precision typo", ["precision=bf16"], "precision='bf16' is not valid"),
    ("precision legacy", ["precision=fp16"], "precision='fp16' is not valid"),
    ("seed negative", ["seed=-1"], "seed=-1 is not valid"),
    ("seed text", ["seed=abc"], "seed='abc' is not valid"),
    ("lr zero", ["model.optimizer.lr=0"], "model.optimizer.lr=0 is not valid: use a positive"),
    ("lr text", ["model.optimizer.lr=fast"], "model.optimizer.lr='fast' is not valid"),
    ("max epochs text", ["trainer.max_epochs=ten"], "trainer.max_epochs='ten' is not valid"),
    ("max epochs -2", ["trainer.max_epochs=-2"], "trainer.max_epochs=-2 is not valid"),
    ("accelerator typo", ["trainer.accelerator=gpus"], "trainer.accelerator='gpus' is not valid"),
    ("compile mode typo", ["compile.mode=fastest"], "compile.mode='fastest' is not valid"),
    ("fullgraph text", ["compile=default", "compile.fullgraph=maybe"], "compile.fullgraph='maybe'"),
    ("matmul precision", ["matmul_precision=low"], "matmul_precision='low' is not valid"),
    ("tune typo", ["tune=batch"], "tune='batch' is not valid"),
    ("missing value", ["data.batch_size=???"], "data.batch_size has no value (???)"),
    ("nodes zero", ["trainer.num_nodes=0"], "trainer.num_nodes=0 is not valid"),
    ("no training data", ["data.test_fraction=0.9"], "leave no training data"),
    ("test fraction zero", ["data.test_fraction=0"], "data.test_fraction=0 is not valid"),
    (
        "batch over ranks",
        ["trainer=ddp", "trainer.accelerator=cpu", "trainer.devices=2", "data.batch_size=63"],
        "does not divide over 2 processes",
    ),
    ("adam eps in fp16", ["precision=16-true"], "model.optimizer.eps=1e-08: fp16 rounds it to 0"),
    # Path parts: every value that names a directory, and the directory they make.
    ("name escapes", ["name=../../../x"], "name='../../../x' is not valid"),
    ("task_name escapes", ["task_name=../../../x"], "task_name='../../../x' is not valid"),
    ("run dir outside", ["hydra.run.dir=elsewhere"], "is not inside paths.outputs_dir="),
    (
        "sweep value escapes",
        ["-m", "callbacks.model_checkpoint.filename=best,../../../x"],
        "callbacks.model_checkpoint.filename=../../../x: a sweep job's directory is named by",
    ),
    # Keys nothing reads: a plain section's by conf/, a `_target_` section's by its signature.
    ("unknown top-level key", ["+foo.bar=1"], "the train config has no top-level key 'foo'"),
    ("unknown section key", ["+compile.mod=default"], "did you mean compile.mode?"),
    (
        "trainer key typo",
        ["+trainer.max_epoch=5"],
        "trainer.max_epoch: lightning.pytorch.Trainer takes no argument 'max_epoch'; did you mean"
        " trainer.max_epochs",
    ),
    ("data key typo", ["+data.batchsize=3"], "data.batchsize: volt.data.digits.DigitsDataModule"),
    ("callback key typo", ["+callbacks.early_stopping.patiense=3"], "early_stopping.patience?"),
    ("logger kwargs typo", ["+logger.tensorboard.flush_sec=5"], "logger.tensorboard.flush_secs?"),
    (
        "strategy kwargs typo",
        ["trainer=ddp", "+trainer.strategy.find_unused_parameter=true"],
        "did you mean trainer.strategy.find_unused_parameters",
    ),
    ("set by volt", ["+model.num_classes=3"], "model.num_classes is set by volt"),
    # What Lightning refuses only when it builds the Trainer, after the run directory exists.
    ("devices zero", ["trainer.devices=0"], "trainer.devices=0 is not valid"),
    ("devices negative", ["trainer=cpu", "trainer.devices=-2"], "trainer.devices=-2 is not valid"),
    ("strategy typo", ["trainer.strategy=ddpp"], "trainer.strategy='ddpp' is not a strategy"),
    # Lightning's own ranks: each a new run of the command (exit 137), or a pickled run (exit 1).
    ("Lightning's ddp", ["trainer=cpu", "trainer.devices=2"], "use trainer=ddp trainer.devices=2"),
    (
        "Lightning's ddp_spawn",
        ["trainer=cpu", "trainer.devices=2", "trainer.strategy=ddp_spawn"],
        "trainer.strategy='ddp_spawn' over 2 processes",
    ),
    ("limit batches", ["trainer.limit_val_batches=1.5"], "trainer.limit_val_batches=1.5 is not"),
    ("clip algorithm", ["+trainer.gradient_clip_algorithm=max"], "gradient_clip_algorithm='max'"),
    ("prefetch zero", ["data.prefetch_factor=0"], "data.prefetch_factor=0 is not valid"),
    # Counts a callback would take and act on wrongly.
    ("patience negative", ["callbacks.early_stopping.patience=-1"], "patience=-1 is not valid"),
    ("top k", ["callbacks.model_checkpoint.save_top_k=-2"], "save_top_k=-2 is not valid"),
    ("gc steps", ["callbacks.garbage_collection.every_n_steps=-5"], "every_n_steps=-5 is not"),
    # The learning-rate finder cut short by max_epochs: one line, no run directory.
    ("lr finder cut", ["tune=lr", "trainer.max_epochs=1"], "tune=lr: the learning-rate finder ran"),
    # Only the library can tell: its error in one line, the directory it was made for removed.
    ("refused by Lightning", ["+trainer.max_time=abc"], "Trainer refused its arguments: Misc"),
    # Any error in volt's Hydra callbacks ends the run; Hydra alone would only warn and go on.
    ("error in a callback", ["hydra.run.dir=${oc.env:VOLT_UNSET_X}"], "volt: error: Interpolation"),
]
if not torch.cuda.is_available():
    CASES += [
        ("gpu without gpu", ["trainer=gpu"], "no CUDA GPU is visible"),
        ("cuda without gpu", ["trainer.accelerator=cuda"], "no CUDA GPU is visible"),
    ]
CASES += [
    (f"{name} absent", [f"trainer.accelerator={name}"], f"trainer.accelerator='{name}' but this")
    for name in ("mps", "tpu")
    if not AcceleratorRegistry[name]["accelerator"].is_available()
]


def assert_refused(err: str, message: str, outputs: Path, before: dict[str, str]) -> None:
    assert message in err, err
    assert "Traceback" not in err
    assert snapshot(outputs) == before


def volt_line(err: str, message: str) -> str:
    """The one line volt printed, holding the whole of `message`."""
    lines = [line for line in err.splitlines() if line.startswith("volt: ") and message in line]
    assert len(lines) == 1, err
    return lines[0]


@pytest.mark.parametrize(
    ("overrides", "fragments"), [c[1:] for c in HYDRA_CASES], ids=[c[0] for c in HYDRA_CASES]
)
def test_refused_by_hydra(
    overrides: list[str],
    fragments: tuple[str, ...],
    run_main: Callable[..., tuple[int, str]],
    outputs: Path,
) -> None:
    before = snapshot(outputs)
    code, err = run_main(overrides)
    assert code == 2, err
    assert len(err.splitlines()) == 1, err  # volt's line, and none of Hydra's
    assert err.startswith(f"volt: config error: {overrides[0]}: "), err
    for fragment in fragments:
        assert fragment in err, err
    assert snapshot(outputs) == before


@pytest.mark.parametrize(
    ("overrides", "message"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_bad_training_input(
    overrides: list[str], message: str, run_main: Callable[..., tuple[int, str]], outputs: Path
) -> None:
    before = snapshot(outputs)
    code, err = run_main(overrides)
    assert code == 2, err
    assert_refused(err, message, outputs, before)
    volt_line(err, message)


# {garbage}: a file that is not a checkpoint; {foreign}: a checkpoint volt did not write.
EVAL_CASES: list[tuple[list[str], str]] = [
    (["ckpt_path=missing.ckpt"], "ckpt_path='missing.ckpt' is not valid: use an existing"),
    (["ckpt_path={tmp}"], "is not valid: use an existing checkpoint file"),
    (["ckpt_path={garbage}"], "garbage.ckpt' is not a checkpoint: give a .ckpt file a run wrote"),
    (["ckpt_path=README.md"], "ckpt_path='README.md' is not a checkpoint"),
    (["ckpt_path={foreign}"], "was not written by volt's training"),
    (["ckpt_path={garbage}", "mode=train"], "mode='train' is not valid: use test or predict"),
    (["ckpt_path={garbage}", "precision=8-true"], "precision='8-true' is not valid"),
    (["ckpt_path={garbage}", "batch_size=0"], "batch_size=0 is not valid"),
    (["mode=test"], "ckpt_path has no value (???)"),
    (["ckpt_path={garbage}", "name=../../../x"], "name='../../../x' is not valid"),
    (["ckpt_path={garbage}", "task_name=../../x"], "task_name='../../x' is not valid"),
    (["ckpt_path={garbage}", "+foo.bar=1"], "the eval config has no top-level key 'foo'"),
    (["ckpt_path={garbage}", "+batchsize=3"], "did you mean batch_size?"),
    (
        ["ckpt_path={garbage}", "batchsize=3"],
        "batchsize=3: the eval config has no key or config group 'batchsize'; did you mean"
        " batch_size=3?",
    ),
    (
        [
            "-m",
            "ckpt_path={garbage}",
            "data_root=a,../../../x",
            "hydra.job.config.override_dirname.exclude_keys=[ckpt_path]",
        ],
        "data_root=../../../x: a sweep job's directory is named by its overrides",
    ),
]
if not AcceleratorRegistry["mps"]["accelerator"].is_available():
    EVAL_CASES.append((["ckpt_path={garbage}", "accelerator=mps"], "accelerator='mps' but this"))


@pytest.mark.parametrize(("overrides", "message"), EVAL_CASES)
def test_bad_eval_input(
    overrides: list[str],
    message: str,
    tmp_path: Path,
    run_main: Callable[..., tuple[int, str]],
    outputs: Path,
) -> None:
    foreign = tmp_path / "foreign.ckpt"
    torch.save({"state_dict": {}}, foreign)
    files = {"tmp": tmp_path, "garbage": write(tmp_path / "garbage.ckpt", b"not a ckpt")}
    args = [o.format(foreign=foreign, **files) for o in overrides]
    before = snapshot(outputs)
    code, err = run_main(args, entry=volt_eval.main)
    assert code == 2, err
    assert_refused(err, message, outputs, before)
    volt_line(err, message)


def test_missing_data_files_are_one_clear_line(
    run_main: Callable[..., tuple[int, str]], tmp_path: Path, outputs: Path
) -> None:
    """Only the data module can tell (in prepare_data, when the fit starts): the run directory
    Hydra made for it is gone again, and nothing else changed."""
    before = snapshot(outputs)
    code, err = run_main(["data=mnist", f"data.root={tmp_path / 'nowhere'}", "data.download=false"])
    assert code == 2
    line = volt_line(err, f"data.root={tmp_path / 'nowhere'}: MNIST files not found")
    assert "train-images-idx3-ubyte" in line
    assert "Traceback" not in err
    assert snapshot(outputs) == before


def test_a_named_run_that_existed_is_kept(
    run_main: Callable[..., tuple[int, str]], tmp_path: Path, outputs: Path
) -> None:
    """Refused after Hydra wrote into it, a run directory that was there before stays."""
    code, err = run_main(["name=earlier", "+trainer.max_time=abc"])
    assert code == 2, err
    assert "Trainer refused its arguments" in err
    assert (outputs / "train" / "runs" / "earlier" / "checkpoints" / "last.ckpt").is_file()
    assert (
        (outputs / "train" / "runs" / "earlier" / "train.log")
        .read_text()
        .startswith("the user's log\n")
    )


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["resume=true"], "resume=true needs a run name"),
        (["name=new-run", "resume=true"], "name=new-run with resume=true, but"),
        (["name=has/slash"], "name='has/slash' is not valid"),
    ],
)
def test_bad_resume_requests(
    overrides: list[str], message: str, run_main: Callable[..., tuple[int, str]], outputs: Path
) -> None:
    before = snapshot(outputs)
    code, err = run_main(overrides)
    assert code == 2, err
    assert_refused(err, message, outputs, before)
