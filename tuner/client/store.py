"""One store interface for every call a client or a worker makes, and the URL that picks
its implementation.

``http(s)://…`` is the service's REST API (:class:`tuner.client.rest.RestStore`); a
database URL runs the service's own functions in this process, through the store the
service declares for that URL's scheme (the ``tuner.stores`` entry points: ``sqlite``,
``postgresql``, ``postgres``). Both take the wire contract's models or what
would go on the wire (the recommendation question as a :class:`RecommendationQuery`, JSON
bodies), check it where the service does, and give back the wire contract's response
schemas (:mod:`tuner.core.wire`), which are re-exported here for the worker (it reads the
service only through this package).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from importlib.metadata import entry_points
from typing import Any, Protocol

from tuner.core.errors import BadInputError
from tuner.core.extras import install_line
from tuner.core.urls import redact
from tuner.core.wire.jobs import JobClaim, JobPublic, Lease
from tuner.core.wire.oom_reports import OomReportPublic
from tuner.core.wire.profiles import ProfilePublic, ProfilesPublic
from tuner.core.wire.recommendation import RecommendationPublic, RecommendationQuery
from tuner.core.wire.workers import WorkerPublic

__all__ = ["JobClaim", "JobPublic", "Lease", "Store", "WorkerPublic", "open_store"]

HTTP_SCHEMES = ("http", "https")
DATABASE_SCHEMES = ("sqlite", "postgresql", "postgres")
SERVER_EXTRA = install_line("server") + " in your clone of microbatch-tuner"


class Store(Protocol):
    """What a client or a worker needs of the service; one implementation per kind of URL."""

    url: str

    def close(self) -> None: ...

    # The client's calls
    def recommend(self, query: RecommendationQuery) -> RecommendationPublic: ...
    def upload_profile(self, document: Mapping[str, Any]) -> ProfilePublic: ...
    def get_profile(self, profile_id: int) -> ProfilePublic: ...
    def list_profiles(self, params: Mapping[str, Any]) -> ProfilesPublic: ...
    def report_oom(self, body: Mapping[str, Any]) -> OomReportPublic: ...
    def queue_job(self, body: Mapping[str, Any]) -> JobPublic: ...
    def get_job(self, job_id: int) -> JobPublic: ...

    # The worker's calls
    def register_worker(self, body: Mapping[str, Any]) -> WorkerPublic: ...
    def leave_worker(self, worker_id: int) -> WorkerPublic: ...
    def claim_job(self, worker_id: int, *, ranks: int) -> JobClaim | None: ...
    def extend_lease(self, job_id: int, body: Mapping[str, Any]) -> Lease: ...
    def submit_result(self, job_id: int, body: Mapping[str, Any]) -> JobPublic: ...
    def report_failure(self, job_id: int, body: Mapping[str, Any]) -> JobPublic: ...


STORES_GROUP = "tuner.stores"


def _database_store(scheme: str) -> Callable[[str], Store]:
    """The store the service declares for a database URL's ``scheme``; an ``ImportError``
    when its packages (the server extra) or the declaration itself are missing."""
    for entry in entry_points(group=STORES_GROUP, name=scheme):
        store: Callable[[str], Store] = entry.load()
        return store
    raise ImportError(f"a {STORES_GROUP} entry point for {scheme}")


def open_store(
    url: str, *, token: str | None, timeout: float, retries: int, backoff: float
) -> Store:
    """The REST store for ``http(s)://…``, the embedded one for a database URL."""
    scheme = url.partition(":")[0].lower()
    if scheme in HTTP_SCHEMES:
        from tuner.client.rest import RestStore

        return RestStore(url, token=token, timeout=timeout, retries=retries, backoff=backoff)
    if scheme.partition("+")[0] in DATABASE_SCHEMES:
        try:
            return _database_store(scheme.partition("+")[0])(url)
        except ImportError as exc:
            raise BadInputError(
                f"{redact(url)} is a database: the client opens it in this process, which needs "
                f"the service's packages ({exc.name or exc} is missing): {SERVER_EXTRA}, or "
                "use the service's http(s):// URL"
            ) from None
    raise BadInputError(
        f"cannot use {redact(url)!r} as TUNER_URL: give the service (http://host:8000 or "
        "https://...) or a database to use without a server (sqlite:///path/to/tuner.db "
        "or postgresql://user@host/dbname)"
    )
