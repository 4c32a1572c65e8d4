"""Bad input, table-driven: each case exits non-zero with one clear line naming the key, the value
and the fix, before anything is started or written; nothing already in outputs/ changes."""

import hashlib
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch
from hydra.core.global_hydra import GlobalHydra

from volt import eval as volt_eval
from volt import train as volt_train


def snapshot(root: Path) -> dict[str, str]:
    """Every file under root with a hash of its bytes: any change to what was there shows."""
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
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


CASES: list[tuple[str, list[str], str]] = [
    # (id, overrides, expected text in stderr)
    ("unknown key", ["nonexistent=1"], "Could not override 'nonexistent'"),
    ("unknown nested key", ["data.batchsize=3"], "Could not override 'data.batchsize'"),
    ("unknown model", ["model=transformer"], "Could not find 'model/transformer'"),
    ("unknown data", ["data=imagenet"], "Could not find 'data/imagenet'"),
    ("unknown trainer", ["trainer=tpu9"], "Could not find 'trainer/tpu9'"),
    ("unknown compile", ["compile=fast"], "Could not find 'compile/fast'"),
    ("unknown experiment", ["experiment=nope"], "Could not find 'experiment/nope'"),
    ("unknown debug", ["debug=nope"], "Could not find 'debug/nope'"),
    ("bad override syntax", ["model.optimizer.lr=[1,"], "no viable alternative at input '[1,'"),
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
    ("batch over ranks", ["trainer=ddp", "data.batch_size=63"], "does not divide over 2 DDP"),
    ("adam eps in fp16", ["precision=16-true"], "model.optimizer.eps=1e-08: fp16 rounds it to 0"),
]
if not torch.cuda.is_available():
    CASES += [
        ("gpu without gpu", ["trainer=gpu"], "no CUDA GPU is visible"),
        ("cuda without gpu", ["trainer.accelerator=cuda"], "no CUDA GPU is visible"),
    ]


@pytest.mark.parametrize(
    ("overrides", "message"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_bad_training_input(
    overrides: list[str], message: str, run_main: Callable[..., tuple[int, str]], outputs: Path
) -> None:
    before = snapshot(outputs)
    code, err = run_main(overrides)
    assert code != 0
    assert message in err, err
    assert "Traceback" not in err
    assert snapshot(outputs) == before
    assert sorted(p.name for p in (outputs / "train" / "runs").iterdir()) == ["earlier"]


def eval_cases(tmp_path: Path) -> list[tuple[list[str], str]]:
    garbage = write(tmp_path / "garbage.ckpt", b"not a checkpoint")
    foreign = tmp_path / "foreign.ckpt"
    torch.save({"state_dict": {}}, foreign)
    return [
        (["ckpt_path=missing.ckpt"], "ckpt_path='missing.ckpt' is not valid: use an existing"),
        ([f"ckpt_path={tmp_path}"], "is not valid: use an existing checkpoint file"),
        ([f"ckpt_path={garbage}"], "cannot be used"),
        ([f"ckpt_path={foreign}"], "was not written by volt's training"),
        ([f"ckpt_path={garbage}", "mode=train"], "mode='train' is not valid: use test or predict"),
        ([f"ckpt_path={garbage}", "precision=8-true"], "precision='8-true' is not valid"),
        ([f"ckpt_path={garbage}", "batch_size=0"], "batch_size=0 is not valid"),
        (["mode=test"], "ckpt_path has no value (???)"),
    ]


def test_bad_eval_input(
    tmp_path: Path, run_main: Callable[..., tuple[int, str]], outputs: Path
) -> None:
    for overrides, message in eval_cases(tmp_path):
        before = snapshot(outputs)
        code, err = run_main(overrides, entry=volt_eval.main)
        assert code != 0, overrides
        assert message in err, (overrides, err)
        assert "Traceback" not in err
        assert snapshot(outputs) == before


def test_missing_data_files_are_one_clear_line(
    run_main: Callable[..., tuple[int, str]], tmp_path: Path
) -> None:
    code, err = run_main(["data=mnist", f"data.root={tmp_path / 'nowhere'}", "data.download=false"])
    assert code == 2
    assert f"data.root={tmp_path / 'nowhere'}: MNIST files not found" in err
    assert "train-images-idx3-ubyte" in err
    assert "Traceback" not in err


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
    assert message in err
    assert {k: v for k, v in snapshot(outputs).items() if k in before} == before
