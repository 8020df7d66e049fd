"""What every resource shares: storable field types, the page envelope and its token.

Every request schema forbids unknown fields and bounds every value to what the database
can hold, so that bad input is a field-level 422 and never a database error (a 500).
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Annotated, Any, Generic, TypeVar

from pydantic import (
    AfterValidator,
    AwareDatetime,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    Strict,
    StringConstraints,
    model_validator,
)

from tuner.core.names import check_name

# Where the REST API lives: the service mounts its routers here, clients and workers call here.
# The project a request acts in, for a token of every project (a token of one project may
# name its own); a client given the database itself acts in the one the variable names.
PROJECT_HEADER = "X-Tuner-Project"
PROJECT_ENV = "TUNER_PROJECT"
API_PREFIX = "/api/v1"

INT32_MAX = 2**31 - 1  # SQL INTEGER on PostgreSQL
INT64_MAX = 2**63 - 1  # SQL BIGINT
MAX_PAGE_SIZE = 500
DEFAULT_PAGE_SIZE = 50


def _storable_text(value: str) -> str:
    # PostgreSQL refuses NUL in text, and a lone surrogate (which JSON's \ud800 escape can
    # produce) cannot be encoded for either database.
    if "\x00" in value:
        raise ValueError("must not contain NUL (\\u0000) characters")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("must be valid Unicode text (no lone surrogate escapes)") from None
    return value


def _text(max_length: int) -> tuple[StringConstraints, AfterValidator]:
    return StringConstraints(max_length=max_length), AfterValidator(_storable_text)


# Strings sized to their columns (String(n)); LongText is for free text such as errors.
Text8 = Annotated[str, *_text(8)]
Text16 = Annotated[str, *_text(16)]
Text32 = Annotated[str, *_text(32)]
Text64 = Annotated[str, *_text(64)]
Text100 = Annotated[str, *_text(100)]
Text200 = Annotated[str, *_text(200)]
Text500 = Annotated[str, *_text(500)]
LongText = Annotated[str, *_text(65_536)]

Key = Annotated[
    str,
    StringConstraints(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.:-]+$"),
    Field(description="a device or workload key: 1 to 64 of A-Z a-z 0-9 _ . : -"),
]
IdempotencyKey = Annotated[
    str,
    StringConstraints(min_length=8, max_length=64, pattern=r"^[A-Za-z0-9_.:-]+$"),
    Field(
        description="chosen by the client for one request (a UUID), 8 to 64 of A-Z a-z 0-9 "
        "_ . : -: the same request sent again with it (a retry) is answered with what the "
        "first stored (200), never done twice; another request with it is a 409"
    ),
]
# Names are refused when another that looks the same could sit beside them (tuner.core.names);
# a reference is checked alike, so that asking by such a name says why (422), not 404.
Name = Annotated[
    str,
    StringConstraints(min_length=1, max_length=200),
    AfterValidator(_storable_text),
    AfterValidator(check_name),
]
Reference = Annotated[
    str,
    StringConstraints(min_length=1, max_length=200),
    AfterValidator(_storable_text),
    AfterValidator(check_name),
    Field(description="a key or a name"),
]
# Numbers in request bodies are JSON numbers and nothing else: strict, so that `true` is
# not taken for 1 nor "8 " for 8 (a JSON integer is still a valid float).
StrictBool = Annotated[bool, Strict()]
FiniteFloat = Annotated[float, Strict(), Field(allow_inf_nan=False)]
NonNegativeFloat = Annotated[float, Strict(), Field(ge=0, allow_inf_nan=False)]
Fraction = Annotated[float, Strict(), Field(ge=0, lt=1, allow_inf_nan=False)]
Int32 = Annotated[int, Strict(), Field(ge=0, le=INT32_MAX)]
PositiveInt32 = Annotated[int, Strict(), Field(ge=1, le=INT32_MAX)]
Int64 = Annotated[int, Strict(), Field(ge=0, le=INT64_MAX)]
PositiveInt64 = Annotated[int, Strict(), Field(ge=1, le=INT64_MAX)]
SignedInt64 = Annotated[int, Strict(), Field(ge=-INT64_MAX, le=INT64_MAX)]
Id = Annotated[int, Strict(), Field(ge=1, le=INT32_MAX)]

_MOST_DIGITS = 18  # every bound below 10**18; and int() of a long text is quadratic


def _decimal(value: object) -> object:
    # A query string is text, and pydantic's lax parsing reads "256.0", " 256", "2_56"
    # and "+256" as 256: one question with many spellings. Only plain digits are a number.
    # A minus sign is let through, for the bound to refuse it with the range allowed.
    if isinstance(value, str):
        digits = value.removeprefix("-")
        if not (digits.isascii() and digits.isdigit() and len(digits) <= _MOST_DIGITS):
            raise ValueError(
                f"must be an integer in plain decimal digits (at most {_MOST_DIGITS}), e.g. "
                "256: no plus sign, point, space or underscore"
            )
        return int(value)
    return value


# Integers from a query string or a path: plain decimal digits, else a 422 that says so.
# From Python (a client building a query) an int, strictly.
QueryInt = Annotated[int, BeforeValidator(_decimal), Strict()]


def _utc(value: datetime) -> datetime:
    try:
        return value.astimezone(UTC)
    except OverflowError:
        raise ValueError("is outside the range of dates that can be stored") from None


Timestamp = Annotated[AwareDatetime, AfterValidator(_utc)]


def _assume_utc(value: datetime) -> datetime:
    return _utc(value if value.tzinfo is not None else value.replace(tzinfo=UTC))


LooseTimestamp = Annotated[
    datetime,
    AfterValidator(_assume_utc),
    Field(description="ISO 8601 date or time; without a zone it is taken as UTC"),
]


class RequestModel(BaseModel):
    """Base of request bodies and query models: unknown fields are refused."""

    model_config = ConfigDict(extra="forbid")


# A project's name travels in headers and URLs: plain characters only.
ProjectName = Annotated[
    str,
    StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$"),
    Field(description="a project's name: 1 to 100 of A-Z a-z 0-9 . _ -, first a letter or digit"),
]


def describe_invalid(
    errors: Iterable[Mapping[str, Any]], *, location: Sequence[str] = ()
) -> tuple[str, list[dict[str, Any]]]:
    """The message and the ``fields`` of a 422 from pydantic's errors; ``location``
    ("query", "body", "path") prefixes each error's own location. The service's 422s and
    every surface that reads a request in this process say the same."""
    fields = [
        {
            "location": [*location, *(str(part) for part in err.get("loc", ()))],
            "message": str(err.get("msg", "")),
            "type": str(err.get("type", "")),
        }
        for err in errors
    ]
    summary = "; ".join(f"{'.'.join(f['location'])}: {f['message']}" for f in fields[:5])
    return f"invalid request: {summary}", fields


T = TypeVar("T")


class Page(BaseModel, Generic[T]):
    """One page of a list. ``count`` is how many items match the filters in all pages;
    ``next_page_token`` fetches the next page and is null on the last one."""

    data: list[T]
    count: int
    next_page_token: str | None = None


@dataclass(frozen=True)
class Cursor:
    """Where a page ended: lists are ordered newest first by ``(created_at, id)``."""

    created_at: datetime
    id: int

    def encode(self) -> str:
        document = json.dumps({"c": self.created_at.isoformat(), "i": self.id})
        return base64.urlsafe_b64encode(document.encode()).decode().rstrip("=")

    @classmethod
    def decode(cls, token: str) -> Cursor:
        try:
            raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
            document = json.loads(raw)
            created_at = datetime.fromisoformat(document["c"])
            row_id = document["i"]
        except (binascii.Error, ValueError, TypeError, KeyError):
            raise ValueError(_BAD_TOKEN) from None
        valid_id = isinstance(row_id, int) and not isinstance(row_id, bool)
        if not valid_id or not 1 <= row_id <= INT32_MAX or created_at.tzinfo is None:
            raise ValueError(_BAD_TOKEN)
        return cls(created_at=_utc(created_at), id=row_id)


_BAD_TOKEN = (
    "is not a page token this service gave out: pass the next_page_token of the previous "
    "page unchanged, or leave it out to start from the first page"
)


def _check_token(token: str) -> str:
    Cursor.decode(token)
    return token


PageToken = Annotated[str, StringConstraints(max_length=200), AfterValidator(_check_token)]


class PageQuery(RequestModel):
    """Pagination of every list: ``limit`` items from where ``next_page_token`` points."""

    limit: QueryInt = Field(
        default=DEFAULT_PAGE_SIZE, ge=1, le=MAX_PAGE_SIZE, description="items per page, 1 to 500"
    )
    next_page_token: PageToken | None = Field(
        default=None, description="the next_page_token of the previous page"
    )
    page_token: PageToken | None = Field(
        default=None, description="another name for next_page_token"
    )

    @model_validator(mode="after")
    def _one_token(self) -> PageQuery:
        if self.page_token and self.next_page_token and self.page_token != self.next_page_token:
            raise ValueError(
                "page_token and next_page_token name the same thing and differ: pass one"
            )
        return self

    @property
    def cursor(self) -> Cursor | None:
        token = self.next_page_token or self.page_token
        return Cursor.decode(token) if token else None
