"""Profiles at world size W: real rank processes on gloo (127.0.0.1), each under the CPU
backend's own limit, one search across them. Every profile is time-boxed by the
coordinator (a rank that does not answer is ended and the test fails, never hangs)."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest

from tests.helpers import run_tuner
from tuner.core.parallel import Parallel
from tuner.core.results import Profile
from tuner.engine import launch
from tuner.engine.backends import make_backend
from tuner.engine.dry_run import DryRun, dry_run_of_target
from tuner.engine.launch import profile_distributed
from tuner.engine.profiler import profile_workload
from tuner.engine.rank import RankReady
from tuner.engine.workload import load_workload

MiB = 2**20
# Parameter-heavy for its size (a 2048-token vocabulary, 8-token sequences), so that a
# copy of the gradients is worth a few samples of activations.
GPT = {"layers": 1, "dim": 64, "heads": 2, "vocab": 2048, "seq_len": 8}
LIMIT = 8 * MiB
PROBE_TIMEOUT_S = 120


def _profile(parallel: Parallel, world_size: int, **search: object) -> Profile:
    return profile_distributed(
        "examples.gpt:workload",
        options=GPT,
        device="cpu",
        memory_limit_bytes=LIMIT,
        world_size=world_size,
        parallel=parallel,
        headroom=0.05,
        strategy=str(search.pop("strategy", "model")),
        size_cap=int(search.pop("size_cap", 4096)),  # type: ignore[call-overload]
        probe_timeout_s=PROBE_TIMEOUT_S,
    )


def _at_max(profile: Profile):  # type: ignore[no-untyped-def]
    probe = profile.probe_at(profile.max_micro_batch_size)
    assert probe is not None
    assert probe.breakdown is not None
    return probe


@pytest.fixture(scope="module")
def ddp_default() -> tuple[Profile, list[tuple[str, object]]]:
    """DDP's default profile on two ranks, and what the coordinator did in which order
    while it started them: the dry run built (at the capacity it stood for) and the ranks
    ready (with the capacity their budget stands for). Two tests read it; each profile on
    real ranks costs the ranks' start and every probe."""
    events: list[tuple[str, object]] = []
    build, wait = dry_run_of_target, launch.RankGroup.wait_ready

    def building(*args: Any, **kwargs: Any) -> DryRun:
        events.append(("dry run", kwargs["capacity_bytes"]))
        return build(*args, **kwargs)

    def waiting(self: launch.RankGroup) -> RankReady:
        ready = wait(self)
        events.append(("ready", math.ceil(ready.budget_bytes / (1 - 0.05))))
        return ready

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(launch, "dry_run_of_target", building)
        patch.setattr(launch.RankGroup, "wait_ready", waiting)
        return _profile(Parallel(mode="ddp"), 2), events


@pytest.mark.slow
def test_ddp_the_bucket_copy_shows_and_bucket_views_zeroed_in_place_give_it_back(
    ddp_default: tuple[Profile, list[tuple[str, object]]],
) -> None:
    off = _profile(Parallel(mode="ddp", gradient_as_bucket_view=False), 2)
    views_to_none = _profile(Parallel(mode="ddp", set_to_none=True), 2)
    views_in_place, _ = ddp_default  # the default: in place with views
    one_process = profile_workload(
        load_workload("examples.gpt:workload", GPT), make_backend("cpu", memory_limit_bytes=LIMIT)
    )
    gradients = _at_max(off).breakdown.gradients_bytes
    # Without bucket views, and with views but gradients set to None, DDP holds a second
    # copy of the gradients between micro batches; with views zeroed in place it does not.
    for profile in (off, views_to_none):
        assert _at_max(profile).breakdown.communication_bytes == pytest.approx(gradients, rel=0.05)
    assert _at_max(views_in_place).breakdown.communication_bytes < 0.05 * gradients
    # M* in the order measured: the copy costs samples; views zeroed in place win them back.
    assert views_in_place.max_micro_batch_size > off.max_micro_batch_size
    assert views_in_place.max_micro_batch_size > views_to_none.max_micro_batch_size
    assert one_process.max_micro_batch_size >= views_in_place.max_micro_batch_size
    for profile in (off, views_to_none, views_in_place):
        assert profile.world_size == 2
        assert profile.parallel.mode == "ddp"
        # Every probe that ran to the end on both ranks carries both peaks (one stopped at
        # twice the limit carries none: the ranks were ended and restarted).
        assert all(len(p.rank_peaks_bytes) == 2 for p in profile.probes if p.peak_bytes)
        assert profile.probe_at(profile.max_micro_batch_size + 1).fits is False  # type: ignore[union-attr]
    # The spec is part of the workload key; one process keeps the key it always had.
    keys = {p.workload_key for p in (off, views_to_none, views_in_place, one_process)}
    assert len(keys) == 4


@pytest.mark.slow
def test_fsdp_sharded_terms_scale_as_one_over_w_and_sync_styles_are_measured_apart() -> None:
    every2 = _profile(Parallel(mode="fsdp"), 2, size_cap=2, strategy="bisect")
    every4 = _profile(Parallel(mode="fsdp"), 4, size_cap=2, strategy="bisect")
    last2 = _profile(Parallel(mode="fsdp", gradient_sync="last"), 2, size_cap=2, strategy="bisect")
    two, four = _at_max(every2).breakdown, _at_max(every4).breakdown
    for name in ("parameters_bytes", "gradients_bytes", "optimizer_state_bytes"):
        assert getattr(two, name) / getattr(four, name) == pytest.approx(2.0, rel=0.05), name
    # Syncing on the last micro batch keeps unsharded gradients (at least the whole model's
    # gradient, W times a shard) between micro batches; syncing every time keeps none.
    held_last = _at_max(last2).breakdown.communication_bytes
    assert held_last >= 2 * two.gradients_bytes * 0.95
    assert two.communication_bytes < 0.05 * held_last
    assert last2.parallel.gradient_sync == "last"
    assert every2.parallel.gradient_sync == "every"
    assert last2.workload_key != every2.workload_key


@pytest.mark.slow
def test_an_out_of_memory_on_one_rank_is_does_not_fit_for_all_and_the_search_goes_on() -> None:
    profile = profile_distributed(
        "tests.workloads:oom_on_rank_one",
        options={"above": 3},
        device="cpu",
        memory_limit_bytes=64 * MiB,
        world_size=2,
        parallel=Parallel(mode="ddp"),
        headroom=0.05,
        strategy="bisect",
        size_cap=64,
        probe_timeout_s=PROBE_TIMEOUT_S,
    )
    assert profile.max_micro_batch_size == 3
    failed = [p for p in profile.probes if not p.fits]
    assert failed
    assert all(p.oom for p in failed)
    assert {p.micro_batch_size for p in failed} == {4}  # bisect: 1, 2, 4 fails, then 3
    assert profile.probes[-1].micro_batch_size == 3
    assert profile.probes[-1].fits


@pytest.mark.slow
def test_the_dry_run_is_built_while_the_ranks_start_with_the_capacity_they_report(
    ddp_default: tuple[Profile, list[tuple[str, object]]],
) -> None:
    """On the CPU the coordinator builds its dry run before waiting for the ranks (they
    import torch and build the model meanwhile), at the capacity the ranks' budget
    stands for, so the predictions are those made after they answered."""
    profile, events = ddp_default
    assert profile.max_micro_batch_size > 0
    # Once per start of the ranks (a probe that ran out of memory restarts them), the dry
    # run first and only at the first start.
    assert events[:2] == [("dry run", events[1][1]), ("ready", events[1][1])]
    assert [name for name, _ in events].count("dry run") == 1


@pytest.mark.slow
def test_cli_profiles_two_real_ranks_and_prints_world_size_and_parallel_mode() -> None:
    options = [f"-o{k}={v}" for k, v in GPT.items()]
    common = ["profile", "examples.gpt:workload", *options, "--device", "cpu"]
    ddp = run_tuner(*common, "--memory-limit", "8MiB", "--world-size", "2", "--parallel", "ddp",
                    "--json")  # fmt: skip
    assert ddp.returncode == 0, ddp.stderr
    document = json.loads(ddp.stdout)
    assert document["world_size"] == 2
    assert document["parallel"]["mode"] == "ddp"
    assert document["parallel"]["gradient_as_bucket_view"] is True
    assert len(document["probes"][0]["rank_peaks_bytes"]) == 2
    one = run_tuner(*common, "--memory-limit", "8MiB", "--world-size", "2",
                    "--global-batch-size", "64")  # fmt: skip
    assert one.returncode == 0, one.stderr
    assert "measured in one process; for 2 ranks the plan only divides" in " ".join(
        one.stdout.split()
    )


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (["examples.gpt:workload", "--world-size", "100000", "--parallel", "ddp"],
         "is more than this machine's"),
        (["examples.mlp:workload", "--world-size", "2", "--parallel", "fsdp"],
         "does not say how to shard its model"),
        (["examples.mlp:workload", "--world-size", "2", "--parallel", "ddp"],
         "make_batch of"),
        (["examples.gpt:workload", "--parallel", "ddp", "--parallel-option", "gradient_sync=last"],
         "does not apply to ddp"),
    ],
)  # fmt: skip
def test_bad_input_is_one_line_and_exit_2(arguments: list[str], message: str) -> None:
    result = run_tuner("profile", *arguments, "--device", "cpu", "--memory-limit", "256MiB")
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert message in lines[0]
