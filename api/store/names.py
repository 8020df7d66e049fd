"""How a reference (``?workload=``, ``?device=``, an OOM report's pair) finds one row.

The rule, the same for every reader, whoever wrote since:

1. A key names its own row, always.
2. A name belongs to whoever registered the first row that bears it: the token that
   uploaded its first profile, registered it, or queued the job that measured it (rows
   stored before registrants were recorded, migration 0010, have none and keep their
   names among themselves). A row another token registers later under the same name is
   stored, listed and reachable by its key, but the name never resolves to it, so no
   write by someone else can change what a name answers, or make it ambiguous.
3. Among the owner's rows of that name, a workload is chosen by the question:
   its parallel mode (else the one-process workload), its sequence length when some
   workload was built for it, then the workload whose newest profile the service received
   last; when that profile is one variant of an exploration (``--explore``), the
   variant the exploration chose (``variant_chosen``), or for one stored before choices
   were (migration 0012), its fastest variant at its own M* (what ``tuner profile
   --explore`` chooses without a global batch). A device name picks the device
   registered last.
4. A family of lengths (``--seq-lens``) is, like a name, its first member's registrant's:
   the lengths a question by length reads are that registrant's workloads only.

So profiling more (another limit, another mode, an exploration, a changed model) keeps a
name answering, and the answer follows the owner's newest work.

The lookups are statements with one bound parameter (``ref``), so the recommendation's
prepared reads (``api.store.prepared``) and ORM sessions run the very same SQL.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any, Protocol, TypeVar

from sqlalchemy import (
    BindParameter,
    ColumnElement,
    ScalarSelect,
    Select,
    and_,
    bindparam,
    func,
    or_,
    select,
)

from api import models
from tuner.core.errors import NotFoundError
from tuner.core.wire.common import API_PREFIX

Named = type[models.Workload] | type[models.Device]

DEVICE_MISSING = (
    "a device becomes known when a worker registers on it or a profile from it is uploaded; "
    f"GET {API_PREFIX}/devices lists the known ones"
)
WORKLOAD_MISSING = (
    "profile it first (`tuner profile TARGET --upload`); "
    f"GET {API_PREFIX}/workloads lists the known ones"
)


def by_key(table: Named, *columns: Any) -> Select[Any]:
    """``columns`` of the row whose key is the bound parameter ``ref``: rule 1 alone, one
    probe of the unique index. A key always wins (:func:`choose_workload`,
    :func:`choose_device`), so a hot path tries it before :func:`by_reference`."""
    return select(*columns).where(table.key == bindparam("ref"))


def by_reference(table: Named, *columns: Any) -> Select[Any]:
    """``columns`` of the rows the bound parameter ``ref`` may name: the row with that key,
    and the rows of that name registered by the name's owner (the registrant of its first
    row; ``IS NOT DISTINCT FROM`` so that a name first stored without a registrant stays
    with the rows stored without one)."""
    reference: BindParameter[str] = bindparam("ref")
    owner = _first_registrant(table, table.name == reference)
    owned = and_(table.name == reference, table.registered_by.is_not_distinct_from(owner))
    return select(*columns).where(or_(table.key == reference, owned)).order_by(table.id)


def _first_registrant(table: Named, condition: ColumnElement[bool]) -> ScalarSelect[Any]:
    """The registrant of the first row (lowest id) that meets ``condition``: the owner."""
    return (
        select(table.registered_by).where(condition).order_by(table.id).limit(1).scalar_subquery()
    )


def family_statement(*columns: Any) -> Select[Any]:
    """``columns`` of the workloads of the length family bound as ``family``, registered
    by the registrant of its first member: a family's lengths, like a name, are its
    owner's (another token's workload of the same shapes cannot join its estimates)."""
    family: BindParameter[str] = bindparam("family")
    table = models.Workload
    owner = _first_registrant(table, table.length_family == family)
    return select(*columns).where(
        table.length_family == family, table.registered_by.is_not_distinct_from(owner)
    )


def newest_profile_statement() -> Select[Any]:
    """The workload's newest profile (received last): when, its exploration, the
    fastest speed measured at its own M*, and whether its exploration chose it (the bound
    parameter ``workload_id``)."""
    profile, probe = models.Profile, models.Probe
    speed_at_max = (
        select(func.max(probe.samples_per_second))
        .where(
            probe.profile_id == profile.id,
            probe.micro_batch_size == profile.max_micro_batch_size,
            probe.fits.is_(True),
        )
        .scalar_subquery()
    )
    return (
        select(
            profile.received_at,
            profile.id,
            profile.variant_group,
            speed_at_max,
            profile.variant_chosen,
        )
        .where(profile.workload_id == bindparam("workload_id"))
        .order_by(profile.received_at.desc(), profile.id.desc())
        .limit(1)
    )


class _Row(Protocol):
    @property
    def id(self) -> int: ...
    @property
    def key(self) -> str: ...


class _WorkloadRow(_Row, Protocol):
    @property
    def parallel_mode(self) -> str: ...
    @property
    def seq_len(self) -> int | None: ...


R = TypeVar("R", bound=_Row)
W = TypeVar("W", bound=_WorkloadRow)

# (received_at, profile id, variant group, samples/s at M*, chosen by its exploration) of
# a workload's newest profile, or None when it has none.
NewestProfile = tuple[datetime | None, int, str | None, float | None, bool]
NewestOf = Callable[[int], NewestProfile | None]


def _by_key(rows: Sequence[R], reference: str) -> R | None:
    return next((row for row in rows if row.key == reference), None)


def _missing(what: str, reference: str, missing: str) -> NotFoundError:
    return NotFoundError(f"no {what} has the key or name {reference!r}: {missing}")


def choose_device(rows: Sequence[R], reference: str) -> R:
    """The device with key ``reference``, else the owner's device of that name registered
    last (rows come oldest first)."""
    keyed = _by_key(rows, reference)
    if keyed is not None:
        return keyed
    if not rows:
        raise _missing("device", reference, DEVICE_MISSING)
    return rows[-1]


def choose_workload(
    rows: Sequence[W],
    reference: str,
    newest_of: NewestOf,
    *,
    mode: str | None = None,
    seq_len: int | None = None,
) -> W:
    """The workload with key ``reference``, else, among the owner's workloads of that name,
    the one the question means (rule 3 of the module's docstring). ``newest_of`` reads a
    workload's newest profile; it runs only when the name is shared."""
    keyed = _by_key(rows, reference)
    if keyed is not None:
        return keyed
    if not rows:
        raise _missing("workload", reference, WORKLOAD_MISSING)
    candidates = list(rows)
    for wanted in dict.fromkeys((mode or "none", "none")):
        of_mode = [row for row in candidates if row.parallel_mode == wanted]
        if of_mode:
            candidates = of_mode
            break
    at_length = [row for row in candidates if seq_len is not None and row.seq_len == seq_len]
    candidates = at_length or candidates
    if len(candidates) == 1:
        return candidates[0]
    return _newest_or_chosen(candidates, newest_of)


def _newest_or_chosen(candidates: Sequence[W], newest_of: NewestOf) -> W:
    """The workload whose newest profile came last (registered last when none has one);
    when that profile is a variant, the one its exploration chose, else its fastest."""
    newest = {row.id: newest_of(row.id) for row in candidates}

    def recency(row: W) -> tuple[int, float, int, int]:
        found = newest[row.id]
        if found is None:
            return (0, 0.0, 0, row.id)
        received_at = found[0].timestamp() if found[0] is not None else 0.0
        return (1, received_at, found[1], row.id)

    last = max(candidates, key=recency)
    found = newest[last.id]
    if found is None or found[2] is None:
        return last
    group = found[2]
    variants = [
        row for row in candidates if (seen := newest[row.id]) is not None and seen[2] == group
    ]
    return max(variants, key=lambda row: (_chosen(newest[row.id]), _speed(newest[row.id]), row.id))


def _chosen(found: NewestProfile | None) -> bool:
    return bool(found and found[4])


def _speed(found: NewestProfile | None) -> float:
    return (found[3] if found else None) or 0.0
