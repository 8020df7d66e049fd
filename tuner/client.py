"""The REST client of the recommendation service. Torch-free, so it runs anywhere.

Configured by arguments or by the environment (``TUNER_URL``, ``TUNER_TOKEN``)::

    from tuner.client import TunerClient

    with TunerClient() as client:
        plan = client.recommend(workload="gpt", device="NVIDIA H100 80GB HBM3",
                                global_batch_size=512, world_size=8)
        print(plan.describe())

Answers are the service's own schemas (``api.schemas``, pydantic only); errors are the
``tuner.errors`` type the service raised, rebuilt by ``tuner.transport``.
"""

from __future__ import annotations

from datetime import datetime
from types import TracebackType
from typing import Any

from pydantic_settings import BaseSettings, SettingsConfigDict

from api.schemas.oom_reports import OomReportPublic
from api.schemas.profiles import ProfilePublic, ProfilesPublic
from api.schemas.recommendation import RecommendationPublic
from tuner.errors import BadInputError
from tuner.results import Profile
from tuner.transport import Transport

API_PREFIX = "/api/v1"


class ClientSettings(BaseSettings):
    """Where the service is and how to authenticate: ``TUNER_URL``, ``TUNER_TOKEN``."""

    model_config = SettingsConfigDict(env_prefix="TUNER_", extra="ignore")

    url: str | None = None
    token: str | None = None
    timeout: float = 10.0


class TunerClient:
    """Talks to one service; arguments left out come from ``ClientSettings``."""

    def __init__(
        self,
        url: str | None = None,
        *,
        token: str | None = None,
        timeout: float | None = None,
        retries: int = 3,
    ) -> None:
        settings = ClientSettings()
        url = url or settings.url
        if not url:
            raise BadInputError(
                "no service URL: pass url=... or set TUNER_URL, e.g. http://127.0.0.1:8000"
            )
        self.url = url.rstrip("/")
        self._transport = Transport(
            self.url,
            token=token or settings.token,
            timeout=timeout if timeout is not None else settings.timeout,
            retries=retries,
        )

    def close(self) -> None:
        self._transport.close()

    def __enter__(self) -> TunerClient:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    def _request(self, method: str, path: str, **kwargs: Any) -> Any:
        return self._transport.request(method, API_PREFIX + path, **kwargs)

    def recommend(
        self,
        *,
        workload: str,
        device: str,
        global_batch_size: int,
        world_size: int = 1,
        policy: str = "max",
    ) -> RecommendationPublic:
        """Micro batch and accumulation steps for ``workload`` (key or name) on ``device``."""
        params = {
            "workload": workload,
            "device": device,
            "global_batch_size": global_batch_size,
            "world_size": world_size,
            "policy": policy,
        }
        return RecommendationPublic.model_validate(
            self._request("GET", "/recommendation", params=params)
        )

    def upload_profile(self, profile: Profile) -> ProfilePublic:
        """Store ``profile``; sending the same one again returns the stored copy."""
        # Exactly what `tuner profile --json` prints (the service drops the derived peak_bytes).
        document = profile.model_dump(mode="json")
        return ProfilePublic.model_validate(self._request("POST", "/profiles", json=document))

    def get_profile(self, profile_id: int) -> ProfilePublic:
        """One stored profile with its probes."""
        return ProfilePublic.model_validate(self._request("GET", f"/profiles/{profile_id}"))

    def list_profiles(
        self,
        *,
        workload: str | None = None,
        device: str | None = None,
        created_after: datetime | None = None,
        created_before: datetime | None = None,
        limit: int | None = None,
        page_token: str | None = None,
    ) -> ProfilesPublic:
        """One page of profiles, newest first; pass ``next_page_token`` on for the next."""
        params = {
            name: value.isoformat() if isinstance(value, datetime) else value
            for name, value in (
                ("workload", workload),
                ("device", device),
                ("created_after", created_after),
                ("created_before", created_before),
                ("limit", limit),
                ("next_page_token", page_token),
            )
            if value is not None
        }
        return ProfilesPublic.model_validate(self._request("GET", "/profiles", params=params))

    def report_oom(
        self, *, workload: str, device: str, micro_batch_size: int, message: str | None = None
    ) -> OomReportPublic:
        """Tell the service that training ran out of memory at ``micro_batch_size``."""
        body = {
            "workload": workload,
            "device": device,
            "micro_batch_size": micro_batch_size,
            "message": message,
        }
        return OomReportPublic.model_validate(self._request("POST", "/oom-reports", json=body))
