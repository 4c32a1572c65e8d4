"""float8=true: refused in one line where it cannot train, and where it can, torchao's Float8Linear
in place of the GPT's block layers (not its LM head), applied by volt.build before compile."""

import importlib.util
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from omegaconf import DictConfig, OmegaConf
from torch import nn

from volt import gpu
from volt.build import build_training
from volt.config.validation import check_config, check_machine
from volt.errors import ConfigError
from volt.gpu import apply_float8, converts_to_float8, float8_unavailable
from volt.nets.gpt import GPT

Compose = Callable[..., DictConfig]
HAS_TORCHAO = importlib.util.find_spec("torchao") is not None
needs_torchao = pytest.mark.skipif(not HAS_TORCHAO, reason="torchao (the float8 extra) is absent")
# gpt_1b's shape scaled down so that building it takes no time: every dim a multiple of 16.
SMALL = ["model.net.n_layer=2", "model.net.n_head=2", "model.net.n_embd=32", "data.block_size=32"]


def small_gpt() -> GPT:
    torch.manual_seed(0)
    return GPT(block_size=16, n_layer=2, n_head=4, n_embd=32)


def one_line(message: str | None) -> str:
    assert message is not None
    assert "\n" not in message
    return message


def test_gpt_1b_with_float8_composes_and_passes_the_config_checks(compose_config: Compose) -> None:
    cfg = compose_config("train", ["experiment=gpt_1b", "float8=true"])
    check_config(cfg)
    assert cfg.float8 is True
    assert cfg.trainer.strategy._target_ == "volt.strategies.fsdp.FSDPStrategy"


def test_a_float8_value_other_than_true_or_false_is_refused(compose_config: Compose) -> None:
    cfg = compose_config("train", ["experiment=gpt_1b", "float8=yes"])
    with pytest.raises(ConfigError, match=r"^float8='yes' is not valid: use true or false"):
        check_config(cfg)


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA GPU")
def test_float8_without_a_gpu_is_refused_before_the_run(compose_config: Compose) -> None:
    cfg = compose_config("train", ["experiment=gpt_1b", "float8=true", "trainer=cpu"])
    with pytest.raises(ConfigError) as refused:
        check_machine(cfg)
    assert one_line(str(refused.value)).startswith("float8=true but no CUDA GPU is visible here")
    assert "use float8=false" in str(refused.value)
    check_machine(compose_config("train", ["experiment=gpt_1b", "trainer=cpu"]))  # false: no check


def test_float8_on_a_gpu_without_float8_tensor_cores_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *_: (8, 0))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *_: "NVIDIA A100-SXM4-80GB")
    message = one_line(float8_unavailable())
    assert message.startswith("float8=true but NVIDIA A100-SXM4-80GB (compute capability 8.0)")
    assert message.endswith("use float8=false")


def test_float8_without_torchao_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *_: (9, 0))
    monkeypatch.setattr(
        gpu.importlib.util,
        "find_spec",
        lambda name, *rest: None if name == "torchao" else find_spec(name, *rest),
    )
    message = one_line(float8_unavailable())
    assert message.startswith("float8=true needs the torchao package, which is not installed")
    assert "pip install -e '.[float8]'" in message


def test_the_filter_takes_linear_layers_with_dims_of_16_except_the_lm_head() -> None:
    assert converts_to_float8(nn.Linear(32, 96), "blocks.0.attn.qkv")
    assert not converts_to_float8(nn.Linear(24, 32), "blocks.0.mlp.fc")  # 24 is not 16k
    assert not converts_to_float8(nn.Linear(32, 40), "blocks.0.mlp.fc")
    assert not converts_to_float8(nn.Linear(32, 256), "lm_head")
    assert not converts_to_float8(nn.LayerNorm(32), "ln_f")


@needs_torchao
def test_conversion_swaps_the_block_layers_and_leaves_the_head_tied() -> None:
    from torchao.float8.float8_linear import Float8Linear

    net = small_gpt()
    keys = list(net.state_dict())
    apply_float8(net)
    swapped = {name for name, m in net.named_modules() if isinstance(m, Float8Linear)}
    layers = ("attn.qkv", "attn.proj", "mlp.fc", "mlp.proj")
    assert swapped == {f"blocks.{i}.{layer}" for i in range(2) for layer in layers}
    assert type(net.lm_head) is nn.Linear
    assert net.lm_head.weight is net.tok_emb.weight
    assert list(net.state_dict()) == keys  # checkpoints load with or without float8


@needs_torchao
def test_a_float8_net_trains_close_to_the_float32_one_on_the_cpu() -> None:
    # torch 2.14's CPU float8 matmul (torch._scaled_mm) runs what the GPU's tensor cores would.
    reference, net = small_gpt(), small_gpt()
    apply_float8(net)
    idx = torch.randint(256, (2, 16), generator=torch.Generator().manual_seed(1))
    for model in (reference, net):
        model(idx).float().logsumexp(-1).mean().backward()
    out, expected = net(idx).flatten(), reference(idx).flatten()
    assert torch.cosine_similarity(out, expected, dim=0) > 0.99
    for (name, p), q in zip(net.named_parameters(), reference.parameters(), strict=True):
        assert p.grad is not None and p.grad.abs().sum() > 0, name
        assert torch.cosine_similarity(p.grad.flatten(), q.grad.flatten(), dim=0) > 0.9, name


@needs_torchao
def test_build_converts_the_net_when_float8_is_on(compose_config: Compose, tmp_path: Path) -> None:
    from torchao.float8.float8_linear import Float8Linear

    overrides = ["experiment=gpt_1b", "trainer=cpu", "compile=off", f"paths.data_dir={tmp_path}"]
    for on in (False, True):
        cfg = compose_config("train", [*overrides, *SMALL, f"float8={str(on).lower()}"])
        run = build_training(cfg, OmegaConf.to_container(cfg, resolve=True))  # type: ignore[arg-type]
        net = run.model.net
        assert isinstance(net.blocks[0].mlp.fc, Float8Linear) is on
        assert type(net.lm_head) is nn.Linear
