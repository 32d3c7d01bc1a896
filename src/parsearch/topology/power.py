"""Sustained SM clock under a power limit or a clock lock, and the compute speed it leaves.

A GPU under a board power limit keeps its draw at the limit by lowering the SM clock
(``nvidia-smi -pl``: the firmware throttles the clock, not the memory), so the
tensor-core and special-function rates scale with the sustained SM clock while HBM
bandwidth does not (see *memory-bound work* below).  Dynamic power grows as
``f * V**2`` and the voltage rises with the clock, so near the top of the
voltage/frequency curve the sustained clock grows as a small power of the board power:

    f(P) = f(P_rated) * (P / P_rated) ** gamma

**gamma = 0.30**, from NVIDIA's own ratings of the same 132-SM GH100 die at two board
powers (NVIDIA H100 product page / datasheet, columns "H100 SXM" and "H100 NVL",
as of 2026-12): 1,979 and 1,671 sparse BF16 TFLOP/s at "up to 700 W" and "350-400 W",
i.e. tensor clocks of 1,830 and 1,545 MHz (540,672 dense BF16 FLOP per clock;
glennklockwood.com/garden/peak-FLOPS; 1,830 MHz is NVIDIA's H100/H200 compute clock,
stas00/ml-engineering compute/accelerator "Clock speed" note 12):
``ln(1830/1545) / ln(700/400) = 0.3026``.  A measured check on another die:
ml-engineering's maximum-achievable-matmul table gives A100 SXM (400 W) 271.2 and A100
PCIe (300 W) 252.9 BF16 TFLOP/s, the same 108-SM GA100 at the same 1,410 MHz boost;
the law predicts 271.2 x 0.75**0.30 = 248.8 (1.6 % low; that pair alone gives
gamma = 0.24).  So an H100 SXM capped at 500 W keeps (5/7)**0.30 = 0.904 of its
700 W compute rate (0.922 with gamma = 0.24): torchtitan's footnote on its 500 W-class
H100s puts their peak "between SXM and NVL" (989 and 835 TFLOP/s), and the law gives 894.

The reference clock is the clock sustained under dense tensor-core load at the rated
power, not the boost clock: DeepSeek measured ~1,600 MHz on an H800 SXM5 at 700 W
("due to throttling (reducing to ~1600 MHz in our case), the practical peak FLOPs drops
to ~865 TFlops"; deepseek-ai/FlashMLA docs/20250422-new-kernel-deep-dive.md).  The
efficiency profiles were fitted on GPUs running there, so a clock lock above it changes
nothing and one below it slows compute by ``lock / sustained``.

**Memory-bound work** keeps its speed: a power cap throttles the SM clock and leaves the
memory clock alone (an RTX 3090 at a binding 315 W cap ran its memory clock at the full
9,501 MHz in every sample while the SM clock fell, ashalliants/ninfer-3090 PR #72), and
HBM-bound decode on an H200 draws 137-300 W of its 700 W, below any cap that would bind
(Ma et al., "The Illusion of Power Capping in LLM Decode", arXiv 2605.11999).  Below
about 300 W on an H100 the memory's own share of the budget is no longer small
(Ujeniya et al., arXiv 2604.11391, caps from 200 to 700 W); the model does not follow
that, and the fitted range of the law is 300-700 W.
"""

from __future__ import annotations

from parsearch.errors import SpecError
from parsearch.topology.gpu_profile import GpuProfile

#: gamma of ``f ~ P ** gamma``: the H100 SXM / H100 NVL datasheet pair (0.3026), rounded.
POWER_CLOCK_EXPONENT = 0.30


def power_limited_clock_MHz(gpu: GpuProfile, power_limit_W: float) -> float:
    """SM clock sustained under dense tensor-core load at a board power limit.

    >>> from parsearch.topology.hardware import load_gpu_profile
    >>> round(power_limited_clock_MHz(load_gpu_profile("h100-sxm"), 500))
    1446
    """
    if gpu.tdp_W is None or gpu.sustained_clock_MHz is None:
        raise SpecError(f"GPU '{gpu.name}' has no rated power and sustained clock in its "
                        "hardware profile (tdp_W, sustained_clock_MHz), so a power limit "
                        "cannot be priced; give a profile file that states them")
    gamma = gpu.power_clock_exponent or POWER_CLOCK_EXPONENT
    return gpu.sustained_clock_MHz * (power_limit_W / gpu.tdp_W) ** gamma


def sustained_clock_MHz(gpu: GpuProfile, power_limit_W: float | None = None,
                        clock_lock_MHz: float | None = None) -> float:
    """The SM clock the GPU sustains: the lower of the power-limited clock and the lock."""
    if gpu.sustained_clock_MHz is None:
        raise SpecError(f"GPU '{gpu.name}' has no sustained clock in its hardware profile "
                        "(sustained_clock_MHz), so a power limit or clock lock cannot be "
                        "priced")
    clock = gpu.sustained_clock_MHz
    if power_limit_W is not None:
        clock = power_limited_clock_MHz(gpu, power_limit_W)
    if clock_lock_MHz is not None:
        clock = min(clock, clock_lock_MHz)
    return clock


def compute_speed(gpu: GpuProfile, power_limit_W: float | None = None,
                  clock_lock_MHz: float | None = None) -> float:
    """Tensor-core and special-function rate relative to the part at its rated power
    (1.0 with neither limit; never above 1.0).

    >>> from parsearch.topology.hardware import load_gpu_profile
    >>> round(compute_speed(load_gpu_profile("h100-sxm"), power_limit_W=500), 3)
    0.904
    """
    if power_limit_W is None and clock_lock_MHz is None:
        return 1.0
    reference = gpu.sustained_clock_MHz
    clock = sustained_clock_MHz(gpu, power_limit_W, clock_lock_MHz)
    assert reference is not None  # checked by sustained_clock_MHz
    return min(1.0, clock / reference)


__all__ = ["POWER_CLOCK_EXPONENT", "compute_speed", "power_limited_clock_MHz",
           "sustained_clock_MHz"]
