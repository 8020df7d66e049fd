"""Workloads for Hugging Face ``transformers`` models, built from a config: no downloads.

    tuner profile tuner.hf:causal_lm -o config=path/to/config.json -o seq_len=2048 \\
        -o precision=bf16 -o checkpointing=true

Tasks: ``causal_lm`` (decoder-only), ``sequence_classification`` (an encoder, or a
decoder with a classification head), ``seq2seq_lm`` (encoder-decoder: T5, BART; the
source and the target are both ``seq_len`` tokens) and ``image_classification`` (ViT and
other vision models: images of the config's ``image_size``, no sequence length).

The model is built with random weights from its config (``AutoModelFor….from_config``),
so a profile needs the architecture, never the weights; or pass a model instance from
Python (``causal_lm(model=my_model, seq_len=1024)``). Batches are the worst case for
memory: every sequence ``seq_len`` tokens long.

Under ``--parallel fsdp`` every block the model itself names as one that must not be split
(``_no_split_modules``: a decoder layer, an encoder layer) is sharded on its own, then the
whole model, as FSDP's documentation does for transformers.

Losses follow the accumulator's rules (:mod:`tuner.train.accumulate`): a causal LM's
loss is the model's own (the mean over target tokens after the shift, ``-100`` ignored)
and ``loss_units`` counts exactly those targets, ``labels[:, 1:] != -100``; an
encoder-decoder's is the model's own too (the mean over target tokens, no shift) and
``loss_units`` counts ``labels != -100``; a classifier's loss is the mean over samples.

The optimizer is ``adamw`` (two moments a weight), ``adafactor`` (torch's Adafactor:
factored second moments, about a row and a column a matrix) or ``sgd`` (with momentum 0.9:
one buffer a weight): ``-o optimizer=adafactor``. ``-o attn_implementation=eager`` (or
``sdpa``, ...) picks the attention kernel transformers runs, which changes what forward
saves for backward; it is part of the workload key.

``transformers`` is an optional extra (``pip install -e '.[hf]'`` in a clone), and so
is ``peft`` for LoRA adapters (``-o lora=8``): frozen base weights have no gradients and
no optimizer state, which changes memory a lot.
"""

from __future__ import annotations

import inspect
import json
import warnings
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Literal, get_args

import torch
from torch import nn

from tuner.core.errors import WorkloadError
from tuner.core.extras import require
from tuner.core.option_files import read_option_file
from tuner.engine.workload import PRECISIONS, OptimizerFactory, Workload

Task = Literal["causal-lm", "sequence-classification", "seq2seq-lm", "image-classification"]
TASKS: tuple[str, ...] = get_args(Task)
Optimizer = Literal["adamw", "adafactor", "sgd"]
OPTIMIZERS: tuple[str, ...] = get_args(Optimizer)
# SGD as people train with it: a momentum buffer a weight (plain SGD would keep none).
SGD_MOMENTUM = 0.9
IGNORE_INDEX = -100
Batch = dict[str, torch.Tensor]


_AUTO_CLASSES = {
    "causal-lm": "AutoModelForCausalLM",
    "sequence-classification": "AutoModelForSequenceClassification",
    "seq2seq-lm": "AutoModelForSeq2SeqLM",
    "image-classification": "AutoModelForImageClassification",
}
_CLASSIFIERS = ("sequence-classification", "image-classification")


def workload(
    *,
    task: str = "causal-lm",
    config: str | Mapping[str, Any] | None = None,
    model: nn.Module | None = None,
    seq_len: int | None = None,
    precision: str = "fp32",
    checkpointing: bool = False,
    compile: bool = False,
    lora: int = 0,
    lr: float = 1e-4,
    num_labels: int = 2,
    optimizer: str = "adamw",
    attn_implementation: str | None = None,
) -> Workload:
    """A ``transformers`` model as a workload, for ``task`` (``causal-lm``,
    ``sequence-classification``, ``seq2seq-lm`` or ``image-classification``). Give
    ``config`` (a ``config.json`` file, a folder holding one, or a dict with ``model_type``)
    or a ``model`` instance. Text tasks take ``seq_len`` (default 512); images have the
    config's ``image_size`` and take none. ``optimizer`` is ``adamw``, ``adafactor`` or
    ``sgd`` (with momentum); ``attn_implementation`` the attention kernel of a model built
    from ``config`` (``eager``, ``sdpa``, ...; default: transformers' choice)."""
    transformers = _transformers()
    if task not in TASKS:
        raise WorkloadError(f"unknown task {task!r}: use one of {', '.join(TASKS)}")
    if precision not in PRECISIONS:
        raise WorkloadError(f"unknown precision {precision!r}: use one of {', '.join(PRECISIONS)}")
    if optimizer not in OPTIMIZERS:
        raise WorkloadError(f"unknown optimizer {optimizer!r}: use one of {', '.join(OPTIMIZERS)}")
    if attn_implementation is not None and model is not None:
        raise WorkloadError(
            "attn_implementation applies to a model built from config; for a model you "
            "pass, build it with the attention you want"
        )
    if task == "image-classification" and seq_len is not None:
        raise WorkloadError(
            "image-classification takes no seq_len: its images have the config's image_size"
        )
    if model is None:
        loaded = load_config(config, transformers)
        if task in _CLASSIFIERS:
            loaded.num_labels = num_labels
        if task == "sequence-classification" and loaded.pad_token_id is None:
            loaded.pad_token_id = 0  # sequence classifiers find each sample's last token
        torch.manual_seed(0)
        model = _from_config(transformers, task, loaded, attn_implementation)
    elif config is not None:
        raise WorkloadError("give config or model, not both")
    if not isinstance(model, nn.Module) or not hasattr(model, "config"):
        raise WorkloadError(
            f"model must be a transformers PreTrainedModel, got {type(model).__name__}"
        )
    model_config: Any = model.config
    if task != "image-classification":
        seq_len = 512 if seq_len is None else seq_len
        _check_length(seq_len, model_config)
    # transformers checkpoints the blocks of most models, not all (ConvNeXt): such a model
    # has no checkpointing variant to explore.
    can_checkpoint = bool(getattr(model, "supports_gradient_checkpointing", False))
    if checkpointing:
        if not can_checkpoint:
            raise WorkloadError(
                f"{type(model).__name__} does not support activation checkpointing in "
                "transformers; leave out checkpointing=true"
            )
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
    make_batch, loss_units = _batches(task, model_config, seq_len, num_labels)
    settings = {"attn_implementation": attn_implementation} if attn_implementation else {}
    return Workload(
        name=_name(model_config, task, seq_len, lora, optimizer, attn_implementation),
        model=trained,
        optimizer=optimizer_factory(optimizer, lr),
        memory_settings=settings,
        make_batch=make_batch,
        loss_fn=_model_loss,
        loss_units=loss_units,
        precision=precision,  # type: ignore[arg-type]
        activation_checkpointing=checkpointing,
        shard=shard_blocks,
        variants={"checkpointing": [False, True]} if can_checkpoint else {},
    )


def causal_lm(**options: Any) -> Workload:
    """A causal language model (``AutoModelForCausalLM``): next-token loss over targets."""
    return workload(task="causal-lm", **options)


def sequence_classification(**options: Any) -> Workload:
    """A sequence classifier (``AutoModelForSequenceClassification``): loss per sample."""
    return workload(task="sequence-classification", **options)


def seq2seq_lm(**options: Any) -> Workload:
    """An encoder-decoder (``AutoModelForSeq2SeqLM``: T5, BART): source and target both
    ``seq_len`` tokens, loss over the target tokens."""
    return workload(task="seq2seq-lm", **options)


def _takes_workloads_options(factory: Callable[..., Workload]) -> None:
    """Give a task's factory :func:`workload`'s signature, less ``task``: the options a
    command line checks (a misspelt one is refused in one line that lists them)."""
    signature = inspect.signature(workload)
    parameters = [p for name, p in signature.parameters.items() if name != "task"]
    factory.__signature__ = signature.replace(parameters=parameters)  # type: ignore[attr-defined]


for _factory in (causal_lm, sequence_classification, seq2seq_lm):
    _takes_workloads_options(_factory)


def image_classification(
    *,
    config: str | Mapping[str, Any] | None = None,
    model: nn.Module | None = None,
    precision: str = "fp32",
    checkpointing: bool = False,
    compile: bool = False,
    lora: int = 0,
    lr: float = 1e-4,
    num_labels: int = 2,
    optimizer: str = "adamw",
    attn_implementation: str | None = None,
) -> Workload:
    """An image classifier (``AutoModelForImageClassification``: ViT and others): images of
    the config's ``image_size``, loss per sample. No ``seq_len``, so ``--seq-lens`` refuses it."""
    return workload(
        task="image-classification",
        config=config,
        model=model,
        precision=precision,
        checkpointing=checkpointing,
        compile=compile,
        lora=lora,
        lr=lr,
        num_labels=num_labels,
        optimizer=optimizer,
        attn_implementation=attn_implementation,
    )


def optimizer_factory(name: str, lr: float) -> OptimizerFactory:
    """``adamw``, ``adafactor`` or ``sgd`` (momentum 0.9) over the trained parameters."""

    def build(params: Iterator[nn.Parameter]) -> torch.optim.Optimizer:
        trained = [p for p in params if p.requires_grad]
        if name == "adafactor":
            return torch.optim.Adafactor(trained, lr=lr)
        if name == "sgd":
            return torch.optim.SGD(trained, lr=lr, momentum=SGD_MOMENTUM)
        return torch.optim.AdamW(trained, lr=lr)

    return build


def shard_blocks(model: nn.Module, fully_shard: Callable[[nn.Module], Any]) -> None:
    """FSDP: shard each block the model names in ``_no_split_modules`` (its decoder or
    encoder layers), then the whole model, so that one block is gathered at a time.

    Only the outermost such blocks: a model may also name a block's parts (mBART names
    ``MBartAttention`` beside its layers), and a part sharded after its layer would find
    its parameters sharded already (torch refuses: "value was None")."""
    names: set[str] = set()
    for module in model.modules():
        names.update(getattr(module, "_no_split_modules", None) or ())
    blocks: list[tuple[str, nn.Module]] = []
    for name, module in model.named_modules():
        if module is model or type(module).__name__ not in names:
            continue
        if any(name.startswith(f"{outer}.") for outer, _ in blocks):
            continue  # inside a block already chosen (modules come parents first)
        blocks.append((name, module))
    for _, block in blocks:
        fully_shard(block)
    fully_shard(model)


def target_tokens(batch: Batch) -> int:
    """The tokens a causal LM's loss averages over: labels after the shift, not -100."""
    return int((batch["labels"][:, 1:] != IGNORE_INDEX).sum())


def labelled_tokens(batch: Batch) -> int:
    """The tokens an encoder-decoder's loss averages over: every label that is not -100."""
    return int((batch["labels"] != IGNORE_INDEX).sum())


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
            # On a worker, only files its owner allows (tuner.core.option_files).
            data = json.loads(read_option_file(config, option="config", in_folder="config.json"))
        model_type = data.pop("model_type")
        return transformers.AutoConfig.for_model(model_type, **data)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        reason = f"no model_type in it ({exc})" if isinstance(exc, KeyError) else str(exc)
        raise WorkloadError(
            f"config {config!r} does not load as a transformers config: {reason.splitlines()[0]}"
        ) from None


def _from_config(transformers: Any, task: str, config: Any, attention: str | None) -> Any:
    auto = getattr(transformers, _AUTO_CLASSES[task])
    if attention is None:
        return auto.from_config(config)
    try:
        return auto.from_config(config, attn_implementation=attention)
    except (ValueError, ImportError) as exc:
        # transformers says which kernels exist and which this model supports.
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise WorkloadError(f"attn_implementation={attention!r}: {reason}") from None


def _transformers() -> Any:
    require("hf", feature="tuner.hf", modules=("transformers",))
    import transformers

    return transformers


def _with_lora(model: nn.Module, rank: int) -> nn.Module:
    require("hf", feature="lora", modules=("peft",))
    import peft

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


def _name(
    config: Any,
    task: str,
    seq_len: int | None,
    lora: int,
    optimizer: str = "adamw",
    attention: str | None = None,
) -> str:
    layers = (
        getattr(config, "num_hidden_layers", None)
        or getattr(config, "n_layer", None)
        or getattr(config, "num_layers", "?")  # T5
    )
    width = (
        getattr(config, "hidden_size", None)
        or getattr(config, "n_embd", None)
        or getattr(config, "d_model", "?")  # T5, BART
    )
    adapters = f"-lora{lora}" if lora else ""
    shape = seq_len if seq_len is not None else f"{getattr(config, 'image_size', '?')}px"
    # The default optimizer and attention keep the names they had.
    trained = f"-{optimizer}" if optimizer != "adamw" else ""
    kernel = f"-{attention}" if attention else ""
    return f"hf-{config.model_type}-{task}-{layers}l{width}d-{shape}{adapters}{trained}{kernel}"


def _random_ids(n: int, seq_len: int, vocab: int, rank: int) -> torch.Tensor:
    # Rank 0 draws from the global generator (reproducible with torch.manual_seed); other
    # ranks from one seeded by their rank, so each sees samples of its own. Token 0 is
    # left out: a classifier's padding token.
    generator = torch.Generator().manual_seed(rank) if rank else None
    return torch.randint(1, vocab, (n, seq_len), generator=generator)


def _batches(
    task: str, config: Any, seq_len: int | None, num_labels: int
) -> tuple[Callable[..., Batch], Callable[[Batch], int] | None]:
    """The task's worst-case batches, and what its loss averages over (None: samples)."""
    if task == "image-classification":
        return _image_batches(config, num_labels), None
    assert seq_len is not None  # text tasks always have one by now
    vocab = int(config.vocab_size)
    if task == "causal-lm":
        return _causal_batches(vocab, seq_len), target_tokens
    if task == "seq2seq-lm":
        return _causal_batches(vocab, seq_len), labelled_tokens
    return _class_batches(vocab, seq_len, num_labels), None


def _image_batches(config: Any, num_labels: int) -> Callable[..., Batch]:
    size = int(getattr(config, "image_size", 224))
    channels = int(getattr(config, "num_channels", 3))

    def make_batch(n: int, rank: int = 0) -> Batch:
        generator = torch.Generator().manual_seed(rank) if rank else None
        return {
            "pixel_values": torch.randn(n, channels, size, size, generator=generator),
            "labels": torch.arange(n) % num_labels,
        }

    return make_batch


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
