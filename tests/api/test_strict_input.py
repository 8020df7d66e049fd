"""What a client types is read one way: integers in a query string are plain digits, names
that look like another are refused, and a token's name cannot forge an access-log line.
Real server, real sockets."""

from __future__ import annotations

import time
from collections.abc import Iterator

import httpx
import pytest

from api import migrate
from api.config import ServiceSettings
from api.db import Database
from api.main import create_app
from tests.api.conftest import make_token
from tests.api.documents import sample_profile
from tests.services import ServerThread, tuner_serve
from tuner.cli.main import main

QUESTION = {"workload": "w" * 24, "device": "d" * 24, "global_batch_size": "256"}


@pytest.fixture
def stored(sqlite_url: str) -> Iterator[tuple[str, str]]:
    """A real service over SQLite with one profile behind QUESTION, and an admin token."""
    migrate.upgrade(sqlite_url)
    database = Database(sqlite_url)
    try:
        token = make_token(database, "admin", name="admin")
    finally:
        database.dispose()
    with ServerThread(create_app(ServiceSettings(database_url=sqlite_url))) as server:
        response = httpx.post(
            server.url + "/api/v1/profiles",
            json=sample_profile(max_micro_batch_size=16).model_dump(mode="json"),
            headers={"Authorization": f"Bearer {token}"},
        )
        assert response.status_code == 201, response.text
        yield server.url, token


@pytest.mark.parametrize("spelling", ["256.0", " 256", "2_56", "+256", "256 ", "２５６", "²"])
def test_an_integer_in_a_query_string_is_plain_decimal_digits(
    stored: tuple[str, str], spelling: str
) -> None:
    url, token = stored
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}) as client:
        assert client.get("/api/v1/recommendation", params=QUESTION).status_code == 200
        asked = {**QUESTION, "global_batch_size": spelling}
        response = client.get("/api/v1/recommendation", params=asked)
        assert response.status_code == 422, response.text
        message = response.json()["error"]["message"]
        assert "global_batch_size" in message
        assert "plain decimal digits" in message
        # The same type everywhere an integer comes from the URL: a page size, a path id.
        for path in (f"/api/v1/workloads?limit={spelling}", f"/api/v1/profiles/{spelling}"):
            response = client.get(path)
            assert response.status_code == 422, (path, response.text)
            assert "plain decimal digits" in response.json()["error"]["message"]


@pytest.mark.parametrize(
    ("name", "says"),
    [
        ("gpt-t\u0435st", "write it in one script"),  # a Cyrillic е
        ("gpt-\u200btest", "U+200B ZERO WIDTH SPACE"),
        ("gpt-test\u202e", "U+202E RIGHT-TO-LEFT OVERRIDE"),
        ("ｇｐｔ-test", "write it as 'gpt-test'"),
    ],
)
def test_a_name_that_looks_like_another_is_refused(
    stored: tuple[str, str], name: str, says: str
) -> None:
    url, token = stored
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}) as client:
        profile = sample_profile(workload_key="v" * 24, workload_name=name)
        response = client.post("/api/v1/profiles", json=profile.model_dump(mode="json"))
        assert response.status_code == 422, response.text
        assert says in response.json()["error"]["message"]
        device = sample_profile(device_key="e" * 24, device_name=name)
        response = client.post("/api/v1/profiles", json=device.model_dump(mode="json"))
        assert response.status_code == 422, response.text
        # Asked by such a name: the same reason, not "no such workload".
        response = client.get("/api/v1/recommendation", params={**QUESTION, "workload": name})
        assert response.status_code == 422
        assert says in response.json()["error"]["message"]
        listed = client.get("/api/v1/workloads").json()["data"]
        assert [workload["name"] for workload in listed] == ["gpt-test"]


def test_names_in_one_script_or_latin_beside_east_asian_are_accepted(
    stored: tuple[str, str],
) -> None:
    url, token = stored
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}) as client:
        for number, name in enumerate(["naïve-bayes 2", "модель", "gpt 日本語 モデル"]):
            profile = sample_profile(workload_key=f"{number}" * 24, workload_name=name)
            response = client.post("/api/v1/profiles", json=profile.model_dump(mode="json"))
            assert response.status_code == 201, response.text


def test_token_create_refuses_a_name_with_a_control_character(
    sqlite_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    status = main(
        ["token", "--database-url", sqlite_url, "create", "--name", "ci\nGET /x", "--scope", "read"]
    )
    assert status != 0
    err = capsys.readouterr().err.strip()
    assert "\n" not in err, err  # one line
    assert "U+000A" in err
    assert "--name" in err


@pytest.mark.slow
def test_a_stored_token_name_cannot_forge_an_access_log_line(sqlite_url: str) -> None:
    """A name stored before names were checked: written escaped, on its own line."""
    migrate.upgrade(sqlite_url)
    database = Database(sqlite_url)
    try:
        forged = "ci\nDELETE /api/v1/profiles/1 200 0.10ms token=admin"
        token = make_token(database, "read", name=forged)
    finally:
        database.dispose()
    lines: list[str] = []
    with tuner_serve(sqlite_url, stderr_lines=lines) as url:
        asked = httpx.get(url + "/api/v1/workloads", headers={"Authorization": f"Bearer {token}"})
        assert asked.status_code == 200
        deadline = time.monotonic() + 10  # lines are written every half second
        while not any("/api/v1/workloads" in line for line in lines):
            assert time.monotonic() < deadline, lines
            time.sleep(0.05)
    logged = [line for line in lines if line.startswith("GET /api/v1/workloads ")]
    assert len(logged) == 1, lines
    assert (
        logged[0].rstrip().endswith(r"token=ci\nDELETE /api/v1/profiles/1 200 0.10ms token=admin")
    )
    assert not any(line.startswith("DELETE") for line in lines), lines
