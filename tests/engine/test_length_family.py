"""One workload at several sequence lengths: the family key its lengths share, and
``profile_lengths``, which profiles each length aimed by the ones before it and answers
every length exactly as a bisection would."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from tuner.core.errors import BadInputError, WorkloadError
from tuner.core.results import Profile
from tuner.engine.backends import make_backend
from tuner.engine.fingerprint import length_family_key, workload_document
from tuner.engine.lengths import (
    check_seq_lens,
    guess_max_micro_batch,
    profile_lengths,
    target_builder,
)
from tuner.engine.profiler import profile_workload
from tuner.engine.workload import Workload, load_workload

GPT = "examples.gpt:workload"
SMALL = {"vocab": 64, "dim": 16, "layers": 1, "heads": 2}
LENGTHS = (64, 16, 32)  # given out of order: profiled shortest first
LIMIT = 2**20


def gpt_document(seq_len: int, **options: Any) -> dict[str, Any]:
    workload = load_workload(GPT, {**SMALL, **options, "seq_len": seq_len})
    return workload_document(workload, workload.build_optimizer())


def test_the_same_workload_at_other_lengths_has_the_same_family_key() -> None:
    first = length_family_key([gpt_document(16), gpt_document(32)])
    later = length_family_key([gpt_document(64), gpt_document(128), gpt_document(256)])
    assert first == later
    assert len(first) == 24


def test_another_width_or_depth_is_another_family() -> None:
    base = length_family_key([gpt_document(16), gpt_document(32)])
    wider = length_family_key([gpt_document(16, dim=32), gpt_document(32, dim=32)])
    deeper = length_family_key([gpt_document(16, layers=2), gpt_document(32, layers=2)])
    assert len({base, wider, deeper}) == 3


def test_the_family_of_a_transformers_model_from_its_config() -> None:
    pytest.importorskip("transformers")
    config = str(Path(__file__).resolve().parents[1] / "data" / "tiny_llama.json")

    def document(seq_len: int) -> dict[str, Any]:
        workload = load_workload("tuner.hf:causal_lm", {"config": config, "seq_len": seq_len})
        return workload_document(workload, workload.build_optimizer())

    assert length_family_key([document(8), document(16)]) == length_family_key(
        [document(32), document(64)]
    )


def growing(seq_len: int) -> Workload:
    """A model whose depth follows the length: not one workload at several lengths."""
    layers = nn.Sequential(*(nn.Linear(4, 4) for _ in range(seq_len // 8)))
    return Workload(
        model=layers,
        optimizer=lambda params: torch.optim.SGD(params, lr=0.1),
        make_batch=lambda n: torch.randn(n, seq_len, 4),
        loss_fn=lambda model, batch: model(batch).square().mean(),
    )


def test_a_structure_that_changes_with_the_length_is_refused_in_one_line() -> None:
    documents = [workload_document(w, w.build_optimizer()) for w in (growing(8), growing(16))]
    with pytest.raises(WorkloadError, match="structure changes with seq_len") as raised:
        length_family_key(documents)
    assert "\n" not in raised.value.message


def test_a_workload_that_ignores_the_length_is_refused() -> None:
    with pytest.raises(WorkloadError, match="the same at every seq_len"):
        length_family_key([gpt_document(16), gpt_document(16)])
    with pytest.raises(WorkloadError, match="two or more lengths"):
        length_family_key([gpt_document(16)])


@pytest.mark.parametrize(
    ("lengths", "message"),
    [
        ([256], "two or more different"),
        ([256, 256], "two or more different"),
        ([256, 0], "not a positive whole number"),
        ([256, "x"], "not a positive whole number"),
        ([256, True], "not a positive whole number"),
    ],
)
def test_lengths_are_checked(lengths: list[Any], message: str) -> None:
    with pytest.raises(BadInputError, match=message):
        check_seq_lens(lengths)


def test_lengths_are_distinct_and_shortest_first() -> None:
    assert check_seq_lens([512, 256, 512, 1024]) == [256, 512, 1024]


def test_the_target_must_take_seq_len_and_get_it_only_once() -> None:
    with pytest.raises(WorkloadError, match="takes no seq_len option"):
        target_builder("examples.mlp:workload", {})(16)
    with pytest.raises(WorkloadError, match="cannot import"):
        target_builder("no_such_module:workload", {})(16)
    with pytest.raises(BadInputError, match="leave out -o seq_len="):
        target_builder(GPT, {"seq_len": 64})
    assert target_builder(GPT, SMALL)(24).options["seq_len"] == 24


@pytest.fixture(scope="module")
def family() -> list[Profile]:
    return profile_lengths(
        target_builder(GPT, SMALL), LENGTHS, make_backend("cpu", memory_limit_bytes=LIMIT)
    )


@pytest.mark.slow
def test_one_profile_per_length_linked_as_a_family(family: list[Profile]) -> None:
    assert [p.workload.seq_len for p in family] == [16, 32, 64]
    keys = {p.workload.length_family for p in family}
    assert len(keys) == 1
    assert None not in keys
    assert len({p.workload_key for p in family}) == 3  # each length its own workload
    assert keys == {length_family_key([gpt_document(128), gpt_document(256)])}


@pytest.mark.slow
def test_every_length_is_answered_exactly_as_bisection(family: list[Profile]) -> None:
    backend = make_backend("cpu", memory_limit_bytes=LIMIT)
    build = target_builder(GPT, SMALL)
    for profile in family:
        found = profile.max_micro_batch_size
        assert found >= 2
        fits = {p.micro_batch_size: p.fits for p in profile.probes}
        assert fits[found] is True
        assert fits[found + 1] is False
        seq_len = profile.workload.seq_len
        assert seq_len is not None
        bisected = profile_workload(build(seq_len), backend, strategy="bisect")
        assert bisected.max_micro_batch_size == found


def test_every_length_costs_few_probes(family: list[Profile]) -> None:
    """The first length aimed by the dry run, later ones by the lengths before them: M*
    and M* + 1, and one more only where the fit across lengths needs it."""
    probes = [len(p.probes) for p in family]
    sizes = [[q.micro_batch_size for q in p.probes] for p in family]
    assert probes[0] == 2, sizes
    assert all(count <= 3 for count in probes), sizes


def test_the_guess_never_exceeds_a_shorter_lengths_answer(family: list[Profile]) -> None:
    shortest = family[0]
    assert guess_max_micro_batch([shortest], 8) <= shortest.max_micro_batch_size
    assert 1 <= guess_max_micro_batch(family[:2], 64) <= family[1].max_micro_batch_size
    nothing = shortest.model_copy(update={"max_micro_batch_size": 0})
    assert guess_max_micro_batch([nothing], 64) == 1
    # Without a breakdown the tokens per micro batch are kept: M* · 16 / 64.
    bare = [p.model_copy(update={"breakdown": None}) for p in shortest.probes]
    unbroken = shortest.model_copy(update={"probes": bare})
    assert guess_max_micro_batch([unbroken], 64) == shortest.max_micro_batch_size * 16 // 64


@pytest.mark.slow
def test_a_single_profile_knows_its_seq_len_and_no_family() -> None:
    workload = load_workload(GPT, {**SMALL, "seq_len": 16})
    profile = profile_workload(workload, make_backend("cpu", memory_limit_bytes=LIMIT), size_cap=4)
    assert profile.workload.seq_len == 16
    assert profile.workload.length_family is None
    unknown = load_workload("examples.mlp:workload", {"in_features": 8, "hidden": 8})
    found = profile_workload(unknown, make_backend("cpu", memory_limit_bytes=LIMIT), size_cap=2)
    assert found.workload.seq_len is None
