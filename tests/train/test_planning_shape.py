"""plan_training reads the run's mesh once, from the world size and the workload's spec:
a world that tp does not divide is refused in one line, by the shape's own rule."""

from __future__ import annotations

from pathlib import Path

import pytest

from tuner.client import TunerClient
from tuner.core.errors import BadInputError
from tuner.core.parallel import Parallel
from tuner.engine.workload import load_workload
from tuner.train.planning import plan_training


def test_a_world_that_tp_does_not_divide_is_refused_before_any_question(
    tmp_path: Path,
) -> None:
    workload = load_workload("examples.mesh_mlp:workload")
    workload.parallel = Parallel(mode="fsdp", tp=4, tp_plan="workload")
    with (
        TunerClient(f"sqlite:///{tmp_path / 'tuner.db'}", cache_dir=tmp_path) as client,
        pytest.raises(BadInputError, match="world size 6 is not a multiple of tp 4"),
    ):
        plan_training(
            workload,
            global_batch_size=12,
            world_size=6,
            device="cpu",
            memory_limit_bytes=64 * 2**20,
            missing="fail",
            client=client,
        )
