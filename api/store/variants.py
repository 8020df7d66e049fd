"""Variants of one exploration (``tuner profile --explore``): the profiles that share a
``variant_group``, each measured with other workload options, compared side by side."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from api import models
from api.store.profiles import to_result
from api.store.projects import in_project
from tuner.answer.local import answer_from
from tuner.core.wire.variants import VariantPlan, VariantPublic, VariantsPublic


def variants_of(session: Session, row: models.Profile) -> VariantsPublic:
    """Every profile of ``row``'s exploration in its project, oldest first (the variant as
    loaded leads); only ``row`` itself when it was not explored."""
    rows = [row]
    if row.variant_group is not None:
        rows = list(
            session.scalars(
                select(models.Profile)
                .where(
                    in_project(row.workload.project_id),
                    models.Profile.variant_group == row.variant_group,
                )
                .order_by(models.Profile.received_at, models.Profile.id)
            )
        )
    data = [_public(member) for member in rows]
    return VariantsPublic(variant_group=row.variant_group, data=data, count=len(data))


def _public(row: models.Profile) -> VariantPublic:
    """One variant: its options, M*, and the peak and speed measured at M*."""
    at_max = [p for p in row.probes if p.micro_batch_size == row.max_micro_batch_size and p.fits]
    probe = at_max[-1] if at_max else None
    return VariantPublic(
        profile_id=row.id,
        workload_key=row.workload.key,
        workload_name=row.workload.name,
        variant=dict(row.variant or {}),
        max_micro_batch_size=row.max_micro_batch_size,
        peak_bytes=probe.peak_reserved_bytes if probe is not None else None,
        samples_per_second=probe.samples_per_second if probe is not None else None,
        chosen=bool(row.variant_chosen),
        plan=_plan(row),
        created_at=row.created_at,
    )


def _plan(row: models.Profile) -> VariantPlan | None:
    """The variant's answer for the batch its curve was timed for (the one answer
    function, over this profile alone): the plan and speed its exploration compared."""
    if not row.speeds or row.max_micro_batch_size < 1:
        return None
    profile = to_result(row)
    per_rank = profile.speeds.per_rank_batch_size if profile.speeds else None
    if per_rank is None:
        return None
    answer = answer_from(profile, global_batch_size=per_rank * profile.mesh.dp)
    return VariantPlan(
        global_batch_size=answer.global_batch_size,
        split=answer.split,
        grad_accum=answer.grad_accum,
        samples_per_second=answer.expected_samples_per_second,
        speed_spread=answer.expected_speed_spread,
    )
