"""The layout rules R1–R11 of ``shared/spec/layout-space.md``, each written once.

Every rule is a :class:`Rule`: the axes it reads, a predicate and a message.
The predicate works elementwise on numpy arrays *and* on plain ints, so the
same code serves two callers:

* :func:`check_layout` evaluates every rule on one :class:`Layout` and returns
  :class:`Violation` values that name the values and the fix;
* :mod:`parsearch.layout.space` applies each rule as soon as the enumerator has
  assigned the axes it reads, pruning whole blocks of the space at once.

Derived columns (``dp``, ``edp``, ``m``) are computed by :func:`derive_columns`
and are 0 where the layout is not even well-formed enough to define them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np

from parsearch.errors import Violation
from parsearch.layout import Layout
from parsearch.layout.rank_split import rank_split
from parsearch.model.specs import RECOMPUTE_CODES, RECOMPUTE_MODES, ModelSpec, TrainingSpec

Columns = Mapping[str, np.ndarray]



@dataclass(frozen=True)
class RuleContext:
    """The workload facts the rules read (one model, setup and world size)."""

    num_gpus: int
    num_layers: int
    num_heads: int
    query_groups: int
    dense_ffn: int  # 0 when the model has no dense MLP layer
    num_experts: int  # 0 for a dense model
    expert_ffn: int  # 0 for a dense model
    seq_len: int
    global_batch: int
    pipeline_split: str
    micro_batch_sizes: tuple[int, ...]
    recompute_codes: tuple[int, ...]
    sequence_parallel: str
    max_vpp: int | None
    model_name: str
    max_cp: int | None = None
    activation_offload_layers: int = 0
    experts_follow_tp: bool = False
    min_interleaved_pp: int = 2

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0


def rule_context(model: ModelSpec, training: TrainingSpec, num_gpus: int) -> RuleContext:
    """Collect what the rules need from the specs."""
    moe = model.moe
    return RuleContext(
        num_gpus=num_gpus,
        num_layers=model.num_layers,
        num_heads=model.num_attention_heads,
        query_groups=model.gqa_query_groups,
        dense_ffn=model.ffn_hidden_size if model.has_dense_mlp else 0,
        num_experts=moe.num_experts if moe else 0,
        expert_ffn=moe.expert_ffn_hidden_size if moe else 0,
        seq_len=training.seq_len,
        global_batch=training.global_batch,
        pipeline_split=training.pipeline_split,
        micro_batch_sizes=tuple(training.micro_batch_sizes),
        recompute_codes=tuple(RECOMPUTE_CODES[m] for m in training.recompute_modes),
        sequence_parallel=training.sequence_parallel,
        max_vpp=training.max_vpp,
        model_name=model.name,
        max_cp=training.max_cp,
        activation_offload_layers=training.activation_offload_layers,
        experts_follow_tp=training.experts_follow_tp,
        min_interleaved_pp=training.min_interleaved_pp,
    )


def derive_columns(ctx: RuleContext, cols: Columns) -> dict[str, np.ndarray]:
    """``dp``, ``edp`` and ``m`` from the assigned axes (0 where undefined).

    dp = N / (tp*cp*pp) and edp = N / (pp*ep*etp) (spec "Derived quantities"),
    except that a dense model has edp = dp (spec R3);
    m = B / (mbs*dp) (rule R10).
    """
    out: dict[str, np.ndarray] = {}
    n = ctx.num_gpus
    if {"tp", "cp", "pp"} <= cols.keys():
        model = np.asarray(cols["tp"]) * cols["cp"] * cols["pp"]
        out["dp"] = np.where(n % model == 0, n // model, 0)
    if {"pp", "ep", "etp"} <= cols.keys():
        expert = np.asarray(cols["pp"]) * cols["ep"] * cols["etp"]
        out["edp"] = np.where(n % expert == 0, n // expert, 0)
        if not ctx.is_moe and "dp" in out:  # a dense model has edp = dp (spec R3)
            out["edp"] = out["dp"]
    if "dp" in out and "mbs" in cols:
        per_step = np.asarray(cols["mbs"]) * out["dp"]
        safe = np.where(per_step > 0, per_step, 1)
        out["m"] = np.where(
            (per_step > 0) & (ctx.global_batch % safe == 0), ctx.global_batch // safe, 0
        )
    return out


def _divides(divisor: np.ndarray | int, value: int) -> np.ndarray:
    divisor = np.asarray(divisor)
    safe = np.where(divisor > 0, divisor, 1)
    return (divisor > 0) & (value % safe == 0)


def _valid_values(limit: int, holds: Callable[[int], bool]) -> str:
    values = [v for v in range(1, limit + 1) if holds(v)]
    if len(values) > 12:
        values = [*values[:11], "..."]
    return ", ".join(str(v) for v in values) or "none"


# --- the rules ------------------------------------------------------------------------------


def _r1_holds(ctx: RuleContext, c: Columns) -> np.ndarray:
    ok = np.asarray(True)
    for axis in ("tp", "pp", "cp", "ep", "etp", "vpp", "mbs"):
        ok = ok & (np.asarray(c[axis]) >= 1)
    return ok


def _r1_message(ctx: RuleContext, c: Columns) -> str:
    bad = [f"{a}={int(c[a])}" for a in ("tp", "pp", "cp", "ep", "etp", "vpp", "mbs") if c[a] < 1]
    return f"every size must be a positive integer; got {', '.join(bad)}"


def _r2_holds(ctx: RuleContext, c: Columns) -> np.ndarray:
    # layout-space R2: N = tp*cp*dp*pp (Megatron-Core initialize_model_parallel)
    return _divides(np.asarray(c["tp"]) * c["cp"] * c["pp"], ctx.num_gpus)


def _r2_message(ctx: RuleContext, c: Columns) -> str:
    product = int(c["tp"]) * int(c["cp"]) * int(c["pp"])
    return (
        f"gpus={ctx.num_gpus} is not a multiple of tp*cp*pp="
        f"{int(c['tp'])}*{int(c['cp'])}*{int(c['pp'])}={product}, so dp is not an integer; "
        f"use a GPU count that is a multiple of {product}"
    )


def _r3_holds(ctx: RuleContext, c: Columns) -> np.ndarray:
    # layout-space R3: N = etp*ep*edp*pp (MoE parallel folding, arXiv 2504.14960);
    # a dense model has no expert mesh (edp = dp), so R2 already covers it.
    if not ctx.is_moe:
        return np.asarray(True)
    return _divides(np.asarray(c["pp"]) * c["ep"] * c["etp"], ctx.num_gpus)


def _r3_message(ctx: RuleContext, c: Columns) -> str:
    product = int(c["pp"]) * int(c["ep"]) * int(c["etp"])
    return (
        f"gpus={ctx.num_gpus} is not a multiple of pp*ep*etp="
        f"{int(c['pp'])}*{int(c['ep'])}*{int(c['etp'])}={product}, so edp is not an integer"
    )


def _r4_holds(ctx: RuleContext, c: Columns) -> np.ndarray:
    tp = np.asarray(c["tp"])
    heads = _divides(tp, ctx.num_heads)
    groups = _divides(tp, ctx.query_groups) | (tp % ctx.query_groups == 0)
    ffn = _divides(tp, ctx.dense_ffn) if ctx.dense_ffn else np.asarray(True)
    return heads & groups & ffn


def _r4_message(ctx: RuleContext, c: Columns) -> str:
    tp = int(c["tp"])
    reasons = []
    if ctx.num_heads % tp:
        reasons.append(f"num_attention_heads={ctx.num_heads} is not divisible by tp={tp}")
    if ctx.query_groups % tp and tp % ctx.query_groups:
        reasons.append(
            f"num_query_groups={ctx.query_groups} and tp={tp} do not divide one another"
        )
    if ctx.dense_ffn and ctx.dense_ffn % tp:
        reasons.append(f"ffn_hidden_size={ctx.dense_ffn} is not divisible by tp={tp}")
    valid = _valid_values(
        min(ctx.num_heads, ctx.num_gpus), lambda t: bool(_r4_holds(ctx, {"tp": np.asarray(t)}))
    )
    return f"{'; '.join(reasons)} (model {ctx.model_name}); valid tp: {valid}"


def _r5_holds(ctx: RuleContext, c: Columns) -> np.ndarray:
    ep, etp = np.asarray(c["ep"]), np.asarray(c["etp"])
    if not ctx.is_moe:
        return (ep == 1) & (etp == 1)
    return _divides(ep, ctx.num_experts) & _divides(etp, ctx.expert_ffn)


def _r5_message(ctx: RuleContext, c: Columns) -> str:
    ep, etp = int(c["ep"]), int(c["etp"])
    if not ctx.is_moe:
        return (
            f"model {ctx.model_name} is dense, so ep and etp must be 1; got ep={ep}, etp={etp}"
        )
    reasons = []
    if ctx.num_experts % ep:
        valid = _valid_values(ctx.num_experts, lambda e: ctx.num_experts % e == 0)
        reasons.append(
            f"num_experts={ctx.num_experts} is not divisible by ep={ep} (valid ep: {valid})"
        )
    if ctx.expert_ffn % etp:
        reasons.append(f"expert ffn_hidden_size={ctx.expert_ffn} is not divisible by etp={etp}")
    return "; ".join(reasons)


def _r6_holds(ctx: RuleContext, c: Columns) -> np.ndarray:
    # Megatron-Core arguments.py: seq_length % (2*cp) == 0 (load-balanced causal split)
    cp = np.asarray(c["cp"])
    return (cp == 1) | _divides(2 * cp, ctx.seq_len)


def _r6_message(ctx: RuleContext, c: Columns) -> str:
    cp = int(c["cp"])
    return (
        f"seq_len={ctx.seq_len} is not divisible by 2*cp={2 * cp} "
        "(context parallelism splits each sequence into 2*cp chunks)"
    )


def _r7_holds(ctx: RuleContext, c: Columns) -> np.ndarray:
    sp, tp, cp = np.asarray(c["sp"]), np.asarray(c["tp"]), np.asarray(c["cp"])
    safe_cp = np.where(cp > 0, cp, 1)
    local_seq = ctx.seq_len // safe_cp
    ok = (tp > 1) & (ctx.seq_len % safe_cp == 0) & (local_seq % np.where(tp > 0, tp, 1) == 0)
    return ~sp.astype(bool) | ok


def _r7_message(ctx: RuleContext, c: Columns) -> str:
    tp, cp = int(c["tp"]), int(c["cp"])
    if tp == 1:
        return "sp=true needs tp > 1 (Megatron-Core turns sequence parallelism off at tp=1)"
    return (
        f"sp=true needs (seq_len/cp) % tp == 0; seq_len={ctx.seq_len}, cp={cp}, tp={tp}"
    )


def _r8_holds(ctx: RuleContext, c: Columns) -> np.ndarray:
    stages = np.asarray(c["pp"]) * c["vpp"]
    if ctx.pipeline_split == "even":
        return _divides(stages, ctx.num_layers)
    if ctx.pipeline_split == "first-last":  # the splits Megatron-Core <= 0.12 builds
        pp, vpp = np.asarray(c["pp"]), np.asarray(c["vpp"])
        pairs, inverse = np.unique(np.stack([pp.ravel(), vpp.ravel()]), axis=1,
                                   return_inverse=True)
        ok = np.array([rank_split(ctx.num_layers, int(p), int(v)) is not None
                       if p >= 1 and v >= 1 else False for p, v in pairs.T], dtype=bool)
        return ok[inverse.ravel()].reshape(pp.shape)
    # layout-space R8 uneven: the embedding and the loss may each take a virtual stage of
    # their own (Megatron account_for_embedding/loss_in_pipeline_split), so pp*vpp <= L+2.
    return stages <= ctx.num_layers + 2


def _r8_message(ctx: RuleContext, c: Columns) -> str:
    pp, vpp = int(c["pp"]), int(c["vpp"])
    if ctx.pipeline_split == "even":
        valid = _valid_values(ctx.num_layers, lambda p: ctx.num_layers % (p * vpp) == 0)
        return (
            f"pp*vpp={pp}*{vpp}={pp * vpp} must divide num_layers={ctx.num_layers} of model "
            f"{ctx.model_name} with --pipeline-split even; valid pp (vpp={vpp}): {valid}; "
            "or use --pipeline-split uneven"
        )
    if ctx.pipeline_split == "first-last":
        valid = _valid_values(ctx.num_layers,
                              lambda p: rank_split(ctx.num_layers, p, vpp) is not None)
        return (
            f"pp={pp} with vpp={vpp}: Megatron-Core <= 0.12 builds no split of num_layers="
            f"{ctx.num_layers} of model {ctx.model_name} (every rank's layers must divide "
            f"by vpp: L/pp each, the embedding or loss counted as a layer, or other counts "
            f"on the first and last rank); valid pp (vpp={vpp}): {valid}; or use "
            "--pipeline-split uneven with a Megatron-Core that takes layout strings"
        )
    limit = ctx.num_layers + 2
    valid = _valid_values(limit, lambda p: p * vpp <= limit)
    return (
        f"pp*vpp={pp}*{vpp}={pp * vpp} exceeds num_layers+2={ctx.num_layers}+2={limit} of "
        f"model {ctx.model_name}: every virtual pipeline stage needs at least one unit "
        f"(a layer, the embedding or the loss); valid pp (vpp={vpp}): {valid}, "
        f"or a smaller vpp (at most {max(limit // pp, 1)} with pp={pp})"
    )


def _r9_holds(ctx: RuleContext, c: Columns) -> np.ndarray:
    # NAR21 §2.2.2: interleaving needs pp > 1 and m a multiple of pp
    # (Megatron-LM before 3ee489d9ea, 2024-05-31: pp > 2, ``TrainingSpec.min_interleaved_pp``)
    vpp, pp, m = np.asarray(c["vpp"]), np.asarray(c["pp"]), np.asarray(c["m"])
    return (vpp == 1) | ((pp >= max(ctx.min_interleaved_pp, 2)) & (m > 0)
                         & (m % np.where(pp > 0, pp, 1) == 0))


def _r9_message(ctx: RuleContext, c: Columns) -> str:
    vpp, pp, m = int(c["vpp"]), int(c["pp"]), int(c["m"])
    if pp == 1:
        return f"vpp={vpp} needs pp > 1 (interleaving splits pipeline stages)"
    if pp < ctx.min_interleaved_pp:
        return (f"vpp={vpp} needs pp >= {ctx.min_interleaved_pp} on this software stack "
                "(Megatron-LM before 2024-05-31: \"pipeline-model-parallel size should be "
                "greater than 2 with interleaved schedule\"); use vpp=1 or a larger pp")
    return f"vpp={vpp} needs the micro-batch count m={m} to be a multiple of pp={pp}"


def _r10_holds(ctx: RuleContext, c: Columns) -> np.ndarray:
    return np.asarray(c["m"]) >= 1


def _r10_message(ctx: RuleContext, c: Columns) -> str:
    mbs, dp = int(c["mbs"]), int(c["dp"])
    if dp == 0:
        return "dp is undefined (see R2), so the micro-batch count is undefined"
    return (
        f"global_batch={ctx.global_batch} is not a positive multiple of mbs*dp={mbs}*{dp}="
        f"{mbs * dp}; choose a global batch that is a multiple of {mbs * dp} or a smaller "
        "mbs or dp"
    )


def _sp_allowed(ctx: RuleContext, sp: np.ndarray, tp: np.ndarray) -> np.ndarray:
    if ctx.sequence_parallel == "on":  # sp exactly where tp > 1
        return sp == (tp > 1)
    if ctx.sequence_parallel == "off":
        return ~sp
    return np.ones_like(sp, dtype=bool)


def _r11_holds(ctx: RuleContext, c: Columns) -> np.ndarray:
    # layout-space R11: the user's candidate sets (micro-batch sizes, recompute modes),
    # plus those the CLI or a software stack adds: the sequence-parallel choice and caps
    # on vpp and cp.
    mbs, rec = np.asarray(c["mbs"]), np.asarray(c["recompute"])
    ok = np.isin(mbs, ctx.micro_batch_sizes) & np.isin(rec, ctx.recompute_codes)
    ok = ok & _sp_allowed(ctx, np.asarray(c["sp"]).astype(bool), np.asarray(c["tp"]))
    if ctx.max_vpp is not None:
        ok = ok & (np.asarray(c["vpp"]) <= ctx.max_vpp)
    if ctx.max_cp is not None:
        ok = ok & (np.asarray(c["cp"]) <= ctx.max_cp)
    if ctx.activation_offload_layers:
        # Megatron-Core TransformerConfig.__post_init__ (d98e8a64): CPU offloading "is not
        # supported with pipeline parallelism" nor with "activation recomputation".
        ok = ok & (np.asarray(c["pp"]) == 1) & (rec == RECOMPUTE_CODES["none"])
    return ok


def _r11_message(ctx: RuleContext, c: Columns) -> str:
    mbs, rec = int(c["mbs"]), int(c["recompute"])
    reasons = []
    if mbs not in ctx.micro_batch_sizes:
        reasons.append(
            f"mbs={mbs} is not among the micro-batch candidates "
            f"{','.join(map(str, ctx.micro_batch_sizes))} (--micro-batch-sizes)"
        )
    if rec not in ctx.recompute_codes:
        allowed = ", ".join(RECOMPUTE_MODES[r] for r in ctx.recompute_codes)
        reasons.append(f"recompute={RECOMPUTE_MODES[rec]} is not among the allowed: {allowed}")
    sp, tp = bool(c["sp"]), int(c["tp"])
    if not bool(_sp_allowed(ctx, np.asarray(sp), np.asarray(tp))):
        reasons.append(
            f"sp={str(sp).lower()} with tp={tp} is excluded by --sequence-parallel "
            f"{ctx.sequence_parallel}"
        )
    if ctx.max_vpp is not None and int(c["vpp"]) > ctx.max_vpp:
        reasons.append(f"vpp={int(c['vpp'])} exceeds --max-vpp {ctx.max_vpp}")
    if ctx.max_cp is not None and int(c["cp"]) > ctx.max_cp:
        reasons.append(f"cp={int(c['cp'])} exceeds the context-parallel cap {ctx.max_cp} "
                       f"(--max-cp, or a --stack without context parallelism)")
    offload = ctx.activation_offload_layers
    if offload and int(c["pp"]) > 1:
        reasons.append(f"pp={int(c['pp'])} with --activation-offload-layers {offload}: "
                       "Megatron's CPU offloading does not run with pipeline parallelism "
                       "(use pp=1, or drop the offload)")
    if offload and rec != RECOMPUTE_CODES["none"]:
        reasons.append(f"recompute={RECOMPUTE_MODES[rec]} with --activation-offload-layers "
                       f"{offload}: Megatron's CPU offloading does not run with activation "
                       "recomputation (use recompute none, or drop the offload)")
    return "; ".join(reasons)


def _r12_holds(ctx: RuleContext, c: Columns) -> np.ndarray:
    # A software stack before MoE parallel folding (Megatron-LM 7f22e210cd, 2024-11-23;
    # --stack mcore-0.9) shards the experts over the model's TP: etp = tp.  A rule of its
    # own so that it prunes on the small (tp, etp) grid, before the later axes.
    # Its EP ranks are DP ranks too: ep divides dp (core_v0.9.0 parallel_state.py,
    # "data_parallel_size ... is not divisible by expert_model_parallel_size").
    tp, etp = np.asarray(c["tp"]), np.asarray(c["etp"])
    if ctx.experts_follow_tp and ctx.is_moe:
        ep, dp = np.asarray(c["ep"]), np.asarray(c["dp"])
        return (etp == tp) & (ep > 0) & (dp % np.where(ep > 0, ep, 1) == 0)
    return np.ones(np.broadcast(tp, etp).shape, dtype=bool)


def _r12_message(ctx: RuleContext, c: Columns) -> str:
    if int(c["etp"]) != int(c["tp"]):
        return (f"etp={int(c['etp'])} differs from tp={int(c['tp'])}: the --stack predates "
                "MoE parallel folding, so the experts take the model's TP")
    return (f"ep={int(c['ep'])} does not divide dp={int(c['dp'])}: the --stack predates MoE "
            "parallel folding, so the expert-parallel ranks are data-parallel ranks")


@dataclass(frozen=True)
class Rule:
    """One rule of the layout spec: the axes it reads, its predicate, its message."""

    rule_id: str
    name: str
    axes: frozenset[str]
    holds: Callable[[RuleContext, Columns], np.ndarray]
    message: Callable[[RuleContext, Columns], str]

    def violation(self, ctx: RuleContext, columns: Columns) -> Violation:
        return Violation(self.rule_id, self.name, self.message(ctx, columns))


def _rule(rule_id: str, name: str, axes: str, holds, message) -> Rule:  # type: ignore[no-untyped-def]
    return Rule(rule_id, name, frozenset(axes.split()), holds, message)


RULES: tuple[Rule, ...] = (
    _rule("R1", "positive-sizes", "tp pp cp ep etp vpp mbs", _r1_holds, _r1_message),
    _rule("R2", "dense-mesh", "tp cp pp", _r2_holds, _r2_message),
    _rule("R3", "expert-mesh", "pp ep etp", _r3_holds, _r3_message),
    _rule("R4", "tensor-parallel-divides-model", "tp", _r4_holds, _r4_message),
    _rule("R5", "expert-parallel-divides-experts", "ep etp", _r5_holds, _r5_message),
    _rule("R6", "context-parallel-divides-sequence", "cp", _r6_holds, _r6_message),
    _rule("R7", "sequence-parallel", "sp tp cp", _r7_holds, _r7_message),
    _rule("R8", "pipeline-split", "pp vpp", _r8_holds, _r8_message),
    _rule("R9", "interleaving", "vpp pp m", _r9_holds, _r9_message),
    _rule("R10", "batch-divisibility", "m mbs dp", _r10_holds, _r10_message),
    _rule("R11", "candidate-sets", "mbs recompute sp tp vpp cp pp", _r11_holds,
          _r11_message),
    _rule("R12", "stack-expert-tp", "tp etp ep dp", _r12_holds, _r12_message),
)

RULES_BY_ID: dict[str, Rule] = {rule.rule_id: rule for rule in RULES}


def layout_columns(layout: Layout) -> dict[str, np.ndarray]:
    """One layout as 0-d columns, plus its recompute code."""
    cols = {
        axis: np.asarray(getattr(layout, axis))
        for axis in ("tp", "pp", "cp", "ep", "etp", "vpp", "mbs")
    }
    cols["sp"] = np.asarray(layout.sp)
    cols["recompute"] = np.asarray(RECOMPUTE_CODES[layout.recompute])
    return cols


def check_layout(model: ModelSpec, training: TrainingSpec, layout: Layout) -> list[Violation]:
    """Every rule ``layout`` breaks for this model and setup (empty: valid).

    >>> from parsearch.model.specs import ModelSpec, TrainingSpec
    >>> m = ModelSpec("toy", 32, 4096, 14336, 32, 8, 128, 128256)
    >>> t = TrainingSpec(seq_len=8192, global_batch=64)
    >>> [v.rule for v in check_layout(m, t, Layout(num_gpus=64, tp=8, pp=6))]
    ['R2']
    >>> [v.rule for v in check_layout(m, t, Layout(num_gpus=64, tp=64, mbs=3))]
    ['R4', 'R10', 'R11']
    """
    ctx = rule_context(model, training, layout.num_gpus)
    cols = layout_columns(layout)
    if not bool(_r1_holds(ctx, cols)):
        return [RULES_BY_ID["R1"].violation(ctx, cols)]
    cols.update(derive_columns(ctx, cols))
    # R9/R10 read m = B/(mbs*dp); when R2 leaves dp undefined they would only echo R2.
    undefined = {"m", "dp"} if int(cols["dp"]) == 0 else set()
    return [
        rule.violation(ctx, cols)
        for rule in RULES
        if not (rule.axes & undefined) and not bool(rule.holds(ctx, cols))
    ]
