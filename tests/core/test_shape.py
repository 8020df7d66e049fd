"""The mesh shape: one type, every rule about world size and tp checked in it."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tuner.core.errors import BadInputError
from tuner.core.parallel import Parallel
from tuner.core.shape import ONE_PROCESS, MeshShape


def test_dp_is_the_world_over_tp_and_names_itself() -> None:
    mesh = MeshShape(8, 2)
    assert (mesh.dp, mesh.tp, mesh.is_mesh) == (4, 2, True)
    assert mesh.where() == "4 × 2 mesh (dp × tp)"
    assert mesh.ranks_words() == " × 4 data-parallel groups of 2 ranks"
    assert mesh.flags() == ("--world-size", "8", "--tp", "2")
    assert MeshShape(4).ranks_words() == " × 4 ranks"
    assert ONE_PROCESS.ranks_words() == ""
    assert MeshShape.of(4, 2) == mesh


@pytest.mark.parametrize(
    ("world_size", "tp", "message"),
    [
        (6, 4, "world size 6 is not a multiple of tp 4"),
        (2, 4, "world size 2 is not a multiple of tp 4"),
        (0, 1, "world size must be a positive integer"),
        (4, 0, "tp must be a positive integer"),
        (True, 1, "world size must be a positive integer"),
    ],
)
def test_a_shape_that_is_not_dp_by_tp_is_refused(world_size, tp, message) -> None:
    with pytest.raises(BadInputError, match=message):
        MeshShape(world_size, tp)


def test_a_global_batch_is_split_over_the_data_parallel_groups() -> None:
    assert MeshShape(4, 2).per_group_batch(26) == 13
    with pytest.raises(BadInputError, match="2 data-parallel groups of a 2 × 2 mesh"):
        MeshShape(4, 2).per_group_batch(27)
    with pytest.raises(BadInputError, match="not divisible by world size 4"):
        MeshShape(4).per_group_batch(26)


def test_a_smaller_shape_in_both_dimensions_bounds_a_larger_one() -> None:
    assert MeshShape(4, 2).bounds(MeshShape(8, 4))
    assert MeshShape(4, 2).bounds(MeshShape(4, 2))
    assert not MeshShape(8, 2).bounds(MeshShape(4, 2))  # more dp measured than asked
    assert not MeshShape(4, 4).bounds(MeshShape(4, 2))  # more tp measured than asked


@given(dp=st.integers(1, 64), tp=st.integers(1, 16), per_group=st.integers(1, 1000))
def test_global_batch_is_per_group_batch_times_dp(dp: int, tp: int, per_group: int) -> None:
    mesh = MeshShape.of(dp, tp)
    assert mesh.world_size == dp * tp
    assert mesh.per_group_batch(per_group * dp) == per_group


def test_a_ranks_place_is_its_group_and_its_tp_rank() -> None:
    mesh = MeshShape(8, 2)
    assert [mesh.coordinates(r) for r in range(4)] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert [mesh.group_of(r) for r in range(8)] == [0, 0, 1, 1, 2, 2, 3, 3]
    assert list(mesh.ranks_of(3)) == [6, 7]
    # Without a mesh every rank is a group of its own.
    assert [MeshShape(4).group_of(r) for r in range(4)] == [0, 1, 2, 3]
    with pytest.raises(BadInputError, match="rank 8 is not one of the 8 ranks of 4 × 2 mesh"):
        mesh.group_of(8)
    with pytest.raises(BadInputError, match="group 4 is not one of the 4"):
        mesh.ranks_of(4)


@given(dp=st.integers(1, 16), tp=st.integers(1, 8), data=st.data())
def test_the_ranks_of_a_group_are_those_it_is_the_group_of(dp: int, tp: int, data) -> None:
    mesh = MeshShape.of(dp, tp)
    group = data.draw(st.integers(0, dp - 1))
    assert [mesh.group_of(r) for r in mesh.ranks_of(group)] == [group] * tp


def test_a_profile_and_a_parallel_spec_name_their_mesh() -> None:
    spec = Parallel(mode="fsdp", tp=2, tp_plan="llama")
    assert spec.mesh(8) == MeshShape.of(4, 2)
    with pytest.raises(BadInputError, match="world size 6 is not a multiple of tp 4"):
        Parallel(mode="fsdp", tp=4, tp_plan="llama").mesh(6)
    assert Parallel().mesh(1) == ONE_PROCESS
