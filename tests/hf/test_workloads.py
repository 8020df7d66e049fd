"""Hugging Face models as workloads, built from small config files (2 layers, width 64):
one command profiles them on the CPU, and the answer trains with the accumulator and
with the Hugging Face Trainer. Nothing is downloaded."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from tuner.core.errors import WorkloadError
from tuner.core.extras import MissingExtraError
from tuner.core.plan import Recommendation
from tuner.engine.workload import load_workload
from tuner.hf import causal_lm, sequence_classification, target_tokens, workload
from tuner.train.accumulate import Accumulator
from tuner.train.integrations import EqualMicroBatchWarning, apply_to_training_arguments

DATA = Path(__file__).resolve().parent.parent / "data"
LLAMA = str(DATA / "tiny_llama.json")
GPT2 = str(DATA / "tiny_gpt2.json")
REPO = DATA.parent.parent


@pytest.fixture(scope="module")
def profiled() -> dict:
    """``tuner profile`` on a causal LM from its config file, as a user runs it."""
    command = [
        sys.executable, "-m", "tuner.cli", "profile", "tuner.hf:causal_lm",
        "-o", f"config={LLAMA}", "-o", "seq_len=32",
        "--device", "cpu", "--memory-limit", "4MiB", "--global-batch-size", "16", "--json",
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=REPO)
    assert done.returncode == 0, done.stderr
    document: dict = json.loads(done.stdout)
    return document


@pytest.mark.slow
def test_one_command_profiles_a_transformers_model_from_its_config(profiled) -> None:
    assert profiled["workload"]["name"] == "hf-llama-causal-lm-2l64d-32"
    found = profiled["max_micro_batch_size"]
    assert 2 <= found < 16  # small enough that the batch of 16 must accumulate
    fits = {p["micro_batch_size"]: p["fits"] for p in profiled["probes"]}
    assert fits[found] is True
    assert fits.get(found + 1) is not True
    plan = Recommendation.model_validate(profiled["recommendation"])
    assert sum(plan.flat_split()) == 16
    assert max(plan.flat_split()) <= found


@pytest.mark.slow
def test_its_recommendation_trains_with_the_accumulator(profiled) -> None:
    plan = Recommendation.model_validate(profiled["recommendation"])
    model_workload = causal_lm(config=LLAMA, seq_len=32)
    accumulator = Accumulator.for_workload(
        model_workload, plan.micro_batch_size, split=plan.flat_split()
    )
    losses = []
    for step in range(3):
        torch.manual_seed(step)
        report = accumulator.step(model_workload.make_batch(16))
        assert report.split == plan.flat_split()
        losses.append(report.loss)
    assert all(torch.isfinite(torch.tensor(losses)))
    assert report.units == 16 * 31  # every target token after the shift


@pytest.mark.slow
def test_its_recommendation_trains_with_the_hugging_face_trainer(profiled, tmp_path) -> None:
    transformers = pytest.importorskip("transformers")
    plan = Recommendation.model_validate(profiled["recommendation"])
    model_workload = causal_lm(config=LLAMA, seq_len=32)
    batch = model_workload.make_batch(32)
    samples = [{key: value[i] for key, value in batch.items()} for i in range(32)]
    arguments = transformers.TrainingArguments(
        output_dir=str(tmp_path), use_cpu=True, report_to=[], max_steps=2, save_strategy="no"
    )
    with warnings.catch_warnings():
        # Whether equal micro batches cost speed here depends on timings of a busy CPU.
        warnings.simplefilter("ignore", EqualMicroBatchWarning)
        arguments = apply_to_training_arguments(arguments, plan)
    micro, steps = arguments.per_device_train_batch_size, arguments.gradient_accumulation_steps
    assert micro * steps == 16
    assert micro <= plan.max_micro_batch_size
    trainer = transformers.Trainer(
        model=model_workload.model, args=arguments, train_dataset=samples
    )
    result = trainer.train()
    assert result.global_step == 2


def test_the_loss_units_are_the_targets_after_the_shift() -> None:
    model_workload = causal_lm(config=LLAMA, seq_len=16)
    torch.manual_seed(0)
    batch = model_workload.make_batch(3)
    batch["labels"][0, 8:] = -100  # padding at the end of the first sample
    batch["labels"][1, 0] = -100  # ignored first position: never a target anyway
    assert target_tokens(batch) == 15 + 7 + 15 + 0
    with torch.no_grad():
        loss = model_workload.loss_fn(model_workload.model, batch)
        logits = model_workload.model(input_ids=batch["input_ids"]).logits
    by_hand = F.cross_entropy(
        logits[:, :-1].flatten(0, 1), batch["labels"][:, 1:].flatten(), ignore_index=-100,
        reduction="sum",
    )  # fmt: skip
    torch.testing.assert_close(loss, by_hand / target_tokens(batch))


def test_accumulated_gradients_equal_the_full_batch_with_padding() -> None:
    model_workload = causal_lm(config=LLAMA, seq_len=16)
    torch.manual_seed(1)
    batch = model_workload.make_batch(5)
    batch["labels"][2, 4:] = -100
    batch["labels"][4, :] = -100  # a sample with no targets at all
    reference = copy.deepcopy(model_workload.model)
    model_workload.loss_fn(reference, batch).backward()
    model = model_workload.model
    accumulator = Accumulator(
        model, torch.optim.SGD(model.parameters(), lr=0.0), 2, model_workload.loss_fn,
        model_workload.loss_units, split=[2, 2, 1],
    )  # fmt: skip
    accumulator.step(batch)
    for got, want in zip(model.parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(got.grad, want.grad, rtol=1e-4, atol=1e-6)


def test_a_sequence_classifier_from_the_command_line_target() -> None:
    model_workload = load_workload(
        "tuner.hf:sequence_classification", {"config": GPT2, "seq_len": 16, "num_labels": 3}
    )
    assert model_workload.name == "hf-gpt2-sequence-classification-2l64d-16"
    assert model_workload.loss_units is None  # per sample
    report = Accumulator.for_workload(model_workload, 2).step(model_workload.make_batch(5))
    assert report.units == 5
    assert report.split == [2, 2, 1]


def test_checkpointing_and_lora_change_what_is_trained() -> None:
    pytest.importorskip("peft")
    plain = causal_lm(config=LLAMA, seq_len=16)
    adapted = causal_lm(config=LLAMA, seq_len=16, lora=4, checkpointing=True)
    assert adapted.activation_checkpointing
    assert adapted.name.endswith("-lora4")
    trainable = sum(p.numel() for p in adapted.model.parameters() if p.requires_grad)
    everything = sum(p.numel() for p in plain.model.parameters())
    assert 0 < trainable < everything / 10
    optimizer = adapted.build_optimizer()
    assert sum(p.numel() for g in optimizer.param_groups for p in g["params"]) == trainable
    report = Accumulator.for_workload(adapted, 2).step(adapted.make_batch(4))
    assert torch.isfinite(torch.tensor(report.loss))


@pytest.mark.slow
def test_a_model_instance_from_python_and_compiled() -> None:
    model = causal_lm(config=LLAMA, seq_len=16).model
    from_instance = workload(model=model, seq_len=16)
    assert from_instance.model is model
    compiled = workload(model=model, seq_len=16, compile=True)
    assert isinstance(compiled.model, torch._dynamo.eval_frame.OptimizedModule)
    assert compiled.model._orig_mod is model  # compiled lazily: the first step compiles


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"config": str(DATA / "missing.json")}, "does not load as a transformers config"),
        ({"config": {"vocab_size": 8}}, "no model_type"),
        ({"config": LLAMA, "task": "translation"}, "unknown task 'translation': use one of"),
        ({"config": LLAMA, "seq_len": 1024}, r"above the model's maximum positions \(256\)"),
        ({}, "say which model"),
        ({"config": LLAMA, "precision": "fp8"}, "unknown precision"),
    ],
)
def test_bad_input_is_one_clear_line(options, message) -> None:
    with pytest.raises(WorkloadError, match=message) as caught:
        workload(**options)
    assert "\n" not in str(caught.value)


def test_without_transformers_it_says_which_extra_to_install(monkeypatch) -> None:
    # transformers is installed here; hiding it from the import system is the only way to
    # see what a user without it sees.
    monkeypatch.setitem(sys.modules, "transformers", None)
    with pytest.raises(MissingExtraError, match=r"pip install -e '\.\[hf\]'"):
        sequence_classification(config=GPT2)
