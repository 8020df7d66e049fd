"""The answer from profiles in hand, as the service would give it: what ``tuner profile
--global-batch-size`` prints and what ``plan_training`` trains with when the service
cannot be reached. The same :func:`tuner.answer.decide`, over :class:`MemoryEvidence`."""

from __future__ import annotations

from tuner.answer.decide import decide
from tuner.answer.evidence import MemoryEvidence
from tuner.core import plan
from tuner.core.results import Profile
from tuner.core.shape import MeshShape
from tuner.core.wire.recommendation import RecommendationPublic, RecommendationQuery


def answer_from(
    profile: Profile,
    *,
    global_batch_size: int,
    mesh: MeshShape | None = None,
    policy: plan.Policy = plan.DEFAULT_POLICY,
) -> RecommendationPublic:
    """The answer for ``global_batch_size`` over ``mesh`` (the profile's own ranks by
    default) from ``profile`` alone, asked in the profile's parallel mode."""
    mesh = mesh or MeshShape(profile.world_size, profile.parallel.tp)
    question = RecommendationQuery.at(
        mesh,
        workload=profile.workload_key,
        device=profile.device_key,
        global_batch_size=global_batch_size,
        parallel=profile.parallel.mode,
        policy=policy,
    )
    return decide(question, MemoryEvidence.of_profiles([profile]), now=profile.created_at)
