"""Factors that move together in calibration: a tied factor follows its anchor by a ratio.

Where two profile factors price the same kind of kernel run two ways, what lowers a
workload's rate below the microbenchmarks is common to both and only their ratio is a
property of the hardware or the kernel, which is measured:

* **GEMMs by precision.**  ``gemm_efficiency[p]`` is the large-GEMM ceiling of
  precision ``p`` on the shapes training runs (the size curve of
  :func:`parsearch.cost.compute.gemm_efficiency` handles small GEMMs, with one fixed
  time per call for every precision).  What keeps it below the best achievable matmul
  -- LLM shapes, Transformer Engine's kernels, real data, sustained power -- is common to
  the precisions; how close each precision's tensor cores get to their datasheet peak
  is what maximum-achievable-matmul sweeps measure (stas00/ml-engineering MAMF table, in
  the hardware profiles' ``large_matmul_fraction``: H100 BF16 0.803, FP8 0.709; B200
  0.776, 0.763).  FP8 follows BF16 by the generation's mean FP8/BF16 ratio over the GPUs
  that measured both.  Fitted separately, the two landed on those ratios in sample
  (0.89 Hopper against 0.90 measured, 0.99 Blackwell against 0.97) but wandered in the
  folds where one family's rows were the only ones to resolve one of them.  FP4 has no
  measured large-matmul ceiling and stays a factor of its own.
* **Fused attention, backward by forward.**  The same kernel family runs both passes
  and backward reaches the smaller share of the peak (FlashAttention-3, arXiv
  2407.08608: H100 BF16 forward 616-756 TFLOP/s, backward 561 at head dim 128;
  FlashAttention-2, arXiv 2307.08691: A100 forward 50-73%, backward 40-60% of peak).
  Backward follows forward by the ratio of the profile's cited priors, which read those
  measurements.  Fitted alone, forward fell below backward on Hopper (0.30 against
  0.45), an order no measurement shows.  Whether the runs can fit the pair apart from
  GEMMs and memory-bound work is :func:`parsearch.validation.fit.calibration.separable`'s
  to say: on Hopper the long-context Mixtral runs can; on Blackwell they cannot, and it
  keeps its prior.
"""

from __future__ import annotations

from parsearch.cost.compute import generation_matmul_reference
from parsearch.cost.efficiency import EfficiencyProfile, Prior

GEMM_ANCHOR = "gemm_efficiency.bf16"
ATTENTION_ANCHOR = "attention_forward_efficiency"
ATTENTION_TIED = "attention_backward_efficiency"


def factor_ties(profile: EfficiencyProfile) -> dict[str, tuple[str, float]]:
    """``{tied factor: (anchor factor, ratio)}`` for ``profile``.

    >>> from parsearch.cost.efficiency import load_efficiency_profile
    >>> ties = factor_ties(load_efficiency_profile("hopper"))
    >>> {k: (a, round(r, 4)) for k, (a, r) in sorted(ties.items())}
    {'attention_backward_efficiency': ('attention_forward_efficiency', 0.8182), \
'gemm_efficiency.fp8': ('gemm_efficiency.bf16', 0.8985)}
    >>> sorted(factor_ties(load_efficiency_profile("ampere")))
    ['attention_backward_efficiency']
    """
    out: dict[str, tuple[str, float]] = {}
    priors = profile.priors
    bf16 = generation_matmul_reference(tuple(profile.gpus), "bf16")
    fp8 = generation_matmul_reference(tuple(profile.gpus), "fp8")
    if (bf16 and fp8 and GEMM_ANCHOR in priors and "gemm_efficiency.fp8" in priors
            and "fp8" in profile.gemm_efficiency):
        out["gemm_efficiency.fp8"] = (GEMM_ANCHOR, fp8 / bf16)
    if ATTENTION_ANCHOR in priors and ATTENTION_TIED in priors:
        out[ATTENTION_TIED] = (ATTENTION_ANCHOR,
                               priors[ATTENTION_TIED].value / priors[ATTENTION_ANCHOR].value)
    return out


def with_ties(values: dict[str, float],
              ties: dict[str, tuple[str, float]]) -> dict[str, float]:
    """``values`` plus each tied factor whose anchor is given (explicit values win)."""
    out = dict(values)
    for name, (anchor, ratio) in ties.items():
        if anchor in values:
            out.setdefault(name, values[anchor] * ratio)
    return out


def anchor_prior(profile: EfficiencyProfile, anchor: str,
                 ties: dict[str, tuple[str, float]]) -> Prior:
    """``anchor``'s range narrowed so the factors tied to it stay inside their cited ranges.

    The prior value is the anchor's, moved into the narrowed range if it falls outside;
    where the ranges cannot all hold, the anchor's own range is kept.
    """
    own = profile.priors[anchor]
    low, high = own.low, own.high
    parts = [own.source]
    for name, (to, ratio) in ties.items():
        if to != anchor:
            continue
        tied = profile.priors[name]
        low, high = max(low, tied.low / ratio), min(high, tied.high / ratio)
        parts.append(f"{name} = {ratio:.4f} x this, inside its range "
                     f"{tied.low:g}..{tied.high:g}")
    if low > high:
        return own
    return Prior(min(max(own.value, low), high), low, high, "; ".join(parts))


def anchors(ties: dict[str, tuple[str, float]]) -> set[str]:
    """The factors others follow."""
    return {anchor for anchor, _ in ties.values()}


def gemm_ties(profile: EfficiencyProfile) -> dict[str, tuple[str, float]]:
    """The GEMM ties of :func:`factor_ties` only.

    Calibration to a user's own runs (:mod:`parsearch.validation.user.user_calibration`) keeps
    attention backward at its shipped value: a handful of runs of one model cannot tell
    attention from GEMMs apart (the separability test of the published-run fit needs the
    variety of many models and sequence lengths), and tied, attention's doubled effect
    would win the factor ranking over the GEMMs whatever the runs show.
    """
    return {name: tie for name, tie in factor_ties(profile).items() if tie[0] == GEMM_ANCHOR}
