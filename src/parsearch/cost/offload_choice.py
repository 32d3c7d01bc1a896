"""The offloaded layers chosen per layout when CPU activation offloading is searched.

:func:`choose_offload` runs after :func:`~parsearch.cost.memory_features.score_memory_features`
has chosen the other memory features (the caller hands it in: ``score_columns`` passes it
to that function), so this module builds on both :mod:`parsearch.cost.memory_features`
(the settings and their weighing) and :mod:`parsearch.cost.offload` (which layouts may
offload, and the fewest layers that fit), and neither of them imports it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import numpy as np

from parsearch.cost.cost_model import CostModel
from parsearch.cost.memory import memory_arrays
from parsearch.cost.memory_features import (
    MemorySetting,
    memory_settings,
    numerics_penalty,
    with_setting,
)
from parsearch.cost.offload import fewest_fitting_layers, offload_allowed


def _total(cm: CostModel, c: dict[str, np.ndarray]) -> np.ndarray:
    mem = memory_arrays(cm.model, cm.training, c["tp"], c["cp"], c["pp"], c["ep"], c["etp"],
                        c["vpp"], c["mbs"], c["dp"], c["edp"], c["recompute"], c["sp"],
                        cm.options.memory)
    return np.asarray(mem.total, dtype=np.float64).reshape(-1)


def choose_offload(cm: CostModel, cols: dict[str, np.ndarray], out: dict[str, np.ndarray],
                   best: np.ndarray, best_fits: np.ndarray,
                   score: Callable[..., dict[str, np.ndarray]], hbm: float) -> None:
    """Offloaded layers chosen per layout, updating ``out`` (the choice
    :func:`~parsearch.cost.memory_features.score_memory_features` made among the other
    settings) where a setting with offload wins.

    Per numerics combination, a layout Megatron offloads on (``offload_allowed``) that does
    not fit without offload under the combination's first set (its least memory: graphs off,
    no recompute modules apply without recompute) takes the fewest layers that make it fit
    (:func:`fewest_fitting_layers`): with the combination fixed, more
    layers only add exposed copy time, and where the layout fits without offload that setting
    was already priced and is faster.  Priced in full at that count (graphs are then off:
    ``feature_search.graphs_runnable``), it is taken where it fits and nothing chosen fits,
    or where it is faster under the numerics weighing
    (:func:`~parsearch.cost.memory_features.numerics_penalty`).  ``memory_setting`` then
    also carries the count (:func:`~parsearch.cost.memory_features.setting_of`).  A count
    whose activations the node's host memory cannot hold does not fit (the memory model's
    own check, :func:`parsearch.cost.offload.host_memory_fits`), so it is not taken.
    """
    allowed = np.nonzero(offload_allowed(cols))[0]
    flat = [s for combo in memory_settings(cm) for s in combo]
    for chain in memory_settings(cm):
        base = chain[0]
        priced = with_setting(cm, base)
        rows = allowed
        if not len(rows):
            return
        excess = _total(priced, {k: v[rows] for k, v in cols.items()}) - hbm
        rows, excess = rows[excess > 0], excess[excess > 0]
        if not len(rows):
            continue
        sub = {k: v[rows] for k, v in cols.items()}

        def over(k: int, at: np.ndarray, base: MemorySetting = base,
                 sub: dict[str, np.ndarray] = sub) -> np.ndarray:
            return _total(with_setting(cm, replace(base, offload_layers=k)),
                          {key: v[at] for key, v in sub.items()}) - hbm

        layers = fewest_fitting_layers(cm.model, priced.training, priced.options.memory, sub,
                                       excess, over)
        for k in np.unique(layers[layers < cm.model.num_layers]):
            where = rows[layers == k]
            part = score(with_setting(cm, replace(base, offload_layers=int(k))),
                         {key: v[where] for key, v in cols.items()}, with_memory=True)
            part["memory_setting"] = np.full(len(where), flat.index(base) + len(flat) * int(k),
                                             dtype=np.int64)
            fits = np.asarray(part["fits"], dtype=bool)
            penalised = np.asarray(part["step_time_s"], dtype=np.float64) * numerics_penalty(
                base.numerics)
            take = fits & (~best_fits[where] | (penalised < best[where]))
            for key, values in part.items():
                if np.ndim(values) and key in out:
                    out[key][where[take]] = np.asarray(values)[take]
            best[where[take]] = penalised[take]
            best_fits[where[take]] = True


__all__ = ["choose_offload"]
