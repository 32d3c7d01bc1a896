"""Megatron-Core's fine-grained activation offloading: which module inputs go to host.

``--fine-grained-activation-offloading --offload-modules M ...`` (Megatron-Core
``TransformerConfig.fine_grained_activation_offloading`` / ``offload_modules`` and
``megatron/core/pipeline_parallel/fine_grained_activation_offload.py`` at d98e8a64; user
guide ``docs/user-guide/features/fine_grained_activation_offloading.md``) copies the *input*
of each named submodule of every transformer layer to host memory during the forward and
reloads it before that module's backward, on side streams.  What each input is in bytes is
in :mod:`parsearch.cost.memory.activations`; its time in :mod:`parsearch.cost.offload`.

``fused_group_mlp`` (needs Transformer Engine's op fuser) and ``gdp_qkv`` (Gated
DeltaProduct mixers) are not priced.
"""

from __future__ import annotations

from collections.abc import Sequence

from parsearch.errors import SpecError

#: ``--offload-modules`` names parsearch prices, in a layer's forward order
#: (``transformer_config.py`` ``offload_modules`` choices).
OFFLOAD_MODULES: tuple[str, ...] = (
    "attn_norm", "qkv_linear", "core_attn", "attn_proj", "mlp_norm", "expert_fc1", "moe_act",
)
#: modules inside the routed experts (MoE layers only)
EXPERT_OFFLOAD_MODULES: frozenset[str] = frozenset({"expert_fc1", "moe_act"})
#: The nested module sets a searched fine-grained offload tries, in this order: the routed
#: experts' inputs (FC1's and the activation's, the largest per routed token), then
#: attention's (Megatron-Core's fine-grained offloading guide,
#: ``docs/user-guide/features/fine_grained_activation_offloading.md`` at d98e8a64, names
#: ``core_attn attn_proj expert_fc1`` as its example), then the QKV projection's input.  The
#: norms are left out: their inputs cross a per-layer CUDA graph's boundary
#: (:func:`graph_conflict`) and a norm fused into the next linear saves none.
MODULE_OFFLOAD_LINKS: tuple[tuple[str, ...], ...] = (
    ("expert_fc1", "moe_act"), ("core_attn", "attn_proj"), ("qkv_linear",))
#: Megatron-Core's ``min_offloaded_tensor_size`` default: tensors of fewer elements stay
#: in HBM (``TransformerConfig.min_offloaded_tensor_size = 1024 * 1024``)
MIN_OFFLOADED_ELEMENTS = 1024 * 1024


def check_offload_modules(owner: str, modules: object, offload_layers: int,
                          recompute_modules: Sequence[str]) -> tuple[str, ...]:
    """``modules`` as a tuple, or a :class:`SpecError` naming the rule it breaks.

    The rules are ``TransformerConfig.__post_init__``'s (d98e8a64): known names, no
    ``attn_proj`` without ``core_attn`` (its input is core attention's output, which
    core attention's backward needs), not beside ``--cpu-offloading``, and no expert
    module offloaded while ``moe`` recompute checkpoints the whole MoE layer.
    """
    if isinstance(modules, str) or not isinstance(modules, (tuple, list)):
        raise SpecError(f"{owner}: offload_modules must be a tuple of module names, e.g. "
                        f"('core_attn', 'attn_proj'); got {modules!r}")
    names = tuple(modules)
    bad = [m for m in names if m not in OFFLOAD_MODULES]
    if bad:
        raise SpecError(f"{owner}: offload_modules has unknown module(s) "
                        f"{', '.join(map(repr, bad))}; choose from {', '.join(OFFLOAD_MODULES)}")
    if len(set(names)) != len(names):
        raise SpecError(f"{owner}: offload_modules repeats a module: {names!r}")
    if not names:
        return names
    if "attn_proj" in names and "core_attn" not in names:
        raise SpecError(f"{owner}: offload_modules 'attn_proj' needs 'core_attn' too (the "
                        "projection's input is core attention's output, which core "
                        "attention's backward needs; Megatron-Core refuses it alone)")
    if offload_layers:
        raise SpecError(f"{owner}: offload_modules (fine-grained activation offloading) "
                        f"and activation_offload_layers={offload_layers} (--cpu-offloading) "
                        "cannot run together in Megatron-Core; keep one")
    inside = sorted(EXPERT_OFFLOAD_MODULES & set(names))
    if inside and "moe" in recompute_modules:
        raise SpecError(f"{owner}: offload_modules {', '.join(inside)} with the 'moe' "
                        "recompute module: the checkpointed MoE layer saves nothing inside "
                        "it to offload (Megatron-Core refuses the pair); drop one of them")
    return names


def graph_conflict(modules: Sequence[str], impl: str, scope: Sequence[str]) -> str | None:
    """Why per-layer CUDA graphs (``--cuda-graph-impl impl``, ``scope``: the captured
    modules, empty for whole layers) cannot run beside offloading ``modules``, or None.

    Megatron-Core ``TransformerConfig.__post_init__`` (d98e8a64): Transformer Engine graphs,
    or local graphs of a part of the layer that is not the MoE when only expert modules are
    offloaded; never the ``moe`` scope ("Token-drop MoE is temporarily not supported with
    activation offloading"); and its fine-grained offloading guide: the two norms cross the
    graph boundary.
    """
    if not modules or impl == "full_iteration":
        return None
    norms = sorted({"attn_norm", "mlp_norm"} & set(modules))
    if norms:
        return (f"offload module(s) {', '.join(norms)} cannot run beside per-layer CUDA graphs "
                "(they cross the graph boundary; Megatron-Core's fine-grained offloading "
                "guide): drop them or --cuda-graphs")
    if "moe" in scope:
        return ("the moe CUDA graph scope cannot run beside fine-grained activation offloading "
                "(Megatron-Core: token-drop MoE is not supported with it); capture "
                "attn,moe_router,moe_preprocess instead")
    if impl == "local" and (not scope or not set(modules) <= EXPERT_OFFLOAD_MODULES):
        return ("local CUDA graphs run beside fine-grained activation offloading only for a "
                "part of the layer and with only expert_fc1/moe_act offloaded (Megatron-Core); "
                "use --cuda-graph-impl transformer_engine")
    return None


def module_offload_chain(moe: bool) -> tuple[tuple[str, ...], ...]:
    """The nested module sets a searched fine-grained offload tries
    (:data:`MODULE_OFFLOAD_LINKS`; the expert modules only in MoE models).

    Along the chain the bytes moved only grow, so the held activations only shrink and the
    copy time only grows (``tests/test_module_offload_search.py``): per layout and
    recompute setting the first set that fits is the fastest that fits.

    >>> module_offload_chain(moe=False)
    (('core_attn', 'attn_proj'), ('core_attn', 'attn_proj', 'qkv_linear'))
    >>> module_offload_chain(moe=True)[0]
    ('expert_fc1', 'moe_act')
    """
    chain: list[tuple[str, ...]] = []
    current: tuple[str, ...] = ()
    for link in MODULE_OFFLOAD_LINKS:
        kept = tuple(m for m in link if moe or m not in EXPERT_OFFLOAD_MODULES)
        if kept:
            current = current + kept
            chain.append(current)
    return tuple(chain)


def offload_allowed_with(recompute_modules: Sequence[str], modules: Sequence[str]) -> bool:
    """Whether Megatron-Core offloads ``modules`` beside these selective recompute modules:
    no expert module while ``moe`` recompute checkpoints the whole MoE layer (the rule
    :func:`check_offload_modules` enforces)."""
    return not ("moe" in recompute_modules and EXPERT_OFFLOAD_MODULES & set(modules))
