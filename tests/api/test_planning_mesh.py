"""plan_training and queued jobs on a 2-D mesh, against a real SQLite store: the question
carries the mesh, so the answer is the profile at that shape and the global batch is split
over the data-parallel groups (world / tp), not over the ranks."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tuner.client import TunerClient
from tuner.core.parallel import Parallel
from tuner.engine.backends import make_backend
from tuner.engine.fingerprint import device_key, workload_key
from tuner.engine.workload import Workload, load_workload
from tuner.train.planning import plan_training
from tuner.worker.profile_run import profile_command

MESH_PROFILES = Path(__file__).parents[1] / "data" / "mesh"
LIMIT = 64 * 2**20


def _mesh_mlp(tp: int) -> Workload:
    workload = load_workload("examples.mesh_mlp:workload")
    workload.parallel = Parallel(mode="fsdp", tp=tp, tp_plan="workload")
    return workload


def _stored(client: TunerClient) -> dict[tuple[int, int], int]:
    """Every real fake-world profile of examples.mesh_mlp, keyed as this machine keys them
    (the device key names this machine's CPU); their ids by (world size, tp)."""
    workload = _mesh_mlp(1)
    key = workload_key(workload, workload.build_optimizer())
    device = device_key(make_backend("cpu", memory_limit_bytes=LIMIT))
    ids = {}
    for path in sorted(MESH_PROFILES.glob("*.json")):
        document: dict[str, Any] = json.loads(path.read_text())
        document.update(workload_key=key, device_key=device)
        stored = client.upload_profile(document)
        ids[document["world_size"], document["parallel"]["tp"]] = stored.id
    return ids


def test_a_mesh_workload_is_planned_from_its_shape_with_the_batch_split_over_dp(
    tmp_path: Path,
) -> None:
    with TunerClient(f"sqlite:///{tmp_path / 'tuner.db'}", cache_dir=tmp_path) as client:
        ids = _stored(client)
        plan = plan_training(
            _mesh_mlp(2),
            global_batch_size=1024,
            world_size=4,
            device="cpu",
            memory_limit_bytes=LIMIT,
            missing="fail",
            client=client,
        )
        # The 2 × 2 profile answers (not the 4 × 1 one, which holds more per rank), and
        # each of the 2 data-parallel groups takes 512 samples.
        assert plan.profile_id == ids[4, 2]
        assert plan.per_rank_batch_size == 512
        assert sum(plan.flat_split()) == 512
        assert plan.micro_batch_size <= 272  # the 2 × 2 profile's M*
        flat = plan_training(
            _mesh_mlp(1),
            global_batch_size=1024,
            world_size=4,
            device="cpu",
            memory_limit_bytes=LIMIT,
            missing="fail",
            client=client,
        )
        assert flat.profile_id == ids[4, 1]
        assert flat.per_rank_batch_size == 256


def test_a_queued_mesh_job_is_profiled_on_the_mesh() -> None:
    command = profile_command(
        "examples.mesh_mlp:workload",
        options={},
        settings={"world_size": 8, "parallel": "fsdp", "tp": 2},
        device="cpu",
        memory_limit_bytes=LIMIT,
    )
    flags = command[command.index("--device") :]
    assert flags[flags.index("--tp") + 1] == "2"
    assert flags[flags.index("--world-size") + 1] == "8"


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"world_size": 6, "parallel": "fsdp", "tp": 4}, "not a multiple of tp 4"),
        ({"world_size": 4, "parallel": "ddp", "tp": 2}, "tp needs parallel fsdp"),
    ],
)
def test_a_mesh_job_that_cannot_run_is_refused_when_queued(
    tmp_path: Path, settings: dict[str, Any], message: str
) -> None:
    from tuner.core.errors import BadInputError

    with (
        TunerClient(f"sqlite:///{tmp_path / 'tuner.db'}", cache_dir=tmp_path) as client,
        pytest.raises(BadInputError, match=message),
    ):
        client.queue_job("examples.mesh_mlp:workload", device="cpu", **settings)
