"""The profile page's comparison of explored variants (``tuner profile --explore``)."""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy.orm import Session

from api.dashboard.format import variant_text
from api.store.profiles import get_profile
from api.store.variants import variants_of
from tuner.core.wire.variants import VariantPublic


@dataclass(frozen=True)
class VariantRow:
    variant: VariantPublic
    label: str
    speed_width: float  # percent of the fastest variant's plan speed (else speed at M*)

    @property
    def chosen(self) -> bool:
        """The exploration chose it, by its plan's measured speed (the CLI's choice, kept
        by the store); never guessed from the speed at M*, which ranks variants otherwise."""
        return self.variant.chosen


def variant_rows(session: Session, profile_id: int, *, project_id: int) -> list[VariantRow]:
    """The variants explored with this profile, the chosen one marked; empty when not
    explored."""
    found = variants_of(session, get_profile(session, profile_id, project_id=project_id))
    if found.variant_group is None:
        return []
    top = max((_decided_by(v) for v in found.data), default=0.0)
    return [
        VariantRow(
            variant=v,
            label=variant_text(v.variant) or "as loaded",
            speed_width=round(100 * _decided_by(v) / top, 2) if top > 0 else 0.0,
        )
        for v in found.data
    ]


def _decided_by(variant: VariantPublic) -> float:
    """The speed the choice compared: the plan's timed speed where the profile kept a
    curve, else (explorations stored before) the speed at M*."""
    if variant.plan is not None and variant.plan.samples_per_second is not None:
        return variant.plan.samples_per_second
    return variant.samples_per_second or 0.0
