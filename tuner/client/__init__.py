"""Talking to the service, torch-free: ``TunerClient`` over one store interface chosen
by URL (``rest`` over http(s)://, ``embedded`` for sqlite:/// and postgresql://), HTTP with
timeouts and retries (``transport``), and offline answers (``answer_cache``)."""

from tuner.client.client import (  # the public surface: these, and nothing else of the module
    CachedRecommendation,
    ClientSettings,
    Fallback,
    OfflineRecommendation,
    OomReporter,
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
    "TunerClient",
    "TunerClientWarning",
    "TunerOfflineWarning",
]
