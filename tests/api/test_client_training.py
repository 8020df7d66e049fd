"""plan_training end to end on the CPU with the example MLP: no profile → profiled in this
process → uploaded → the plan; later calls use the stored profile without probing; an
out-of-memory in the training loop, reported to the real service, lowers the next plan;
estimates, queued jobs run by a real worker, and an unreachable service."""

from __future__ import annotations

import copy
import threading
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from api.config import ServiceSettings
from api.db import Database
from api.main import create_app
from tests.api.conftest import make_token
from tests.api.documents import sample_profile
from tests.services import ServerThread, free_port
from tuner.client import OfflineRecommendation, TunerClient, TunerOfflineWarning
from tuner.core.errors import (
    BadInputError,
    NotFoundError,
    NothingFitsError,
    ServiceUnavailableError,
)
from tuner.core.plan import balanced_split
from tuner.core.wire.recommendation import RecommendationPublic
from tuner.engine.backends import CpuBackend, iter_tensors, make_backend
from tuner.engine.batching import batch_tensors
from tuner.engine.fingerprint import device_key, workload_key
from tuner.engine.workload import Workload, load_workload
from tuner.train import planning as training
from tuner.train.accumulate import Accumulator
from tuner.train.planning import plan_training
from tuner.worker.allow import AllowList
from tuner.worker.loop import DeviceIdentity, Worker

TARGET = "examples.mlp:workload"
OPTIONS: dict[str, Any] = {"in_features": 32, "hidden": 64, "layers": 2}
LIMIT = 250_000  # bytes: M* of this MLP is below 100, so a batch of 256 accumulates
BATCH = 256
SQLITE = pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)


def mlp() -> Workload:
    return load_workload(TARGET, OPTIONS)


@pytest.fixture
def server(migrated_url: str) -> Iterator[ServerThread]:
    with ServerThread(create_app(ServiceSettings(database_url=migrated_url))) as running:
        yield running


@pytest.fixture(params=["http", "embedded"])
def client(
    request: pytest.FixtureRequest, migrated_url: str, database: Database, tmp_path: Path
) -> Iterator[TunerClient]:
    if request.param == "http":
        url = request.getfixturevalue("server").url
        token: str | None = make_token(database, "admin")
    else:
        url, token = migrated_url, None
    with TunerClient(url, token=token, cache_dir=tmp_path / "cache") as opened:
        yield opened


class ProfileCalls:
    """profile_workload as plan_training sees it, counted; ``forbid()`` makes any call fail."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.count = 0
        self.allowed = True
        real: Callable[..., Any] = training.profile_workload

        def counted(*args: Any, **kwargs: Any) -> Any:
            assert self.allowed, "profiled although a profile was stored"
            self.count += 1
            return real(*args, **kwargs)

        monkeypatch.setattr(training, "profile_workload", counted)

    def forbid(self) -> None:
        self.allowed = False


@pytest.fixture
def profiled(monkeypatch: pytest.MonkeyPatch) -> ProfileCalls:
    return ProfileCalls(monkeypatch)


def plan_for(workload: Workload, client: TunerClient, **options: Any) -> Any:
    settings = {"global_batch_size": BATCH, "device": "cpu", "memory_limit_bytes": LIMIT}
    return plan_training(workload, client=client, **{**settings, **options})


@pytest.mark.slow
@SQLITE
def test_profiled_once_uploaded_then_served_from_the_stored_profile(
    client: TunerClient, profiled: ProfileCalls
) -> None:
    workload = mlp()
    weights = copy.deepcopy(workload.model.state_dict())
    plan = plan_for(workload, client)

    assert profiled.count == 1
    assert isinstance(plan, RecommendationPublic)
    assert plan.basis == "measured"
    (stored,) = client.list_profiles().data
    assert plan.profile_id == stored.id
    assert 1 < plan.micro_batch_size <= stored.max_micro_batch_size < BATCH
    assert plan.flat_split() == balanced_split(BATCH, stored.max_micro_batch_size)
    assert sum(plan.flat_split()) * plan.world_size == BATCH  # global batch = micro × accum × world
    assert plan.grad_accum == len(plan.flat_split())
    # The user's model is as it was, and its optimizer holds no state from the probes.
    assert all(torch.equal(weights[k], v) for k, v in workload.model.state_dict().items())
    assert workload.model.training
    assert not workload.build_optimizer().state

    profiled.forbid()
    again = plan_for(workload, client)
    assert again.model_dump(exclude={"profile_age_s"}) == plan.model_dump(exclude={"profile_age_s"})
    assert client.list_profiles().count == 1


def tracked_step(accumulator: Accumulator, batch: Any, limit: int) -> Any:
    """One training step with every live tensor byte counted against ``limit``."""
    resident = [
        *accumulator.model.parameters(),
        *iter_tensors(dict(accumulator.optimizer.state)),
        *(t for _, t in batch_tensors(batch)),
    ]
    with CpuBackend(limit).track(resident):
        return accumulator.step(batch)


@pytest.mark.slow
@SQLITE
def test_an_oom_in_training_reported_to_the_service_lowers_the_next_plan(
    client: TunerClient, profiled: ProfileCalls
) -> None:
    workload = mlp()
    # max: the accumulator runs M* itself, the size the profile's fit is measured around.
    plan = plan_for(workload, client, policy="max")
    largest = plan.micro_batch_size
    fit = client.get_profile(plan.profile_id).fit
    assert fit is not None
    # A smaller card than the profile's: the planned size runs out of memory, half fits.
    smaller = int(fit.fixed_bytes + fit.bytes_per_sample * 0.75 * largest)
    reporter = client.oom_reporter(plan)
    halvings: list[tuple[int, int]] = []

    def on_oom(failed: int, new: int, message: str) -> None:
        halvings.append((failed, new))
        reporter(failed, new, message)

    # The plan's own split (max: M* first), so the first micro batch is M* itself.
    accumulator = Accumulator.for_workload(workload, largest, on_oom=on_oom, split=plan.split)
    batch = workload.make_batch(BATCH)
    # Two steps: AdamW's moments exist from the first step's end, as in the profile's probes.
    reports = [tracked_step(accumulator, batch, smaller) for _ in range(2)]

    assert halvings == [(largest, largest // 2)]
    # After halving, the batch is split again into micro batches of at most half.
    halved = max(balanced_split(BATCH, largest // 2))
    assert [r.micro_batch_size for r in reports] == [largest, halved]
    assert reporter.reported == [largest]
    profiled.forbid()
    lowered = plan_for(workload, client, policy="max")
    # The run went on at half: that is what the next plan gives, not one below the failure.
    settled = largest // 2
    assert (lowered.oom_limit, lowered.micro_batch_size) == (settled + 1, settled)
    assert lowered.profile_id == plan.profile_id


@pytest.mark.slow
@SQLITE
def test_an_estimate_is_measured_unless_missing_is_fail(
    client: TunerClient, profiled: ProfileCalls
) -> None:
    workload = mlp()
    here = device_key(make_backend("cpu", memory_limit_bytes=LIMIT))
    key = workload_key(workload, workload.build_optimizer())
    # The service knows this device (from another workload's profile), and this workload
    # from another device: enough to estimate, not to measure.
    client.upload_profile(sample_profile(device_key=here, device_name="this cpu"))
    client.upload_profile(sample_profile(workload_key=key, workload_name=workload.name))
    estimate = plan_for(workload, client, missing="fail")
    assert estimate.basis == "estimated"
    assert profiled.count == 0

    measured = plan_for(workload, client)
    assert measured.basis == "measured"
    assert profiled.count == 1


@SQLITE
def test_nothing_fits_is_stored_once_and_said_with_what_would_help(
    client: TunerClient, profiled: ProfileCalls
) -> None:
    workload = mlp()
    with pytest.raises(NothingFitsError, match="What would help"):
        plan_for(workload, client, memory_limit_bytes=20_000)
    (stored,) = client.list_profiles().data
    assert stored.max_micro_batch_size == 0
    profiled.forbid()  # the service knows now: no second measurement
    with pytest.raises(NothingFitsError):
        plan_for(workload, client, memory_limit_bytes=20_000)


@SQLITE
def test_missing_fail_raises_the_services_not_found(client: TunerClient) -> None:
    with pytest.raises(NotFoundError, match="no workload has the key or name"):
        plan_for(mlp(), client, missing="fail")


def test_with_the_service_out_of_reach_it_measures_here_and_warns_once(
    tmp_path: Path, profiled: ProfileCalls
) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    with TunerClient(url, cache_dir=tmp_path, retries=0, timeout=1) as client:
        with pytest.warns(TunerOfflineWarning, match="was not uploaded") as caught:
            plan = plan_for(mlp(), client)
        assert len(caught) == 1
        assert isinstance(plan, OfflineRecommendation)
        assert plan.basis == "measured"  # measured here, just now
        assert sum(plan.flat_split()) == BATCH
        assert profiled.count == 1
        with pytest.raises(ServiceUnavailableError):
            plan_for(mlp(), client, missing="fail")
        # A fallback wins over measuring: the caller chose what to do without the service.
        with pytest.warns(TunerOfflineWarning, match="the fallback is used"):
            fallback = plan_for(mlp(), client, fallback=(32, 8))
        assert (fallback.micro_batch_size, profiled.count) == (32, 1)


def test_without_a_client_it_opens_one_from_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, profiled: ProfileCalls
) -> None:
    monkeypatch.setenv("TUNER_URL", f"sqlite:///{tmp_path / 'tuner.db'}")
    first = plan_for(mlp(), None)
    profiled.forbid()
    assert plan_for(mlp(), None).profile_id == first.profile_id


def test_bad_arguments_say_what_to_give(tmp_path: Path) -> None:
    with TunerClient("http://127.0.0.1:9", cache_dir=tmp_path) as client:
        with pytest.raises(BadInputError, match="needs memory_limit_bytes"):
            plan_training(mlp(), global_batch_size=8, device="cpu", client=client)
        with pytest.raises(BadInputError, match="missing='later'"):
            plan_for(mlp(), client, missing="later")


@SQLITE
def test_queue_needs_a_target_a_worker_can_import(client: TunerClient) -> None:
    workload = mlp()
    anonymous = Workload(
        model=workload.model,
        optimizer=workload.optimizer,
        make_batch=workload.make_batch,
        loss_fn=workload.loss_fn,
    )
    with pytest.raises(BadInputError, match="load_workload"):
        plan_for(anonymous, client, missing="queue")


@SQLITE
@pytest.mark.slow
def test_queue_waits_for_a_real_worker_then_plans(
    server: ServerThread, database: Database, tmp_path: Path, profiled: ProfileCalls
) -> None:
    backend = make_backend("cpu", memory_limit_bytes=LIMIT)
    worker = Worker(
        url=server.url,
        token=make_token(database, "worker"),
        identity=DeviceIdentity("cpu", device_key(backend), backend.describe()),
        name="in-test",
        allow=AllowList(("examples",)),
        memory_limit_bytes=LIMIT,
        poll_interval=0.1,
        log=lambda _line: None,
    )
    runner = threading.Thread(target=worker.run, kwargs={"max_jobs": 1})
    runner.start()
    try:
        with (
            TunerClient(server.url, token=make_token(database, "write"), cache_dir=tmp_path) as c,
            warnings.catch_warnings(),
        ):
            warnings.simplefilter("error")
            plan = plan_for(mlp(), c, missing="queue", options=OPTIONS, poll_interval=0.2)
            job = c.get_job(1)
    finally:
        worker.stop()
        runner.join(timeout=60)
        worker.close()
    assert profiled.count == 0  # the worker measured it, in its own process
    assert (job.status, job.target, job.options) == ("succeeded", TARGET, OPTIONS)
    assert job.settings.memory_limit_bytes == LIMIT
    assert isinstance(plan, RecommendationPublic)
    assert (plan.basis, plan.profile_id) == ("measured", job.profile_id)
