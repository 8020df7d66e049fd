"""tune_trainer trains the exact global batch: a real transformers Trainer (a tiny GPT-2)
on the CPU under a memory limit, counting the samples of each optimizer step at global
batches with and without good divisors."""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import transformers

from tests.hf.trainers import model, pad, token_samples
from tuner.client import TunerClient
from tuner.train.huggingface import tune_trainer
from tuner.train.integrations import EqualMicroBatchWarning

LIMIT = "16MiB"


class Counted(transformers.Trainer):  # type: ignore[misc]
    """Counts the samples of the micro batches training runs (reset after tuning, whose
    probes call compute_loss too), and the largest."""

    seen = 0
    largest = 0

    def compute_loss(self, model: Any, inputs: Any, *args: Any, **kwargs: Any) -> Any:
        size = len(inputs["input_ids"])
        self.seen += size
        self.largest = max(self.largest, size)
        return super().compute_loss(model, inputs, *args, **kwargs)


class PerStep(transformers.TrainerCallback):  # type: ignore[misc]
    def __init__(self) -> None:
        self.trainer: Counted | None = None
        self.steps: list[int] = []

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        assert self.trainer is not None
        self.steps.append(self.trainer.seen)
        self.trainer.seen = 0


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TunerClient]:
    where = tmp_path_factory.mktemp("trainer-batches")
    with TunerClient(f"sqlite:///{where / 'tuner.db'}", cache_dir=where / "cache") as client:
        yield client


@pytest.mark.slow
@pytest.mark.parametrize("batch", [251, 254, 256])
def test_every_optimizer_step_sees_the_exact_global_batch(
    store: TunerClient, tmp_path: Path, batch: int
) -> None:
    counted = PerStep()
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path),
        use_cpu=True,
        report_to=[],
        max_steps=1,
        save_strategy="no",
        logging_strategy="no",
        disable_tqdm=True,
    )
    hf = Counted(
        model=model(),
        args=args,
        train_dataset=token_samples() * 3,  # 270 samples: one step of 256 and more
        data_collator=pad,
        callbacks=[counted],
    )
    counted.trainer = hf
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", EqualMicroBatchWarning)
        tuned = tune_trainer(hf, global_batch_size=batch, memory_limit=LIMIT, client=store)
    answer = tuned.recommendation
    hf.seen = hf.largest = 0
    hf.train()
    assert counted.steps == [batch]
    assert (args.per_device_train_batch_size, args.gradient_accumulation_steps) == (
        answer.equal.micro_batch_size,
        answer.equal.grad_accum,
    )
    assert hf.largest == answer.equal.micro_batch_size <= answer.max_micro_batch_size
    said = [str(w.message) for w in caught if issubclass(w.category, EqualMicroBatchWarning)]
    assert said == ([answer.equal.warning] if answer.equal.warning else [])
    if batch == 251:  # prime: micro batch 1, never in silence
        assert answer.equal.micro_batch_size == 1
        if not answer.is_equal:  # (unless the timed answer is micro batch 1 itself)
            assert len(said) == 1
