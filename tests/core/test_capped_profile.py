"""Which profile an out-of-memory report caps, as the failures page links it
(:func:`tuner.answer.current.capped_profile`): the one the failing plan came from when the
report says, else the pair's newest received before the report; never another pair's, and
none where the pair had no profile yet."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from tuner.answer.current import capped_profile
from tuner.answer.evidence import OomRow, ProfileRow

T0 = datetime(2026, 11, 1, tzinfo=UTC)


def _profile(profile_id: int, *, hours: int, workload: int = 1, device: int = 1) -> ProfileRow:
    return ProfileRow(
        id=profile_id,
        workload_id=workload,
        device_id=device,
        device_key="d" * 24,
        received_at=T0 + timedelta(hours=hours),
        created_at=T0,
        max_micro_batch_size=8,
        headroom=0.05,
        size_cap=4096,
    )


def _report(*, hours: int, profile_id: int | None = None) -> OomRow:
    return OomRow(
        id=1,
        workload_id=1,
        device_id=1,
        micro_batch_size=8,
        created_at=T0 + timedelta(hours=hours),
        profile_id=profile_id,
    )


PROFILES = [
    _profile(1, hours=1),
    _profile(2, hours=2),
    _profile(3, hours=5),  # received after the reports below
    _profile(4, hours=3, device=2),  # another device: another pair
]


def test_the_pairs_newest_received_before_the_report() -> None:
    capped = capped_profile(_report(hours=4), PROFILES)
    assert capped is not None
    assert capped.id == 2


def test_the_profile_the_failing_plan_came_from() -> None:
    capped = capped_profile(_report(hours=4, profile_id=1), PROFILES)
    assert capped is not None
    assert capped.id == 1


def test_a_named_profile_of_another_pair_is_not_the_one_capped() -> None:
    capped = capped_profile(_report(hours=4, profile_id=4), PROFILES)
    assert capped is not None
    assert capped.id == 2


def test_none_before_the_pair_had_a_profile() -> None:
    assert capped_profile(_report(hours=0), PROFILES) is None
