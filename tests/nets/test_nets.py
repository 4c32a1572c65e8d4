import io
import re
from collections.abc import Callable

import pytest
import torch
from torch import nn

from volt.nets.cnn import SmallCNN
from volt.nets.mlp import MLP
from volt.nets.resnet import ResNet

# (C, H, W) of digits, MNIST and CIFAR-10
SHAPES = {"digits": (1, 8, 8), "mnist": (1, 28, 28), "cifar10": (3, 32, 32)}

NETS: dict[str, Callable[[tuple[int, int, int]], nn.Module]] = {
    "mlp": lambda shape: MLP(shape, 10, hidden_sizes=[32, 16], dropout=0.1),
    "cnn": lambda shape: SmallCNN(shape, 10, channels=[8, 16, 16], hidden_size=16, dropout=0.1),
    "resnet": lambda shape: ResNet(shape, 10, widths=[8, 16, 16], blocks_per_stage=[1, 2, 1]),
}

every_net_and_shape = pytest.mark.parametrize(
    ("net_name", "data_name"), [(net, data) for net in NETS for data in SHAPES]
)


def build(net_name: str, data_name: str, seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return NETS[net_name](SHAPES[data_name])


@every_net_and_shape
def test_forward_gives_one_logit_per_class(net_name: str, data_name: str) -> None:
    net = build(net_name, data_name)
    x = torch.randn(4, *SHAPES[data_name])
    assert net(x).shape == (4, 10)
    net.eval()  # BatchNorm in eval mode also takes a single sample
    out = net(x[:1])
    assert out.shape == (1, 10)
    assert torch.isfinite(out).all()


@every_net_and_shape
def test_gradients_reach_every_parameter(net_name: str, data_name: str) -> None:
    net = build(net_name, data_name)
    x = torch.randn(8, *SHAPES[data_name], requires_grad=True)
    nn.functional.cross_entropy(net(x), torch.arange(8) % 10).backward()
    for name, parameter in net.named_parameters():
        assert parameter.grad is not None, name
        assert torch.isfinite(parameter.grad).all(), name
        assert parameter.grad.abs().sum() > 0, name
    assert x.grad is not None and x.grad.abs().sum() > 0


def test_small_cnn_keeps_at_least_2x2_on_8x8_digits() -> None:
    # 8 -> 4 -> 2, then no more pooling: a third stage must not shrink the map to 1x1
    features = SmallCNN((1, 8, 8), 10, channels=[8, 16, 32]).features
    assert features(torch.randn(2, 1, 8, 8)).shape == (2, 32, 2, 2)


def test_small_cnn_pools_once_per_stage_on_larger_images() -> None:
    features = SmallCNN((3, 32, 32), 10, channels=[8, 16, 32]).features
    assert features(torch.randn(2, 3, 32, 32)).shape == (2, 32, 4, 4)


def test_resnet_halves_resolution_in_each_stage_after_the_first() -> None:
    net = ResNet((3, 32, 32), 10, widths=[8, 16, 32], blocks_per_stage=[2, 1, 1])
    assert net.stages(net.stem(torch.randn(2, 3, 32, 32))).shape == (2, 32, 8, 8)
    assert len(net.stages) == 4


@pytest.mark.parametrize(("widths", "blocks"), [([8, 16], [1]), ([8], [1, 1, 1])])
def test_resnet_with_mismatched_stages_names_both_keys(
    widths: list[int], blocks: list[int]
) -> None:
    with pytest.raises(ValueError, match=re.escape("model.net.widths has")) as error:
        ResNet((3, 32, 32), 10, widths=widths, blocks_per_stage=blocks)
    message = str(error.value)
    assert "model.net.blocks_per_stage" in message
    assert f"{len(widths)} stages" in message
    assert f"has {len(blocks)}" in message


@pytest.mark.parametrize("net_name", NETS)
def test_state_dict_round_trip_reproduces_the_outputs(net_name: str) -> None:
    net = build(net_name, "cifar10", seed=0)
    net(torch.randn(8, 3, 32, 32))  # move BatchNorm running statistics off their defaults
    net.eval()
    buffer = io.BytesIO()
    torch.save(net.state_dict(), buffer)
    buffer.seek(0)

    restored = build(net_name, "cifar10", seed=1).eval()
    x = torch.randn(3, 3, 32, 32)
    assert not torch.allclose(restored(x), net(x))
    restored.load_state_dict(torch.load(buffer, weights_only=True))
    assert torch.equal(restored(x), net(x))
