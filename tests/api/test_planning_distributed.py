"""plan_training under torch.distributed: two real gloo ranks on 127.0.0.1 against the real
service. Rank 0 asks and broadcasts; rank 1's client points at a port nothing listens on,
so a plan it received can only have come from rank 0. Time-boxed."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from api.config import ServiceSettings
from api.main import create_app
from tests.api.conftest import make_token
from tests.api.documents import sample_profile
from tests.ddp_ranks import run_ranks
from tests.services import ServerThread, free_port
from tuner.client import TunerClient
from tuner.core.errors import TunerError
from tuner.engine.backends import make_backend
from tuner.engine.fingerprint import device_key, workload_key
from tuner.engine.workload import Workload, load_workload
from tuner.train.planning import plan_training

SQLITE = pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
LIMIT = 250_000
PROFILED = {"in_features": 32, "hidden": 64, "layers": 2}
NEVER_PROFILED = {"in_features": 32, "hidden": 48, "layers": 2}


def _mlp(options: dict[str, int]) -> Workload:
    return load_workload("examples.mlp:workload", options)


def plan_on_rank(rank: int, world: int, port: int, url: str, token: str, out: str) -> None:
    """Each rank plans twice: a workload with a profile, then one with none (an error)."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    results: dict[str, object] = {}
    # Only rank 0 may reach the service; rank 1 fails fast if it ever asks.
    reachable = url if rank == 0 else f"http://127.0.0.1:{free_port()}"
    try:
        with TunerClient(reachable, token=token, retries=0, cache_dir=Path(out) / str(rank)) as c:
            for name, options in (("profiled", PROFILED), ("never", NEVER_PROFILED)):
                try:
                    plan = plan_training(
                        _mlp(options),
                        global_batch_size=64,
                        device="cpu",
                        memory_limit_bytes=LIMIT,
                        missing="fail",
                        client=c,
                    )
                    results[name] = plan.model_dump(mode="json")
                except TunerError as exc:
                    results[name] = {"error": type(exc).__name__, "message": exc.message}
        torch.save(json.loads(json.dumps(results)), Path(out) / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()


@pytest.fixture
def service(migrated_url: str) -> Iterator[tuple[str, str]]:
    from api.db import Database

    database = Database(migrated_url)
    token = make_token(database, "admin")
    database.dispose()
    with ServerThread(create_app(ServiceSettings(database_url=migrated_url))) as server:
        yield server.url, token


@pytest.mark.slow
@SQLITE
def test_rank_zero_plans_and_every_rank_gets_the_same_plan_or_error(
    service: tuple[str, str], tmp_path: Path
) -> None:
    url, token = service
    workload = _mlp(PROFILED)
    backend = make_backend("cpu", memory_limit_bytes=LIMIT)
    profile = sample_profile(
        max_micro_batch_size=12,
        workload_key=workload_key(workload, workload.build_optimizer()),
        device_key=device_key(backend),
    )
    with TunerClient(url, token=token, cache_dir=tmp_path / "parent") as client:
        stored = client.upload_profile(profile)

    ranks = run_ranks(
        plan_on_rank, (2, free_port(), url, token, str(tmp_path)), tmp_path, world=2, timeout_s=120
    )

    # The process group's size is the world size: 64 samples over 2 ranks, M* 12.
    first = ranks[0]["profiled"]
    assert first["profile_id"] == stored.id
    assert (first["world_size"], first["per_rank_batch_size"]) == (2, 32)
    assert first["max_micro_batch_size"] == 12
    assert ranks[1]["profiled"] == first  # received, never asked: rank 1 has no service
    # The error rank 0 met, raised on every rank with its type and message.
    assert ranks[0]["never"]["error"] == "NotFoundError"
    assert ranks[1]["never"] == ranks[0]["never"]
