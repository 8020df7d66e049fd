"""Talking to the service, torch-free: ``TunerClient`` over one store interface chosen
by URL (``rest`` over http(s)://; for sqlite:/// and postgresql://, the store the service
declares as a ``tuner.stores`` entry point), HTTP with timeouts and retries
(``transport``), and offline answers (``answer_cache``). ``RecommendationPublic`` is what
``TunerClient.recommend`` answers with when the service answers."""

from tuner.client.client import (  # the public surface: these, and nothing else of the module
    CachedRecommendation,
    ClientSettings,
    Fallback,
    OfflineRecommendation,
    OomReporter,
    RecommendationPublic,
    TunerClient,
    TunerClientWarning,
    TunerOfflineWarning,
)

__all__ = [
    "CachedRecommendation",
    "ClientSettings",
    "Fallback",
    "OfflineRecommendation",
    "OomReporter",
    "RecommendationPublic",
    "TunerClient",
    "TunerClientWarning",
    "TunerOfflineWarning",
]
