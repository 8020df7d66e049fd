"""The transformers factories as people train: the optimizer (AdamW, Adafactor, SGD with
momentum) and the attention kernel chosen, each measured on a real tiny Llama and keyed
apart; a misspelt option refused in one line that lists the valid ones (exit 2); the peak
located in the model's own layers (``model.layers.0``), so the advice names layers."""

from __future__ import annotations

from pathlib import Path

import pytest

from tuner.cli import main
from tuner.core.results import ProbeResult
from tuner.engine.backends import CpuBackend
from tuner.engine.fingerprint import workload_key
from tuner.engine.probe import Prober
from tuner.engine.profiler import nothing_fits_advice, peak_advice
from tuner.engine.workload import Workload, load_workload
from tuner.hf import OPTIMIZERS, causal_lm

LLAMA = str(Path(__file__).parents[1] / "data" / "tiny_llama.json")
MiB = 2**20


def probe(workload: Workload, size: int = 2) -> tuple[ProbeResult, str]:
    backend = CpuBackend(64 * MiB)
    with backend.session(), Prober(workload, backend, locate=True) as prober:
        return prober(size), workload_key(workload, prober.optimizer)


def test_each_optimizer_keeps_the_state_it_is_known_for() -> None:
    measured = {
        name: probe(causal_lm(config=LLAMA, seq_len=16, optimizer=name)) for name in OPTIMIZERS
    }
    state = {}
    for name, (result, _) in measured.items():
        assert result.breakdown is not None
        state[name] = result.breakdown.optimizer_state_bytes
        parameters = result.breakdown.parameters_bytes
    # AdamW: two moments a weight (and a step count a tensor); SGD's momentum: one buffer
    # a weight; Adafactor: a row and a column a matrix, a few percent of the weights.
    assert 2 * parameters <= state["adamw"] < 2.05 * parameters
    assert state["sgd"] == parameters
    assert 0 < state["adafactor"] < 0.05 * parameters
    assert len({key for _, key in measured.values()}) == 3  # three workloads, three keys


def test_the_attention_kernel_changes_what_forward_saves_and_the_key() -> None:
    eager, eager_key = probe(causal_lm(config=LLAMA, seq_len=32, attn_implementation="eager"))
    sdpa, sdpa_key = probe(causal_lm(config=LLAMA, seq_len=32, attn_implementation="sdpa"))
    assert eager.breakdown is not None
    assert sdpa.breakdown is not None
    # Eager attention keeps its probabilities (batch × heads × length²) for backward.
    assert eager.breakdown.activations_bytes > sdpa.breakdown.activations_bytes
    assert eager_key != sdpa_key
    assert causal_lm(config=LLAMA, seq_len=32, attn_implementation="eager").name.endswith("-eager")


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["-o", "seqlen=64"], "'seqlen' is not an option of it (did you mean seq_len?)"),
        (["-o", "optimizer=adam"], "unknown optimizer 'adam': use one of adamw, adafactor, sgd"),
        (["-o", "attn_implementation=magic"], "attn_implementation='magic': "),
    ],
    ids=["misspelt", "unknown-optimizer", "unknown-attention"],
)
def test_bad_options_are_one_line_and_exit_2(
    capsys: pytest.CaptureFixture[str], options: list[str], message: str
) -> None:
    argv = ["profile", "tuner.hf:causal_lm", "-o", f"config={LLAMA}", *options]
    assert main([*argv, "--device", "cpu", "--memory-limit", "64MiB"]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert message in line
    if "seqlen" in message:
        assert "its options are config, model, seq_len, precision" in line
        assert "optimizer, attn_implementation" in line


def test_the_peak_is_located_in_the_models_own_layers() -> None:
    workload = load_workload("tuner.hf:causal_lm", {"config": LLAMA, "seq_len": 64})
    result, _ = probe(workload, 4)
    assert result.breakdown is not None
    by_block = result.breakdown.activations_by_block_bytes
    assert {"model.embed_tokens", "model.layers.0", "model.layers.1", "lm_head"} <= set(by_block)
    # The layers save alike (the first also the position tables the others reuse).
    assert by_block["model.layers.0"] == pytest.approx(by_block["model.layers.1"], rel=0.01)
    assert by_block["model.layers.1"] > 0
    (advice,) = peak_advice(result, workload)
    assert "activation checkpointing of model.layers.0, model.layers.1" in advice


def test_the_advice_says_the_factory_takes_another_optimizer() -> None:
    workload = load_workload("tuner.hf:causal_lm", {"config": LLAMA, "seq_len": 64})
    backend = CpuBackend(MiB // 4)  # less than the weights and their AdamW state
    with backend.session(), Prober(workload, backend, locate=True) as prober:
        oversize = prober(1, enforce_capacity=False)
    from tuner.core.results import Profile

    profile = Profile.model_construct(
        max_micro_batch_size=0,
        probes=[oversize],
        oversize_probe=oversize,
        budget_bytes=int(0.95 * backend.capacity_bytes),
        headroom=0.05,
        device=backend.describe(),
    )
    advice = nothing_fits_advice(profile, workload)
    assert "a lighter optimizer" in advice
    assert "tuner.hf:causal_lm takes -o optimizer=..." in advice
