"""Hugging Face ``transformers`` models as workloads: ``tuner profile tuner.hf:causal_lm
-o config=config.json``. Importing this package needs neither transformers nor peft;
building a workload does (the ``hf`` extra)."""

from tuner.hf.workloads import (
    TASKS,
    causal_lm,
    load_config,
    sequence_classification,
    target_tokens,
    workload,
)

__all__ = [
    "TASKS",
    "causal_lm",
    "load_config",
    "sequence_classification",
    "target_tokens",
    "workload",
]
