"""tuner.engine.explore: every declared variant profiled with the real search on a real
tiny model, and the choice by measured speed that keeps the global batch exact."""

from __future__ import annotations

import pytest
import torch

from tests.variant_workloads import stack
from tuner.core.errors import BadInputError, WorkloadError
from tuner.core.results import Profile
from tuner.engine.backends import CpuBackend
from tuner.engine.explore import (
    VariantOutcome,
    choose,
    describe_variant,
    explore,
    should_explore,
)
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
        explore(stack(), lambda w: profile_workload(w, backend), global_batch_size=8)


@pytest.mark.slow
def test_the_choice_is_the_fastest_measured_plan_and_keeps_the_global_batch_exact() -> None:
    backend = CpuBackend(LIMIT)
    workload = load_workload(TARGET)
    measured: list[Profile] = []

    def measure(variant: Workload) -> Profile:
        measured.append(profile_workload(variant, backend))
        return measured[-1]

    loaded = profile_workload(workload, backend)
    exploration = explore(workload, measure, global_batch_size=24, done=loaded)
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
        assert sum(plan.flat_split()) == 24
        assert max(plan.flat_split()) <= outcome.profile.max_micro_batch_size
        assert outcome.samples_per_second is not None
        assert outcome.samples_per_second > 0
        assert outcome.spread is not None  # three timed rounds each
        assert 0 <= outcome.spread < 1
    # The fastest, when it beats the variant as loaded by more than the spread; else the
    # variant as loaded, saying so.
    chosen = exploration.chosen
    assert chosen is not None
    fastest = max(exploration.variants, key=lambda o: o.samples_per_second or 0.0)
    loaded = exploration.variants[0]
    assert chosen in (fastest, loaded)
    if chosen is loaded and fastest is not loaded:
        assert "within the spread of the timed rounds" in exploration.reason
    elif chosen is not loaded:
        assert "more than the measured spread" in exploration.reason


def _outcome(label: str, speed: float, spread: float | None, fits: bool = True) -> VariantOutcome:
    profile = Profile.model_construct(max_micro_batch_size=4 if fits else 0, probes=[])
    return VariantOutcome({"variant": label}, profile, None, speed, spread)


@pytest.mark.parametrize(
    ("others", "chosen", "reason"),
    [
        ([("fast", 104.0, 0.02)], "loaded", "measured 4% faster, within the spread"),
        ([("fast", 110.0, 0.02)], "fast", "10% faster than as loaded, more than the measured"),
        ([("slow", 90.0, 0.01)], "loaded", "the fastest measured"),
        ([("fast", 104.0, None)], "fast", "timed once: no spread to weigh"),
    ],
    ids=["within-spread", "beyond-spread", "loaded-fastest", "no-spread"],
)
def test_a_variant_is_chosen_for_speed_only_beyond_the_spread(
    others: list[tuple[str, float, float | None]], chosen: str, reason: str
) -> None:
    loaded = _outcome("loaded", 100.0, 0.05)
    picked, why = choose([loaded, *(_outcome(*other) for other in others)])
    assert picked is not None
    assert picked.options["variant"] == chosen
    assert reason in why


def test_when_the_variant_as_loaded_does_not_fit_the_fastest_that_fits_is_chosen() -> None:
    loaded = _outcome("loaded", 0.0, None, fits=False)
    picked, why = choose([loaded, _outcome("a", 50.0, 0.3), _outcome("b", 60.0, 0.3)])
    assert picked is not None
    assert picked.options["variant"] == "b"
    assert "does not" in why
    assert choose([_outcome("loaded", 0.0, None, fits=False)]) == (None, "no variant fits")


@pytest.mark.slow
def test_exploring_starts_by_itself_below_four_or_when_nothing_fits() -> None:
    short = profile_workload(load_workload(TARGET), CpuBackend(SHORT_LIMIT))
    assert 1 <= short.max_micro_batch_size < 4
    assert should_explore(short)
    roomy = profile_workload(load_workload(TARGET), CpuBackend(LIMIT))
    assert not should_explore(roomy)
