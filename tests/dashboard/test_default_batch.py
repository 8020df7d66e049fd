"""The global batch the calculator asks before the reader asks their own: a power of two
near four of the largest micro batches on each data-parallel rank, at least 256, a
multiple of the data-parallel ranks; the mesh it asks at; the form's fields are the one
question's."""

from __future__ import annotations

import pytest

from api.dashboard.calculator import (
    NOT_ON_THE_FORM,
    QUESTION_FIELDS,
    default_global_batch,
    default_mesh,
)
from tuner.core.shape import MeshShape
from tuner.core.wire.recommendation import RecommendationQuery


@pytest.mark.parametrize(
    ("max_micro_batch_size", "data_parallel", "expected"),
    [
        (2414, 1, 8192),  # 4 · 2,414 = 9,656 was asked before: 8,192 is trained with
        (56, 1, 256),  # 224: at least 256
        (0, 1, 256),  # nothing fits: still a question worth asking
        (30, 8, 1024),  # 960 is nearer 1,024 than 512
        (45, 8, 1024),  # 1,440 is nearer 1,024 than 2,048 (the ratio, not the difference)
        (46, 8, 2048),  # 1,472 is past 1,024 · √2
        (8, 3, 258),  # 256 rounded up to a multiple of 3 ranks
    ],
)
def test_a_power_of_two_near_four_micro_batches_a_rank(
    max_micro_batch_size: int, data_parallel: int, expected: int
) -> None:
    assert default_global_batch(max_micro_batch_size, data_parallel) == expected


def test_the_form_asks_the_one_questions_fields() -> None:
    asked = set(QUESTION_FIELDS) | set(NOT_ON_THE_FORM)
    assert asked == set(RecommendationQuery.model_fields)
    assert len(asked) == len(QUESTION_FIELDS) + len(NOT_ON_THE_FORM)


@pytest.mark.parametrize(
    ("world_size", "tp", "expected"),
    [(4, 2, MeshShape(4, 2)), (6, 4, MeshShape(6)), (8, 1, MeshShape(8))],
)
def test_the_newest_runs_mesh_where_the_world_asked_makes_one(
    world_size: int, tp: int, expected: MeshShape
) -> None:
    assert default_mesh(world_size, tp) == expected
