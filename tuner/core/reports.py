"""What ``tuner profile --json`` prints, as models: one schema for the CLI that prints it,
the service that stores it (``POST /api/v1/profiles`` takes the document as printed) and
anyone who reads it back.

- :class:`ProfileReport`: a :class:`~tuner.core.results.Profile` plus what the command adds
  beside it (the plan for ``--global-batch-size``, the stored id with ``--upload``, the
  advice, the explored variants, the length). Every added field is optional and known, so a
  misspelt key is still refused. With ``--explore`` the profile, its plan and its id are
  the chosen variant's (``variant_chosen``); ``variants`` compares them all.
- :class:`LengthsReport`: ``--seq-lens``: the family, the fit across lengths and one
  :class:`ProfileReport` per length.

The added fields are copies of what the profile says (``seq_len`` is
``workload.seq_len``, ``micro_batch_size`` is the plan's): :meth:`ProfileReport.profile`
drops them, and a document whose copies disagree is refused.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from tuner.core.lengths import LengthFit
from tuner.core.plan import Recommendation
from tuner.core.results import Profile, VariantValue


class VariantSummary(BaseModel):
    """One explored variant: its options, ``M*``, plan and measured speed."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    variant: dict[str, VariantValue]
    variant_group: str | None = None
    max_micro_batch_size: int
    recommendation: Recommendation | None = None
    samples_per_second: float | None = None
    samples_per_second_spread: float | None = Field(
        default=None, description="how far the timed rounds lie apart, a fraction of the speed"
    )
    chosen: bool = False


class ProfileReport(Profile):
    """A profile as ``tuner profile --json`` prints it (see the module docstring)."""

    micro_batch_size: int | None = None
    grad_accum: int | None = None
    recommendation: Recommendation | None = None
    profile_id: int | None = None
    advice: list[str] | None = None
    variants: list[VariantSummary] | None = None
    seq_len: int | None = None
    tokens_per_micro_batch: int | None = None

    @model_validator(mode="after")
    def _copies_agree(self) -> ProfileReport:
        plan = self.recommendation
        pairs = [
            ("micro_batch_size", self.micro_batch_size, plan and plan.micro_batch_size),
            ("grad_accum", self.grad_accum, plan and plan.grad_accum),
            ("seq_len", self.seq_len, self.workload.seq_len),
            (
                "tokens_per_micro_batch",
                self.tokens_per_micro_batch,
                self.max_micro_batch_size * (self.workload.seq_len or 0),
            ),
        ]
        for name, given, derived in pairs:
            if given is not None and given != derived:
                raise ValueError(
                    f"{name} is {given} but the profile says {derived}: leave it out, or "
                    "give the value the profile has"
                )
        if plan is not None and plan.max_micro_batch_size > self.max_micro_batch_size:
            raise ValueError(
                f"the recommendation's M* {plan.max_micro_batch_size} is above the profile's "
                f"{self.max_micro_batch_size}: it belongs to another profile"
            )
        chosen = [v for v in self.variants or [] if v.chosen]
        if len(chosen) > 1:
            raise ValueError("more than one variant is marked chosen: mark one, or none")
        if chosen and chosen[0].max_micro_batch_size != self.max_micro_batch_size:
            raise ValueError(
                f"the chosen variant's M* is {chosen[0].max_micro_batch_size} but the "
                f"profile's is {self.max_micro_batch_size}: the profile must be the chosen one"
            )
        if self.variants is not None and bool(chosen) != self.variant_chosen:
            said = "true" if self.variant_chosen else "false"
            marked = "mark one chosen" if chosen else "mark none chosen"
            raise ValueError(
                f"variant_chosen is {said} but the variants {marked}: the profile printed "
                "is the chosen variant's, marked so in both places"
            )
        return self

    @model_validator(mode="before")
    @classmethod
    def _chosen_from_variants(cls, data: Any) -> Any:
        """A document printed before profiles carried ``variant_chosen`` marks the choice
        in ``variants`` alone; its profile is the chosen one (checked after)."""
        if isinstance(data, dict) and "variant_chosen" not in data:
            variants = data.get("variants")
            if isinstance(variants, list) and any(
                isinstance(v, dict) and v.get("chosen") is True for v in variants
            ):
                return {**data, "variant_chosen": True}
        return data

    @classmethod
    def of(
        cls,
        profile: Profile,
        *,
        recommendation: Recommendation | None = None,
        **added: Any,
    ) -> ProfileReport:
        """``profile`` with what the command adds; the plan's settings are copied to the
        top level, as a person reading the JSON looks for them there."""
        if recommendation is not None:
            added |= {
                "recommendation": recommendation,
                "micro_batch_size": recommendation.micro_batch_size,
                "grad_accum": recommendation.grad_accum,
            }
        return cls.model_validate({**dict(profile), **added})

    def profile(self) -> Profile:
        """The profile alone, without what the command added."""
        return Profile.model_validate(self.model_dump(include=set(Profile.model_fields)))

    def document(self) -> dict[str, Any]:
        """The JSON object printed: the added fields that are not set are left out."""
        unset = {name for name in ADDED_FIELDS if getattr(self, name) is None}
        return self.model_dump(mode="json", exclude=unset)


# What ProfileReport adds to a profile (the service ignores these when it stores one).
ADDED_FIELDS = frozenset(set(ProfileReport.model_fields) - set(Profile.model_fields))


class LengthsReport(BaseModel):
    """``tuner profile --seq-lens … --json``: the family, the fit, a profile per length."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    length_family: str | None
    seq_lens: list[int]
    fit: LengthFit | None
    profiles: list[ProfileReport]

    @model_validator(mode="after")
    def _lengths_agree(self) -> LengthsReport:
        measured = [p.workload.seq_len for p in self.profiles]
        if measured != self.seq_lens:
            raise ValueError(
                f"seq_lens {self.seq_lens} do not match the profiles' lengths {measured}"
            )
        return self

    def document(self) -> dict[str, Any]:
        return {
            **self.model_dump(mode="json", exclude={"profiles"}),
            "profiles": [p.document() for p in self.profiles],
        }
