"""A fake world's search is aimed by a dry run of the same rank: the fake copy of the model
is sharded and split as the rank's is, on torch's fake process group under fake tensors,
and its predictions differ from the rank's probes only by the tensor-parallel layers'
biases (a constant: 256 B a block here). Real FSDP ranks are aimed by the same dry run,
held by their coordinator."""

from __future__ import annotations

import pytest

from tuner.core.parallel import Parallel
from tuner.core.results import ProbeSettings
from tuner.engine.backends import CpuBackend, make_backend
from tuner.engine.dry_run import DryRun
from tuner.engine.fake_group import fake_process_group, with_one_collective_in_flight
from tuner.engine.fake_world import profile_fake_world
from tuner.engine.launch import profile_distributed
from tuner.engine.probe import Prober
from tuner.engine.workload import Workload, load_workload

MiB = 2**20
MLP_OPTIONS = {"dim": 32, "hidden": 64, "layers": 2, "seq_len": 4, "features": 8}
WORLD = 16


def mesh_mlp(tp: int = 2) -> Workload:
    workload = load_workload("examples.mesh_mlp:workload", MLP_OPTIONS)
    workload.parallel = workload.parallel.model_copy(update={"tp": tp})
    return workload


@pytest.mark.slow
def test_the_dry_run_of_a_fake_world_predicts_its_probes_but_for_the_biases() -> None:
    workload = mesh_mlp()
    backend = CpuBackend(2**36)
    # Each block's column-wise bias (64 / 2 fp32) and row-wise bias (32 fp32).
    biases = 2 * (64 // 2 + 32) * 4
    with (
        fake_process_group(WORLD),
        DryRun(workload, backend, headroom=0.05, measured_as=with_one_collective_in_flight) as dry,
        Prober(workload, backend, settings=ProbeSettings(simulated_ranks=True)) as prober,
    ):
        probe = with_one_collective_in_flight(prober)
        assert dry.available
        for size in (1, 7):
            measured, predicted = probe(size), dry(size)
            assert predicted is not None
            assert predicted.collective_copies_bytes == measured.collective_copies_bytes
            assert measured.footprint_bytes is not None
            assert predicted.footprint_bytes == measured.footprint_bytes + biases, size


@pytest.mark.slow
def test_a_fake_world_search_aims_at_its_predicted_boundary() -> None:
    """Without predictions this search starts at size 1 and takes 12 probes."""
    profile = profile_fake_world(
        mesh_mlp(),
        make_backend("cpu", memory_limit_bytes=2 * MiB),
        world_size=WORLD,
        headroom=0.05,
        strategy="model",
        size_cap=4096,
    )
    sizes = [p.micro_batch_size for p in profile.probes]
    m_star = profile.max_micro_batch_size
    assert m_star > 100
    assert len(sizes) <= 3, sizes
    assert abs(sizes[0] - m_star) <= 1, sizes


@pytest.mark.slow
def test_fsdp_ranks_search_from_the_predicted_boundary() -> None:
    """Aimed by one process's step calibrated on size 1, this search took 4 probes."""
    profile = profile_distributed(
        "examples.gpt:workload",
        options={"layers": 1, "dim": 32, "heads": 2, "vocab": 64, "seq_len": 16},
        device="cpu",
        memory_limit_bytes=2 * MiB,
        world_size=2,
        parallel=Parallel(mode="fsdp"),
        headroom=0.05,
        strategy="model",
        size_cap=4096,
        probe_timeout_s=300,
    )
    sizes = [p.micro_batch_size for p in profile.probes]
    assert profile.max_micro_batch_size > 10
    assert len(sizes) <= 3, sizes
    assert sizes[0] != 1, sizes
