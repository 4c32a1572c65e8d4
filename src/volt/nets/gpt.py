"""A GPT language model: token and position embeddings, pre-LayerNorm transformer blocks with
causal self-attention, and an LM head that shares its weight with the token embedding."""

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint


@dataclass(frozen=True)
class GPTConfig:
    vocab_size: int = 256  # bytes
    block_size: int = 256  # longest context, in tokens
    n_layer: int = 6
    n_head: int = 6
    n_embd: int = 384
    dropout: float = 0.0
    bias: bool = False  # biases in Linear and LayerNorm layers: a little slower, no better
    # The LM head reuses the token table: one vocab_size x n_embd matrix instead of two.
    tie_weights: bool = True
    # False: attention written out (scores, mask, softmax), a (T, T) matrix per head held for the
    # backward pass: the reference the fused kernels are checked against.
    sdpa: bool = True

    def __post_init__(self) -> None:
        for name in ("vocab_size", "block_size", "n_layer", "n_head", "n_embd"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)} must be at least 1")
        if self.n_embd % self.n_head:
            # From n_embd down, not n_head: a head count of 10**15 would take days to walk.
            start = min(self.n_head, self.n_embd)
            fits = next(h for h in range(start, 0, -1) if self.n_embd % h == 0)
            raise ValueError(
                f"n_embd={self.n_embd} does not split into n_head={self.n_head} heads: "
                f"use a divisor of n_embd, e.g. n_head={fits}"
            )
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout={self.dropout} must be in [0, 1), e.g. dropout=0.1")


class CausalSelfAttention(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.n_head = config.n_head
        self.dropout = config.dropout
        self.sdpa = config.sdpa
        self.qkv = nn.Linear(config.n_embd, 3 * config.n_embd, bias=config.bias)
        self.proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.resid_dropout = nn.Dropout(config.dropout)

    def forward(self, x: Tensor) -> Tensor:
        B, T, C = x.shape
        q, k, v = self.qkv(x).split(C, dim=2)  # each (B, T, C)
        # (B, nh, T, hs): the heads become a batch dimension of the attention kernel
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        dropout = self.dropout if self.training else 0.0
        if self.sdpa:
            # is_causal instead of a mask tensor: that is what lets PyTorch pick the flash kernel.
            y = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout, is_causal=True)
        else:
            y = written_out_attention(q, k, v, dropout, self.training)  # (B, nh, T, hs)
        y = y.transpose(1, 2).contiguous().view(B, T, C)  # heads side by side again
        return self.resid_dropout(self.proj(y))


def written_out_attention(
    q: Tensor, k: Tensor, v: Tensor, dropout: float, training: bool
) -> Tensor:
    """Causal attention step by step: what scaled_dot_product_attention computes in one kernel."""
    T = q.size(-2)
    scores = (q @ k.transpose(-2, -1)) / math.sqrt(q.size(-1))  # (B, nh, T, T)
    future = torch.ones(T, T, dtype=torch.bool, device=q.device).triu(diagonal=1)
    weights = torch.softmax(scores.masked_fill(future, float("-inf")), dim=-1)
    return F.dropout(weights, dropout, training) @ v  # (B, nh, T, hs)


class MLP(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=config.bias)
        self.gelu = nn.GELU()
        self.proj = nn.Linear(4 * config.n_embd, config.n_embd, bias=config.bias)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x: Tensor) -> Tensor:
        return self.dropout(self.proj(self.gelu(self.fc(x))))  # (B, T, C)


class Block(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.mlp = MLP(config)

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    """(B, T) token indices -> (B, T, vocab_size) logits of the next token at every position.

    Built from keyword arguments (as Hydra calls it); they are kept, checked, in `self.config`.
    """

    def __init__(
        self,
        vocab_size: int = 256,
        block_size: int = 256,
        n_layer: int = 6,
        n_head: int = 6,
        n_embd: int = 384,
        dropout: float = 0.0,
        bias: bool = False,
        tie_weights: bool = True,
        sdpa: bool = True,
        activation_checkpointing: bool = False,
    ) -> None:
        super().__init__()
        config = GPTConfig(
            vocab_size, block_size, n_layer, n_head, n_embd, dropout, bias, tie_weights, sdpa
        )
        self.config = config
        # Keep only each block's input for backward and run the block again there: activations
        # of one block at a time instead of all of them, for about a third more compute.
        self.activation_checkpointing = activation_checkpointing
        self.tok_emb = nn.Embedding(config.vocab_size, config.n_embd)
        self.pos_emb = nn.Embedding(config.block_size, config.n_embd)
        self.drop = nn.Dropout(config.dropout)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.n_layer))
        self.ln_f = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        if config.tie_weights:
            # The head scores a token by its similarity to that token's embedding.
            self.lm_head.weight = self.tok_emb.weight

        self.apply(self._init_weights)
        # Every block adds two projections to the residual stream; scaling them down keeps its
        # variance from growing with depth (GPT-2's initialisation).
        for name, parameter in self.named_parameters():
            if name.endswith(".proj.weight"):
                nn.init.normal_(parameter, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer))

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def forward(self, idx: Tensor) -> Tensor:
        seq_len = idx.size(1)
        if seq_len > self.config.block_size:
            raise ValueError(
                f"a sequence of {seq_len} tokens is longer than block_size="
                f"{self.config.block_size}: crop it to the last block_size tokens, "
                "or build the net with a larger block_size"
            )
        pos = torch.arange(seq_len, device=idx.device)  # (T,)
        x = self.drop(self.tok_emb(idx) + self.pos_emb(pos))  # (B, T, C) + (T, C)
        for block in self.blocks:
            if self.activation_checkpointing and self.training:
                x = checkpoint(block, x, use_reentrant=False)
            else:
                x = block(x)
        return self.lm_head(self.ln_f(x))  # (B, T, vocab_size)

    def num_params(self, non_embedding: bool = True) -> int:
        """Parameters, each shared tensor once. non_embedding leaves out the tables that are only
        looked up: the position table, and the token table unless it is the LM head's weight."""
        n = sum(p.numel() for p in self.parameters())
        if non_embedding:
            n -= self.pos_emb.weight.numel()
            if not self.config.tie_weights:
                n -= self.tok_emb.weight.numel()
        return n

    def flops_per_token(self) -> int:
        """Training FLOPs (forward + backward) per token at full context: 6 per parameter
        (2 forward, 4 backward) plus attention's scores and weighted sums, 12 * L * d * T."""
        c = self.config
        return 6 * self.num_params() + 12 * c.n_layer * c.n_embd * c.block_size

    def param_groups(self, weight_decay: float) -> list[dict[str, Any]]:
        """Two optimiser groups: every matrix decays, vectors (biases, LayerNorm gains) do not.

        The embedding tables count as matrices and decay (nanoGPT's rule): the token table is
        also the LM head's weight, a projection like the others. Decaying a LayerNorm gain or a
        bias would pull a scale or an offset towards zero instead of limiting a layer's size.
        """
        parameters = list(self.parameters())  # a tied tensor appears once
        return [
            {"params": [p for p in parameters if p.dim() >= 2], "weight_decay": weight_decay},
            {"params": [p for p in parameters if p.dim() < 2], "weight_decay": 0.0},
        ]

    @torch.no_grad()
    def generate(
        self,
        idx: Tensor,
        max_new_tokens: int,
        temperature: float = 1.0,
        top_k: int | None = None,
        generator: torch.Generator | None = None,
    ) -> Tensor:
        """(B, T0) -> (B, T0 + max_new_tokens): sample one token at a time, each conditioned on
        at most the last block_size tokens. Call .eval() first, or dropout stays on. A
        `generator` (on idx's device) keeps the draws off torch's global random stream."""
        if temperature <= 0:
            raise ValueError(f"temperature={temperature} must be positive, e.g. temperature=1.0")
        for _ in range(max_new_tokens):
            context = idx[:, -self.config.block_size :]
            logits = self(context)[:, -1, :].float() / temperature  # (B, vocab_size)
            if top_k is not None:
                kth = torch.topk(logits, min(top_k, logits.size(-1))).values[:, -1:]  # (B, 1)
                logits = logits.masked_fill(logits < kth, float("-inf"))
            probs = torch.softmax(logits, dim=-1)
            idx = torch.cat((idx, torch.multinomial(probs, 1, generator=generator)), dim=1)
        return idx
