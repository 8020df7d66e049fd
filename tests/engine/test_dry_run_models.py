"""The dry run on transformers models, each at the smallest config that shows what made its
prediction differ from the real probe: it now predicts the probe within the few bytes its
tracker (a dispatch mode, which sees operators' outputs) cannot see, scalars operators
make for themselves (12 to 16 B), counted in the probe's plain step by the allocator.
Where it cannot run at all, one line says what it could not run."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest

from tests.engine.test_dry_run import gru_workload
from tuner.engine.backends import CpuBackend
from tuner.engine.dry_run import DryRun, dry_run_of_target
from tuner.engine.probe import Prober
from tuner.engine.workload import load_workload

pytest.importorskip("transformers")

from tuner.hf import workload

TEXT = {"vocab_size": 64, "hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1,
        "num_attention_heads": 2, "max_position_embeddings": 64}  # fmt: skip
MBART = {"model_type": "mbart", "vocab_size": 64, "d_model": 16, "encoder_layers": 1,
         "decoder_layers": 1, "encoder_attention_heads": 2, "decoder_attention_heads": 2,
         "encoder_ffn_dim": 32, "decoder_ffn_dim": 32, "max_position_embeddings": 64}  # fmt: skip
SWIN = {"model_type": "swin", "image_size": 16, "patch_size": 4, "embed_dim": 8,
        "depths": [1, 1], "num_heads": [1, 1], "window_size": 2}  # fmt: skip

# model -> (task, config): each the smallest that showed the difference.
CASES: dict[str, tuple[str, dict[str, Any]]] = {
    # transformers skips an all-ones attention mask (SDPA's causal kernel) only where it can
    # read the mask: on fake tensors it built the mask, +24,576 B a sample on Gemma.
    "llama": ("causal-lm", {"model_type": "llama", **TEXT}),
    # mBART's decoder makes its all-ones mask itself (torch.ones) before checking it.
    "mbart": ("seq2seq-lm", MBART),
    # DeBERTa-v2's loss picks the labelled rows with nonzero: no fake tensor can answer it.
    "deberta-v2": ("sequence-classification", {"model_type": "deberta-v2", **TEXT}),
    # layer_norm_backward's CPU kernel returns a contiguous gradient, the fake one kept
    # the transposed layout of Swin's windows, and a later reshape copied.
    "swin": ("image-classification", SWIN),
}


@pytest.mark.slow
@pytest.mark.parametrize("model", list(CASES))
def test_the_dry_run_predicts_transformers_models_within_what_it_cannot_see(model: str) -> None:
    task, config = CASES[model]
    seq_len = None if task == "image-classification" else 8
    loaded = workload(task=task, config=config, seq_len=seq_len)
    backend = CpuBackend(2**40)
    with Prober(loaded, backend) as prober, DryRun(loaded, backend, headroom=0.05) as dry:
        for size in (1, 3):
            measured = prober(size, enforce_capacity=False)
            predicted = dry(size)
            assert predicted is not None, (model, size)
            unseen = {
                phase: peak - predicted.phase_peaks_bytes[phase]
                for phase, peak in measured.phase_peaks_bytes.items()
            }
            assert all(0 <= b <= 64 for b in unseen.values()), (model, size, unseen)


def test_a_dry_run_that_cannot_run_says_so_in_one_line(caplog: pytest.LogCaptureFixture) -> None:
    unrunnable = gru_workload(item_in_loss=True)
    with (
        caplog.at_level(logging.WARNING, logger="tuner.engine.dry_run"),
        DryRun(unrunnable, CpuBackend(2**30), headroom=0.05) as dry,
    ):
        assert dry(2) is None
        assert dry(3) is None  # said once, not again for every size
    lines = [record.getMessage() for record in caplog.records]
    assert len(lines) == 1, lines
    assert "\n" not in lines[0]
    assert lines[0].startswith("dry run of tiny-gru stopped at micro batch 2: ")
    assert "aten._local_scalar_dense" in lines[0]
    assert lines[0].endswith("the search goes on without predictions")


VIT = {"model_type": "vit", "image_size": 16, "patch_size": 4, "hidden_size": 16,
       "intermediate_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2}  # fmt: skip
CONVNEXT = {"model_type": "convnext", "image_size": 16, "hidden_sizes": [8, 16],
            "depths": [1, 1], "num_stages": 2, "drop_path_rate": 0.1}  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize("config", [VIT, CONVNEXT], ids=["vit", "convnext"])
def test_a_coordinator_builds_models_that_read_values_while_built(
    config: dict[str, Any], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The ranks' coordinator builds the model on fake tensors. ViT's initialiser samples
    until ``mask.any()`` is false and ConvNeXt reads its drop-path rates with ``tolist()``:
    both stopped its dry run, and their searches on two ranks took 6 and 7 probes. Built,
    the prediction is one process's to the byte (the drop-path rates were real)."""
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    options = {"config": str(path)}
    with caplog.at_level(logging.WARNING, logger="tuner.engine.dry_run"):
        coordinators = dry_run_of_target(
            "tuner.hf:image_classification", options, capacity_bytes=2**40, headroom=0.05
        )
    assert caplog.records == []
    loaded = load_workload("tuner.hf:image_classification", options)
    with coordinators, DryRun(loaded, CpuBackend(2**40), headroom=0.05) as one_process:
        for size in (1, 3):
            predicted = coordinators(size)
            assert predicted is not None, size
            expected = one_process(size)
            assert expected is not None
            assert predicted.phase_peaks_bytes == expected.phase_peaks_bytes, size
