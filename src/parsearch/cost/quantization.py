"""HBM bytes the low-precision recipes spend casting GEMM operands, per recipe.

Every FP8/FP4 GEMM input (and every output gradient feeding a backward GEMM) is
read in BF16 and written in 8 or 4 bits, row-wise for the forward/dgrad GEMM
and column-wise (transposed) for the wgrad GEMM.  What else a recipe reads
depends on where its scales come from:

* ``mxfp8`` / ``blockwise`` / ``delayed``: the scale is known when the cast
  kernel runs (per 32-element block computed in the kernel, OCP Microscaling
  spec v1.0 §5; per 1x128 / 128x128 block, DeepSeek-V3 report §3.3.1; from the
  amax history, Transformer Engine ``DelayedScaling``): one read of the BF16
  tensor, two 8-bit writes: 2 + 1 + 1 = 4 bytes per element (scales: 1 byte
  per 32 or 128 elements, left out).
* ``tensorwise`` (Transformer Engine ``Float8CurrentScaling``): the scale is
  the current tensor's amax, which a reduction over the whole tensor computes
  before the cast can start: one more BF16 read, 6 bytes per element
  (Transformer Engine docs, "FP8 Delayed Scaling": "FP8 Current Scaling requires
  two tensor reads per quantization: one to compute amax, one to cast").

Per-tensor scaled FP8 (``tensorwise``, ``delayed``) needs the transposed copy
only where the GEMM takes FP8 operands in the TN layout alone (Hopper).
Blackwell's data-centre parts (SM 10.x) run FP8 GEMMs in every layout, and
Transformer Engine then skips the transposed write (``quantizer.cpp``:
``create_transpose = columnwise_usage && !nvte_is_non_tn_fp8_gemm_supported()``):
one byte less per element there.  Block-scaled recipes keep both copies, whose
scales run along different dimensions.  TE's GEMM profiling guide (B300,
``docs/examples/gemm_profiling``) measures the cast overhead of current scaling
at 2.335 ms and of MXFP8 at 1.823 ms per layer (autocast minus pre-quantized):
a ratio of 1.28, against 5/4 = 1.25 here (6/4 = 1.5 with the transpose).

Block-scaled FP8 GEMMs also run slower than per-tensor ones: the MMA loads a
scale per 32-element block beside the operands.  The same guide's pre-quantized
per-layer GEMM totals on B300 are 6.812 ms (FP8 current scaling) and 7.161 ms
(MXFP8): MXFP8 runs at 0.951 of the per-tensor FP8 rate (``MXFP8_GEMM_RATE``).
Blockwise FP8 on Blackwell is emulated through MXFP8 (same guide), so it shares
that rate there.
* ``nvfp4`` (Transformer Engine ``NVFP4BlockScaling``; NVIDIA, "Pretraining
  Large Language Models with NVFP4", arXiv 2509.25149 §4): a per-tensor FP32
  scale from the tensor's amax (one BF16 read) on top of E4M3 scales per
  16 elements; the row-wise cast reads BF16 and writes 4-bit values plus a
  scale byte per 16 (2 + 0.5625); the wgrad operands are cast again after a
  random Hadamard transform (2 + 0.5625): about 7.1 bytes per element.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from parsearch.errors import SpecError
from parsearch.model.specs import ModelSpec

#: FP8 scaling recipes a run can ask for (``auto``: MXFP8 on Blackwell, else tensorwise).
FP8_RECIPE_CHOICES: tuple[str, ...] = ("auto", "tensorwise", "delayed", "mxfp8", "blockwise")
#: HBM bytes per GEMM-operand element spent on casts, by recipe, on a GPU whose FP8
#: GEMMs take the TN layout only (Hopper; module docstring).
QUANTIZE_BYTES_PER_ELEMENT: dict[str, float] = {
    "mxfp8": 2.0 + 1.0 + 1.0,
    "blockwise": 2.0 + 1.0 + 1.0,
    "delayed": 2.0 + 1.0 + 1.0,
    "tensorwise": 2.0 + 2.0 + 1.0 + 1.0,
    "nvfp4": 2.0 + (2.0 + 0.5625) + (2.0 + 0.5625),
}
#: Per-tensor scaled recipes whose transposed FP8 copy a non-TN GPU skips (1 byte each).
TRANSPOSED_COPY_RECIPES: tuple[str, ...] = ("tensorwise", "delayed")
#: MXFP8 GEMM rate over per-tensor FP8 on the same GPU: TE GEMM profiling guide, B300
#: pre-quantized per-layer GEMM totals, 6.812 ms (current scaling) / 7.161 ms (MXFP8).
MXFP8_GEMM_RATE = 6.812 / 7.161


def runs_non_tn_fp8_gemms(compute_capability: float | None) -> bool:
    """Whether FP8 GEMMs take operands in every layout (data-centre Blackwell, SM 10.x).

    Transformer Engine ``nvte_is_non_tn_fp8_gemm_supported``: Hopper (9.0) and the
    consumer Blackwell parts (12.x) run FP8 GEMMs in the TN layout only.

    >>> [runs_non_tn_fp8_gemms(cc) for cc in (9.0, 10.0, 12.0, None)]
    [False, True, False, False]
    """
    return compute_capability is not None and 10.0 <= compute_capability < 12.0


def resolve_fp8_recipe(requested: str, compute_capability: float | None) -> str:
    """The FP8 recipe for ``requested`` (``auto``: MXFP8 on Blackwell, else tensorwise).

    >>> resolve_fp8_recipe("auto", 10.0), resolve_fp8_recipe("auto", 9.0)
    ('mxfp8', 'tensorwise')
    """
    if requested not in FP8_RECIPE_CHOICES:
        raise SpecError(f"fp8 recipe {requested!r} is not one of {', '.join(FP8_RECIPE_CHOICES)}")
    if requested != "auto":
        return requested
    return "mxfp8" if compute_capability is not None and compute_capability >= 10 else "tensorwise"


def quantize_bytes_per_element(precision: str, fp8_recipe: str,
                               compute_capability: float | None) -> float:
    """Cast bytes per GEMM-operand element for a run in ``precision`` (0 for BF16).

    >>> quantize_bytes_per_element("bf16", "auto", 9.0)
    0.0
    >>> [quantize_bytes_per_element("fp8", "auto", cc) for cc in (9.0, 10.0)]
    [6.0, 4.0]
    >>> [quantize_bytes_per_element("fp8", "tensorwise", cc) for cc in (9.0, 10.0)]
    [6.0, 5.0]
    >>> quantize_bytes_per_element("fp4", "auto", 10.0)
    7.125
    """
    if precision == "bf16":
        return 0.0
    if precision == "fp4":
        return QUANTIZE_BYTES_PER_ELEMENT["nvfp4"]
    recipe = resolve_fp8_recipe(fp8_recipe, compute_capability)
    skipped = recipe in TRANSPOSED_COPY_RECIPES and runs_non_tn_fp8_gemms(compute_capability)
    return QUANTIZE_BYTES_PER_ELEMENT[recipe] - (1.0 if skipped else 0.0)


def gemm_rate_factor(precision: str, fp8_recipe: str,
                     compute_capability: float | None) -> float:
    """GEMM rate of ``precision`` under its recipe over the per-tensor FP8 rate.

    The profiles' FP8 efficiencies are anchored on per-tensor FP8 matmul sweeps
    (``torch._scaled_mm``); block-scaled MXFP8 (and blockwise FP8 on Blackwell, which
    runs as MXFP8) is slower by ``MXFP8_GEMM_RATE``.

    >>> [round(gemm_rate_factor("fp8", r, 10.0), 3) for r in ("tensorwise", "mxfp8")]
    [1.0, 0.951]
    >>> gemm_rate_factor("fp8", "blockwise", 9.0), gemm_rate_factor("bf16", "mxfp8", 10.0)
    (1.0, 1.0)
    """
    if precision != "fp8":
        return 1.0
    recipe = resolve_fp8_recipe(fp8_recipe, compute_capability)
    block_scaled_mma = recipe == "mxfp8" or (
        recipe == "blockwise" and runs_non_tn_fp8_gemms(compute_capability))
    return MXFP8_GEMM_RATE if block_scaled_mma else 1.0


#: HBM bytes per element of one FP8 attention cast: read BF16 and write FP8, or read FP8
#: and write BF16 (2 + 1).
FP8_ATTENTION_CAST_BYTES = 3.0


def fp8_attention_cast_bytes_per_token(model: ModelSpec, tp: Any) -> Any:
    """HBM bytes per token (one rank's heads) that FP8 attention spends on casts.

    Transformer Engine's FP8 dot-product attention (recipe ``fp8_dpa``) casts its inputs
    to FP8 and its outputs back (recipe docstring, ``transformer_engine/common/recipe``):
    forward Q, K, V in and O out; backward dO in and dQ, dK, dV out, so every element of
    Q, K, V and O is cast twice per pass pair (``FP8_ATTENTION_CAST_BYTES`` each).  Q and O
    carry the rank's query heads; K and V its KV heads (GQA), or every query head's latent
    up-projection under MLA.

    >>> from parsearch.model.presets import get_preset
    >>> float(fp8_attention_cast_bytes_per_token(get_preset("llama3-8b"), 1))
    61440.0
    """
    tp = np.asarray(tp, dtype=np.float64)
    heads = model.num_attention_heads / tp
    mla = model.mla
    if mla is not None:
        qk = mla.qk_nope_head_dim + mla.qk_rope_head_dim
        elements = heads * (2.0 * qk + 2.0 * mla.v_head_dim)
    else:
        kv_heads = model.num_query_groups / np.minimum(tp, model.num_query_groups)
        elements = heads * 2.0 * model.head_dim + kv_heads * 2.0 * model.head_dim
    return 2.0 * FP8_ATTENTION_CAST_BYTES * elements


__all__ = ["FP8_ATTENTION_CAST_BYTES", "FP8_RECIPE_CHOICES", "MXFP8_GEMM_RATE",
           "QUANTIZE_BYTES_PER_ELEMENT", "TRANSPOSED_COPY_RECIPES",
           "fp8_attention_cast_bytes_per_token", "gemm_rate_factor",
           "quantize_bytes_per_element", "resolve_fp8_recipe", "runs_non_tn_fp8_gemms"]
