"""The store in this process: ``sqlite:///…`` or ``postgresql://…`` without a server.

Each method does what its route does (``api/routes``): the same request schema checks its
input (a failure is the same ``BadInputError`` the service would answer with a 422), the
same store function runs in the same kind of session, and the same response schema comes
back. No token is checked: whoever can open the database holds every scope.

Imported only when a client is given a database URL, since it needs the server extra
(SQLAlchemy, Alembic, psycopg).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any, TypeVar

from pydantic import BaseModel, TypeAdapter, ValidationError
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session

from api.answers import recommendation
from api.config import ServiceSettings
from api.db import Database
from api.errors import describe_invalid
from api.migrate import prepare_database
from api.models import utcnow
from api.schemas.common import Id
from api.schemas.jobs import JobCreate, JobPublic
from api.schemas.oom_reports import OomReportCreate, OomReportPublic
from api.schemas.profiles import ProfileCreate, ProfilePublic, ProfileQuery, ProfilesPublic
from api.schemas.recommendation import RecommendationPublic, RecommendationQuery
from api.store import jobs, oom_reports, profiles
from tuner.client.answer_cache import redact
from tuner.core.errors import BadInputError, ServiceUnavailableError

Request = TypeVar("Request", bound=BaseModel)
_ROW_ID: TypeAdapter[int] = TypeAdapter(Id)


def _parse(model: type[Request], data: Mapping[str, Any], location: str) -> Request:
    """``data`` as ``model``, or the BadInputError the service would answer with."""
    try:
        return model.model_validate(dict(data))
    except ValidationError as exc:
        raise BadInputError(describe_invalid(exc.errors(), location=(location,))[0]) from None


def _row_id(value: int, name: str) -> int:
    try:
        return _ROW_ID.validate_python(value)
    except ValidationError as exc:
        raise BadInputError(describe_invalid(exc.errors(), location=("path", name))[0]) from None


class EmbeddedStore:
    """The service's store functions over one database, called in this process."""

    def __init__(self, url: str) -> None:
        self.url = url
        self._settings = ServiceSettings(database_url=url)
        self._db = Database(url)  # connects on first use
        self._prepared = False

    def close(self) -> None:
        self._db.dispose()

    @contextmanager
    def _session(self, *, write: bool = False) -> Iterator[Session]:
        """A session of the route's kind; a database that cannot be reached is a
        ServiceUnavailableError, as a service that cannot be reached is."""
        try:
            if not self._prepared:
                # As `tuner serve` does: an SQLite file is created and migrated on first
                # use; PostgreSQL must already be at the head revision (`tuner db upgrade`).
                prepare_database(self._settings)
                self._prepared = True
            with self._db.session(write=write) as session:
                yield session
        except OperationalError as exc:
            reason = str(exc.orig).strip().splitlines()[0] if exc.orig else type(exc).__name__
            raise ServiceUnavailableError(
                f"cannot reach the database at {redact(self.url)}: {reason}"
            ) from None

    def recommend(self, params: Mapping[str, Any]) -> RecommendationPublic:
        query = _parse(RecommendationQuery, params, "query")
        with self._session() as session:
            return recommendation.recommend(session, query, now=utcnow())

    def upload_profile(self, document: Mapping[str, Any]) -> ProfilePublic:
        body = _parse(ProfileCreate, document, "body")
        with self._session(write=True) as session:
            row, _created = profiles.save_profile(session, body)
            return profiles.to_public(row)

    def get_profile(self, profile_id: int) -> ProfilePublic:
        profile_id = _row_id(profile_id, "profile_id")
        with self._session() as session:
            return profiles.to_public(profiles.get_profile(session, profile_id))

    def list_profiles(self, params: Mapping[str, Any]) -> ProfilesPublic:
        query = _parse(ProfileQuery, params, "query")
        with self._session() as session:
            rows, count, token = profiles.list_profiles(session, query)
            return ProfilesPublic(
                data=[profiles.to_summary(row) for row in rows], count=count, next_page_token=token
            )

    def report_oom(self, body: Mapping[str, Any]) -> OomReportPublic:
        report = _parse(OomReportCreate, body, "body")
        with self._session(write=True) as session:
            # No token here: keys belong to whoever uses this database directly.
            stored, _created = oom_reports.add_oom_report(session, report, token_id=None)
            return stored

    def queue_job(self, body: Mapping[str, Any]) -> JobPublic:
        job = _parse(JobCreate, body, "body")
        with self._session(write=True) as session:
            row, _created = jobs.create_job(
                session, job, max_attempts=self._settings.max_attempts, token_id=None
            )
            return JobPublic.model_validate(row)

    def get_job(self, job_id: int) -> JobPublic:
        job_id = _row_id(job_id, "job_id")
        # Leases that ran out are swept first, as the service does before every read.
        with self._session() as session:
            expired = jobs.has_expired_leases(session)
        if expired:
            with self._session(write=True) as session:
                jobs.expire_leases(session)
        with self._session() as session:
            return JobPublic.model_validate(jobs.get_job(session, job_id))
