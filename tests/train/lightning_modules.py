"""A real LightningModule over variable-length token sequences, for the callback's tests:
most samples are short, one is far longer, as in a real text set."""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader

VOCAB, WIDTH = 64, 32
SAMPLES, LONGEST_AT, LONGEST = 120, 77, 96
IGNORE = -100


def token_samples() -> list[dict[str, list[int]]]:
    """Lengths 4..19, but sample 77 is 96 tokens long: the one a batch must fit."""
    generator = torch.Generator().manual_seed(0)
    samples = []
    for index in range(SAMPLES):
        length = LONGEST if index == LONGEST_AT else 4 + index % 16
        ids = torch.randint(1, VOCAB, (length,), generator=generator).tolist()
        samples.append({"input_ids": ids})
    return samples


def pad(samples: list[dict[str, list[int]]]) -> dict[str, torch.Tensor]:
    """Pad to the longest sample of the batch; padding is not a target."""
    longest = max(len(s["input_ids"]) for s in samples)
    ids = torch.zeros(len(samples), longest, dtype=torch.long)
    labels = torch.full((len(samples), longest), IGNORE, dtype=torch.long)
    for row, sample in enumerate(samples):
        tokens = torch.tensor(sample["input_ids"])
        ids[row, : len(tokens)] = tokens
        labels[row, : len(tokens)] = tokens
    return {"input_ids": ids, "labels": labels}


class TokenModel(pl.LightningModule):
    """Embedding, two residual MLP blocks, a head; AdamW. Reads ``self.batch_size``."""

    def __init__(self, batch_size: int = 4, lr: float = 1e-3) -> None:
        super().__init__()
        self.batch_size = batch_size
        self.lr = lr
        self.embed = nn.Embedding(VOCAB, WIDTH)
        self.blocks = nn.ModuleList(
            nn.Sequential(nn.Linear(WIDTH, 4 * WIDTH), nn.GELU(), nn.Linear(4 * WIDTH, WIDTH))
            for _ in range(2)
        )
        self.head = nn.Linear(WIDTH, VOCAB)
        self.samples = token_samples()

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids)
        for block in self.blocks:
            x = x + block(x)
        out: torch.Tensor = self.head(x)
        return out

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        logits = self(batch["input_ids"])
        loss = F.cross_entropy(logits.flatten(0, 1), batch["labels"].flatten())
        self.log("loss", loss)  # needs the fit loop: the callback's probes must not log
        return loss

    def configure_optimizers(self) -> Any:
        optimizer = torch.optim.AdamW(self.parameters(), lr=self.lr)
        return {"optimizer": optimizer}

    def train_dataloader(self) -> DataLoader[Any]:
        return DataLoader(self.samples, batch_size=self.batch_size, shuffle=True, collate_fn=pad)  # type: ignore[arg-type]


def trainer(callbacks: list[pl.Callback], tmp: str, **options: Any) -> pl.Trainer:
    """A quiet CPU Trainer that runs two optimizer steps."""
    return pl.Trainer(
        accelerator="cpu",
        devices=1,
        max_steps=2,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=tmp,
        callbacks=callbacks,
        **options,
    )
