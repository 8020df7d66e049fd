"""FSDP × tensor parallelism on a 2-D mesh, measured on real gloo ranks (127.0.0.1, every
probe time-boxed by the coordinator) and by one process standing for rank 0 of the same
world on torch's fake process group. The fake world must measure the peak the real ranks
measure, at every shape that fits this machine."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

from tests.helpers import run_tuner, subprocess_env
from tuner.core.errors import BadInputError, WorkloadError
from tuner.core.parallel import Parallel, parse_parallel
from tuner.core.results import ProbeResult, ProbeSettings, Profile
from tuner.core.shape import MeshShape
from tuner.engine.backends import make_backend
from tuner.engine.fake_group import fake_process_group, with_one_collective_in_flight
from tuner.engine.fake_world import (
    CollectiveValueGuard,
    guarded_until_a_step_runs,
    profile_fake_world,
)
from tuner.engine.launch import RankGroup
from tuner.engine.probe import Prober
from tuner.engine.rank import RankRequest
from tuner.engine.workload import load_workload

MiB = 2**20
LIMIT = 64 * MiB
MLP = "examples.mesh_mlp:workload"
MLP_OPTIONS = {"dim": 32, "hidden": 64, "layers": 2, "seq_len": 4, "features": 8}
LLAMA = "tuner.hf:causal_lm"
LLAMA_CONFIG = Path(__file__).parents[1] / "data" / "tiny_llama.json"
LLAMA_OPTIONS = {"config": str(LLAMA_CONFIG), "seq_len": 16}
SIZES = (1, 6)
PROBE_TIMEOUT_S = 120.0


@dataclasses.dataclass
class Case:
    target: str
    options: dict[str, object]
    parallel: Parallel
    world_size: int


def _ranks(case: Case) -> Iterator[RankGroup]:
    group = RankGroup(
        RankRequest(
            target=case.target,
            options=case.options,
            device="cpu",
            memory_limit_bytes=LIMIT,
            world_size=case.world_size,
            parallel=case.parallel,
            headroom=0.05,
            settings=ProbeSettings(),
            port=0,
        )
    )
    group.start()
    try:
        yield group
    finally:
        group.stop()


def _real_peaks(case: Case) -> dict[int, list[int]]:
    """Each size's step peak (the tracker's, what a GPU holds) on every real rank."""
    peaks: dict[int, list[int]] = {}
    for group in _ranks(case):
        for size in SIZES:
            results = group.probe(size, PROBE_TIMEOUT_S)
            assert results is not None, f"size {size} ran out of memory on a rank"
            peaks[size] = [r.peak_allocated_bytes or 0 for r in results]
    return peaks


def _fake_probes(case: Case) -> dict[int, ProbeResult]:
    """Each size probed in a fake world as a fake-world profile probes it (one collective
    counted in flight)."""
    workload = load_workload(case.target, case.options)
    workload.parallel = case.parallel
    backend = make_backend("cpu", memory_limit_bytes=LIMIT)
    with (
        fake_process_group(case.world_size),
        backend.session(),
        Prober(workload, backend) as prober,
    ):
        probe = with_one_collective_in_flight(prober)
        return {size: probe(size) for size in SIZES}


def _fake_peaks(case: Case) -> dict[int, int]:
    return {size: probe.peak_bytes or 0 for size, probe in _fake_probes(case).items()}


def _mesh(tp: int, plan: str = "workload", **options: object) -> Parallel:
    return Parallel(mode="fsdp", tp=tp, tp_plan=plan, **options)  # type: ignore[arg-type]


@pytest.mark.slow
# transformers' causal LM returns its logits as a view under sequence parallelism (the
# head's gathered output), which FSDP's root warns of; the step and its memory are as torch
# trains them.
@pytest.mark.filterwarnings("ignore:FSDP2-wrapped module:UserWarning")
@pytest.mark.parametrize(
    "case",
    [
        # Two ranks where two show the shape (tensor parallelism alone, FSDP alone): each
        # rank started imports torch, most of a case's time; bench/distributed.py --mesh
        # compares the shapes of four ranks.
        Case(MLP, MLP_OPTIONS, _mesh(2), 4),  # 2 × 2
        Case(MLP, MLP_OPTIONS, _mesh(2), 2),  # 1 × 2
        Case(MLP, MLP_OPTIONS, _mesh(1), 2),  # 2 × 1: FSDP alone, the plan at degree 1
        Case(LLAMA, LLAMA_OPTIONS, _mesh(2, "llama"), 2),  # 1 × 2
        Case(LLAMA, LLAMA_OPTIONS, _mesh(2, "llama", sequence_parallel=True), 2),
    ],
    ids=["mlp-2x2", "mlp-1x2", "mlp-2x1", "llama-1x2", "llama-1x2-sequence-parallel"],
)
def test_a_fake_world_measures_the_peak_the_real_ranks_measure(case: Case) -> None:
    real = _real_peaks(case)
    probes = _fake_probes(case)
    fake = {size: probe.peak_bytes or 0 for size, probe in probes.items()}
    for size in SIZES:
        # The same step on the same shards: the fake world's peak is the real ranks' to
        # the byte, or below it by what real collectives keep alive until they complete
        # (timing-dependent: 0 at most sizes, usually up to one all-gathered block or
        # activation, which the fake world counts in its footprint as one collective in
        # flight). FSDP issues the next all-gather before the last one's buffer is freed,
        # so a real rank can hold a second: seen once in CI under sequence parallelism,
        # 73,728 B above the fake world's peak where one in flight is 49,152 B.
        in_flight = probes[size].collective_copies_bytes
        assert fake[size] <= min(real[size]), (size, real[size], fake[size])
        assert max(real[size]) - fake[size] <= 2 * in_flight, (size, real[size], fake, in_flight)
    # The mesh shrank what each rank holds: the peak grows with the batch, and not by a
    # whole model's activations (the plan splits the MLP's hidden activations).
    assert fake[SIZES[1]] > fake[SIZES[0]]


@pytest.mark.slow
def test_tensor_parallelism_shrinks_each_ranks_peak_in_worlds_beyond_the_machine() -> None:
    big = {**MLP_OPTIONS, "dim": 64, "hidden": 512}
    peaks = {
        shape: _fake_peaks(Case(MLP, big, _mesh(shape[1]), shape[0] * shape[1]))[SIZES[1]]
        for shape in ((64, 1), (64, 8), (8, 8))
    }
    # The hidden activations and the split layers' shards fall with tp; FSDP's shards with dp.
    assert peaks[(64, 8)] < peaks[(64, 1)]
    assert peaks[(64, 8)] < peaks[(8, 8)]


@pytest.mark.slow
def test_the_llama_plan_computes_the_loss_one_process_computes(tmp_path: Path) -> None:
    """The named plan splits attention heads and the MLP without changing the numbers: on
    two real ranks (1 × 2), with and without sequence parallelism, the loss of the first
    step equals one process's. Llama reshapes to -1 heads; StableLM's attention reshapes
    to the heads it counts, which the plan sets to each rank's share (before, a
    RuntimeError from the first view). One pair of ranks runs every case, one after the
    other on the same process group: starting ranks is most of the time."""
    configs = {
        model: {**LLAMA_OPTIONS, "config": str(LLAMA_CONFIG.with_name(f"tiny_{model}.json"))}
        for model in ("llama", "stablelm")
    }
    code = f"""
import json, os, torch, torch.distributed as dist, torch.multiprocessing as mp
from tuner.core.parallel import Parallel
from tuner.engine.parallel import parallelize
from tuner.engine.workload import load_workload
CONFIGS = {json.dumps(configs)}
def loss(options, parallel):
    workload = load_workload("{LLAMA}", options)
    workload.parallel = parallel
    module = parallelize(workload, parallel, torch.device("cpu"))
    return workload.loss_fn(module, workload.make_batch(3)).item()
def rank(r, out):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=os.environ["PORT"])
    dist.init_process_group("gloo", rank=r, world_size=2)
    for name, options in CONFIGS.items():
        for sp in (False, True):
            plan = Parallel(mode="fsdp", tp=2, tp_plan="llama", sequence_parallel=sp)
            value = loss(options, plan)
            if r == 0:
                out.put([name, sp, value])
    dist.destroy_process_group()
    # Past its result, a rank leaves without the interpreter's teardown, where gloo's
    # threads abort a process now and then (std::terminate; 1 run in 10 here).
    os._exit(0)
if __name__ == "__main__":
    import socket
    alone = {{name: loss(options, Parallel()) for name, options in CONFIGS.items()}}
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0)); os.environ["PORT"] = str(s.getsockname()[1])
    out = mp.get_context("spawn").SimpleQueue()
    mp.start_processes(rank, args=(out,), nprocs=2, start_method="spawn")
    for _ in range(2 * len(CONFIGS)):
        name, sp, value = out.get()
        print(json.dumps([name, sp, alone[name], value]))
"""
    script = tmp_path / "llama_ranks.py"
    script.write_text(code)
    done = subprocess.run(
        [sys.executable, str(script)],
        cwd=Path(__file__).parents[2],
        env=subprocess_env(),
        capture_output=True,
        text=True,
        timeout=240,  # a hang fails the test
        check=False,
    )
    assert done.returncode == 0, done.stderr
    cases = [json.loads(line) for line in done.stdout.strip().splitlines()]
    assert {(name, sp) for name, sp, _, _ in cases} == {
        (model, sp) for model in configs for sp in (False, True)
    }
    for name, sp, alone, split in cases:
        assert split == pytest.approx(alone, rel=1e-5), (name, sp)


def test_a_step_that_reads_a_collectives_values_is_refused_in_a_fake_world() -> None:
    workload = load_workload("tests.mesh_workloads:routed")
    with pytest.raises(WorkloadError, match=r"reads the values of a collective's result"):
        profile_fake_world(
            workload,
            make_backend("cpu", memory_limit_bytes=LIMIT),
            world_size=4,
            headroom=0.05,
            strategy="model",
            size_cap=64,
        )


@pytest.fixture(scope="module")
def fake_world_at_tp2() -> tuple[Profile, list[tuple[int, bool]]]:
    """A fake-world profile at 8 × 2, and each size the search probed with whether the
    guard against collective values was on (the tests below share it: each profile asks
    the dry run about many sizes, a step on fake tensors each)."""
    sizes: list[tuple[int, bool]] = []
    call = Prober.__call__

    def recording(self: Prober, size: int, **kwargs: bool) -> ProbeResult:
        if type(self) is Prober:  # the probes, not the dry run's predictions
            guarded = any(
                isinstance(mode, CollectiveValueGuard)
                for mode in _get_current_dispatch_mode_stack()
            )
            sizes.append((size, guarded))
        return call(self, size, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(Prober, "__call__", recording)
        return _fake_world_profile(2), sizes


@pytest.mark.slow
def test_a_fake_world_guards_its_first_probe_and_runs_no_probe_twice(
    fake_world_at_tp2: tuple[Profile, list[tuple[int, bool]]],
) -> None:
    """The guard against collective values rides on the search's first probe (where the
    dry run aims it), which was run twice before: once guarded at size 1, once measured."""
    profile, sizes = fake_world_at_tp2
    assert [size for size, _ in sizes] == [p.micro_batch_size for p in profile.probes]
    assert sizes[0][1] is True
    assert not any(guarded for _, guarded in sizes[1:])


def test_the_guard_stays_until_a_probe_has_run_its_steps_whole() -> None:
    """A probe that ran out of memory may have stopped before the step read a value."""
    guarded: list[bool] = []

    def probe(size: int) -> ProbeResult:
        guarded.append(
            any(isinstance(m, CollectiveValueGuard) for m in _get_current_dispatch_mode_stack())
        )
        return ProbeResult(micro_batch_size=size, fits=size < 8, oom=size >= 8)

    checked = guarded_until_a_step_runs(probe)
    for size in (16, 8, 4, 6):
        checked(size)
    assert guarded == [True, True, True, False]


def _fake_world_profile(tp: int, world_size: int = 16) -> Profile:
    """A small limit and cap: every size the search asks the dry run about costs a step on
    fake tensors, and the cap bounds how many it asks (M* 96 at tp 2, 116 at tp 4)."""
    workload = load_workload(MLP, MLP_OPTIONS)
    workload.parallel = _mesh(tp)
    return profile_fake_world(
        workload,
        make_backend("cpu", memory_limit_bytes=int(0.6 * MiB)),
        world_size=world_size,
        headroom=0.05,
        strategy="model",
        size_cap=128,
    )


@pytest.mark.slow
def test_a_fake_world_profile_is_measured_marked_and_keyed_like_a_real_one(
    fake_world_at_tp2: tuple[Profile, list[tuple[int, bool]]],
) -> None:
    profile, _ = fake_world_at_tp2
    assert profile.settings.simulated_ranks
    assert (profile.world_size, profile.parallel.tp) == (16, 2)
    assert profile.max_micro_batch_size > 0
    fits = profile.probe_at(profile.max_micro_batch_size)
    above = profile.probe_at(profile.max_micro_batch_size + 1)
    assert fits is not None
    assert fits.fits
    assert above is not None
    assert not above.fits
    # One collective in flight is counted at the peak, in the footprint and not in the
    # peak: at least the all-reduced activation of a row-wise layer (m × 4 × 32 fp32).
    assert fits.collective_copies_bytes >= profile.max_micro_batch_size * 4 * 32 * 4
    assert fits.footprint_bytes == (
        fits.peak_bytes + fits.non_torch_bytes + fits.collective_copies_bytes
    )
    assert fits.footprint_bytes <= profile.budget_bytes
    # tp is a shape, not a setting: the same workload at another mesh has the same key.
    other = _fake_world_profile(4)
    assert other.workload_key == profile.workload_key
    assert other.max_micro_batch_size > profile.max_micro_batch_size
    assert not torch.distributed.is_initialized()  # the fake world is left behind


@pytest.mark.slow
def test_the_command_line_says_a_fake_worlds_numerics_are_not_trained() -> None:
    done = run_tuner(
        "profile", MLP, *(f"-o{k}={v}" for k, v in MLP_OPTIONS.items()),
        "--world-size", "512", "--tp", "8", "--fake-world", "--max", "256",
        "--memory-limit", "2MiB", "--device", "cpu", "--global-batch-size", "4096",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    out = " ".join(done.stdout.split())
    assert "as a 64 × 8 mesh (dp × tp)" in out
    assert "numerics not trained" in out
    # What each dimension saved a rank: the whole model's parameters over 512 (split
    # layers) or 64 (the rest), measured at M*.
    assert "mesh 64 × 8: parameters" in out
    assert "÷512 for the layers the tp plan splits, ÷64 for the rest" in out
    assert "in flight +" in out
    # The global batch is split over the 64 data-parallel groups, not 512 ranks.
    assert "global batch 4096" in out
    # The sentence names the groups, as `tuner recommend` does, not 64 ranks.
    assert "× 64 data-parallel groups of 8 ranks = global batch 4096" in out
    # The flag is what this run checks: a cap of 4 keeps the dry run to a few steps.
    as_json = run_tuner(
        "profile", MLP, "--world-size", "8", "--tp", "2", "--fake-world", "--max", "4",
        "--memory-limit", "16MiB", "--device", "cpu", "--json",
    )  # fmt: skip
    assert as_json.returncode == 0, as_json.stderr
    assert json.loads(as_json.stdout)["settings"]["simulated_ranks"] is True


@pytest.mark.slow
@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (["--world-size", "6", "--tp", "4"], "world size 6 is not a multiple of tp 4"),
        (["--world-size", "4", "--tp", "2", "--parallel", "ddp"], "--tp needs --parallel fsdp"),
        (["--world-size", "4", "--fake-world", "--seq-lens", "4,8"], "one shape at a time"),
        (
            [
                "--world-size",
                "4",
                "--tp",
                "2",
                "--fake-world",
                "--parallel-option",
                "tp_plan=llama",
            ],
            "has no Llama-like decoder block",
        ),
    ],
)
def test_mesh_arguments_that_cannot_run_are_refused_in_one_line(
    arguments: list[str], message: str
) -> None:
    done = run_tuner("profile", MLP, "--memory-limit", "16MiB", "--device", "cpu", *arguments)
    assert done.returncode != 0
    assert message in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.slow
def test_a_llama_like_block_with_a_module_per_head_is_refused_in_one_line(
    tmp_path: Path,
) -> None:
    """StableLM with ``qk_layernorm`` keeps one norm per head, which the plan would hand to
    the wrong ranks' heads."""
    config = json.loads(LLAMA_CONFIG.with_name("tiny_stablelm.json").read_text())
    path = tmp_path / "stablelm_qk_norm.json"
    path.write_text(json.dumps({**config, "qk_layernorm": True}))
    done = run_tuner(
        "profile", LLAMA, "-o", f"config={path}", "-o", "seq_len=16",
        "--memory-limit", "16MiB", "--device", "cpu", "--world-size", "4", "--tp", "2",
        "--fake-world", "--parallel", "fsdp", "--parallel-option", "tp_plan=llama",
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert "q_layernorm.norms keeps a module per head" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr


def test_the_mesh_options_are_checked_where_they_are_parsed() -> None:
    with pytest.raises(BadInputError, match="tp > 1 needs a plan"):
        parse_parallel("fsdp", ["tp=2"])
    with pytest.raises(BadInputError, match="unknown tp_plan 'megatron'"):
        parse_parallel("fsdp", ["tp_plan=megatron"])
    assert parse_parallel("fsdp", ["tp=2", "tp_plan=llama"]).mesh(8) == MeshShape.of(4, 2)
    with pytest.raises(BadInputError, match="not a multiple of tp 4"):
        _mesh(4).mesh(6)
    # The plan is in the key; the degree is a shape and is not.
    assert _mesh(2).memory_fields() == _mesh(4).memory_fields()
    assert "tp_plan" in _mesh(2).memory_fields()
    assert "tp_plan" not in Parallel(mode="fsdp").memory_fields()
