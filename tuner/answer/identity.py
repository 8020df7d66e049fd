"""Which stored row a reference (``?workload=``, ``?device=``, an OOM report's pair) means.

The rule, the same for every reader, whoever wrote since:

1. A key names its own row, always.
2. A name belongs to whoever registered the first row that bears it (the lowest id): the
   token that uploaded its first profile, registered it, or queued the job that measured
   it (rows stored before registrants were recorded have none and keep their names among
   themselves). A row another token registers later under the same name is stored,
   listed and reachable by its key, but the name never resolves to it.
3. Among the owner's rows of that name, a workload is chosen by the question: its
   parallel mode (else the one-process workload), its sequence length when some workload
   was built for it, then the workload whose newest profile was received last; when that
   profile is one variant of an exploration (``--explore``), the variant the exploration
   chose, or for one stored before choices were, its fastest variant at its own M*. A
   device name means the owner's device registered last.
4. A family of lengths (``--seq-lens``) is, like a name, its first member's registrant's.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol, TypeVar

from tuner.answer.evidence import DeviceRow, ProfileRow, WorkloadRow
from tuner.core.errors import NotFoundError

API_PREFIX = "/api/v1"
DEVICE_MISSING = (
    "a device becomes known when a worker registers on it or a profile from it is uploaded; "
    f"GET {API_PREFIX}/devices lists the known ones"
)
WORKLOAD_MISSING = (
    "profile it first (`tuner profile TARGET --upload`); "
    f"GET {API_PREFIX}/workloads lists the known ones"
)


class _Row(Protocol):
    @property
    def id(self) -> int: ...
    @property
    def key(self) -> str: ...
    @property
    def name(self) -> str: ...
    @property
    def registered_by(self) -> int | None: ...


R = TypeVar("R", bound=_Row)


def owned(rows: Sequence[R], reference: str) -> list[R]:
    """The rows ``reference`` may mean: the one keyed so (rule 1), else the rows of that
    name registered by the name's owner (rule 2), oldest first."""
    ordered = sorted(rows, key=lambda row: row.id)
    keyed = [row for row in ordered if row.key == reference]
    if keyed:
        return keyed
    named = [row for row in ordered if row.name == reference]
    if not named:
        return []
    owner = named[0].registered_by
    return [row for row in named if row.registered_by == owner]


def family_members(rows: Sequence[WorkloadRow]) -> list[WorkloadRow]:
    """A family's members as a question by length reads them: its owner's (rule 4)."""
    ordered = sorted(rows, key=lambda row: row.id)
    if not ordered:
        return []
    owner = ordered[0].registered_by
    return [row for row in ordered if row.registered_by == owner]


def choose_device(rows: Sequence[DeviceRow], reference: str) -> DeviceRow:
    """The device keyed ``reference``, else the owner's device of that name registered
    last."""
    found = owned(rows, reference)
    if not found:
        raise _missing("device", reference, DEVICE_MISSING)
    return found[-1]


NewestOf = Callable[[WorkloadRow], ProfileRow | None]
SpeedOf = Callable[[ProfileRow], float]


def choose_workload(
    rows: Sequence[WorkloadRow],
    reference: str,
    *,
    newest_of: NewestOf,
    speed_of: SpeedOf,
    mode: str | None = None,
    seq_len: int | None = None,
) -> WorkloadRow:
    """The workload keyed ``reference``, else, among the owner's workloads of that name,
    the one the question means (rule 3). ``newest_of`` is a workload's newest profile and
    ``speed_of`` a profile's samples per second at its own M* (read only for variants
    stored before explorations recorded their choice)."""
    found = owned(rows, reference)
    if not found:
        raise _missing("workload", reference, WORKLOAD_MISSING)
    if found[0].key == reference:
        return found[0]
    candidates = found
    for wanted in dict.fromkeys((mode or "none", "none")):
        of_mode = [row for row in candidates if row.parallel_mode == wanted]
        if of_mode:
            candidates = of_mode
            break
    at_length = [row for row in candidates if seq_len is not None and row.seq_len == seq_len]
    candidates = at_length or candidates
    if len(candidates) == 1:
        return candidates[0]
    return _newest_or_chosen(candidates, newest_of, speed_of)


def _newest_or_chosen(
    candidates: Sequence[WorkloadRow], newest_of: NewestOf, speed_of: SpeedOf
) -> WorkloadRow:
    """The workload whose newest profile came last (registered last when none has one);
    when that profile is a variant, the one its exploration chose, else its fastest."""
    newest = {row.id: newest_of(row) for row in candidates}

    def recency(row: WorkloadRow) -> tuple[int, object, int]:
        found = newest[row.id]
        return (0, 0, row.id) if found is None else (1, found.recency, row.id)

    last = max(candidates, key=recency)
    found = newest[last.id]
    if found is None or found.variant_group is None:
        return last
    group = found.variant_group
    variants = [
        (row, seen)
        for row in candidates
        if (seen := newest[row.id]) is not None and seen.variant_group == group
    ]
    row, _ = max(variants, key=lambda pair: (pair[1].variant_chosen, speed_of(pair[1]), pair[0].id))
    return row


def _missing(what: str, reference: str, missing: str) -> NotFoundError:
    return NotFoundError(f"no {what} has the key or name {reference!r}: {missing}")
