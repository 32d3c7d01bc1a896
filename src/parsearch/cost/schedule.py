"""Pipeline schedule: how per-stage micro-batch times become a step time.

With ``p`` stages, ``m`` micro-batches and ``v`` model chunks per stage
(interleaving), 1F1B runs every micro-batch through the slowest stage once and
pays a fill/drain bubble of the other stages' work, divided by ``v``:

    t_pipe = m * max_r t_r + (sum_r t_r - max_r t_r) / v

For equal stages this is ``(m + (p - 1)/v) * t``, i.e. the bubble fraction
``(p - 1)/(v*m)`` of Narayanan et al. 2021 (arXiv 2104.04473, §2.2.1 for 1F1B,
§2.2.2 for interleaving); unequal stages (uneven splits, the embedding on the
first and the output layer on the last stage) make the slowest stage set the
pace, as in Calculon's ``_compute_batch_stats``.
"""

from __future__ import annotations

import numpy as np


def pipeline_time(stage_times: np.ndarray, num_microbatches: np.ndarray,
                  vpp: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(busy, bubble)`` seconds per step for rows of per-stage micro-batch times.

    ``stage_times`` has shape ``(rows, pp)``; ``busy = m * max_r t_r`` is the
    slowest stage's own work, ``bubble`` the idle fill/drain time on top.

    >>> busy, bubble = pipeline_time(np.array([[1.0, 1.0, 1.0, 1.0]]), np.array([8]), np.array([1]))
    >>> float(busy[0]), float(bubble[0])     # NAR21: bubble fraction (p-1)/m = 3/8
    (8.0, 3.0)
    >>> busy, bubble = pipeline_time(np.array([[1.0, 1.0, 1.0, 1.0]]), np.array([8]), np.array([3]))
    >>> float(bubble[0])                     # interleaved: (p-1)/(v*m) of the work
    1.0
    """
    slowest = stage_times.max(axis=1)
    busy = np.asarray(num_microbatches, dtype=np.float64) * slowest
    bubble = (stage_times.sum(axis=1) - slowest) / np.asarray(vpp, dtype=np.float64)
    return busy, bubble


def bubble_fraction(pp: int, vpp: int, num_microbatches: int) -> float:
    """NAR21's ideal bubble fraction ``(p-1)/(v*m)`` for equal stages.

    >>> bubble_fraction(pp=8, vpp=1, num_microbatches=64)
    0.109375
    """
    return (pp - 1) / (vpp * num_microbatches)
