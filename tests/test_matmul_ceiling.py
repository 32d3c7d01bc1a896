"""GEMMs run at each GPU's own measured large-matmul ceiling relative to its generation."""

from __future__ import annotations

import pytest

from parsearch.cost.compute import matmul_scale
from parsearch.cost.efficiency import efficiency_for_gpu
from parsearch.errors import SpecError
from parsearch.topology.hardware import gpu_profile_from_dict, load_gpu_profile

BLACKWELL_MEASURED = ("b200", "b300", "gb200")


@pytest.mark.parametrize("precision", ["bf16", "fp8"])
def test_measured_gpus_scale_around_their_generation_mean(precision: str) -> None:
    profile = efficiency_for_gpu("b200")
    scales = [matmul_scale(load_gpu_profile(g), profile, precision) for g in BLACKWELL_MEASURED]
    # the mean GPU keeps the profile's efficiency: the scales average to one
    assert sum(scales) / len(scales) == pytest.approx(1.0)
    fractions = [load_gpu_profile(g).large_matmul_fraction[precision] for g in BLACKWELL_MEASURED]
    # hand count: GB200's measured ceiling over the mean of the three
    gb200 = BLACKWELL_MEASURED.index("gb200")
    assert scales[gb200] == pytest.approx(fractions[gb200] / (sum(fractions) / 3))


def test_a_gpu_without_a_measurement_keeps_the_generation_mean() -> None:
    assert matmul_scale(load_gpu_profile("gb300"), efficiency_for_gpu("gb300"), "bf16") == 1.0
    # nor does a precision nobody measured move anything
    assert matmul_scale(load_gpu_profile("gb200"), efficiency_for_gpu("gb200"), "fp4") == 1.0


def test_a_ceiling_above_the_peak_is_refused_with_its_field() -> None:
    data = {"name": "x", "peak_tflops": {"bf16": 100}, "hbm_capacity_GiB": 80,
            "hbm_bandwidth_TBps": 3, "source": "test", "large_matmul_fraction": {"bf16": 1.2}}
    with pytest.raises(SpecError, match=r"large_matmul_fraction\.bf16 must be at most 1"):
        gpu_profile_from_dict(data, "x.yaml")
