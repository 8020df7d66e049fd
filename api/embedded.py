"""The client's store in this process: ``sqlite:///…`` or ``postgresql://…`` without a
server (:class:`tuner.client.store.Store`).

Each method calls the service function its route calls (``api.service``): the same request
schema checks its input first (a failure is the same ``BadInputError`` the service would
answer with a 422), and the same response schema comes back. No token is checked: whoever
can open the database holds every scope.

The client finds it through the ``tuner.stores`` entry points (``pyproject.toml``), and
imports it only when given a database URL, since it needs the server extra (SQLAlchemy,
Alembic, psycopg).
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import replace
from typing import Any, TypeVar

from pydantic import BaseModel, TypeAdapter, ValidationError
from sqlalchemy.exc import OperationalError

from api import service
from api.config import ServiceSettings
from api.db import Database
from api.migrate import prepare_database
from api.models import DEFAULT_PROJECT
from api.security import SCOPES, Principal, check_project_name
from api.store.projects import ensure_project, project_id_of, unknown_project
from tuner.core.errors import BadInputError, ServiceUnavailableError
from tuner.core.urls import redact
from tuner.core.wire.common import PROJECT_ENV, Id, describe_invalid
from tuner.core.wire.jobs import (
    JobClaim,
    JobCreate,
    JobFailure,
    JobPublic,
    JobResult,
    Lease,
    LeaseRef,
)
from tuner.core.wire.oom_reports import OomReportCreate, OomReportPublic
from tuner.core.wire.profiles import ProfileCreate, ProfilePublic, ProfileQuery, ProfilesPublic
from tuner.core.wire.recommendation import RecommendationPublic, RecommendationQuery
from tuner.core.wire.workers import WorkerCreate, WorkerPublic

Request = TypeVar("Request", bound=BaseModel)
_ROW_ID: TypeAdapter[int] = TypeAdapter(Id)
# Whoever opens the database: every scope, and no token (rows it writes belong to nobody's).
_OWNER = Principal(None, "database", frozenset(SCOPES))


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

    def __init__(self, url: str, *, project: str | None = None) -> None:
        self.url = url
        self.project = project or os.environ.get(PROJECT_ENV) or DEFAULT_PROJECT
        check_project_name(self.project)
        self._settings = ServiceSettings(database_url=url)
        self._db = Database(url)  # connects on first use
        self._prepared = False
        self._owner = _OWNER

    def close(self) -> None:
        self._db.dispose()

    @contextmanager
    def _prepared_db(self) -> Iterator[Database]:
        """The database, prepared on first use; a database that cannot be reached is a
        ServiceUnavailableError, as a service that cannot be reached is."""
        try:
            if not self._prepared:
                # As `tuner serve` does: an SQLite file is created and migrated on first
                # use; PostgreSQL must already be at the head revision (`tuner db upgrade`).
                prepare_database(self._settings)
                # Whoever opens the database acts in its project, created if new.
                with self._db.session(write=True) as session:
                    project_id = ensure_project(session, self.project).id
                self._owner = replace(_OWNER, project_id=project_id)
                self._prepared = True
            yield self._db
        except OperationalError as exc:
            reason = str(exc.orig).strip().splitlines()[0] if exc.orig else type(exc).__name__
            raise ServiceUnavailableError(
                f"cannot reach the database at {redact(self.url)}: {reason}"
            ) from None

    def recommend(self, query: RecommendationQuery) -> RecommendationPublic:
        with self._prepared_db() as db:
            return service.recommend(db, query, project_id=self._project_of(db, query.project))

    def _project_of(self, db: Database, name: str | None) -> int:
        """The project a question names (whoever opens the database may read any), else
        the one the store was opened in."""
        if name is None or name == self.project:
            return self._owner.project
        with db.session() as session:
            found = project_id_of(session, name)
        if found is None:
            raise unknown_project(name)
        return found

    def upload_profile(self, document: Mapping[str, Any]) -> ProfilePublic:
        body = _parse(ProfileCreate, document, "body")
        with self._prepared_db() as db:
            # No token here: rows belong to whoever uses this database directly.
            return service.upload_profile(
                db, body, registered_by=None, project_id=self._owner.project
            )[0]

    def get_profile(self, profile_id: int) -> ProfilePublic:
        profile_id = _row_id(profile_id, "profile_id")
        with self._prepared_db() as db:
            return service.get_profile(db, profile_id, project_id=self._owner.project)

    def list_profiles(self, params: Mapping[str, Any]) -> ProfilesPublic:
        query = _parse(ProfileQuery, params, "query")
        with self._prepared_db() as db:
            return service.list_profiles(db, query, project_id=self._owner.project)

    def report_oom(self, body: Mapping[str, Any]) -> OomReportPublic:
        report = _parse(OomReportCreate, body, "body")
        with self._prepared_db() as db:
            return service.report_oom(db, report, token_id=None, project_id=self._owner.project)[0]

    def queue_job(self, body: Mapping[str, Any]) -> JobPublic:
        job = _parse(JobCreate, body, "body")
        with self._prepared_db() as db:
            return service.queue_job(
                db,
                job,
                max_attempts=self._settings.max_attempts,
                token_id=None,
                project_id=self._owner.project,
            )[0]

    def get_job(self, job_id: int) -> JobPublic:
        job_id = _row_id(job_id, "job_id")
        with self._prepared_db() as db:
            return service.get_job(db, job_id, project_id=self._owner.project)

    def register_worker(self, body: Mapping[str, Any]) -> WorkerPublic:
        worker = _parse(WorkerCreate, body, "body")
        with self._prepared_db() as db:
            return service.register_worker(db, worker, self._owner)[0]

    def leave_worker(self, worker_id: int) -> WorkerPublic:
        worker_id = _row_id(worker_id, "worker_id")
        with self._prepared_db() as db:
            return service.leave_worker(db, worker_id, self._owner)

    def claim_job(self, worker_id: int, *, ranks: int) -> JobClaim | None:
        worker_id = _row_id(worker_id, "worker_id")
        with self._prepared_db() as db:
            return service.claim_job(
                db, worker_id, self._owner, lease_seconds=self._settings.lease_seconds, ranks=ranks
            )

    def extend_lease(self, job_id: int, body: Mapping[str, Any]) -> Lease:
        job_id, ref = _row_id(job_id, "job_id"), _parse(LeaseRef, body, "body")
        with self._prepared_db() as db:
            return service.extend_lease(
                db, job_id, ref.lease_id, self._owner, lease_seconds=self._settings.lease_seconds
            )

    def submit_result(self, job_id: int, body: Mapping[str, Any]) -> JobPublic:
        job_id, result = _row_id(job_id, "job_id"), _parse(JobResult, body, "body")
        with self._prepared_db() as db:
            return service.complete_job(db, job_id, result.lease_id, self._owner, result.profile)

    def report_failure(self, job_id: int, body: Mapping[str, Any]) -> JobPublic:
        job_id, failure = _row_id(job_id, "job_id"), _parse(JobFailure, body, "body")
        with self._prepared_db() as db:
            return service.fail_job(
                db,
                job_id,
                failure.lease_id,
                self._owner,
                reason=failure.reason,
                retryable=failure.retryable,
            )
