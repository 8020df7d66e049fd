"""FSDP × tensor parallelism on a 2-D device mesh, the way PyTorch's own stack trains it.

The world is laid out as a :class:`~tuner.core.shape.MeshShape`, ``dp × tp``, the ``tp``
ranks of a data-parallel group adjacent (:meth:`MeshShape.coordinates`). The
tensor-parallel plan runs first (``parallelize_module`` on ``mesh["tp"]``), then FSDP
shards what is left across ``mesh["dp"]`` (``fully_shard(..., mesh=mesh["dp"])``). The
ranks of one tensor-parallel group compute one micro batch together, so they must see the
same samples: a rank's samples are drawn by its data-parallel group
(:meth:`MeshShape.group_of`).

Named plans:

- ``llama``: a Llama-like decoder (a block with ``self_attn.{q,k,v,o}_proj`` and
  ``mlp.{gate,up,down}_proj``, as in transformers' Llama, Mistral, Qwen2, StableLM): q/k/v
  and gate/up column-wise, o and down row-wise, the attention's own head counts set to one
  rank's share. With ``sequence_parallel`` the norms run on
  sequence shards as well (the embedding's output is sharded by sequence, the head gathers
  it back), torchtitan's layout.
- ``auto``: the plan transformers ships with the model, ``config.base_model_tp_plan``
  (Phi-3, GPT-NeoX, StarCoder2, Llama and most decoders), applied to the base model with
  torch's own parallel styles: ``colwise`` and ``rowwise`` as above, ``colwise_gather_output``
  (the output gathered, for a layer whose output is sliced), ``rowwise_split_input`` (a
  replicated input split), ``embedding_rowwise`` (the vocabulary split). A plan that needs
  another style, a model with none, or a split weight tied to one left whole is refused in
  one line, naming what to give instead (``tp_plan=workload`` with a plan of its own).
- ``workload``: the workload's own ``tp_plan(model, tp_mesh)``, which calls
  ``parallelize_module`` itself (a plain module with a hand-written plan).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from tuner.core.errors import BadInputError, WorkloadError
from tuner.core.parallel import Parallel

# ``tp_plan(model, tp_mesh)``: calls ``parallelize_module`` on the model's parts.
TensorParallelPlan = Callable[[nn.Module, Any], None]

_ATTENTION_COLUMNS = ("q_proj", "k_proj", "v_proj")
_MLP_COLUMNS = ("gate_proj", "up_proj")
# An attention module's own counts of its heads. Llama's attention reshapes its projections
# with -1 heads, but some (StableLM's) reshape to the heads they count; under the plan each
# rank computes its share of the heads, so the counts become the rank's, as torchtitan's
# Llama sets them.
_HEAD_COUNTS = ("num_heads", "num_key_value_heads", "num_attention_heads")


def build_mesh(parallel: Parallel, world_size: int, device: torch.device) -> Any:
    """The ``(dp, tp)`` device mesh of the current process group."""
    from torch.distributed.device_mesh import init_device_mesh

    mesh = parallel.mesh(world_size)
    return init_device_mesh(device.type, (mesh.dp, mesh.tp), mesh_dim_names=("dp", "tp"))


def apply_plan(
    model: nn.Module, parallel: Parallel, own: TensorParallelPlan | None, mesh: Any
) -> None:
    """Split ``model`` over ``mesh["tp"]`` by the plan ``parallel`` names."""
    tp_mesh = mesh["tp"]
    if parallel.tp_plan == "llama":
        llama_plan(model, tp_mesh, sequence_parallel=parallel.sequence_parallel)
        return
    if parallel.tp_plan == "auto":
        model_plan(model, tp_mesh, sequence_parallel=parallel.sequence_parallel)
        return
    if own is None:
        raise BadInputError(
            "tp_plan=workload: the workload gives no plan; give Workload(tp_plan=fn), where "
            "fn(model, tp_mesh) calls parallelize_module, or use tp_plan=llama"
        )
    own(model, tp_mesh)


def llama_blocks(model: nn.Module) -> list[nn.Module]:
    """Every decoder block of a Llama-like model, in order."""
    return [
        module
        for module in model.modules()
        if all(
            hasattr(getattr(module, "self_attn", None), name)
            for name in (*_ATTENTION_COLUMNS, "o_proj")
        )
        and all(
            hasattr(getattr(module, "mlp", None), name) for name in (*_MLP_COLUMNS, "down_proj")
        )
    ]


def llama_plan(model: nn.Module, tp_mesh: Any, *, sequence_parallel: bool = False) -> None:
    """Attention q/k/v column-wise and o row-wise, MLP gate/up column-wise and down
    row-wise, in every decoder block; the heads split evenly over the ranks."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        SequenceParallel,
        parallelize_module,
    )

    blocks = llama_blocks(model)
    if not blocks:
        raise BadInputError(
            f"tp_plan=llama: {type(model).__name__} has no Llama-like decoder block "
            "(self_attn.q_proj/k_proj/v_proj/o_proj and mlp.gate_proj/up_proj/down_proj); "
            "give the workload its own tp_plan and use tp_plan=workload"
        )
    size = tp_mesh.size()
    config = getattr(model, "config", None)
    for name in ("num_attention_heads", "num_key_value_heads", "intermediate_size"):
        value = getattr(config, name, None)
        if isinstance(value, int) and value % size:
            raise WorkloadError(
                f"tp_plan=llama at tp {size}: the model's {name} ({value}) does not split "
                f"evenly over {size} ranks; use a tp that divides it"
            )
    # With sequence parallelism the activations between blocks stay sharded by sequence
    # (DTensors, so that the model's own code still sees the whole sequence's shape).
    between = Shard(1) if sequence_parallel else Replicate()
    local = not sequence_parallel
    for block in blocks:
        _localise_heads(block.get_submodule("self_attn"), size)
        plan: dict[str, Any] = {
            **{
                f"self_attn.{n}": ColwiseParallel(input_layouts=between) for n in _ATTENTION_COLUMNS
            },
            "self_attn.o_proj": RowwiseParallel(output_layouts=between, use_local_output=local),
            **{f"mlp.{n}": ColwiseParallel(input_layouts=between) for n in _MLP_COLUMNS},
            "mlp.down_proj": RowwiseParallel(output_layouts=between, use_local_output=local),
        }
        if sequence_parallel:
            for norm in ("input_layernorm", "post_attention_layernorm"):
                if hasattr(block, norm):
                    plan[norm] = SequenceParallel()
        parallelize_module(block, tp_mesh, plan)
    if sequence_parallel:
        _shard_sequence_around_blocks(model, tp_mesh)


def _localise_heads(attention: nn.Module, size: int) -> None:
    """Set ``attention``'s head counts to one rank's share of the heads (of ``size``).

    A module kept per head (StableLM's ``qk_layernorm``: one norm per head) would need its
    own split: refused in one line, before anything is changed."""
    counts = {
        name: value
        for name in _HEAD_COUNTS
        if isinstance(value := getattr(attention, name, None), int)
    }
    for module_name, module in attention.named_modules():
        if isinstance(module, nn.ModuleList) and len(module) in counts.values():
            raise BadInputError(
                f"tp_plan=llama: {type(attention).__name__}.{module_name} keeps a module per "
                "head, which the plan does not split; give the workload its own tp_plan "
                "and use tp_plan=workload, or build the model without it"
            )
    for name, value in counts.items():
        if value % size:
            raise WorkloadError(
                f"tp_plan=llama at tp {size}: {type(attention).__name__}.{name} ({value}) "
                f"does not split evenly over {size} ranks; use a tp that divides it"
            )
    for name, value in counts.items():
        setattr(attention, name, value // size)


def _shard_sequence_around_blocks(model: nn.Module, tp_mesh: Any) -> None:
    """Sequence parallelism outside the blocks: the embedding's output sharded by sequence,
    the final norm on shards, the head gathering the whole sequence back."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        SequenceParallel,
        parallelize_module,
    )

    inner = getattr(model, "model", model)
    embed = getattr(inner, "embed_tokens", None)
    norm = getattr(inner, "norm", None)
    head = getattr(model, "lm_head", None)
    if embed is None or norm is None or head is None:
        raise BadInputError(
            "tp_plan=llama with sequence_parallel needs model.model.embed_tokens, "
            "model.model.norm and model.lm_head (a causal LM); use sequence_parallel=false"
        )
    if head.weight is embed.weight:
        raise BadInputError(
            "tp_plan=llama with sequence_parallel: the head's weight is tied to the "
            "embedding, which the two layouts cannot share; use sequence_parallel=false"
        )
    parallelize_module(
        model,
        tp_mesh,
        {
            f"{'model.' if inner is not model else ''}embed_tokens": RowwiseParallel(
                input_layouts=Replicate(), output_layouts=Shard(1), use_local_output=False
            ),
            f"{'model.' if inner is not model else ''}norm": SequenceParallel(),
            "lm_head": ColwiseParallel(input_layouts=Shard(1), output_layouts=Replicate()),
        },
    )


# The styles of transformers' plans applied with torch's own: (kind, output gathered or
# input split). The rest (packed, expert, local and sequence-parallel styles) are refused.
_AUTO_STYLES = {
    "colwise": ("colwise", False),
    "colwise_gather_output": ("colwise", True),
    "colwise_rep": ("colwise", True),
    "rowwise": ("rowwise", False),
    "rowwise_split_input": ("rowwise", True),
    "rowwise_rep": ("rowwise", True),
    "embedding_rowwise": ("rowwise", True),
}
# What every rank keeps whole: nothing to split.
_KEPT_WHOLE = ("replicate",)


def auto_plan(model: nn.Module, tp: int) -> dict[str, str]:
    """The model's own plan (``config.base_model_tp_plan``) resolved to its modules' full
    names (``model.layers.0.self_attn.q_proj`` → ``colwise``), checked to split evenly over
    ``tp`` ranks; refused in one line when it cannot be applied."""
    name = type(model).__name__
    plan = getattr(getattr(model, "config", None), "base_model_tp_plan", None)
    if not plan:
        raise BadInputError(
            f"tp_plan=auto: {name} has no tensor-parallel plan in its config "
            "(config.base_model_tp_plan); give the workload its own tp_plan and use "
            "tp_plan=workload, or tp_plan=llama for a Llama-like decoder"
        )
    base = getattr(model, "base_model", model)
    prefix = next((f"{n}." for n, m in model.named_modules() if m is base and n), "")
    modules = dict(base.named_modules())
    resolved: dict[str, str] = {}
    for pattern, style in plan.items():
        if style in _KEPT_WHOLE:
            continue
        if style not in _AUTO_STYLES:
            raise BadInputError(
                f"tp_plan=auto: {name}'s plan splits {pattern} as {style!r}, which tuner does "
                f"not apply (it applies {', '.join(_AUTO_STYLES)}); give the workload its own "
                "tp_plan and use tp_plan=workload"
            )
        matcher = re.compile(re.escape(pattern).replace(r"\*", r"[^.]+") + "$")
        for module_name in modules:
            if module_name and matcher.match(module_name):
                resolved[prefix + module_name] = style
    if not resolved:
        raise BadInputError(
            f"tp_plan=auto: no module of {name} matches its config's plan "
            f"({', '.join(plan)}); give the workload its own tp_plan and use tp_plan=workload"
        )
    _check_even(model, resolved, tp)
    _check_untied(model, resolved)
    return resolved


def _check_even(model: nn.Module, resolved: dict[str, str], tp: int) -> None:
    """Every split dimension divides by ``tp``, and so do the heads when the attention's
    projections are split locally (each rank then computes its own heads)."""
    modules = dict(model.named_modules())
    for module_name, style in resolved.items():
        weight = getattr(modules[module_name], "weight", None)
        if not isinstance(weight, torch.Tensor) or weight.dim() != 2:
            raise BadInputError(
                f"tp_plan=auto: {module_name} is split as {style!r} but is not a linear layer "
                "or an embedding; give the workload its own tp_plan and use tp_plan=workload"
            )
        kind, _ = _AUTO_STYLES[style]
        # Linear weights are (out, in); an embedding's rows are its vocabulary.
        embedding = isinstance(modules[module_name], nn.Embedding)
        dim = 0 if kind == "colwise" or embedding else 1
        size = weight.shape[dim]
        if size % tp:
            raise WorkloadError(
                f"tp_plan=auto at tp {tp}: {module_name} splits {size} "
                f"{'rows' if dim == 0 else 'columns'}, not evenly over {tp} ranks; use a tp "
                "that divides it"
            )
    if "colwise" in resolved.values():
        config = getattr(model, "config", None)
        for field in ("num_attention_heads", "num_key_value_heads"):
            value = getattr(config, field, None)
            if isinstance(value, int) and value % tp:
                raise WorkloadError(
                    f"tp_plan=auto at tp {tp}: the model's {field} ({value}) does not split "
                    f"evenly over {tp} ranks; use a tp that divides it"
                )


def _check_untied(model: nn.Module, resolved: dict[str, str]) -> None:
    """A weight the plan splits must not also be a weight of a module it leaves whole (an
    output head tied to the embedding): one tensor cannot be split and whole at once."""
    split = {
        id(parameter): module_name
        for module_name, module in model.named_modules()
        if module_name in resolved
        for parameter in module.parameters(recurse=False)
    }
    for module_name, module in model.named_modules(remove_duplicate=False):
        if module_name in resolved:
            continue
        for parameter in module.parameters(recurse=False):
            if id(parameter) in split:
                raise BadInputError(
                    f"tp_plan=auto: {split[id(parameter)]} is split but its weight is tied to "
                    f"{module_name}, which the plan leaves whole; build the model with "
                    "tie_word_embeddings=false, or use tp_plan=workload"
                )


def model_plan(model: nn.Module, tp_mesh: Any, *, sequence_parallel: bool = False) -> None:
    """Split ``model`` by its own plan (:func:`auto_plan`) with torch's parallel styles."""
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    if sequence_parallel:
        raise BadInputError(
            "sequence_parallel=true is for tp_plan=llama, which shards the norms too; "
            "with tp_plan=auto use sequence_parallel=false"
        )
    styles: dict[str, Any] = {}
    for module_name, style in auto_plan(model, tp_mesh.size()).items():
        kind, whole = _AUTO_STYLES[style]
        if kind == "colwise":
            styles[module_name] = ColwiseParallel(output_layouts=Replicate() if whole else None)
        else:
            styles[module_name] = RowwiseParallel(input_layouts=Replicate() if whole else None)
    parallelize_module(model, tp_mesh, styles)
