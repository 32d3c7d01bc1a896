"""Which precisions' GEMM efficiencies move with BF16 in calibration, and by what ratio.

A profile's ``gemm_efficiency[p]`` is the large-GEMM ceiling of precision ``p`` on the
shapes training runs (the size curve of :func:`parsearch.cost.compute.gemm_efficiency`
handles small GEMMs, with one fixed time per call for every precision).  What lowers it
below the best achievable matmul -- LLM shapes, Transformer Engine's kernels, real data,
sustained power -- is common to the precisions; what differs between them is how close
each precision's tensor cores get to their datasheet peak, which maximum-achievable-matmul
sweeps measure (stas00/ml-engineering MAMF table, in the hardware profiles'
``large_matmul_fraction``: H100 BF16 0.803, FP8 0.709; B200 0.776, 0.763).

So calibration fits one GEMM factor, expressed as the BF16 efficiency, and sets FP8 from
it by the generation's measured FP8/BF16 large-matmul ratio (means over the generation's
GPUs that measured both).  Fitted separately, the two trade off against whatever else a
family's rows share: on the published runs the free fit landed on FP8/BF16 = 0.89 for
Hopper (the MAMF ratio is 0.90) and 0.99 for Blackwell (0.97), and a family held out of
the fit left one of them resolved by one or two rows.  FP4 has no measured
large-matmul ceiling and stays a factor of its own.
"""

from __future__ import annotations

from parsearch.cost.compute import generation_matmul_reference
from parsearch.cost.efficiency import EfficiencyProfile, Prior

#: The factor tied precisions follow.
TIE_ANCHOR = "gemm_efficiency.bf16"


def gemm_ties(profile: EfficiencyProfile) -> dict[str, float]:
    """``{"gemm_efficiency.fp8": ratio}`` where the generation measured both ceilings.

    >>> from parsearch.cost.efficiency import load_efficiency_profile
    >>> {k: round(v, 4) for k, v in gemm_ties(load_efficiency_profile("hopper")).items()}
    {'gemm_efficiency.fp8': 0.8985}
    >>> gemm_ties(load_efficiency_profile("ampere"))
    {}
    """
    bf16 = generation_matmul_reference(tuple(profile.gpus), "bf16")
    out = {}
    for precision in ("fp8",):
        name = f"gemm_efficiency.{precision}"
        other = generation_matmul_reference(tuple(profile.gpus), precision)
        if (bf16 and other and TIE_ANCHOR in profile.priors and name in profile.priors
                and precision in profile.gemm_efficiency):
            out[name] = other / bf16
    return out


def with_ties(values: dict[str, float], ties: dict[str, float]) -> dict[str, float]:
    """``values`` plus each tied precision's efficiency, where the anchor is given."""
    if TIE_ANCHOR not in values:
        return dict(values)
    out = dict(values)
    for name, ratio in ties.items():
        out.setdefault(name, values[TIE_ANCHOR] * ratio)
    return out


def anchor_prior(profile: EfficiencyProfile, ties: dict[str, float]) -> Prior:
    """The anchor's range narrowed so every tied precision stays inside its own cited range.

    The prior value is the anchor's, moved into the narrowed range if it falls outside.
    """
    own = profile.priors[TIE_ANCHOR]
    low, high = own.low, own.high
    parts = [own.source]
    for name, ratio in ties.items():
        tied = profile.priors[name]
        low, high = max(low, tied.low / ratio), min(high, tied.high / ratio)
        parts.append(f"{name} = {ratio:.4f} x this, inside its range "
                     f"{tied.low:g}..{tied.high:g} (measured large-matmul ratio)")
    if low > high:  # the cited ranges cannot both hold: keep the anchor's own
        return own
    return Prior(min(max(own.value, low), high), low, high, "; ".join(parts))
