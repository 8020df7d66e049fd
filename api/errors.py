"""Errors as HTTP: one JSON shape, ``{"error": {"code", "message", "fields"?}}``, and one
status per error code. The client rebuilds the same exception type from ``code``."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from tuner.core.errors import RateLimitedError, TunerError
from tuner.core.wire.common import describe_invalid

STATUS_BY_CODE = {
    "bad_input": 422,
    "bad_workload": 422,
    "device_unavailable": 422,
    "nothing_fits": 409,
    "not_found": 404,
    "conflict": 409,
    "unauthenticated": 401,
    "forbidden": 403,
    "unavailable": 503,
    "payload_too_large": 413,
    "rate_limited": 429,
}


def error_body(
    code: str, message: str, fields: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    error: dict[str, Any] = {"code": code, "message": message}
    if fields is not None:
        error["fields"] = fields
    return {"error": error}


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(TunerError)
    async def _tuner_error(_request: Request, exc: TunerError) -> JSONResponse:
        status = STATUS_BY_CODE.get(exc.code, 400)
        headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
        if isinstance(exc, RateLimitedError):
            headers = {"Retry-After": str(exc.retry_after_s)}
        return JSONResponse(error_body(exc.code, exc.message), status_code=status, headers=headers)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(_request: Request, exc: RequestValidationError) -> JSONResponse:
        message, fields = describe_invalid(exc.errors())
        return JSONResponse(error_body("bad_input", message, fields), status_code=422)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(_request: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = {404: "not_found", 405: "method_not_allowed", 413: "payload_too_large"}.get(
            exc.status_code, "http_error"
        )
        return JSONResponse(error_body(code, str(exc.detail)), status_code=exc.status_code)
