"""Cached answers and token checks never outlive a write, from whichever process it came.

The writes here go straight to the store, as `tuner token revoke`, a worker or another
service replica would: not through this service, which therefore learns of them only
through the store's generation.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from sqlalchemy.orm import Session

import api.deps
from api.cache import GenerationCache
from api.db import Database
from api.security import Principal
from api.store.generation import DirectReader, mark_changed
from api.store.profiles import add_profile
from api.store.tokens import authenticate, list_tokens, revoke_token
from tests.api.conftest import make_token
from tests.api.documents import sample_profile

# The store is the subject: SQLite and PostgreSQL.
pytestmark = pytest.mark.both_stores

QUESTION = {"workload": "w" * 24, "device": "d" * 24, "global_batch_size": 64}


def test_a_token_revoked_elsewhere_is_refused_on_the_next_request(
    service, database: Database
) -> None:
    token = make_token(database, "read", name="soon-revoked")
    headers = {"Authorization": f"Bearer {token}"}
    with httpx.Client(base_url=service.url, headers=headers, timeout=10) as client:
        assert client.get("/api/v1/profiles").status_code == 200
        assert client.get("/api/v1/profiles").status_code == 200  # now from the cache
        with database.session(write=True) as session:
            token_id = next(t.id for t in list_tokens(session) if t.name == "soon-revoked")
            revoke_token(session, token_id)
        assert client.get("/api/v1/profiles").status_code == 401


def test_a_profile_stored_elsewhere_changes_the_next_answer(
    http: httpx.Client, database: Database
) -> None:
    with database.session(write=True) as session:
        add_profile(session, sample_profile(max_micro_batch_size=8), project_id=1)
    first = http.get("/api/v1/recommendation", params=QUESTION).json()
    again = http.get("/api/v1/recommendation", params=QUESTION).json()
    assert first["micro_batch_size"] == again["micro_batch_size"] == 8
    with database.session(write=True) as session:
        add_profile(session, sample_profile(max_micro_batch_size=16), project_id=1)
    assert http.get("/api/v1/recommendation", params=QUESTION).json()["micro_batch_size"] == 16


@pytest.mark.slow
def test_an_oom_report_lowers_the_cached_answer_at_once(http: httpx.Client, database) -> None:
    with database.session(write=True) as session:
        add_profile(session, sample_profile(max_micro_batch_size=16), project_id=1)
    assert http.get("/api/v1/recommendation", params=QUESTION).json()["micro_batch_size"] == 16
    report = {
        "workload": QUESTION["workload"],
        "device": QUESTION["device"],
        "micro_batch_size": 12,
    }
    assert http.post("/api/v1/oom-reports", json=report).status_code == 201
    assert http.get("/api/v1/recommendation", params=QUESTION).json()["micro_batch_size"] == 11


def test_one_transaction_raises_the_generation_once(database: Database) -> None:
    reader = DirectReader(database.engine)
    try:
        before = reader.generation()
        with database.session(write=True) as session:
            mark_changed(session)
            mark_changed(session)
        assert reader.generation() == before + 1
        with database.session(write=True):
            pass  # a write session that changed nothing leaves it alone
        assert reader.generation() == before + 1
    finally:
        reader.close()


def test_generation_cache_answers_only_for_its_generation_and_stays_bounded() -> None:
    cache: GenerationCache[str] = GenerationCache(max_entries=2)
    cache.put("a", 1, "A")
    assert cache.get("a", 1) == "A"
    assert cache.get("a", 2) is None  # something was written since
    cache.put("b", 1, "B")
    cache.get("a", 1)  # a is now the most recently used
    cache.put("c", 1, "C")
    assert (cache.get("a", 1), cache.get("b", 1), cache.get("c", 1)) == ("A", None, "C")
    assert len(cache) == 2


def test_one_question_spelled_two_ways_gets_one_answer_whose_age_moves(
    http: httpx.Client, database: Database
) -> None:
    with database.session(write=True) as session:
        add_profile(session, sample_profile(max_micro_batch_size=8), project_id=1)
    url = "/api/v1/recommendation"
    first = http.get(f"{url}?workload={'w' * 24}&device={'d' * 24}&global_batch_size=64").json()
    time.sleep(0.05)
    second = http.get(f"{url}?global_batch_size=64&device={'d' * 24}&workload={'w' * 24}").json()
    time.sleep(0.05)
    cached = http.get(f"{url}?workload={'w' * 24}&device={'d' * 24}&global_batch_size=64").json()
    ages = [answer.pop("profile_age_s") for answer in (first, second, cached)]
    assert first == second == cached
    assert ages[0] < ages[1] < ages[2]  # the one moving part, even from the cache


def test_after_a_write_concurrent_requests_check_their_token_once(
    service, database: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A write voids every cached token check; fifty requests arriving together then
    share one check instead of making fifty (each in a thread, each touching the token)."""
    token = make_token(database, "read", name="busy")
    checks: list[str] = []

    def counted(session: Session, presented: str) -> tuple[Principal, bool]:
        checks.append(presented)
        time.sleep(0.2)  # long enough for every request below to arrive meanwhile
        return authenticate(session, presented)

    monkeypatch.setattr(api.deps, "authenticate", counted)
    headers = {"Authorization": f"Bearer {token}"}
    with database.session(write=True) as session:
        mark_changed(session)

    def ask(_: int) -> int:
        with httpx.Client(base_url=service.url, headers=headers, timeout=30) as client:
            return client.get("/api/v1/profiles").status_code

    with ThreadPoolExecutor(max_workers=25) as pool:
        statuses = list(pool.map(ask, range(25)))
    assert statuses == [200] * 25
    assert len(checks) == 1


def test_a_cached_answer_still_needs_a_valid_token(service, database: Database) -> None:
    """A token check is cached; a revoked token is refused all the same."""
    with database.session(write=True) as session:
        add_profile(session, sample_profile(max_micro_batch_size=8), project_id=1)
    reader = make_token(database, "read", name="reader")
    url = service.url + "/api/v1/recommendation"

    def ask(token: str | None) -> httpx.Response:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return httpx.get(url, params=QUESTION, headers=headers, timeout=10)

    assert ask(reader).status_code == 200
    assert ask(reader).status_code == 200  # now cached, token check too
    assert ask(None).status_code == 401
    assert ask("mbt_" + "0" * 43).status_code == 401
    with database.session(write=True) as session:
        token_id = next(t.id for t in list_tokens(session) if t.name == "reader")
        revoke_token(session, token_id)
    assert ask(reader).status_code == 401


@pytest.mark.slow
def test_token_checks_cannot_grow_with_what_requests_send(service, database: Database) -> None:
    """The principal cache holds one entry per token the store accepted, keyed by its
    digest: tokens the store refuses, however many and however long, add nothing."""
    principals: GenerationCache[tuple[Principal, float]] = (
        service.server.config.app.state.principals
    )
    with httpx.Client(base_url=service.url, timeout=10) as client:
        for index in range(200):
            wrong = f"{index:04d}" + "x" * 4000
            response = client.get("/api/v1/profiles", headers={"Authorization": f"Bearer {wrong}"})
            assert response.status_code == 401
        assert len(principals) == 0
        token = make_token(database, "read", name="reader")
        for _ in range(3):
            response = client.get("/api/v1/profiles", headers={"Authorization": f"Bearer {token}"})
            assert response.status_code == 200
    assert len(principals) == 1
