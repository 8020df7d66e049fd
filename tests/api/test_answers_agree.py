"""One question, three askers, one answer: ``GET /api/v1/recommendation`` on a real server,
the embedded store of the Python client over the same database, and the dashboard's
calculator (the landing page's HTML, as a browser receives it) answer each question the
same, on SQLite and PostgreSQL.

The questions cover every kind of answer: measured, estimated from another device's fit,
estimated across world sizes, estimated across sequence lengths, and refusals (a 404, a 409
and a 422). The route's JSON and the embedded answer are compared byte for byte up to the
answer's age, the one field that moves with the clock; the dashboard shows the same JSON,
parsed, and a refusal's message and status.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from html.parser import HTMLParser
from typing import Any

import httpx
import pytest

from api import migrate
from api.config import ServiceSettings
from api.db import Database
from api.embedded import EmbeddedStore
from api.errors import STATUS_BY_CODE
from api.main import create_app
from tests.api.conftest import fresh_postgres_database, make_token
from tests.api.documents import MiB, sample_probe, sample_profile
from tests.dashboard.data import nothing_fits_profile, store
from tests.dashboard.test_world_sizes import DDP_KEY, ddp_profile
from tests.services import ServerThread
from tuner.core.errors import TunerError
from tuner.core.results import AffineFit, Profile
from tuner.core.wire.recommendation import RecommendationQuery

KiB = 1024

ONE = sample_profile(max_micro_batch_size=8, workload_name="gpt-agree")
# Another device the one-process workload was never profiled on: estimated from ONE's fit.
OTHER_DEVICE = sample_profile(
    max_micro_batch_size=4,
    workload_key="other".ljust(24, "o"),
    workload_name="other-model",
    device_key="other".ljust(16, "d"),
)
HUGE = nothing_fits_profile()
FAMILY = "agree-len".ljust(24, "f")


def length_profile(seq_len: int) -> Profile:
    """One member of a length family whose activations grow with the tokens of a micro
    batch: ``100 MiB + 40 KiB·m·s`` against the 190 MiB budget."""
    slope = 40 * KiB * seq_len
    found = (190 * MiB - 100 * MiB) // slope
    base = sample_profile(
        max_micro_batch_size=found,
        workload_key=f"agree{seq_len}".ljust(24, "l"),
        workload_name="gpt-agree-len",
    )
    info = base.workload.model_copy(update={"seq_len": seq_len, "length_family": FAMILY})
    probes = [sample_probe(m, fits=m <= found, slope=slope) for m in (1, found, found + 1)]
    fit = AffineFit(fixed_bytes=100 * MiB, bytes_per_sample=slope, points=len(probes))
    return base.model_copy(update={"workload": info, "probes": probes, "fit": fit})


LENGTHS = [length_profile(seq_len) for seq_len in (64, 128, 256)]
AGE = b',"profile_age_s":'

# name -> the question, as the calculator's form and the API's query string ask it.
QUESTIONS: dict[str, dict[str, str]] = {
    "measured": {
        "workload": ONE.workload_key,
        "device": ONE.device_key,
        "global_batch_size": "64",
    },
    "another device": {
        "workload": ONE.workload_key,
        "device": OTHER_DEVICE.device_key,
        "global_batch_size": "64",
    },
    "world size": {
        "workload": DDP_KEY,
        "device": ONE.device_key,
        "global_batch_size": "256",
        "world_size": "8",
        "parallel": "ddp",
    },
    "length": {
        "workload": FAMILY,
        "device": LENGTHS[0].device_key,
        "global_batch_size": "64",
        "seq_len": "96",
    },
    "unknown device": {
        "workload": ONE.workload_key,
        "device": "no-such-device",
        "global_batch_size": "64",
    },
    "length out of range": {
        "workload": FAMILY,
        "device": LENGTHS[0].device_key,
        "global_batch_size": "64",
        "seq_len": "4096",
    },
    "nothing fits": {
        "workload": HUGE.workload_key,
        "device": HUGE.device_key,
        "global_batch_size": "64",
    },
}
FORM_FIELDS = ("workload", "device", "global_batch_size", "world_size", "policy", "parallel", "tp")
KIND = {
    "measured": "measured",
    "another device": "estimated",
    "world size": "estimated",
    "length": "estimated",
}

REFUSED = {"unknown device": 404, "length out of range": 422, "nothing fits": 409}


@dataclass(frozen=True)
class Said:
    """What one asker answered: the answer's JSON without its age, or a refusal."""

    answer: dict[str, Any] | None
    status: int
    message: str | None = None


@dataclass(frozen=True)
class Service:
    url: str
    token: str
    database_url: str
    app: Any


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def service(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Service]:
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path_factory.mktemp('agree') / 'tuner.db'}"
        yield from _service(url)
    else:
        with fresh_postgres_database(request.getfixturevalue("postgres_server")) as url:
            yield from _service(url)


def _service(url: str) -> Iterator[Service]:
    migrate.upgrade(url)
    database = Database(url)
    token = make_token(database, "admin", name="ada")
    store(database, [ONE, OTHER_DEVICE, ddp_profile(2), ddp_profile(4), HUGE, *LENGTHS])
    database.dispose()
    app = create_app(ServiceSettings(database_url=url))
    with ServerThread(app) as server:
        yield Service(server.url, token, url, app)


def _asked(question: dict[str, str]) -> dict[str, str]:
    return {name: value for name, value in question.items() if value != ""}


def by_route(
    service: Service, question: dict[str, str], *, cookie: bool = False
) -> tuple[Said, bytes]:
    """Asked with a bearer token, or with the dashboard's cookie."""
    credentials: dict[str, Any] = (
        {"cookies": {"tuner_token": service.token}}
        if cookie
        else {"headers": {"Authorization": f"Bearer {service.token}"}}
    )
    with httpx.Client(base_url=service.url, **credentials) as http:
        response = http.get("/api/v1/recommendation", params=_asked(question))
    if response.status_code != 200:
        return Said(None, response.status_code, response.json()["error"]["message"]), b""
    head = response.content.rpartition(AGE)[0]
    return Said(json.loads(head + b"}"), 200), head


def by_embedded(service: Service, question: dict[str, str]) -> tuple[Said, bytes]:
    embedded = EmbeddedStore(service.database_url)
    try:
        # The question read as every surface in this process reads it.
        public = embedded.recommend(RecommendationQuery.read(_asked(question)))
    except TunerError as exc:
        return Said(None, STATUS_BY_CODE[exc.code], exc.message), b""
    finally:
        embedded.close()
    head = public.model_dump_json(exclude={"profile_age_s"}).encode()[:-1]
    return Said(json.loads(head + b"}"), 200), head


class _Calculator(HTMLParser):
    """The calculator's answer (``data-answer``) or refusal (``#calc-error``) in a page."""

    def __init__(self) -> None:
        super().__init__()
        self.answer: str | None = None
        self.status: str | None = None
        self.error = ""
        self._in_error = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        found = dict(attrs)
        if found.get("id") == "calc-result":
            self.answer = found["data-answer"]
        elif found.get("id") == "calc-error":
            self.status, self._in_error = found["data-status"], True

    def handle_endtag(self, tag: str) -> None:
        self._in_error = False  # the error box holds text only

    def handle_data(self, data: str) -> None:
        if self._in_error:
            self.error += data


def by_dashboard(service: Service, question: dict[str, str]) -> Said:
    # Every field of the form, empty where not asked (else the page asks its defaults).
    params = {name: question.get(name, "") for name in (*FORM_FIELDS, "seq_len")}
    with httpx.Client(base_url=service.url, cookies={"tuner_token": service.token}) as http:
        page = http.get("/", params=params, headers={"Authorization": f"Bearer {service.token}"})
    assert page.status_code == 200, page.text
    parsed = _Calculator()
    parsed.feed(page.text)
    if parsed.answer is not None:
        answer: dict[str, Any] = json.loads(parsed.answer)
        answer.pop("profile_age_s")
        return Said(answer, 200)
    assert parsed.status is not None, page.text
    return Said(None, int(parsed.status), parsed.error.strip())


@pytest.mark.parametrize("name", list(QUESTIONS))
def test_route_embedded_and_dashboard_agree(service: Service, name: str) -> None:
    question = QUESTIONS[name]
    route, route_bytes = by_route(service, question)
    embedded, embedded_bytes = by_embedded(service, question)
    dashboard = by_dashboard(service, question)
    assert route == embedded == dashboard
    assert route_bytes == embedded_bytes  # the same JSON, byte for byte, but for the age
    if name in KIND:
        assert route.answer is not None
        assert route.answer["basis"] == KIND[name]
    else:
        assert route.answer is None
        assert route.message
        assert (
            route.status
            == {"unknown device": 404, "length out of range": 422, "nothing fits": 409}[name]
        )
    if name == "world size":
        assert route.answer is not None
        assert len(route.answer["based_on_profiles"]) == 2  # the fit across W = 2 and 4
    if name == "length":
        assert route.answer is not None
        assert route.answer["length_basis"] == "estimated"
