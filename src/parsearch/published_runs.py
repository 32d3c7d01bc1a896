"""Published training runs: the ground truth ``parsearch validate`` compares against.

The dataset (``parsearch/data/published_runs.csv``, provenance in
``PROVENANCE.md`` next to it) lists real runs with their parallel layout and
measured throughput.  :func:`load_published_runs` turns every CSV row into a
frozen :class:`PublishedRun`:

* the layout as a :class:`~parsearch.layout.Layout`, blank cells filled with
  documented defaults (each recorded in ``assumptions``);
* the precision normalised to ``bf16`` / ``fp8`` / ``fp4`` (the original
  string and the FP8 recipe are kept);
* the measurement as tokens/s/GPU.  When a source gives only TFLOP/s or MFU
  it is converted with *that source's own* FLOP count (``conversion`` names
  which one, :data:`CONVERSIONS` describes it);
* a :class:`~parsearch.workload.ModelSpec` (a preset when one matches the
  model name, else built from the row's architecture columns) and the
  cluster preset to run it on;
* ``skip_reason``: why the row cannot be used as ground truth, or ``None``.
"""

from __future__ import annotations

import csv
import io
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

from parsearch.errors import ParsearchError, SpecError
from parsearch.layout import Layout
from parsearch.workload import (
    ModelSpec,
    MoeSpec,
    Precision,
    Recompute,
    TrainingSpec,
    short_repr,
)

Row = Mapping[str, str]

DATA_PACKAGE = "parsearch.data"
DATA_FILE = "published_runs.csv"

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
OTHER = "OTHER"

_SOURCE_PREFIXES: tuple[tuple[str, str], ...] = (
    ("Narayanan et al. 2021", NAR21),
    ("Korthikanti et al. 2022", KOR22),
    ("Megatron-Bridge perf summary", MBRIDGE),
    ("MoE Parallel Folding", FOLD),
    ("NeMo long-sequence perf", NEMO_LONGSEQ),
    ("Llama 3 paper", LLAMA3),
    ("MegaScale", MEGASCALE),
    ("torchtitan", TORCHTITAN),
    ("DeepSeek-V3 technical report", DEEPSEEK_V3),
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

CLUSTER_BY_GPU: dict[str, str] = {
    "A100-SXM-80GB": "dgx-a100",
    "H100-SXM-80GB": "dgx-h100",
    "H100-SXM-80GB (Eos)": "dgx-h100",
    "B200": "dgx-b200",
    "B300": "dgx-b300",
    "GB200": "gb200-nvl72",
    "GB300": "gb300-nvl72",
    "H200-SXM-141GB": "dgx-h200",
    "H800-SXM-80GB": "hgx-h800",
}

# GPU labels with no shipped hardware profile, and why none is made up.
NO_PROFILE_REASONS: dict[str, str] = {
    "H100-SXM-96GB (Grand Teton, 500W)": (
        "no hardware profile for a 500 W-capped H100 96 GB: NVIDIA's datasheet peaks are "
        "for the 700 W H100 SXM 80 GB; torchtitan's benchmark file gives 2.4 TB/s HBM2e "
        "but says the peak is 'between SXM and NVL, and we don't know its exact value', "
        "and no published peak for the part was found"
    ),
}

# Model name (without its parenthesised variant) -> preset names to try, in order.
_PRESET_CANDIDATES: dict[str, tuple[str, ...]] = {
    "LLAMA3_8B": ("llama3-8b",),
    "LLAMA3-8B": ("llama3-8b",),
    "LLAMA3_70B": ("llama3-70b",),
    "DeepSeekV3": ("deepseek-v3",),
    "Qwen3_30B_a3B": ("qwen3-30b-a3b",),
    "Kimi_K2": ("kimi-k2",),
    "Mixtral-8x22B": ("mixtral-8x22b",),
    "Qwen2-57B-A14B": ("qwen2-57b-a14b",),
    "GPT-175B": ("gpt3-175b", "gpt-175b"),
    "GPT-174.6B": ("gpt3-175b", "gpt-174.6b", "gpt-175b"),
    "GPT-22B": ("kor22-22b", "gpt-22b"),
    "GPT-530B": ("mt-nlg-530b", "gpt-529.6b", "gpt-530b"),
    "GPT-529.6B": ("gpt-529.6b", "gpt-530b"),
    "GPT-1008B": ("gpt-1t", "gpt-1008b"),
    "GPT-1T": ("gpt-1t",),
    # Independent references: Llama 3.1 8B/70B keep Llama 3's dimensions (Llama 3 paper Table 3).
    "Llama-3-8B": ("llama3-8b",),
    "Llama-3.1-8B": ("llama3-8b",),
    "Llama-3-70B": ("llama3-70b",),
    "Llama-3.1-70B": ("llama3-70b",),
    "Llama-3.1-405B": ("llama3.1-405b",),
    "DeepSeek-V3": ("deepseek-v3",),
}

# Fields the CSV leaves blank, filled from the model's public config when no
# preset exists (Hugging Face config.json of the named checkpoint).
_PUBLIC_CONFIG_FILLS: dict[str, dict[str, int]] = {
    "LLAMA3_8B": {"vocab_size": 128256},  # meta-llama/Meta-Llama-3-8B
    "LLAMA3-8B": {"vocab_size": 128256},
    "LLAMA3_70B": {"vocab_size": 128256},  # meta-llama/Meta-Llama-3-70B
    "Mixtral-8x22B": {"vocab_size": 32000},  # mistralai/Mixtral-8x22B-v0.1
    "Qwen3_30B_a3B": {"head_dim": 128},  # Qwen/Qwen3-30B-A3B (head_dim != h/a)
}

# Models whose attention is MLA: the CSV columns cannot describe them.
_NEEDS_PRESET: frozenset[str] = frozenset({"DeepSeekV3", "Kimi_K2"})

_RELEASE_RE = re.compile(r"NeMo (\d+(?:\.\d+)*)")
_VARIANT_RE = re.compile(r"^(?P<base>.*?)\s*\((?P<variant>[^)]*)\)\s*$")


@dataclass(frozen=True)
class PublishedRun:
    """One published training run, normalised for validation.

    ``measured_tokens_per_s_per_gpu`` is the ground truth; ``conversion``
    says how it was obtained (:data:`CONVERSIONS`).  ``skip_reason`` is
    ``None`` when the row is usable.  ``assumptions`` lists every default
    the loader filled in for a blank cell.
    """

    id: str
    source: str
    source_tag: str
    source_locator: str
    model: str
    gpu: str
    cluster: str | None
    num_gpus: int
    layout: Layout
    global_batch: int
    seq_len: int
    precision: Precision
    precision_raw: str
    fp8_recipe: str | None
    measured_tokens_per_s_per_gpu: float | None
    measured_tflops_per_gpu: float | None
    measured_mfu: float | None
    conversion: str | None
    verified: str
    notes: str
    model_spec: ModelSpec | None
    model_source: str | None
    release: tuple[int, ...] | None
    assumptions: tuple[str, ...]
    skip_reason: str | None

    @property
    def kept(self) -> bool:
        """True when the row can serve as ground truth."""
        return self.skip_reason is None

    @property
    def is_moe(self) -> bool:
        """True when the resolved model has routed experts."""
        return self.model_spec is not None and self.model_spec.is_moe

    @property
    def base_model(self) -> str:
        """The model name without its parenthesised variant (``"DeepSeekV3"``)."""
        return split_model_name(self.model)[0]

    @property
    def variant(self) -> str | None:
        """The parenthesised variant of the model name (``"tokendrop"``), if any."""
        return split_model_name(self.model)[1]


# --------------------------------------------------------------------------- cells


def _text(row: Row, column: str) -> str:
    return (row.get(column) or "").strip()


#: Largest integer cell (GPU counts, degrees, sizes); larger ones are typos.
MAX_INT_CELL = 2**31 - 1


def _parsed(row: Row, column: str, kind: type[int] | type[float], what: str) -> Any:
    text = _text(row, column)
    if not text:
        return None
    try:
        value = kind(text)
    except ValueError:
        raise SpecError(
            f"published run {row.get('id')}: {column}={short_repr(text)} is not {what}"
        ) from None
    if kind is int and not 0 <= value <= MAX_INT_CELL:
        raise SpecError(f"published run {row.get('id')}: {column}={short_repr(text)} is not "
                        f"an integer between 0 and {MAX_INT_CELL:,}")
    if kind is float and not (math.isfinite(value) and value >= 0):
        raise SpecError(f"published run {row.get('id')}: {column}={short_repr(text)} is not "
                        "a finite number >= 0")
    return value


def _int(row: Row, column: str) -> int | None:
    return _parsed(row, column, int, "an integer")


def _float(row: Row, column: str) -> float | None:
    return _parsed(row, column, float, "a number")


def _required_int(row: Row, column: str) -> int:
    value = _int(row, column)
    if value is None:
        raise SpecError(f"published run {row.get('id')}: {column} is blank")
    return value


# --------------------------------------------------------------------------- names


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


def split_model_name(model: str) -> tuple[str, str | None]:
    """``"DeepSeekV3 (w/o MTP)"`` -> ``("DeepSeekV3", "w/o MTP")``.

    >>> split_model_name("GPT-175B (GPT-3)")
    ('GPT-175B', 'GPT-3')
    >>> split_model_name("LLAMA3_70B")
    ('LLAMA3_70B', None)
    """
    match = _VARIANT_RE.match(model.strip())
    if match is None:
        return model.strip(), None
    return match.group("base"), match.group("variant")


def normalise_precision(raw: str) -> tuple[Precision, str | None]:
    """Map a published precision string to (``bf16``|``fp8``|``fp4``, FP8 recipe).

    16-bit formats (BF16, FP16 mixed) all map to ``bf16``; the recipe is
    ``None`` except for FP8.

    >>> normalise_precision("FP8-MX")
    ('fp8', 'mxfp8')
    >>> normalise_precision("FP16 mixed")
    ('bf16', None)
    """
    text = raw.strip().upper()
    if "FP4" in text:
        return "fp4", None
    if "FP8" in text:
        return "fp8", _fp8_recipe(text)
    if text in ("BF16", "FP16", "FP16 MIXED", "MIXED 16-BIT"):
        return "bf16", None
    raise SpecError(f"published run: unknown precision {raw!r}")


def _fp8_recipe(text: str) -> str:
    if "MX" in text:
        return "mxfp8"
    if "BLOCKWISE" in text:
        return "blockwise"
    if "ROWWISE" in text:  # torchao float8 rowwise scaling (torchtitan rows)
        return "rowwise"
    if "TENSORWISE" in text:
        return "tensorwise"
    if "DELAYED" in text:
        return "delayed"
    if text.endswith("-CS"):
        return "tensorwise"
    if "SEE NOTE" in text:
        return "tensorwise (presumed)"
    return "unspecified"


def _recompute(text: str) -> Recompute:
    lowered = text.lower()
    if lowered.startswith("full"):
        return "full"
    if lowered.startswith("selective"):
        return "selective"
    if lowered in ("", "none", "no"):
        return "none"
    raise SpecError(f"published run: unknown recompute {text!r}")


# --------------------------------------------------------------------------- layout


def _build_layout(row: Row, tag: str, moe_row: bool) -> tuple[Layout, list[str]]:
    """The row's :class:`Layout` and the defaults used for its blank cells."""
    notes: list[str] = []
    tp = _int(row, "tp") or 1
    pp = _int(row, "pp") or 1
    ep = _int(row, "ep") or 1
    etp = _etp(row, tag, moe_row, tp, notes)
    vpp = _int(row, "vpp")
    if vpp is None:
        vpp = _llama3_vpp(row, pp, notes) if tag == LLAMA3 else 1
        if pp > 1 and vpp == 1:
            notes.append("vpp not stated: 1 (no interleaving)")
    mbs = _int(row, "micro_batch_size")
    if mbs is None:
        mbs = 1
        notes.append("micro-batch size not stated: 1")
    recompute_text = _text(row, "recompute")
    if not recompute_text:
        recompute_text = _llama3_recompute(row, notes) if tag == LLAMA3 else ""
    if not recompute_text:
        notes.append("recompute not stated: none")
    elif tag == TORCHTITAN and recompute_text.lower().startswith("selective"):
        # torchtitan's selective AC (per-op or every-other-layer checkpointing) is not
        # Megatron's; the cost model knows only Megatron's modules.
        notes.append(f"recompute {recompute_text!r} (torchtitan SAC) priced as Megatron "
                     "selective (core attention)")
    return (
        Layout(
            num_gpus=_required_int(row, "num_gpus"),
            tp=tp,
            pp=pp,
            cp=_int(row, "cp") or 1,
            ep=ep,
            etp=etp,
            vpp=vpp,
            mbs=mbs,
            sp=_sequence_parallel(row, tp, notes),
            recompute=_recompute(recompute_text),
        ),
        notes,
    )


def _llama3_vpp(row: Row, pp: int, notes: list[str]) -> int:
    """Virtual stages per rank the Llama 3 paper's text implies (its Table 4 gives none).

    §3.3.2 (arXiv 2407.21783): "one Transformer layer is reduced each from the first
    and the last stages ... the first model chunk on the first stage has only the
    embedding, and the last model chunk on the last stage has only output projection
    and loss" -- one unit per model chunk, so pp·V = layers + 2 (embedding, loss).
    """
    layers = _int(row, "num_layers")
    if pp <= 1 or layers is None or (layers + 2) % pp:
        return 1
    vpp = (layers + 2) // pp
    notes.append(f"vpp not stated: {vpp} (Llama 3 §3.3.2: one layer per model chunk, "
                 f"embedding and loss a chunk each: ({layers}+2)/{pp})")
    return vpp


def _llama3_recompute(row: Row, notes: list[str]) -> str:
    """Recompute the Llama 3 paper states: none at 8K tokens (§3.3.2); "" when unstated."""
    seq = _int(row, "seq_length")
    if seq is None or seq > 8192:
        return ""
    notes.append("recompute from the text: none (Llama 3 §3.3.2: 8K sequences "
                 "pre-trained without activation checkpointing)")
    return "none"


def _etp(row: Row, tag: str, moe_row: bool, tp: int, notes: list[str]) -> int:
    etp = _int(row, "etp")
    if etp is not None:
        return etp
    if not moe_row:
        return 1
    if tag == FOLD:
        notes.append("etp not stated: = tp (no folding couples expert TP to TP)")
        return tp
    notes.append("etp not listed by NVIDIA: 1" if tag == MBRIDGE else "etp not stated: 1")
    return 1


def _sequence_parallel(row: Row, tp: int, notes: list[str]) -> bool:
    text = _text(row, "sequence_parallel").lower()
    if text in ("yes", "true", "1"):
        return True
    if text in ("no", "false", "0"):
        return False
    if tp > 1:
        notes.append("sequence parallel not stated: on (tp > 1)")
    return tp > 1


def layout_problems(
    layout: Layout,
    model: ModelSpec | None,
    seq_len: int,
    global_batch: int,
    stated_dp: int | None = None,
) -> list[str]:
    """Why a published layout cannot be what ran, as short sentences (empty if fine).

    Checks the world-size algebra (dense and expert mesh), the stated DP,
    the batch split and the divisibility a Megatron run cannot violate.
    """
    problems = _mesh_problems(layout, model, stated_dp)
    if layout.dp and global_batch % (layout.mbs * layout.dp):
        problems.append(
            f"global_batch={global_batch} is not a multiple of mbs·dp={layout.mbs * layout.dp}"
        )
    if layout.vpp > 1 and layout.pp == 1:
        problems.append(f"vpp={layout.vpp} needs pp > 1")
    if layout.cp > 1 and seq_len % (2 * layout.cp):
        problems.append(f"seq_len={seq_len} is not a multiple of 2·cp={2 * layout.cp}")
    if layout.sp and layout.tp == 1:
        problems.append("sequence parallel needs tp > 1")
    if model is not None:
        problems.extend(_model_problems(layout, model))
    return problems


def _mesh_problems(layout: Layout, model: ModelSpec | None, stated_dp: int | None) -> list[str]:
    problems: list[str] = []
    dense = layout.tp * layout.cp * layout.pp
    if layout.num_gpus % dense:
        problems.append(f"num_gpus={layout.num_gpus} is not a multiple of tp·cp·pp={dense}")
    elif stated_dp is not None and stated_dp != layout.dp:
        problems.append(
            f"stated dp={stated_dp} but num_gpus/(tp·cp·pp)={layout.dp} "
            f"(tp·cp·dp·pp={dense * stated_dp} ≠ {layout.num_gpus})"
        )
    expert = layout.pp * layout.ep * layout.etp
    if layout.num_gpus % expert:
        problems.append(f"num_gpus={layout.num_gpus} is not a multiple of pp·ep·etp={expert}")
    if model is not None and model.moe is None and (layout.ep > 1 or layout.etp > 1):
        problems.append(f"ep={layout.ep}, etp={layout.etp} on a dense model")
    return problems


def _model_problems(layout: Layout, model: ModelSpec) -> list[str]:
    problems: list[str] = []
    if model.num_attention_heads % layout.tp:
        problems.append(f"heads={model.num_attention_heads} not divisible by tp={layout.tp}")
    # As constraint R8 (uneven split): the embedding and the loss may each take a virtual
    # stage (Megatron account_for_embedding/loss_in_pipeline_split; Llama 3 §3.3.2).
    if layout.pp * layout.vpp > model.num_layers + 2:
        problems.append(f"pp·vpp={layout.pp * layout.vpp} exceeds "
                        f"num_layers+2={model.num_layers + 2}")
    moe = model.moe
    if moe is not None:
        if moe.num_experts % layout.ep:
            problems.append(f"num_experts={moe.num_experts} not divisible by ep={layout.ep}")
        if moe.expert_ffn_hidden_size % layout.etp:
            problems.append(
                f"expert ffn={moe.expert_ffn_hidden_size} not divisible by etp={layout.etp}"
            )
    return problems


# --------------------------------------------------------------------------- models


@cache
def _preset(name: str) -> ModelSpec | None:
    """The preset called ``name``, or ``None`` if there is none (or no preset module)."""
    try:
        from parsearch.presets import get_preset
    except ModuleNotFoundError as exc:
        if exc.name in ("parsearch.presets", "parsearch"):
            return None
        raise
    try:
        return get_preset(name)
    except (ParsearchError, KeyError, ValueError, LookupError):
        return None


def _preset_candidates(base: str) -> tuple[str, ...]:
    if base in _PRESET_CANDIDATES:
        return _PRESET_CANDIDATES[base]
    if base.startswith("GPT-"):
        return (base.lower(),)
    return ()


def _preset_mismatches(spec: ModelSpec, row: Row) -> list[str]:
    """Row architecture columns that contradict the preset (blank cells are not checked)."""
    checks: list[tuple[str, int | None]] = [
        ("num_layers", spec.num_layers),
        ("hidden_size", spec.hidden_size),
        ("num_attention_heads", spec.num_attention_heads),
        ("vocab_size", spec.vocab_size),
    ]
    if spec.mla is None:
        checks.append(("num_query_groups", spec.num_query_groups))
    if spec.moe is None or spec.has_dense_mlp:
        checks.append(("ffn_hidden_size", spec.ffn_hidden_size))
    if spec.moe is not None:
        checks += [
            ("num_experts", spec.moe.num_experts),
            ("moe_topk", spec.moe.top_k),
            ("moe_ffn_hidden_size", spec.moe.expert_ffn_hidden_size),
        ]
    mismatches = []
    for column, value in checks:
        stated = _int(row, column)
        if stated is not None and stated != value:
            mismatches.append(f"{column} {stated} vs preset {value}")
    return mismatches


def _apply_variant(spec: ModelSpec, variant: str | None) -> ModelSpec:
    """Model changes a name variant implies (DeepSeek-V3 with / without MTP)."""
    if variant == "w/o MTP":
        return replace(spec, mtp_layers=0)
    if variant == "w/ MTP":
        return replace(spec, mtp_layers=max(1, spec.mtp_layers))
    return spec


def _model_from_columns(row: Row, base: str) -> ModelSpec | None:
    """A :class:`ModelSpec` from the row's architecture columns, or ``None`` if incomplete."""
    fills = _PUBLIC_CONFIG_FILLS.get(base, {})
    values = {
        column: _int(row, column) or fills.get(column)
        for column in (
            "num_layers",
            "hidden_size",
            "ffn_hidden_size",
            "num_attention_heads",
            "vocab_size",
        )
    }
    if base in _NEEDS_PRESET or any(v is None for v in values.values()):
        return None
    gpt = base.startswith("GPT-")
    heads = values["num_attention_heads"]
    groups = _int(row, "num_query_groups") or (heads if gpt else None)
    if groups is None:
        return None
    moe = _moe_from_columns(row) if _text(row, "arch_kind") == "moe" else None
    if _text(row, "arch_kind") == "moe" and moe is None:
        return None
    return ModelSpec(
        name=base,
        num_layers=values["num_layers"],
        hidden_size=values["hidden_size"],
        ffn_hidden_size=values["ffn_hidden_size"],
        num_attention_heads=heads,
        num_query_groups=groups,
        head_dim=fills.get("head_dim", values["hidden_size"] // heads),
        vocab_size=values["vocab_size"],
        tied_embeddings=gpt,
        mlp_activation="gelu" if gpt else "swiglu",
        norm="layernorm" if gpt else "rmsnorm",
        qkv_bias=gpt,
        moe=moe,
        source=f"published_runs.csv row {_text(row, 'id')} architecture columns",
    )


def _moe_from_columns(row: Row) -> MoeSpec | None:
    experts = _int(row, "num_experts")
    top_k = _int(row, "moe_topk")
    expert_ffn = _int(row, "moe_ffn_hidden_size")
    shared = _int(row, "num_shared_experts")
    if experts is None or top_k is None or expert_ffn is None or shared is None:
        return None
    return MoeSpec(
        num_experts=experts,
        top_k=top_k,
        expert_ffn_hidden_size=expert_ffn,
        shared_expert_ffn_hidden_size=shared * expert_ffn,
    )


def _megascale_block(row: Row) -> str | None:
    """Why a MegaScale-method row is not the standard GPT block (``None`` for Megatron-LM)."""
    if not _text(row, "notes").startswith("method=MegaScale"):
        return None
    return ("MegaScale's own model block: parallel attention+MLP and sliding-window "
            "attention (MegaScale §3.1, arXiv 2402.15627); the cost model prices the "
            "standard serial block, so only the Megatron-LM baseline rows are scored")


def resolve_model(row: Row) -> tuple[ModelSpec | None, str | None, str | None]:
    """(model, where it came from, why there is none) for one CSV row."""
    base, variant = split_model_name(_text(row, "model"))
    if base.startswith("Nemotron_3"):
        return None, None, "architecture unknown (hybrid Mamba: Nemotron 3)"
    disagreement = ""
    for name in _preset_candidates(base):
        spec = _preset(name)
        if spec is None:
            continue
        mismatches = _preset_mismatches(spec, row)
        if not mismatches:
            return _apply_variant(spec, variant), f"preset:{name}", None
        disagreement = f"preset {name} disagrees with row ({'; '.join(mismatches)})"
    spec = _model_from_columns(row, base)
    if spec is not None:
        return spec, "row columns", None
    return None, None, disagreement or f"no preset/arch for {base}"


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
    from parsearch.params import parameter_counts

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


def _measurement(
    row: Row, tag: str, model: ModelSpec | None, layout: Layout, seq_len: int
) -> tuple[float | None, str | None]:
    """(tokens/s/GPU, conversion id); (None, None) when it cannot be had."""
    tokens = _float(row, "measured_tokens_per_sec_per_gpu")
    if tokens is not None:
        return tokens, CONV_REPORTED
    tflops = _float(row, "measured_tflops_per_gpu")
    mfu = _float(row, "measured_mfu")
    flops_per_token, conversion, peak = _source_flops(row, tag, model, layout, seq_len)
    if flops_per_token is None:
        return None, None
    if tflops is None and mfu is not None and peak is not None:
        tflops = mfu * peak
    if tflops is None:
        return None, None
    return tflops * 1e12 / flops_per_token, conversion


def _source_flops(
    row: Row, tag: str, model: ModelSpec | None, layout: Layout, seq_len: int
) -> tuple[float | None, str | None, float | None]:
    """(FLOPs per token in the source's convention, conversion id, MFU peak)."""
    if tag in (NAR21, KOR22):
        L, h, V = (_int(row, c) for c in ("num_layers", "hidden_size", "vocab_size"))
        if L is None or h is None or V is None:
            return None, None, None
        if tag == NAR21:
            return nar21_flops_per_token(L, h, seq_len, V), CONV_NAR21, None
        return kor22_model_flops_per_token(L, h, seq_len, V), CONV_KOR22, KOR22_PEAK_TFLOPS
    if tag == MEGASCALE:
        L, h, V = (_int(row, c) for c in ("num_layers", "hidden_size", "vocab_size"))
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


# --------------------------------------------------------------------------- loading


def parse_row(row: Row) -> PublishedRun:
    """Turn one CSV row (a ``csv.DictReader`` dict) into a :class:`PublishedRun`."""
    source = _text(row, "source")
    tag = source_tag(source)
    layout, assumptions = _build_layout(row, tag, _text(row, "arch_kind") == "moe")
    seq_len = _required_int(row, "seq_length")
    global_batch = _required_int(row, "global_batch_size")
    model, model_source, model_problem = resolve_model(row)
    if model_source == "row columns":
        assumptions.append("model built from the row's architecture columns")
    if tag == MEGASCALE:
        model_problem = model_problem or _megascale_block(row)
        assumptions += ["GPU memory not stated ('NVIDIA Ampere'): A100 80 GB",
                        "precision not stated: BF16"]
    precision, recipe = normalise_precision(_text(row, "precision"))
    tokens, conversion = _measurement(row, tag, model, layout, seq_len)
    gpu = _text(row, "gpu")
    cluster = CLUSTER_BY_GPU.get(gpu)
    problems = layout_problems(layout, model, seq_len, global_batch, _int(row, "dp"))
    verified = _text(row, "verified")
    skip = _skip_reason(verified, gpu, cluster, model_problem, problems, tokens)
    return PublishedRun(
        id=_text(row, "id"),
        source=source,
        source_tag=tag,
        source_locator=_text(row, "source_locator"),
        model=_text(row, "model"),
        gpu=gpu,
        cluster=cluster,
        num_gpus=layout.num_gpus,
        layout=layout,
        global_batch=global_batch,
        seq_len=seq_len,
        precision=precision,
        precision_raw=_text(row, "precision"),
        fp8_recipe=recipe,
        measured_tokens_per_s_per_gpu=tokens,
        measured_tflops_per_gpu=_float(row, "measured_tflops_per_gpu"),
        measured_mfu=_float(row, "measured_mfu"),
        conversion=conversion,
        verified=verified,
        notes=_text(row, "notes"),
        model_spec=model,
        model_source=model_source,
        release=release_of(source),
        assumptions=tuple(assumptions),
        skip_reason=skip,
    )


def _skip_reason(
    verified: str,
    gpu: str,
    cluster: str | None,
    model_problem: str | None,
    layout_issues: Sequence[str],
    tokens: float | None,
) -> str | None:
    """The first reason (in a fixed order) why a row is not usable, or ``None``."""
    if verified == "no":
        return "verified=no"
    if cluster is None:
        return NO_PROFILE_REASONS.get(gpu, f"unknown GPU {gpu!r}")
    if model_problem is not None:
        return model_problem
    if layout_issues:
        return "layout invalid: " + "; ".join(layout_issues)
    if tokens is None or tokens <= 0:
        return "no measurement"
    return None


#: Largest runs file read (the bundled ones are under 1 MB).
MAX_FILE_BYTES = 64 * 2**20


def _read_text(path: str | Path | None) -> str:
    if path is None:
        return resources.files(DATA_PACKAGE).joinpath(DATA_FILE).read_text(encoding="utf-8")
    try:
        file = Path(path)
        if file.is_dir():
            raise SpecError(f"published runs {path}: is a folder, not a CSV file")
        if file.stat().st_size > MAX_FILE_BYTES:
            raise SpecError(f"published runs {path}: over {MAX_FILE_BYTES:,} bytes")
        return file.read_bytes().decode("utf-8-sig")
    except OSError as error:
        raise SpecError(f"published runs {path}: cannot read it ({error.strerror})") from None
    except UnicodeDecodeError as error:
        raise SpecError(f"published runs {path}: not UTF-8 text (byte {error.start}: "
                        f"{error.reason})") from None


@dataclass(frozen=True)
class PublishedRunsFile:
    """The rows of a runs file: the readable runs, and each unreadable row with why."""

    runs: list[PublishedRun]
    unreadable: tuple[tuple[str, str], ...]


def read_published_runs(path: str | Path | None = None) -> PublishedRunsFile:
    """Every row of the dataset (default: the packaged CSV), in file order.

    A row with a blank required cell or a malformed cell is not a run: it is
    listed in ``unreadable`` as ``(id, reason)`` (id ``line N`` when the id
    cell is blank) and the other rows are read.  A file that is not a runs
    CSV at all (unreadable, not UTF-8, required columns missing) raises
    :class:`SpecError`.
    """
    name = path or DATA_FILE
    try:
        reader = csv.DictReader(io.StringIO(_read_text(path)))
        fieldnames = reader.fieldnames or []
    except csv.Error as error:
        raise SpecError(f"published runs {name}: not a CSV file ({error})") from None
    missing = [c for c in ("id", "model", "num_gpus", "tp", "pp", "global_batch_size",
                           "seq_length") if c not in fieldnames]
    if missing:
        raise SpecError(
            f"published runs {name}: missing column(s) {', '.join(missing)}; "
            "use the columns of the bundled published_runs.csv"
        )
    runs: list[PublishedRun] = []
    unreadable: list[tuple[str, str]] = []
    line = 1
    try:
        for line, row in enumerate(reader, start=2):
            try:
                runs.append(parse_row(row))
            except (KeyError, ValueError, TypeError, ArithmeticError) as error:
                row_id = _text(row, "id") or f"line {line}"
                reason = str(error) if isinstance(error, SpecError) else repr(error)
                reason = reason.removeprefix(f"published run {row.get('id')}: ")
                unreadable.append((row_id, f"cannot read row: {' '.join(reason.split())[:300]}"))
    except csv.Error as error:
        raise SpecError(f"published runs {name} line {line + 1}: not CSV ({error})") from None
    return PublishedRunsFile(runs, tuple(unreadable))


def load_published_runs(path: str | Path | None = None) -> list[PublishedRun]:
    """The readable rows of the dataset (see :func:`read_published_runs` for the others)."""
    return read_published_runs(path).runs


# --------------------------------------------------------------------------- selections


def dev_rows(runs: Iterable[PublishedRun]) -> list[PublishedRun]:
    """Rows fit for accuracy checks: verified=yes, not skipped, with a model and a measurement."""
    return [
        run
        for run in runs
        if run.verified == "yes"
        and run.skip_reason is None
        and run.model_spec is not None
        and run.measured_tokens_per_s_per_gpu is not None
    ]


def group_key(run: PublishedRun) -> tuple[str, str, int, int]:
    """Key of the ranking study: runs that competed for the same job."""
    return (run.model, run.gpu, run.num_gpus, run.global_batch)


def dedupe_key(run: PublishedRun) -> tuple[object, ...]:
    """Same model, GPU, precision (and FP8 recipe), layout, batch and sequence length."""
    return (
        run.model,
        run.gpu,
        run.precision,
        run.fp8_recipe,
        run.layout,
        run.global_batch,
        run.seq_len,
    )


def dedupe(runs: Iterable[PublishedRun]) -> list[PublishedRun]:
    """One run per :func:`dedupe_key`: the latest NeMo release wins (first row on ties).

    Rows without a release (papers) rank below any release. Order of the
    survivors follows the input.
    """
    ordered = list(runs)
    best: dict[tuple[object, ...], PublishedRun] = {}
    for run in ordered:
        key = dedupe_key(run)
        held = best.get(key)
        if held is None or (run.release or ()) > (held.release or ()):
            best[key] = run
    chosen = {id(run) for run in best.values()}
    return [run for run in ordered if id(run) in chosen]


def training_spec(run: PublishedRun) -> TrainingSpec:
    """A :class:`TrainingSpec` for the run's job that admits its own choices.

    The micro-batch size, recompute mode and sequence-parallel setting are
    pinned to the run's; the other axes stay open (``max_vpp`` unbounded).
    """
    sp_mode = "on" if run.layout.sp or run.layout.tp == 1 else "off"
    return TrainingSpec(
        seq_len=run.seq_len,
        global_batch=run.global_batch,
        micro_batch_sizes=(run.layout.mbs,),
        precision=run.precision,
        recompute_modes=(run.layout.recompute,),
        sequence_parallel=sp_mode,
        fsdp=uses_fsdp(run),
    )


def uses_fsdp(run: PublishedRun) -> bool:
    """Whether the source says the run used fully sharded data parallelism.

    "FSDP=..." in the notes (NVIDIA tables), or a torchtitan row: torchtitan's
    data parallelism is FSDP2 (ZeRO-3-style) in every benchmark it publishes.
    """
    return "FSDP=" in run.notes or run.source_tag == TORCHTITAN
