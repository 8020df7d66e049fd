"""A property-based fuzz of the OpenAPI schema against the real service: whatever a client
sends, within the schema or not, the service never answers with a server error."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis.checks import not_a_server_error
from schemathesis.schemas import APIOperation

from api import migrate
from api.config import ServiceSettings
from api.db import Database
from api.main import create_app
from tests.api.conftest import make_token
from tests.api.documents import sample_profile
from tests.services import ServerThread


@pytest.fixture(scope="module")
def fuzzed_service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerThread, str]]:
    """One service over SQLite with a stored profile, so lookups can succeed as well as fail."""
    url = f"sqlite:///{tmp_path_factory.mktemp('fuzz') / 'tuner.db'}"
    migrate.upgrade(url)
    database = Database(url)
    token = make_token(database, "admin")
    from api.store.profiles import add_profile

    with database.session(write=True) as session:
        add_profile(session, sample_profile(), project_id=1)
    database.dispose()
    with ServerThread(create_app(ServiceSettings(database_url=url))) as server:
        yield server, token


def _operation_labels() -> list[str]:
    """Every operation of the schema (``GET /api/v1/recommendation``, ...), read from the
    app itself so that each is a test of its own, which the workers share out."""
    with tempfile.TemporaryDirectory() as folder:
        app = create_app(ServiceSettings(database_url=f"sqlite:///{folder}/tuner.db"))
        schema = schemathesis.openapi.from_dict(app.openapi())
    return [result.ok().label for result in schema.get_all_operations()]


LABELS = _operation_labels()


@pytest.fixture(scope="module")
def operations(fuzzed_service: tuple[ServerThread, str]) -> dict[str, APIOperation]:
    """The operations as the running service's own schema describes them."""
    server, _ = fuzzed_service
    schema = schemathesis.openapi.from_url(f"{server.url}/openapi.json")
    return {operation.label: operation for operation in map(_ok, schema.get_all_operations())}


def _ok(result: Any) -> APIOperation:
    operation: APIOperation = result.ok()
    return operation


def test_every_route_is_fuzzed(operations: dict[str, APIOperation]) -> None:
    assert len(operations) >= 15  # every route is in the schema
    assert sorted(operations) == sorted(LABELS)


@pytest.mark.slow
@pytest.mark.parametrize("label", LABELS)
def test_no_input_produces_a_server_error(
    fuzzed_service: tuple[ServerThread, str], operations: dict[str, APIOperation], label: str
) -> None:
    # Driven by hand rather than through schemathesis' pytest plugin, which does not run
    # under this pytest; every operation gets its own Hypothesis search.
    server, token = fuzzed_service

    @given(case=operations[label].as_strategy())
    @settings(
        max_examples=40,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
    )
    def never_a_server_error(case: schemathesis.Case) -> None:
        case.call_and_validate(
            base_url=server.url,
            headers={"Authorization": f"Bearer {token}"},
            checks=[not_a_server_error],
        )

    never_a_server_error()
