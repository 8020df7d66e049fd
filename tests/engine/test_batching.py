"""tuner.engine.batching: batches as tensors, tuples, named tuples, lists and dicts."""

from __future__ import annotations

from typing import NamedTuple

import pytest
import torch

from tuner.engine.batching import batch_size_of, batch_tensors, map_tensors, slice_batch, to_device


class Pair(NamedTuple):
    inputs: torch.Tensor
    labels: torch.Tensor


def test_batch_tensors_names_every_tensor_by_its_path() -> None:
    batch = {"b": [torch.zeros(2), (torch.ones(2), "text")], "a": torch.zeros(2, 3)}
    paths = [path for path, _ in batch_tensors(batch)]
    assert paths == ["['a']", "['b'][0]", "['b'][1][0]"]
    assert [path for path, _ in batch_tensors(torch.zeros(1))] == ["batch"]


def test_map_tensors_keeps_the_structure_and_leaves_other_values() -> None:
    batch = {
        "pair": Pair(torch.ones(2, 3), torch.zeros(2)),
        "list": [torch.ones(2), 7],
        "meta": "keep me",
    }
    doubled = map_tensors(batch, lambda t: t * 2)
    assert isinstance(doubled["pair"], Pair)
    assert torch.equal(doubled["pair"].inputs, torch.full((2, 3), 2.0))
    assert isinstance(doubled["list"], list)
    assert doubled["list"][1] == 7
    assert doubled["meta"] == "keep me"


def test_slice_batch_takes_samples_and_keeps_scalars() -> None:
    batch = (torch.arange(10).reshape(5, 2), torch.arange(5), torch.tensor(3.0))
    part = slice_batch(batch, 1, 3)
    assert batch_size_of(part[:2]) == 2
    assert torch.equal(part[1], torch.tensor([1, 2]))
    assert part[2].item() == 3.0
    # Views, not copies: slicing a batch costs no memory.
    assert part[0].untyped_storage().data_ptr() == batch[0].untyped_storage().data_ptr()


def test_to_device_moves_every_tensor() -> None:
    batch = to_device({"x": torch.zeros(2)}, torch.device("cpu"))
    assert batch["x"].device.type == "cpu"


def test_batch_size_of_ignores_scalars_and_refuses_disagreement() -> None:
    assert batch_size_of((torch.zeros(4, 2), torch.tensor(1.0))) == 4
    with pytest.raises(ValueError, match="disagree"):
        batch_size_of((torch.zeros(4), torch.zeros(3)))
    with pytest.raises(ValueError, match="at least one tensor"):
        batch_size_of({"text": "no tensors"})
