"""Models the project was not written around, for ``bench/corpus.py``.

Transformers architectures come as tiny configs (two layers, width 64: nothing is
downloaded, the weights are random; a mixture of experts, Mixtral, and a state-space
model, Mamba, among them) for ``tuner.hf``'s factories, as a user would pass
``-o config=config.json``. The convolutional and recurrent models are written here:
torchvision's wheels for this torch (0.28.0, ``torch==2.13.0``) load their operators only
against the CUDA build of torch (``operator torchvision::nms does not exist`` on the CPU
build), so ``TinyResNet`` (ResNet's basic blocks: two 3×3 convolutions, batch norm and a
projected shortcut where the shape changes) and ``TinyMobileNet`` (MobileNetV2's inverted
residuals: 1×1 expansion, depthwise 3×3, 1×1 projection) follow torchvision's layouts at
a small width, and ``LstmLm`` is a word-level LSTM language model as in PyTorch's
examples.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from tuner import Workload

HF_CONFIGS: dict[str, dict[str, Any]] = {
    "gpt_neox": {
        "model_type": "gpt_neox",
        "vocab_size": 256,
        "hidden_size": 64,
        "intermediate_size": 256,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "max_position_embeddings": 256,
        "rotary_pct": 0.25,
    },
    "qwen2": {
        "model_type": "qwen2",
        "vocab_size": 256,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 256,
        "tie_word_embeddings": False,
    },
    "mistral": {
        "model_type": "mistral",
        "vocab_size": 256,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 256,
        "sliding_window": 64,
    },
    "phi": {
        "model_type": "phi",
        "vocab_size": 256,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "max_position_embeddings": 256,
    },
    "bert": {
        "model_type": "bert",
        "vocab_size": 256,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "max_position_embeddings": 256,
    },
    "distilbert": {
        "model_type": "distilbert",
        "vocab_size": 256,
        "dim": 64,
        "hidden_dim": 128,
        "n_layers": 2,
        "n_heads": 4,
        "max_position_embeddings": 256,
    },
    "t5": {
        "model_type": "t5",
        "vocab_size": 256,
        "d_model": 64,
        "d_kv": 16,
        "d_ff": 128,
        "num_layers": 2,
        "num_decoder_layers": 2,
        "num_heads": 4,
        "decoder_start_token_id": 0,
        "pad_token_id": 0,
    },
    "bart": {
        "model_type": "bart",
        "vocab_size": 256,
        "d_model": 64,
        "encoder_layers": 2,
        "decoder_layers": 2,
        "encoder_attention_heads": 4,
        "decoder_attention_heads": 4,
        "encoder_ffn_dim": 128,
        "decoder_ffn_dim": 128,
        "max_position_embeddings": 256,
    },
    # Families whose dry runs differed from the probes (bench/corpus.py's second group).
    **{
        name: {
            "model_type": name,
            "vocab_size": 256,
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "max_position_embeddings": 256,
            **extra,
        }
        for name, extra in {
            "gemma": {"head_dim": 16},
            "gemma2": {"head_dim": 16},
            "granite": {},
            "olmo": {"eos_token_id": 0, "pad_token_id": 1},
            "stablelm": {},
            "phi3": {"eos_token_id": 0, "pad_token_id": 1, "bos_token_id": 2},
        }.items()
    },
    "falcon": {
        "model_type": "falcon",
        "vocab_size": 256,
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "max_position_embeddings": 256,
    },
    "bloom": {
        "model_type": "bloom",
        "vocab_size": 256,
        "hidden_size": 64,
        "n_layer": 2,
        "n_head": 4,
    },
    "opt": {
        "model_type": "opt",
        "vocab_size": 256,
        "hidden_size": 64,
        "ffn_dim": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "max_position_embeddings": 256,
        "word_embed_proj_dim": 64,
    },
    "swin": {
        "model_type": "swin",
        "image_size": 32,
        "patch_size": 4,
        "embed_dim": 16,
        "depths": [1, 1],
        "num_heads": [2, 2],
        "window_size": 4,
    },
    "convnext": {
        "model_type": "convnext",
        "image_size": 32,
        "num_channels": 3,
        "hidden_sizes": [16, 32],
        "depths": [1, 1],
        "patch_size": 4,
        "num_stages": 2,
    },
    "vit": {
        "model_type": "vit",
        "image_size": 32,
        "patch_size": 4,
        "num_channels": 3,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
    },
}
# BERT's and BART's shapes under other names (their own embeddings, attention and losses).
# A mixture of experts (top-2 of 4 experts a token, each a gated MLP) and a state-space
# model (Mamba: no attention, a selective scan; transformers' own PyTorch path on the CPU).
HF_CONFIGS["mixtral"] = {
    **HF_CONFIGS["qwen2"],
    "model_type": "mixtral",
    "num_local_experts": 4,
    "num_experts_per_tok": 2,
}
HF_CONFIGS["mamba"] = {
    "model_type": "mamba",
    "vocab_size": 256,
    "hidden_size": 64,
    "state_size": 16,
    "num_hidden_layers": 2,
    "expand": 2,
    "conv_kernel": 4,
}
HF_CONFIGS["roberta"] = {**HF_CONFIGS["bert"], "model_type": "roberta"}
HF_CONFIGS["deberta_v2"] = {**HF_CONFIGS["bert"], "model_type": "deberta-v2"}
HF_CONFIGS["mbart"] = {**HF_CONFIGS["bart"], "model_type": "mbart"}


class BasicBlock(nn.Module):
    """ResNet's basic block: conv-bn-relu, conv-bn, plus the (projected) input."""

    def __init__(self, inputs: int, outputs: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(inputs, outputs, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(outputs)
        self.conv2 = nn.Conv2d(outputs, outputs, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(outputs)
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or inputs != outputs:
            self.shortcut = nn.Sequential(
                nn.Conv2d(inputs, outputs, 1, stride, bias=False), nn.BatchNorm2d(outputs)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        return F.relu(self.bn2(self.conv2(out)) + self.shortcut(x))


class _Classifier(nn.Module):
    """A stem, a list of blocks, global average pooling and a linear head."""

    stem: nn.Module
    blocks: nn.ModuleList
    head: nn.Module

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        for block in self.blocks:
            x = block(x)
        logits: torch.Tensor = self.head(x.mean(dim=(2, 3)))
        return logits


class TinyResNet(_Classifier):
    """A ResNet of basic blocks at widths 16, 32, 64 for 32×32 images."""

    def __init__(self, classes: int = 10, widths: tuple[int, ...] = (16, 32, 64)) -> None:
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(3, widths[0], 3, 1, 1, bias=False), nn.BatchNorm2d(widths[0]), nn.ReLU()
        )
        blocks: list[nn.Module] = []
        previous = widths[0]
        for i, width in enumerate(widths):
            blocks.append(BasicBlock(previous, width, 1 if i == 0 else 2))
            previous = width
        self.blocks = nn.ModuleList(blocks)
        self.head = nn.Linear(previous, classes)


class InvertedResidual(nn.Module):
    """MobileNetV2's block: 1×1 expand, depthwise 3×3, 1×1 project; residual when shapes match."""

    def __init__(self, inputs: int, outputs: int, stride: int, expand: int = 4) -> None:
        super().__init__()
        hidden = inputs * expand
        self.residual = stride == 1 and inputs == outputs
        self.layers = nn.Sequential(
            nn.Conv2d(inputs, hidden, 1, bias=False),
            nn.BatchNorm2d(hidden),
            nn.ReLU6(),
            nn.Conv2d(hidden, hidden, 3, stride, 1, groups=hidden, bias=False),
            nn.BatchNorm2d(hidden),
            nn.ReLU6(),
            nn.Conv2d(hidden, outputs, 1, bias=False),
            nn.BatchNorm2d(outputs),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.layers(x)
        return x + out if self.residual else out


class TinyMobileNet(_Classifier):
    """Inverted residuals at widths 16, 24, 32 for 32×32 images."""

    def __init__(self, classes: int = 10) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, 1, 1, bias=False), nn.BatchNorm2d(16))
        self.blocks = nn.ModuleList(
            [InvertedResidual(16, 16, 1), InvertedResidual(16, 24, 2), InvertedResidual(24, 32, 2)]
        )
        self.head = nn.Linear(32, classes)


class LstmLm(nn.Module):
    """Embedding, a two-layer LSTM, a linear decoder: next-token logits."""

    def __init__(self, vocab: int = 256, width: int = 64, layers: int = 2) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.lstm = nn.LSTM(width, width, layers, batch_first=True)
        self.decoder = nn.Linear(width, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        hidden, _ = self.lstm(self.embed(tokens))
        logits: torch.Tensor = self.decoder(hidden)
        return logits


def _shard_blocks(model: nn.Module, fully_shard: Callable[[nn.Module], Any]) -> None:
    for block in getattr(model, "blocks", ()):
        fully_shard(block)
    fully_shard(model)


def _images(n: int, rank: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(rank) if rank else None
    images = torch.randn(n, 3, 32, 32, generator=generator)
    return images, torch.randint(0, 10, (n,), generator=generator)


def _classify(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    return F.cross_entropy(model(batch[0]), batch[1])


def _image_workload(name: str, model: nn.Module, precision: str) -> Workload:
    return Workload(
        name=name,
        model=model,
        optimizer=lambda params: torch.optim.SGD(params, lr=0.1, momentum=0.9),
        make_batch=_images,
        loss_fn=_classify,
        precision=precision,  # type: ignore[arg-type]
        shard=_shard_blocks,
        variants={"precision": ["fp32", "bf16"]},
    )


def resnet(*, precision: str = "fp32") -> Workload:
    """A small ResNet (basic blocks) on 32×32 images, SGD with momentum."""
    torch.manual_seed(0)
    return _image_workload("corpus-resnet", TinyResNet(), precision)


def mobilenet(*, precision: str = "fp32") -> Workload:
    """A small MobileNetV2 (depthwise inverted residuals) on 32×32 images."""
    torch.manual_seed(0)
    return _image_workload("corpus-mobilenet", TinyMobileNet(), precision)


def lstm_lm(*, seq_len: int = 64, precision: str = "fp32") -> Workload:
    """An LSTM language model over ``seq_len`` tokens, AdamW, mean next-token loss."""
    torch.manual_seed(0)
    model = LstmLm()

    def make_batch(n: int, rank: int = 0) -> torch.Tensor:
        generator = torch.Generator().manual_seed(rank) if rank else None
        return torch.randint(0, 256, (n, seq_len + 1), generator=generator)

    def loss_fn(trained: nn.Module, tokens: torch.Tensor) -> torch.Tensor:
        logits = trained(tokens[:, :-1])
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1))

    return Workload(
        name=f"corpus-lstm-lm-{seq_len}",
        model=model,
        optimizer=lambda params: torch.optim.AdamW(params, lr=1e-3),
        make_batch=make_batch,
        loss_fn=loss_fn,
        precision=precision,  # type: ignore[arg-type]
        shard=_shard_blocks,
        variants={"precision": ["fp32", "bf16"]},
    )
