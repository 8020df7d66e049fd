"""The family page's M* against sequence length, per device.

Workloads built for different sequence lengths of one model have keys of their own and share
a ``length_family``. For each device: the measured points (the newest one-process profile at
each length) and, from two lengths on, the answers ``tuner.core.lengths.estimate_length``
gives (the recommendation's own estimate) across the whole range it answers, half the
shortest length to 1.25 times the longest, sampled at :data:`CURVE_POINTS` lengths.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any, Literal

from api import models
from api.store.profiles import to_result
from tuner.core import lengths
from tuner.core.errors import BadInputError
from tuner.core.lengths import estimate_length as at_length
from tuner.core.plan import Basis

# Enough lengths that the curve shows each step of M* on a page-wide chart, few enough that
# refitting for each answer stays a few milliseconds.
CURVE_POINTS = 48

Quantity = Literal["mstar", "tokens"]


@dataclass(frozen=True)
class MeasuredLength:
    seq_len: int
    max_micro_batch_size: int
    profile_id: int
    probes: int
    workload_id: int
    workload_name: str


@dataclass(frozen=True)
class LengthAnswer:
    """M* at one length, as the recommendation answers it; ``measured`` when profiled."""

    seq_len: int
    max_micro_batch_size: int
    basis: Basis
    measured: MeasuredLength | None = None

    @property
    def tokens_per_micro_batch(self) -> int:
        return self.max_micro_batch_size * self.seq_len


@dataclass(frozen=True)
class DeviceLengths:
    device_id: int
    device_name: str
    measured: list[MeasuredLength]
    # Every length answered, measured ones included: the curve, and the table's rows.
    answers: dict[int, LengthAnswer] = field(default_factory=dict)
    expected_error: float | None = None
    note: str = ""

    @property
    def fitted(self) -> bool:
        return any(a.basis == "estimated" for a in self.answers.values())

    def table(self) -> list[LengthAnswer]:
        """The measured lengths, the ends of the range answered, and the length halfway
        between each two measured ones."""
        measured = [m.seq_len for m in self.measured]
        shown = set(measured) | (_landmarks(measured) if self.fitted else set())
        return [self.answers[s] for s in sorted(shown) if s in self.answers]

    def chart(self, quantity: Quantity) -> dict[str, Any]:
        """What a chart draws: every length answered, the measured points (gaps between
        them) and, when there is a fit, the estimated curve (keys ending ``-estimated``)."""

        def value(answer: LengthAnswer) -> int:
            return (
                answer.max_micro_batch_size
                if quantity == "mstar"
                else answer.tokens_per_micro_batch
            )

        xs = sorted(self.answers)
        name = "M*" if quantity == "mstar" else "tokens"
        series: list[dict[str, Any]] = [
            {
                "key": f"{quantity}-measured",
                "label": f"{name} measured",
                "colour": "--chart-max",
                "values": [
                    value(self.answers[s]) if self.answers[s].basis == "measured" else None
                    for s in xs
                ],
            }
        ]
        if self.fitted:
            series.append(
                {
                    "key": f"{quantity}-estimated",
                    "label": f"{name} estimated",
                    "colour": "--chart-fit",
                    "values": [value(self.answers[s]) for s in xs],
                }
            )
        return {"xs": xs, "series": series}


def by_device(rows: list[models.Profile]) -> list[DeviceLengths]:
    """``rows``: the family's newest one-process profiles per workload and device, newest
    first (``queries.length_family``); where two workloads share a length on a device, the
    newer profile counts, as in the recommendation."""
    newest: dict[int, dict[int, models.Profile]] = {}
    names: dict[int, str] = {}
    for row in rows:
        if row.workload.seq_len is None:
            continue
        names[row.device_id] = row.device.name
        newest.setdefault(row.device_id, {}).setdefault(row.workload.seq_len, row)
    return [
        _device(device_id, names[device_id], newest[device_id])
        for device_id in sorted(names, key=lambda d: (names[d], d))
    ]


def _device(device_id: int, name: str, by_length: dict[int, models.Profile]) -> DeviceLengths:
    seq_lens = sorted(by_length)
    measured = [_measured(s, by_length[s]) for s in seq_lens]
    answers = {
        m.seq_len: LengthAnswer(m.seq_len, m.max_micro_batch_size, "measured", m) for m in measured
    }
    if len(seq_lens) < 2:
        return DeviceLengths(
            device_id,
            name,
            measured,
            answers,
            note="one length measured: profile a second length to fit M* across lengths",
        )
    profiles = [to_result(by_length[s]) for s in seq_lens]
    low, high = _answered_range(seq_lens)
    step = (high - low) / (CURVE_POINTS - 1)
    curve = {round(low + i * step) for i in range(CURVE_POINTS)}
    try:
        estimates = [
            at_length(profiles, seq_lens, s)
            for s in sorted((curve | _landmarks(seq_lens)) - set(seq_lens))
        ]
    except BadInputError as exc:
        return DeviceLengths(device_id, name, measured, answers, note=f"no fit: {exc.message}")
    answers.update(
        {e.seq_len: LengthAnswer(e.seq_len, e.max_micro_batch_size, e.basis) for e in estimates}
    )
    fits = [e.fit for e in estimates if e.fit is not None]
    error = fits[0].max_relative_error if fits else None
    return DeviceLengths(device_id, name, measured, answers, expected_error=error)


def _answered_range(seq_lens: list[int]) -> tuple[int, int]:
    """The shortest and the longest length ``estimate_length`` answers."""
    return (
        math.ceil(min(seq_lens) * lengths.SHORTEST_FRACTION),
        math.floor(max(seq_lens) * lengths.EXTRAPOLATION),
    )


def _landmarks(seq_lens: list[int]) -> set[int]:
    """Lengths worth a table row beside the measured ones: the ends of the range answered,
    and halfway between each two measured lengths."""
    return set(_answered_range(seq_lens)) | {(a + b) // 2 for a, b in pairwise(seq_lens)}


def _measured(seq_len: int, row: models.Profile) -> MeasuredLength:
    return MeasuredLength(
        seq_len=seq_len,
        max_micro_batch_size=row.max_micro_batch_size,
        profile_id=row.id,
        probes=len(row.probes),
        workload_id=row.workload_id,
        workload_name=row.workload.name,
    )
