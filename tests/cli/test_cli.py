"""The ``tuner profile`` command, run as a real subprocess and in-process through main()."""

from __future__ import annotations

import json
import subprocess
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from tests.helpers import run_tuner, tuner_executable
from tuner.cli import main
from tuner.core.plan import balanced_split, format_split
from tuner.engine.fingerprint import workload_key
from tuner.engine.workload import load_workload

MLP = ["-o", "in_features=32", "-o", "hidden=64", "-o", "layers=2"]
# 250 kB puts M* of this MLP below 100, so a global batch of 100 needs accumulation.
PROFILE = ["profile", "examples.mlp:workload", "--device", "cpu", "--memory-limit", "250KB", *MLP]

# Every subprocess case, run concurrently once per module: each starts a Python that
# imports torch, and one after another they would take most of the suite's time.
CASES: dict[str, list[str]] = {
    "json": [*PROFILE, "--global-batch-size", "100", "--json"],
    "human": [*PROFILE, "--global-batch-size", "100", "--strategy", "bisect"],
    "nothing fits": [*PROFILE[:5], "20KB", "--json"],
    "target does not import": ["profile", "examples.nope:workload", "--device", "cpu",
                               "--memory-limit", "1MiB"],
    "target returns the wrong thing": ["profile", "tests.workloads:not_a_workload",
                                       "--device", "cpu", "--memory-limit", "1MiB"],
    "unparsable memory limit": [*PROFILE[:5], "lots"],
    "zero memory limit": [*PROFILE[:5], "0"],
    "negative memory limit": [*PROFILE[:4], "--memory-limit=-1GiB"],
    "headroom 1.0": [*PROFILE, "--headroom", "1.0"],
    "headroom -0.1": [*PROFILE, "--headroom", "-0.1"],
    "cuda without CUDA": ["profile", "examples.mlp:workload", "--device", "cuda"],
    "batch not divisible by world size": [*PROFILE, "--global-batch-size", "100",
                                          "--world-size", "3"],
    "loss raises": ["profile", "tests.workloads:raising_loss", "--device", "cpu",
                    "--memory-limit", "10MiB"],
}  # fmt: skip


@pytest.fixture(scope="module")
def runs() -> dict[str, subprocess.CompletedProcess[str]]:
    assert tuner_executable().exists(), "the tuner console script is installed with the package"
    with ThreadPoolExecutor(max_workers=4) as pool:
        futures = {name: pool.submit(run_tuner, *args) for name, args in CASES.items()}
        return {name: future.result() for name, future in futures.items()}


@pytest.mark.slow  # the first of these waits for every subprocess
def test_json_output_is_exactly_one_object_with_the_answer(
    runs: dict[str, subprocess.CompletedProcess[str]],
) -> None:
    run = runs["json"]
    assert run.returncode == 0, run.stderr
    assert run.stdout.endswith("\n")
    assert run.stdout.count("\n") == 1  # one line: one object, nothing else on stdout
    document = json.loads(run.stdout)
    assert isinstance(document, dict)
    found = document["max_micro_batch_size"]
    assert 1 < found < 100
    probes = {p["micro_batch_size"]: p for p in document["probes"]}
    for probe in document["probes"]:
        assert {"micro_batch_size", "fits", "peak_bytes", "samples_per_second"} <= set(probe)
    assert probes[found]["fits"]
    assert probes[found]["peak_bytes"] > 0
    assert probes[found]["samples_per_second"] > 0
    assert not probes[found + 1]["fits"]
    # micro batch × accumulation covers the global batch of 100 on one rank.
    assert document["grad_accum"] == -(-100 // found)
    # Balanced by default: the fewest micro batches, sizes within one of each other.
    assert document["micro_batch_size"] == -(-100 // document["grad_accum"])
    assert sum(size * count for size, count in document["recommendation"]["split"]) == 100
    assert document["recommendation"]["policy"] == "balanced"
    # The key is the one this process computes for the same workload.
    options = {"in_features": 32, "hidden": 64, "layers": 2}
    workload = load_workload("examples.mlp:workload", options)
    assert document["workload_key"] == workload_key(workload, workload.build_optimizer())
    assert len(document["device_key"]) == 24
    # Progress goes to stderr, one line per probe.
    assert run.stderr.count("probe ") == len(document["probes"])


@pytest.mark.slow  # the first of these waits for every subprocess
def test_human_output_shows_the_table_and_the_recommendation(
    runs: dict[str, subprocess.CompletedProcess[str]],
) -> None:
    run = runs["human"]
    assert run.returncode == 0, run.stderr
    found = json.loads(runs["json"].stdout)["max_micro_batch_size"]
    for header in ("micro batch", "fits", "peak allocated", "samples/s"):
        assert header in run.stdout
    assert "Probes (bisect search)" in run.stdout
    # Bisect finds the same M* as the model search of the JSON run.
    assert f"largest micro batch that fits: {found}" in run.stdout
    assert "for global batch 100:" in run.stdout
    split = balanced_split(100, found)  # the split of one step
    assert (
        f"micro batch {split[0]} × {len(split)} accumulation step"
        if len(set(split)) == 1
        else format_split(split)
    ) in run.stdout
    assert "why       balanced:" in run.stdout


@pytest.mark.slow  # the first of these waits for every subprocess
def test_nothing_fits_exits_3_with_advice_on_stderr(
    runs: dict[str, subprocess.CompletedProcess[str]],
) -> None:
    run = runs["nothing fits"]
    assert run.returncode == 3, run.stderr
    document = json.loads(run.stdout)
    assert document["max_micro_batch_size"] == 0
    assert "micro_batch_size" not in document  # no recommendation without a fitting size
    assert document["oversize_probe"]["breakdown"]["optimizer_state_bytes"] > 0
    advice = " ".join(run.stderr.split())  # rich wraps the advice at the pipe's width
    assert "Even a micro batch of 1 does not fit" in advice
    for remedy in ("activation checkpointing", "bf16", "optimizer"):
        assert remedy in advice


@pytest.mark.slow
@pytest.mark.parametrize(
    ("case", "says"),
    [
        ("target does not import", "cannot import 'examples.nope'"),
        ("target returns the wrong thing", "returned dict, not a tuner.Workload"),
        ("unparsable memory limit", "cannot read memory size 'lots'"),
        ("zero memory limit", "must be positive"),
        ("negative memory limit", "cannot read memory size '-1GiB'"),
        ("headroom 1.0", "headroom 1.0 is outside [0, 1)"),
        ("headroom -0.1", "headroom -0.1 is outside [0, 1)"),
        ("batch not divisible by world size", "not divisible by world size 3"),
        ("cuda without CUDA", "torch sees no CUDA device"),
    ],
)
def test_bad_input_exits_2_with_one_clear_line(
    runs: dict[str, subprocess.CompletedProcess[str]], case: str, says: str
) -> None:
    if case == "cuda without CUDA" and torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    run = runs[case]
    assert run.returncode == 2, run.stderr
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1, run.stderr
    assert lines[0].startswith("tuner profile: ")
    assert says in lines[0]
    assert run.stdout == ""
    assert "Traceback" not in run.stderr


@pytest.mark.slow  # the first of these waits for every subprocess
def test_workload_error_exits_1_with_the_workloads_traceback(
    runs: dict[str, subprocess.CompletedProcess[str]],
) -> None:
    run = runs["loss raises"]
    assert run.returncode == 1
    assert "WorkloadBug" in run.stderr
    assert "raise_workload_bug" in run.stderr  # the workload's own frame
    assert "label index out of range" in run.stderr
    # The closing message (rich may wrap it at the pipe's width) comes after the traceback.
    tail = " ".join(run.stderr.split()).rpartition("WorkloadBug:")[2]
    assert "raised an error that is not an out-of-memory" in tail
    assert run.stdout == ""


def test_help_lists_the_profile_options() -> None:
    run = run_tuner("profile", "--help")
    assert run.returncode == 0
    for option in ("--memory-limit", "--headroom", "--strategy", "--global-batch-size", "--json"):
        assert option in run.stdout


# In-process: the same entry point, for the paths the subprocesses cannot be measured on.


def test_main_json_in_process(capsys: pytest.CaptureFixture[str]) -> None:
    status = main(
        ["profile", "tests.workloads:tiny", "--device", "cpu", "--memory-limit", "1MiB",
         "--max", "16", "--global-batch-size", "64", "--world-size", "2", "--json"]
    )  # fmt: skip
    out = capsys.readouterr().out
    assert status == 0
    document = json.loads(out)
    assert document["max_micro_batch_size"] == 16
    assert (document["micro_batch_size"], document["grad_accum"]) == (16, 2)
    assert document["recommendation"]["per_rank_batch_size"] == 32


def test_main_human_in_process_says_when_the_cap_bound_the_answer(
    capsys: pytest.CaptureFixture[str],
) -> None:
    status = main(
        ["profile", "tests.workloads:tiny", "--device", "cpu", "--memory-limit", "1MiB",
         "--max", "8", "-o", "width=8"]
    )  # fmt: skip
    out = capsys.readouterr().out
    assert status == 0
    assert "largest micro batch that fits: 8 (the --max cap)" in out
    assert "for global batch" not in out


def test_main_nothing_fits_in_process(capsys: pytest.CaptureFixture[str]) -> None:
    status = main(["profile", "tests.workloads:tiny", "--device", "cpu", "--memory-limit", "1KB"])
    captured = capsys.readouterr()
    assert status == 3
    assert "largest micro batch that fits: 0" in captured.out
    assert "What would help" in captured.err


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["tests.workloads:tiny", "--device", "cpu"], "needs --memory-limit"),
        (["tests.workloads:non_scalar_loss", "--device", "cpu", "--memory-limit", "1MiB"],
         "must return a scalar tensor"),
        ([".mlp:workload", "--device", "cpu", "--memory-limit", "1MiB"],
         "must look like package.module:function"),
        (["tests.workloads:tiny", "--device", "tpu", "--memory-limit", "1MiB"], "unknown device"),
        (["tests.workloads:tiny", "--device", "cpu", "--memory-limit", "1MiB", "-o", "width"],
         "must look like name=value"),
        (["tests.workloads:tiny", "--device", "cpu", "--memory-limit", "1MiB", "-o", "depth=2"],
         "do not fit"),
    ],
)  # fmt: skip
def test_main_bad_input_in_process(
    capsys: pytest.CaptureFixture[str], argv: list[str], says: str
) -> None:
    assert main(["profile", *argv]) == 2
    captured = capsys.readouterr()
    # Progress lines of probes that ran may come first; the error is the one last line.
    last = captured.err.strip().splitlines()[-1]
    assert last.startswith("tuner profile: ")
    assert says in last
    assert "Traceback" not in captured.err
    assert captured.out == ""


def test_main_workload_error_in_process(capsys: pytest.CaptureFixture[str]) -> None:
    status = main(
        ["profile", "tests.workloads:runtime_error_loss", "--device", "cpu", "--memory-limit",
         "1MiB"]
    )  # fmt: skip
    assert status == 1
    err = capsys.readouterr().err
    assert "shapes cannot be multiplied" in err
    assert "not an out-of-memory" in " ".join(err.split())


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--headroom", "1"], "outside [0, 1)"),
        (["--headroom", "abc"], "is not a number"),
        (["--max", "0"], "must be a positive whole number"),
        (["--max", "many"], "is not a whole number"),
        (["--strategy", "greedy"], "invalid choice"),
        (["--memory-limit", "12 parsecs"], "cannot read memory size"),
    ],
)
def test_argument_errors_exit_2_before_anything_runs(
    capsys: pytest.CaptureFixture[str], argv: list[str], says: str
) -> None:
    with pytest.raises(SystemExit) as info:
        main(["profile", "tests.workloads:tiny", "--device", "cpu", *argv])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert says in err
    assert len(err.strip().splitlines()) == 1
