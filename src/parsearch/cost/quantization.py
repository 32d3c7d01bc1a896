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
* ``nvfp4`` (Transformer Engine ``NVFP4BlockScaling``; NVIDIA, "Pretraining
  Large Language Models with NVFP4", arXiv 2509.25149 §4): a per-tensor FP32
  scale from the tensor's amax (one BF16 read) on top of E4M3 scales per
  16 elements; the row-wise cast reads BF16 and writes 4-bit values plus a
  scale byte per 16 (2 + 0.5625); the wgrad operands are cast again after a
  random Hadamard transform (2 + 0.5625): about 7.1 bytes per element.
"""

from __future__ import annotations

from parsearch.errors import SpecError

#: FP8 scaling recipes a run can ask for (``auto``: MXFP8 on Blackwell, else tensorwise).
FP8_RECIPE_CHOICES: tuple[str, ...] = ("auto", "tensorwise", "delayed", "mxfp8", "blockwise")
#: HBM bytes per GEMM-operand element spent on casts, by recipe (module docstring).
QUANTIZE_BYTES_PER_ELEMENT: dict[str, float] = {
    "mxfp8": 2.0 + 1.0 + 1.0,
    "blockwise": 2.0 + 1.0 + 1.0,
    "delayed": 2.0 + 1.0 + 1.0,
    "tensorwise": 2.0 + 2.0 + 1.0 + 1.0,
    "nvfp4": 2.0 + (2.0 + 0.5625) + (2.0 + 0.5625),
}


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
    >>> quantize_bytes_per_element("fp4", "auto", 10.0)
    7.125
    """
    if precision == "bf16":
        return 0.0
    if precision == "fp4":
        return QUANTIZE_BYTES_PER_ELEMENT["nvfp4"]
    return QUANTIZE_BYTES_PER_ELEMENT[resolve_fp8_recipe(fp8_recipe, compute_capability)]


__all__ = ["FP8_RECIPE_CHOICES", "QUANTIZE_BYTES_PER_ELEMENT", "quantize_bytes_per_element",
           "resolve_fp8_recipe"]
