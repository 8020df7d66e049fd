"""The service's settings: one pydantic-settings class, environment prefix ``TUNER_``."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from platformdirs import user_data_path
from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from api.limits import parse_rate


def default_database_url() -> str:
    """An SQLite file in the user's data directory, e.g. ``~/.local/share/microbatch-tuner``."""
    directory: Path = user_data_path("microbatch-tuner", appauthor=False)
    return f"sqlite:///{directory / 'tuner.db'}"


class ServiceSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="TUNER_", extra="ignore")

    database_url: str = Field(default_factory=default_database_url)
    public_reads: bool = Field(default=False, description="answer GET requests without a token")
    host: str = "127.0.0.1"
    port: int = 8000
    workers: int = Field(
        default=1, ge=1, le=64, description="server processes; one per core is a good start"
    )
    answer_threads: int = Field(
        default=4,
        ge=1,
        le=64,
        description="answers a server process computes at once, each in a worker thread; "
        "more questions wait their turn (answers hold Python's interpreter lock, so more "
        "threads only take turns)",
    )
    max_body_bytes: int = 1024 * 1024
    # Limits on what a connection may hold (enforced by api.connections under `tuner serve`).
    request_timeout_s: float = Field(
        default=10.0,
        gt=0,
        description="seconds a client has to send a whole request, from the connection's "
        "opening or the end of its last response; slower connections are closed",
    )
    write_timeout_s: float = Field(
        default=10.0,
        gt=0,
        description="seconds a client has to take what the service writes to it once "
        "writing backs up; a connection whose peer does not read is reset",
    )
    max_pipelined_requests: int = Field(
        default=16,
        ge=1,
        description="requests a connection may queue behind the one being answered; past "
        "it, the connection is closed after the queued answers and the rest dropped",
    )
    forwarded_allow_ips: str | None = Field(
        default=None,
        description="behind a reverse proxy: the proxy's addresses (comma-separated IPs or "
        "networks, '*' for any), whose X-Forwarded-For and X-Forwarded-Proto are trusted; "
        "unset, no such header is trusted",
    )
    keep_alive_timeout_s: float = Field(
        default=5.0, gt=0, description="an idle keep-alive connection is closed after this"
    )
    max_connections: int = Field(
        default=2048,
        ge=1,
        description="open connections per server process; past it, the connection that has "
        "waited longest without sending a whole request, or for its peer to read, is closed",
    )
    max_target_bytes: int = Field(
        default=4096, ge=256, description="longest path and query string (else 414)"
    )
    max_header_bytes: int = Field(
        default=16 * 1024, ge=1024, description="largest header section (else 431)"
    )
    access_log: bool = Field(
        default=True, description="one line per request on stderr (never the token)"
    )
    lease_seconds: float = Field(default=60.0, gt=0)
    max_attempts: int = Field(default=3, ge=1)
    write_rate_limit: str | None = Field(
        default="600/minute",
        description="writes each token may make per process ('20/second', 'none')",
    )

    @field_validator("write_rate_limit")
    @classmethod
    def _a_rate(cls, value: str | None) -> str | None:
        parse_rate(value)  # refuses, saying what a rate looks like
        return value


@lru_cache(maxsize=1)
def get_settings() -> ServiceSettings:
    return ServiceSettings()
