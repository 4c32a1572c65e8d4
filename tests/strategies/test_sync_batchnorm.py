"""volt's SyncBatchNorm against BatchNorm over the whole global batch in one process.

Two real ranks (gloo on the CPU, NCCL on two GPUs) each normalise their slice of one global batch;
outputs, input gradients, summed weight gradients and running statistics must match a single
`nn.BatchNorm` that saw the whole batch, for uneven slices and for a rank with an empty slice,
in float32, float64, bfloat16 inputs to a float32 layer (autocast) and a float16 layer.
"""

import copy
import datetime
import socket
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from lightning.pytorch.plugins import LayerSync
from torch import nn
from torch._dynamo.testing import CompileCounter
from torch.nn.modules.batchnorm import _BatchNorm

from volt.build import build_training
from volt.nets.resnet import ResNet
from volt.strategies.ddp import DDPStrategy
from volt.strategies.sync_batchnorm import (
    BatchNormNd,
    SyncBatchNorm,
    SyncBatchNormLayers,
    convert_batchnorm,
)

WORLD_SIZE = 2
CHANNELS = 4
STEPS = 2  # two steps: the running statistics are updated from updated ones


@dataclass(frozen=True)
class Case:
    slices: tuple[int, int]  # samples on rank 0 and rank 1
    momentum: float | None = 0.1
    affine: bool = True
    channels_last: bool = False
    spatial: tuple[int, ...] = (3, 5)  # () for BatchNorm1d on (N, C)
    track_running_stats: bool = True
    input_dtype: torch.dtype = torch.float32
    layer_dtype: torch.dtype = torch.float32
    atol: float = 1e-4  # and rtol

    def batch(self, step: int) -> torch.Tensor:
        generator = torch.Generator().manual_seed(step)
        shape = (sum(self.slices), CHANNELS, *self.spatial)
        # An offset mean makes a merge that subtracts large squares visibly wrong.
        batch = torch.randn(shape, generator=generator, dtype=torch.float64) * 3 + 5
        return batch.to(self.input_dtype).double()  # the values the ranks see

    def output_weights(self, step: int) -> torch.Tensor:
        generator = torch.Generator().manual_seed(100 + step)
        return torch.randn(self.batch(step).shape, generator=generator, dtype=torch.float64)

    def batchnorm(self) -> nn.Module:
        kind = nn.BatchNorm1d if not self.spatial else nn.BatchNorm2d
        return kind(
            CHANNELS,
            momentum=self.momentum,
            affine=self.affine,
            track_running_stats=self.track_running_stats,
        )


CASES = [
    Case(slices=(5, 3)),
    Case(slices=(0, 6)),  # rank 0 has nothing this step
    Case(slices=(4, 4), momentum=None, affine=False),
    Case(slices=(6, 2), channels_last=True),
    Case(slices=(3, 5), spatial=()),
    # CUDA's kernels round bfloat16 inputs' sums to bfloat16: 0.06 apart at 11
    Case(slices=(5, 3), track_running_stats=False, input_dtype=torch.bfloat16, atol=1e-1),
    Case(slices=(5, 3), input_dtype=torch.float16, layer_dtype=torch.float16, atol=2e-2),
    # float32 arithmetic would be off by about 1e-6
    Case(slices=(0, 6), input_dtype=torch.float64, layer_dtype=torch.float64, atol=1e-10),
]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def run_ranks(
    rank: int, port: int, backend: str, out_dir: Path, compiled: dict[str, Any] | None = None
) -> None:
    """One rank: every case, its slice of each step's batch, results saved for the test; with
    `compiled`, the layer runs under torch.compile(**compiled), in one graph where it can be."""
    # A collective waits this long for a lost peer, then fails, so no rank outlives the test
    # for long (NCCL's default is 10 minutes, gloo's 30).
    dist.init_process_group(
        backend,
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=WORLD_SIZE,
        timeout=datetime.timedelta(seconds=60),
    )
    device = torch.device("cuda", rank) if backend == "nccl" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    layers = SyncBatchNormLayers()
    group = layers.apply(nn.BatchNorm1d(1)).process_group
    assert group is not None
    results = []
    for index, case in enumerate(CASES):
        layer = layers.apply(case.batchnorm())
        assert type(layer) is SyncBatchNorm and layer.process_group is group  # made once
        if index % 2:
            # A copy syncs over the default group: a process group cannot be pickled.
            layer = copy.deepcopy(layer)
            assert layer.process_group is None
        layer = layer.to(device, case.layer_dtype).train()
        run = layer
        if compiled:
            torch._dynamo.reset()  # each case's layer compiled afresh, not against the limit
            # momentum=None reads the step count on the host (.item()): a graph break
            run = torch.compile(layer, fullgraph=case.momentum is not None, **compiled)
        start = sum(case.slices[:rank])
        rows = slice(start, start + case.slices[rank])
        steps = []
        for step in range(STEPS):
            # Lower precision on the ranks, as in training; the reference runs in float64.
            x = case.batch(step)[rows].to(device, case.input_dtype).requires_grad_()
            if case.channels_last:
                x = x.detach().to(memory_format=torch.channels_last).requires_grad_()
            layer.zero_grad()
            out = run(x)
            assert out.dtype == case.input_dtype
            weights = case.output_weights(step)[rows].to(device)
            (out * weights.to(torch.promote_types(out.dtype, torch.float32))).sum().backward()
            steps.append(
                {
                    "out": out.detach().cpu(),
                    "grad_input": x.grad.cpu() if x.grad is not None else torch.zeros(x.shape),
                    "grads": [
                        p.grad.cpu() if p.grad is not None else torch.zeros(p.shape)
                        for p in layer.parameters()
                    ],
                }
            )
        buffers = {name: value.cpu() for name, value in layer.named_buffers()}
        results.append({"steps": steps, "buffers": buffers})
    torch.save(results, out_dir / f"rank{rank}.pt")
    layers.revert(layer)  # as Lightning at the fit's end: CUDA graphs freed before the groups go
    dist.destroy_process_group()


def reference(case: Case) -> dict:
    layer = case.batchnorm().double().train()
    steps = []
    for step in range(STEPS):
        x = case.batch(step).requires_grad_()
        layer.zero_grad()
        out = layer(x)
        (out * case.output_weights(step)).sum().backward()
        steps.append(
            {
                "out": out.detach(),
                "grad_input": x.grad,
                "grads": [p.grad for p in layer.parameters()],
            }
        )
    return {"steps": steps, "buffers": dict(layer.named_buffers())}


def check_against_reference(out_dir: Path) -> None:
    ranks = [torch.load(out_dir / f"rank{r}.pt") for r in range(WORLD_SIZE)]
    for index, case in enumerate(CASES):
        expected = reference(case)
        for step in range(STEPS):
            got = [ranks[r][index]["steps"][step] for r in range(WORLD_SIZE)]
            want = expected["steps"][step]
            for key in ("out", "grad_input"):
                joined = torch.cat([g[key] for g in got]).double()
                assert_close(joined, want[key], case, f"step {step} {key}")
            # Each rank holds the gradient of its own slice; DDP sums (then averages) them.
            for position, grad in enumerate(want["grads"]):
                summed = sum(g["grads"][position].double() for g in got)
                assert_close(summed, grad, case, f"step {step} parameter {position} grad")
        for rank in range(WORLD_SIZE):
            for name, value in expected["buffers"].items():
                got_buffer = ranks[rank][index]["buffers"][name].to(value.dtype)
                assert_close(got_buffer, value, case, f"rank {rank} {name}")


def assert_close(got: torch.Tensor, want: torch.Tensor, case: Case, what: str) -> None:
    torch.testing.assert_close(
        got, want, atol=case.atol, rtol=case.atol, msg=lambda message: f"{case} {what}\n{message}"
    )


def test_two_cpu_ranks_normalise_over_the_global_batch(tmp_path: Path) -> None:
    mp.spawn(run_ranks, args=(free_port(), "gloo", tmp_path), nprocs=WORLD_SIZE)
    check_against_reference(tmp_path)


def test_two_cpu_ranks_compiled_trace_the_layer_whole(tmp_path: Path) -> None:
    # dynamo and AOT autograd's graphs (inductor's CPU code adds nothing here): forward and
    # backward with their collectives (the functional ones NCCL takes too) in one graph, the
    # same results as the reference.
    compiled = {"backend": "aot_eager"}
    mp.spawn(run_ranks, args=(free_port(), "gloo", tmp_path, compiled), nprocs=WORLD_SIZE)
    check_against_reference(tmp_path)


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_two_gpu_ranks_normalise_over_the_global_batch(tmp_path: Path) -> None:
    mp.spawn(run_ranks, args=(free_port(), "nccl", tmp_path), nprocs=WORLD_SIZE)
    check_against_reference(tmp_path)


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_two_gpu_ranks_in_cuda_graphs_normalise_over_the_global_batch(tmp_path: Path) -> None:
    # compile=reduce-overhead: inductor's kernels and the NCCL collectives captured in CUDA
    # graphs. Each case compiles afresh (dynamo's reset frees the graphs before), so the last
    # case's, over the default group, are alive when the ranks revert and destroy their groups.
    compiled = {"mode": "reduce-overhead"}
    mp.spawn(run_ranks, args=(free_port(), "nccl", tmp_path, compiled), nprocs=WORLD_SIZE)
    check_against_reference(tmp_path)


def test_without_a_process_group_it_is_plain_batchnorm() -> None:
    torch.manual_seed(0)
    plain = nn.BatchNorm2d(CHANNELS)
    synced = convert_batchnorm(nn.BatchNorm2d(CHANNELS))
    x = torch.randn(6, CHANNELS, 3, 3)
    torch.testing.assert_close(synced(x), plain(x))
    torch.testing.assert_close(synced.running_var, plain.running_var)


def small_resnet() -> nn.Module:
    return ResNet(in_shape=(3, 8, 8), num_classes=10, widths=[8, 16], blocks_per_stage=[1, 1])


def test_conversion_shares_tensors_and_reverts_to_the_same_classes_and_state_dict() -> None:
    net = small_resnet()
    classes = [type(m) for m in net.modules()]
    before = {name: value.clone() for name, value in net.state_dict().items()}
    originals = [m for m in net.modules() if isinstance(m, _BatchNorm)]
    layers = SyncBatchNormLayers()
    converted = layers.apply(net)
    batchnorms = [m for m in converted.modules() if isinstance(m, _BatchNorm)]
    assert batchnorms and all(type(m) is SyncBatchNorm for m in batchnorms)
    for original, layer in zip(originals, batchnorms, strict=True):
        assert layer.weight is original.weight and layer.running_var is original.running_var
    # torch's converted layers are replaced too, and revert to BatchNorm of any dimensions
    again = convert_batchnorm(nn.SyncBatchNorm.convert_sync_batchnorm(small_resnet()))
    assert not any(isinstance(m, nn.SyncBatchNorm) for m in again.modules())
    assert {type(m) for m in layers.revert(again).modules() if isinstance(m, _BatchNorm)} == {
        BatchNormNd
    }
    reverted = layers.revert(converted)
    assert [type(m) for m in reverted.modules()] == classes
    after = reverted.state_dict()
    assert after.keys() == before.keys()
    for name, value in before.items():
        torch.testing.assert_close(after[name], value)


def recompiles_after_revert(rank: int, world: int, port: int, out_dir: Path) -> None:
    """One rank: for a net with BatchNorm and one without, whether a function compiled before
    the fit's end (`revert`) is compiled again after it, i.e. torch.compile's code was dropped."""
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world
    )
    import torch._inductor.cudagraph_trees  # as a compile=reduce-overhead run has

    counter = CompileCounter()
    square = torch.compile(lambda x: x * x, backend=counter)
    recompiles = {}
    for name, net in [("batchnorm", small_resnet()), ("no batchnorm", nn.Linear(4, 4))]:
        square(torch.ones(3))
        before = counter.frame_count
        layers = SyncBatchNormLayers()
        layers.revert(layers.apply(net))
        square(torch.ones(3))
        recompiles[name] = counter.frame_count - before
    torch.save(recompiles, out_dir / f"rank{rank}.pt")
    dist.destroy_process_group()


@pytest.mark.parametrize("world", [1, 2])
def test_fit_end_drops_compiled_code_once_layers_talked_to_other_ranks(
    tmp_path: Path, world: int
) -> None:
    # Their collectives may sit in CUDA graphs, and destroying the group then hangs
    # (pytorch/pytorch#115388): the graphs go, and the compiled code bound to them with them.
    # With no layer that talked to another rank, compiled code (a test's graphs) is kept.
    mp.spawn(recompiles_after_revert, args=(world, free_port(), tmp_path), nprocs=world)
    expected = {"batchnorm": int(world > 1), "no batchnorm": 0}
    assert [torch.load(tmp_path / f"rank{r}.pt") for r in range(world)] == [expected] * world


class KeepModel(LayerSync):
    def apply(self, model: nn.Module) -> nn.Module:
        return model

    def revert(self, model: nn.Module) -> nn.Module:
        return model


def test_sync_batchnorm_true_builds_volts_layers(compose_config: Callable[..., Any]) -> None:
    # The choice is made in one place, volt.build.apply_toggles: volt's layers as the Trainer's
    # LayerSync plugin, and Lightning's own sync_batchnorm switched off.
    cfg = compose_config("train", ["trainer=ddp", "trainer.devices=2"])
    assert cfg.trainer.sync_batchnorm is True
    trainer = build_training(cfg, {}).trainer
    assert type(trainer.strategy._layer_sync) is SyncBatchNormLayers


def test_ddp_strategy_leaves_a_layer_sync_plugin_of_the_users_own(tmp_path: Path) -> None:
    strategy = DDPStrategy(tmp_path / "config.yaml")
    pl.Trainer(accelerator="cpu", devices=2, strategy=strategy, logger=False, plugins=[KeepModel()])
    assert type(strategy._layer_sync) is KeepModel
