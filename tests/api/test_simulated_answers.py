"""A fake world's profile (one process stood for rank 0, ``--fake-world``) measured memory,
not speed: its collectives moved no data. Answers from it say so and quote no speed
(the offline plan here; the service and the dashboard in tests/dashboard/test_simulated.py)."""

from __future__ import annotations

from tests.api.documents import sample_profile
from tuner.answer.local import answer_from
from tuner.core.parallel import Parallel
from tuner.core.results import ProbeSettings, Profile


def fake_world(*, simulated: bool = True, minute: int = 0) -> Profile:
    base = sample_profile(max_micro_batch_size=8)
    return base.model_copy(
        update={
            "world_size": 8,
            "parallel": Parallel(mode="fsdp"),
            "settings": ProbeSettings(simulated_ranks=simulated),
            "created_at": base.created_at.replace(minute=minute),
        }
    )


def test_an_answer_from_a_fake_world_quotes_no_speed_and_says_why() -> None:
    real = answer_from(fake_world(simulated=False), global_batch_size=64)
    assert real.expected_samples_per_second is not None
    assert not real.profile_simulated_ranks
    fake = answer_from(fake_world(), global_batch_size=64)
    assert fake.profile_simulated_ranks
    assert fake.expected_samples_per_second is None
    assert fake.measured_samples_per_second == {}
    # Memory was measured: the settings are the same as the real run's.
    assert (fake.micro_batch_size, fake.grad_accum) == (real.micro_batch_size, real.grad_accum)
