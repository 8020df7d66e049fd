"""`tuner profile` plans for the mesh the workload is measured on, wherever its tp came
from: ``--tp``, or the parallel spec (``--parallel-option tp=2``, the workload's own).

Before the mesh was one type, the plan read ``--world-size`` and ``--tp`` from the command
line alone: a 2 × 2 mesh given by ``--parallel-option tp=2`` was planned as four ranks
(``micro batch 7 × 4 ranks`` for a global batch of 28), and a global batch that the two
data-parallel groups share exactly (26) was refused as not divisible by the world size.
"""

from __future__ import annotations

import pytest

from tests.helpers import run_tuner

MESH_MLP = "examples.mesh_mlp:workload"
OPTIONS = ("-odim=32", "-ohidden=64", "-olayers=2", "-oseq_len=4", "-ofeatures=8")
# Four ranks of FSDP whose tp comes from the parallel spec, not from --tp.
TP_FROM_THE_SPEC = (
    *("--world-size", "4", "--parallel", "fsdp", "--parallel-option", "tp=2"),
    *("--fake-world", "--memory-limit", "16MiB", "--device", "cpu"),
)


@pytest.mark.slow
def test_a_tp_from_the_parallel_spec_is_the_plans_mesh() -> None:
    done = run_tuner(
        "profile", MESH_MLP, *OPTIONS, *TP_FROM_THE_SPEC, "--max", "2",
        "--global-batch-size", "26",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    out = " ".join(done.stdout.split())
    assert "as a 2 × 2 mesh (dp × tp)" in out
    assert "13 samples a step × 2 data-parallel groups of 2 ranks = global batch 26" in out


@pytest.mark.slow
def test_a_global_batch_the_groups_cannot_share_is_refused_before_probing() -> None:
    done = run_tuner(
        "profile", MESH_MLP, *OPTIONS, *TP_FROM_THE_SPEC, "--global-batch-size", "27"
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert "not divisible by the 2 data-parallel groups of a 2 × 2 mesh" in done.stderr
    assert "probing" not in done.stderr
    assert "Traceback" not in done.stderr
