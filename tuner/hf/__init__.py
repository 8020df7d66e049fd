"""Hugging Face ``transformers`` models as workloads: ``tuner profile tuner.hf:causal_lm
-o config=config.json`` (also ``sequence_classification``, ``seq2seq_lm`` and
``image_classification``). Importing this package needs neither transformers nor peft;
building a workload does (the ``hf`` extra)."""

from tuner.hf.workloads import (
    OPTIMIZERS,
    TASKS,
    causal_lm,
    image_classification,
    labelled_tokens,
    load_config,
    optimizer_factory,
    seq2seq_lm,
    sequence_classification,
    shard_blocks,
    target_tokens,
    workload,
)

__all__ = [
    "OPTIMIZERS",
    "TASKS",
    "causal_lm",
    "image_classification",
    "labelled_tokens",
    "load_config",
    "optimizer_factory",
    "seq2seq_lm",
    "sequence_classification",
    "shard_blocks",
    "target_tokens",
    "workload",
]
