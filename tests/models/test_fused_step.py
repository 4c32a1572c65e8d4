"""model.fused_optimizer for the classifier: torch's fused step where the parameters are on CUDA,
on the CPU only when asked, refused in one line where the optimiser has none."""

from functools import partial
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch import nn

from volt.models.classifier import Classifier
from volt.models.fused_step import fused_options


def classifier(optimizer: Any, fused: bool | None = None) -> Classifier:
    net = nn.Sequential(nn.Flatten(), nn.Linear(12, 3))
    return Classifier(net, num_classes=3, optimizer=optimizer, fused_optimizer=fused)


RESNET_SGD = partial(torch.optim.SGD, lr=0.1, momentum=0.9, nesterov=True, weight_decay=5e-4)


@pytest.mark.parametrize(("fused", "expected"), [(None, False), (True, True), (False, False)])
def test_fused_sgd_on_the_cpu_only_when_asked(fused: bool | None, expected: bool) -> None:
    optimizer = classifier(RESNET_SGD, fused).configure_optimizers()
    assert isinstance(optimizer, torch.optim.SGD)
    assert bool(optimizer.defaults["fused"]) is expected


def test_a_fused_sgd_step_matches_the_unfused_one() -> None:
    models = [classifier(RESNET_SGD, fused) for fused in (False, True)]
    models[1].load_state_dict(models[0].state_dict())
    x, y = torch.randn(8, 12), torch.randint(0, 3, (8,))
    for model in models:
        optimizer = model.configure_optimizers()
        assert isinstance(optimizer, torch.optim.Optimizer)
        for _ in range(3):
            optimizer.zero_grad()
            model.criterion(model(x), y).backward()
            optimizer.step()
    for a, b in zip(models[0].parameters(), models[1].parameters(), strict=True):
        torch.testing.assert_close(a, b)


def test_an_optimizer_without_a_fused_step_or_a_fused_it_would_override_is_refused() -> None:
    with pytest.raises(ValueError, match=r"model.fused_optimizer=true, but .*RMSprop.* has no"):
        classifier(partial(torch.optim.RMSprop, lr=0.1), fused=True)
    with pytest.raises(ValueError, match=r"model.optimizer.fused=True would be overridden"):
        classifier(partial(torch.optim.SGD, lr=0.1, fused=True))
    plain = classifier(partial(torch.optim.RMSprop, lr=0.1)).configure_optimizers()
    assert isinstance(plain, torch.optim.RMSprop)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_fused_sgd_by_default_on_cuda() -> None:
    optimizer = classifier(RESNET_SGD).cuda().configure_optimizers()
    assert isinstance(optimizer, torch.optim.SGD)
    assert optimizer.defaults["fused"] is True


def on_cuda_by_name(model: Classifier) -> Classifier:
    """The model as configure_optimizers sees it on a GPU (its device), weights left on the CPU:
    which `fused=` volt would ask for there."""
    model._device = torch.device("cuda", 0)
    return model


def asked_fused(model: Classifier) -> bool | None:
    return fused_options(model, model.optimizer_factory, model.fused_optimizer).get("fused")


def test_on_cuda_fused_by_default_except_where_torch_cannot() -> None:
    assert asked_fused(on_cuda_by_name(classifier(RESNET_SGD))) is True
    foreach = partial(torch.optim.AdamW, lr=1e-3, foreach=True)
    assert asked_fused(on_cuda_by_name(classifier(foreach))) is False
    sparse = on_cuda_by_name(classifier(RESNET_SGD))
    sparse.net.append(nn.Embedding(4, 2, sparse=True))
    assert asked_fused(sparse) is False
    with pytest.raises(ValueError, match=r"fused_optimizer=true and model.optimizer.foreach=true"):
        classifier(foreach, fused=True)


def test_sgd_over_fsdp2_weights_is_not_fused_adamw_is(tmp_path: Path) -> None:
    """FSDP2's DTensor weights: torch has no sharding rule for SGD's fused kernel (its first step
    would raise NotImplementedError), AdamW's it has."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    dist.init_process_group(
        "gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1
    )
    try:
        for optimizer, fused in ((RESNET_SGD, False), (partial(torch.optim.AdamW, lr=1e-3), True)):
            model = classifier(optimizer)
            fully_shard(model.net, mesh=init_device_mesh("cpu", (1,)))
            assert asked_fused(on_cuda_by_name(model)) is fused
    finally:
        dist.destroy_process_group()
