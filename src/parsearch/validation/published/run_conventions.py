"""How each source of published runs reports throughput, and its conversion to tokens/s/GPU.

Sources are named by tags derived from the ``source`` column
(:func:`source_tag`).  When a source gives only TFLOP/s or MFU, the
measurement is converted with *that source's own* FLOP count: NAR21 Eq. 3,
KOR22 model FLOPs, Megatron-Core's early-2025 count, PaLM/torchtitan's
6N + 12LHQs, or MegaScale's MFU read with KOR22's count.  ``conversion``
on a run names which one (:data:`CONVERSIONS` describes each).
"""

from __future__ import annotations

import re

from parsearch.cost.stacks import DEFAULT_STACK, get_stack, stack_offload
from parsearch.errors import SpecError
from parsearch.layout import Layout
from parsearch.model.specs import ModelSpec
from parsearch.validation.published.run_cells import Row, cell_float, cell_int

# Source tags (derived from the ``source`` column).
NAR21 = "NAR21"
KOR22 = "KOR22"
MBRIDGE = "MBRIDGE"
FOLD = "FOLD"
NEMO_LONGSEQ = "NEMO-LONGSEQ"
# Independent references (``independent_runs.csv``, INDEPENDENT_RUNS.md); never fitted to.
LLAMA3 = "LLAMA3"
MEGASCALE = "MEGASCALE"
TORCHTITAN = "TORCHTITAN"
DEEPSEEK_V3 = "DEEPSEEK-V3"
MBRIDGE_AB = "MBRIDGE-AB"
MBRIDGE_CARD = "MBRIDGE-CARD"
# A user's public re-measurement of a Megatron-Bridge preset (a GitHub issue with its log).
MBRIDGE_USER = "MBRIDGE-USER"
# Rows of the Megatron-Bridge performance tables for models the calibration set does not
# hold (Qwen3-235B-A22B, gpt-oss-120b): same source, never fitted to.
MBRIDGE_HELDOUT = "MBRIDGE-HELDOUT"
# BigScience's BLOOM-176B layout trial on Jean Zay (Megatron-DeepSpeed, ZeRO-1, 4x100G OPA).
BLOOM_TRIAL = "BLOOM-TRIAL"
# NVIDIA's DGX Cloud benchmarking recipes (github NVIDIA/dgxc-benchmarking): NeMo 24.09
# runs of Llama 3.1 8B / 70B / 405B on 8-2,304 H100, weak scaling; never fitted to.
DGXC = "DGXC"
OTHER = "OTHER"

_SOURCE_PREFIXES: tuple[tuple[str, str], ...] = (
    ("Narayanan et al. 2021", NAR21),
    ("Korthikanti et al. 2022", KOR22),
    # Before its parent prefix: the first match wins.
    ("Megatron-Bridge perf summary, held-out model", MBRIDGE_HELDOUT),
    ("Megatron-Bridge perf summary", MBRIDGE),
    ("MoE Parallel Folding", FOLD),
    ("NeMo long-sequence perf", NEMO_LONGSEQ),
    ("Llama 3 paper", LLAMA3),
    ("MegaScale", MEGASCALE),
    ("torchtitan", TORCHTITAN),
    ("DeepSeek-V3 technical report", DEEPSEEK_V3),
    ("Megatron-Bridge perf skills", MBRIDGE_AB),
    ("Megatron-Bridge model verification card", MBRIDGE_CARD),
    ("Megatron-Bridge user report", MBRIDGE_USER),
    ("BigScience BLOOM-176B layout trial", BLOOM_TRIAL),
    ("NVIDIA DGX Cloud benchmarking recipes", DGXC),
)

# Peaks the sources divide by to report MFU (TFLOP/s, dense 16-bit).
KOR22_PEAK_TFLOPS = 312.0  # A100; KOR22 Table 5 / README
FOLD_PEAK_TFLOPS = 989.5  # H100 SXM; FOLD §4.1
# MegaScale's MFU peak: A100 dense BF16 (NVIDIA A100 datasheet, 312 TF).  The paper
# names no peak; this one reproduces its Table 2 tokens/s column (CONV_MEGASCALE).
MEGASCALE_PEAK_TFLOPS = 312.0

# Conversion identifiers stored in ``PublishedRun.conversion``.
CONV_REPORTED = "reported"
CONV_NAR21 = "nar21-eq3"
CONV_KOR22 = "kor22-model-flops"
CONV_MCORE_2025 = "mcore-2025-model-flops"
CONV_PALM = "palm-6n-12lhqt"
CONV_MEGASCALE = "megascale-kor22-mfu"

CONVERSIONS: dict[str, str] = {
    CONV_REPORTED: "tokens/s/GPU as published (measured_tokens_per_sec_per_gpu column)",
    CONV_NAR21: (
        "NAR21 Eq. 3 hardware FLOPs (full recompute counted): "
        "96·B·s·L·h²·(1 + s/6h + V/16Lh) per iteration; "
        "tokens/s/GPU = TFLOP/s·1e12 / (FLOPs per iteration / B·s)"
    ),
    CONV_KOR22: (
        "KOR22 model FLOPs (no recompute): 72·B·s·L·h²·(1 + s/6h + V/12Lh) per iteration; "
        "TFLOP/s = MFU × 312 (A100) when only MFU is given"
    ),
    CONV_MCORE_2025: (
        "Megatron-Core num_floating_point_operations of early 2025 (model FLOPs: GQA, "
        "SwiGLU, routed top-k + shared experts, logits over the vocabulary padded to "
        "128·tp; full s² attention, no causal halving, no recompute); "
        "TFLOP/s = MFU × 989.5 (H100, FOLD §4.1) when only MFU is given"
    ),
    CONV_PALM: (
        "Llama 3 paper §3.3.2 (arXiv 2407.21783): MFU and TFLOPs/GPU after Chowdhery et al. "
        "(PaLM, arXiv 2204.02311, App. B), counted as Meta's torchtitan does "
        "(torchtitan/models/llama3/model/args.py get_nparams_and_flops): "
        "6·N + 12·L·H·Q·s per token, N = all parameters but the input embedding table "
        "(output layer counted), H·Q = heads × head dim, full s² attention (no causal "
        "halving), no recompute; tokens/s/GPU = TFLOP/s·1e12 / that"
    ),
    CONV_MEGASCALE: (
        "MegaScale (arXiv 2402.15627) Table 2 MFU: the paper defines MFU as observed over "
        "peak throughput (§1, citing Megatron-LM) without writing its FLOP count; assumed "
        "the KOR22 model-FLOPs count 72·B·s·L·h²·(1 + s/6h + V/12Lh) (no recompute) at "
        "312 TF (A100 BF16), because with it the MFU column reproduces the table's own "
        "tokens/s column within 0.2% on every Megatron-LM row; "
        "tokens/s/GPU = MFU × 312e12 / (FLOPs per token)"
    ),
}

_RELEASE_RE = re.compile(r"NeMo (\d+(?:\.\d+)*)")


# --------------------------------------------------------------------------- sources


def source_tag(source: str) -> str:
    """Short tag of a ``source`` string (``NAR21``, ``KOR22``, ``MBRIDGE``, ``FOLD`` …)."""
    for prefix, tag in _SOURCE_PREFIXES:
        if source.startswith(prefix):
            return tag
    return OTHER


def release_of(source: str) -> tuple[int, ...] | None:
    """NeMo container release named in ``source`` (``(26, 4, 1)``), or ``None``.

    >>> release_of("Megatron-Bridge perf summary (NeMo 26.04.01 container)")
    (26, 4, 1)
    >>> release_of("Narayanan et al. 2021 (arXiv 2104.04473)") is None
    True
    """
    match = _RELEASE_RE.search(source)
    if match is None:
        return None
    return tuple(int(part) for part in match.group(1).split("."))


#: The software stack each source's runs used (:mod:`parsearch.cost.stacks`): the papers'
#: Megatron-LM of their year, MoE Parallel Folding's Megatron-Core (recipes of 2025-04-03,
#: before DeepEP reached a release), NeMo 25.04's Megatron-Core 0.12, and the DGX Cloud
#: recipes' NeMo 24.09 container (Megatron-Core 0.9: before MoE parallel folding), and
#: torchtitan's own benchmark files.
_SOURCE_STACKS: dict[str, str] = {NAR21: "megatron-lm-2021", KOR22: "megatron-lm-2022",
                                  MEGASCALE: "megatron-lm-2023",
                                  BLOOM_TRIAL: "megatron-deepspeed-2022",
                                  FOLD: "mcore-0.11", NEMO_LONGSEQ: "mcore-0.12",
                                  DGXC: "mcore-0.9", TORCHTITAN: "torchtitan"}


def stack_of_source(source: str) -> str:
    """The software stack a run of ``source`` was measured with: by source, and for
    Megatron-Bridge's tables by NeMo container (25.09 shipped Megatron-Core 0.14, 25.11
    Megatron-Bridge 0.2 with Megatron-Core 0.15, 26.02 and 26.04 Megatron-Bridge 0.3-0.4
    with 0.16-0.17, 26.06 on Megatron-Bridge 0.5+ with 0.18+).

    >>> stack_of_source("Megatron-Bridge perf summary (NeMo 25.09 container)")
    'mcore-0.14'
    >>> stack_of_source("Megatron-Bridge perf summary (NeMo 25.11 container)")
    'mcore-0.15'
    >>> stack_of_source("Megatron-Bridge perf summary (NeMo 26.04.01 container)")
    'mcore-0.16'
    """
    tag = source_tag(source)
    if tag in _SOURCE_STACKS:
        return _SOURCE_STACKS[tag]
    release = release_of(source)
    if release is not None and release < (25, 11):
        return "mcore-0.14"
    if release is not None and release < (26, 2):
        return "mcore-0.15"
    if release is not None and release < (26, 6):
        return "mcore-0.16"
    return DEFAULT_STACK


def offload_of_source(source: str) -> tuple[bool, bool]:
    """What ``--cpu-offloading`` moved in a run of ``source``
    (:func:`parsearch.cost.stacks.stack_offload`): its stack's.  Megatron-Bridge 0.2.0 (NeMo
    25.11, ``mcore-0.15``) pinned Transformer Engine 2.9, whose offload moves only the tensors
    marked for it; Bridge 0.3.0 (NeMo 26.02, ``mcore-0.16``) on pin TE >= 2.10.

    >>> offload_of_source("Megatron-Bridge perf summary (NeMo 25.11 container)")
    (True, False)
    """
    return stack_offload(get_stack(stack_of_source(source)))


# --------------------------------------------------------------------------- FLOPs


def nar21_flops_per_token(num_layers: int, hidden: int, seq_len: int, vocab: int) -> float:
    """NAR21 Eq. 3 per token: 96·L·h²·(1 + s/6h + V/16Lh) (full recompute counted)."""
    L, h, s, V = num_layers, hidden, seq_len, vocab
    return 96.0 * L * h * h * (1.0 + s / (6.0 * h) + V / (16.0 * L * h))


def kor22_model_flops_per_token(num_layers: int, hidden: int, seq_len: int, vocab: int) -> float:
    """KOR22 model FLOPs per token: 72·L·h²·(1 + s/6h + V/12Lh) (no recompute)."""
    L, h, s, V = num_layers, hidden, seq_len, vocab
    return 72.0 * L * h * h * (1.0 + s / (6.0 * h) + V / (12.0 * L * h))


def palm_flops_per_token(model: ModelSpec, seq_len: int) -> float:
    """Model FLOPs per token after PaLM App. B, as torchtitan counts them (:data:`CONV_PALM`).

    6·N + 12·L·H·Q·s with N = all parameters except the input embedding table
    (torchtitan ``get_nparams_and_flops`` subtracts the ``nn.Embedding`` only, so
    an untied output layer is in N) and H·Q = heads × head dim; no causal halving.
    """
    from parsearch.model.params import parameter_counts

    counts = parameter_counts(model)
    n = counts.total - counts.embedding
    attention = 12.0 * model.num_layers * model.num_attention_heads * model.head_dim * seq_len
    return 6.0 * n + attention


def padded_vocab(vocab: int, tp: int, divisible_by: int = 128) -> int:
    """Megatron's padded vocabulary: next multiple of ``divisible_by·tp``.

    >>> padded_vocab(151936, 2)
    152064
    """
    multiple = divisible_by * tp
    return -(-vocab // multiple) * multiple


def mcore_2025_flops_per_token(model: ModelSpec, seq_len: int, tp: int = 1) -> float:
    """Model FLOPs per token, Megatron-Core ``num_floating_point_operations`` of early 2025.

    3 passes × 2 FLOPs per multiply-add over: QKV + output projection (GQA),
    full (not causal-halved) QKᵀ and PV, the dense or MoE MLP (routed top-k
    plus shared experts, 3 matrices for SwiGLU), and the logits over the
    vocabulary padded to 128·tp.  No recompute, router, norms or MTP.
    """
    if model.mla is not None:
        raise SpecError(f"model {model.name!r}: the early-2025 MCore formula used here has no MLA")
    h, s = model.hidden_size, seq_len
    q_width = model.num_attention_heads * model.head_dim
    kv_width = model.num_query_groups * model.head_dim
    phi = 3 if model.mlp_activation == "swiglu" else 2
    attention = h * (q_width + 2 * kv_width) + q_width * h + 2 * s * q_width
    dense_mlp = phi * h * model.ffn_hidden_size
    moe_mlp = 0
    if model.moe is not None:
        moe = model.moe
        routed = moe.top_k * moe.expert_ffn_hidden_size
        moe_mlp = phi * h * (routed + moe.shared_expert_ffn_hidden_size)
    per_token = (
        model.num_layers * attention
        + model.num_dense_layers * dense_mlp
        + model.num_moe_layers * moe_mlp
        + h * padded_vocab(model.vocab_size, tp)
    )
    return 6.0 * per_token


# --------------------------------------------------------------------------- measurement


def measurement(
    row: Row, tag: str, model: ModelSpec | None, layout: Layout, seq_len: int
) -> tuple[float | None, str | None]:
    """(tokens/s/GPU, conversion id); (None, None) when it cannot be had."""
    tokens = cell_float(row, "measured_tokens_per_sec_per_gpu")
    if tokens is not None:
        return tokens, CONV_REPORTED
    tflops = cell_float(row, "measured_tflops_per_gpu")
    mfu = cell_float(row, "measured_mfu")
    flops_per_token, conversion, peak = source_flops(row, tag, model, layout, seq_len)
    if flops_per_token is None:
        return None, None
    if tflops is None and mfu is not None and peak is not None:
        tflops = mfu * peak
    if tflops is None:
        return None, None
    return tflops * 1e12 / flops_per_token, conversion


def source_flops(
    row: Row, tag: str, model: ModelSpec | None, layout: Layout, seq_len: int
) -> tuple[float | None, str | None, float | None]:
    """(FLOPs per token in the source's convention, conversion id, MFU peak)."""
    if tag in (NAR21, KOR22):
        L, h, V = (cell_int(row, c) for c in ("num_layers", "hidden_size", "vocab_size"))
        if L is None or h is None or V is None:
            return None, None, None
        if tag == NAR21:
            return nar21_flops_per_token(L, h, seq_len, V), CONV_NAR21, None
        return kor22_model_flops_per_token(L, h, seq_len, V), CONV_KOR22, KOR22_PEAK_TFLOPS
    if tag == MEGASCALE:
        L, h, V = (cell_int(row, c) for c in ("num_layers", "hidden_size", "vocab_size"))
        if L is None or h is None or V is None:
            return None, None, None
        flops = kor22_model_flops_per_token(L, h, seq_len, V)
        return flops, CONV_MEGASCALE, MEGASCALE_PEAK_TFLOPS
    if tag == LLAMA3 and model is not None and model.mla is None and model.moe is None:
        return palm_flops_per_token(model, seq_len), CONV_PALM, None
    if tag in (FOLD, NEMO_LONGSEQ) and model is not None and model.mla is None:
        flops = mcore_2025_flops_per_token(model, seq_len, layout.tp)
        return flops, CONV_MCORE_2025, FOLD_PEAK_TFLOPS if tag == FOLD else None
    return None, None, None
