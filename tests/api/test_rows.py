"""One row by id (``api.store.rows.get_or_404``): each table's lookup answers its row, and
a missing id a NotFoundError (HTTP 404) in that table's own words, on SQLite and
PostgreSQL."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import pytest
from sqlalchemy.orm import Session

from api.db import Database
from api.store.jobs import get_job, get_worker
from api.store.profiles import add_profile, get_device, get_profile, get_workload
from api.store.tokens import create_token, revoke_token
from tests.api.documents import sample_profile
from tuner.core.errors import NotFoundError

# The store is the subject: SQLite and PostgreSQL.
pytestmark = pytest.mark.both_stores


def _in_default(get: Callable[..., Any]) -> Callable[[Session, int], Any]:
    return partial(get, project_id=1)


GETTERS: list[tuple[Callable[[Session, int], Any], str]] = [
    (_in_default(get_worker), "no worker with id 999: register again with POST /api/v1/workers"),
    (_in_default(get_job), "no job with id 999; GET /api/v1/jobs lists them"),
    (_in_default(get_device), "no device with id 999: GET /api/v1/devices lists them"),
    (_in_default(get_workload), "no workload with id 999: GET /api/v1/workloads lists them"),
    (_in_default(get_profile), "no profile with id 999: GET /api/v1/profiles lists them"),
    (revoke_token, "no token with id 999; `tuner token list` shows them"),
]
NAMES = ["get_worker", "get_job", "get_device", "get_workload", "get_profile", "revoke_token"]


@pytest.mark.parametrize(("get", "message"), GETTERS, ids=NAMES)
def test_a_missing_id_is_not_found_in_its_tables_words(
    database: Database, get: Callable[[Session, int], Any], message: str
) -> None:
    with database.session(write=True) as session, pytest.raises(NotFoundError) as raised:
        get(session, 999)
    assert raised.value.message == message


def test_a_stored_row_is_found_by_its_id(database: Database) -> None:
    with database.session(write=True) as session:
        profile = add_profile(session, sample_profile(), project_id=1)
        ids = (profile.id, profile.device_id, profile.workload_id)
        token, _ = create_token(session, name="reader", scopes=["read"])
    with database.session(write=True) as session:
        assert get_profile(session, ids[0], project_id=1).id == ids[0]
        assert get_device(session, ids[1], project_id=1).id == ids[1]
        assert get_workload(session, ids[2], project_id=1).id == ids[2]
        # Another project's row is missing, in the same words as one that does not exist.
        with pytest.raises(NotFoundError, match="no profile with id"):
            get_profile(session, ids[0], project_id=2)
        assert revoke_token(session, token.id).revoked_at is not None
