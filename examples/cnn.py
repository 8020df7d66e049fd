"""A small convolutional classifier with BatchNorm, on 32×32 RGB images."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from tuner.engine.workload import Precision, Workload


def _block(channels_in: int, channels_out: int) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(channels_in, channels_out, 3, padding=1, bias=False),
        nn.BatchNorm2d(channels_out),
        nn.ReLU(),
    )


class SmallCnn(nn.Module):
    def __init__(self, width: int = 32, classes: int = 10) -> None:
        super().__init__()
        self.features = nn.Sequential(
            _block(3, width),
            _block(width, width),
            nn.MaxPool2d(2),
            _block(width, 2 * width),
            _block(2 * width, 2 * width),
            nn.MaxPool2d(2),
        )
        self.head = nn.Linear(2 * width, classes)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        features = self.features(images)
        logits: torch.Tensor = self.head(features.mean(dim=(2, 3)))
        return logits


def workload(
    *, width: int = 32, image_size: int = 32, classes: int = 10, precision: Precision = "fp32"
) -> Workload:
    """SmallCnn trained with SGD and momentum (one momentum buffer per parameter)."""
    torch.manual_seed(0)
    model = SmallCnn(width, classes)

    def make_batch(n: int) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.randn(n, 3, image_size, image_size), torch.randint(0, classes, (n,))

    def loss_fn(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        images, labels = batch
        loss: torch.Tensor = F.cross_entropy(model(images), labels)
        return loss

    return Workload(
        name=f"cnn-w{width}-{image_size}px",
        model=model,
        optimizer=lambda params: torch.optim.SGD(params, lr=0.05, momentum=0.9),
        make_batch=make_batch,
        loss_fn=loss_fn,
        precision=precision,
    )
