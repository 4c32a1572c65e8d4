"""trainer=fsdp as a user runs it: torch's FSDP2 over two CPU processes (gloo), started by volt;
the tiny GPT fitted, sampled, resumed exactly, its checkpoint evaluated, swept; bad combinations
refused before anything starts. One H100: the same on one GPU in bf16-mixed (marked gpu)."""

import json
import re
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from omegaconf import DictConfig, OmegaConf
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from torch import Tensor

from tests.in_process import RunHere
from volt.build import build_training
from volt.config.validation import check_config
from volt.errors import ConfigError

Run = Callable[..., subprocess.CompletedProcess[str]]
PROBES = "tests.strategies.rank_probes"
Compose = Callable[..., DictConfig]

# The tiny GPT, a few steps on two ranks: validation (and sampling) every 3 steps.
TINY = [
    "experiment=gpt_bytes_tiny",
    "trainer=fsdp",
    "trainer.devices=2",
    "trainer.max_steps=6",
    "model.scheduler.warmup_steps=2",
    "data.batch_size=8",
    "data.steps_per_epoch=3",
    "trainer.limit_val_batches=2",
    "trainer.limit_test_batches=2",
    "trainer.log_every_n_steps=2",
    "callbacks.text_samples.max_new_tokens=8",
    "callbacks.progress_bar=null",
    "callbacks.model_summary=null",
]


def eval_command(checkpoint: str | Path) -> list[str]:
    """`python -m volt.eval` of `checkpoint` on the test batches its run tested."""
    return [
        f"ckpt_path={checkpoint}",
        "trainer.limit_test_batches=2",
        "callbacks.progress_bar=null",
    ]


def only_dir(parent: Path) -> Path:
    children = [p for p in parent.iterdir() if p.is_dir()]
    assert len(children) == 1, children
    return children[0]


def assert_two_ranks_trained(run_dir: Path) -> None:
    rank0_log = (run_dir / "train.log").read_text()
    assert "GLOBAL_RANK: 0, MEMBER: 1/2" in rank0_log
    assert "GLOBAL_RANK: 1, MEMBER: 2/2" in (run_dir / "train_rank1.log").read_text()
    assert "strategy=FSDPStrategy" in rank0_log
    if not torch.cuda.is_available():
        assert rank0_log.count("FSDP on the CPU (no GPU visible): 2 processes over gloo") == 1


def text_samples(run_dir: Path) -> list[int]:
    """The steps at which TensorBoard got a samples/0 text, from whichever event file holds it."""
    steps = []
    for events_file in run_dir.rglob("events.out.tfevents.*"):
        events = EventAccumulator(str(events_file), size_guidance={"tensors": 0})
        events.Reload()
        if "samples/0/text_summary" in events.Tags()["tensors"]:
            steps += [e.step for e in events.Tensors("samples/0/text_summary")]
    return sorted(steps)


def as_lists(value: object) -> object:
    if isinstance(value, dict):
        return {k: as_lists(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [as_lists(v) for v in value]
    return value


def test_fsdp_config_asks_for_two_cpu_processes_and_shards_gpt_blocks(
    compose_config: Compose, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    cfg = compose_config("train", ["trainer=fsdp"])
    assert cfg.trainer.devices == 2
    assert cfg.trainer.strategy._target_ == "volt.strategies.fsdp.FSDPStrategy"
    assert cfg.trainer.strategy.rank_config == f"{cfg.paths.output_dir}/config_resolved.yaml"
    assert list(cfg.trainer.strategy.wrap) == ["volt.nets.gpt.Block"]
    check_config(cfg)


@pytest.mark.parametrize(
    ("overrides", "refusal"),
    [
        (["trainer=fsdp", "precision=16-mixed"], "precision=16-mixed with trainer=fsdp"),
        (["trainer=fsdp", "precision=64-true"], "precision=64-true with trainer=fsdp"),
        (["trainer=fsdp", "+trainer.sync_batchnorm=true"], "trainer.sync_batchnorm=true with"),
        (["trainer=ddp", "trainer.strategy=fsdp"], "trainer.strategy=fsdp: Lightning's FSDP1"),
        (["trainer=fsdp", "tune=lr"], "tune=lr runs on one device only"),
    ],
)
def test_combinations_fsdp_cannot_train_are_refused_in_one_line(
    overrides: list[str], refusal: str, compose_config: Compose
) -> None:
    cfg = compose_config("train", overrides)
    with pytest.raises(ConfigError, match=refusal) as caught:
        check_config(cfg)
    assert "\n" not in str(caught.value)
    assert "trainer=" in str(caught.value) or "precision=" in str(caught.value)


def test_a_wrap_class_the_model_lacks_is_refused_before_any_rank_starts(
    compose_config: Compose, tmp_path: Path
) -> None:
    # The default model (an MLP) has no GPT block: a config for another model, caught at build.
    cfg = compose_config("train", ["trainer=fsdp", f"paths.data_dir={tmp_path}"])
    with pytest.raises(
        ConfigError, match=re.escape("has no layer of class 'volt.nets.gpt.Block'")
    ) as caught:
        build_training(cfg, OmegaConf.to_container(cfg, resolve=True))
    assert "trainer.strategy.wrap=[]" in str(caught.value)
    assert not list(Path(cfg.paths.output_dir).glob("config_resolved.yaml"))  # nothing started


@pytest.mark.slow
def test_two_cpu_ranks_fit_sample_and_eval_reads_the_checkpoint(
    run_volt: Run, run_volt_here: RunHere, tmp_path: Path
) -> None:
    # The single-file layout; the sharded default: tests/strategies/test_fsdp_checkpoints.py.
    clipping = f"+callbacks.clipping={{_target_: {PROBES}.RecordClipping}}"
    trusted = "trusted_targets=[tests]"  # the probe's package
    result = run_volt([*TINY, "name=tiny", "trainer.strategy.checkpoint=full", clipping, trusted])
    assert result.returncode == 0, result.stderr[-3000:]
    run_dir = tmp_path / "outputs" / "train" / "runs" / "tiny"
    assert_two_ranks_trained(run_dir)
    for rank in (0, 1):  # gpt_bytes clips at 1.0 and steps AdamW: each rank on its shards
        clip = (run_dir / f"clip_rank{rank}.txt").read_text()
        assert clip == "volt.strategies.fsdp._clip_by_norm_on_shards"
        step = (run_dir / f"step_rank{rank}.txt").read_text()
        assert step == "volt.strategies.fsdp.step_on_shards.<locals>.step"
    # Both ranks sampled (the sharded forward needs both), rank 0 wrote: at each validation.
    assert text_samples(run_dir) == [3, 6]
    trained = json.loads((run_dir / "metrics.json").read_text())
    best = Path(trained["best_checkpoint"])
    # One file, as a single-device run's: full weights and names, tied head included.
    state = torch.load(best, weights_only=True)["state_dict"]
    assert state["net.blocks.0.attn.qkv.weight"].shape == (384, 128)
    assert torch.equal(state["net.lm_head.weight"], state["net.tok_emb.weight"])

    evaluated = run_volt_here(eval_command(best), module="volt.eval")  # one process, one device
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]
    record = json.loads(only_dir(tmp_path / "outputs" / "eval" / "runs").joinpath(
        "metrics.json").read_text())  # fmt: skip
    # The same 16 windows: two ranks' 2 batches of 4 (every other window each), one device's 2
    # batches of 8.
    assert record["metrics"]["test/bpb"] == pytest.approx(trained["metrics"]["test/bpb"], rel=1e-5)


@pytest.mark.slow
def test_a_resumed_run_restores_exactly_the_state_its_checkpoint_holds(
    run_volt: Run, tmp_path: Path
) -> None:
    """Saved from two shards, read back into two shards, saved again: the same file contents.
    (Whether the training that follows matches an unbroken run is volt's resume logic, the same
    with or without FSDP: tests/runs/test_resume.py. The sharded layout, resharded too:
    tests/strategies/test_fsdp_checkpoints.py.)"""
    quick = [
        *TINY,
        "trainer.strategy.checkpoint=full",
        "model.scheduler.max_steps=6",
        "callbacks.early_stopping=null",  # volt's check at a restored epoch end: see the report
        "test=false",
        "callbacks.text_samples=null",
        "logger=csv",
        "trusted_targets=[tests]",
        f"+callbacks.restored={{_target_:{PROBES}.SaveWhenTrainingStarts}}",
    ]
    stopped = run_volt([*quick, "name=resumed", "trainer.max_steps=3"])
    assert stopped.returncode == 0, stopped.stderr[-3000:]
    run_dir = tmp_path / "outputs" / "train" / "runs" / "resumed"
    (run_dir / "metrics.json").unlink()  # as if killed after its step-3 checkpoint
    saved = torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)
    resumed = run_volt([*quick, "name=resumed"])
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resuming run resumed from" in (run_dir / "train.log").read_text()
    assert "resuming run resumed from" in (run_dir / "train_rank1.log").read_text()
    restored = torch.load(run_dir / "restored.ckpt", weights_only=True)
    assert restored["global_step"] == saved["global_step"] == 3
    # Parameters, and state kept otherwise: the best bpb so far (a torchmetrics metric).
    assert saved["state_dict"].keys() == restored["state_dict"].keys()
    assert "val_bpb_best.min_value" in saved["state_dict"]
    for key, value in saved["state_dict"].items():
        assert torch.equal(value, restored["state_dict"][key]), key
    # AdamW's moments and step, keyed as a single-device run's, and its groups' settings.
    before, after = saved["optimizer_states"][0], restored["optimizer_states"][0]
    # (betas come back a list, as the config gave them, where the file had a tuple)
    assert as_lists(before["param_groups"]) == as_lists(after["param_groups"])
    assert before["state"].keys() == after["state"].keys()
    for index, moments in before["state"].items():
        for name, value in moments.items():
            assert torch.equal(value, after["state"][index][name]), (index, name)
    assert saved["lr_schedulers"] == restored["lr_schedulers"]
    assert torch.load(run_dir / "checkpoints" / "last.ckpt")["global_step"] == 6


@pytest.mark.slow
def test_multirun_jobs_each_shard_their_own_config_over_both_ranks(
    run_volt: Run, tmp_path: Path
) -> None:
    quick = [*TINY, "trainer.max_steps=3", "test=false", "callbacks.text_samples=null"]
    # Job directories named by number alone: these overrides would make too long a name.
    subdir = "hydra.sweep.subdir=${hydra.job.num}"
    result = run_volt(["-m", *quick, "model.optimizer.lr=1e-3,1e-2", subdir])
    assert result.returncode == 0, result.stderr[-3000:]
    sweep = only_dir(tmp_path / "outputs" / "train" / "multiruns")
    jobs = sorted(p for p in sweep.iterdir() if p.is_dir())
    assert [j.name for j in jobs] == ["0", "1"]
    for job, lr in zip(jobs, (1e-3, 1e-2), strict=True):
        assert_two_ranks_trained(job)
        # sharded: the config and the loops' state are in the folder's meta.pt
        stored = torch.load(job / "checkpoints" / "last.ckpt" / "meta.pt", weights_only=True)
        assert stored["volt_config"]["model"]["optimizer"]["lr"] == lr
        assert stored["global_step"] == 3


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("compile_mode", ["off", "default"])
def test_one_gpu_fits_bf16_resumes_and_evals(
    compile_mode: str, run_volt: Run, tmp_path: Path
) -> None:
    """The lead's H100 check: trainer=fsdp devices=1 in bf16-mixed, eager and compiled."""
    gpu = [
        *TINY,
        "trainer.devices=1",
        "precision=bf16-mixed",
        f"compile={compile_mode}",
        "data.batch_size=32",
        "trainer.limit_val_batches=4",
        "callbacks.early_stopping=null",  # volt's check at a restored epoch end: see above
        "trainer.strategy.checkpoint=full",  # eval's command reads files (sharded: next file)
    ]
    assert run_volt([*gpu, "name=gpu", "trainer.max_steps=3"]).returncode == 0
    runs = tmp_path / "outputs" / "train" / "runs"
    (runs / "gpu" / "metrics.json").unlink()  # as if killed after its step-3 checkpoint
    result = run_volt([*gpu, "name=gpu"])
    assert result.returncode == 0, result.stderr[-3000:]
    log = (runs / "gpu" / "train.log").read_text()
    assert "resuming run gpu from" in log
    assert "precision=bf16-mixed strategy=FSDPStrategy" in log
    assert text_samples(runs / "gpu") == [3, 6]
    trained = json.loads((runs / "gpu" / "metrics.json").read_text())
    assert torch.load(runs / "gpu" / "checkpoints" / "last.ckpt")["global_step"] == 6
    evaluated = run_volt(eval_command(trained["best_checkpoint"]), module="volt.eval")
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]
    record = json.loads(only_dir(tmp_path / "outputs" / "eval" / "runs").joinpath(
        "metrics.json").read_text())  # fmt: skip
    # One device in both: the same weights on the same test batches.
    assert record["metrics"]["test/bpb"] == pytest.approx(trained["metrics"]["test/bpb"], rel=1e-2)


@pytest.mark.parametrize("reshard_after_forward", [True, False])
def test_every_block_but_the_last_frees_its_gathered_weights_after_forward(
    reshard_after_forward: bool,
) -> None:
    """FSDP2 registers a layer's gathered (plain) weights while it holds them and its shards
    (DTensors) once it has freed them: after a forward, only the last block, which backward
    needs first, still holds them (all of them do with reshard_after_forward=false)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor

    from volt.nets.gpt import GPT
    from volt.strategies.fsdp import mixed_precision, shard

    store = torch.distributed.HashStore()
    torch.distributed.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        holder = torch.nn.Module()
        holder.net = GPT(block_size=8, vocab_size=16, n_layer=3, n_head=2, n_embd=8)
        mesh = init_device_mesh("cpu", (1,))
        policy = mixed_precision("32-true")
        shard(holder, ["volt.nets.gpt.Block"], mesh, policy, reshard_after_forward, 0)
        holder.net(torch.zeros(1, 8, dtype=torch.long))
        gathered = [not isinstance(b.mlp.fc.weight, DTensor) for b in holder.net.blocks]
        assert gathered == ([False, False, True] if reshard_after_forward else [True] * 3)
    finally:
        torch.distributed.destroy_process_group()


def sharded_gpt(
    blocks_a_group: int, mesh: Any, wrap: tuple[str, ...] = ("volt.nets.gpt.Block",), **net: Any
) -> torch.nn.Module:
    """A 5-block GPT (width 8 unless `net` says otherwise) in a holder, as the LightningModule
    holds its net, sharded by volt with groups of at least `blocks_a_group` blocks' parameters."""
    from volt.nets.gpt import GPT
    from volt.strategies.fsdp import mixed_precision, shard

    holder = torch.nn.Module()
    holder.net = GPT(**{"block_size": 16, "n_layer": 5, "n_head": 2, "n_embd": 8, **net})
    block_params = sum(p.numel() for p in holder.net.blocks[0].parameters())
    policy = mixed_precision("32-true")
    shard(holder, list(wrap), mesh, policy, True, blocks_a_group * block_params)
    return holder


def test_blocks_are_sharded_in_groups_of_at_least_min_group_params() -> None:
    """Five blocks, groups of at least two blocks' parameters: blocks 0-1 and 2-3 gather as one
    group each (one FSDP state, one all-gather), block 4 is left to the net's own group; a
    threshold above the whole net shards it as one group, 0 each block alone."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import FSDPModule

    def groups(blocks_a_group: int) -> list[list[int]]:
        holder = sharded_gpt(blocks_a_group, init_device_mesh("cpu", (1,)), vocab_size=16)
        holder.net(torch.zeros(1, 8, dtype=torch.long)).sum().backward()  # it still trains
        states: dict[int, list[int]] = {}
        for i, block in enumerate(holder.net.blocks):
            if isinstance(block, FSDPModule):
                states.setdefault(id(block._get_fsdp_state()), []).append(i)
        assert isinstance(holder.net, FSDPModule)
        return list(states.values())

    store = torch.distributed.HashStore()
    torch.distributed.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        assert groups(2) == [[0, 1], [2, 3]]
        assert groups(100) == []
        assert groups(0) == [[0], [1], [2], [3], [4]]
    finally:
        torch.distributed.destroy_process_group()


def test_a_wrap_class_inside_another_is_sharded_on_its_own_inside_its_group() -> None:
    """wrap names the block and its MLP: blocks gather in pairs as without the MLP, and each
    MLP is an FSDP unit of its own inside its block's group (gathered and freed by itself, kept
    gathered after forward with the last group)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.tensor import DTensor

    store = torch.distributed.HashStore()
    torch.distributed.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        mesh = init_device_mesh("cpu", (1,))
        wrap = ("volt.nets.gpt.Block", "volt.nets.gpt.MLP")
        holder = sharded_gpt(2, mesh, wrap, vocab_size=16)
        blocks = holder.net.blocks
        states = [b._get_fsdp_state() if isinstance(b, FSDPModule) else None for b in blocks]
        assert states[0] is states[1] and states[2] is states[3] and states[4] is None
        assert states[0] is not states[2] is not None
        for block in blocks:
            assert isinstance(block.mlp, FSDPModule)
            assert block.mlp._get_fsdp_state() not in states
        holder.net(torch.zeros(1, 8, dtype=torch.long))
        # after forward the last group keeps its weights for backward, its MLPs' too
        for weights in ([b.mlp.fc.weight for b in blocks], [b.attn.proj.weight for b in blocks]):
            gathered = [not isinstance(w, DTensor) for w in weights]
            assert gathered == [False, False, True, True, False]
        for _ in range(2):
            holder.net(torch.zeros(1, 8, dtype=torch.long)).sum().backward()
        assert all(isinstance(p, DTensor) for p in holder.parameters())
    finally:
        torch.distributed.destroy_process_group()


def test_a_parameter_two_layers_share_counts_once_towards_a_group() -> None:
    from volt.strategies.fsdp import _groups

    shared = torch.nn.Linear(10, 10)  # 110 parameters
    first, second = torch.nn.Sequential(shared), torch.nn.Sequential(shared, torch.nn.Linear(1, 1))
    assert _groups([first, second], 113) == []  # 110 + 2, not 110 + 112
    assert _groups([first, second], 112) == [[first, second]]


def test_a_negative_min_group_params_is_refused_in_one_line(tmp_path: Path) -> None:
    from volt.strategies.fsdp import FSDPStrategy

    with pytest.raises(ConfigError, match=r"min_group_params=-1 is negative: use 0") as caught:
        FSDPStrategy(rank_config=tmp_path / "c.yaml", min_group_params=-1)
    assert "\n" not in str(caught.value)


def save_on_rank_zero_and_leave(rank: int, saved: Any, path: Path) -> None:
    """Rank 0 saves `saved` to `path`; then both ranks tear gloo down together. A rank that
    destroyed its group while the other was still saving died at times in gloo's teardown
    ("terminate called without an active exception", SIGABRT): 2 runs of a test in 12 and once
    in a `make test-slow` on the 2-core CPU (torch 2.14, 2026-11-29); with the barrier 16 runs in
    16 passed."""
    if rank == 0:
        torch.save(saved, path)
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()


def train_grouped_on_rank(rank: int, init_file: str, out_dir: Path) -> None:
    """On each of two gloo ranks: three SGD steps of a 5-block GPT, sharded with each grouping
    (none, pairs, one group) with and without activation checkpointing; rank 0 saves the losses."""
    from torch.distributed.device_mesh import init_device_mesh

    torch.set_num_threads(1)
    torch.distributed.init_process_group(
        "gloo", init_method=f"file://{init_file}", rank=rank, world_size=2
    )
    mesh = init_device_mesh("cpu", (2,))
    losses = {}
    for blocks_a_group in (0, 2, 100):
        for checkpointing in (False, True):
            torch.manual_seed(0)
            holder = sharded_gpt(blocks_a_group, mesh, activation_checkpointing=checkpointing)
            optimizer = torch.optim.SGD(holder.parameters(), lr=0.5)
            torch.manual_seed(1 + rank)  # each rank its own batches
            run = []
            for _ in range(3):
                loss = holder.net(torch.randint(0, 256, (2, 16))).logsumexp(-1).mean()
                loss.backward()
                optimizer.step()
                optimizer.zero_grad()
                run.append(loss.detach())
            losses[blocks_a_group, checkpointing] = torch.stack(run)
    save_on_rank_zero_and_leave(rank, losses, out_dir / "losses.pt")


@pytest.mark.slow
def test_grouped_blocks_train_exactly_as_blocks_sharded_alone(tmp_path: Path) -> None:
    """Two real ranks (~10 s): the same losses step by step whether FSDP gathers each block
    alone, in pairs or all in one group, with activation checkpointing (which runs each
    block's forward again in backward, inside its group's gathering) or without."""
    import torch.multiprocessing as mp

    mp.spawn(train_grouped_on_rank, args=(str(tmp_path / "rendezvous"), tmp_path), nprocs=2)
    losses = torch.load(tmp_path / "losses.pt")
    reference = losses[0, False]
    assert reference[-1] < reference[0]  # it learns: steps that did nothing would also agree
    for key, got in losses.items():
        torch.testing.assert_close(got, reference, msg=lambda m, key=key: f"{key}: {m}")


class EncoderDecoder(torch.nn.Module):
    """Three encoder blocks, then three decoder blocks, in one submodule; `encode_only` runs the
    encoder alone (as an encoder-only loss or a retrieval step does)."""

    def __init__(self, config: Any) -> None:
        from volt.nets.gpt import Block

        super().__init__()
        self.encoder = torch.nn.Sequential(*(Block(config) for _ in range(3)))
        self.decoder = torch.nn.Sequential(*(Block(config) for _ in range(3)))

    def forward(self, x: Tensor, encode_only: bool = False) -> Tensor:
        return self.encoder(x) if encode_only else self.decoder(self.encoder(x))


def _with_teacher(student: torch.nn.Module, teacher: torch.nn.Module, x: Tensor) -> Tensor:
    """A student's output against a frozen teacher's (run without gradients), the teacher then
    moved towards the student by a momentum step, as self-distillation (BYOL, DINO) does."""
    with torch.no_grad():
        target = teacher(x)
        for mine, theirs in zip(teacher.parameters(), student.parameters(), strict=True):
            mine.mul_(0.9).add_(theirs.detach(), alpha=0.1)
    return student(x) - target


def _holders() -> dict[str, tuple[torch.nn.Module, Callable[[torch.nn.Module], Tensor]]]:
    """LightningModule-like holders whose layouts grouping must not break (a review found each
    one failing): a top-level ModuleList of blocks, a Sequential of blocks only, a net reached
    through an alias of its blocks, a frozen teacher registered after its student, an encoder
    and a decoder in one submodule whose forward may run the encoder alone."""
    from volt.nets.gpt import GPT, Block, GPTConfig

    config = GPTConfig(vocab_size=16, block_size=8, n_layer=3, n_head=2, n_embd=8)
    x = torch.randn(2, 8, 8)
    taught = torch.nn.Module()
    taught.student = torch.nn.Sequential(*(Block(config) for _ in range(3)))
    taught.teacher = torch.nn.Sequential(*(Block(config) for _ in range(3)))
    taught.teacher.requires_grad_(False)
    coded = torch.nn.Module()
    coded.model = EncoderDecoder(config)
    steps = iter(range(1_000_000))
    probed = torch.nn.Module()
    probed.probe = (
        (net := GPT(vocab_size=16, block_size=8, n_layer=3, n_head=2, n_embd=8)).blocks[1].mlp
    )  # an inner layer (when wrap names the MLP) reached first as a child of its own
    probed.net = net
    listed = torch.nn.Module()
    listed.layers = torch.nn.ModuleList(Block(config) for _ in range(3))
    listed.head = torch.nn.Linear(8, 8)
    chained = torch.nn.Module()
    chained.body = torch.nn.Sequential(*(Block(config) for _ in range(3)))
    aliased = torch.nn.Module()
    aliased.net = GPT(vocab_size=16, block_size=8, n_layer=3, n_head=2, n_embd=8)
    aliased.body = aliased.net.blocks
    tokens = torch.zeros(2, 8, dtype=torch.long)
    return {
        "module list": (listed, lambda h: h.head(h.layers[2](h.layers[1](h.layers[0](x))))),
        "sequential": (chained, lambda h: h.body(x)),
        "alias": (aliased, lambda h: h.net(tokens)),
        "teacher": (taught, lambda h: _with_teacher(h.student, h.teacher, x)),
        # an encoder-only step, then whole ones
        "encoder-decoder": (coded, lambda h: h.model(x, encode_only=next(steps) == 0)),
        "inner alias": (probed, lambda h: h.net(tokens)),
    }


LAYOUTS = ["module list", "sequential", "alias", "teacher", "encoder-decoder", "inner alias"]
BLOCKS, BLOCKS_AND_MLPS = ["volt.nets.gpt.Block"], ["volt.nets.gpt.Block", "volt.nets.gpt.MLP"]


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("min_group_params", [0, 1000, 100_000_000])
@pytest.mark.parametrize("reshard_after_forward", [True, False])
@pytest.mark.parametrize("wrap", [BLOCKS, BLOCKS_AND_MLPS], ids=["blocks", "blocks+mlps"])
def test_grouping_shards_every_layout_it_trains(
    layout: str, min_group_params: int, reshard_after_forward: bool, wrap: list[str]
) -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor

    from volt.strategies.fsdp import mixed_precision, shard

    holder, call = _holders()[layout]
    store = torch.distributed.HashStore()
    torch.distributed.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        mesh = init_device_mesh("cpu", (1,))
        policy = mixed_precision("32-true")
        shard(holder, wrap, mesh, policy, reshard_after_forward, min_group_params)
        for _ in range(2):  # a second step: FSDP's state after a whole step
            call(holder).sum().backward()
        assert all(isinstance(p, DTensor) for p in holder.parameters())
    finally:
        torch.distributed.destroy_process_group()


def odd_shards_on_rank(rank: int, init_file: str) -> tuple[torch.nn.Module, Any]:
    """On each of two gloo ranks (joined here): the 5-block GPT, every block its own group, and
    a layer of odd shapes (rank 1 holds empty shards of its (1, 3) weight and (1,) bias), the
    same weights on both; and the mesh."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    torch.set_num_threads(1)
    torch.distributed.init_process_group(
        "gloo", init_method=f"file://{init_file}", rank=rank, world_size=2
    )
    mesh = init_device_mesh("cpu", (2,))
    torch.manual_seed(0)
    holder = sharded_gpt(0, mesh)
    holder.odd = fully_shard(
        torch.nn.Sequential(torch.nn.Linear(5, 3), torch.nn.Linear(3, 1)), mesh=mesh
    )
    return holder, mesh


def clip_on_rank(rank: int, init_file: str, out_dir: Path) -> None:
    """On each of two gloo ranks, `odd_shards_on_rank`'s net: one backward of this rank's own
    batch, the gradients clipped on the shards. Then a gradient replicated on both
    ranks, which must go to torch's function. Rank 0 saves the gathered gradients before and
    after, and the norms every rank returned."""
    from torch.distributed.tensor import DTensor, Replicate, distribute_tensor

    from volt.strategies.fsdp import clip_sharded_grad_norm_

    holder, mesh = odd_shards_on_rank(rank, init_file)
    torch.manual_seed(1 + rank)
    loss = holder.net(torch.randint(0, 256, (2, 16))).logsumexp(-1).mean()
    (loss + holder.odd(torch.randn(4, 5)).square().mean()).backward()
    params = list(holder.parameters())
    before = [p.grad.full_tensor() for p in params]
    norm = clip_sharded_grad_norm_(params, 0.001)
    assert not isinstance(norm, DTensor)  # the shards' own path, not torch's
    after = [p.grad.full_tensor() for p in params]
    replicated = torch.nn.Parameter(distribute_tensor(torch.ones(3), mesh, [Replicate()]))
    replicated.grad = distribute_tensor(torch.full((3,), 2.0), mesh, [Replicate()])
    replicated_norm = clip_sharded_grad_norm_([replicated], 1.0)
    saved = {"before": before, "after": after, "norms": [torch.zeros(()), torch.zeros(())]}
    torch.distributed.all_gather(saved["norms"], norm)
    saved["replicated"] = replicated_norm.full_tensor()
    save_on_rank_zero_and_leave(rank, saved, out_dir / "clip.pt")


@pytest.mark.slow
def test_clipping_on_shards_clips_as_torch_clips_the_whole_gradients(tmp_path: Path) -> None:
    """Two real ranks (~10 s), each holding part of each gradient (some none): the norm every
    rank returns and the clipped gradients, gathered, are torch's clip_grad_norm_ of the whole
    gradients; a replicated gradient counts once (torch's function)."""
    import torch.multiprocessing as mp

    mp.spawn(clip_on_rank, args=(str(tmp_path / "rendezvous"), tmp_path), nprocs=2)
    saved = torch.load(tmp_path / "clip.pt")
    whole = [torch.nn.Parameter(torch.zeros_like(g)) for g in saved["before"]]
    for p, g in zip(whole, saved["before"], strict=True):
        p.grad = g.clone()
    expected = torch.nn.utils.clip_grad_norm_(whole, 0.001)
    assert expected > 0.01  # so 0.001 clips: gradients left alone would not match
    for norm in saved["norms"]:
        torch.testing.assert_close(norm, expected)
    torch.testing.assert_close(saved["after"], [p.grad for p in whole])
    torch.testing.assert_close(saved["replicated"], torch.tensor(12**0.5))  # not summed twice


def test_clipping_takes_other_layouts_to_torch_and_reads_shards_without_autograd(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """In a world of one: the shards clipped as torch clips the same DTensors, by the shards'
    own path (a plain tensor back), DTensor's autograd-tracked to_local never called; plain
    gradients (no FSDP) go to torch's function."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, _api

    from volt.strategies.fsdp import clip_sharded_grad_norm_

    plain = [torch.nn.Parameter(torch.ones(3)), torch.nn.Parameter(torch.ones(2))]
    for p in plain:
        p.grad = torch.full_like(p, 2.0)
    torch.testing.assert_close(clip_sharded_grad_norm_(plain, 1.0), torch.tensor(20**0.5))
    torch.testing.assert_close(plain[0].grad, torch.full((3,), 2 / (20**0.5 + 1e-6)))

    store = torch.distributed.HashStore()
    torch.distributed.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        torch.manual_seed(0)
        holder = sharded_gpt(0, init_device_mesh("cpu", (1,)), vocab_size=16)
        holder.net(torch.randint(0, 16, (2, 8))).logsumexp(-1).mean().backward()
        params = list(holder.parameters())
        saved = [p.grad.to_local().clone() for p in params]
        expected = torch.nn.utils.clip_grad_norm_(params, 0.01).full_tensor()
        clipped = [p.grad.to_local().clone() for p in params]
        for p, g in zip(params, saved, strict=True):
            p.grad.to_local().copy_(g)
        calls = []
        tracked = _api._ToTorchTensor.apply
        monkeypatch.setattr(_api._ToTorchTensor, "apply", lambda *a: calls.append(a) or tracked(*a))
        norm = clip_sharded_grad_norm_(params, 0.01)
        assert not calls
        assert not isinstance(norm, DTensor)  # torch's function would give a DTensor back
        assert expected > 0.1  # so 0.01 clips
        torch.testing.assert_close(norm, expected)
        torch.testing.assert_close([p.grad.to_local() for p in params], clipped)
    finally:
        torch.distributed.destroy_process_group()


def test_a_precision_plugin_that_clips_its_own_way_keeps_it() -> None:
    """Lightning's plugins clip on the shards under trainer=fsdp; a user's plugin (trainer.plugins)
    whose clip_grad_by_norm is its own is left alone."""
    from lightning.pytorch.plugins.precision import MixedPrecision, Precision

    from volt.strategies.fsdp import clip_on_shards

    class OwnClip(Precision):
        def clip_grad_by_norm(self, optimizer: Any, clip_val: int | float) -> None:
            pass

    for plugin in (Precision(), MixedPrecision("bf16-mixed", "cpu")):
        clip_on_shards(plugin)
        assert plugin.clip_grad_by_norm.func.__name__ == "_clip_by_norm_on_shards"  # type: ignore[attr-defined]
    own = OwnClip()
    clip_on_shards(own)
    assert own.clip_grad_by_norm.__func__ is OwnClip.clip_grad_by_norm  # type: ignore[attr-defined]


def dtensors_and_state(optimizer: torch.optim.Optimizer) -> list[dict[str, Tensor]]:
    """Each parameter's state (by the order of the parameter groups), DTensors as local tensors."""
    from torch.distributed.tensor import DTensor

    params = [p for group in optimizer.param_groups for p in group["params"]]
    return [
        {k: v.to_local() if isinstance(v, DTensor) else v for k, v in optimizer.state[p].items()}
        for p in params
    ]


OPTIMIZERS: dict[str, Callable[[Any], torch.optim.Optimizer]] = {
    "fused AdamW": lambda params: torch.optim.AdamW(params, lr=0.01, fused=True),
    "foreach Adam, amsgrad": lambda params: torch.optim.Adam(
        params, lr=0.01, weight_decay=0.1, amsgrad=True, foreach=True
    ),
    "SGD, Nesterov": lambda params: torch.optim.SGD(params, lr=0.01, momentum=0.9, nesterov=True),
}


def spy_on_steps(monkeypatch: pytest.MonkeyPatch, cls: type) -> dict[int, list[set[type]]]:
    """Record, by optimizer, the types of the parameters `cls`'s own step runs on (before any LR
    scheduler or volt wraps it)."""
    seen: dict[int, list[set[type]]] = {}
    original = cls.step

    def step(self: torch.optim.Optimizer, *args: Any, **kwargs: Any) -> Any:
        params = [p for group in self.param_groups for p in group["params"]]
        seen.setdefault(id(self), []).append({type(p) for p in params})
        return original(self, *args, **kwargs)

    monkeypatch.setattr(cls, "step", step)
    return seen


@pytest.mark.parametrize("make", OPTIMIZERS.values(), ids=OPTIMIZERS.keys())
def test_an_optimizer_steps_on_the_shards_as_on_the_dtensors(
    make: Callable[[Any], torch.optim.Optimizer], monkeypatch: pytest.MonkeyPatch
) -> None:
    """In a world of one, three steps of the same gradients: the optimizer volt wraps runs its
    step on plain tensors, yet leaves the same weights and state as one stepping the DTensors,
    state kept as DTensors under the DTensor parameters; its LR scheduler (made first, as
    Lightning makes it) sees its step called; a copy of its sharded state dict loads into another
    wrapped optimizer, through DCP, bit for bit."""
    import copy
    import warnings

    from torch.distributed.checkpoint.state_dict import (
        get_optimizer_state_dict,
        set_optimizer_state_dict,
    )
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor

    from volt.strategies.fsdp import step_on_shards

    store = torch.distributed.HashStore()
    torch.distributed.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        mesh = init_device_mesh("cpu", (1,))
        nets = []
        for _ in range(3):
            torch.manual_seed(0)
            nets.append(sharded_gpt(0, mesh, vocab_size=16))
        plain, wrapped, restored = nets
        as_is, on_shards = make(plain.parameters()), make(wrapped.parameters())
        seen = spy_on_steps(monkeypatch, type(on_shards))
        scheduler = torch.optim.lr_scheduler.LambdaLR(on_shards, lambda step: 0.5**step)
        step_on_shards(on_shards)
        for _ in range(3):
            plain.net(torch.randint(0, 16, (2, 8))).logsumexp(-1).mean().backward()
            for p, q in zip(plain.parameters(), wrapped.parameters(), strict=True):
                q.grad = p.grad.clone()
            as_is.step()
            with warnings.catch_warnings():
                warnings.simplefilter("error")  # the scheduler's warning about a replaced step
                on_shards.step()
                scheduler.step()
            as_is.zero_grad()
            on_shards.zero_grad()
            as_is.param_groups[0]["lr"] = on_shards.param_groups[0]["lr"]
        assert seen == {id(as_is): [{DTensor}] * 3, id(on_shards): [{torch.Tensor}] * 3}
        assert all(isinstance(p, DTensor) for g in on_shards.param_groups for p in g["params"])
        for p, q in zip(plain.parameters(), wrapped.parameters(), strict=True):
            assert torch.equal(p.to_local(), q.to_local())
            assert q.grad is None
        assert set(on_shards.state) == set(wrapped.parameters())
        for p, state in on_shards.state.items():
            for value in state.values():
                if value.dim():
                    assert isinstance(value, DTensor) and value.placements == p.placements
        torch.testing.assert_close(
            dtensors_and_state(on_shards), dtensors_and_state(as_is), rtol=0, atol=0
        )

        again = make(restored.parameters())
        step_on_shards(again)
        # A copy: the state dict holds the optimizer's own tensors, which loading would share.
        state_dict = copy.deepcopy(get_optimizer_state_dict(wrapped, on_shards))
        set_optimizer_state_dict(restored, again, state_dict)  # DCP steps it once to make state
        torch.testing.assert_close(
            dtensors_and_state(again), dtensors_and_state(on_shards), rtol=0, atol=0
        )
    finally:
        torch.distributed.destroy_process_group()


def test_a_step_on_shards_runs_the_closure_skips_gradless_weights_and_restores_on_error() -> None:
    """Two parameter groups, one weight without a gradient: a closure passed to step runs with
    gradients on (as torch's step runs it) and its loss comes back; the weight without one is
    left alone, with no state. A step that fails leaves the groups and the state as they were.
    Wrapping twice wraps once, and the wrapped optimizer is freed as soon as it is dropped."""
    import weakref

    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor

    from volt.strategies.fsdp import step_on_shards

    store = torch.distributed.HashStore()
    torch.distributed.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        torch.manual_seed(0)
        holder = sharded_gpt(0, init_device_mesh("cpu", (1,)), vocab_size=16)
        params = list(holder.parameters())
        matrices = [p for p in params if p.dim() == 2]
        optimizer = torch.optim.AdamW(
            [{"params": matrices}, {"params": [p for p in params if p.dim() < 2]}], lr=0.1
        )
        step_on_shards(optimizer)
        wrapper = optimizer.step
        step_on_shards(optimizer)
        assert optimizer.step is wrapper
        untouched = matrices[-1]
        before = untouched.to_local().clone()

        def closure() -> Tensor:
            loss = holder.net(torch.randint(0, 16, (2, 8))).logsumexp(-1).mean()
            loss.backward()
            untouched.grad = None
            return loss

        with torch.no_grad():  # as Lightning's loop may call it
            loss = optimizer.step(closure)
        assert isinstance(loss, Tensor) and loss.requires_grad
        assert untouched not in optimizer.state
        assert torch.equal(untouched.to_local(), before)
        assert len(optimizer.state) == len(params) - 1

        groups = [list(g["params"]) for g in optimizer.param_groups]
        state = {p: {k: id(v) for k, v in s.items()} for p, s in optimizer.state.items()}
        closure()
        optimizer.param_groups[0]["lr"] = None  # the step fails before it changes anything
        with pytest.raises(TypeError):
            optimizer.step()
        assert [list(g["params"]) for g in optimizer.param_groups] == groups
        assert {p: {k: id(v) for k, v in s.items()} for p, s in optimizer.state.items()} == state
        assert all(
            isinstance(v, DTensor) for s in optimizer.state.values() for v in s.values() if v.dim()
        )

        fresh = torch.optim.AdamW(params, lr=0.1)
        step_on_shards(fresh)
        fresh.step()
        dropped = weakref.ref(fresh)
        del fresh
        assert dropped() is None  # no cycle through its step: freed without the collector
    finally:
        torch.distributed.destroy_process_group()


def test_layouts_the_shards_cannot_step_take_the_dtensor_step(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A gradient laid out unlike its parameter (replicated against sharded), and a
    differentiable optimizer, step on the DTensors as torch runs them: the same update, the same
    error."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor

    from volt.strategies.fsdp import step_on_shards

    store = torch.distributed.HashStore()
    torch.distributed.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        mesh = init_device_mesh("cpu", (1,))
        seen = spy_on_steps(monkeypatch, torch.optim.SGD)
        params = []
        for grad_placement in (Replicate(), Shard(0)):
            p = torch.nn.Parameter(distribute_tensor(torch.ones(4, 2), mesh, [Shard(0)]))
            p.grad = distribute_tensor(torch.full((4, 2), 2.0), mesh, [grad_placement])
            params.append(p)
        replicated_grad = torch.optim.SGD([params[0]], lr=0.1)
        step_on_shards(replicated_grad)
        replicated_grad.step()
        torch.testing.assert_close(params[0].full_tensor(), torch.full((4, 2), 0.8))
        differentiable = torch.optim.SGD([params[1]], lr=0.1, differentiable=True)
        step_on_shards(differentiable)
        with pytest.raises(RuntimeError, match="leaf Variable"):  # torch's own, on DTensors too
            differentiable.step()
        assert seen == {id(replicated_grad): [{DTensor}], id(differentiable): [{DTensor}]}
    finally:
        torch.distributed.destroy_process_group()


def test_an_optimizer_with_step_hooks_steps_on_the_dtensors_as_torch_runs_it() -> None:
    """A step pre-hook runs before the closure and sees the DTensors, as without volt."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor

    from volt.strategies.fsdp import step_on_shards

    store = torch.distributed.HashStore()
    torch.distributed.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        torch.manual_seed(0)
        holder = sharded_gpt(0, init_device_mesh("cpu", (1,)), vocab_size=16)
        optimizer = torch.optim.SGD(holder.parameters(), lr=0.1)
        step_on_shards(optimizer)
        calls: list[str] = []

        def hook(opt: torch.optim.Optimizer, *_: Any) -> None:
            types = {type(p) for g in opt.param_groups for p in g["params"]}
            calls.append(f"hook {sorted(t.__name__ for t in types)}")

        def closure() -> Tensor:
            calls.append("closure")
            loss = holder.net(torch.randint(0, 16, (2, 8))).logsumexp(-1).mean()
            loss.backward()
            return loss

        optimizer.register_step_pre_hook(hook)
        optimizer.step(closure)
        assert calls == ["hook ['DTensor']", "closure"]
        assert all(isinstance(v, DTensor) for s in optimizer.state.values() for v in s.values())
    finally:
        torch.distributed.destroy_process_group()


def test_optimizers_that_are_not_elementwise_keep_their_own_step() -> None:
    """Only torch's AdamW, Adam and SGD themselves step on shards: a subclass, whose step may do
    anything, and an optimizer of another kind keep their step."""
    from volt.strategies.fsdp import step_on_shards

    class Custom(torch.optim.AdamW):
        pass

    params = [torch.nn.Parameter(torch.ones(2))]
    for optimizer in (Custom(params), torch.optim.LBFGS(params), torch.optim.RMSprop(params)):
        step_on_shards(optimizer)
        assert optimizer.step.__func__ is type(optimizer).step  # type: ignore[attr-defined]
    wrapped = torch.optim.SGD(params)
    step_on_shards(wrapped)
    assert wrapped.step.__qualname__ == "step_on_shards.<locals>.step"


def step_on_rank(rank: int, init_file: str, out_dir: Path) -> None:
    """On each of two gloo ranks, `odd_shards_on_rank`'s net (rank 1 holds empty shards): two
    fused AdamW steps on the shards of this rank's own batches.
    Rank 0 saves the gathered weights before, each step's gathered gradients, the types AdamW's
    own step ran on, and the gathered weights and state after."""
    from volt.strategies.fsdp import step_on_shards

    holder, _ = odd_shards_on_rank(rank, init_file)
    stepped: list[set[type]] = []  # what AdamW's own step ran on: the shards, not the DTensors
    adamw_step = torch.optim.AdamW.step

    def recorded(self: torch.optim.Optimizer, *args: Any, **kwargs: Any) -> Any:
        stepped.append({type(p) for group in self.param_groups for p in group["params"]})
        return adamw_step(self, *args, **kwargs)

    torch.optim.AdamW.step = recorded  # type: ignore[method-assign]  # (this rank's process)
    optimizer = torch.optim.AdamW(holder.parameters(), lr=0.01, fused=True)
    step_on_shards(optimizer)
    params = list(holder.parameters())
    saved: dict[str, Any] = {"before": [p.full_tensor() for p in params], "grads": []}
    saved["stepped"] = stepped
    torch.manual_seed(1 + rank)
    for _ in range(2):
        loss = holder.net(torch.randint(0, 256, (2, 16))).logsumexp(-1).mean()
        (loss + holder.odd(torch.randn(4, 5)).square().mean()).backward()
        saved["grads"].append([p.grad.full_tensor() for p in params])
        optimizer.step()
        optimizer.zero_grad()
    saved["after"] = [p.full_tensor() for p in params]
    saved["state"] = [
        {k: v.full_tensor() if v.dim() else v for k, v in optimizer.state[p].items()}
        for p in params
    ]
    save_on_rank_zero_and_leave(rank, saved, out_dir / "steps.pt")


@pytest.mark.slow
def test_stepping_on_shards_steps_as_torch_steps_the_whole_weights(tmp_path: Path) -> None:
    """Two real ranks (~10 s), each stepping only its part of each weight (some none): the
    weights and state (moments, step), gathered, are those of fused AdamW on the whole weights
    and gradients."""
    import torch.multiprocessing as mp

    mp.spawn(step_on_rank, args=(str(tmp_path / "rendezvous"), tmp_path), nprocs=2)
    saved = torch.load(tmp_path / "steps.pt")
    whole = [torch.nn.Parameter(w.clone()) for w in saved["before"]]
    optimizer = torch.optim.AdamW(whole, lr=0.01, fused=True)
    for grads in saved["grads"]:
        for p, g in zip(whole, grads, strict=True):
            p.grad = g
        optimizer.step()
    assert saved["stepped"] == [{torch.Tensor}] * 2
    assert not torch.equal(saved["after"][0], saved["before"][0])  # it stepped
    torch.testing.assert_close(saved["after"], [p.detach() for p in whole])
    torch.testing.assert_close(saved["state"], [optimizer.state[p] for p in whole])
