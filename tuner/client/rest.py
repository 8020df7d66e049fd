"""The store over HTTP: the client's side of ``/api/v1``. Torch-free, and free of FastAPI
and SQLAlchemy, so it runs anywhere."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tuner.client.transport import Transport
from tuner.core.wire.common import API_PREFIX, PROJECT_HEADER
from tuner.core.wire.jobs import JobClaim, JobPublic, Lease
from tuner.core.wire.oom_reports import OomReportPublic
from tuner.core.wire.profiles import ProfilePublic, ProfilesPublic
from tuner.core.wire.recommendation import RecommendationPublic, RecommendationQuery
from tuner.core.wire.workers import WorkerPublic


class RestStore:
    """One service's REST API, with the transport's timeouts and bounded retries."""

    def __init__(
        self, url: str, *, token: str | None, timeout: float, retries: int, backoff: float
    ) -> None:
        self._transport = Transport(
            url, token=token, timeout=timeout, retries=retries, backoff=backoff
        )
        self.url = self._transport.url

    def close(self) -> None:
        self._transport.close()

    def _call(self, method: str, path: str, **kwargs: Any) -> Any:
        return self._transport.request(method, API_PREFIX + path, **kwargs)

    def recommend(self, query: RecommendationQuery) -> RecommendationPublic:
        # The project travels as the request's header (this question's, over the client's).
        params = query.params()
        project = params.pop("project", None)
        headers = {PROJECT_HEADER: project} if project is not None else None
        answer = self._call("GET", "/recommendation", params=params, headers=headers)
        return RecommendationPublic.model_validate(answer)

    def upload_profile(self, document: Mapping[str, Any]) -> ProfilePublic:
        # A profile is named by its workload, device and created_at: sent twice, it is
        # stored once (the second answer is the stored one).
        stored = self._call("POST", "/profiles", json=dict(document), idempotent=True)
        return ProfilePublic.model_validate(stored)

    def get_profile(self, profile_id: int) -> ProfilePublic:
        return ProfilePublic.model_validate(self._call("GET", f"/profiles/{profile_id}"))

    def list_profiles(self, params: Mapping[str, Any]) -> ProfilesPublic:
        return ProfilesPublic.model_validate(self._call("GET", "/profiles", params=dict(params)))

    def report_oom(self, body: Mapping[str, Any]) -> OomReportPublic:
        return OomReportPublic.model_validate(self._call("POST", "/oom-reports", json=dict(body)))

    def queue_job(self, body: Mapping[str, Any]) -> JobPublic:
        return JobPublic.model_validate(self._call("POST", "/jobs", json=dict(body)))

    def get_job(self, job_id: int) -> JobPublic:
        return JobPublic.model_validate(self._call("GET", f"/jobs/{job_id}"))

    def register_worker(self, body: Mapping[str, Any]) -> WorkerPublic:
        return WorkerPublic.model_validate(self._call("POST", "/workers", json=dict(body)))

    def leave_worker(self, worker_id: int) -> WorkerPublic:
        return WorkerPublic.model_validate(self._call("POST", f"/workers/{worker_id}/leave"))

    def claim_job(self, worker_id: int, *, ranks: int) -> JobClaim | None:
        reply = self._call("POST", f"/workers/{worker_id}/claim", params={"ranks": ranks})
        return None if reply is None else JobClaim.model_validate(reply)  # 204: none queued

    def extend_lease(self, job_id: int, body: Mapping[str, Any]) -> Lease:
        return Lease.model_validate(
            self._call("POST", f"/jobs/{job_id}/heartbeat", json=dict(body))
        )

    def submit_result(self, job_id: int, body: Mapping[str, Any]) -> JobPublic:
        return JobPublic.model_validate(
            self._call("POST", f"/jobs/{job_id}/result", json=dict(body))
        )

    def report_failure(self, job_id: int, body: Mapping[str, Any]) -> JobPublic:
        return JobPublic.model_validate(
            self._call("POST", f"/jobs/{job_id}/failure", json=dict(body))
        )
