"""Peak memory across sequence lengths, from profiles of one workload at several lengths.

    peak(m, s) ≈ a₀ + a₁·s + b·m·s + c·m·s²

``a₀`` is weights, gradients and optimizer state; ``a₁·s`` buffers that grow with the
length alone (position tables, masks); ``b·m·s`` activations per token; ``c·m·s²``
attention scores held per pair of tokens. A memory-efficient attention kernel never holds
the scores, and then ``c`` is close to zero: it is fitted, never assumed, and a negative
``c`` (noise around zero) is set to zero and the other terms fitted again.

The fit is weighted least squares of relative errors (:mod:`tuner.core.least_squares`)
over every probe that measured a peak near its length's boundary, where the answers are.
Three unknowns need peaks at two lengths and two sizes at one of them at least: a search
whose guess is right measures only ``M*`` at its length (``M* + 1`` runs out of memory
and leaves no peak), and :mod:`tuner.engine.lengths` then measures one more size there.
When the points cannot separate ``s²`` from ``s`` (one peak at a third length), ``c`` is
set to zero as with two lengths.
Lengths that were measured are answered by their own profile; others between the
shortest and longest measured are estimated, and so are lengths down to half the
shortest and up to :data:`EXTRAPOLATION` times the longest; further is refused, since
the terms that dominate there were never seen dominating. An estimate keeps a margin of
the fit's largest relative error on the measured probes, and never exceeds the measured
``M*`` of a shorter length or falls below that of a longer one.

The margin is the error the fit makes where it was not fitted, never its residual alone: a
fit with as many terms as points passes through every one of them (a residual of 1e-15
says nothing; measured: XLM-RoBERTa at 64, 128 and 256 answered 7 at 192, where 7 runs
out of memory and 6 is the truth). So each measured point is left out in turn, the fit
is made again from the others (:func:`fit_lengths`, which may then fit fewer terms) and
the point predicted from it; the largest relative error of these predictions
(``held_out_error``), or of the fit itself where larger (``max_relative_error``), is the
margin (``error_bound``). Where some point cannot be left out (the others
cannot be fitted: one peak at a length, two at no other), the fit cannot know its error
and nothing is estimated: the refusal names the command that measures the length.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import suppress

from pydantic import BaseModel, ConfigDict

from tuner.core.errors import BadInputError
from tuner.core.least_squares import fit_linear, relative_weights
from tuner.core.plan import Basis
from tuner.core.results import ProbeResult, Profile
from tuner.core.worlds import near_boundary

EXTRAPOLATION = 1.25  # answers reach this far past the longest measured length
SHORTEST_FRACTION = 0.5  # and down to this fraction of the shortest


_TOO_FEW_PEAKS = (
    "the profiles measured too few peaks near the boundary to fit across lengths (two "
    "sizes at one length at least): profile the lengths again with --seq-lens"
)


class LengthFit(BaseModel):
    model_config = ConfigDict(frozen=True)

    fixed_bytes: float  # a₀
    fixed_per_token_bytes: float  # a₁
    per_token_bytes: float  # b
    per_token_pair_bytes: float  # c
    seq_lens: list[int]
    points: int
    max_relative_error: float = 0.0  # the fit's residual on its own points
    # Its error on each point left out of it; None: some point cannot be left out (the
    # others cannot be fitted), so the fit does not know its error and does not estimate.
    held_out_error: float | None = None

    def predict(self, micro_batch_size: int, seq_len: int) -> float:
        m, s = micro_batch_size, seq_len
        return (
            self.fixed_bytes
            + self.fixed_per_token_bytes * s
            + self.per_token_bytes * m * s
            + self.per_token_pair_bytes * m * s * s
        )

    def per_sample_bytes(self, seq_len: int) -> float:
        return self.per_token_bytes * seq_len + self.per_token_pair_bytes * seq_len**2

    @property
    def error_bound(self) -> float | None:
        """The margin an estimate keeps: the larger of the residual and the error on the
        points left out; None where the fit cannot know its error."""
        if self.held_out_error is None:
            return None
        return max(self.max_relative_error, self.held_out_error)


class LengthEstimate(BaseModel):
    model_config = ConfigDict(frozen=True)

    seq_len: int
    max_micro_batch_size: int
    tokens_per_micro_batch: int  # M* sequences of seq_len tokens: the packing budget
    expected_peak_bytes: int
    basis: Basis
    based_on: list[int]  # the measured lengths the answer rests on
    fit: LengthFit | None = None

    def describe(self) -> str:
        if self.basis == "measured":
            return f"measured at seq_len {self.seq_len}"
        lengths = ", ".join(str(s) for s in self.based_on)
        error = (self.fit.error_bound or 0.0) if self.fit else 0.0
        return (
            f"estimated for seq_len {self.seq_len} from profiles at {lengths} "
            f"(fit within {error:.1%} of every measured peak near the boundary, each "
            "predicted by the fit to the others)"
        )


def fit_lengths(points: Sequence[tuple[int, int, int]]) -> LengthFit:
    """The fit through ``(micro batch, seq_len, peak bytes)`` points, with its error on
    each point left out of it (the module's docstring says why)."""
    return _fit_points(points).model_copy(update={"held_out_error": held_out_error(points)})


def held_out_error(points: Sequence[tuple[int, int, int]]) -> float | None:
    """The largest relative error predicting each point from the fit to the others; None
    where some point cannot be left out (the others cannot be fitted)."""
    worst = 0.0
    for index, (m, s, y) in enumerate(points):
        others = [*points[:index], *points[index + 1 :]]
        try:
            fit = _fit_points(others)
        except BadInputError:
            return None
        if y > 0:
            worst = max(worst, abs(fit.predict(m, s) - y) / y)
    return worst


def _fit_points(points: Sequence[tuple[int, int, int]]) -> LengthFit:
    """The least-squares fit alone, its residual as its error."""
    lengths = sorted({s for _, s, _ in points})
    if len(lengths) < 2:
        raise BadInputError("a fit across sequence lengths needs profiles at two or more lengths")
    sizes_at = {s: {m for m, at, _ in points if at == s} for s in lengths}
    if max(len(sizes) for sizes in sizes_at.values()) < 2:
        # One peak per length: m·s is nearly the same at every M* (the tokens a budget
        # holds), so the per-token term would rest on the rounding between lengths.
        raise BadInputError(_TOO_FEW_PEAKS)
    peaks = [float(peak) for _, _, peak in points]
    weights = relative_weights(peaks)
    with_pairs = [(1.0, float(s), float(m * s), float(m * s * s)) for m, s, _ in points]
    a0, a1, b, c = 0.0, 0.0, 0.0, -1.0
    if len(lengths) >= 3:
        with suppress(BadInputError):  # too few peaks to tell s from s² apart: c = 0 below
            a0, a1, b, c = fit_linear(with_pairs, peaks, weights)
    if c < 0:  # two lengths cannot tell s from s² apart, or c is noise around zero
        try:
            a0, a1, b = fit_linear([row[:3] for row in with_pairs], peaks, weights)
        except BadInputError:
            raise BadInputError(_TOO_FEW_PEAKS) from None
        c = 0.0
    fit = LengthFit(
        fixed_bytes=a0,
        fixed_per_token_bytes=a1,
        per_token_bytes=b,
        per_token_pair_bytes=c,
        seq_lens=lengths,
        points=len(points),
    )
    worst = max(abs(fit.predict(m, s) - y) / y for m, s, y in points if y > 0)
    return fit.model_copy(update={"max_relative_error": worst})


def fit_length_profiles(profiles: Sequence[Profile], seq_lens: Sequence[int]) -> LengthFit:
    """The fit through the probes of ``profiles[i]``, measured at ``seq_lens[i]``: those
    with a measured peak within a factor of two of their profile's ``M*``."""
    if len(profiles) != len(seq_lens):
        raise BadInputError("give one sequence length per profile")
    _check_comparable(profiles)
    points = [
        point
        for profile, seq_len in zip(profiles, seq_lens, strict=True)
        for point in boundary_points(profile.probes, profile.max_micro_batch_size, seq_len)
    ]
    return fit_lengths(points)


def boundary_points(
    probes: Sequence[ProbeResult], max_micro_batch_size: int, seq_len: int
) -> list[tuple[int, int, int]]:
    """``(micro batch, seq_len, peak)`` of the probes at one length that the fit uses: those
    with a measured peak within a factor of two of ``M*``."""
    return [
        (probe.micro_batch_size, seq_len, probe.footprint_bytes)
        for probe in probes
        if probe.footprint_bytes and near_boundary(probe.micro_batch_size, max_micro_batch_size)
    ]


def estimate_length(
    profiles: Sequence[Profile], seq_lens: Sequence[int], seq_len: int
) -> LengthEstimate:
    """The answer for ``seq_len`` from profiles of one workload at ``seq_lens``."""
    if seq_len < 1:
        raise BadInputError(f"seq_len must be positive, got {seq_len}")
    if len(profiles) != len(seq_lens):
        raise BadInputError("give one sequence length per profile")
    by_length = dict(zip(seq_lens, profiles, strict=True))
    if seq_len in by_length:
        found = by_length[seq_len]
        probe = found.probe_at(found.max_micro_batch_size)
        return LengthEstimate(
            seq_len=seq_len,
            max_micro_batch_size=found.max_micro_batch_size,
            tokens_per_micro_batch=found.max_micro_batch_size * seq_len,
            expected_peak_bytes=(probe.footprint_bytes or 0) if probe else 0,
            basis="measured",
            based_on=[seq_len],
        )
    # The range first: a length out of it is refused as such, whatever the fit would say.
    fitted = sorted(s for s in seq_lens if by_length[s].max_micro_batch_size >= 1) or sorted(
        seq_lens
    )
    lowest, highest = fitted[0], fitted[-1]
    if not lowest * SHORTEST_FRACTION <= seq_len <= highest * EXTRAPOLATION:
        raise BadInputError(
            f"seq_len {seq_len} is too far from the measured lengths "
            f"({', '.join(map(str, fitted))}) to estimate: answers reach "
            f"{int(lowest * SHORTEST_FRACTION)} to {int(highest * EXTRAPOLATION)}; profile "
            f"it too (--seq-lens {','.join(map(str, sorted({*fitted, seq_len})))})"
        )
    fit = fit_length_profiles(profiles, seq_lens)
    if fit.held_out_error is None:
        raise BadInputError(
            f"seq_len {seq_len} cannot be estimated: the fit across lengths passes through "
            "every peak measured near the boundary, so it cannot know its error between "
            "them (leaving any one out leaves too few to fit); profile it too (--seq-lens "
            f"{','.join(map(str, sorted({*fitted, seq_len})))})"
        )
    if fit.per_sample_bytes(seq_len) <= 0:
        raise BadInputError("peak memory does not grow with the micro batch in these profiles")
    budget = profiles[0].budget_bytes
    margin = 1 + (fit.error_bound or 0.0)
    per_sample = fit.per_sample_bytes(seq_len)
    fixed = fit.predict(0, seq_len)
    size = max(0, int((budget / margin - fixed) // per_sample))
    # A longer sequence never fits more than a shorter one: the measured answers bound it.
    shorter = [by_length[s].max_micro_batch_size for s in seq_lens if s < seq_len]
    longer = [by_length[s].max_micro_batch_size for s in seq_lens if s > seq_len]
    size = min(size, *shorter, profiles[0].size_cap)
    size = max(size, *longer) if longer else size
    return LengthEstimate(
        seq_len=seq_len,
        max_micro_batch_size=size,
        tokens_per_micro_batch=size * seq_len,
        expected_peak_bytes=int(fit.predict(size, seq_len)) if size else 0,
        basis="estimated",
        based_on=fit.seq_lens,
        fit=fit,
    )


def _check_comparable(profiles: Sequence[Profile]) -> None:
    first = profiles[0]
    for profile in profiles[1:]:
        if (profile.device_key, profile.budget_bytes, profile.mesh) != (
            first.device_key,
            first.budget_bytes,
            first.mesh,
        ):
            raise BadInputError(
                "the profiles differ in device, budget or mesh shape (world size, tp): "
                "estimate across lengths from profiles of one workload on one device and "
                "one shape"
            )
