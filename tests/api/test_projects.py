"""Projects, tried as another team would: team B holds ordinary tokens of its own project
and knows everything team A's rows are called (keys, names, family keys, variant groups,
device names). Nothing B sends changes what A is answered, and B reads nothing of A's. A
real server on SQLite and PostgreSQL; tokens made with `tuner token create --project`.

Each route below changed A's answers before projects (issue 35): an upload into A's
workload key, a key that is A's workload name, a workload named like A's length-family
key, an OOM report on A's pair, a "chosen" variant in A's exploration, and a worker on a
device that bears A's device name and key.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest

from api import migrate
from api.config import ServiceSettings
from api.embedded import EmbeddedStore
from api.main import create_app
from tests.api.conftest import fresh_postgres_database
from tests.api.documents import sample_profile
from tests.api.jobs_helpers import claim, device_document, queue, register
from tests.api.test_recommend_cli import tuner
from tests.services import ServerThread
from tuner.client import TunerClient
from tuner.core.errors import NotFoundError, PermissionDeniedError
from tuner.core.wire.recommendation import RecommendationQuery

A_KEY, A_NAME, A_DEVICE, A_FAMILY = "a" * 24, "team-a-model", "d" * 24, "f" * 24
ASK_A = {"workload": A_NAME, "device": "cpu-test", "global_batch_size": "64"}


@dataclass
class Teams:
    url: str
    database_url: str
    tokens: dict[str, str]

    def client(self, who: str, **headers: str) -> httpx.Client:
        return httpx.Client(
            base_url=f"{self.url}/api/v1",
            headers={"Authorization": f"Bearer {self.tokens[who]}", **headers},
            timeout=30,
        )


def _token(database_url: str, name: str, *args: str) -> str:
    made = tuner("token", "--database-url", database_url, "create", "--name", name, *args)
    assert made.returncode == 0, made.stderr
    return made.stdout.strip()


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def teams(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Teams]:
    def serve(url: str) -> Iterator[Teams]:
        migrate.upgrade(url)
        tokens = {
            "a": _token(url, "a-writer", "--scope", "write"),  # no --project: default's
            "a-worker": _token(url, "a-worker", "--scope", "worker"),
            "b": _token(url, "b-writer", "--scope", "write", "--project", "team-b"),
            "b-worker": _token(url, "b-worker", "--scope", "worker", "--project", "team-b"),
            "b-admin": _token(url, "b-admin", "--scope", "admin", "--project", "team-b"),
            "root": _token(url, "root", "--scope", "admin", "--all-projects"),
        }
        with ServerThread(create_app(ServiceSettings(database_url=url))) as server:
            yield Teams(server.url, url, tokens)

    if request.param == "sqlite":
        yield from serve(f"sqlite:///{tmp_path_factory.mktemp('projects') / 'tuner.db'}")
    else:
        with fresh_postgres_database(request.getfixturevalue("postgres_server")) as url:
            yield from serve(url)


def _profile(found: int, minute: int, *, family: bool = False, **update: Any) -> dict[str, Any]:
    document = sample_profile(
        max_micro_batch_size=found,
        workload_key=A_KEY,
        workload_name=A_NAME,
        device_key=A_DEVICE,
        created_at=datetime(2026, 11, 1, tzinfo=UTC) + timedelta(minutes=minute),
    ).model_dump(mode="json")
    if family:  # team A's: one length of a family
        document["workload"].update(seq_len=128, length_family=A_FAMILY)
    for path, value in update.items():
        *parents, leaf = path.split(".")
        target = document
        for part in parents:
            target = target[part]
        target[leaf] = value
    return document


def _answer(client: httpx.Client, **asked: str) -> tuple[int, int]:
    response = client.get("/recommendation", params={**ASK_A, **asked})
    assert response.status_code == 200, response.text
    body = response.json()
    return body["max_micro_batch_size"], body["profile_id"]


@pytest.fixture(scope="module")
def a_answer(teams: Teams) -> tuple[int, int]:
    """Team A's stored profile (M* 12) and the answer it gets, by name and by key."""
    with teams.client("a") as a:
        stored = a.post(
            "/profiles", json=_profile(12, 0, family=True, **{"variant_group": "g" * 24})
        )
        assert stored.status_code == 201, stored.text
        by_name = _answer(a)
        assert by_name == (12, stored.json()["id"])
        assert _answer(a, workload=A_KEY) == by_name
    return by_name


@pytest.mark.slow
def test_nothing_team_b_writes_changes_team_as_answers(
    teams: Teams, a_answer: tuple[int, int]
) -> None:
    with teams.client("b") as b:
        # An OOM report on A's pair names nothing B can see.
        report = {"workload": A_NAME, "device": A_DEVICE, "micro_batch_size": 2}
        assert b.post("/oom-reports", json=report).status_code == 404
        # (a) a newer profile, back-dated or not, into A's workload key: B's own row.
        forged = b.post("/profiles", json=_profile(1, 99, **{"workload.name": "b-model"}))
        assert forged.status_code == 201, forged.text
        # (b) a workload keyed with A's name.
        keyed = _profile(1, 98, workload_key=A_NAME, **{"workload.name": "b-model"})
        assert b.post("/profiles", json=keyed).status_code == 201
        # (c) a workload named like A's length-family key.
        named = _profile(1, 97, workload_key="c" * 24, **{"workload.name": A_FAMILY})
        assert b.post("/profiles", json=named).status_code == 201
        # An OOM report on A's pair, now that B has a row of A's key: it caps B's row.
        report["workload"] = A_KEY
        assert b.post("/oom-reports", json=report).status_code == 201
        # A "chosen" variant in A's exploration: B's exploration of that group.
        chosen = _profile(3, 96, variant_group="g" * 24, variant_chosen=True)
        chosen["workload"]["name"] = "b-model"
        assert b.post("/profiles", json=chosen).status_code == 201
    with teams.client("a") as a:
        assert _answer(a) == a_answer
        assert _answer(a, workload=A_KEY) == a_answer
        assert _answer(a, workload=A_FAMILY, seq_len="128") == a_answer
        # A's own chosen variant is still A's to upload (before: a 409, B's was first).
        mine = _profile(12, 5, family=True, variant_group="g" * 24, variant_chosen=True)
        assert a.post("/profiles", json=mine).status_code == 201


def test_team_b_reads_nothing_of_team_as(teams: Teams, a_answer: tuple[int, int]) -> None:
    _, profile_id = a_answer
    with teams.client("b") as b:
        assert b.get(f"/profiles/{profile_id}").status_code == 404
        assert b.get("/workloads", params={"name": A_NAME}).json()["data"] == []
        listed = b.get("/profiles").json()["data"]
        assert all(row["workload_name"] != A_NAME for row in listed)
        # B's own rows of A's key and name (test above) answer B; A's profile never does.
        answered = b.get("/recommendation", params=ASK_A)
        assert answered.status_code in (200, 404)
        assert answered.json().get("profile_id") != profile_id
        # Its own admin token is its project's only; naming another project is refused.
        with teams.client("b-admin", **{"X-Tuner-Project": "default"}) as admin:
            assert admin.get("/profiles").status_code == 403
    dashboard = httpx.Client(base_url=teams.url, cookies={"tuner_token": teams.tokens["b"]})
    with dashboard:
        assert A_NAME not in dashboard.get("/profiles").text
        assert A_NAME not in dashboard.get("/workloads").text
        assert dashboard.get(f"/profiles/{profile_id}").status_code == 404


def test_an_admin_of_every_project_acts_in_the_one_it_names(
    teams: Teams, a_answer: tuple[int, int]
) -> None:
    with teams.client("a") as a:
        as_a = _answer(a)
    with teams.client("root") as root:  # no header: the project default
        assert _answer(root) == as_a
    with teams.client("root", **{"X-Tuner-Project": "team-b"}) as root:
        answered = root.get("/recommendation", params=ASK_A)
        assert answered.json().get("profile_id") not in (as_a[1], a_answer[1])
    with teams.client("root", **{"X-Tuner-Project": "nope"}) as root:
        refused = root.get("/profiles")
        assert refused.status_code == 404
        assert "tuner token create --project nope" in refused.json()["error"]["message"]


def test_a_worker_takes_only_its_projects_jobs(teams: Teams) -> None:
    """B's worker registers a device with A's device key and name: A's jobs stay queued
    for A's workers, and what A's worker stores is A's."""
    with teams.client("b-worker") as b:
        b_worker = register(b, "b-host", device_key=A_DEVICE)
    with teams.client("a") as a:
        job = queue(a)
    with teams.client("b-worker") as b:
        assert claim(b, b_worker) is None
    with teams.client("a-worker") as a_worker_client:
        a_worker = register(a_worker_client, "a-host", device_key=A_DEVICE)
        held = claim(a_worker_client, a_worker)
        assert held is not None
        assert held["job"]["id"] == job["id"]
    with teams.client("b") as b:
        assert b.get(f"/jobs/{job['id']}").status_code == 404
        assert all(w["name"] != "a-host" for w in b.get("/workers").json()["data"])
    assert device_document()  # the same device document both registered


def test_the_embedded_store_reads_the_project_it_is_given(
    teams: Teams, a_answer: tuple[int, int]
) -> None:
    """A client given the database itself acts in one project: TUNER_PROJECT, else
    default."""
    with teams.client("a") as a:
        as_a = _answer(a)
    for project, expected in ((None, as_a), ("nobody-here", None)):
        embedded = EmbeddedStore(teams.database_url, project=project)
        try:
            if expected is None:
                with pytest.raises(NotFoundError):
                    embedded.recommend(RecommendationQuery.read(ASK_A))
            else:
                answer = embedded.recommend(RecommendationQuery.read(ASK_A))
                assert (answer.max_micro_batch_size, answer.profile_id) == expected
        finally:
            embedded.close()


def test_a_question_that_names_its_project_is_answered_there_by_the_headers_rules(
    teams: Teams, a_answer: tuple[int, int]
) -> None:
    """``RecommendationQuery.project``: on the route, as the X-Tuner-Project header would
    (a token of every project acts in it, another token's own only, never two names); in
    the embedded store, whatever project it was opened in."""
    del a_answer  # A's profile is stored
    with teams.client("a") as a:
        as_a = _answer(a)
    with teams.client("root") as root:
        assert _answer(root, project="default") == as_a
        in_b = root.get("/recommendation", params={**ASK_A, "project": "team-b"})
        assert in_b.status_code in (200, 404), in_b.text  # team B's rows, if any
        assert in_b.json().get("profile_id") != as_a[1]
    with teams.client("b") as b:
        refused = b.get("/recommendation", params={**ASK_A, "project": "default"})
        assert refused.status_code == 403, refused.text
    with teams.client("a", **{"X-Tuner-Project": "default"}) as a:
        both = a.get("/recommendation", params={**ASK_A, "project": "team-b"})
        assert both.status_code == 422, both.text
        assert "name one project" in both.json()["error"]["message"]
    embedded = EmbeddedStore(teams.database_url, project="nobody-here")
    try:
        answer = embedded.recommend(RecommendationQuery.read({**ASK_A, "project": "default"}))
        assert (answer.max_micro_batch_size, answer.profile_id) == as_a
        with pytest.raises(NotFoundError, match="no project is named 'nope'"):
            embedded.recommend(RecommendationQuery.read({**ASK_A, "project": "nope"}))
    finally:
        embedded.close()


# Reads team B's rows that test_nothing_team_b_writes_changes_team_as_answers writes (the
# quick lane leaves both out together).
@pytest.mark.slow
def test_the_dashboard_shows_the_tokens_project_and_an_admin_switches(
    teams: Teams, a_answer: tuple[int, int]
) -> None:
    del a_answer  # A's profile is stored
    with httpx.Client(base_url=teams.url, cookies={"tuner_token": teams.tokens["b"]}) as b:
        page = b.get("/profiles").text
        assert 'id="project-name"' in page
        assert ">team-b<" in page
        refused = b.post("/project", data={"project": "default"})
        assert refused.status_code == 403
        assert "reads its own project only" in refused.text
    root_cookie = {"tuner_token": teams.tokens["root"]}
    with httpx.Client(base_url=teams.url, cookies=root_cookie) as root:
        assert A_NAME in root.get("/profiles").text  # no choice made: the project default
        switched = root.post("/project", data={"project": "team-b"})
        assert switched.status_code == 303
        assert "tuner_project=team-b" in switched.headers["set-cookie"]
        # The cookie is Secure, which a client keeps only over HTTPS: sent as a browser would.
        root.cookies.set("tuner_project", "team-b")
        shown = root.get("/profiles").text
        assert A_NAME not in shown
        assert "b-model" in shown
        assert 'value="team-b"' in shown
        missing = root.post("/project", data={"project": "nope"})
        assert missing.status_code == 404


# Reads team B's rows that test_nothing_team_b_writes_changes_team_as_answers writes (the
# quick lane leaves both out together).
@pytest.mark.slow
def test_the_client_names_its_project_with_tuner_project(
    teams: Teams, a_answer: tuple[int, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """TUNER_PROJECT travels as X-Tuner-Project: a token of every project acts there, and a
    token of one project naming another is refused in one line."""
    del a_answer
    asked = {"workload": A_NAME, "device": "cpu-test", "global_batch_size": 64}
    monkeypatch.setenv("TUNER_PROJECT", "team-b")
    with TunerClient(teams.url, token=teams.tokens["root"]) as root:
        assert root.recommend(**asked).workload_name == "b-model"  # team B's row of that key
    with (
        TunerClient(teams.url, token=teams.tokens["a"]) as a,
        pytest.raises(PermissionDeniedError, match="reads and writes its own project only"),
    ):
        a.recommend(**asked)
