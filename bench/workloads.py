"""Workloads only the benchmarks use: shapes the tests and examples never show the search.

- ``gru``: a GRU sequence model (token embedding, stacked GRU, a next-token head). Its
  recurrent activations grow with the batch and the sequence length, with cuDNN-free CPU
  kernels whose temporaries differ from a transformer's.
- ``vit``: a small vision transformer (patch embedding, pre-norm encoder blocks, a class
  token and a classification head) on square images.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from tuner.engine.workload import Workload


class _GruModel(nn.Module):
    def __init__(self, *, vocab: int, dim: int, layers: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.rnn = nn.GRU(dim, dim, num_layers=layers, batch_first=True)
        self.head = nn.Linear(dim, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        hidden, _ = self.rnn(self.embed(tokens))
        logits: torch.Tensor = self.head(hidden)
        return logits


def gru(*, vocab: int = 512, dim: int = 64, layers: int = 2, seq_len: int = 16) -> Workload:
    """A ``layers``-layer GRU of width ``dim`` predicting the next of ``seq_len`` tokens."""
    torch.manual_seed(0)
    model = _GruModel(vocab=vocab, dim=dim, layers=layers)

    def make_batch(n: int) -> torch.Tensor:
        return torch.randint(0, vocab, (n, seq_len + 1))

    def loss_fn(model: nn.Module, batch: torch.Tensor) -> torch.Tensor:
        logits = model(batch[:, :-1])
        return F.cross_entropy(logits.reshape(-1, vocab), batch[:, 1:].reshape(-1))

    return Workload(
        name=f"gru-{layers}x{dim}-{seq_len}",
        model=model,
        optimizer=lambda params: torch.optim.AdamW(params, lr=1e-3),
        make_batch=make_batch,
        loss_fn=loss_fn,
    )


class _Vit(nn.Module):
    def __init__(
        self, *, image: int, patch: int, dim: int, depth: int, heads: int, classes: int
    ) -> None:
        super().__init__()
        self.patches = nn.Conv2d(3, dim, kernel_size=patch, stride=patch)
        count = (image // patch) ** 2
        self.cls = nn.Parameter(torch.zeros(1, 1, dim))
        self.position = nn.Parameter(torch.randn(1, count + 1, dim) * 0.02)
        layer = nn.TransformerEncoderLayer(
            dim, heads, dim_feedforward=4 * dim, dropout=0.0, batch_first=True, norm_first=True
        )
        self.encoder = nn.TransformerEncoder(layer, depth, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, classes)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        tokens = self.patches(images).flatten(2).transpose(1, 2)
        tokens = torch.cat([self.cls.expand(len(tokens), -1, -1), tokens], dim=1)
        encoded = self.encoder(tokens + self.position)
        logits: torch.Tensor = self.head(self.norm(encoded[:, 0]))
        return logits


def vit(
    *, image: int = 16, patch: int = 4, dim: int = 48, depth: int = 2, heads: int = 4
) -> Workload:
    """A ViT of ``depth`` blocks of width ``dim`` on ``image``² RGB images, 10 classes."""
    torch.manual_seed(0)
    classes = 10
    model = _Vit(image=image, patch=patch, dim=dim, depth=depth, heads=heads, classes=classes)

    def make_batch(n: int) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.randn(n, 3, image, image), torch.randint(0, classes, (n,))

    def loss_fn(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        images, labels = batch
        return F.cross_entropy(model(images), labels)

    return Workload(
        name=f"vit-{depth}x{dim}-{image}p{patch}",
        model=model,
        optimizer=lambda params: torch.optim.AdamW(params, lr=1e-3),
        make_batch=make_batch,
        loss_fn=loss_fn,
    )
