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
    first_fitting,
    memory_settings,
    numerics_penalty,
    searches_module_offload,
    searches_offload,
    setting_index,
    with_setting,
)
from parsearch.cost.offload import fewest_fitting_layers, offload_allowed
from parsearch.model.offload_modules import (
    graph_conflict,
    module_offload_chain,
    offload_allowed_with,
)
from parsearch.model.specs import RECOMPUTE_CODES


def _total(cm: CostModel, c: dict[str, np.ndarray]) -> np.ndarray:
    mem = memory_arrays(cm.model, cm.training, c["tp"], c["cp"], c["pp"], c["ep"], c["etp"],
                        c["vpp"], c["mbs"], c["dp"], c["edp"], c["recompute"], c["sp"],
                        cm.options.memory)
    return np.asarray(mem.total, dtype=np.float64).reshape(-1)


def choose_offload(cm: CostModel, cols: dict[str, np.ndarray], out: dict[str, np.ndarray],
                   best: np.ndarray, best_fits: np.ndarray,
                   score: Callable[..., dict[str, np.ndarray]], hbm: float) -> None:
    """Whole-layer offload (:func:`choose_offload_layers`), then fine-grained module offload
    (:func:`choose_module_offload`), each where searched; a layout keeps the faster that
    fits."""
    if searches_offload(cm):
        choose_offload_layers(cm, cols, out, best, best_fits, score, hbm)
    if searches_module_offload(cm):
        choose_module_offload(cm, cols, out, best, best_fits, score, hbm)


def choose_offload_layers(cm: CostModel, cols: dict[str, np.ndarray],
                          out: dict[str, np.ndarray], best: np.ndarray, best_fits: np.ndarray,
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
            _merge(out, best, best_fits, part, where, base.numerics)


def choose_module_offload(cm: CostModel, cols: dict[str, np.ndarray],
                          out: dict[str, np.ndarray], best: np.ndarray, best_fits: np.ndarray,
                          score: Callable[..., dict[str, np.ndarray]], hbm: float) -> None:
    """Fine-grained offload modules chosen per layout, updating ``out`` where a setting with
    them wins (Megatron-Core ``--fine-grained-activation-offloading --offload-modules``).

    Offloading module inputs only adds copy time (hidden behind the layer's compute up to
    the host link's rate, :mod:`parsearch.cost.offload`) and frees activations, while a
    recompute module always re-runs its work; so module offload can win only where memory
    forced something slower: a layout that fits under no setting, needs a longer
    recompute-module set than the cheapest, or offloads whole layers.  Each such layout gets
    one candidate recompute set, priced with the fewest modules of
    :func:`~parsearch.model.offload_modules.module_offload_chain` that fit beside it:

    * where nothing fits (or whole layers are offloaded), the cheapest set that fits with
      every module offloaded (:func:`first_fitting`), in the first numerics combination
      reaching it (the fewest numerics features);
    * where the choice fits, the set one cheaper than its own, in its numerics combination
      (chosen to fit or for speed; module offload leaves model state and DP traffic as they
      are), and while that wins one cheaper again: each step swaps re-run work for bytes to
      copy, and stops paying once the copies outrun the layer.

    A set with ``moe`` recompute takes no expert module (Megatron-Core refuses the pair).
    The candidate is taken where it fits and nothing chosen fits, or where it is faster
    under the numerics weighing.  Fully recomputed layouts save no module input and are
    left as they are.
    """
    settings = memory_settings(cm)
    flat = [s for combo in settings for s in combo]
    chain_len = len(settings[0])
    index = np.asarray(out["memory_setting"], dtype=np.int64)
    position = (index % len(flat)) % chain_len
    layers = index // len(flat)
    rows = np.nonzero((~best_fits | (position > 0) | (layers > 0))
                      & (np.asarray(cols["recompute"]) != RECOMPUTE_CODES["full"]))[0]
    if not len(rows):
        return
    sets = module_offload_chain(cm.model.moe is not None)
    current = (index[rows] % len(flat)) // chain_len
    fitting = best_fits[rows] & (layers[rows] == 0)
    # the candidate set and combination (docstring): where the choice fits, one set cheaper
    # in its combination; elsewhere the cheapest set that fits with every module offloaded
    combo_of = current.copy()
    next_k = np.where(fitting, position[rows] - 1, -1)
    loose = np.nonzero(~fitting)[0]
    if len(loose):
        sub = {k: np.asarray(v)[rows[loose]] for k, v in cols.items()}
        reach = np.full((len(loose), len(settings)), chain_len, dtype=np.int64)
        for ci, chain in enumerate(settings):
            most = _with_modules(chain, sets[-1])
            first = first_fitting(cm, most, sub, hbm)
            reach[first < len(most), ci] = first[first < len(most)]
        cheapest = reach.min(axis=1)
        combo_of[loose] = np.argmax(reach == cheapest[:, None], axis=1)
        next_k[loose] = np.where(cheapest < chain_len, cheapest, -1)
    sub = {k: np.asarray(v)[rows] for k, v in cols.items()}
    for k in range(chain_len - 1, -1, -1):
        for ci, chain in enumerate(settings):
            group = np.nonzero((next_k == k) & (combo_of == ci))[0]
            taken = np.zeros(len(group), dtype=bool)
            todo = np.arange(len(group))
            # at that recompute set, the fewest modules that fit
            for modules in sets:
                if not len(todo) or not offload_allowed_with(chain[k].recompute_modules,
                                                             modules):
                    break
                setting = replace(chain[k], offload_modules=modules)
                fits = first_fitting(cm, (setting,), {key: v[group[todo]] for key, v
                                                      in sub.items()}, hbm) == 0
                if fits.any():
                    taken[todo[fits]] = _take(cm, cols, out, best, best_fits, score, setting,
                                              rows[group[todo[fits]]])
                todo = todo[~fits]
            # a fitting layout whose step won goes one set cheaper again
            next_k[group] = np.where(taken & fitting[group] & (k > 0), k - 1, -1)


def _with_modules(chain: tuple[MemorySetting, ...], modules: tuple[str, ...]
                  ) -> tuple[MemorySetting, ...]:
    """``chain`` with ``modules`` offloaded, up to the first set Megatron-Core refuses them
    beside (the ``moe`` recompute link, the chain's last, with expert modules)."""
    out: list[MemorySetting] = []
    for setting in chain:
        if not offload_allowed_with(setting.recompute_modules, modules):
            break
        out.append(replace(setting, offload_modules=modules))
    return tuple(out)


def _take(cm: CostModel, cols: dict[str, np.ndarray], out: dict[str, np.ndarray],
          best: np.ndarray, best_fits: np.ndarray, score: Callable[..., dict[str, np.ndarray]],
          setting: MemorySetting, where: np.ndarray) -> np.ndarray:
    """Price rows ``where`` under ``setting`` and keep it where it fits and nothing chosen
    does, or where it is faster under the numerics weighing; returns where it was kept.

    Each row is priced with the features it was priced with (dispatcher, overlaps, CUDA
    graphs: ``feature_variant``) where they run beside the offloaded modules, instead of
    choosing them again: module offload changes what each layer holds and copies, not what
    those features cost, and DeepSeek-V3's layouts have 21 feature sets to price.  A row
    with no fitting choice that does not fit under its set chooses its features as any
    layout does (a leaner set may fit)."""
    priced = with_setting(cm, setting)
    index = setting_index(cm, setting)
    variant = (np.asarray(out["feature_variant"])[where]
               if "feature_variant" in out and priced.variants else None)
    rest = np.arange(len(where))
    taken = np.zeros(len(where), dtype=bool)
    if variant is not None:
        for v in np.unique(variant):
            options = priced.variants[int(v)]
            if options.cuda_graphs and graph_conflict(
                    setting.offload_modules, options.cuda_graph_impl, options.cuda_graph_scope):
                continue
            local = np.nonzero(variant == v)[0]
            fixed = replace(priced, options=replace(options, search_features=()), variants=())
            fits, taken[local] = _keep(cols, out, best, best_fits, score, setting, index, fixed,
                                       where[local], int(v))
            # a layout with nothing fitting may fit under a leaner feature set: it chooses
            rest = np.setdiff1d(rest, local[fits | best_fits[where[local]]])
    if len(rest):
        _, taken[rest] = _keep(cols, out, best, best_fits, score, setting, index, priced,
                               where[rest], None)
    return taken


def _keep(cols: dict[str, np.ndarray], out: dict[str, np.ndarray], best: np.ndarray,
          best_fits: np.ndarray, score: Callable[..., dict[str, np.ndarray]],
          setting: MemorySetting, index: int, priced: CostModel, at: np.ndarray,
          variant: int | None) -> tuple[np.ndarray, np.ndarray]:
    """Price rows ``at`` with ``priced`` (``setting``, ``memory_setting`` ``index``;
    ``variant``: the one feature set it prices) and keep it where :func:`_take` would;
    returns where it fits and where it was kept."""
    part = score(priced, {key: np.asarray(c)[at] for key, c in cols.items()}, with_memory=True)
    part["memory_setting"] = np.full(len(at), index, dtype=np.int64)
    if variant is not None:
        part["feature_variant"] = np.full(len(at), variant, dtype=np.int64)
    return _merge(out, best, best_fits, part, at, setting.numerics)


def _merge(out: dict[str, np.ndarray], best: np.ndarray, best_fits: np.ndarray,
           part: dict[str, np.ndarray], at: np.ndarray,
           numerics: int) -> tuple[np.ndarray, np.ndarray]:
    """Write ``part`` (rows ``at`` priced under one setting with ``numerics`` numerics
    features) into ``out`` where it fits and nothing chosen does, or where it is faster
    under the numerics weighing; returns where it fits and where it was written."""
    fits = np.asarray(part["fits"], dtype=bool)
    penalised = np.asarray(part["step_time_s"], dtype=np.float64) * numerics_penalty(numerics)
    take = fits & (~best_fits[at] | (penalised < best[at]))
    for key, values in part.items():
        if np.ndim(values) and key in out:
            out[key][at[take]] = np.asarray(values)[take]
    best[at[take]] = penalised[take]
    best_fits[at[take]] = True
    return fits, take


__all__ = ["choose_module_offload", "choose_offload", "choose_offload_layers"]
