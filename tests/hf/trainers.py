"""A real transformers ``Trainer`` over variable-length token sequences, for
``tune_trainer``'s tests: a tiny causal LM built from a config (no downloads), a dataset
of short samples with one far longer, and the collator that pads them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
import transformers

CONFIG = Path(__file__).parents[1] / "data" / "tiny_gpt2.json"
VOCAB = 128
SAMPLES, LONGEST_AT, LONGEST = 90, 41, 120
IGNORE = -100


def token_samples() -> list[dict[str, Any]]:
    """Lengths 4..19, but sample 41 is 120 tokens long; a ``note`` column the model's
    forward does not take, which the Trainer removes."""
    generator = torch.Generator().manual_seed(0)
    samples = []
    for index in range(SAMPLES):
        length = LONGEST if index == LONGEST_AT else 4 + index % 16
        ids = torch.randint(3, VOCAB, (length,), generator=generator).tolist()
        samples.append({"input_ids": ids, "note": f"sample {index}"})
    return samples


def pad(samples: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
    """Right-pad to the longest of the batch; padding is masked and is no target."""
    longest = max(len(s["input_ids"]) for s in samples)
    ids = torch.zeros(len(samples), longest, dtype=torch.long)
    mask = torch.zeros(len(samples), longest, dtype=torch.long)
    labels = torch.full((len(samples), longest), IGNORE, dtype=torch.long)
    for row, sample in enumerate(samples):
        tokens = torch.tensor(sample["input_ids"])
        ids[row, : len(tokens)] = tokens
        mask[row, : len(tokens)] = 1
        labels[row, : len(tokens)] = tokens
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


def model() -> Any:
    torch.manual_seed(0)
    data = json.loads(CONFIG.read_text())
    config = transformers.AutoConfig.for_model(data.pop("model_type"), **data)
    return transformers.AutoModelForCausalLM.from_config(config)  # type: ignore[no-untyped-call]


def trainer(tmp: Path, **arguments: Any) -> Any:
    args = transformers.TrainingArguments(
        output_dir=str(tmp),
        use_cpu=True,
        report_to=[],
        max_steps=1,
        save_strategy="no",
        logging_strategy="no",
        disable_tqdm=True,
        **arguments,
    )
    return transformers.Trainer(
        model=model(), args=args, train_dataset=token_samples(), data_collator=pad
    )
