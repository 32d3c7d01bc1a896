"""The environment a launch exports: what the priced run needs from the process, per
launcher-independent variable (:func:`launch_env`), with each variable's source."""

from __future__ import annotations

from parsearch.layout import Layout

#: Environment every launch pins, as priced (both launchers export it; a Bridge recipe's own
#: ``env_vars`` are only defaults, ``os.environ.setdefault`` in ``apply_environment_variables``,
#: ``src/megatron/bridge/training/config.py`` at 067f987d, so the exported value wins):
#:
#: * ``NCCL_NVLS_ENABLE=0``: the cost model prices NCCL's ring and tree collectives at the
#:   cluster file's bus bandwidth (cost/collectives.py), not NVLink SHARP's in-switch
#:   reduction, and the memory model counts no NVLS buffers (Megatron-LM
#:   ``megatron/core/transformer/moe/README.md`` at d98e8a64: "Disable NVLS to prevent memory
#:   overhead"; NCCL enables it by default where the switch has it; Bridge main's
#:   ``perf_recipes`` write 0 415 times, 1 16 times, in Llama 3 GB300/VR200 recipes).
#: * ``NVTE_ALLOW_NONDETERMINISTIC_ALGO=1`` (Transformer Engine's default, Megatron-Core
#:   ``extensions/transformer_engine.py`` reads ``os.getenv(..., "1")`` at d98e8a64): fused
#:   attention is priced at its non-deterministic backward's efficiency; ``0`` is
#:   Megatron-LM's deterministic mode (``megatron/training/determinism.py``), which the
#:   launch also turns off (``model.deterministic_mode``); Bridge's DeepSeek-V3/V4 and
#:   GPT-OSS ``perf_recipes`` set 0.
PINNED_ENV: tuple[tuple[str, str], ...] = (("NCCL_NVLS_ENABLE", "0"),
                                           ("NVTE_ALLOW_NONDETERMINISTIC_ALGO", "1"))


def launch_env(lay: Layout, fsdp: bool, a2a_overlap: bool, capability: float | None, *,
         fused_expert_mlp: bool = False, flex: str | None = None, nvlink_domain_size: int = 8,
         gpus_per_node: int = 8, module_offload: bool = False) -> tuple[tuple[str, str], ...]:
    """The environment the priced run needs, for every launcher.

    ``CUDA_DEVICE_MAX_CONNECTIONS`` as Megatron-LM's ``validate_args`` wants it:
    before Blackwell, TP or CP > 1 requires it to be 1 (kernel order of the
    overlapped TP collectives); Megatron-FSDP requires it unset or > 1, and EP
    all-to-all overlap asks for > 1 (``megatron/training/arguments.py``,
    ``validate_args``; Megatron-Bridge's performance recipes use 32); otherwise 8,
    CUDA's default, what a Megatron-LM run without the variable gets, written so a
    recipe's own 1 (which serialises the overlapped collectives behind compute) does not
    run.  Then :data:`PINNED_ENV`; ``NVTE_CUTEDSL_FUSED_GROUPED_MLP=1`` where the fused
    expert MLP is priced (Megatron-Core ``TEGroupedMLP`` takes the op-fuser path for a
    gated MLP only with it, ``transformer/moe/experts.py`` at d98e8a64, default ``"0"``);
    and HybridEP's topology where it is the priced flex back end (below);
    ``NVTE_CPU_OFFLOAD_V1=1`` with fine-grained activation offloading, which Megatron-LM's
    ``validate_args`` requires with Transformer Engine >= 2.10 (so TE keeps the weights).

    >>> launch_env(Layout(num_gpus=16, tp=2, sp=True), False, False, 9.0)[0]
    ('CUDA_DEVICE_MAX_CONNECTIONS', '1')
    >>> env = dict(launch_env(Layout(num_gpus=64, ep=32), False, False, 10.0, flex="hybridep",
    ...                 nvlink_domain_size=72, gpus_per_node=4))
    >>> env["CUDA_DEVICE_MAX_CONNECTIONS"], env["NUM_OF_HYBRID_EP_RANKS_PER_NVLINK_DOMAIN"]
    ('8', '32')
    """
    if fsdp or a2a_overlap:
        connections = "32"
    elif (capability is None or capability < 10) and (lay.tp > 1 or lay.cp > 1):
        connections = "1"
    else:
        connections = "8"
    env = [("CUDA_DEVICE_MAX_CONNECTIONS", connections), *PINNED_ENV]
    if fused_expert_mlp:
        env.append(("NVTE_CUTEDSL_FUSED_GROUPED_MLP", "1"))
    if module_offload:
        env.append(("NVTE_CPU_OFFLOAD_V1", "1"))
    if flex == "hybridep":
        env += hybridep_topology(lay.ep, nvlink_domain_size, gpus_per_node)
    return tuple(env)


def hybridep_topology(ep: int, nvlink_domain_size: int, gpus_per_node: int
                      ) -> list[tuple[str, str]]:
    """HybridEP's topology variables for the priced EP group and NVLink domain.

    Bridge's rule (``apply_target_topology_environment``,
    ``scripts/performance/utils/utils.py`` at 067f987d): on 8-GPU NVLink domains
    ``min(ep, 8)`` ranks per domain, ``NVLINK_DOMAIN_SIZE=8``, ``USE_MNNVL=0``; on NVL72
    ``ep`` ranks (at most 72), 72, ``USE_MNNVL=1``.  Here the domain is the cluster's, and
    an EP group larger than it keeps the largest divisor of ``ep`` that fits, the ranks of
    one group that share a domain.  A recipe's values describe its own EP size, which the
    launch replaces; the cost model prices one network copy per remote domain
    (cost/communication.py), which is what these variables tell HybridEP.

    >>> [value for _, value in hybridep_topology(16, 8, 8)]
    ['8', '8', '0']
    >>> hybridep_topology(128, 72, 4)[0]
    ('NUM_OF_HYBRID_EP_RANKS_PER_NVLINK_DOMAIN', '64')
    """
    ranks = max(d for d in range(1, min(ep, nvlink_domain_size) + 1) if ep % d == 0)
    return [("NUM_OF_HYBRID_EP_RANKS_PER_NVLINK_DOMAIN", str(ranks)),
            ("NVLINK_DOMAIN_SIZE", str(nvlink_domain_size)),
            ("USE_MNNVL", "1" if nvlink_domain_size > gpus_per_node else "0")]
