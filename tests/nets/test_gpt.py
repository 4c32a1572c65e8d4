from dataclasses import asdict

import pytest
import torch
from omegaconf import OmegaConf
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from volt.config import CONF_DIR
from volt.nets.gpt import GPT, GPTConfig

V, BLOCK, LAYERS, WIDTH = 256, 16, 2, 32


def small_gpt(seed: int = 0, **changes: object) -> GPT:
    torch.manual_seed(seed)
    kwargs: dict[str, object] = dict(block_size=BLOCK, n_layer=LAYERS, n_head=4, n_embd=WIDTH)
    return GPT(**{**kwargs, **changes})  # type: ignore[arg-type]


def tokens(batch: int, length: int, seed: int = 1) -> torch.Tensor:
    return torch.randint(V, (batch, length), generator=torch.Generator().manual_seed(seed))


def test_forward_gives_next_token_logits_at_every_position() -> None:
    net = small_gpt()
    assert net(tokens(3, 10)).shape == (3, 10, V)
    assert net(tokens(2, BLOCK)).shape == (2, BLOCK, V)
    with pytest.raises(ValueError, match=f"longer than block_size={BLOCK}"):
        net(tokens(1, BLOCK + 1))


def test_builds_from_keyword_arguments_and_from_a_config() -> None:
    config = GPTConfig(block_size=8, n_layer=1, n_head=2, n_embd=16, dropout=0.1, bias=True)
    net = GPT(**asdict(config))
    assert net.config == config
    assert net.blocks[0].attn.qkv.bias is not None  # bias=True reached the layers


def test_rejects_a_width_that_does_not_split_into_heads() -> None:
    with pytest.raises(ValueError, match=r"n_embd=30 does not split into n_head=4.*n_head=3"):
        GPT(n_embd=30, n_head=4)


@pytest.mark.parametrize("dropout", [0.0, 0.2])
def test_a_future_token_does_not_change_earlier_logits(dropout: float) -> None:
    net = small_gpt(dropout=dropout).eval()
    idx = tokens(2, BLOCK)
    changed = idx.clone()
    changed[:, 9] = (changed[:, 9] + 1) % V
    before, after = net(idx), net(changed)
    torch.testing.assert_close(after[:, :9], before[:, :9], rtol=0, atol=1e-6)
    assert not torch.allclose(after[:, 9:], before[:, 9:])  # the change is seen from there on


def test_without_tying_the_head_has_its_own_table_and_counts_it_once() -> None:
    tied, untied = small_gpt(), small_gpt(tie_weights=False)
    assert untied.lm_head.weight is not untied.tok_emb.weight
    table = V * WIDTH
    assert untied.num_params(non_embedding=False) == tied.num_params(non_embedding=False) + table
    # The token table is then a lookup only, the head a matrix product like the blocks' own.
    assert untied.num_params() == tied.num_params()
    decay, _ = untied.param_groups(0.1)
    assert any(p is untied.lm_head.weight for p in decay["params"])
    assert any(p is untied.tok_emb.weight for p in decay["params"])


def test_written_out_attention_computes_what_sdpa_does() -> None:
    fused, written = small_gpt(), small_gpt(sdpa=False)
    written.load_state_dict(fused.state_dict())
    idx = tokens(3, BLOCK)
    torch.testing.assert_close(written(idx), fused(idx), rtol=1e-4, atol=1e-5)


def test_written_out_attention_drops_weights_in_training_only() -> None:
    attention = small_gpt(sdpa=False, dropout=0.5).blocks[0].attn
    x = torch.randn(2, BLOCK, WIDTH)
    evaluated = attention.eval()(x)
    torch.testing.assert_close(attention(x), evaluated)
    attention.train()
    attention.resid_dropout.p = 0.0  # only the attention weights' own dropout is left
    assert not torch.allclose(attention(x), evaluated)


def test_lm_head_shares_the_token_embedding() -> None:
    net = small_gpt()
    assert net.lm_head.weight is net.tok_emb.weight
    # One shared table: a step through the head moves the embedding the model reads with.
    before = net.tok_emb.weight.detach().clone()
    loss = nn.functional.cross_entropy(
        net(tokens(2, 8)).flatten(0, 1), tokens(2, 8, seed=2).flatten()
    )
    loss.backward()
    torch.optim.SGD(net.parameters(), lr=1.0).step()
    assert not torch.equal(net.tok_emb.weight, before)
    assert net.lm_head.weight is net.tok_emb.weight


def test_parameter_count_holds_the_shared_table_once() -> None:
    net = small_gpt()
    d = WIDTH
    # per block: qkv 3d^2 + proj d^2 + fc 4d^2 + proj 4d^2, and two LayerNorm gains (no biases)
    blocks = LAYERS * (12 * d * d + 2 * d)
    expected = V * d + BLOCK * d + blocks + d  # token table, position table, blocks, final norm
    assert net.num_params(non_embedding=False) == expected
    assert net.num_params() == expected - BLOCK * d


def test_residual_projections_start_smaller_with_depth() -> None:
    net = GPT(block_size=8, n_layer=8, n_head=4, n_embd=256)
    block = net.blocks[3]
    assert block.attn.qkv.weight.std().item() == pytest.approx(0.02, rel=0.05)
    for projection in (block.attn.proj, block.mlp.proj):
        assert projection.weight.std().item() == pytest.approx(0.02 / 4, rel=0.05)  # sqrt(2*8)


@pytest.mark.parametrize("tie_weights", [True, False])
def test_flops_per_token_matches_a_count_of_the_real_training_step(tie_weights: bool) -> None:
    net = small_gpt(tie_weights=tie_weights)
    assert net.flops_per_token() == 6 * net.num_params() + 12 * LAYERS * WIDTH * BLOCK
    idx = tokens(4, BLOCK)
    # The math kernel: its matrix products are counted like the rest (fused CPU kernels are not).
    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
        net(idx).sum().backward()
    measured = counter.get_total_flops() / idx.numel()
    # The count sees matrix products only: LayerNorm gains (2d per block, d at the end) are
    # parameters without a matmul, so the formula may exceed it by 6 FLOPs for each of them.
    norm_gains = (2 * LAYERS + 1) * WIDTH
    assert net.flops_per_token() - 6 * norm_gains == pytest.approx(measured, rel=1e-6)


@pytest.mark.parametrize("bias", [False, True])
def test_param_groups_hold_every_parameter_once_and_decay_only_matrices(bias: bool) -> None:
    net = small_gpt(bias=bias)
    decay, no_decay = net.param_groups(weight_decay=0.1)
    assert (decay["weight_decay"], no_decay["weight_decay"]) == (0.1, 0.0)
    grouped = [id(p) for group in (decay, no_decay) for p in group["params"]]
    assert len(grouped) == len(set(grouped))
    assert set(grouped) == {id(p) for p in net.parameters()}
    assert all(p.dim() >= 2 for p in decay["params"])
    assert any(p is net.tok_emb.weight for p in decay["params"])
    assert any(p is net.ln_f.weight for p in no_decay["params"])
    torch.optim.AdamW(net.param_groups(0.1))  # refuses a parameter found in two groups


def test_generate_appends_tokens_and_crops_a_long_context() -> None:
    net = small_gpt().eval()
    prompt = tokens(2, 5)
    out = net.generate(prompt, max_new_tokens=20)
    assert out.shape == (2, 25)
    assert torch.equal(out[:, :5], prompt)
    assert out.dtype == torch.int64 and out.min() >= 0 and out.max() < V
    assert net.generate(tokens(2, 3 * BLOCK), max_new_tokens=4).shape == (2, 3 * BLOCK + 4)


def test_generate_with_top_k_1_is_greedy_on_the_last_block() -> None:
    net = small_gpt().eval()
    idx = tokens(2, BLOCK + 3)
    out = net.generate(idx, max_new_tokens=5, top_k=1)
    for _ in range(5):
        next_token = net(idx[:, -BLOCK:])[:, -1].argmax(-1, keepdim=True)
        idx = torch.cat((idx, next_token), dim=1)
    assert torch.equal(out, idx)


def test_generate_with_a_generator_repeats_itself_and_leaves_the_global_stream_alone() -> None:
    net = small_gpt().eval()
    prompt = tokens(2, 4)
    torch.manual_seed(5)
    untouched = torch.rand(3)
    torch.manual_seed(5)
    first = net.generate(prompt, 12, generator=torch.Generator().manual_seed(7))
    assert torch.equal(torch.rand(3), untouched)  # the global stream moved by nothing
    second = net.generate(prompt, 12, generator=torch.Generator().manual_seed(7))
    other = net.generate(prompt, 12, generator=torch.Generator().manual_seed(8))
    assert torch.equal(first, second)
    assert not torch.equal(first, other)


@pytest.mark.parametrize("tie_weights", [True, False])
@pytest.mark.parametrize("sdpa", [True, False])
def test_gradients_reach_every_parameter(tie_weights: bool, sdpa: bool) -> None:
    net = small_gpt(bias=True, dropout=0.1, tie_weights=tie_weights, sdpa=sdpa)
    loss = nn.functional.cross_entropy(net(tokens(2, 8)).flatten(0, 1), tokens(2, 8, 2).flatten())
    loss.backward()
    for name, parameter in net.named_parameters():
        assert parameter.grad is not None and parameter.grad.abs().sum() > 0, name


def saved_bytes(net: GPT, idx: torch.Tensor) -> int:
    """Bytes autograd keeps for backward across one forward pass of `net`."""
    total = 0

    def keep(tensor: torch.Tensor) -> torch.Tensor:
        nonlocal total
        total += tensor.numel() * tensor.element_size()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(keep, lambda tensor: tensor):
        net(idx).sum()
    return total


def test_activation_checkpointing_keeps_less_and_computes_the_same_gradients() -> None:
    torch.manual_seed(0)
    plain = small_gpt()
    checkpointed = small_gpt(activation_checkpointing=True)
    checkpointed.load_state_dict(plain.state_dict())
    idx = tokens(4, BLOCK)
    for net in (plain, checkpointed):
        net(idx).logsumexp(-1).mean().backward()
    for (name, a), b in zip(plain.named_parameters(), checkpointed.parameters(), strict=True):
        torch.testing.assert_close(b.grad, a.grad, msg=name)
    # Only each block's input is kept, not the attention and MLP activations inside it.
    assert saved_bytes(checkpointed, idx) < saved_bytes(plain, idx) / 2
    checkpointed.eval()  # and in eval nothing is recomputed: the plain forward
    torch.testing.assert_close(checkpointed(idx), plain.eval()(idx))


def test_the_gpt_1b_experiment_holds_over_a_billion_parameters() -> None:
    stored = OmegaConf.load(CONF_DIR / "experiment" / "gpt_1b.yaml")
    shape = {k: stored.model.net[k] for k in ("n_layer", "n_head", "n_embd")}
    context = OmegaConf.load(CONF_DIR / "data" / "text_bytes.yaml").block_size
    with torch.device("meta"):  # the shapes only: no 4.8 GB of weights drawn on the CPU
        net = GPT(block_size=context, **shape)
    assert net.num_params() == 1_208_584_192
    assert net.blocks[0].attn.qkv.weight.shape == (3 * 2048, 2048)
