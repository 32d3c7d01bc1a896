"""``--gpu-power-limit``, ``--gpu-memory-gib`` and friends: a GPU variant without a
hardware file, on every command that takes ``--cluster``.

The options vary the cluster's GPU (:func:`parsearch.topology.variants.cluster_variant`):
a power limit or clock lock scales the tensor, SFU and 4-bit weight conversion rates by the
sustained SM clock (:mod:`parsearch.topology.power`), the memory options replace HBM
capacity and bandwidth, ``--nvlink-bandwidth`` the NVLink bandwidth per GPU and direction
(the H800's 200).
"""

from __future__ import annotations

import argparse

from parsearch.cli.input_checks import finite_float
from parsearch.topology.cluster import ClusterSpec

#: option destination -> (variant field, option as the user writes it)
OPTIONS: dict[str, tuple[str, str]] = {
    "gpu_power_limit": ("power_limit_W", "--gpu-power-limit"),
    "gpu_sm_clock": ("sm_clock_MHz", "--gpu-sm-clock"),
    "gpu_memory_gib": ("hbm_capacity_GiB", "--gpu-memory-gib"),
    "gpu_hbm_bandwidth": ("hbm_bandwidth_TBps", "--gpu-hbm-bandwidth"),
}
_NAMES = {field: option for field, option in OPTIONS.values()} | {
    "nvlink_GBps": "--nvlink-bandwidth"}


def add_gpu_variant_options(parser: argparse.ArgumentParser) -> None:
    """The GPU-variant options (all default to the cluster file's values)."""
    group = parser.add_argument_group(
        "GPU variant", "change the cluster's GPU without writing a hardware file "
        "(docs/commands.md#gpu-variants)")
    group.add_argument("--gpu-power-limit", type=finite_float, default=None, metavar="W",
                       help="board power limit in W (nvidia-smi -pl): compute slows with the "
                       "sustained SM clock, ~(W / rated) ** 0.30 (500 of 700 W: x0.904); "
                       "HBM bandwidth does not change")
    group.add_argument("--gpu-sm-clock", type=finite_float, default=None, metavar="MHZ",
                       help="SM clock lock in MHz (nvidia-smi -lgc): compute runs at "
                       "min(lock, power-limited clock) / the clock sustained at rated power")
    group.add_argument("--gpu-memory-gib", type=finite_float, default=None, metavar="GIB",
                       help="memory per GPU in GiB (e.g. 94 for the H100 NVL / 94 GB parts)")
    group.add_argument("--gpu-hbm-bandwidth", type=finite_float, default=None, metavar="TBPS",
                       help="HBM bandwidth per GPU in TB/s (e.g. 2.4 for HBM2e H100 parts)")
    group.add_argument("--nvlink-bandwidth", type=finite_float, default=None, metavar="GBPS",
                       help="NVLink bandwidth per GPU and direction in GB/s (H800: 200)")


def variant_fields(args: argparse.Namespace) -> dict[str, float]:
    """The variant fields the command line sets."""
    return {field: value for dest, (field, _) in OPTIONS.items()
            if (value := getattr(args, dest, None)) is not None}


def apply_gpu_variant(args: argparse.Namespace, cluster: ClusterSpec) -> ClusterSpec:
    """``cluster`` with the command line's GPU variant (unchanged without one)."""
    from parsearch.topology.variants import cluster_variant

    return cluster_variant(cluster, variant_fields(args),
                           getattr(args, "nvlink_bandwidth", None), _NAMES)


def cluster_from_args(args: argparse.Namespace, name: str | None = None) -> ClusterSpec:
    """``--cluster`` (or ``name``) loaded, with the command line's GPU variant applied."""
    from parsearch.topology.cluster import load_cluster

    return apply_gpu_variant(args, load_cluster(name or args.cluster))


__all__ = ["OPTIONS", "add_gpu_variant_options", "apply_gpu_variant", "cluster_from_args",
           "variant_fields"]
