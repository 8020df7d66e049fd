"""tuner.engine.explore: every declared variant profiled with the real search on a real
tiny model, and the choice by measured speed that keeps the global batch exact."""

from __future__ import annotations

import pytest
import torch

from tests.variant_workloads import stack
from tuner.core.errors import BadInputError, WorkloadError
from tuner.core.results import Profile
from tuner.engine.backends import CpuBackend
from tuner.engine.explore import describe_variant, explore, should_explore
from tuner.engine.profiler import profile_workload
from tuner.engine.workload import Workload, load_workload, variant_options

TARGET = "tests.variant_workloads:stack"
# M* is about 10 for the stack at this limit, 3 at the smaller one.
LIMIT, SHORT_LIMIT = 1_000_000, 460_000


def test_variants_are_every_combination_with_the_loaded_one_first() -> None:
    combinations = variant_options(load_workload(TARGET, {"checkpointing": True}))
    assert combinations == [{"precision": "fp32"}, {"precision": "bf16"}]
    every = variant_options(load_workload(TARGET))
    assert len(every) == 4
    assert every[0] == {"checkpointing": False, "precision": "fp32"}
    assert len({describe_variant(c) for c in every}) == 4  # type: ignore[arg-type]


def test_variants_must_list_alternatives() -> None:
    with pytest.raises(WorkloadError, match="two or more values"):
        Workload(
            model=torch.nn.Linear(2, 2),
            optimizer=lambda params: torch.optim.SGD(params, lr=0.1),
            make_batch=lambda n: torch.zeros(n, 2),
            loss_fn=lambda model, batch: model(batch).sum(),
            variants={"checkpointing": [True]},
        )


def test_a_workload_without_a_target_cannot_be_explored() -> None:
    backend = CpuBackend(LIMIT)
    with pytest.raises(BadInputError, match="load_workload"):
        explore(stack(), backend, lambda w: profile_workload(w, backend), global_batch_size=8)


def test_the_choice_is_the_fastest_measured_plan_and_keeps_the_global_batch_exact() -> None:
    backend = CpuBackend(LIMIT)
    workload = load_workload(TARGET)
    measured: list[Profile] = []

    def measure(variant: Workload) -> Profile:
        measured.append(profile_workload(variant, backend))
        return measured[-1]

    loaded = profile_workload(workload, backend)
    exploration = explore(workload, backend, measure, global_batch_size=24, done=loaded)
    # The loaded workload's profile is reused, the three other variants measured.
    assert len(measured) == 3
    assert exploration.variants[0].profile.created_at == loaded.created_at
    groups = {o.profile.variant_group for o in exploration.variants}
    assert groups == {exploration.group}
    assert exploration.group is not None
    assert [o.profile.variant for o in exploration.variants] == variant_options(workload)
    # Checkpointing saves memory per sample: a larger micro batch fits.
    by_label = {o.label: o for o in exploration.variants}
    plain = by_label["checkpointing=false precision=fp32"].profile.max_micro_batch_size
    assert by_label["checkpointing=true precision=fp32"].profile.max_micro_batch_size > plain
    for outcome in exploration.variants:
        plan = outcome.recommendation
        assert plan is not None
        assert sum(plan.split) == 24
        assert max(plan.split) <= outcome.profile.max_micro_batch_size
        assert outcome.samples_per_second is not None
        assert outcome.samples_per_second > 0
    chosen = exploration.chosen
    assert chosen is not None
    assert chosen.samples_per_second == max(
        o.samples_per_second or 0.0 for o in exploration.variants
    )


def test_exploring_starts_by_itself_below_four_or_when_nothing_fits() -> None:
    short = profile_workload(load_workload(TARGET), CpuBackend(SHORT_LIMIT))
    assert 1 <= short.max_micro_batch_size < 4
    assert should_explore(short)
    roomy = profile_workload(load_workload(TARGET), CpuBackend(LIMIT))
    assert not should_explore(roomy)
