"""Encoder-decoders, image classifiers and FSDP for ``tuner.hf``, from tiny configs
(2 layers, width 32): models of other shapes than the decoders the package began with."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tests.accumulate_helpers import (
    frozen_sgd,
    full_batch_gradients,
    gradients,
    relative_difference,
)
from tests.helpers import run_tuner
from tuner.core.errors import WorkloadError
from tuner.engine.workload import load_workload
from tuner.hf import causal_lm, image_classification, seq2seq_lm, shard_blocks, workload
from tuner.train.accumulate import Accumulator

pytest.importorskip("transformers")

DATA = Path(__file__).resolve().parent.parent / "data"
T5 = {
    "model_type": "t5", "vocab_size": 64, "d_model": 32, "d_kv": 8, "d_ff": 64,
    "num_layers": 2, "num_decoder_layers": 2, "num_heads": 4,
    "decoder_start_token_id": 0, "pad_token_id": 0, "dropout_rate": 0.0,
}  # fmt: skip
BART = {
    "model_type": "bart", "vocab_size": 64, "d_model": 32, "encoder_layers": 2,
    "decoder_layers": 2, "encoder_attention_heads": 4, "decoder_attention_heads": 4,
    "encoder_ffn_dim": 64, "decoder_ffn_dim": 64, "max_position_embeddings": 64,
    "dropout": 0.0, "attention_dropout": 0.0, "activation_dropout": 0.0,
}  # fmt: skip
VIT = {
    "model_type": "vit", "image_size": 16, "patch_size": 4, "num_channels": 3,
    "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
    "num_attention_heads": 4,
}  # fmt: skip


@pytest.mark.parametrize("config", [T5, BART], ids=["t5", "bart"])
def test_an_encoder_decoder_accumulates_the_full_batch_gradient(config) -> None:
    model_workload = seq2seq_lm(config=config, seq_len=8)
    assert model_workload.name == f"hf-{config['model_type']}-seq2seq-lm-2l32d-8"
    batch = model_workload.make_batch(5)
    assert model_workload.loss_units is not None
    assert model_workload.loss_units(batch) == 5 * 8  # every target token: no shift
    want = full_batch_gradients(model_workload, batch)  # no dropout: the same function
    model = model_workload.model
    accumulator = Accumulator(
        model, frozen_sgd(model), 2, model_workload.loss_fn, model_workload.loss_units,
        split=[2, 2, 1],
    )  # fmt: skip
    accumulator.step(batch)
    assert relative_difference(gradients(model), want) < 1e-5


def test_an_image_classifier_from_the_command_line_target() -> None:
    model_workload = load_workload(
        "tuner.hf:image_classification", {"config": VIT, "num_labels": 3}
    )
    assert model_workload.name == "hf-vit-image-classification-2l32d-16px"
    assert model_workload.loss_units is None  # per sample
    batch = model_workload.make_batch(5)
    assert batch["pixel_values"].shape == (5, 3, 16, 16)
    report = Accumulator.for_workload(model_workload, 2).step(batch)
    assert report.units == 5
    assert torch.isfinite(torch.tensor(report.loss))


def test_an_image_classifier_refuses_a_sequence_length_in_one_line() -> None:
    with pytest.raises(WorkloadError, match="takes no seq_len") as caught:
        workload(task="image-classification", config=VIT, seq_len=16)
    assert "\n" not in str(caught.value)
    with pytest.raises(TypeError):
        image_classification(config=VIT, seq_len=16)  # type: ignore[call-arg]


CONVNEXT = {
    "model_type": "convnext", "image_size": 16, "num_channels": 3, "hidden_sizes": [8, 16],
    "depths": [1, 1], "patch_size": 4, "num_stages": 2,
}  # fmt: skip


@pytest.mark.slow
def test_a_model_transformers_cannot_checkpoint_has_no_checkpointing_variant(
    tmp_path: Path,
) -> None:
    """ConvNeXt: ``checkpointing=true`` is refused in one line (it was a 40-line
    ``ValueError`` from transformers, and ``--explore`` raised it on its second variant)."""
    assert image_classification(config=CONVNEXT).variants == {}
    assert image_classification(config=VIT).variants == {"checkpointing": [False, True]}
    with pytest.raises(WorkloadError, match="does not support activation checkpointing"):
        image_classification(config=CONVNEXT, checkpointing=True)
    config = tmp_path / "convnext.json"
    config.write_text(json.dumps(CONVNEXT))
    done = run_tuner(
        "profile", "tuner.hf:image_classification", "-o", f"config={config}",
        "--device", "cpu", "--memory-limit", "8MiB", "--explore",
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert "declares no variants to explore" in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize(
    ("model_workload", "blocks"),
    [
        (
            lambda: causal_lm(config=str(DATA / "tiny_llama.json"), seq_len=8),
            ["LlamaDecoderLayer"] * 2,
        ),
        (lambda: seq2seq_lm(config=T5, seq_len=8), ["T5Block"] * 4),
        (lambda: image_classification(config=VIT), ["ViTEmbeddings"] + ["ViTLayer"] * 2),
        # mBART also names MBartAttention, a part of its layers: only the layers are
        # sharded (a part sharded after its layer stopped torch's fully_shard).
        (
            lambda: seq2seq_lm(config={**BART, "model_type": "mbart"}, seq_len=8),
            ["MBartEncoderLayer"] * 2 + ["MBartDecoderLayer"] * 2,
        ),
    ],
    ids=["llama", "t5", "vit", "mbart"],
)
def test_fsdp_shards_each_block_the_model_names_then_the_model(model_workload, blocks) -> None:
    built = model_workload()
    assert built.shard is shard_blocks
    sharded: list[torch.nn.Module] = []
    built.shard(built.model, sharded.append)
    assert [type(m).__name__ for m in sharded[:-1]] == blocks
    assert sharded[-1] is built.model  # the whole model last: embeddings and head


@pytest.mark.slow
def test_a_transformers_model_profiles_under_fsdp_on_two_ranks() -> None:
    done = run_tuner(
        "profile", "tuner.hf:causal_lm", "-o", f"config={DATA / 'tiny_llama.json'}",
        "-o", "seq_len=16", "--device", "cpu", "--memory-limit", "8MiB",
        "--world-size", "2", "--parallel", "fsdp", "--max", "4", "--json", timeout=300,
    )  # fmt: skip
    # The cap keeps the search to a probe or two: each probe that runs out of memory
    # restarts both ranks, and each rank imports transformers.
    assert done.returncode == 0, done.stderr
    document = json.loads(done.stdout)
    assert document["world_size"] == 2
    assert document["parallel"]["mode"] == "fsdp"
    assert document["max_micro_batch_size"] >= 1
