"""Non-dominated sorting and hypervolume for two objectives, in plain numpy.

Objectives are columns of an ``(n, 2)`` array; ``minimize`` says, per
column, whether smaller is better.  Internally everything is turned into
minimization (maximized columns are negated), so the functions below never
branch on direction.

>>> import numpy as np
>>> gpus = np.array([8, 16, 16, 32])
>>> tokens = np.array([1.0, 1.8, 1.5, 1.7])
>>> pareto_mask(np.stack([gpus, tokens], axis=1), minimize=(True, False)).tolist()
[True, True, False, False]
>>> hypervolume(np.stack([gpus, tokens], axis=1), reference=(40, 0.0), minimize=(True, False))
51.2
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from parsearch.errors import SpecError


def _as_minimization(values: np.ndarray, minimize: Sequence[bool]) -> np.ndarray:
    points = np.asarray(values, dtype=np.float64)
    if points.ndim != 2 or points.shape[1] != 2:
        raise SpecError(f"pareto: expected an (n, 2) array of objectives, got shape {points.shape}")
    if len(minimize) != 2:
        raise SpecError(f"pareto: minimize needs 2 flags, got {len(minimize)}")
    signs = np.array([1.0 if flag else -1.0 for flag in minimize])
    return points * signs


def pareto_mask(values: np.ndarray, *, minimize: Sequence[bool] = (True, True)) -> np.ndarray:
    """Boolean mask of the non-dominated rows of ``values`` (shape ``(n, 2)``).

    A row is dominated when another row is at least as good in both
    objectives and strictly better in one.  Of several identical
    non-dominated rows only the first is kept, so the front has no
    duplicates.  O(n log n): sort by the first objective, sweep the second.
    """
    points = _as_minimization(values, minimize)
    n = len(points)
    mask = np.zeros(n, dtype=bool)
    if n == 0:
        return mask
    order = np.lexsort((np.arange(n), points[:, 1], points[:, 0]))
    best_second = np.inf
    for i in order:
        if points[i, 1] < best_second:
            mask[i] = True
            best_second = points[i, 1]
    return mask


def pareto_front_indices(values: np.ndarray, *,
                         minimize: Sequence[bool] = (True, True)) -> np.ndarray:
    """Indices of the non-dominated rows, sorted by the first objective (best first)."""
    points = _as_minimization(values, minimize)
    idx = np.nonzero(pareto_mask(values, minimize=minimize))[0]
    return idx[np.argsort(points[idx, 0], kind="stable")]


def dominates(a: Sequence[float], b: Sequence[float], *,
              minimize: Sequence[bool] = (True, True)) -> bool:
    """True when point ``a`` dominates point ``b``.

    >>> dominates((8, 2.0), (16, 1.0), minimize=(True, False))
    True
    >>> dominates((8, 2.0), (8, 2.0), minimize=(True, False))
    False
    """
    pa, pb = _as_minimization(np.array([a, b]), minimize)
    return bool(np.all(pa <= pb) and np.any(pa < pb))


def hypervolume(values: np.ndarray, *, reference: Sequence[float],
                minimize: Sequence[bool] = (True, True)) -> float:
    """Area dominated by ``values`` and bounded by ``reference`` (2 objectives).

    Points that do not strictly improve on the reference in both
    objectives contribute nothing.  The reference is in the same units and
    directions as ``values``.
    """
    points = _as_minimization(values, minimize)
    ref = _as_minimization(np.asarray([reference], dtype=np.float64), minimize)[0]
    inside = np.all(points < ref, axis=1)
    points = points[inside]
    if len(points) == 0:
        return 0.0
    front = points[pareto_mask(points)]
    front = front[np.argsort(front[:, 0], kind="stable")]
    # Sweep in the first objective: each point owns the slab up to the next point.
    widths = np.diff(np.append(front[:, 0], ref[0]))
    heights = ref[1] - front[:, 1]
    return float(np.sum(widths * heights))


__all__ = ["dominates", "hypervolume", "pareto_front_indices", "pareto_mask"]
