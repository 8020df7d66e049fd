"""What a question means and what its answer is, decided once, torch-free.

:func:`decide` takes a question (:class:`RecommendationQuery`) and the evidence a store
hands over (:class:`Evidence`: plain reads of stored rows) and returns the answer
(:class:`RecommendationPublic`) or raises the error that refuses it. Which profile is
current, what an OOM report caps and what a footprint is are :mod:`tuner.answer.current`'s
definitions; which row a name means is :mod:`tuner.answer.identity`'s. The REST route, the
embedded store, the CLI, the client's offline plan, ``plan_training`` and the dashboard all
call these; no other module decides any of it.
"""

from tuner.answer.decide import decide, profile_command
from tuner.answer.evidence import (
    DeviceRow,
    Evidence,
    MemoryEvidence,
    OomRow,
    ProfileRow,
    WorkloadRow,
)
from tuner.core.wire.recommendation import RecommendationPublic, RecommendationQuery

__all__ = [
    "DeviceRow",
    "Evidence",
    "MemoryEvidence",
    "OomRow",
    "ProfileRow",
    "RecommendationPublic",
    "RecommendationQuery",
    "WorkloadRow",
    "decide",
    "profile_command",
]
