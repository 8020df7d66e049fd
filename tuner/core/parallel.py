"""How a workload is parallelised across ranks, and the rules its training step follows.

Torch-free: the spec travels in profiles (the service and the client read it) and is part
of the workload key. Only what changes memory is in it:

- ``ddp``: ``gradient_as_bucket_view`` (gradients live inside DDP's all-reduce buckets
  instead of beside them), ``bucket_cap_mb``, ``static_graph``.
- ``fsdp`` (``fully_shard``): ``reshard_after_forward``, the mixed-precision policy's
  ``param_dtype`` and ``reduce_dtype``, and ``gradient_sync``: ``every`` micro batch
  reduce-scatters its gradients (sharded gradients accumulate), or ``last`` only
  (unsharded gradients stay resident between micro batches: more memory, less traffic).
- a 2-D mesh (FSDP only): ``tp`` ranks of tensor parallelism inside each data-parallel
  group, laid out as ``(world_size / tp) × tp`` with dimensions named ``dp`` and ``tp``.
  ``tp_plan`` names how the model is split (``llama`` for Llama-like decoder blocks,
  ``auto`` for the plan a transformers model's config ships, or ``workload`` for the
  workload's own ``tp_plan`` function) and ``sequence_parallel``
  shards the norms' activations along the sequence too. The plan is part of the workload
  key; ``tp`` is a shape, like the world size, so profiles at (4, 1), (2, 2) and (1, 4)
  are of one workload and the service can fit across them.

The step rules every probe and the accumulator share follow from the spec:
gradients are zeroed in place when DDP uses bucket views (``set_to_none`` would make the
first micro batch allocate fresh gradients beside the buckets: measured, the bucket view
then saves nothing), and DDP synchronises on the last micro batch only.
"""

from __future__ import annotations

from typing import Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from tuner.core.errors import BadInputError
from tuner.core.shape import MeshShape

ParallelMode = Literal["none", "ddp", "fsdp"]
PARALLEL_MODES: tuple[str, ...] = get_args(ParallelMode)
GradientSync = Literal["every", "last"]
Dtype = Literal["fp32", "bf16", "fp16"]

_DDP_FIELDS = ("gradient_as_bucket_view", "bucket_cap_mb", "static_graph", "set_to_none")
_FSDP_FIELDS = (
    "reshard_after_forward",
    "param_dtype",
    "reduce_dtype",
    "gradient_sync",
    "tp",
    "tp_plan",
    "sequence_parallel",
)
# Shapes, not settings: a profile records them but they are not part of the workload key.
_SHAPE_FIELDS = ("tp",)
# Part of the key only when a plan is named, so that keys of FSDP workloads without a mesh
# stay what they were.
_PLAN_FIELDS = ("tp_plan", "sequence_parallel")
NAMED_TP_PLANS: tuple[str, ...] = ("llama", "auto", "workload")


class Parallel(BaseModel):
    """Data parallelism of a workload: none, DDP or FSDP, with the options that change
    memory. ``Parallel()`` is one process, as before world sizes existed."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    mode: ParallelMode = "none"
    gradient_as_bucket_view: bool = Field(
        default=True,
        description="DDP: gradients are views into the all-reduce buckets (one copy, not two)",
    )
    bucket_cap_mb: float = Field(default=25.0, gt=0, description="DDP: bucket size in MiB")
    static_graph: bool = Field(default=False, description="DDP: the graph is the same each step")
    set_to_none: bool | None = Field(
        default=None,
        description="DDP: zero_grad(set_to_none=...) at each step; None chooses by memory: "
        "in place with bucket views, else to None",
    )
    reshard_after_forward: bool = Field(
        default=True, description="FSDP: free unsharded parameters after each forward"
    )
    param_dtype: Dtype | None = Field(
        default=None, description="FSDP: MixedPrecisionPolicy.param_dtype"
    )
    reduce_dtype: Dtype | None = Field(
        default=None, description="FSDP: MixedPrecisionPolicy.reduce_dtype"
    )
    gradient_sync: GradientSync = Field(
        default="every",
        description="FSDP: reduce-scatter gradients every micro batch, or on the last only",
    )

    tp: int = Field(
        default=1,
        ge=1,
        description="FSDP: tensor-parallel ranks inside each data-parallel group (the mesh's "
        "second dimension)",
    )
    tp_plan: str | None = Field(
        default=None,
        description="FSDP with a mesh: how the model is split over the tp ranks: 'llama' "
        "(Llama-like decoder blocks), 'auto' (the plan transformers ships in the model's "
        "config) or 'workload' (the workload's own tp_plan function)",
    )
    sequence_parallel: bool = Field(
        default=False,
        description="FSDP with a mesh: shard the norms' activations along the sequence too",
    )

    @model_validator(mode="after")
    def _mesh_needs_fsdp_and_a_plan(self) -> Parallel:
        if self.mode != "fsdp" and (self.tp > 1 or self.tp_plan or self.sequence_parallel):
            raise ValueError("a tensor-parallel mesh (tp, tp_plan) needs --parallel fsdp")
        if self.tp_plan is not None and self.tp_plan not in NAMED_TP_PLANS:
            raise ValueError(
                f"unknown tp_plan {self.tp_plan!r}: use one of {', '.join(NAMED_TP_PLANS)}"
            )
        if self.tp > 1 and self.tp_plan is None:
            raise ValueError(
                "tp > 1 needs a plan: tp_plan=auto (a transformers model's own), "
                "tp_plan=llama, or tp_plan=workload with the workload's own Workload(tp_plan=fn)"
            )
        return self

    @property
    def distributed(self) -> bool:
        return self.mode != "none"

    @property
    def has_mesh(self) -> bool:
        """Whether the model is split by a tensor-parallel plan (on a 2-D mesh)."""
        return self.tp_plan is not None

    def mesh(self, world_size: int) -> MeshShape:
        """``world_size`` ranks of this spec as ``dp × tp`` (refused where ``tp`` does not
        divide them)."""
        return MeshShape(world_size, self.tp)

    @property
    def zero_grad_set_to_none(self) -> bool:
        """Whether a step starts with ``zero_grad(set_to_none=True)``: by default not when
        DDP keeps gradients as bucket views, whose storage must be reused, not replaced."""
        if self.mode == "ddp" and self.set_to_none is not None:
            return self.set_to_none
        return not (self.mode == "ddp" and self.gradient_as_bucket_view)

    def syncs_on(self, index: int, count: int) -> bool:
        """Whether micro batch ``index`` of ``count`` reduces gradients across ranks."""
        if self.mode == "fsdp" and self.gradient_sync == "every":
            return True
        return index == count - 1

    def memory_fields(self) -> dict[str, Any]:
        """The mode and the options that apply to it (the part of the workload key)."""
        names = {"ddp": _DDP_FIELDS, "fsdp": _FSDP_FIELDS}.get(self.mode, ())
        names = tuple(
            name
            for name in names
            if name not in _SHAPE_FIELDS and (name not in _PLAN_FIELDS or self.has_mesh)
        )
        return {"mode": self.mode, **{name: getattr(self, name) for name in names}}

    def describe(self) -> str:
        """``ddp (gradient_as_bucket_view=True, ...)``, or ``one process``."""
        if not self.distributed:
            return "one process"
        options = ", ".join(f"{k}={v}" for k, v in self.memory_fields().items() if k != "mode")
        mesh = f" × tp {self.tp}" if self.has_mesh else ""
        return f"{self.mode}{mesh} ({options})"


# What every place that shows a fake world's profile says of it (the CLI, the dashboard).
SIMULATED_RANKS_NOTE = (
    "one process stood for rank 0 on torch's fake process group: memory measured, "
    "numerics not trained (collectives moved no data)"
)


def mesh_text(parallel: Parallel, world_size: int) -> str:
    """``2 × 2 mesh (dp × tp)`` where a plan splits the model (tp 1 included); ``""``
    otherwise."""
    if not parallel.has_mesh:
        return ""
    mesh = parallel.mesh(world_size)
    return f"{mesh.dp} × {mesh.tp} mesh (dp × tp)"


def parse_parallel(mode: str, pairs: list[str], base: Parallel | None = None) -> Parallel:
    """``--parallel MODE`` and ``--parallel-option NAME=VALUE`` over the workload's own spec.

    The workload's options carry over when it declared the same mode."""
    if mode not in PARALLEL_MODES:
        raise BadInputError(
            f"unknown parallel mode {mode!r}: use one of {', '.join(PARALLEL_MODES)}"
        )
    fields: dict[str, Any] = {}
    if base is not None and base.mode == mode:
        fields = base.model_dump(exclude={"mode"})
    allowed = {"ddp": _DDP_FIELDS, "fsdp": _FSDP_FIELDS}.get(mode, ())
    for pair in pairs:
        name, sep, raw = pair.partition("=")
        if not sep or name not in allowed:
            hint = ", ".join(allowed) if allowed else "none for this mode"
            raise BadInputError(
                f"parallel option {pair!r} does not apply to {mode}: use NAME=VALUE with "
                f"NAME one of {hint}"
            )
        fields[name] = None if raw.lower() in ("none", "null") else raw
    try:
        return Parallel.model_validate({"mode": mode, **fields})
    except ValidationError as exc:
        error = exc.errors()[0]
        where = ".".join(str(part) for part in error["loc"])
        message = str(error["msg"]).removeprefix("Value error, ")
        raise BadInputError(
            f"parallel option {where}: {message}" if where else f"--parallel {mode}: {message}"
        ) from None
