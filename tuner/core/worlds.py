"""Answers for a world size or mesh shape never measured, from profiles at two or more others.

On a 2-D mesh of ``dp × tp`` ranks (``W = dp·tp``; ``tp = 1`` is plain DDP or FSDP), per
rank, each phase of a step peaks close to

    peak(m, dp, tp) ≈ a + b·m + c·m/tp + s/(dp·tp) + u/dp + g/tp

- ``a``: what every rank holds whole (DDP's replicas, buffers, workspaces);
- ``b``: activations per sample that every tp rank holds whole (the residual stream, the
  norms without sequence parallelism, the inputs and the head's output);
- ``c``: activations per sample of the layers the plan splits (each tp rank holds its
  ``1/tp`` of a column-split layer's output);
- ``s``: parameters, gradients and optimizer state of the split layers, which FSDP then
  shards over the data-parallel ranks (``1/(dp·tp)`` of them on a rank);
- ``u``: the same of the layers the plan leaves whole (sharded over ``dp`` only);
- ``g``: FSDP's all-gathered blocks of split layers (whole over ``dp``, ``1/tp`` of them).

Only the terms the measured shapes can tell apart enter the fit, in that order of
preference — ``1, m, 1/W, m/tp, 1/tp, 1/dp`` — each when its column is independent of
those already taken (exactly, over the measured ``(m, dp, tp)``): all at ``tp = 1``, it is
``a + b·m + s/W`` as before meshes existed; one value of ``dp·tp`` leaves ``1/W`` out; one
value of ``tp`` leaves ``m/tp``, ``1/tp`` and ``1/dp`` out. Why these: measured on
fake-world profiles of ``examples.mesh_mlp`` at (dp, tp) = (4, 1), (8, 1), (1, 4), (2, 4),
(4, 2), the held-out (2, 2) is predicted within 0.08% of every measured peak near its M*
(and M* 272 estimated, 272 measured); holding out each other shape in turn, within 0.22%.
Without ``m/tp`` the held-out errors reach 4 to 18% (activations dominate a rank's peak,
and most of them shrink with ``tp``); with ``1, m, 1/W, m/tp`` only, 0.25 to 0.41%; the
shape terms ``1/tp`` and ``1/dp`` halve that again (``tests/core/test_mesh_worlds.py``).

A step has two phases whose peaks grow differently (forward and backward with m; the
optimizer step hardly at all), so each is fitted on its own by least squares of relative
errors over every probe whose peak was measured, at every shape given, and the peak is
the larger of the two. Only probes near each profile's boundary (half to twice its M*)
enter the fit: that is where the answer lies, and at small sizes a fixed transient can
hold a phase's peak flat.

The answer at ``(W, tp)`` is ``measured`` where a profile at exactly that shape exists
(the newest), else ``estimated``: the largest m whose predicted footprint, raised by the
fit's error, stays within the budget, and never above what was
measured to fit at the nearest measured shape that is at least as large in both
dimensions (a rank's memory does not grow with dp or with tp, so that shape is a ceiling
that ran). On a mesh, a shape outside the measured range of dp or of tp, or with no
measured shape larger in both, is refused in one line: that would extrapolate. Without a
mesh (every shape ``tp = 1``), as before: above the largest measured world size, that
size's M* is the ceiling. Torch-free, so the service can answer with it.

The fit's error is what it makes where it was not fitted, never its residual alone: with
as many probes as terms it passes through all of them. Each probe is left out in turn,
the fit made again from the others and the probe's footprint predicted from it; the
largest relative error of these (``held_out_error``, or the residual
``max_relative_error`` where larger) is the margin (``error_bound``). Where some
probe cannot be left out (the others separate fewer terms, or none), the fit cannot know
its error, and a shape whose ceiling comes from a larger shape (a ceiling above the
truth) is refused with the command that profiles it; above every measured world size the
ceiling is a smaller size's M*, which a larger world never fits less than, and answers.
"""

from __future__ import annotations

from collections.abc import Sequence
from fractions import Fraction

from pydantic import BaseModel, ConfigDict

from tuner.core.errors import BadInputError
from tuner.core.least_squares import fit_linear, relative_weights
from tuner.core.plan import Basis
from tuner.core.results import ProbeResult, Profile
from tuner.core.shape import ONE_PROCESS, MeshShape

# The fit's terms in order of preference: each enters when the measured points can tell
# it from those before it. Names are PhaseFit's fields.
TERMS: tuple[str, ...] = (
    "fixed_bytes",  # 1
    "per_sample_bytes",  # m
    "sharded_bytes",  # 1 / (dp·tp)
    "per_sample_split_bytes",  # m / tp
    "gathered_bytes",  # 1 / tp
    "dp_sharded_bytes",  # 1 / dp
)


def _term_values(m: int, mesh: MeshShape) -> tuple[Fraction, ...]:
    return (
        Fraction(1),
        Fraction(m),
        Fraction(1, mesh.world_size),
        Fraction(m, mesh.tp),
        Fraction(1, mesh.tp),
        Fraction(1, mesh.dp),
    )


class PhaseFit(BaseModel):
    """``peak ≈ fixed + per_sample·m + per_sample_split·m/tp + sharded/(dp·tp)
    + dp_sharded/dp + gathered/tp`` for one phase of a step (terms the shapes measured
    cannot separate are 0)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    fixed_bytes: float
    per_sample_bytes: float
    sharded_bytes: float
    per_sample_split_bytes: float = 0.0
    gathered_bytes: float = 0.0
    dp_sharded_bytes: float = 0.0

    def predict(self, micro_batch_size: int, mesh: MeshShape) -> float:
        return (
            self.fixed_bytes
            + self.per_sample_bytes * micro_batch_size
            + self.per_sample_split_bytes * micro_batch_size / mesh.tp
            + self.sharded_bytes / mesh.world_size
            + self.gathered_bytes / mesh.tp
            + self.dp_sharded_bytes / mesh.dp
        )

    def per_sample_at(self, mesh: MeshShape = ONE_PROCESS) -> float:
        """Bytes per sample on a rank of ``mesh``."""
        return self.per_sample_bytes + self.per_sample_split_bytes / mesh.tp


class WorldFit(BaseModel):
    """One fit per phase of a step (forward and backward of the micro batches grow with m;
    the optimizer step does not): the peak is the larger of the phases, plus what the
    allocator caches and memory outside torch at the nearest measured size."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    phases: dict[str, PhaseFit]
    overhead_bytes: float
    points: int
    world_sizes: list[int]
    max_relative_error: float  # the fit's residual on its own probes
    # Its error on each probe left out of it; None where some probe cannot be left out,
    # and the fit does not know its error.
    held_out_error: float | None = None
    # The measured shapes (by dp, then tp) and the terms the fit could separate.
    shapes: list[MeshShape] = []
    terms: list[str] = []

    def predict(self, micro_batch_size: int, mesh: MeshShape) -> float:
        peak = max(fit.predict(micro_batch_size, mesh) for fit in self.phases.values())
        return peak + self.overhead_bytes

    @property
    def error_bound(self) -> float | None:
        """The margin an estimate keeps: the larger of the residual and the error on the
        probes left out; None where the fit cannot know its error."""
        if self.held_out_error is None:
            return None
        return max(self.max_relative_error, self.held_out_error)

    @property
    def per_sample_bytes(self) -> float:
        return self.per_sample_at(ONE_PROCESS)

    def per_sample_at(self, mesh: MeshShape = ONE_PROCESS) -> float:
        """The steepest phase's bytes per sample on a rank of ``mesh``."""
        return max(fit.per_sample_at(mesh) for fit in self.phases.values())

    @property
    def has_mesh(self) -> bool:
        return any(shape.is_mesh for shape in self.shapes)


class WorldEstimate(BaseModel):
    """The largest micro batch expected to fit on a rank of ``mesh``, and what it rests on."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    mesh: MeshShape
    max_micro_batch_size: int
    expected_peak_bytes: int
    fit: WorldFit
    based_on: list[int]  # the world sizes of the profiles used
    basis: Basis = "estimated"
    # The shapes of the profiles used, and the one whose M* is the ceiling.
    based_on_shapes: list[MeshShape] = []
    ceiling_shape: MeshShape | None = None

    def where(self) -> str:
        """``world size 4``, or ``a 2 × 2 mesh (dp × tp)`` (``a 4 × 1 mesh`` too, where the
        fit rests on meshes)."""
        if not (self.mesh.is_mesh or self.fit.has_mesh):
            return self.mesh.where()
        return f"a {self.mesh.dp} × {self.mesh.tp} mesh (dp × tp)"

    def describe(self) -> str:
        where = self.where()
        if self.basis == "measured":
            return f"M* {self.max_micro_batch_size} at {where} (measured)"
        if self.fit.has_mesh or self.mesh.is_mesh:
            sources = "mesh shapes " + ", ".join(f"{s.dp} × {s.tp}" for s in self.based_on_shapes)
        else:
            sources = "world sizes " + ", ".join(map(str, self.based_on))
        return (
            f"M* {self.max_micro_batch_size} at {where} (estimated from {sources}; fit "
            f"within {self.fit.max_relative_error:.1%} of every measured peak)"
        )


def _by_dp(shape: MeshShape) -> tuple[int, int]:
    """Shapes listed by dp, then tp (``1 × 4, 2 × 2, 4 × 1``), as people read meshes."""
    return shape.dp, shape.tp


def fit_world_sizes(profiles: Sequence[Profile]) -> WorldFit:
    """Least squares of each phase's measured peak against the terms the shapes measured
    can separate, drawn from ``(1, m, 1/W, m/tp, 1/tp, 1/dp)``."""
    _check_comparable(profiles)
    # Near each profile's boundary only: at small sizes a fixed transient (an all-gathered
    # embedding, say) can hold the peak flat, and far past the budget nothing is decided.
    measured = [
        (probe, profile.mesh)
        for profile in profiles
        for probe in profile.probes
        if probe.footprint_bytes is not None
        and probe.peak_allocated_bytes is not None
        and near_boundary(probe.micro_batch_size, profile.max_micro_batch_size)
    ]
    if len({probe.micro_batch_size for probe, _ in measured}) < 2:
        raise BadInputError("the profiles measured fewer than two micro batch sizes: profile more")
    fit = _fit_measured(measured, profiles)
    return fit.model_copy(update={"held_out_error": _held_out_error(measured, profiles)})


def _held_out_error(
    measured: list[tuple[ProbeResult, MeshShape]], profiles: Sequence[Profile]
) -> float | None:
    """The largest relative error predicting each measured footprint from the fit to the
    other probes (which may separate fewer terms); None where some probe cannot be left
    out (the others cannot be fitted)."""
    worst = 0.0
    for index, (probe, mesh) in enumerate(measured):
        others = [*measured[:index], *measured[index + 1 :]]
        try:
            fit = _fit_measured(others, profiles)
        except BadInputError:
            return None
        footprint = probe.footprint_bytes or 0
        if footprint > 0:
            predicted = fit.predict(probe.micro_batch_size, mesh)
            worst = max(worst, abs(predicted - footprint) / footprint)
    return worst


def _fit_measured(
    measured: list[tuple[ProbeResult, MeshShape]], profiles: Sequence[Profile]
) -> WorldFit:
    """The least-squares fit of each phase over ``measured``, its residual as its error."""
    if len({probe.micro_batch_size for probe, _ in measured}) < 2:
        raise BadInputError("the profiles measured fewer than two micro batch sizes: profile more")
    curves: dict[str, list[tuple[int, MeshShape, int]]] = {}
    for probe, mesh in measured:
        # Without phases (an older profile), the whole footprint is one curve.
        peaks = probe.phase_peaks_bytes or {"step": probe.peak_allocated_bytes or 0}
        for phase, peak in peaks.items():
            # What collectives hold beyond the peak (gloo's copies, a fake world's one in
            # flight) grows with the shape like the accumulation phase it happens in, so it
            # is fitted with it; the optimizer step runs no collective.
            held = probe.collective_copies_bytes if phase != "optimizer" else 0
            curves.setdefault(phase, []).append((probe.micro_batch_size, mesh, peak + held))
    overhead = max(
        (probe.footprint_bytes or 0)
        - (probe.peak_allocated_bytes or 0)
        - probe.collective_copies_bytes
        for probe, _ in measured
    )
    terms = separable_terms([(p.micro_batch_size, mesh) for p, mesh in measured])
    fit = WorldFit(
        phases={phase: _fit_phase(points, terms) for phase, points in curves.items()},
        overhead_bytes=float(overhead),
        points=len(measured),
        world_sizes=sorted({p.world_size for p in profiles}),
        max_relative_error=0.0,
        shapes=sorted({p.mesh for p in profiles}, key=_by_dp),
        terms=[TERMS[i] for i in terms],
    )
    worst = max(
        abs(fit.predict(probe.micro_batch_size, mesh) - (probe.footprint_bytes or 0))
        / (probe.footprint_bytes or 1)
        for probe, mesh in measured
    )
    return fit.model_copy(update={"max_relative_error": worst})


def near_boundary(size: int, max_micro_batch_size: int) -> bool:
    """Within a factor of two of ``M*``: the probes a fit should answer near the boundary from."""
    return max_micro_batch_size / 2 <= size <= 2 * max_micro_batch_size + 2


def separable_terms(points: Sequence[tuple[int, MeshShape]]) -> list[int]:
    """The indices into :data:`TERMS` of the terms the ``(m, mesh)`` points can tell
    apart: each in turn when its column is independent of those taken (exact arithmetic,
    so no tolerance decides it)."""
    rows = {_term_values(m, mesh) for m, mesh in points}
    chosen: list[int] = []
    for index in range(len(TERMS)):
        if _rank(rows, [*chosen, index]) == len(chosen) + 1:
            chosen.append(index)
    return chosen


def _rank(rows: set[tuple[Fraction, ...]], columns: list[int]) -> int:
    """The rank of the points' matrix restricted to ``columns`` (Gaussian elimination)."""
    matrix = [[row[c] for c in columns] for row in rows]
    rank = 0
    for col in range(len(columns)):
        pivot = next((r for r in range(rank, len(matrix)) if matrix[r][col] != 0), None)
        if pivot is None:
            continue
        matrix[rank], matrix[pivot] = matrix[pivot], matrix[rank]
        for r in range(len(matrix)):
            if r != rank and matrix[r][col] != 0:
                factor = matrix[r][col] / matrix[rank][col]
                matrix[r] = [x - factor * y for x, y in zip(matrix[r], matrix[rank], strict=True)]
        rank += 1
    return rank


def _fit_phase(points: list[tuple[int, MeshShape, int]], terms: list[int]) -> PhaseFit:
    """Least squares of relative errors over ``(m, mesh, peak)`` points."""
    rows = [[float(_term_values(m, mesh)[i]) for i in terms] for m, mesh, _ in points]
    peaks = [float(peak) for *_, peak in points]
    found = fit_linear(rows, peaks, relative_weights(peaks))
    values = dict.fromkeys(TERMS, 0.0)
    values.update({TERMS[i]: value for i, value in zip(terms, found, strict=True)})
    return PhaseFit(**values)


def estimate_world_size(
    profiles: Sequence[Profile], mesh: MeshShape, fit: WorldFit | None = None
) -> WorldEstimate:
    """The answer on a rank of ``mesh`` from profiles of the same workload at other sizes
    or shapes. ``fit``: ``fit_world_sizes(profiles)`` where the caller asks at many shapes
    (the fit and its probes left out one at a time are most of the cost)."""
    fit = fit or fit_world_sizes(profiles)
    shapes = sorted({p.mesh for p in profiles}, key=_by_dp)
    exact = [p for p in profiles if p.mesh == mesh]
    if exact:  # measured: the newest profile at this shape answers
        found = max(exact, key=lambda p: p.created_at)
        probe = found.probe_at(found.max_micro_batch_size)
        return WorldEstimate(
            mesh=mesh,
            max_micro_batch_size=found.max_micro_batch_size,
            expected_peak_bytes=(probe.footprint_bytes or 0) if probe else 0,
            fit=fit,
            based_on=[mesh.world_size],
            basis="measured",
            based_on_shapes=[mesh],
            ceiling_shape=mesh,
        )
    across_meshes = fit.has_mesh or mesh.is_mesh
    ceiling_from = _ceiling(profiles, mesh, across_meshes=across_meshes)
    if fit.held_out_error is None and mesh.bounds(ceiling_from.mesh):
        # The fit passes through every probe, and the ceiling comes from a larger shape (a
        # rank there holds less, so its M* may be below the truth here, or equal): nothing
        # measured bounds the fit's error from below.
        raise BadInputError(
            f"{_where(mesh, across_meshes)} cannot be estimated: the fit across the measured "
            "shapes passes through every probe near their boundaries, so it cannot know its "
            "error between them (leaving any one out leaves too few to fit); profile at "
            f"this shape (--world-size {mesh.world_size}"
            + (f" --tp {mesh.tp})" if mesh.tp > 1 else ")")
        )
    if fit.per_sample_at(mesh) <= 0:
        raise BadInputError("peak memory does not grow with the micro batch in these profiles")
    budget = profiles[0].budget_bytes
    # Where the fit cannot know its error (refused above unless a smaller size's M*
    # bounds the answer from below), its residual is the margin.
    margin = 1 + (fit.error_bound or fit.max_relative_error)
    fitting = [
        m for m in range(1, profiles[0].size_cap + 1) if fit.predict(m, mesh) * margin <= budget
    ]
    size = max(fitting, default=0)
    size = max(0, min(size, ceiling_from.max_micro_batch_size, profiles[0].size_cap))
    return WorldEstimate(
        mesh=mesh,
        max_micro_batch_size=size,
        expected_peak_bytes=int(fit.predict(size, mesh)) if size else 0,
        fit=fit,
        based_on=fit.world_sizes,
        based_on_shapes=shapes,
        ceiling_shape=ceiling_from.mesh,
    )


def _where(mesh: MeshShape, across_meshes: bool) -> str:
    return f"a {mesh.dp} × {mesh.tp} mesh (dp × tp)" if across_meshes else mesh.where()


def _ceiling(profiles: Sequence[Profile], mesh: MeshShape, *, across_meshes: bool) -> Profile:
    """The profile whose M* bounds the estimate at ``mesh``: of the measured shapes at
    least as large in both dp and tp, the nearest (fewest ranks; of equals, the smaller
    M*). Across meshes, refused where the estimate would extrapolate."""
    larger = [p for p in profiles if mesh.bounds(p.mesh)]
    if not across_meshes:  # one dimension, as before meshes: the largest size measured caps it
        if not larger:
            return max(profiles, key=lambda p: p.world_size)
        return min(larger, key=lambda p: (p.world_size, p.max_micro_batch_size))
    dps = sorted({p.mesh.dp for p in profiles})
    tps = sorted({p.mesh.tp for p in profiles})
    measured = ", ".join(str(s) for s in sorted({p.mesh for p in profiles}, key=_by_dp))
    dp, tp = mesh.dp, mesh.tp
    if not (dps[0] <= dp <= dps[-1] and tps[0] <= tp <= tps[-1]):
        raise BadInputError(
            f"a {dp} × {tp} mesh (dp × tp) is outside the measured dp {dps[0]}..{dps[-1]} "
            f"and tp {tps[0]}..{tps[-1]} (shapes {measured}): an estimate would extrapolate; "
            "profile at this shape"
        )
    if not larger:
        raise BadInputError(
            f"no measured mesh is at least {dp} × {tp} (dp × tp) in both dimensions (shapes "
            f"{measured}), so nothing that ran bounds an estimate: profile at this shape"
        )
    return min(larger, key=lambda p: (p.world_size, p.max_micro_batch_size))


def _check_comparable(profiles: Sequence[Profile]) -> None:
    if len({p.mesh for p in profiles}) < 2:
        raise BadInputError(
            "an estimate across world sizes needs profiles at two or more world sizes "
            "(or mesh shapes)"
        )
    first = profiles[0]
    for profile in profiles[1:]:
        if (profile.parallel.memory_fields(), profile.budget_bytes, profile.device_key) != (
            first.parallel.memory_fields(),
            first.budget_bytes,
            first.device_key,
        ):
            raise BadInputError(
                "the profiles differ in parallel mode, options, device or budget: estimate "
                "from profiles of one workload, one device and one parallel setting"
            )
        if profile.workload_key != first.workload_key:
            raise BadInputError("the profiles are of different workloads")
