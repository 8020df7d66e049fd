"""Workloads for Hugging Face ``transformers`` models, built from a config: no downloads.

    tuner profile tuner.hf:causal_lm -o config=path/to/config.json -o seq_len=2048 \\
        -o precision=bf16 -o checkpointing=true

The model is built with random weights from its config (``AutoModelFor….from_config``),
so a profile needs the architecture, never the weights; or pass a model instance from
Python (``causal_lm(model=my_model, seq_len=1024)``). Batches are the worst case for
memory: every sequence ``seq_len`` tokens long.

Losses follow the accumulator's rules (:mod:`tuner.train.accumulate`): a causal LM's
loss is the model's own (the mean over target tokens after the shift, ``-100`` ignored)
and ``loss_units`` counts exactly those targets, ``labels[:, 1:] != -100``; a
classifier's loss is the mean over samples.

``transformers`` is an optional extra (``pip install 'microbatch-tuner[hf]'``), and so
is ``peft`` for LoRA adapters (``-o lora=8``): frozen base weights have no gradients and
no optimizer state, which changes memory a lot.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Literal, get_args

import torch
from torch import nn

from tuner.core.errors import WorkloadError
from tuner.engine.workload import PRECISIONS, Workload

Task = Literal["causal-lm", "sequence-classification"]
TASKS: tuple[str, ...] = get_args(Task)
IGNORE_INDEX = -100
Batch = dict[str, torch.Tensor]


def workload(
    *,
    task: str = "causal-lm",
    config: str | Mapping[str, Any] | None = None,
    model: nn.Module | None = None,
    seq_len: int = 512,
    precision: str = "fp32",
    checkpointing: bool = False,
    compile: bool = False,
    lora: int = 0,
    lr: float = 1e-4,
    num_labels: int = 2,
) -> Workload:
    """A ``transformers`` model as a workload, for ``task`` (``causal-lm`` or
    ``sequence-classification``). Give ``config`` (a ``config.json`` file, a folder
    holding one, or a dict with ``model_type``) or a ``model`` instance."""
    transformers = _transformers()
    if task not in TASKS:
        raise WorkloadError(f"unknown task {task!r}: use one of {', '.join(TASKS)}")
    if precision not in PRECISIONS:
        raise WorkloadError(f"unknown precision {precision!r}: use one of {', '.join(PRECISIONS)}")
    if model is None:
        loaded = load_config(config, transformers)
        if task == "sequence-classification":
            loaded.num_labels = num_labels
            if loaded.pad_token_id is None:
                loaded.pad_token_id = 0  # sequence classifiers find each sample's last token
        torch.manual_seed(0)
        auto = (
            transformers.AutoModelForCausalLM
            if task == "causal-lm"
            else transformers.AutoModelForSequenceClassification
        )
        model = auto.from_config(loaded)
    elif config is not None:
        raise WorkloadError("give config or model, not both")
    if not isinstance(model, nn.Module) or not hasattr(model, "config"):
        raise WorkloadError(
            f"model must be a transformers PreTrainedModel, got {type(model).__name__}"
        )
    model_config: Any = model.config
    _check_length(seq_len, model_config)
    if checkpointing:
        _enable_checkpointing(model)
        model_config.use_cache = False
    if lora:
        model = _with_lora(model, lora)
    trained = model
    if compile:
        with warnings.catch_warnings():
            # Importing inductor the first time trips a deprecation inside torch itself.
            warnings.simplefilter("ignore", DeprecationWarning)
            trained = torch.compile(model)  # type: ignore[assignment]
    vocab = int(model_config.vocab_size)
    make_batch = (
        _causal_batches(vocab, seq_len)
        if task == "causal-lm"
        else _class_batches(vocab, seq_len, num_labels)
    )
    return Workload(
        name=_name(model_config, task, seq_len, lora),
        model=trained,
        optimizer=lambda params: torch.optim.AdamW([p for p in params if p.requires_grad], lr=lr),
        make_batch=make_batch,
        loss_fn=_model_loss,
        loss_units=target_tokens if task == "causal-lm" else None,
        precision=precision,  # type: ignore[arg-type]
        activation_checkpointing=checkpointing,
        variants={"checkpointing": [False, True]},
    )


def causal_lm(**options: Any) -> Workload:
    """A causal language model (``AutoModelForCausalLM``): next-token loss over targets."""
    return workload(task="causal-lm", **options)


def sequence_classification(**options: Any) -> Workload:
    """A sequence classifier (``AutoModelForSequenceClassification``): loss per sample."""
    return workload(task="sequence-classification", **options)


def target_tokens(batch: Batch) -> int:
    """The tokens a causal LM's loss averages over: labels after the shift, not -100."""
    return int((batch["labels"][:, 1:] != IGNORE_INDEX).sum())


def load_config(config: str | Mapping[str, Any] | None, transformers: Any) -> Any:
    """A ``PretrainedConfig`` from a file, a folder or a dict, never from the network."""
    if config is None:
        raise WorkloadError(
            "say which model: -o config=path/to/config.json (a transformers config), or "
            "pass model=... from Python"
        )
    try:
        if isinstance(config, Mapping):
            data = dict(config)
        else:
            path = Path(config)
            if path.is_dir():
                path = path / "config.json"
            data = json.loads(path.read_text())
        model_type = data.pop("model_type")
        return transformers.AutoConfig.for_model(model_type, **data)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        reason = f"no model_type in it ({exc})" if isinstance(exc, KeyError) else str(exc)
        raise WorkloadError(
            f"config {config!r} does not load as a transformers config: {reason.splitlines()[0]}"
        ) from None


def _transformers() -> Any:
    try:
        import transformers
    except ImportError:
        raise WorkloadError(
            "tuner.hf needs transformers: pip install 'microbatch-tuner[hf]'"
        ) from None
    return transformers


def _with_lora(model: nn.Module, rank: int) -> nn.Module:
    try:
        import peft
    except ImportError:
        raise WorkloadError(
            "lora needs peft: pip install 'microbatch-tuner[hf]' (or pip install peft)"
        ) from None
    adapters = peft.LoraConfig(r=rank, lora_alpha=2 * rank, target_modules="all-linear")
    with warnings.catch_warnings():
        # peft reads transformers attributes that newer releases renamed: their notice.
        warnings.simplefilter("ignore", FutureWarning)
        return peft.get_peft_model(model, adapters)


def _enable_checkpointing(model: Any) -> None:
    # Newer transformers renamed it (the old name warns there), and its keyword argument.
    kwargs = {"use_reentrant": False}
    if hasattr(model, "activation_checkpointing_enable"):
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)


def _check_length(seq_len: int, config: Any) -> None:
    if seq_len < 2:
        raise WorkloadError(f"seq_len must be at least 2, got {seq_len}")
    limit = getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", None)
    if limit is not None and seq_len > limit:
        raise WorkloadError(
            f"seq_len {seq_len} is above the model's maximum positions ({limit}): use at "
            f"most {limit}, or a config with more positions"
        )


def _name(config: Any, task: str, seq_len: int, lora: int) -> str:
    layers = getattr(config, "num_hidden_layers", None) or getattr(config, "n_layer", "?")
    width = getattr(config, "hidden_size", None) or getattr(config, "n_embd", "?")
    adapters = f"-lora{lora}" if lora else ""
    return f"hf-{config.model_type}-{task}-{layers}l{width}d-{seq_len}{adapters}"


def _random_ids(n: int, seq_len: int, vocab: int, rank: int) -> torch.Tensor:
    # Rank 0 draws from the global generator (reproducible with torch.manual_seed); other
    # ranks from one seeded by their rank, so each sees samples of its own. Token 0 is
    # left out: a classifier's padding token.
    generator = torch.Generator().manual_seed(rank) if rank else None
    return torch.randint(1, vocab, (n, seq_len), generator=generator)


def _causal_batches(vocab: int, seq_len: int) -> Callable[..., Batch]:
    def make_batch(n: int, rank: int = 0) -> Batch:
        input_ids = _random_ids(n, seq_len, vocab, rank)
        return {
            "input_ids": input_ids,
            "attention_mask": torch.ones_like(input_ids),
            "labels": input_ids.clone(),
        }

    return make_batch


def _class_batches(vocab: int, seq_len: int, num_labels: int) -> Callable[..., Batch]:
    def make_batch(n: int, rank: int = 0) -> Batch:
        input_ids = _random_ids(n, seq_len, vocab, rank)
        labels = torch.arange(n) % num_labels
        return {
            "input_ids": input_ids,
            "attention_mask": torch.ones_like(input_ids),
            "labels": labels,
        }

    return make_batch


def _model_loss(model: nn.Module, batch: Batch) -> torch.Tensor:
    loss: torch.Tensor = model(**batch).loss
    return loss
