"""GPU hardware profiles: dense peak FLOP/s per precision, HBM capacity and bandwidth.

The loader of a GPU by name, datasheet part or variant alike.  The profile type and the
reading of one file are :mod:`parsearch.topology.gpu_profile` (re-exported here), the
variants (a power limit, clock lock or other memory) :mod:`parsearch.topology.variants`;
this module sits above both, so neither imports it.

Profiles live in ``cost_models/hardware/<name>.yaml`` (see
:func:`parsearch.resources.data_dir`); every number in them carries its
source in a comment and the file's ``source`` field.  Units in the files are
the ones datasheets use (TFLOP/s, GiB, TB/s); :class:`GpuProfile` holds SI
values (FLOP/s, bytes, bytes/s).

>>> profile = load_gpu_profile("h100-sxm")
>>> round(profile.peak_flops["bf16"] / 1e12, 1)
989.4
>>> "fp4" in profile.peak_flops   # Hopper has no NVFP4
False
"""

from __future__ import annotations

import contextlib
from functools import cache

from parsearch.errors import SpecError
from parsearch.topology.gpu_profile import (
    PEAK_PRECISIONS,
    GpuProfile,
    gpu_profile_from_dict,
    hardware_dir,
    list_gpu_profiles,
    read_profile_file,
)
from parsearch.topology.variants import load_variant_profile

__all__ = [
    "PEAK_PRECISIONS",
    "GpuProfile",
    "generation_profiles",
    "gpu_profile_from_dict",
    "hardware_dir",
    "list_gpu_profiles",
    "load_gpu_profile",
    "read_profile_file",
]


def load_gpu_profile(name: str) -> GpuProfile:
    """Load a built-in profile by name (e.g. ``"h100-sxm"``) or a YAML file by path.

    A variant (a file with ``variant_of``, or ``"h100-sxm@power_limit_W=500"``) is the
    base part with a power limit, clock lock or other memory applied
    (:mod:`parsearch.topology.variants`).
    """
    data, where = (None, "") if "@" in name else read_profile_file(name)
    if data is None or (isinstance(data, dict) and "variant_of" in data):
        return load_variant_profile(name)
    return gpu_profile_from_dict(data, where)


@cache
def generation_profiles(names: tuple[str, ...]) -> tuple[GpuProfile, ...]:
    """The built-in profiles of a generation's GPUs (an efficiency profile's ``gpus``),
    skipping names with no profile; loaded once per set of names."""
    profiles = []
    for name in names:
        with contextlib.suppress(SpecError):
            profiles.append(load_gpu_profile(name))
    return tuple(profiles)
