"""Workload specifications: the model and the training setup.

Both are frozen dataclasses validated on construction, so every later stage
(layout space, placement, cost) may assume well-formed values.  Loading from
files lives in :mod:`parsearch.model.files`; presets in
:mod:`parsearch.model.presets`; parameter counts in :mod:`parsearch.model.params`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from parsearch.errors import SpecError
from parsearch.model.offload_modules import check_offload_modules
from parsearch.model.pipeline_layout import parse_pipeline_layout

MlpActivation = Literal["swiglu", "gelu", "squared_relu"]
NormKind = Literal["rmsnorm", "layernorm"]
Precision = Literal["bf16", "fp8", "fp4"]
Recompute = Literal["none", "selective", "full"]
PipelineSplit = Literal["even", "uneven", "first-last"]

PRECISIONS: tuple[str, ...] = ("bf16", "fp8", "fp4")
RECOMPUTE_MODES: tuple[str, ...] = ("none", "selective", "full")
#: Integer code of each recompute mode in numpy columns of layouts.
RECOMPUTE_CODES: dict[str, int] = {mode: code for code, mode in enumerate(RECOMPUTE_MODES)}
#: how layers are split over pipeline stages (layout-space R8; ``first-last``: the splits
#: Megatron-Core <= 0.12 builds, :mod:`parsearch.layout.rank_split`)
PIPELINE_SPLITS: tuple[str, ...] = ("even", "uneven", "first-last")
SequenceParallelMode = Literal["both", "on", "off"]
SEQUENCE_PARALLEL_MODES: tuple[str, ...] = ("both", "on", "off")
#: Megatron-FSDP ``--data-parallel-sharding-strategy`` values parsearch prices
#: (``megatron/training/arguments.py``): ZeRO-3 and ZeRO-2.
FSDP_STRATEGIES: tuple[str, ...] = ("optim_grads_params", "optim_grads")
#: Megatron-Core ``--recompute-modules`` names (``transformer_config.py::recompute_modules``)
#: that parsearch models; what each drops is in :mod:`parsearch.cost.memory.activations`.
RECOMPUTE_MODULES: tuple[str, ...] = (
    "core_attn", "moe_act", "layernorm", "mla_up_proj", "mlp", "moe", "shared_experts",
)
#: torchtitan's op-level selective activation checkpointing (``selective_ac_option = "op"``,
#: torchtitan ``_apply_ac_to_transformer_block``): each block saves the outputs of its
#: matmuls except every second one, and of SDPA, and recomputes the rest.  Priced so that
#: torchtitan's published runs are read as they ran; it is not a Megatron-Core module (no
#: launch line carries it), and it stands alone (:mod:`parsearch.cost.titan_sac`).
TORCHTITAN_OP_SAC = "torchtitan_op_sac"


# Upper bounds of sizes, far above any published model or run, so that every
# later product (FLOPs, bytes, layout counts) stays finite and exact in int64
# and float64 and no input can make the enumeration hang.  An error names the
# bound; ``MAX_SIZES`` maps each field to its bound.
# Deepest public models: 126 layers (Llama 3.1 405B), 128 (GPT-1T); 61 (DeepSeek-V3).  The
# space grows with layers x interleaving choices; on one loaded core a pareto to 64 GPUs of
# a 7B-wide model takes ~31 s with 256 layers and ~150 s with 512, a search ~13 s with 512.
MAX_LAYERS = 256
MAX_HIDDEN_SIZE = 262_144  # public maximum 25,600 (GPT-1T, Narayanan et al. 2021)
MAX_FFN_HIDDEN_SIZE = 1_048_576
MAX_HEADS = 16_384  # public maximum 160 (GPT-1T)
MAX_HEAD_DIM = 16_384
MAX_VOCAB_SIZE = 16_777_216  # public maximum ~262k (Gemma 3)
MAX_EXPERTS = 65_536  # public maximum 384 (Kimi-K2)
MAX_MTP_LAYERS = 64
MAX_SEQ_LEN = 4_194_304  # 4M tokens; public long-context training reaches 1M
MAX_GLOBAL_BATCH = 16_777_216  # sequences per step
MAX_MICRO_BATCH = 65_536
MAX_BYTES_PER_PARAMETER = 64.0  # fp64 master weights + two fp64 moments = 24
MAX_SIZES: dict[str, int] = {
    "num_layers": MAX_LAYERS,
    "hidden_size": MAX_HIDDEN_SIZE,
    "ffn_hidden_size": MAX_FFN_HIDDEN_SIZE,
    "num_attention_heads": MAX_HEADS,
    "num_query_groups": MAX_HEADS,
    "head_dim": MAX_HEAD_DIM,
    "vocab_size": MAX_VOCAB_SIZE,
    "mtp_layers": MAX_MTP_LAYERS,
    "num_experts": MAX_EXPERTS,
    "top_k": MAX_EXPERTS,
    "expert_ffn_hidden_size": MAX_FFN_HIDDEN_SIZE,
    "shared_expert_ffn_hidden_size": MAX_FFN_HIDDEN_SIZE,
    "first_k_dense": MAX_LAYERS,
    "layer_freq": MAX_LAYERS,
    "kv_lora_rank": MAX_HIDDEN_SIZE,
    "qk_nope_head_dim": MAX_HEAD_DIM,
    "qk_rope_head_dim": MAX_HEAD_DIM,
    "v_head_dim": MAX_HEAD_DIM,
    "q_lora_rank": MAX_HIDDEN_SIZE,
    "seq_len": MAX_SEQ_LEN,
    "sliding_window": MAX_SEQ_LEN,
    "sliding_window_layers": MAX_LAYERS,
    "global_batch": MAX_GLOBAL_BATCH,
    "micro_batch_sizes": MAX_MICRO_BATCH,
    "max_vpp": MAX_LAYERS,
    "max_cp": MAX_SEQ_LEN,
    "recompute_num_layers": MAX_LAYERS,
    "activation_offload_layers": MAX_LAYERS,
}


def _require_int(owner: str, name: str, value: object, minimum: int, kind: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise SpecError(f"{owner}: {name} must be {kind}, got {short_repr(value)} "
                        f"({type(value).__name__})")
    if value < minimum:
        raise SpecError(f"{owner}: {name} must be {kind}, got {short_repr(value)}")
    bound = MAX_SIZES.get(name)
    if bound is not None and value > bound:
        raise SpecError(f"{owner}: {name}={short_repr(value)} exceeds the largest supported "
                        f"{name}, {bound:,}")
    return value


def short_repr(value: object) -> str:
    """``repr(value)``, shortened: a 5,000-digit integer is not worth printing."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 200:
        return f"<integer of about {int(value.bit_length() * 0.30103) + 1} digits>"
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def require_positive_int(owner: str, name: str, value: object) -> int:
    """``value`` if it is an int >= 1 (and within ``MAX_SIZES``), else a :class:`SpecError`."""
    return _require_int(owner, name, value, 1, "a positive integer")


def require_non_negative_int(owner: str, name: str, value: object) -> int:
    """``value`` if it is an int >= 0 (and within ``MAX_SIZES``), else a :class:`SpecError`."""
    return _require_int(owner, name, value, 0, "a non-negative integer")


def require_choice(owner: str, name: str, value: object, choices: tuple[str, ...]) -> str:
    """Return ``value`` if it is one of ``choices``, else raise a :class:`SpecError`."""
    if value not in choices:
        raise SpecError(
            f"{owner}: {name} must be one of {', '.join(choices)}; got {value!r}"
        )
    return str(value)


@dataclass(frozen=True)
class MlaSpec:
    """Multi-head latent attention dimensions (DeepSeek-V2/V3, Kimi-K2).

    ``q_lora_rank`` is 0 when queries are projected directly (no q-LoRA).
    """

    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    q_lora_rank: int = 0

    def __post_init__(self) -> None:
        owner = "model.mla"
        require_positive_int(owner, "kv_lora_rank", self.kv_lora_rank)
        require_positive_int(owner, "qk_nope_head_dim", self.qk_nope_head_dim)
        require_positive_int(owner, "qk_rope_head_dim", self.qk_rope_head_dim)
        require_positive_int(owner, "v_head_dim", self.v_head_dim)
        require_non_negative_int(owner, "q_lora_rank", self.q_lora_rank)


@dataclass(frozen=True)
class MoeSpec:
    """Mixture-of-Experts block description.

    Which layers are MoE: the first ``first_k_dense`` layers are dense; of
    the rest, layer ``i`` is MoE when ``(i - first_k_dense) % layer_freq == 0``
    (``layer_freq = 1``: every remaining layer).  ``shared_expert_ffn_hidden_size``
    is the *total* FFN width of the shared experts (0: none).
    ``router_num_groups`` / ``router_group_topk``: group-limited routing (Megatron-Core
    ``--moe-router-num-groups`` / ``--moe-router-group-topk``; HF ``n_group`` /
    ``topk_group``): the experts are cut into equal groups and a token's ``top_k``
    experts come from at most ``router_group_topk`` of them.  DeepSeek-V3 uses 8 and 4
    so a token reaches at most 4 nodes (arXiv 2412.19437 §3.2.2); 1 and 1: no limit.
    """

    num_experts: int
    top_k: int
    expert_ffn_hidden_size: int
    shared_expert_ffn_hidden_size: int = 0
    first_k_dense: int = 0
    layer_freq: int = 1
    router_num_groups: int = 1
    router_group_topk: int = 1

    def __post_init__(self) -> None:
        owner = "model.moe"
        require_positive_int(owner, "router_num_groups", self.router_num_groups)
        require_positive_int(owner, "router_group_topk", self.router_group_topk)
        require_positive_int(owner, "num_experts", self.num_experts)
        require_positive_int(owner, "top_k", self.top_k)
        require_positive_int(owner, "expert_ffn_hidden_size", self.expert_ffn_hidden_size)
        require_non_negative_int(
            owner, "shared_expert_ffn_hidden_size", self.shared_expert_ffn_hidden_size
        )
        require_non_negative_int(owner, "first_k_dense", self.first_k_dense)
        require_positive_int(owner, "layer_freq", self.layer_freq)
        if self.top_k > self.num_experts:
            raise SpecError(
                f"{owner}: top_k={self.top_k} exceeds num_experts={self.num_experts}; "
                "a token cannot be routed to more experts than exist"
            )
        groups, chosen = self.router_num_groups, self.router_group_topk
        if self.num_experts % groups:
            raise SpecError(
                f"{owner}: router_num_groups={groups} does not divide "
                f"num_experts={self.num_experts}; expert groups must be equal"
            )
        if chosen > groups:
            raise SpecError(
                f"{owner}: router_group_topk={chosen} exceeds router_num_groups={groups}"
            )
        if self.top_k > chosen * (self.num_experts // groups):
            raise SpecError(
                f"{owner}: top_k={self.top_k} exceeds the {chosen} x "
                f"{self.num_experts // groups} experts of the router_group_topk groups a "
                "token may use; raise router_group_topk or lower top_k"
            )

    @property
    def group_limited(self) -> bool:
        """Whether routing is limited to fewer expert groups than exist."""
        return self.router_group_topk < self.router_num_groups


@dataclass(frozen=True)
class ModelSpec:
    """A decoder-only transformer, dense or Mixture-of-Experts.

    Sizes follow Megatron-Core's names: ``ffn_hidden_size`` is the dense MLP
    width (used by the dense layers of an MoE model too), ``head_dim`` the
    per-head size of Q/K/V (``kv_channels``), ``num_query_groups`` the number
    of KV heads (GQA; equal to ``num_attention_heads`` for MHA, 1 for MQA).
    ``sliding_window`` (tokens) and ``sliding_window_layers``: how many layers attend
    only to the last ``sliding_window`` tokens (GPT-OSS: 18 of 36 at 128, Hugging Face
    ``layer_types``; Mistral 7B v0.1: all at 4,096); 0 and 0 for full attention.
    ``mlp_activation``: ``swiglu`` (gated, three matrices), or one of the ungated two-matrix
    MLPs, ``gelu`` (GPT) and ``squared_relu`` (Nemotron-4: relu(x)^2, So et al. 2021
    "Primer", arXiv 2109.08668).

    Three GPT-OSS features that Megatron-Core runs outside its fused kernels (priced in
    :mod:`parsearch.cost.unfused_ops`): ``glu_limit``, the clamp of the gated MLP's
    inputs (Hugging Face ``swiglu_limit``, 7.0; 0: none); ``expert_bias``, biases in the
    routed experts' FC1 and FC2 (Megatron ``add_bias_linear``); ``yarn_rope``, YaRN
    rotary embeddings on standard attention (Megatron ``position_embedding_type="yarn"``).

    ``attention_unquantized``: the checkpoint's FP4 release keeps the attention projections
    in BF16 (Hugging Face ``quantization_config.modules_to_not_convert`` names
    ``self_attn``, as openai/gpt-oss does); serving reads and holds them at 2 bytes a
    parameter (:func:`parsearch.serve.memory.attention_element_bytes`).
    """

    name: str
    num_layers: int
    hidden_size: int
    ffn_hidden_size: int
    num_attention_heads: int
    num_query_groups: int
    head_dim: int
    vocab_size: int
    tied_embeddings: bool = False
    mlp_activation: MlpActivation = "swiglu"
    norm: NormKind = "rmsnorm"
    qkv_bias: bool = False
    moe: MoeSpec | None = None
    mla: MlaSpec | None = None
    mtp_layers: int = 0
    sliding_window: int = 0
    sliding_window_layers: int = 0
    glu_limit: float = 0.0
    expert_bias: bool = False
    yarn_rope: bool = False
    attention_unquantized: bool = False
    source: str = ""

    def __post_init__(self) -> None:
        owner = f"model {self.name!r}" if self.name else "model"
        for name in (
            "num_layers",
            "hidden_size",
            "ffn_hidden_size",
            "num_attention_heads",
            "num_query_groups",
            "head_dim",
            "vocab_size",
        ):
            require_positive_int(owner, name, getattr(self, name))
        require_non_negative_int(owner, "mtp_layers", self.mtp_layers)
        require_non_negative_int(owner, "sliding_window", self.sliding_window)
        require_non_negative_int(owner, "sliding_window_layers", self.sliding_window_layers)
        if (self.sliding_window > 0) != (self.sliding_window_layers > 0):
            raise SpecError(
                f"{owner}: sliding_window={self.sliding_window} and sliding_window_layers="
                f"{self.sliding_window_layers} go together: a window in tokens and how many "
                "layers use it (0 and 0 for full attention)"
            )
        if self.sliding_window_layers > self.num_layers:
            raise SpecError(
                f"{owner}: sliding_window_layers={self.sliding_window_layers} exceeds "
                f"num_layers={self.num_layers}"
            )
        require_choice(owner, "mlp_activation", self.mlp_activation,
                       ("swiglu", "gelu", "squared_relu"))
        self._check_unfused_features(owner)
        require_choice(owner, "norm", self.norm, ("rmsnorm", "layernorm"))
        if self.num_query_groups > self.num_attention_heads:
            raise SpecError(
                f"{owner}: num_query_groups={self.num_query_groups} exceeds "
                f"num_attention_heads={self.num_attention_heads}"
            )
        if self.num_attention_heads % self.num_query_groups:
            raise SpecError(
                f"{owner}: num_attention_heads={self.num_attention_heads} is not a "
                f"multiple of num_query_groups={self.num_query_groups}"
            )
        if self.moe is not None and self.moe.first_k_dense >= self.num_layers:
            raise SpecError(
                f"{owner}: moe.first_k_dense={self.moe.first_k_dense} leaves no MoE "
                f"layer among num_layers={self.num_layers}"
            )

    def _check_unfused_features(self, owner: str) -> None:
        limit = self.glu_limit
        if (isinstance(limit, bool) or not isinstance(limit, int | float)
                or not math.isfinite(limit) or limit < 0):
            raise SpecError(f"{owner}: glu_limit={limit!r} must be a finite number >= 0 "
                            "(0: no clamp)")
        if limit > 0 and self.mlp_activation != "swiglu":
            raise SpecError(f"{owner}: glu_limit clamps a gated MLP's inputs; "
                            f"mlp_activation={self.mlp_activation!r} is not gated")
        for name in ("expert_bias", "yarn_rope", "attention_unquantized"):
            if not isinstance(getattr(self, name), bool):
                raise SpecError(f"{owner}: {name}={getattr(self, name)!r} must be true or false")
        if self.expert_bias and self.moe is None:
            raise SpecError(f"{owner}: expert_bias needs routed experts (moe)")
        if self.yarn_rope and self.mla is not None:
            raise SpecError(f"{owner}: yarn_rope is for standard attention; MLA applies its "
                            "own YaRN rotary embedding")

    @property
    def is_moe(self) -> bool:
        """True when the model has routed experts."""
        return self.moe is not None

    def is_moe_layer(self, index: int) -> bool:
        """Whether transformer layer ``index`` (0-based) has a routed-expert MLP."""
        if self.moe is None or index < self.moe.first_k_dense:
            return False
        return (index - self.moe.first_k_dense) % self.moe.layer_freq == 0

    @property
    def num_moe_layers(self) -> int:
        """Number of transformer layers (MTP excluded) with routed experts."""
        return sum(self.is_moe_layer(i) for i in range(self.num_layers))

    @property
    def num_dense_layers(self) -> int:
        """Number of transformer layers (MTP excluded) with a dense MLP."""
        return self.num_layers - self.num_moe_layers

    @property
    def has_dense_mlp(self) -> bool:
        """True when at least one layer has a dense MLP (rule R4's ``f % tp``)."""
        return self.num_dense_layers > 0

    @property
    def gqa_query_groups(self) -> int:
        """Query groups as the layout rules see them (MLA models: one per head)."""
        return self.num_attention_heads if self.mla is not None else self.num_query_groups


@dataclass(frozen=True)
class TrainingSpec:
    """The training setup a layout must serve.

    ``global_batch`` counts sequences.  The byte counts are per parameter and
    default to Megatron-Core mixed precision (bf16 weights, fp32 main
    gradients, fp32 master weights plus Adam moments: 2 / 4 / 12).

    The candidate sets bound the layout space: ``micro_batch_sizes`` and
    ``recompute_modes`` (rule R11); ``sequence_parallel`` is ``"both"`` (sp
    on and off wherever tp > 1), ``"on"`` (sp exactly when tp > 1, the usual
    Megatron setting) or ``"off"``; ``max_cp`` caps context parallelism (``1``: a
    software stack without it); ``max_vpp`` caps interleaving (``None``:
    every vpp the rules allow).

    ``fsdp`` switches from the distributed optimizer (ZeRO-1: only optimizer
    state sharded over DP*CP) to fully sharded data parallelism
    (Megatron-FSDP ``optim_grads_params``, ZeRO-3): weights, gradients and
    optimizer state are all sharded, and parameters are all-gathered for every
    forward and backward pass.  ``fsdp_strategy`` names Megatron-FSDP's
    ``--data-parallel-sharding-strategy``: ``optim_grads_params`` (that ZeRO-3, the
    default) or ``optim_grads`` (ZeRO-2, ZeRO paper §5 P_os+g: gradients and optimizer
    state sharded, the BF16 weights whole; each micro-batch's gradients are
    reduce-scattered as its backward ends and the updated weights are all-gathered once
    per step, as the Llama 3 paper's FSDP that does not reshard weights after forward).

    ``grad_bytes`` sizes the gradient buffer of the memory model: 4 for fp32
    main gradients (Megatron default), 2 for BF16 main gradients
    (``--grad-reduce-in-bf16`` / Megatron-Bridge ``grad_reduce_in_fp32=False``).

    Activation memory options (Megatron-Core ``TransformerConfig``):

    * ``recompute_num_layers`` — with a layout's ``recompute="full"``,
      ``--recompute-method block --recompute-num-layers N``: only the first N
      transformer layers of each model chunk (virtual pipeline stage) are
      fully recomputed, the others keep their activations
      (``megatron/core/recompute.py`` block branch); ``None``: every layer.
    * ``recompute_modules`` — with ``recompute="selective"``,
      ``--recompute-modules`` (any of ``RECOMPUTE_MODULES``; default
      ``core_attn``, as Megatron).  ``mla_up_proj`` has an effect only on MLA
      models and ``moe_act``/``moe``/``shared_experts`` only on MoE layers.
    * ``activation_offload_layers`` — activations of this many transformer
      layers (the first ones) of each model chunk are offloaded to host
      memory (Megatron ``--cpu-offloading --cpu-offloading-num-layers N``,
      which Megatron allows only with pp=1 and no recompute).
    * ``offload_modules`` — Megatron-Core's fine-grained activation offloading:
      the inputs of these submodules (:data:`~parsearch.model.offload_modules.OFFLOAD_MODULES`)
      of every layer go to host memory, with any pp and recompute.
    * ``pipeline_layout`` — Megatron's ``--pipeline-model-parallel-layout``
      (e.g. ``Et*4|(t*4|)*14tmL``): used for the layouts whose ``pp*vpp``
      equals its number of virtual stages, instead of ``pipeline_split``.
    """

    seq_len: int
    global_batch: int
    micro_batch_sizes: tuple[int, ...] = (1, 2, 4, 8)
    precision: Precision = "bf16"
    recompute_modes: tuple[Recompute, ...] = ("none", "selective", "full")
    pipeline_split: PipelineSplit = "uneven"
    distributed_optimizer: bool = True
    weight_bytes: float = 2.0
    grad_bytes: float = 4.0
    optimizer_bytes: float = 12.0
    sequence_parallel: SequenceParallelMode = "both"
    max_vpp: int | None = None
    max_cp: int | None = None
    optimizer: str = "adam"
    fsdp: bool = False
    fsdp_strategy: str = "optim_grads_params"
    recompute_num_layers: int | None = None
    recompute_modules: tuple[str, ...] = ("core_attn",)
    activation_offload_layers: int = 0
    #: ``--fine-grained-activation-offloading --offload-modules``: module inputs of every
    #: layer kept on host (:mod:`parsearch.model.offload_modules`)
    offload_modules: tuple[str, ...] = ()
    pipeline_layout: str | None = None
    #: the experts take the model's TP (etp == tp): Megatron-Core before MoE parallel
    #: folding (NVIDIA/Megatron-LM 7f22e210cd, 2024-11-23) had no separate expert TP
    experts_follow_tp: bool = False
    #: the least pp an interleaved schedule (vpp > 1) runs with: 2, or 3 on Megatron-LM
    #: before commit 3ee489d9ea (2024-05-31), whose ``arguments.py`` asserted pp > 2
    min_interleaved_pp: int = 2

    def __post_init__(self) -> None:
        owner = "training"
        if not isinstance(self.experts_follow_tp, bool):
            raise SpecError(f"{owner}: experts_follow_tp={self.experts_follow_tp!r} must be "
                            "true or false")
        require_positive_int(owner, "seq_len", self.seq_len)
        require_positive_int(owner, "global_batch", self.global_batch)
        if self.max_vpp is not None:
            require_positive_int(owner, "max_vpp", self.max_vpp)
        if self.max_cp is not None:
            require_positive_int(owner, "max_cp", self.max_cp)
        if not self.micro_batch_sizes:
            raise SpecError(f"{owner}: micro_batch_sizes is empty; give at least one, e.g. 1,2,4,8")
        for mbs in self.micro_batch_sizes:
            require_positive_int(owner, "micro_batch_sizes", mbs)
        if not self.recompute_modes:
            raise SpecError(f"{owner}: recompute_modes is empty; use none, selective or full")
        for mode in self.recompute_modes:
            require_choice(owner, "recompute", mode, RECOMPUTE_MODES)
        require_choice(owner, "sequence_parallel", self.sequence_parallel, SEQUENCE_PARALLEL_MODES)
        require_choice(owner, "precision", self.precision, PRECISIONS)
        require_choice(owner, "pipeline_split", self.pipeline_split, PIPELINE_SPLITS)
        require_positive_int(owner, "min_interleaved_pp", self.min_interleaved_pp)
        require_choice(owner, "fsdp_strategy", self.fsdp_strategy, FSDP_STRATEGIES)
        for name in ("weight_bytes", "grad_bytes", "optimizer_bytes"):
            value = getattr(self, name)
            if (isinstance(value, bool) or not isinstance(value, (int, float))
                    or not math.isfinite(value) or value < 0):
                raise SpecError(f"{owner}: {name} must be a finite number >= 0, got {value!r}")
            if value > MAX_BYTES_PER_PARAMETER:
                raise SpecError(f"{owner}: {name}={value:g} exceeds the largest supported "
                                f"bytes per parameter, {MAX_BYTES_PER_PARAMETER:g}")
        self._check_activation_options(owner)

    def _check_activation_options(self, owner: str) -> None:
        if self.recompute_num_layers is not None:
            value = self.recompute_num_layers
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise SpecError(
                    f"{owner}: recompute_num_layers must be a positive integer (layers per "
                    f"model chunk to recompute with recompute=full) or None for all layers; "
                    f"got {value!r}"
                )
            require_positive_int(owner, "recompute_num_layers", value)
        modules = self.recompute_modules
        if isinstance(modules, str) or not isinstance(modules, (tuple, list)):
            raise SpecError(
                f"{owner}: recompute_modules must be a tuple of module names, e.g. "
                f"('core_attn', 'moe_act'); got {modules!r}"
            )
        object.__setattr__(self, "recompute_modules", tuple(modules))
        bad = [m for m in modules if m not in (*RECOMPUTE_MODULES, TORCHTITAN_OP_SAC)]
        if bad:
            raise SpecError(
                f"{owner}: recompute_modules has unknown module(s) "
                f"{', '.join(map(repr, bad))}; choose from {', '.join(RECOMPUTE_MODULES)}"
            )
        if TORCHTITAN_OP_SAC in modules and len(modules) > 1:
            raise SpecError(
                f"{owner}: recompute_modules {TORCHTITAN_OP_SAC!r} (torchtitan's op-level "
                f"selective checkpointing) stands alone; got {modules!r}"
            )
        if len(set(modules)) != len(modules):
            raise SpecError(f"{owner}: recompute_modules repeats a module: {modules!r}")
        if self.pipeline_layout is not None:  # syntax now; stage/layer counts per layout
            parse_pipeline_layout(self.pipeline_layout)
        value = self.activation_offload_layers
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise SpecError(
                f"{owner}: activation_offload_layers must be an integer >= 0 (transformer "
                f"layers per model chunk whose activations go to host memory); got {value!r}"
            )
        require_non_negative_int(owner, "activation_offload_layers", value)
        object.__setattr__(self, "offload_modules", check_offload_modules(
            owner, self.offload_modules, value, self.recompute_modules))

    @property
    def fsdp_shards_weights(self) -> bool:
        """FSDP that shards the weights too (``optim_grads_params``, ZeRO-3); ZeRO-2
        (``optim_grads``) keeps them whole."""
        return self.fsdp and self.fsdp_strategy == "optim_grads_params"

    @property
    def tokens_per_step(self) -> int:
        """Tokens processed by one optimizer step."""
        return self.seq_len * self.global_batch

