"""Memory-saving features chosen with the layout: recompute modules, BF16 moments, FP8 gather.

Three features trade memory for time or numerics, and each layout keeps the fastest
setting Megatron runs that fits (issue 32):

* ``recompute_modules`` (``--recompute-modules``, selective granularity only): a short
  nested chain (:func:`recompute_chain`), each set adding the modules that cost the least
  recompute time per byte they free: ``core_attn`` (Megatron's default; FlashAttention
  re-runs its softmax anyway), then the element-wise ``moe_act`` and ``layernorm``
  (no GEMM re-run), then ``mla_up_proj`` (MLA models: the up projections, small GEMMs
  whose outputs are the large per-head K/V), then ``shared_experts``, then ``mlp`` / ``moe``
  (whole MLP GEMMs re-run).  Along a nested chain the held activations only shrink and
  the recomputed work only grows (``tests/test_memory_feature_search.py`` checks both), so
  per layout the first set that fits is the fastest that fits: one cheap memory-only pass
  per set, no product over subsets.
* ``bf16_moments``: Megatron's precision-aware optimizer with both Adam moments in BF16
  (``--use-precision-aware-optimizer --exp-avg-dtype bf16 --exp-avg-sq-dtype bf16``): the
  optimizer state drops from 12 to 8 bytes per (sharded) parameter (fp32 master 4 + m 2
  + v 2; Megatron-Core ``OptimizerConfig.exp_avg_dtype``), and the step reads and writes
  8 fewer bytes per parameter (:func:`optimizer_step_bytes`).
* ``fp8_param_gather`` (FP8/FP4 training only): FP8 primary weights
  (``--fp8-param-gather``): no BF16 copy of the GEMM weights
  (:func:`parsearch.cost.memory.states`) and the DP parameter all-gather sends 1 byte per
  parameter instead of 2.

A fourth, ``activation_offload_layers`` (CPU activation offloading, Megatron
``--cpu-offloading-num-layers``), is chosen per layout after the others
(:func:`parsearch.cost.offload_choice.choose_offload`): only on layouts Megatron runs it with
(``pp = 1``, no recompute, :func:`parsearch.cost.offload.offload_allowed`), only where
the layout does not fit without it, and then at the fewest layers that make it fit (its
exposed copy time only grows with the layers, :mod:`parsearch.cost.offload`), solved from
the layer bytes instead of a scan.  A fifth, ``offload_modules`` (fine-grained activation
offloading, Megatron-Core 0.16 ``--offload-modules``), is chosen after it where asked for
(not in :data:`~parsearch.cost.options.DEFAULT_SEARCHED_FEATURES`;
:func:`parsearch.cost.offload_choice.choose_module_offload`).

BF16 moments and FP8 gather change the numerics, so they are taken only where a layout
needs them to fit, or where they make it faster by at least :data:`NUMERICS_MIN_GAIN`
(the modelled gain of a few milliseconds of optimizer step on a multi-second step is
below what the model resolves, and is no reason to change a run's numerics); the
launch settings and ``explain`` name them when chosen.  A user who does not want them
pins them off (``--no-bf16-moments``, ``--no-fp8-param-gather``).

Preconditions (NVIDIA/Megatron-LM at d98e8a64ddf34856e74b24714e3bedb2f5a39553):

* precision-aware optimizer: Adam only (``megatron/core/optimizer/optimizer_config.py``:
  "--use-precision-aware-optimizer only supported with adam") and the distributed optimizer
  (``megatron/core/optimizer/__init__.py``: "--use-precision-aware-optimizer only supported
  with distributed optimizer"); not searched under Megatron-FSDP;
* ``--fp8-param-gather``: FP8/FP4 training (``transformer_config.py``: "fp8_param must be
  used together with fp8 mode") and the distributed optimizer or FSDP
  (``megatron/training/arguments.py`` ``validate_args``: "--fp8-param-gather only supported
  with distributed optimizer, torch fsdp2, megatron fsdp");
* ``recompute_modules``: only with ``recompute_granularity == "selective"``; ``mla_up_proj``
  only with multi-latent attention, ``moe_act`` only with grouped-GEMM MoE, ``moe_act`` and
  ``layernorm`` not with FP8 delayed scaling, ``shared_experts`` not with
  ``--moe-shared-expert-overlap`` (``transformer_config.py`` ``__post_init__``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np

from parsearch.cost.cost_model import CostModel
from parsearch.cost.memory import memory_arrays
from parsearch.cost.offload import max_offload_layers
from parsearch.cost.options import CostOptions
from parsearch.cost.quantization import resolve_fp8_recipe
from parsearch.model.offload_modules import module_offload_chain
from parsearch.model.specs import RECOMPUTE_CODES, ModelSpec, TrainingSpec

#: The searched features this module chooses (besides those of ``feature_search``).
MEMORY_FEATURES: tuple[str, ...] = ("recompute_modules", "bf16_moments", "fp8_param_gather",
                                    "activation_offload_layers", "offload_modules")
#: Numerics-changing features are taken for speed only when they save at least this share of
#: the step (below it the modelled gain is within the model's resolution).
NUMERICS_MIN_GAIN = 0.01
#: Adam state bytes per parameter: fp32 master + fp32 m, v (12); with BF16 moments (8).
ADAM_FP32_STATE_BYTES = 12.0
ADAM_BF16_MOMENT_STATE_BYTES = 8.0
#: Bytes the optimizer step moves per sharded parameter at fp32 state: fp32 grad read (4),
#: master, m and v read and written (3 x 4 x 2), bf16 weight written (2)
#: (:data:`parsearch.cost.stage_time.OPTIMIZER_STEP_BYTES`).
_STEP_BYTES_FP32_STATE = 30.0

Score = Callable[..., dict[str, np.ndarray]]
#: ``choose_offload(cm, cols, out, best, best_fits, score, hbm)``, updating ``out``
OffloadChoice = Callable[[CostModel, dict[str, np.ndarray], dict[str, np.ndarray], np.ndarray,
                          np.ndarray, Score, float], None]


@dataclass(frozen=True)
class MemorySetting:
    """One setting of the memory-saving features."""

    recompute_modules: tuple[str, ...]
    bf16_moments: bool
    fp8_param_gather: bool
    #: layers whose activations go to host memory (0: none; chosen by
    #: :func:`parsearch.cost.offload_choice.choose_offload`)
    offload_layers: int = 0
    #: submodules whose inputs go to host memory (fine-grained offloading; chosen by
    #: :func:`parsearch.cost.offload_choice.choose_module_offload`)
    offload_modules: tuple[str, ...] = ()

    @property
    def numerics(self) -> int:
        """How many numerics-changing features the setting turns on."""
        return int(self.bf16_moments) + int(self.fp8_param_gather)


def optimizer_step_bytes(training: TrainingSpec) -> float:
    """Bytes the optimizer step moves per sharded parameter.

    Adam at 12 bytes of state: 30 (above); with BF16 moments (8 bytes of state) the two
    moments are read and written at 2 bytes instead of 4: 30 - 2 x 2 x 2 = 22.  Other
    optimizers and byte counts keep the fp32 figure.
    """
    if training.optimizer == "adam" and training.optimizer_bytes == ADAM_BF16_MOMENT_STATE_BYTES:
        return _STEP_BYTES_FP32_STATE - 2.0 * (ADAM_FP32_STATE_BYTES
                                               - ADAM_BF16_MOMENT_STATE_BYTES)
    return _STEP_BYTES_FP32_STATE


def effective_training(training: TrainingSpec, options: CostOptions) -> TrainingSpec:
    """``training`` with the memory features ``options`` chose applied (recompute modules,
    BF16 moments as 8 bytes of Adam state, offloaded layers)."""
    changes: dict[str, object] = {}
    if options.activation_offload_layers is not None and options.activation_offload_layers != \
            training.activation_offload_layers:
        changes["activation_offload_layers"] = options.activation_offload_layers
    if options.recompute_modules is not None and options.recompute_modules != \
            training.recompute_modules:
        changes["recompute_modules"] = options.recompute_modules
    if options.offload_modules is not None and options.offload_modules != \
            training.offload_modules:
        changes["offload_modules"] = options.offload_modules
    if options.bf16_moments and training.optimizer_bytes != ADAM_BF16_MOMENT_STATE_BYTES:
        changes["optimizer_bytes"] = ADAM_BF16_MOMENT_STATE_BYTES
    return replace(training, **changes) if changes else training  # type: ignore[arg-type]


def searches_memory_features(cm: CostModel) -> bool:
    """Whether ``cm`` chooses any memory feature per layout."""
    return bool(set(cm.options.search_features) & set(MEMORY_FEATURES))


def searches_offload(cm: CostModel) -> bool:
    """Whether ``cm`` chooses the offloaded layers per layout: searched, not pinned (in the
    training spec or the options), and no per-layer CUDA graphs pinned on (Megatron-Core:
    "CUDA graphs not supported with CPU offloading")."""
    options = cm.options
    graphs_pinned = (options.cuda_graphs and options.cuda_graph_impl != "full_iteration"
                     and "cuda_graphs" not in options.search_features)
    return ("activation_offload_layers" in options.search_features
            and cm.training.activation_offload_layers == 0
            and not cm.training.offload_modules  # --cpu-offloading excludes it (Megatron-Core)
            and options.activation_offload_layers is None and not graphs_pinned
            and max_offload_layers(cm.model) > 1)


def searches_module_offload(cm: CostModel) -> bool:
    """Whether ``cm`` chooses the fine-grained offload modules per layout: searched (the
    stack has it), not pinned (training spec or options), and no whole-layer offload pinned
    (Megatron-Core runs one of the two, never both; where both are searched each layout
    takes the faster that fits, :mod:`parsearch.cost.offload_choice`)."""
    options = cm.options
    return ("offload_modules" in options.search_features
            and not cm.training.offload_modules and options.offload_modules is None
            and cm.training.activation_offload_layers == 0
            and not options.activation_offload_layers)


def recompute_chain(model: ModelSpec, training: TrainingSpec, options: CostOptions,
                    compute_capability: float | None = None) -> tuple[tuple[str, ...], ...]:
    """The nested recompute-module sets a searched ``recompute_modules`` tries, cheapest first.

    Each set adds the modules of the next link the model has and Megatron accepts (module
    docstring); links that add nothing are dropped.

    >>> from parsearch.model.presets import get_preset
    >>> from parsearch.model.specs import TrainingSpec
    >>> t = TrainingSpec(seq_len=4096, global_batch=64)
    >>> recompute_chain(get_preset("llama3-8b"), t, CostOptions())
    (('core_attn',), ('core_attn', 'layernorm'), ('core_attn', 'layernorm', 'mlp'))
    """
    moe = model.moe
    delayed = (training.precision == "fp8"
               and resolve_fp8_recipe(options.fp8_recipe, compute_capability) == "delayed")
    dense_layers = moe is None or moe.first_k_dense > 0 or moe.layer_freq > 1
    shared = moe is not None and moe.shared_expert_ffn_hidden_size > 0
    links: list[tuple[str, ...]] = [
        ("core_attn",),
        # element-wise: no GEMM re-run; Megatron refuses both under FP8 delayed scaling
        () if delayed else (("moe_act",) if moe is not None else ()) + ("layernorm",),
        ("mla_up_proj",) if model.mla is not None else (),
        # not beside --moe-shared-expert-overlap (pinned on); searched: the overlap is
        # left out where this set is chosen (feature_search.runnable)
        ("shared_experts",) if shared and not (
            options.moe_shared_expert_overlap
            and "moe_shared_expert_overlap" not in options.search_features) else (),
        (("mlp",) if dense_layers else ())
        # the whole-MoE checkpoint leaves no expert input to offload: Megatron-Core refuses
        # it beside offloaded expert modules (parsearch.model.offload_modules)
        + (("moe",) if moe is not None and not {"expert_fc1", "moe_act"}
           & set(training.offload_modules) else ()),
    ]
    chain: list[tuple[str, ...]] = []
    current: tuple[str, ...] = ()
    for link in links:
        if link:
            current = current + link
            chain.append(current)
    return tuple(chain)


def bf16_moments_allowed(training: TrainingSpec) -> bool:
    """Whether Megatron runs the precision-aware optimizer with BF16 moments here."""
    return (training.optimizer == "adam" and training.distributed_optimizer
            and not training.fsdp and training.optimizer_bytes == ADAM_FP32_STATE_BYTES)


def fp8_param_gather_allowed(training: TrainingSpec) -> bool:
    """Whether Megatron gathers FP8 primary weights here (FP8/FP4; distributed optimizer)."""
    return training.precision != "bf16" and (training.distributed_optimizer or training.fsdp)


def memory_settings(cm: CostModel) -> tuple[tuple[MemorySetting, ...], ...]:
    """Per combination of the numerics features (the pinned one first), the recompute chain.

    Without a searched feature, one setting: what ``cm`` states.
    """
    searched = set(cm.options.search_features)
    training, options = cm.training, cm.options
    chain = (recompute_chain(cm.model, training, options, cm.fabric.gpu.compute_capability)
             if "recompute_modules" in searched and options.recompute_modules is None
             else (options.recompute_modules or training.recompute_modules,))
    bf16 = ((False, True) if "bf16_moments" in searched and bf16_moments_allowed(training)
            else (options.bf16_moments,))
    fp8 = ((options.memory.fp8_param_gather, True)
           if "fp8_param_gather" in searched and fp8_param_gather_allowed(training)
           and not options.memory.fp8_param_gather else (options.memory.fp8_param_gather,))
    return tuple(tuple(MemorySetting(mods, b, f) for mods in chain)
                 for b in bf16 for f in fp8)


def apply_setting(options: CostOptions, setting: MemorySetting) -> CostOptions:
    """``options`` with ``setting`` applied, the memory features no longer searched (those
    the search turned on named in ``chosen_features``)."""
    searched = set(options.search_features)
    chosen = tuple(name for name, on in (
        ("recompute_modules", "recompute_modules" in searched),
        ("bf16_moments", setting.bf16_moments and not options.bf16_moments),
        ("fp8_param_gather", setting.fp8_param_gather and not options.memory.fp8_param_gather),
        ("activation_offload_layers", setting.offload_layers > 0),
        ("offload_modules", bool(setting.offload_modules)))
        if on and name in searched)
    offload: dict[str, object] = ({"activation_offload_layers": setting.offload_layers}
                                  if setting.offload_layers > 0 else {})
    if setting.offload_modules:
        offload["offload_modules"] = setting.offload_modules
    return replace(
        options, **offload,  # type: ignore[arg-type]
        recompute_modules=setting.recompute_modules, bf16_moments=setting.bf16_moments,
        chosen_features=options.chosen_features + tuple(c for c in chosen
                                                        if c not in options.chosen_features),
        param_gather_bytes=1.0 if setting.fp8_param_gather else options.param_gather_bytes,
        memory=replace(options.memory, fp8_param_gather=setting.fp8_param_gather),
        search_features=tuple(f for f in options.search_features if f not in MEMORY_FEATURES))


def with_setting(cm: CostModel, setting: MemorySetting) -> CostModel:
    """``cm`` priced under ``setting`` (options, feature sets and training); kept on ``cm``,
    as a search asks for the same few settings many times."""
    priced = cm.derived.get(setting)
    if priced is None:
        options = apply_setting(cm.options, setting)
        priced = replace(cm, options=options, training=effective_training(cm.training, options),
                         variants=tuple(apply_setting(v, setting) for v in cm.variants))
        cm.derived[setting] = priced
    return priced


def first_fitting(cm: CostModel, chain: tuple[MemorySetting, ...], cols: dict[str, np.ndarray],
                  hbm: float) -> np.ndarray:
    """Per row, the index of the first chain setting whose memory fits, ``len(chain)`` if
    none does: memory only, under the base feature set (graphs off, no all-to-all overlap:
    the least memory of the feature sets).  Only selective-recompute rows move along the
    chain (recompute modules apply to selective granularity only)."""
    n = len(cols["tp"])
    first = np.full(n, len(chain), dtype=np.int64)
    pending = np.arange(n)
    for index, setting in enumerate(chain):
        if not len(pending):
            break
        sub = with_setting(cm, setting)
        c = {k: np.asarray(v)[pending] for k, v in cols.items()}
        mem = memory_arrays(sub.model, sub.training, c["tp"], c["cp"], c["pp"], c["ep"],
                            c["etp"], c["vpp"], c["mbs"], c["dp"], c["edp"], c["recompute"],
                            c["sp"], sub.options.memory)
        fits = np.asarray(mem.total, dtype=np.float64).reshape(-1) <= hbm
        first[pending[fits]] = index
        pending = pending[~fits]
        if index == 0:  # no recompute modules beyond the first for the other granularities
            pending = pending[c["recompute"][~fits] == RECOMPUTE_CODES["selective"]]
    return first


def score_memory_features(cm: CostModel, cols: dict[str, np.ndarray], with_memory: bool,
                          score: Score, hbm: float,
                          offload_choice: OffloadChoice | None = None) -> dict[str, np.ndarray]:
    """Scores with each layout's memory features chosen (module docstring).

    ``score(cm, cols, with_memory=...)`` scores under one setting (choosing the other
    features itself).  Time only: every layout under the pinned numerics at the cheapest
    recompute set, with ``tokens_per_s_bound`` an upper bound on its throughput under any
    setting.  With memory: per numerics combination, each row's first fitting
    chain set is priced in full; a row keeps the fastest that fits, each numerics-changing
    feature weighed as :data:`NUMERICS_MIN_GAIN` of the step (:func:`numerics_penalty`).
    ``memory_setting`` indexes :func:`memory_settings` flattened.  ``offload_choice``
    (:func:`parsearch.cost.offload_choice.choose_offload`) then chooses the offloaded layers
    where :func:`searches_offload`.
    """
    settings = memory_settings(cm)
    flat = [s for combo in settings for s in combo]
    if not with_memory:  # the pinned combination at the cheapest recompute set
        out = score(with_setting(cm, settings[0][0]), cols, with_memory=False)
        out["memory_setting"] = np.zeros(len(cols["tp"]), dtype=np.int64)
        share = _saving_share(settings)
        if share:
            step = np.asarray(out["step_time_s"], dtype=np.float64)
            save = share * (np.asarray(out["time_dp_comm"]) + np.asarray(out["time_optimizer"]))
            # no setting is faster than this: the numerics features only shrink the DP
            # gather and the optimizer step (max over stages of exposed DP + optimizer time)
            out["tokens_per_s_bound"] = (np.asarray(out["tokens_per_s"]) * step
                                         / np.maximum(step - save, 1e-30))
        return out
    cols = {k: np.asarray(v) for k, v in cols.items()}
    n = len(cols["tp"])
    out: dict[str, np.ndarray] = {}
    best = np.full(n, np.inf)
    best_fits = np.zeros(n, dtype=bool)
    best_numerics = np.zeros(n, dtype=np.int64)
    for ci, chain in enumerate(settings):
        numerics = chain[0].numerics
        if ci == 0:  # every row gets a price: where nothing fits, the least recompute-heavy
            rows = np.arange(n)
            first = np.minimum(first_fitting(cm, chain, cols, hbm), len(chain) - 1)
        else:  # only where the base may lose: it does not fit, this combination fits with less
            # recompute, or the DP + optimizer time it can shrink reaches the gain needed
            saveable = numerics_saving(cm, out)
            chain_index = np.asarray(out["memory_setting"]) % len(chain)
            may = (~best_fits | (best_numerics > 0) | (saveable >= NUMERICS_MIN_GAIN * best))
            rows = np.nonzero(may | (chain_index > 0))[0]
            first = first_fitting(cm, chain, {k: v[rows] for k, v in cols.items()}, hbm)
            keep = (first < len(chain)) & (may[rows] | (first < chain_index[rows]))
            rows, first = rows[keep], first[keep]
        if not len(rows):
            continue
        for index in np.unique(first):
            local = np.nonzero(first == index)[0]
            where = rows[local]
            part = score(with_setting(cm, chain[int(index)]),
                         {k: v[where] for k, v in cols.items()}, with_memory=True)
            part["memory_setting"] = np.full(len(local), flat.index(chain[int(index)]),
                                             dtype=np.int64)
            step = np.asarray(part["step_time_s"], dtype=np.float64)
            fits = np.asarray(part["fits"], dtype=bool)
            # each numerics-changing feature counts as NUMERICS_MIN_GAIN of the step more
            penalised = step * numerics_penalty(numerics)
            if ci == 0:
                take = np.ones(len(local), dtype=bool)
            else:
                take = fits & (~best_fits[where] | (penalised < best[where]))
            if not out:
                out = {k: (np.empty(n, dtype=np.asarray(v).dtype) if np.ndim(v)
                           else v) for k, v in part.items()}
            for key, values in part.items():
                if np.ndim(values) and key in out:
                    out[key][where[take]] = np.asarray(values)[take]
            best[where[take]] = penalised[take]
            best_fits[where[take]] = fits[take]
            best_numerics[where[take]] = numerics
    if n and offload_choice is not None and (searches_offload(cm)
                                             or searches_module_offload(cm)):
        offload_choice(cm, cols, out, best, best_fits, score, hbm)
    return out


def numerics_penalty(numerics: int) -> float:
    """The factor a setting's step is weighed by when choosing: each numerics-changing feature
    must save :data:`NUMERICS_MIN_GAIN` of the step to be taken for speed alone, so a row's
    choice minimises ``step * numerics_penalty(count)`` among the settings that fit (a total
    order: the choice is never beaten under it)."""
    return (1.0 / (1.0 - NUMERICS_MIN_GAIN)) ** numerics


def _saving_share(settings: tuple[tuple[MemorySetting, ...], ...]) -> float:
    """Share of the exposed DP + optimizer time the searched numerics features can save:
    FP8 gather up to all of it (bound), BF16 moments 8 of the step's 30 bytes per parameter
    (:func:`optimizer_step_bytes`)."""
    base = settings[0][0]
    if any(c[0].fp8_param_gather and not base.fp8_param_gather for c in settings):
        return 1.0
    if any(c[0].bf16_moments and not base.bf16_moments for c in settings):
        return 1.0 - optimizer_step_bytes_share()
    return 0.0


def optimizer_step_bytes_share() -> float:
    """BF16 moments' optimizer-step bytes over fp32 moments' (22 / 30)."""
    return (_STEP_BYTES_FP32_STATE - 2.0 * (ADAM_FP32_STATE_BYTES - ADAM_BF16_MOMENT_STATE_BYTES)
            ) / _STEP_BYTES_FP32_STATE


def needs_full_choice(cm: CostModel, timed: dict[str, np.ndarray], fits_base: np.ndarray
                      ) -> np.ndarray:
    """Which rows the base setting (pinned numerics, cheapest recompute set) may not be the
    choice of: it does not fit, or a numerics feature may save :data:`NUMERICS_MIN_GAIN`
    (``timed``: the time-only scores of :func:`score_memory_features`)."""
    return ~fits_base | (numerics_saving(cm, timed)
                         >= NUMERICS_MIN_GAIN * np.asarray(timed["step_time_s"]))


def numerics_saving(cm: CostModel, timed: dict[str, np.ndarray]) -> np.ndarray:
    """What the searched numerics features can save of a step priced without them, at the
    step's worst data-parallel stage: FP8 gather at most its exposed DP traffic, BF16 moments
    8 of the optimizer step's 30 bytes per parameter (:func:`optimizer_step_bytes`)."""
    settings = memory_settings(cm)
    base = settings[0][0]
    fp8 = any(c[0].fp8_param_gather and not base.fp8_param_gather for c in settings)
    bf16 = any(c[0].bf16_moments and not base.bf16_moments for c in settings)
    save = np.zeros(np.shape(timed["step_time_s"]))
    if fp8:
        save = save + np.asarray(timed["time_dp_comm"])
    if bf16:
        optimizer = np.maximum(np.asarray(timed["time_optimizer"])
                               - cm.profile.step_overhead_s / cm.profile.cluster_speed, 0.0)
        save = save + (1.0 - optimizer_step_bytes_share()) * optimizer
    return save


def setting_index(cm: CostModel, setting: MemorySetting) -> int:
    """The ``memory_setting`` index of ``setting``: its place among the flattened settings,
    plus ``len`` times its offloaded layers, plus ``len x (num_layers + 1)`` times the
    1-based place of its module set in :func:`~parsearch.model.offload_modules.module_offload_chain`
    (the inverse of :func:`setting_of`)."""
    flat = [s for combo in memory_settings(cm) for s in combo]
    base = flat.index(replace(setting, offload_layers=0, offload_modules=()))
    modules = 0
    if setting.offload_modules:
        modules = 1 + module_offload_chain(cm.model.moe is not None).index(
            setting.offload_modules)
    return base + len(flat) * (setting.offload_layers
                               + (cm.model.num_layers + 1) * modules)


def setting_of(cm: CostModel, index: int) -> MemorySetting:
    """The setting ``memory_setting`` ``index`` names (:func:`setting_index`)."""
    flat = [s for combo in memory_settings(cm) for s in combo]
    setting = flat[index % len(flat)]
    modules, layers = divmod(index // len(flat), cm.model.num_layers + 1)
    if modules:
        chain = module_offload_chain(cm.model.moe is not None)
        setting = replace(setting, offload_modules=chain[modules - 1])
    return replace(setting, offload_layers=layers) if layers else setting


__all__ = [
    "MEMORY_FEATURES",
    "NUMERICS_MIN_GAIN",
    "MemorySetting",
    "apply_setting",
    "bf16_moments_allowed",
    "effective_training",
    "first_fitting",
    "fp8_param_gather_allowed",
    "memory_settings",
    "needs_full_choice",
    "numerics_penalty",
    "numerics_saving",
    "optimizer_step_bytes",
    "recompute_chain",
    "score_memory_features",
    "searches_memory_features",
    "searches_module_offload",
    "searches_offload",
    "setting_index",
    "setting_of",
    "with_setting",
]
