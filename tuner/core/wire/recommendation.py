"""The recommendation: ``tuner.core.plan.Recommendation`` and where its numbers came from."""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from datetime import datetime
from typing import Any, Literal, Self

from pydantic import Field, ValidationError, ValidationInfo, field_validator

from tuner.core import plan
from tuner.core.errors import BadInputError
from tuner.core.parallel import ParallelMode
from tuner.core.shape import MeshShape
from tuner.core.wire.common import (
    ProjectName,
    QueryInt,
    Reference,
    RequestModel,
    describe_invalid,
)

# The split travels as runs, so the answer's size does not depend on it; the bound keeps
# the numbers far from any overflow and the per-rank loop of a training job finite.
MAX_GLOBAL_BATCH_SIZE = 2**20
# The most micro batches GET /api/v1/recommendation?split=flat lists (4,096 numbers, tens
# of KiB of JSON at most); past it, the runs.
MAX_FLAT_SPLIT = 4096
MAX_SEQ_LEN = 2**24  # far past any model's positions: only a guard against nonsense


class RecommendationQuery(RequestModel):
    """The one question every surface asks (the client, its offline cache, ``tuner
    recommend``, the dashboard's calculator, the training integrations):

        global batch = micro batch × accumulation steps × dp

    where ``dp`` is the data-parallel groups of :attr:`mesh` (``world_size / tp``); the mesh
    rules are :class:`tuner.core.shape.MeshShape`'s. Over HTTP it is the query string of
    ``GET /api/v1/recommendation`` (:meth:`params`)."""

    workload: Reference = Field(description="workload key or name")
    device: Reference = Field(description="device key or name")
    global_batch_size: QueryInt = Field(
        ge=1,
        le=MAX_GLOBAL_BATCH_SIZE,
        description=f"samples per optimizer step over all ranks, 1 to {MAX_GLOBAL_BATCH_SIZE}",
    )
    # Before world_size, whose check reads it.
    tp: QueryInt = Field(
        default=1,
        ge=1,
        le=MAX_GLOBAL_BATCH_SIZE,
        description="tensor-parallel ranks of a 2-D mesh (world_size / tp × tp; 1 without a "
        "mesh): answered from profiles at that mesh shape, or estimated across the shapes "
        "measured; must divide world_size",
    )
    world_size: QueryInt = Field(
        default=1,
        ge=1,
        le=MAX_GLOBAL_BATCH_SIZE,
        description="ranks; world_size / tp (the data-parallel ranks) must divide "
        "global_batch_size",
    )
    parallel: ParallelMode | None = Field(
        default=None,
        description="how the run is parallelised: none, ddp or fsdp (default: the workload's "
        "own mode); a DDP or FSDP run is answered from profiles measured under that mode",
    )
    policy: plan.Policy = Field(
        default=plan.DEFAULT_POLICY,
        description="balanced (default): the fewest micro batches that fit, sizes within one "
        "of each other; max: largest fitting micro batch first, the remainder last; even: "
        "the best equal split (micro batches of one size, the answer's equal); throughput: "
        "fastest measured",
    )

    seq_len: QueryInt | None = Field(
        default=None,
        ge=1,
        le=MAX_SEQ_LEN,
        description="tokens per sequence (padded or packed to it): measured where that "
        "length was profiled, estimated from the workload's length family between and near "
        "the measured lengths (from half the shortest to 1.25 times the longest)",
    )
    tokens_per_micro_batch: QueryInt | None = Field(
        default=None,
        ge=1,
        le=MAX_SEQ_LEN * MAX_GLOBAL_BATCH_SIZE,
        description="packed sequences: the tokens a micro batch is filled with, a multiple "
        "of seq_len; no micro batch of the answer holds more, and a budget that does not "
        "fit is refused, saying how many tokens do",
    )

    project: ProjectName | None = Field(
        default=None,
        description="the project whose evidence answers (default: the token's own; for a "
        "token of every project, the X-Tuner-Project header's, else default); named here "
        "it must be one the token may read, as in the header",
    )

    @classmethod
    def at(cls, mesh: MeshShape, **fields: Any) -> Self:
        """The question ``fields`` ask for a run of ``mesh``'s ranks (its world size and tp
        written as the wire's two integers)."""
        return cls(world_size=mesh.world_size, tp=mesh.tp, **fields)

    @classmethod
    def read(cls, params: Mapping[str, Any]) -> Self:
        """The question in ``params`` (its fields as a query string or Python values), or
        the ``BadInputError`` with the message the route's 422 gives."""
        try:
            return cls.model_validate(dict(params))
        except ValidationError as exc:
            raise BadInputError(describe_invalid(exc.errors(), location=("query",))[0]) from None

    def params(self) -> dict[str, Any]:
        """The question as ``GET /api/v1/recommendation``'s query parameters: the fields
        given, defaults left out (a question asked as before keeps its query string)."""
        return self.model_dump(exclude_defaults=True, include=set(RecommendationQuery.model_fields))

    @property
    def mesh(self) -> MeshShape:
        """The run's ranks as ``dp × tp`` (checked when the query was read)."""
        return MeshShape(self.world_size, self.tp)

    @field_validator("world_size")
    @classmethod
    def _divides(cls, world_size: int, info: ValidationInfo) -> int:
        global_batch_size = info.data.get("global_batch_size")
        if global_batch_size is not None:
            try:
                plan.per_rank_batch(
                    global_batch_size, MeshShape(world_size, info.data.get("tp", 1))
                )
            except BadInputError as exc:
                raise ValueError(exc.message) from None
        return world_size

    @field_validator("tokens_per_micro_batch")
    @classmethod
    def _whole_sequences(cls, tokens: int | None, info: ValidationInfo) -> int | None:
        if tokens is None:
            return None
        seq_len = info.data.get("seq_len")
        if seq_len is None:
            raise ValueError(
                "tokens_per_micro_batch needs seq_len, the length the sequences are packed to"
            )
        if tokens % seq_len:
            raise ValueError(
                f"tokens_per_micro_batch {tokens} is not a multiple of seq_len {seq_len}: "
                "packed micro batches hold whole sequences"
            )
        return tokens


SplitForm = Literal["runs", "flat"]


class RecommendationParams(RecommendationQuery):
    """GET /api/v1/recommendation's query string: the question, and how to write the
    answer's split (which changes nothing of the answer)."""

    split: SplitForm = Field(
        default="runs",
        description="runs (default): the split as runs [[size, count], ...], at most two "
        "whatever the batch; flat: every micro batch listed, refused (422) above "
        f"{MAX_FLAT_SPLIT} micro batches",
    )


class RecommendationPublic(plan.Recommendation):
    """The settings, and the profile, device and limits they rest on."""

    workload_key: str
    workload_name: str
    device_key: str
    device_name: str
    capacity_bytes: int
    headroom: float = Field(description="fraction of the device's memory kept free")
    oom_limit: int | None = Field(
        description="smallest micro batch reported to run out of memory in training since "
        "the profile; recommendations stay below it until a newer profile exists"
    )
    profile_id: int = Field(description="the profile the numbers come from")
    profile_device_key: str = Field(
        description="device that profile measured: another device when basis is estimated"
    )
    profile_world_size: int = Field(description="ranks that profile was measured on")
    profile_tp: int = Field(
        default=1, description="tensor-parallel ranks of that profile's mesh (1 without one)"
    )
    profile_parallel: ParallelMode = Field(description="that profile's parallel mode")
    profile_created_at: datetime
    profile_simulated_ranks: bool = Field(
        default=False,
        description="that profile is a fake world's (one process stood for rank 0): its "
        "memory was measured, its speed was not, so the answer quotes none",
    )
    parallel: ParallelMode = Field(description="the run's parallel mode, as answered")
    based_on_profiles: list[int] = Field(
        description="every profile the numbers rest on: several when estimated across world sizes"
    )
    expected_error: float | None = Field(
        default=None,
        description="estimated across world sizes: the fit's largest relative error on the "
        "measured peaks (the estimate keeps that much margin)",
    )
    one_process_only: bool = Field(
        default=False,
        description="a DDP or FSDP run answered from a one-process profile: see caveat",
    )
    caveat: str | None = Field(
        default=None, description="what the answer does not know, and how to measure it"
    )
    seq_len: int | None = Field(default=None, description="the sequence length asked for")
    length_family: str | None = Field(
        default=None, description="the family of lengths the workload belongs to"
    )
    length_basis: plan.Basis | None = Field(
        default=None,
        description="measured: seq_len was profiled; estimated: from the fit across the "
        "family's measured lengths (expected_error is then the fit's)",
    )
    measured_seq_lens: list[int] = Field(
        default_factory=list, description="the measured lengths the answer rests on"
    )
    tokens_per_micro_batch: int | None = Field(
        default=None, description="micro_batch_size × seq_len"
    )
    max_tokens_per_micro_batch: int | None = Field(
        default=None,
        description="max_micro_batch_size × seq_len: the budget for packed sequences or "
        "token-bucketed batches whose sequences are at most seq_len long",
    )
    profile_age_s: float


def recommend_command(answer: RecommendationPublic) -> str:
    """The ``tuner recommend`` command that asks the question ``answer`` answers, every
    choice the answer made spelled out (workload and device by key, the parallel mode and
    policy it used), so that running it against the same store gives the same answer.
    (The answer's ``tokens_per_micro_batch`` is its micro batch in tokens, not a packing
    asked for: it is left out.)"""
    words = [
        "tuner",
        "recommend",
        "--workload",
        answer.workload_key,
        "--device",
        answer.device_key,
        "--global-batch-size",
        str(answer.global_batch_size),
        *answer.mesh.flags(),
    ]
    words += ["--parallel", answer.parallel, "--policy", answer.policy]
    if answer.seq_len is not None:
        words += ["--seq-len", str(answer.seq_len)]
    return shlex.join(words)
