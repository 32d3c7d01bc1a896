"""Efficiency profile files: the optional ``gemm_half_flops_ceiling`` field."""

from __future__ import annotations

import pytest
import yaml

from parsearch.cost.efficiency import (
    load_efficiency_profile,
    parse_efficiency_profile,
    profile_to_yaml,
)
from parsearch.errors import SpecError


@pytest.mark.parametrize("name", ["ampere", "hopper", "blackwell"])
def test_a_profile_survives_its_own_yaml(name: str) -> None:
    profile = load_efficiency_profile(name)
    again = parse_efficiency_profile(yaml.safe_load(profile_to_yaml(profile)), "round trip")
    assert again.gemm_half_flops_ceiling == profile.gemm_half_flops_ceiling
    assert again.gemm_half_flops == pytest.approx(profile.gemm_half_flops)


def test_the_ceiling_is_optional_and_checked() -> None:
    data = yaml.safe_load(profile_to_yaml(load_efficiency_profile("hopper")))
    data.pop("gemm_half_flops_ceiling")
    assert parse_efficiency_profile(data, "user file").gemm_half_flops_ceiling is None
    for bad in (0.0, 1.5, "fast"):
        data["gemm_half_flops_ceiling"] = bad
        with pytest.raises(SpecError, match=r"user file: gemm_half_flops_ceiling must be"):
            parse_efficiency_profile(data, "user file")
