"""``tuner profile --explore`` and the peak's location, through the real command."""

from __future__ import annotations

import json

import pytest

from tests.helpers import run_tuner

TARGET = "tests.variant_workloads:stack"
# Its peaks at one sample: 1,671,096 B as loaded, about 1,157,000 B checkpointed or in bf16,
# 888,184 B both (1,375,736 B at two samples): only both fit one sample under 1,000,000 B.
HEAVY, HEAVY_LIMIT = "tests.variant_workloads:activations_heavy", "1000000"
SMALL_GPT = (
    "-o",
    "vocab=64",
    "-o",
    "seq_len=16",
    "-o",
    "dim=16",
    "-o",
    "heads=2",
    "-o",
    "layers=2",
)


@pytest.mark.slow
def test_memory_short_explores_by_itself_and_says_so() -> None:
    done = run_tuner(
        "profile", TARGET, "--device", "cpu", "--memory-limit", "460000",
        "--global-batch-size", "12",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "M* = 3 < 4: exploring the variants stack-3x32 declares" in done.stderr
    assert "--no-explore skips this" in done.stderr
    out = done.stdout
    assert "Variants (measured)" in out
    assert out.count("chosen") == 1
    assert "variant: " in out
    assert "= global batch 12" in out
    # Where the peak is, and what would lower it.
    assert "Saved for backward at micro batch 3, peak in backward" in out
    assert "blocks.0" in out
    assert "activation checkpointing of blocks.0" in " ".join(out.split())


@pytest.mark.slow
def test_nothing_fitting_explores_and_a_variant_that_fits_is_the_answer() -> None:
    done = run_tuner(
        "profile", HEAVY, "--device", "cpu", "--memory-limit", HEAVY_LIMIT,
        "--global-batch-size", "4",
    )  # fmt: skip
    # Only checkpointing with bf16 fits one sample here: that variant is the answer.
    assert done.returncode == 0, done.stderr
    assert "nothing fits: exploring the variants" in done.stderr
    assert "largest micro batch that fits: 0" in done.stdout
    assert "variant: checkpointing=true precision=bf16" in done.stdout
    assert "the variant as loaded does not" in " ".join(done.stdout.split())
    assert "micro batch 1 × 4 accumulation steps = global batch 4" in done.stdout


@pytest.mark.slow
def test_no_explore_keeps_to_the_workload_as_loaded() -> None:
    done = run_tuner(
        "profile", TARGET, "--device", "cpu", "--memory-limit", "460000", "--no-explore",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "exploring" not in done.stderr
    assert "Variants" not in done.stdout


@pytest.mark.slow
def test_explore_json_on_the_gpt_example_picks_the_fastest_and_keeps_b_exact() -> None:
    done = run_tuner(
        "profile", "examples.gpt:workload", *SMALL_GPT, "--device", "cpu",
        "--memory-limit", "1500000", "--global-batch-size", "32", "--explore", "--json",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    document = json.loads(done.stdout)
    variants = document["variants"]
    assert [v["variant"] for v in variants] == [
        {"checkpointing": False, "precision": "fp32"},
        {"checkpointing": False, "precision": "bf16"},
        {"checkpointing": True, "precision": "fp32"},
        {"checkpointing": True, "precision": "bf16"},
    ]
    assert len({v["variant_group"] for v in variants}) == 1
    assert document["variant_group"] == variants[0]["variant_group"]
    (chosen,) = [v for v in variants if v["chosen"]]
    # The fastest when it beats the variant as loaded by more than their timed spread,
    # else the variant as loaded; every speed carries its spread.
    fastest = max(variants, key=lambda v: v["samples_per_second"])
    loaded = variants[0]
    assert chosen in (fastest, loaded)
    gain = fastest["samples_per_second"] / loaded["samples_per_second"] - 1
    spread = max(fastest["samples_per_second_spread"], loaded["samples_per_second_spread"])
    assert (chosen == fastest) == (gain > spread or fastest == loaded)
    for variant in variants:
        plan = variant["recommendation"]
        assert sum(size * count for size, count in plan["split"]) == 32  # runs [size, count]
        assert max(size for size, _ in plan["split"]) <= variant["max_micro_batch_size"]
    assert document["recommendation"] == chosen["recommendation"]
    at_max = [
        p for p in document["probes"] if p["micro_batch_size"] == document["max_micro_batch_size"]
    ]
    blocks = at_max[-1]["breakdown"]["activations_by_block_bytes"]
    assert blocks["blocks.0"] > 0


@pytest.mark.slow
def test_explore_without_declared_variants_is_refused_before_probing() -> None:
    done = run_tuner(
        "profile", "tests.workloads:tiny", "--device", "cpu", "--memory-limit", "1MiB",
        "--explore",
    )  # fmt: skip
    assert done.returncode == 2
    assert done.stderr.strip().count("\n") == 0
    assert "declares no variants to explore" in done.stderr
    assert "probe" not in done.stderr
