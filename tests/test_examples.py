"""examples/: the workloads the demo, the tests and the benchmarks profile."""

from __future__ import annotations

import pytest
import torch

from examples.gpt import IGNORE_INDEX, TinyGpt
from tuner.engine.workload import load_workload


def test_gpt_batches_are_padded_to_the_worst_case_and_count_real_tokens() -> None:
    workload = load_workload(
        "examples.gpt:workload", {"vocab": 64, "seq_len": 16, "dim": 16, "layers": 1, "heads": 2}
    )
    batch = workload.sample_batch(8)
    assert batch["input_ids"].shape == batch["labels"].shape == (8, 16)
    labels = batch["labels"]
    assert (labels[:, -1] == IGNORE_INDEX).all()  # nothing to predict after the last token
    real = int((labels != IGNORE_INDEX).sum())
    assert workload.loss_units is not None
    assert workload.loss_units(batch) == real
    # At least half the context is real text, minus the last position.
    assert 8 * 7 <= real <= 8 * 15
    loss = workload.loss_fn(workload.model, batch)
    assert loss.dim() == 0
    assert loss.requires_grad


def test_gpt_ties_the_output_head_to_the_token_embedding() -> None:
    workload = load_workload("examples.gpt:workload", {"vocab": 64, "dim": 16, "layers": 1})
    model = workload.model
    assert isinstance(model, TinyGpt)
    assert model.head.weight is model.tokens.weight
    assert workload.name == "gpt-1l16d-128"


def test_gpt_checkpointing_is_part_of_the_workload() -> None:
    options = {"vocab": 64, "seq_len": 8, "dim": 16, "layers": 1, "heads": 2}
    plain = load_workload("examples.gpt:workload", options)
    checkpointed = load_workload("examples.gpt:workload", {**options, "checkpointing": True})
    assert checkpointed.activation_checkpointing
    assert not plain.activation_checkpointing
    # The same loss either way: checkpointing recomputes, it does not change the maths.
    torch.manual_seed(3)
    batch = plain.sample_batch(2)
    assert torch.equal(
        plain.loss_fn(plain.model, batch), checkpointed.loss_fn(checkpointed.model, batch)
    )


def test_cnn_has_batchnorm_state_and_classifies_images() -> None:
    workload = load_workload("examples.cnn:workload", {"width": 4, "image_size": 8})
    assert any(isinstance(m, torch.nn.BatchNorm2d) for m in workload.model.modules())
    images, labels = workload.sample_batch(3)
    assert images.shape == (3, 3, 8, 8)
    assert labels.shape == (3,)
    assert workload.model(images).shape == (3, 10)
    assert isinstance(workload.build_optimizer(), torch.optim.SGD)


@pytest.mark.parametrize(("name", "kind"), [("adamw", torch.optim.AdamW), ("sgd", torch.optim.SGD)])
def test_mlp_optimizers(name: str, kind: type[torch.optim.Optimizer]) -> None:
    workload = load_workload("examples.mlp:workload", {"hidden": 8, "optimizer": name})
    assert isinstance(workload.build_optimizer(), kind)


def test_mlp_refuses_an_unknown_optimizer() -> None:
    with pytest.raises(ValueError, match="unknown optimizer 'lbfgs'"):
        load_workload("examples.mlp:workload", {"optimizer": "lbfgs"})
