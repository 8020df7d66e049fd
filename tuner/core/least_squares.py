"""Weighted linear least squares for every memory fit of the core (the affine fit of one
profile, the fits across world sizes and across sequence lengths), in plain Python: the
core stays free of numpy, which the service image does not carry.

    minimise  Σₖ wₖ · (yₖ − Σᵢ θᵢ·xₖᵢ)²   ⇔   (Xᵀ W X) θ = Xᵀ W y
"""

from __future__ import annotations

from collections.abc import Sequence

from tuner.core.errors import BadInputError


def relative_weights(targets: Sequence[float]) -> list[float]:
    """``1 / y²``: least squares of relative errors, so that a point far past the budget
    does not outweigh the ones near the boundary, where the answer is."""
    return [1.0 / (y * y) if y > 0 else 0.0 for y in targets]


def fit_linear(
    rows: Sequence[Sequence[float]], targets: Sequence[float], weights: Sequence[float]
) -> list[float]:
    """The coefficients θ; refuses (one line) when the rows cannot separate the terms."""
    n = len(rows[0])
    normal = [
        [sum(w * r[i] * r[j] for r, w in zip(rows, weights, strict=True)) for j in range(n)]
        for i in range(n)
    ]
    right = [
        sum(w * r[i] * y for r, y, w in zip(rows, targets, weights, strict=True)) for i in range(n)
    ]
    return _solve(normal, right)


def _solve(matrix: list[list[float]], right: list[float]) -> list[float]:
    """Gaussian elimination with partial pivoting."""
    n = len(right)
    rows = [[*matrix[i], right[i]] for i in range(n)]
    scale = max(abs(x) for row in matrix for x in row) or 1.0
    for col in range(n):
        pivot = max(range(col, n), key=lambda r: abs(rows[r][col]))
        if abs(rows[pivot][col]) <= 1e-12 * scale:
            raise BadInputError("the measurements cannot separate the terms of the fit")
        rows[col], rows[pivot] = rows[pivot], rows[col]
        for r in range(n):
            if r != col:
                factor = rows[r][col] / rows[col][col]
                rows[r] = [x - factor * y for x, y in zip(rows[r], rows[col], strict=True)]
    return [rows[i][n] / rows[i][i] for i in range(n)]
