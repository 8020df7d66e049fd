"""How a workload is parallelised across ranks, and the rules its training step follows.

Torch-free: the spec travels in profiles (the service and the client read it) and is part
of the workload key. Only what changes memory is in it:

- ``ddp``: ``gradient_as_bucket_view`` (gradients live inside DDP's all-reduce buckets
  instead of beside them), ``bucket_cap_mb``, ``static_graph``.
- ``fsdp`` (``fully_shard``): ``reshard_after_forward``, the mixed-precision policy's
  ``param_dtype`` and ``reduce_dtype``, and ``gradient_sync``: ``every`` micro batch
  reduce-scatters its gradients (sharded gradients accumulate), or ``last`` only
  (unsharded gradients stay resident between micro batches: more memory, less traffic).

The step rules every probe and the accumulator share follow from the spec:
gradients are zeroed in place when DDP uses bucket views (``set_to_none`` would make the
first micro batch allocate fresh gradients beside the buckets: measured, the bucket view
then saves nothing), and DDP synchronises on the last micro batch only.
"""

from __future__ import annotations

from typing import Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from tuner.core.errors import BadInputError

ParallelMode = Literal["none", "ddp", "fsdp"]
PARALLEL_MODES: tuple[str, ...] = get_args(ParallelMode)
GradientSync = Literal["every", "last"]
Dtype = Literal["fp32", "bf16", "fp16"]

_DDP_FIELDS = ("gradient_as_bucket_view", "bucket_cap_mb", "static_graph", "set_to_none")
_FSDP_FIELDS = ("reshard_after_forward", "param_dtype", "reduce_dtype", "gradient_sync")


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

    @property
    def distributed(self) -> bool:
        return self.mode != "none"

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
        return {"mode": self.mode, **{name: getattr(self, name) for name in names}}

    def describe(self) -> str:
        """``ddp (gradient_as_bucket_view=True, ...)``, or ``one process``."""
        if not self.distributed:
            return "one process"
        options = ", ".join(f"{k}={v}" for k, v in self.memory_fields().items() if k != "mode")
        return f"{self.mode} ({options})"


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
        raise BadInputError(f"parallel option {where}: {error['msg']}") from None
