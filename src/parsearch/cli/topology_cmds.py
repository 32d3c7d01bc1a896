"""``parsearch clusters``, ``parsearch cluster show`` and ``parsearch placement``."""

from __future__ import annotations

import argparse
from typing import Any

from parsearch.cli.common import (
    add_format_option,
    add_model_option,
    layout_from_args,
    model_from_args,
    positive_int,
    print_json,
    print_table,
)
from parsearch.cost.stacks import DEFAULT_STACK, get_stack
from parsearch.errors import SpecError
from parsearch.topology.cluster import ClusterSpec, list_clusters, load_cluster
from parsearch.topology.fabric import Fabric, build_fabric
from parsearch.topology.graph import build_graph, count_kinds
from parsearch.topology.placement import DEFAULT_ORDER, RANK_ORDERS, place

_GB = 1e9


def register(subparsers: argparse._SubParsersAction) -> None:
    clusters = subparsers.add_parser(
        "clusters", help="list the cluster presets",
        description="List the built-in cluster presets, one line each.",
    )
    add_format_option(clusters, ("table", "json"))
    clusters.set_defaults(handler=run_clusters)

    cluster = subparsers.add_parser(
        "cluster", help="inspect one cluster", description="Inspect one cluster description.",
    )
    actions = cluster.add_subparsers(dest="action", metavar="ACTION")
    actions.required = True
    show = actions.add_parser(
        "show", help="the topology of N GPUs of a cluster",
        description="Build the topology graph of N GPUs of a cluster (preset name or cluster "
        "file), validate it, and print its tiers and the bandwidth each tier leaves per GPU.",
    )
    show.add_argument("name", metavar="NAME", help="preset name or path to a cluster file")
    show.add_argument("--gpus", type=positive_int, required=True, metavar="N")
    add_format_option(show, ("table", "json"))
    show.set_defaults(handler=run_cluster_show)

    placement = subparsers.add_parser(
        "placement", help="where each process group of a layout sits",
        description="For each process group kind of a layout (tp, cp, dp incl. cp, ep, etp, "
        "edp, pp): its size, how many NVLink domains and nodes one group spans, and the "
        "bandwidth per member (GB/s per direction) on the given cluster.",
    )
    add_model_option(placement)
    placement.add_argument("--cluster", required=True, metavar="C",
                           help="preset name (see `parsearch clusters`) or a cluster file")
    placement.add_argument("--gpus", type=positive_int, required=True, metavar="N")
    placement.add_argument("--layout", required=True, metavar="L",
                           help='e.g. "tp=8,pp=4,cp=1,ep=1,etp=1"')
    placement.add_argument("--rank-order", choices=RANK_ORDERS, default=DEFAULT_ORDER,
                           help=f"Megatron-Core rank order (default {DEFAULT_ORDER})")
    placement.add_argument("--stack", default=DEFAULT_STACK, metavar="NAME",
                           help="software stack the job runs: before MoE parallel folding "
                           "(mcore-0.9 and older) the EP groups are carved out of the "
                           f"data-parallel ranks (default {DEFAULT_STACK})")
    add_format_option(placement, ("table", "json"))
    placement.set_defaults(handler=run_placement)


def _cluster_row(c: ClusterSpec) -> dict[str, Any]:
    return {
        "name": c.name,
        "gpu": c.gpu,
        "gpus_per_node": c.gpus_per_node,
        "nvlink_domain_size": c.nvlink_domain_size,
        "nvlink_GBps": c.nvlink_bandwidth_Bps / _GB,
        "nics_per_node": c.nics_per_node,
        "nic_Gbps": c.nic_bandwidth_Bps * 8 / _GB,
        "fabric": c.fabric,
        "leaf_oversubscription": c.leaf_oversubscription,
        "description": c.description,
    }


def run_clusters(args: argparse.Namespace) -> int:
    rows = [_cluster_row(c) for c in list_clusters()]
    if args.format == "json":
        print_json({"clusters": rows})
        return 0
    print_table(
        ("name", "gpu", "node", "domain", "NVLink GB/s", "NICs", "Gb/s", "fabric", "oversub",
         "description"),
        [(r["name"], r["gpu"], r["gpus_per_node"], r["nvlink_domain_size"], r["nvlink_GBps"],
          r["nics_per_node"], r["nic_Gbps"], r["fabric"], f"{r['leaf_oversubscription']:g}:1",
          r["description"]) for r in rows],
    )
    return 0


def _fabric_summary(fabric: Fabric) -> dict[str, Any]:
    n = fabric.num_gpus
    c = fabric.cluster
    return {
        "nodes": int(fabric.node_of.max()) + 1,
        "nvlink_domains": int(fabric.domain_of.max()) + 1,
        "leaf_groups": int(fabric.leaf_group_of.max()) + 1,
        "pods": int(fabric.pod_of.max()) + 1,
        "per_gpu_GBps": {
            "nvlink": float(fabric.nvlink_Bps.min()) / _GB,
            "nic_share": float(fabric.nic_share_Bps.min()) / _GB,
            "leaf_uplink_share": _finite(fabric.leaf_uplink_share_Bps.min()) if n else None,
            "pod_uplink_share": _finite(fabric.pod_uplink_share_Bps.min()) if n else None,
        },
        "efficiency": {"nvlink": c.nvlink_efficiency, "network": c.network_efficiency,
                       "network_collectives": c.collective_efficiency},
        "latency_us": {k: v * 1e6 for k, v in fabric.tier_latency_s.items()},
    }


def _finite(value: float) -> float | None:
    return None if value == float("inf") else float(value) / _GB


def run_cluster_show(args: argparse.Namespace) -> int:
    cluster = load_cluster(args.name)
    graph = build_graph(cluster, args.gpus)
    fabric = build_fabric(cluster, args.gpus, graph=graph)  # validates the graph
    document = {
        "cluster": _cluster_row(cluster) | {
            "rail_optimized": cluster.rail_optimized,
            "gpus_per_leaf": cluster.gpus_per_leaf,
            "spine_oversubscription": cluster.spine_oversubscription,
            "usable_domain_size": cluster.job_domain_size,
            "max_gpus": cluster.max_gpus,
            "sources": dict(cluster.sources),
        },
        "num_gpus": args.gpus,
        "graph": {"nodes": count_kinds(graph), "edges": graph.number_of_edges()},
        "fabric": _fabric_summary(fabric),
    }
    if args.format == "json":
        print_json(document)
        return 0
    summary = document["fabric"]
    print(f"{cluster.name}: {cluster.description}")
    print(f"{args.gpus} x {cluster.gpu} in {summary['nodes']} nodes, "
          f"{summary['nvlink_domains']} NVLink domains, {summary['leaf_groups']} leaf groups, "
          f"{summary['pods']} pods ({cluster.fabric}"
          f"{', rail-optimized' if cluster.rail_optimized else ''})")
    kinds = ", ".join(f"{count} {kind}" for kind, count in document["graph"]["nodes"].items())
    print(f"graph: {kinds}; {document['graph']['edges']} edges (validated)")
    per_gpu = summary["per_gpu_GBps"]
    rows = [
        ("nvlink", per_gpu["nvlink"], c_eff := cluster.nvlink_efficiency,
         per_gpu["nvlink"] * c_eff, summary["latency_us"]["nvlink"]),
        ("nic (leaf)", per_gpu["nic_share"], n_eff := cluster.network_efficiency,
         per_gpu["nic_share"] * n_eff, summary["latency_us"]["leaf"]),
    ]
    if per_gpu["leaf_uplink_share"] is not None:
        share = min(per_gpu["nic_share"], per_gpu["leaf_uplink_share"])
        rows.append(("spine", share, n_eff, share * n_eff, summary["latency_us"]["spine"]))
    if per_gpu["pod_uplink_share"] is not None:
        share = min(per_gpu["nic_share"], per_gpu["leaf_uplink_share"] or float("inf"),
                    per_gpu["pod_uplink_share"])
        rows.append(("core", share, n_eff, share * n_eff, summary["latency_us"]["core"]))
    print_table(("tier", "line GB/s per GPU", "efficiency", "achievable GB/s", "latency us"),
                rows)
    if cluster.collective_efficiency != cluster.network_efficiency:
        print(f"data-parallel collectives across nodes run at {cluster.collective_efficiency:g} "
              "of line rate (network_collective_efficiency; sends at "
              f"{cluster.network_efficiency:g})")
    return 0


def run_placement(args: argparse.Namespace) -> int:
    model = model_from_args(args)
    layout = layout_from_args(args)
    if not model.is_moe and (layout.ep > 1 or layout.etp > 1):
        raise SpecError(
            f"R5: ep={layout.ep}, etp={layout.etp} on dense model {model.name}; "
            "expert parallelism needs a MoE model (use ep=1, etp=1)"
        )
    fabric = build_fabric(load_cluster(args.cluster), args.gpus)
    stack = get_stack(args.stack)
    placement = place(layout, fabric, args.rank_order, expert=model.is_moe,
                      experts_fold=stack.expert_tensor_parallel)
    if args.format == "json":
        print_json(placement.to_dict())
        return 0
    folding = "" if stack.expert_tensor_parallel or not model.is_moe else (
        f", stack {stack.name}: EP groups inside the data-parallel ranks (no MoE parallel "
        "folding)")
    print(f"{model.name} on {args.gpus} x {fabric.gpu.name} ({fabric.cluster.name}), "
          f"layout {layout.key()}, rank order {args.rank_order}{folding}")
    print_table(
        ("group", "size", "count", "domains", "nodes", "tier", "GB/s per member"),
        [(g.kind, g.size, g.count, g.nvlink_domains_spanned, g.nodes_spanned, g.tier,
          round(g.bandwidth_GBps, 1)) for g in placement.groups],
    )
    return 0
