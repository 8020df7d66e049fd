"""What a worker may run (its owner's ``--allow`` patterns), what a job's code inherits
from the worker's environment, and what a failed job's readers may see."""

from __future__ import annotations

import re

import pytest

from tuner.core.errors import BadInputError
from tuner.worker.allow import AllowList
from tuner.worker.profile_run import (
    REASON_MAX_CHARS,
    passable_names,
    profile_environment,
    public_reason,
)


@pytest.mark.parametrize(
    ("pattern", "target", "allowed"),
    [
        # A module prefix: the package and what is under it, not a longer name.
        ("examples", "examples:workload", True),
        ("examples", "examples.gpt:workload", True),
        ("examples", "examples.gpt.blocks:workload", True),
        ("examples", "examples_evil:workload", False),
        ("examples", "examplesx.gpt:workload", False),
        ("examples.gpt", "examples.mlp:workload", False),
        ("examples", "os:system", False),
        # A glob on the module.
        ("examples.*", "examples.gpt:workload", True),
        ("examples.*", "examples:workload", False),
        ("team_?.models", "team_a.models:workload", True),
        ("team_?.models", "team_ab.models:workload", False),
        ("Examples", "examples:workload", False),  # imports are case-sensitive
        # With a colon: the whole target.
        ("examples.gpt:workload", "examples.gpt:workload", True),
        ("examples.gpt:workload", "examples.gpt:other", False),
        ("examples.*:workload", "examples.mlp:workload", True),
        # Everything, when the owner says so.
        ("*", "os:system", True),
        # A target of any other shape is never allowed, whatever the pattern.
        ("*", "--upload:x", False),
        ("*", "examples.gpt", False),
        ("*", ".relative:workload", False),
    ],
)
def test_a_target_is_allowed_only_by_a_pattern_that_matches_it(
    pattern: str, target: str, allowed: bool
) -> None:
    assert AllowList.parse([pattern]).allows(target) is allowed


def test_patterns_come_repeated_or_comma_separated() -> None:
    allow = AllowList.parse(["examples, mypkg.models", "tests.job_workloads"])
    assert allow.patterns == ("examples", "mypkg.models", "tests.job_workloads")
    assert allow.allows("mypkg.models.big:workload")
    assert not AllowList.parse([]).allows("examples:workload")


@pytest.mark.parametrize("pattern", ["examples/gpt", "a b", "os;rm", "a:b:c", "$(id)"])
def test_a_pattern_that_can_match_no_target_is_refused(pattern: str) -> None:
    says = re.escape(f"--allow {pattern!r} is not a module prefix or glob")
    with pytest.raises(BadInputError, match=says):
        AllowList.parse([pattern])


def test_a_refusal_is_one_line_that_names_the_target_and_the_flag() -> None:
    refusal = AllowList.parse(["examples", "mypkg"]).refusal("os:system", worker="gpu-1")
    assert refusal == (
        "target 'os:system' is not allowed on worker 'gpu-1', which runs only examples, "
        "mypkg: its owner may allow it with `tuner worker --allow PATTERN`"
    )


def test_a_profile_inherits_what_it_needs_and_no_credential() -> None:
    worker = {
        "PATH": "/usr/bin",
        "HOME": "/home/tuner",
        "PYTHONPATH": "/src",
        "LC_ALL": "C.UTF-8",
        "CUDA_VISIBLE_DEVICES": "0,1",
        "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True",
        "NCCL_DEBUG": "WARN",
        "OMP_NUM_THREADS": "1",
        "TUNER_TOKEN": "secret-token",
        "TUNER_URL": "http://tuner:8000",
        "TUNER_DATABASE_URL": "postgresql://tuner:pw@db/tuner",
        "HF_TOKEN": "hf_secret",
        "AWS_SECRET_ACCESS_KEY": "aws-secret",
        "SSH_AUTH_SOCK": "/tmp/agent",
        "LD_PRELOAD": "/tmp/hook.so",
    }
    assert profile_environment(worker) == {
        name: worker[name]
        for name in (
            "PATH",
            "HOME",
            "PYTHONPATH",
            "LC_ALL",
            "CUDA_VISIBLE_DEVICES",
            "PYTORCH_CUDA_ALLOC_CONF",
            "NCCL_DEBUG",
            "OMP_NUM_THREADS",
        )
    }


def test_the_owner_may_pass_more_variables_but_none_of_the_workers_own() -> None:
    worker = {"PATH": "/usr/bin", "HF_TOKEN": "hf_secret", "DATA_DIR": "/data", "X": "y"}
    names = passable_names(["HF_TOKEN, DATA_DIR"])
    assert names == ("HF_TOKEN", "DATA_DIR")
    assert profile_environment(worker, also=names) == {
        "PATH": "/usr/bin",
        "HF_TOKEN": "hf_secret",
        "DATA_DIR": "/data",
    }
    for name in ("TUNER_TOKEN", "tuner_url", "A-B", "1X"):
        with pytest.raises(BadInputError, match=f"--pass-env {name!r} must name"):
            passable_names([name])


def test_a_reason_never_shows_the_token_and_is_bounded() -> None:
    token = "t0ken-" + "x" * 40
    short = public_reason(f"exited 1\nRuntimeError: {token}", secrets=[token, None])
    assert short == "exited 1\nRuntimeError: [redacted]"
    flood = "tuner profile exited 1: the workload raised\n" + "y" * 1_000_000 + f"\nEnd {token}"
    bounded = public_reason(flood, secrets=[token])
    assert len(bounded) <= REASON_MAX_CHARS
    assert token not in bounded
    assert bounded.startswith("tuner profile exited 1: the workload raised\n[... ")
    assert bounded.endswith("\nEnd [redacted]")
    cut = int(bounded.splitlines()[1].split()[1])  # "[... N characters cut ...]"
    assert cut > 990_000
