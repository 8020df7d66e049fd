"""One exception family for the whole product.

Every error carries a stable ``code``. The CLI maps codes to exit statuses, the service
maps them to HTTP statuses, and the client rebuilds the same type from the code it
receives, so a caller handles one family wherever the error was raised.
"""

from __future__ import annotations

from typing import ClassVar


class TunerError(Exception):
    """Base of every error this project raises on purpose."""

    code: ClassVar[str] = "error"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class BadInputError(TunerError):
    """The caller gave something unusable; the message says what to give instead."""

    code = "bad_input"


class WorkloadError(BadInputError):
    """A workload target cannot be imported or does not describe a training step."""

    code = "bad_workload"


class DeviceUnavailableError(BadInputError):
    """The requested device does not exist on this machine."""

    code = "device_unavailable"


class NothingFitsError(TunerError):
    """Not even a micro batch of one sample fits in the memory budget."""

    code = "nothing_fits"


class NotFoundError(TunerError):
    """The thing asked for does not exist (yet)."""

    code = "not_found"


class ConflictError(TunerError):
    """The request contradicts the current state (a stale lease, a finished job)."""

    code = "conflict"


class AuthenticationError(TunerError):
    """No token, or a token that is unknown or revoked."""

    code = "unauthenticated"


class PermissionDeniedError(TunerError):
    """A valid token without the scope this action needs."""

    code = "forbidden"


class ServiceUnavailableError(TunerError):
    """The service could not be reached or did not answer in time."""

    code = "unavailable"


class RateLimitedError(TunerError):
    """Too many writes from one token in the service's window; ``retry_after_s`` says
    when the next one is accepted."""

    code = "rate_limited"

    def __init__(self, message: str, retry_after_s: int = 1) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class RankFailedError(TunerError):
    """A rank of a profile at world size W raised an error that is not an out-of-memory,
    died, or did not answer in time; the message carries its traceback or exit status."""

    code = "rank_failed"


ERRORS_BY_CODE: dict[str, type[TunerError]] = {
    cls.code: cls
    for cls in (
        TunerError,
        BadInputError,
        WorkloadError,
        DeviceUnavailableError,
        NothingFitsError,
        NotFoundError,
        ConflictError,
        AuthenticationError,
        PermissionDeniedError,
        ServiceUnavailableError,
        RateLimitedError,
        RankFailedError,
    )
}
