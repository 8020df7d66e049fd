"""HTTP to the service, shared by the client and the worker. Torch-free.

Timeouts on every request; failures retried a bounded number of times with exponential
backoff; error bodies (``{"error": {"code", "message"}}``) turned back into the exception
type the service raised. What still fails after the retries (no connection, a timeout, a
502/503/504 from the service or a proxy in front of it) is a ``ServiceUnavailableError``,
so callers can tell "not reachable" from an answer.

Only what is harmless to do twice is retried once it may have reached the service: after
a timeout, a dropped connection or a 502/503/504, the service (or a proxy) may well have
done the request and lost only the answer. Repeatable are the idempotent methods (GET,
HEAD, OPTIONS, PUT, DELETE), a POST whose JSON body carries an ``idempotency_key`` (the
service answers a replay with what the first request stored), and a request sent with
``idempotent=True``. A request that never left (no connection could be made) is retried
whatever it is.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from typing import Any

import httpx

from tuner.core.errors import ERRORS_BY_CODE, BadInputError, ServiceUnavailableError, TunerError
from tuner.core.wire.common import PROJECT_ENV, PROJECT_HEADER

RETRYABLE_STATUS = {502, 503, 504}
IDEMPOTENT_METHODS = frozenset({"GET", "HEAD", "OPTIONS", "PUT", "DELETE"})
# Raised before any byte of the request was sent: the service cannot have seen it.
_NOT_SENT = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout)


def repeatable(method: str, json: Any = None) -> bool:
    """Whether sending the request twice does what sending it once does."""
    if method.upper() in IDEMPOTENT_METHODS:
        return True
    return isinstance(json, Mapping) and json.get("idempotency_key") is not None


def error_from_response(response: httpx.Response) -> TunerError:
    """The exception the service raised, rebuilt from its JSON error body."""
    try:
        error = response.json()["error"]
        code, message = str(error["code"]), str(error["message"])
    except (ValueError, KeyError, TypeError):
        status = response.status_code
        if status in RETRYABLE_STATUS:
            # A gateway's own page: the service behind it is down, restarting or overloaded.
            return ServiceUnavailableError(
                f"the service at {response.request.url.host} answered {status} "
                f"{response.reason_phrase} without an error of its own (a proxy with no "
                "service behind it, or one that is restarting): try again later"
            )
        return TunerError(f"the service answered {status}: {response.text[:200]}")
    cls = ERRORS_BY_CODE.get(code)
    if cls is None:
        cls = BadInputError if response.status_code in (413, 422) else TunerError
    return cls(message)


class Transport:
    """One service base URL and token, with timeouts and bounded retries."""

    def __init__(
        self,
        url: str,
        *,
        token: str | None = None,
        timeout: float = 10.0,
        retries: int = 3,
        backoff: float = 0.2,
    ) -> None:
        if not url.startswith(("http://", "https://")):
            raise BadInputError(f"service URL {url!r} must start with http:// or https://")
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        # The project a token of every project acts in (one of a project's own may name
        # its project too; naming another is refused).
        project = os.environ.get(PROJECT_ENV)
        if project:
            headers[PROJECT_HEADER] = project
        self.url = url.rstrip("/")
        self.retries = retries
        self.backoff = backoff
        self._http = httpx.Client(base_url=self.url, headers=headers, timeout=timeout)

    def close(self) -> None:
        self._http.close()

    def request(
        self, method: str, path: str, *, idempotent: bool | None = None, **kwargs: Any
    ) -> Any:
        """Send, retrying what may succeed later and is harmless to repeat (``idempotent``:
        say so for a POST that is; by default :func:`repeatable` decides); return the JSON
        body or raise TunerError."""
        again = repeatable(method, kwargs.get("json")) if idempotent is None else idempotent
        attempt = 0
        while True:
            try:
                response = self._http.request(method, path, **kwargs)
            except httpx.TransportError as exc:
                if attempt >= self.retries:
                    raise ServiceUnavailableError(
                        f"cannot reach the service at {self.url}: {exc}"
                    ) from None
                if not again and not isinstance(exc, _NOT_SENT):
                    raise ServiceUnavailableError(
                        f"no answer from the service at {self.url} to {method} {path} ({exc}): "
                        "it may have been done; look before sending it again"
                    ) from None
            else:
                last = attempt >= self.retries or not again
                if response.status_code not in RETRYABLE_STATUS or last:
                    if response.is_success:
                        return _json(response) if response.content else None
                    raise error_from_response(response)
            time.sleep(self.backoff * 2**attempt)
            attempt += 1


def _json(response: httpx.Response) -> Any:
    try:
        return response.json()
    except ValueError:
        raise TunerError(
            f"{response.request.url} answered {response.status_code} with something that is "
            "not JSON: check that the URL is the microbatch-tuner service (TUNER_URL)"
        ) from None
