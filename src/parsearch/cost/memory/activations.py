"""Activation memory per GPU: per layer, and micro-batches in flight per model chunk.

A whole stage (chunks, block recompute, offload) is assembled in
:mod:`parsearch.cost.memory.activation_terms`.

Sources (``shared/reference/formulas.md``):

* per layer — §5.3: the Korthikanti et al. 2022 (KOR22, arXiv 2205.05198)
  Table 2 form for GPT-style models (``activation_model="korthikanti"``),
  or by default the FlashAttention / GQA / SwiGLU / MoE form derived there
  with the same accounting (``"flash"``);
* micro-batches in flight — §5.4 (NAR21 §2.2.1; MCORE ``schedules.py``),
  counted per model chunk for interleaving, so uneven chunks (and the empty
  embedding-only / loss-only chunks of R8) weigh what they hold;
* recompute — ``full`` keeps only each layer's input (KOR22 Table 2
  ``2sbh``); with ``TrainingSpec.recompute_num_layers`` only the first N
  layers of each model chunk do (Megatron ``--recompute-method block``,
  ``megatron/core/recompute.py``); ``selective`` drops what each of
  ``TrainingSpec.recompute_modules`` discards (see :func:`_flash_parts`);
* offload — ``TrainingSpec.activation_offload_layers``: the first K layers of
  each model chunk go to host memory (Megatron ``--cpu-offloading-num-layers``
  / fine-grained activation offloading,
  ``megatron/core/pipeline_parallel/fine_grained_activation_offload.py``);
  HBM keeps one such layer in flight.

Everything is elementwise: layout degrees and the recompute code may be
numpy arrays.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from parsearch.cost.memory.module_offload import module_offload_bytes
from parsearch.cost.memory.options import (
    ACTIVATION_BYTES,
    DEFAULT_MEMORY_OPTIONS,
    FP32_BYTES,
    TE_OFFLOAD_MIN_ELEMENTS,
    MemoryOptions,
    Num,
    gemm_input_bytes,
)
from parsearch.cost.routing import layout_imbalance
from parsearch.cost.titan_sac import require_dense_block, saved_elements
from parsearch.errors import SpecError
from parsearch.model.specs import RECOMPUTE_CODES, TORCHTITAN_OP_SAC, ModelSpec, TrainingSpec

FULL = RECOMPUTE_CODES["full"]
SELECTIVE = RECOMPUTE_CODES["selective"]


@dataclass(frozen=True)
class ActDegrees:
    """The layout degrees activation memory depends on (numbers or arrays)."""

    tp: Num
    cp: Num
    ep: Num
    etp: Num
    mbs: Num
    sp_div: Num  # tp with sequence parallelism, else 1


def _mlp_up_factor(model: ModelSpec) -> int:
    """FC1 output width / ffn width: 2 for SwiGLU (gate and up), 1 for GeLU."""
    return 2 if model.mlp_activation == "swiglu" else 1


# ---------------------------------------------------------------------------
# One transformer layer, per micro-batch ("flash" model)
# ---------------------------------------------------------------------------


def _attention_bytes(model: ModelSpec, tokens: Num, deg: ActDegrees, gemm_b: float,
                     modules: frozenset[str]) -> Num:
    """Attention half of a layer (formulas.md §5.3 modern form, derived).

    Saved without recompute: norm-1 and norm-2 inputs (h each, SP-sharded);
    the QKV-GEMM input (norm-1 output, h, SP-sharded, GEMM-input precision);
    Q, K, V and the output O (out-proj input), TP-sharded; FlashAttention's
    fp32 log-sum-exp per head and token.  Selective modules
    (Megatron-Core ``transformer_config.py::recompute_modules``):

    * ``core_attn`` (``attention.py::_checkpointed_attention_forward``, a
      normal checkpoint whose inputs are Q, K, V): drops the log-sum-exp;
      Q, K, V stay as the checkpoint's inputs, O as the out-proj input;
    * ``layernorm`` (``transformer_layer.py``, ``CheckpointWithoutOutput`` of
      ``input_layernorm``): drops the norm-1 output, i.e. the QKV-GEMM input;
    * ``mla_up_proj`` (``multi_latent_attention.py``, output-discarding
      checkpoint of the q/kv up-projections and RoPE): drops Q, K, V of MLA
      models (no effect on others; Megatron rejects it there).
    """
    h, a = model.hidden_size, model.num_attention_heads
    tp, sp_div = deg.tp, deg.sp_div
    mla = model.mla
    if mla is None:
        q = a * model.head_dim / tp
        kv = 2.0 * model.num_query_groups * model.head_dim / np.minimum(tp, model.num_query_groups)
        o = a * model.head_dim / tp
        latent = 0.0
    else:
        qk = a * (mla.qk_nope_head_dim + mla.qk_rope_head_dim) / tp
        q, kv, o = qk, qk + a * mla.v_head_dim / tp, a * mla.v_head_dim / tp
        # Latents: norm input + up-proj input for q and kv, plus the rope key [derived].
        latent = (2.0 * (mla.q_lora_rank + mla.kv_lora_rank) + mla.qk_rope_head_dim) / sp_div
        if "mla_up_proj" in modules:
            q, kv = 0.0, 0.0
    qkv_in = 0.0 if "layernorm" in modules else h / sp_div
    elems_act = 2.0 * h / sp_div + q + kv + latent
    elems_gemm = qkv_in + o
    lse = 0.0 if "core_attn" in modules else FP32_BYTES * a / tp
    return tokens * (elems_act * ACTIVATION_BYTES + elems_gemm * gemm_b + lse)


def _dense_mlp_bytes(model: ModelSpec, tokens: Num, deg: ActDegrees, gemm_b: float,
                     modules: frozenset[str]) -> Num:
    """Dense MLP: FC1 input (h, SP-sharded), FC1 output (2f or f), FC2 input (f), ÷ tp.

    ``mlp`` (``transformer_layer.py`` ``recompute_mlp``, dense layers only, a
    normal checkpoint) keeps only its input, the BF16 norm-2 output;
    ``layernorm`` (``pre_mlp_layernorm`` output discarded) drops that input.
    """
    f = model.ffn_hidden_size
    fc1_in = 0.0 if "layernorm" in modules else model.hidden_size / deg.sp_div
    if "mlp" in modules:
        return tokens * fc1_in * ACTIVATION_BYTES
    fc1_out = _mlp_up_factor(model) * f / deg.tp
    return tokens * ((fc1_in + f / deg.tp) * gemm_b + fc1_out * ACTIVATION_BYTES)


def _moe_bytes(model: ModelSpec, tokens: Num, deg: ActDegrees, gemm_b: float, imbalance: float,
               modules: frozenset[str]) -> Num:
    """MoE MLP (formulas.md §5.3 "MoE layer activations", derived).

    ``T = tokens/tp`` tokens enter the MoE on a rank; routed experts keep
    ``T·k·(h·etp + 3·f_e)`` elements (dispatched FC1 input, all-gathered over
    ETP; FC1 and activation outputs), times the imbalance; router input
    ``h`` (SP-sharded) and fp32 router logits ``4·E`` bytes per token; shared
    experts use the attention TP layout.  Selective modules:

    * ``moe`` (``moe_layer.py`` ``moe_layer_recompute``, normal checkpoint of
      the whole MoE): keeps only its input (the norm-2 output);
    * ``moe_act`` (``experts.py``, output-discarding checkpoint of the expert
      activation): drops the activation output, the FC2 input ``f_e``;
    * ``shared_experts`` (``moe_layer.py::shared_experts_compute``, normal
      checkpoint): keeps only its input, the tensor the router already keeps;
    * ``layernorm``: drops the norm-2 output (router and shared-expert input).
    """
    moe = model.moe
    assert moe is not None
    h = model.hidden_size
    norm_out = 0.0 if "layernorm" in modules else h / deg.sp_div
    if "moe" in modules:
        return tokens * norm_out * ACTIVATION_BYTES
    up = _mlp_up_factor(model)
    routed_tokens = tokens / deg.tp * moe.top_k * imbalance
    f_e, f_sh = moe.expert_ffn_hidden_size, moe.shared_expert_ffn_hidden_size
    fc2_in = 0.0 if "moe_act" in modules else f_e
    routed = routed_tokens * ((h * deg.etp + fc2_in) * gemm_b + up * f_e * ACTIVATION_BYTES)
    router = tokens * (norm_out * ACTIVATION_BYTES + FP32_BYTES * moe.num_experts / deg.tp)
    shared = 0.0
    if f_sh and "shared_experts" not in modules:
        shared = tokens * (
            (norm_out + f_sh / deg.tp) * gemm_b + up * f_sh / deg.tp * ACTIVATION_BYTES
        )
    return routed + router + shared


def offload_kept_bytes(model: ModelSpec, training: TrainingSpec, is_moe: bool,
                       deg: ActDegrees, options: MemoryOptions) -> Num:
    """Bytes of one offloaded layer (no recompute) that ``--cpu-offloading`` leaves in HBM.

    Megatron-Core runs the layer inside Transformer Engine's offload context.  Before TE
    2.10 that context moves only the saved tensors marked for it (TE ``cpu_offload.py``:
    ``tensor_need_offloading_checker_activations`` tests ``activation_offloading``).  TE's
    own modules mark what they save (``mark_activation_offload`` in Linear,
    LayerNormLinear, DotProductAttention); Megatron's MLP activation function saves its
    input, the FC1 output (``up * f`` per token), and marks it only in the dense MLP's
    fused SwiGLU from Megatron-Core 0.13 on (``cpu_offload_input``, Megatron-LM 0bbcbb1157,
    2025-06-13; ``MemoryOptions.offload_moves_mlp_activation_input``).  The experts never
    mark theirs (``experts.py`` calls ``(weighted_)bias_swiglu_impl`` without it, 0.11
    through d98e8a64), nor do the GeLU paths, and the router's fp32 logits are saved by
    PyTorch ops: those stay in HBM for every offloaded layer.  From TE 2.10 the offload
    moves every saved tensor that is not a parameter, marked or not, and keeps only those of
    fewer than :data:`TE_OFFLOAD_MIN_ELEMENTS` elements
    (``MemoryOptions.offload_moves_every_saved_tensor``): of these tensors, only a small
    router's logits stay.
    """
    tokens = deg.mbs * training.seq_len / deg.cp
    if options.activation_model == "korthikanti":  # KOR22 has no per-tensor split
        return 0.0 * tokens
    up = _mlp_up_factor(model)
    every = options.offload_moves_every_saved_tensor
    mlp_marked = options.offload_moves_mlp_activation_input and model.mlp_activation == "swiglu"

    def stays(nbytes: Num, element_bytes: float) -> Num:
        # TE >= 2.10: a saved tensor stays only below its element floor
        if not every:
            return nbytes
        return np.where(nbytes / element_bytes < TE_OFFLOAD_MIN_ELEMENTS, nbytes, 0.0)

    def mlp_input(width: float) -> Num:
        if mlp_marked and not every:
            return 0.0 * tokens
        return stays(tokens * up * width / deg.tp * ACTIVATION_BYTES, ACTIVATION_BYTES)

    if not is_moe:
        return mlp_input(model.ffn_hidden_size)
    moe = model.moe
    assert moe is not None
    imb = _expert_load(model, training, deg, options)
    routed = tokens / deg.tp * moe.top_k * imb * up * moe.expert_ffn_hidden_size
    router = tokens * FP32_BYTES * moe.num_experts / deg.tp
    shared = mlp_input(moe.shared_expert_ffn_hidden_size) if moe.shared_expert_ffn_hidden_size \
        else 0.0
    return (stays(routed * ACTIVATION_BYTES, ACTIVATION_BYTES) + stays(router, FP32_BYTES)
            + shared)


def _korthikanti_layer(model: ModelSpec, deg: ActDegrees, seq_len: int, selective: bool) -> Num:
    """One layer, KOR22 Table 2 (bytes; GPT, MHA, GeLU 4h, dropout, no FlashAttention).

    CP is not in KOR22; every term is divided by cp (the sequence is sharded).
    KOR22's selective rows recompute core attention only, so they apply when
    ``core_attn`` is among the modules; other modules are not in KOR22.
    """
    s, h, a = seq_len, model.hidden_size, model.num_attention_heads
    sbh = s * deg.mbs * h / deg.cp
    tp = deg.tp
    sp = deg.sp_div > 1
    # KOR22 Table 2 rows: "TP+SP" / "TP"; "TP+SP+selective" / "TP+selective".
    if selective:
        return np.where(sp, 34.0 * sbh / tp, sbh * (10.0 + 24.0 / tp))
    return np.where(sp, sbh * (34.0 + 5.0 * a * s / h) / tp,
                    sbh * (10.0 + 24.0 / tp + 5.0 * a * s / (h * tp)))


@dataclass(frozen=True)
class LayerBytes:
    """One layer's saved activations per micro-batch under each recompute choice."""

    none: Num  # everything saved
    selective: Num  # with TrainingSpec.recompute_modules
    full: Num  # layer input only
    #: what fine-grained offloading (``TrainingSpec.offload_modules``) keeps on host instead,
    #: without recompute and with the selective modules (full recompute saves no module input)
    moved_none: Num = 0.0
    moved_selective: Num = 0.0

    def of(self, code: Num) -> Num:
        """Bytes under the recompute code(s) ``code`` (every layer recomputed)."""
        return np.where(code == FULL, self.full, np.where(code == SELECTIVE, self.selective,
                                                          self.none))

    def moved_of(self, code: Num, *, block: bool = False) -> Num:
        """Bytes the module offload moves to host per layer under the recompute code(s)
        ``code``; ``block`` (``--recompute-method block``): a ``full`` row's layers kept
        whole move what a layer without recompute moves."""
        return np.where(code == FULL, self.moved_none if block else 0.0,
                        np.where(code == SELECTIVE, self.moved_selective, self.moved_none))


def _layer_variants(model: ModelSpec, training: TrainingSpec, deg: ActDegrees,
                    options: MemoryOptions, kinds: tuple[bool, ...]) -> dict[bool, LayerBytes]:
    """:class:`LayerBytes` of each layer kind in ``kinds`` (``True``: MoE)."""
    s = training.seq_len
    tokens = deg.mbs * s / deg.cp  # CP shards the sequence (formulas.md §5.3)
    # Full recompute keeps only the layer input, SP-sharded (KOR22 Table 2 "2sbh",
    # /t with SP as MCORE checkpoints the sharded input; formulas.md §5.3/§11.4).
    full = tokens * model.hidden_size / deg.sp_div * ACTIVATION_BYTES
    modules = frozenset(training.recompute_modules)
    if options.activation_model == "korthikanti":  # KOR22 counts MoE layers as dense
        kor = LayerBytes(_korthikanti_layer(model, deg, s, False),
                         _korthikanti_layer(model, deg, s, "core_attn" in modules), full)
        return dict.fromkeys(kinds, kor)
    gemm_b = gemm_input_bytes(training.precision)
    imb = _expert_load(model, training, deg, options) if any(kinds) else 1.0
    offload = frozenset(training.offload_modules)
    # The attention half is the same in dense and MoE layers: computed once per variant.
    attn_none = _attention_bytes(model, tokens, deg, gemm_b, frozenset())
    attn_sel = _attention_bytes(model, tokens, deg, gemm_b, modules)
    out = {}
    for is_moe in kinds:
        if is_moe:
            none = _moe_bytes(model, tokens, deg, gemm_b, imb, frozenset())
        else:
            none = _dense_mlp_bytes(model, tokens, deg, gemm_b, frozenset())
        # fine-grained offloading (--offload-modules) keeps those module inputs on host
        moved_none = module_offload_bytes(model, tokens, deg, gemm_b, imb, frozenset(),
                                          offload, is_moe)
        if TORCHTITAN_OP_SAC in modules:  # torchtitan's op-level checkpointing of the block
            require_dense_block(model, modules)
            # matmul outputs are BF16 under torchao Float8 too (its scaled mm returns BF16)
            act, mm = saved_elements(model, deg.tp, deg.sp_div)
            sel = tokens * (act + mm) * ACTIVATION_BYTES
        elif is_moe:
            sel = attn_sel + _moe_bytes(model, tokens, deg, gemm_b, imb, modules)
        else:
            sel = attn_sel + _dense_mlp_bytes(model, tokens, deg, gemm_b, modules)
        moved_sel = (0.0 if TORCHTITAN_OP_SAC in modules else
                     module_offload_bytes(model, tokens, deg, gemm_b, imb, modules, offload,
                                          is_moe))
        if offload:  # held bytes less what goes to host (no copies in the plain search)
            out[is_moe] = LayerBytes(attn_none + none - moved_none, sel - moved_sel, full,
                                     moved_none, moved_sel)
        else:
            out[is_moe] = LayerBytes(attn_none + none, sel, full)
    return out


def _expert_load(model: ModelSpec, training: TrainingSpec, deg: ActDegrees,
                 options: MemoryOptions) -> Num:
    """max/mean routed tokens on the busiest EP rank, per layout: the imbalance the time
    model prices (:func:`~parsearch.cost.routing.priced_imbalance`: same copies per rank
    and sequences per dispatch), so a layout's expert activations are those of the rank
    that holds the most tokens."""
    # 1.0 is "not fixed" in MemoryOptions (CostOptions' None)
    return layout_imbalance(
        model, training.seq_len, options,
        fixed=options.moe_imbalance if options.moe_imbalance != 1.0 else None,
        tp=deg.tp, cp=deg.cp, ep=deg.ep, mbs=deg.mbs)


def layer_bytes(model: ModelSpec, training: TrainingSpec, is_moe: bool, deg: ActDegrees,
                options: MemoryOptions) -> LayerBytes:
    """Saved activation bytes of one transformer layer per micro-batch, per recompute choice."""
    return _layer_variants(model, training, deg, options, (is_moe,))[is_moe]


def stage_layer_bytes(model: ModelSpec, training: TrainingSpec, deg: ActDegrees,
                      options: MemoryOptions) -> dict[bool, LayerBytes]:
    """:func:`layer_bytes` of a dense (``False``) and, for MoE models, a MoE (``True``) layer."""
    kinds = (False, True) if model.moe is not None else (False,)
    return _layer_variants(model, training, deg, options, kinds)


# ---------------------------------------------------------------------------
# Micro-batches in flight
# ---------------------------------------------------------------------------


def num_microbatches(global_batch: int, mbs: Num, dp: Num) -> Num:
    """``m = B / (mbs·dp)`` (layout-space.md R10), at least 1."""
    denom = np.maximum(np.asarray(mbs) * np.asarray(dp), 1)
    return np.maximum(global_batch // denom, 1)


def chunk_in_flight(rank: Num, pp: Num, vpp: Num, chunk: Num, num_microbatches: Num,
                    extra: int = 0) -> Num:
    """Micro-batches whose activations model chunk ``chunk`` of ``rank`` holds at its peak.

    Elementwise in every argument.  1F1B (``vpp = 1``): ``min(m, p − r)``
    (NAR21 §2.2.1; MCORE ``schedules.py`` warm-up ``p − r − 1`` + 1).
    Interleaved: MCORE warm-up ``W = 2·(p − r − 1) + (v − 1)·p`` chunk-forwards
    + 1 outstanding, capped at ``m·v``; forward ``k`` runs chunk ``(k // p) % v``
    (``schedules.py::get_model_chunk_id``), so chunk ``c`` holds
    ``#{k < W : (k // p) % v = c}`` micro-batches.  With equal chunks the sum
    over chunks divided by ``v`` is KOR22 §4.2.3's ``p·(1 + (p − 1)/(p·v))``
    for ``r = 0`` (formulas.md §5.4).  Whole micro-batch counts; integer-valued floats.
    ``extra``: chunk forwards an interleaved schedule adds to its warm-up (1 under the
    merged forward-backward schedule of ``--overlap-moe-expert-parallel-comm``:
    Megatron-Core ``schedules.py`` ``get_pp_rank_microbatches`` adds one warm-up
    micro-batch of model chunks).  Without interleaving it adds nothing at the peak: the
    merged schedule runs the next micro-batch's forward layer by layer beside this one's
    backward, which frees a layer's activations as the forward saves one (DeepSeek-V3
    technical report §3.2.1, Figure 4).
    """
    m = np.asarray(num_microbatches, dtype=np.float64)
    one_f1b = np.minimum(m, np.subtract(pp, rank))
    if np.all(np.equal(vpp, 1)):
        return one_f1b
    # Integer arithmetic (micro-batch counts are whole): exact, and faster than float //, %.
    r, p, v, c = (np.asarray(x, dtype=np.int64) for x in (rank, pp, vpp, chunk))
    window = np.minimum(m.astype(np.int64) * v, 2 * (p - r - 1) + (v - 1) * p + 1 + extra)
    full_cycles, rest = np.divmod(window, p * v)
    held = full_cycles * p + np.minimum(np.maximum(rest - c * p, 0), p)
    return np.where(v == 1, one_f1b, held)


def in_flight_chunk_microbatches(rank: int, pp: int, vpp: int,
                                 num_microbatches: Num) -> tuple[Num, ...]:
    """:func:`chunk_in_flight` of each model chunk of ``rank``.

    >>> [int(x) for x in in_flight_chunk_microbatches(0, 4, 2, 8)]
    [7, 4]
    """
    return tuple(chunk_in_flight(rank, pp, vpp, chunk, num_microbatches)
                 for chunk in range(vpp))


def in_flight_microbatches(rank: int, pp: int, vpp: int, num_microbatches: Num) -> Num:
    """Micro-batches' worth of the rank's layers held at its peak (equal chunks).

    The sum over chunks of :func:`in_flight_chunk_microbatches` divided by
    ``vpp``: ``min(m, p − r)`` for 1F1B, ``min(m·v, 2(p−r−1) + (v−1)p + 1)/v``
    interleaved (formulas.md §5.4).
    """
    return sum(in_flight_chunk_microbatches(rank, pp, vpp, num_microbatches)) / vpp


def _as_f64(value: Num) -> Num:
    return np.asarray(value, dtype=np.float64)


def layer_activation_bytes(
    model: ModelSpec,
    training: TrainingSpec,
    *,
    is_moe: bool = False,
    tp: Num = 1,
    cp: Num = 1,
    ep: Num = 1,
    etp: Num = 1,
    mbs: Num = 1,
    sp: Num = False,
    recompute: str = "none",
    options: MemoryOptions = DEFAULT_MEMORY_OPTIONS,
) -> Num:
    """Activation bytes one transformer layer keeps per micro-batch on one GPU.

    With ``options.activation_model="korthikanti"`` these are the KOR22
    Table 2 rows (e.g. TP+SP+selective ``34·s·b·h/t``); the default
    ``"flash"`` form is formulas.md §5.3's FlashAttention/GQA/SwiGLU/MoE one.
    ``recompute="selective"`` drops what ``training.recompute_modules`` discard.
    """
    tp_f, cp_f, ep_f, etp_f, mbs_f = (_as_f64(x) for x in (tp, cp, ep, etp, mbs))
    deg = ActDegrees(tp=tp_f, cp=cp_f, ep=ep_f, etp=etp_f, mbs=mbs_f,
                     sp_div=np.where(np.asarray(sp, dtype=bool), tp_f, 1.0))
    if is_moe and model.moe is None:
        raise SpecError(f"memory: model {model.name!r} has no MoE layers")
    result = layer_bytes(model, training, is_moe, deg, options).of(
        np.asarray(RECOMPUTE_CODES[recompute]))
    return float(result) if np.ndim(result) == 0 else result
