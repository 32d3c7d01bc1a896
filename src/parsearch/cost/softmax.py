"""The softmax exponentials of fused attention, per GPU.

Fused attention computes one exponential per attention score in forward and recomputes
it once in backward (FlashAttention-2, arXiv 2307.08691 §3.1), on the special function
units (SFUs), not the tensor cores.  Per score the forward matmuls do ``2 (d_qk + d_v)``
FLOPs, so at head dim 128 the tensor cores outrun the SFUs: on H100 SXM, 989 TFLOP/s of
BF16 matmul against 3.9 T exponentials/s, the exponentials take about half the matmul
time (FlashAttention-3, arXiv 2407.08608 §3.1).  Kernels hide part of that time behind
the matmuls (warp-group ping-pong); the rest is exposed.

A generation's efficiency profile gives attention's end-to-end efficiency for the
generation as a whole; within a generation the SFU rate differs (Blackwell Ultra doubles
it over Blackwell: NVIDIA technical blog "Making Softmax More Efficient with NVIDIA
Blackwell Ultra", 2026), so each GPU's attention is scaled by its speed relative to the
generation's mean at the model's head dims (:func:`attention_scale`), the way
:func:`parsearch.cost.compute.matmul_scale` scales GEMMs.
"""

from __future__ import annotations

from parsearch.cost.efficiency import EfficiencyProfile
from parsearch.model.specs import ModelSpec
from parsearch.topology.hardware import GpuProfile, generation_profiles

#: Share of the exponential time that the tensor-core matmuls do not hide.  From NVIDIA's
#: measurement in the blog above: FP8 attention forward on DeepSeek-V3 shapes runs about
#: 35% faster on GB300 than on GB200 when only the SFU rate doubles.  With our rates
#: (exponential time over matmul time at peak: 1.68 on GB200, 0.78 on GB300),
#: (1 + 1.68 k) / (1 + 0.78 k) = 1.35 gives k = 0.55.
EXP_EXPOSED_SHARE = 0.55
#: Backward does 2.5x the forward matmul FLOPs per score (FlashAttention-2 §3.2: five
#: matmuls against two) and one exponential (the recomputed probabilities).
BACKWARD_FLOPS_RATIO = 2.5


def flops_per_score(model: ModelSpec) -> float:
    """Forward matmul FLOPs per attention score: ``2 (d_qk + d_v)`` (QKᵀ and P·V).

    >>> from parsearch.model.presets import get_preset
    >>> flops_per_score(get_preset("llama3-70b"))
    512.0
    """
    mla = model.mla
    if mla is None:
        return 2.0 * (model.head_dim + model.head_dim)
    return 2.0 * (mla.qk_nope_head_dim + mla.qk_rope_head_dim + mla.v_head_dim)


def attention_speed(gpu: GpuProfile, score_flops: float, *, backward: bool,
                    precision: str = "bf16") -> float | None:
    """Matmul time over matmul + exposed exponential time (1.0: no SFU limit).

    ``precision`` is the attention matmuls' (``fp8`` with FP8 attention): at twice the
    tensor rate the same exponentials weigh twice as much.  ``None`` when the profile
    states no SFU rate.
    """
    if gpu.exp_per_s is None:
        return None
    flops = score_flops * (BACKWARD_FLOPS_RATIO if backward else 1.0)
    exp_over_mma = (gpu.peak_flops[precision] / flops) / gpu.exp_per_s
    return 1.0 / (1.0 + EXP_EXPOSED_SHARE * exp_over_mma)


def _generation_speed(gpus: tuple[str, ...], score_flops: float, backward: bool) -> float | None:
    """Mean :func:`attention_speed` of a generation's GPUs that state an SFU rate."""
    speeds = [speed for p in generation_profiles(gpus)
              if (speed := attention_speed(p, score_flops, backward=backward)) is not None]
    return sum(speeds) / len(speeds) if speeds else None


def attention_scale(gpu: GpuProfile, profile: EfficiencyProfile, model: ModelSpec, *,
                    backward: bool, precision: str = "bf16") -> float:
    """This GPU's fused-attention speed relative to its generation's mean (1.0: unknown).

    The profile's attention efficiency is the generation's BF16 end-to-end rate, so the
    reference is always the BF16 speed; ``precision="fp8"`` (FP8 attention) gives this
    GPU's speed with the matmuls at the FP8 rate against that reference, which with the
    FP8 peak prices FP8 attention as the same kernel with faster matmuls and the same
    exponentials (FlashAttention-3, arXiv 2407.08608, abstract: about 1.2 PFLOP/s in
    FP8 against 740 TFLOP/s in FP16 on H100, 1.6x; this model gives 1.65x at head dim 128).

    >>> from parsearch.cost.efficiency import efficiency_for_gpu
    >>> from parsearch.model.presets import get_preset
    >>> llama = get_preset("llama3-70b")
    >>> from parsearch.topology.hardware import load_gpu_profile
    >>> gb300 = load_gpu_profile("gb300")
    >>> round(attention_scale(gb300, efficiency_for_gpu("gb300"), llama, backward=False), 3)
    1.093
    """
    score_flops = flops_per_score(model)
    own = attention_speed(gpu, score_flops, backward=backward, precision=precision)
    reference = _generation_speed(tuple(profile.gpus), score_flops, backward)
    if own is None or reference is None:
        return 1.0
    return own / reference


def calibration_head_dim(model: ModelSpec, profile: EfficiencyProfile) -> int:
    """The head dim the profile's attention efficiency was measured at, for ``model``: its
    own where the calibration runs had it (or MLA, or no record), else the nearest one
    they had (ties: the smaller).

    >>> from parsearch.cost.efficiency import efficiency_for_gpu
    >>> from parsearch.model.presets import get_preset
    >>> calibration_head_dim(get_preset("gpt-oss-120b"), efficiency_for_gpu("b200"))
    128
    """
    coverage = profile.coverage
    if coverage is None or model.mla is not None or not coverage.head_dims:
        return model.head_dim
    if model.head_dim in coverage.head_dims:
        return model.head_dim
    return min(coverage.head_dims, key=lambda d: (abs(d - model.head_dim), d))


def head_dim_scale(profile: EfficiencyProfile, model: ModelSpec, *, backward: bool) -> float:
    """The generation's fused-attention speed at the model's head dim over its speed at the
    calibration's (1.0 where the calibration had the model's head dim).

    The exponentials are a fixed cost per score while the matmul FLOPs per score scale
    with the head dim (FlashAttention-3, arXiv 2407.08608 §3.1), so a head dim below the
    calibration's spends a larger share of its time on the SFUs than the fitted
    efficiency holds: GPT-OSS's 64 against the calibrated 128 on Blackwell runs its
    forward at 0.79x and its backward at 0.88x of the calibrated rate per FLOP.
    :func:`attention_scale` compares GPUs at the model's own head dim; this factor
    carries the generation from the calibrated head dim to the model's.

    >>> from parsearch.cost.efficiency import efficiency_for_gpu
    >>> from parsearch.model.presets import get_preset
    >>> profile = efficiency_for_gpu("b200")
    >>> round(head_dim_scale(profile, get_preset("gpt-oss-120b"), backward=False), 2)
    0.79
    >>> head_dim_scale(profile, get_preset("llama3-70b"), backward=False)
    1.0
    """
    calibrated = calibration_head_dim(model, profile)
    if calibrated == model.head_dim:
        return 1.0
    gpus = tuple(profile.gpus)
    own = _generation_speed(gpus, flops_per_score(model), backward)
    reference = _generation_speed(gpus, 4.0 * calibrated, backward)
    if own is None or reference is None:
        return 1.0
    return own / reference
