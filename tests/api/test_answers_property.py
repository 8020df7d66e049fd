"""Agreement as a property: random stores, random questions, one answer on every surface.

Hypothesis builds a store (profiles of workloads that share names, at several devices,
world sizes, mesh shapes and parallel modes; OOM reports) and questions about it (by key
and by name, good and bad). Each question is asked of ``GET /api/v1/recommendation`` on a
real server, the client's embedded store over the same database, the dashboard's
calculator (the landing page as a browser receives it) and, for one question a store,
``tuner recommend --json``; they must say the same, field by field (but for the answer's
age), refusals included; what the framework integrations set is the answer's equal
split, asked as the integrations ask (the question ``plan_training`` builds, through the
client), set as Lightning and the Trainer take it. Where the answer is measured from one
profile with nothing capping it, the plan made offline from that profile alone
(``tuner.answer.local``, what ``plan_training`` trains with when the service is away)
must say the same too. On SQLite and PostgreSQL.
"""

from __future__ import annotations

import json
import os
import warnings
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import text

from api.db import Database
from tests.api.builders import at
from tests.api.conftest import fresh_postgres_database
from tests.api.documents import MiB, sample_profile
from tests.api.test_answers_agree import (
    Said,
    Service,
    _service,
    by_dashboard,
    by_embedded,
    by_route,
)
from tests.api.test_recommend_cli import tuner
from tests.dashboard.data import store
from tuner.answer.local import answer_from
from tuner.client import TunerClient
from tuner.core.parallel import Parallel
from tuner.core.plan import POLICIES, Recommendation
from tuner.core.results import Profile
from tuner.core.shape import MeshShape
from tuner.core.speeds import SpeedCurve, TimedSize
from tuner.core.wire.recommendation import RecommendationQuery
from tuner.train.integrations import (
    EqualMicroBatchWarning,
    equal_settings,
    huggingface_arguments,
    lightning_arguments,
)

DEVICES = [
    ("dev-a".ljust(24, "a"), "cpu-a", 200 * MiB),
    ("dev-b".ljust(24, "b"), "cpu-b", 300 * MiB),
    ("dev-c".ljust(24, "c"), "cpu-a", 400 * MiB),  # a name two devices bear
]
WORKLOADS = [  # key, name, parallel mode
    ("wl-one".ljust(24, "1"), "model", "none"),
    ("wl-two".ljust(24, "2"), "model", "none"),  # another workload of the same name
    ("wl-ddp".ljust(24, "3"), "model", "ddp"),
    ("wl-fsdp".ljust(24, "4"), "other", "fsdp"),
]
DATA_TABLES = ("oom_reports", "probes", "jobs", "workers", "profiles", "workloads", "devices")


@st.composite
def stored_profile(draw: st.DrawFn, minute: int) -> Profile:
    key, name, mode = draw(st.sampled_from(WORKLOADS))
    device_key, device_name, capacity = draw(st.sampled_from(DEVICES))
    world = 1 if mode == "none" else draw(st.sampled_from([2, 4]))
    tp = draw(st.sampled_from([1, 2])) if mode == "fsdp" else 1
    found = draw(st.integers(min_value=1, max_value=12))
    base = sample_profile(
        max_micro_batch_size=found,
        workload_key=key,
        workload_name=name,
        device_key=device_key,
        device_name=device_name,
        capacity_bytes=capacity,
        created_at=at(minute),
    )
    parallel = Parallel(mode=mode, tp=tp, tp_plan="llama" if tp > 1 else None)  # type: ignore[arg-type]
    # Some profiles were timed after M*: their answers compare splits by the speed curve.
    speeds = None
    if draw(st.booleans()):
        sizes = sorted({max(1, found // 2**j) for j in range(4)})
        rounds = [draw(st.lists(st.floats(1e-4, 1e-2), min_size=1, max_size=3)) for _ in sizes]
        speeds = SpeedCurve(
            sizes=[
                TimedSize(micro_batch_size=m, seconds_per_sample=r)
                for m, r in zip(sizes, rounds, strict=True)
            ],
            optimizer_seconds=draw(st.floats(0, 0.05)),
        )
    return base.model_copy(update={"world_size": world, "parallel": parallel, "speeds": speeds})


@st.composite
def question(draw: st.DrawFn) -> dict[str, str]:
    workload = draw(st.sampled_from([*(w[0] for w in WORKLOADS), "model", "other", "nope"]))
    device = draw(st.sampled_from([*(d[0] for d in DEVICES), "cpu-a", "cpu-b"]))
    return {
        "workload": workload,
        "device": device,
        "global_batch_size": str(draw(st.sampled_from([8, 24, 64, 100]))),
        "world_size": str(draw(st.sampled_from([1, 2, 4]))),
        "policy": draw(st.sampled_from(POLICIES)),
        "parallel": draw(st.sampled_from(["", "none", "ddp", "fsdp"])),
        "tp": draw(st.sampled_from(["", "2"])),
    }


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def service(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Service]:
    if request.param == "sqlite":
        yield from _service(f"sqlite:///{tmp_path_factory.mktemp('property') / 'tuner.db'}")
    else:
        with fresh_postgres_database(request.getfixturevalue("postgres_server")) as url:
            yield from _service(url)


def _fill(
    service: Service, profiles: list[Profile], reports: list[tuple[int, int, bool]]
) -> list[int]:
    """The store holds ``profiles`` (received in that order) and OOM reports on some of
    their pairs, and nothing else; the profiles' ids."""
    database = Database(service.database_url)
    try:
        with database.session(write=True) as session:
            for table in DATA_TABLES:
                session.execute(text(f"DELETE FROM {table}"))
        ids = store(database, profiles)
    finally:
        database.dispose()
    with httpx.Client(
        base_url=service.url, headers={"Authorization": f"Bearer {service.token}"}
    ) as http:
        for index, failed, workload_by_name in reports:
            profile = profiles[index % len(profiles)]
            body = {
                "workload": profile.workload.name if workload_by_name else profile.workload_key,
                "device": profile.device_key,
                "micro_batch_size": failed,
            }
            assert http.post("/api/v1/oom-reports", json=body).status_code in (201, 404)
    return ids


def by_cli(service: Service, asked: dict[str, str], cache: str) -> Said:
    args = [
        part
        for name, value in asked.items()
        if value
        for part in (f"--{name.replace('_', '-')}", value)
    ]
    before = os.environ.get("TUNER_CACHE_DIR")
    os.environ["TUNER_CACHE_DIR"] = cache  # the command keeps answers for offline use there
    try:
        done = tuner("recommend", *args, "--json", url=service.url, token=service.token)
    finally:
        if before is None:
            del os.environ["TUNER_CACHE_DIR"]
        else:
            os.environ["TUNER_CACHE_DIR"] = before
    if done.returncode == 0:
        answer: dict[str, Any] = json.loads(done.stdout)
        answer.pop("profile_age_s")
        return Said(answer, 200)
    return Said(None, done.returncode, done.stderr.strip())


PLAN_FIELDS = set(Recommendation.model_fields)


@pytest.mark.slow
@settings(
    max_examples=20,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.data())
def test_every_surface_gives_the_same_answer(
    service: Service, data: st.DataObject, tmp_path_factory: pytest.TempPathFactory
) -> None:
    count = data.draw(st.integers(min_value=1, max_value=6), label="profiles")
    profiles = [
        data.draw(stored_profile(minute), label=f"profile {minute}") for minute in range(count)
    ]
    reports = data.draw(
        st.lists(st.tuples(st.integers(0, 5), st.integers(1, 12), st.booleans()), max_size=2),
        label="oom reports",
    )
    ids = _fill(service, profiles, reports)
    asked_all = data.draw(st.lists(question(), min_size=2, max_size=3), label="questions")
    with TunerClient(service.database_url, cache_dir=tmp_path_factory.mktemp("asks")) as client:
        _every_surface(service, tmp_path_factory, client, profiles, ids, asked_all)


def _every_surface(
    service: Service,
    tmp_path_factory: pytest.TempPathFactory,
    client: TunerClient,
    profiles: list[Profile],
    ids: list[int],
    asked_all: list[dict[str, str]],
) -> None:
    """Each question asked of every surface, which must agree."""
    for number, asked in enumerate(asked_all):
        route, _ = by_route(service, asked)
        assert route.status != 500, route
        embedded, _ = by_embedded(service, asked)
        dashboard = by_dashboard(service, asked)
        assert route == embedded == dashboard, asked
        if number == 0:
            cli = by_cli(service, asked, str(tmp_path_factory.mktemp("cache")))
            if route.answer is not None:
                assert cli == route, asked
            else:  # refused: the command says so on stderr and exits non-zero
                assert cli.answer is None
                assert cli.status != 0
                assert cli.message, asked
        answer = route.answer
        if answer is not None:
            # The frameworks run the answer's own equal split, and what they are told holds.
            plan = Recommendation.model_validate(
                {k: v for k, v in answer.items() if k in PLAN_FIELDS}
            )
            # The integrations ask the question plan_training builds (the answer's keys,
            # mesh, parallel mode and policy) through the client, and are answered alike.
            asked_by_integrations = RecommendationQuery.at(
                plan.mesh,
                workload=answer["workload_key"],
                device=answer["device_key"],
                global_batch_size=plan.global_batch_size,
                parallel=answer["parallel"],
                policy=plan.policy,
            )
            integrated = client.ask(asked_by_integrations)
            assert integrated.model_dump(mode="json", exclude={"profile_age_s"}) == answer
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", EqualMicroBatchWarning)
                settings_for = lightning_arguments(integrated, world_size=plan.world_size)
                trainer_for = huggingface_arguments(integrated, world_size=plan.world_size)
            equal = answer["equal"]
            assert equal_settings(integrated) == (equal["micro_batch_size"], equal["grad_accum"])
            assert settings_for == {
                "batch_size": equal["micro_batch_size"],
                "accumulate_grad_batches": equal["grad_accum"],
            }
            assert trainer_for == {
                "per_device_train_batch_size": equal["micro_batch_size"],
                "gradient_accumulation_steps": equal["grad_accum"],
            }
            assert (
                equal["micro_batch_size"] * equal["grad_accum"] * plan.mesh.dp
                == answer["global_batch_size"]
            )
        if (
            answer is not None
            and answer["basis"] == "measured"
            and answer["oom_limit"] is None
            and not answer["one_process_only"]
        ):
            profile = profiles[ids.index(answer["profile_id"])]
            offline = answer_from(
                profile,
                global_batch_size=answer["global_batch_size"],
                mesh=MeshShape(answer["world_size"], answer["tp"]),
                policy=answer["policy"],
            )
            assert offline.model_dump(mode="json", include=PLAN_FIELDS) == {
                k: v for k, v in answer.items() if k in PLAN_FIELDS
            }
