"""Estimates across mesh shapes (dp × tp) from real profiles: the fit of each phase's peak
against ``1, m, 1/W, m/tp, 1/tp, 1/dp`` (torch-free), held out against a measured shape.

The profiles in ``tests/data/mesh`` are real measurements: one process standing for rank 0
of the world on torch's fake process group (``simulated_ranks``), each printed by

    tuner profile examples.mesh_mlp:workload --world-size W --tp T --fake-world \\
        --memory-limit 64MiB --device cpu --json > tests/data/mesh/mesh_mlp_wW_tpT.json

for (W, T) = (4, 1), (8, 1), (4, 4), (8, 4), (8, 2), (4, 2): the mesh shapes (dp, tp) =
(4, 1), (8, 1), (1, 4), (2, 4), (4, 2) and the held-out (2, 2).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tuner.core.errors import BadInputError
from tuner.core.results import Profile
from tuner.core.shape import MeshShape
from tuner.core.worlds import (
    TERMS,
    estimate_world_size,
    fit_world_sizes,
    near_boundary,
    separable_terms,
)

MESH = Path(__file__).resolve().parents[1] / "data" / "mesh"


def load(world_size: int, tp: int) -> Profile:
    document = json.loads((MESH / f"mesh_mlp_w{world_size}_tp{tp}.json").read_text())
    document.pop("advice", None)  # what the CLI prints beside the profile
    return Profile.model_validate(document)


# (W, tp) of the shapes fitted; (4, 2), the 2 × 2 mesh, is held out.
FITTED = [(4, 1), (8, 1), (4, 4), (8, 4), (8, 2)]
HELD_OUT = (4, 2)


@pytest.fixture(scope="module")
def fitted() -> list[Profile]:
    return [load(*shape) for shape in FITTED]


@pytest.fixture(scope="module")
def held_out() -> Profile:
    return load(*HELD_OUT)


def test_the_profiles_are_one_workload_measured_by_simulated_ranks(
    fitted: list[Profile], held_out: Profile
) -> None:
    assert sorted(p.mesh for p in fitted) == [
        MeshShape(4, 1),
        MeshShape(4, 4),
        MeshShape(8, 1),
        MeshShape(8, 2),
        MeshShape(8, 4),
    ]
    assert held_out.mesh == MeshShape.of(2, 2)
    assert {p.workload_key for p in [*fitted, held_out]} == {held_out.workload_key}
    assert all(p.settings.simulated_ranks for p in [*fitted, held_out])


def test_the_held_out_2x2_mesh_is_estimated_within_2_percent_never_above_its_m_star(
    fitted: list[Profile], held_out: Profile
) -> None:
    fit = fit_world_sizes(fitted)
    assert fit.terms == list(TERMS)  # five shapes separate every term
    assert fit.shapes == [
        MeshShape.of(dp, tp) for dp, tp in [(1, 4), (2, 4), (4, 1), (4, 2), (8, 1)]
    ]
    near = [
        probe
        for probe in held_out.probes
        if probe.footprint_bytes
        and near_boundary(probe.micro_batch_size, held_out.max_micro_batch_size)
    ]
    assert len(near) >= 2
    for probe in near:  # every measured peak near the held-out M*
        predicted = fit.predict(probe.micro_batch_size, MeshShape(4, 2))
        assert predicted == pytest.approx(probe.footprint_bytes, rel=0.02)

    estimate = estimate_world_size(fitted, MeshShape(4, 2))
    assert estimate.basis == "estimated"
    assert estimate.mesh == MeshShape.of(2, 2)
    # The wire's two integers (api/ passes them) are the same question.
    assert 1 <= estimate.max_micro_batch_size <= held_out.max_micro_batch_size
    assert estimate.max_micro_batch_size >= 0.95 * held_out.max_micro_batch_size
    # Its expected peak, at the size it answers, within 2% of what the 2 × 2 mesh measured
    # there (the nearest size it probed at or above, a measured upper bound).
    at = min(
        (p for p in near if p.micro_batch_size >= estimate.max_micro_batch_size),
        key=lambda p: p.micro_batch_size,
    )
    assert estimate.expected_peak_bytes == pytest.approx(at.footprint_bytes, rel=0.02)
    assert estimate.expected_peak_bytes <= held_out.budget_bytes
    # Ceiling: the nearest shape larger in both dimensions, (4, 2) or (2, 4).
    assert estimate.ceiling_shape in [MeshShape.of(4, 2), MeshShape.of(2, 4)]
    assert "2 × 2 mesh" in estimate.describe()
    assert "mesh shapes" in estimate.describe()


def test_a_measured_shape_answers_with_its_own_profile(
    fitted: list[Profile], held_out: Profile
) -> None:
    answer = estimate_world_size([*fitted, held_out], MeshShape(4, 2))
    assert answer.basis == "measured"
    assert answer.max_micro_batch_size == held_out.max_micro_batch_size
    # The same world size without a mesh is another shape: (4, 1), measured too.
    flat = estimate_world_size([*fitted, held_out], MeshShape(4))
    assert flat.basis == "measured"
    assert flat.max_micro_batch_size == load(4, 1).max_micro_batch_size


@pytest.mark.parametrize(
    ("world_size", "tp", "message"),
    [
        (16, 1, "outside the measured dp"),  # dp 16 > 8
        (8, 8, r"outside the measured dp 1\.\.8 and tp 1\.\.4"),  # tp 8 > 4
        # dp and tp each in range, but no measured shape larger in both:
        (16, 2, "no measured mesh is at least 8 × 2"),
        (16, 4, "no measured mesh is at least 4 × 4"),
        (6, 4, "not a multiple of tp 4"),
    ],
)
def test_extrapolation_is_refused_in_one_line(
    fitted: list[Profile], world_size: int, tp: int, message: str
) -> None:
    with pytest.raises(BadInputError, match=message) as raised:
        estimate_world_size(fitted, MeshShape(world_size, tp))
    assert "\n" not in str(raised.value)


def test_terms_are_only_those_the_shapes_separate(fitted: list[Profile]) -> None:
    flat = [load(4, 1), load(8, 1)]
    # tp = 1 only: a + b·m + s/W, as before meshes.
    assert fit_world_sizes(flat).terms == ["fixed_bytes", "per_sample_bytes", "sharded_bytes"]
    # One world size (8 = 8 × 1 = 4 × 2 = 2 × 4): no 1/W column, which is the constant's.
    one_world = [load(8, 1), load(8, 2), load(8, 4)]
    assert fit_world_sizes(one_world).terms == [
        "fixed_bytes",
        "per_sample_bytes",
        "per_sample_split_bytes",
        "gathered_bytes",
        "dp_sharded_bytes",
    ]
    # One tp (4), two world sizes: no m/tp, 1/tp or 1/dp apart from m, 1 and 1/W.
    one_tp = [load(4, 4), load(8, 4)]
    assert fit_world_sizes(one_tp).terms == ["fixed_bytes", "per_sample_bytes", "sharded_bytes"]
    assert separable_terms([(1, MeshShape(4)), (2, MeshShape(4))]) == [
        0,
        1,
    ]  # one shape: 1 and m only


def test_without_a_mesh_the_answer_is_what_it_was(fitted: list[Profile]) -> None:
    flat = [load(4, 1), load(8, 1)]
    fit = fit_world_sizes(flat)
    for phase in fit.phases.values():
        assert phase.per_sample_split_bytes == phase.gathered_bytes == 0.0
        assert phase.dp_sharded_bytes == 0.0
    # Above every measured world size the largest one caps it, as before (no refusal).
    above = estimate_world_size(flat, MeshShape(16))
    assert above.max_micro_batch_size <= load(8, 1).max_micro_batch_size
    assert above.describe().startswith(f"M* {above.max_micro_batch_size} at world size 16")
    assert "estimated from world sizes 4, 8" in above.describe()
    # Below the measured dp on a mesh: refused (it would extrapolate upwards in memory).
    with pytest.raises(BadInputError, match=r"outside the measured dp 2\.\.4"):
        estimate_world_size([load(8, 4), load(8, 2)], MeshShape(4, 4))
    # A mesh asked of profiles without one would extrapolate in tp.
    with pytest.raises(BadInputError, match="outside the measured"):
        estimate_world_size(flat, MeshShape(8, 2))
