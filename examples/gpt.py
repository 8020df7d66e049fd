"""A small GPT-style causal language model with a token-level loss over padded batches.

Sequences are padded to ``seq_len`` (the worst case a data loader produces); padded
positions carry the label ``IGNORE_INDEX`` so that the loss averages over real tokens
only. ``loss_units`` counts those tokens, which is what accumulation must weight by.

``-o parallel=ddp`` or ``-o parallel=fsdp`` declares the data-parallel variant (FSDP
shards each block, then the whole model); ``make_batch(n, rank=r)`` draws rank r's own
samples, so that ranks never train on the same ones.
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.checkpoint import checkpoint

from tuner.core.parallel import Parallel, ParallelMode
from tuner.engine.workload import Precision, ShardFn, Workload

IGNORE_INDEX = -100


class Block(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.norm1 = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, dim = x.shape
        q, k, v = self.qkv(self.norm1(x)).split(dim, dim=-1)
        shape = (batch, length, self.heads, dim // self.heads)
        q, k, v = (t.view(shape).transpose(1, 2) for t in (q, k, v))
        attended = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(attended.transpose(1, 2).reshape(batch, length, dim))
        out: torch.Tensor = x + self.mlp(self.norm2(x))
        return out


class TinyGpt(nn.Module):
    def __init__(
        self,
        *,
        vocab: int,
        seq_len: int,
        dim: int,
        layers: int,
        heads: int,
        checkpointing: bool = False,
    ) -> None:
        super().__init__()
        self.checkpointing = checkpointing
        self.tokens = nn.Embedding(vocab, dim)
        self.positions = nn.Embedding(seq_len, dim)
        self.blocks = nn.ModuleList(Block(dim, heads) for _ in range(layers))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)
        self.head.weight = self.tokens.weight  # tied, as in GPT-2
        for module in self.modules():
            if isinstance(module, nn.Linear | nn.Embedding):
                nn.init.normal_(module.weight, std=0.02)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)
        x = self.tokens(input_ids) + self.positions(positions)
        for block in self.blocks:
            x = checkpoint(block, x, use_reentrant=False) if self.checkpointing else block(x)
        return self.head(self.norm(x))  # type: ignore[no-any-return]


def shard_blocks(model: nn.Module, fully_shard: ShardFn) -> None:
    """FSDP the usual way for a transformer: each block is one unit, then the root (the
    embeddings, the final norm and the tied head)."""
    for block in model.blocks:  # type: ignore[union-attr]
        fully_shard(block)
    fully_shard(model)


def workload(
    *,
    vocab: int = 2048,
    seq_len: int = 128,
    dim: int = 128,
    layers: int = 4,
    heads: int = 4,
    precision: Precision = "fp32",
    checkpointing: bool = False,
    fused: bool = False,
    parallel: ParallelMode = "none",
) -> Workload:
    """TinyGpt trained with AdamW on next-token prediction, batches padded to ``seq_len``."""
    torch.manual_seed(0)
    model = TinyGpt(
        vocab=vocab,
        seq_len=seq_len,
        dim=dim,
        layers=layers,
        heads=heads,
        checkpointing=checkpointing,
    )

    def make_batch(n: int, rank: int = 0) -> dict[str, torch.Tensor]:
        # Rank 0 draws from the global generator (reproducible with torch.manual_seed);
        # other ranks from one seeded by their rank, so each sees samples of its own.
        generator = torch.Generator().manual_seed(rank) if rank else None
        input_ids = torch.randint(0, vocab, (n, seq_len), generator=generator)
        labels = input_ids.roll(-1, dims=1)
        # Ragged real lengths, at least half the context; the rest is padding.
        lengths = torch.randint(math.ceil(seq_len / 2), seq_len + 1, (n, 1), generator=generator)
        padding = torch.arange(seq_len).expand(n, seq_len) >= lengths
        labels[:, -1] = IGNORE_INDEX
        labels[padding] = IGNORE_INDEX
        return {"input_ids": input_ids, "labels": labels}

    def loss_fn(model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        logits = model(batch["input_ids"])
        loss: torch.Tensor = F.cross_entropy(
            logits.flatten(0, 1).float(), batch["labels"].flatten(), ignore_index=IGNORE_INDEX
        )
        return loss

    def loss_units(batch: dict[str, torch.Tensor]) -> int:
        return int((batch["labels"] != IGNORE_INDEX).sum())

    return Workload(
        name=f"gpt-{layers}l{dim}d-{seq_len}",
        model=model,
        optimizer=lambda params: torch.optim.AdamW(params, lr=3e-4, fused=fused or None),
        make_batch=make_batch,
        loss_fn=loss_fn,
        loss_units=loss_units,
        precision=precision,
        activation_checkpointing=checkpointing,
        parallel=Parallel(mode=parallel),
        shard=shard_blocks,
        # What changes memory per sample and speed: `tuner profile --explore` measures each.
        variants={"checkpointing": [False, True], "precision": ["fp32", "bf16"]},
    )
