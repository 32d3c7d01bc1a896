"""Which precision features a GPU and a training setup can run, checked before pricing.

Each rule names the flag and how to fix it (``SpecError``); the time model then prices
only combinations Megatron-Core and Transformer Engine accept.
"""

from __future__ import annotations

from parsearch.cost.efficiency import EfficiencyProfile
from parsearch.cost.options import CostOptions
from parsearch.cost.quantization import resolve_fp8_recipe
from parsearch.errors import SpecError
from parsearch.model.offload_modules import graph_conflict
from parsearch.model.specs import TrainingSpec
from parsearch.topology.hardware import GpuProfile


def check_precision_options(training: TrainingSpec, gpu: GpuProfile, cluster_name: str,
                            profile: EfficiencyProfile, options: CostOptions) -> CostOptions:
    """``options`` unchanged, or a :class:`SpecError` naming the rule it breaks."""
    if training.precision not in gpu.peak_flops:
        have = ", ".join(sorted(gpu.peak_flops))
        raise SpecError(
            f"precision {training.precision} is not supported by {gpu.name} "
            f"(cluster {cluster_name}); it supports {have}"
        )
    if training.precision not in profile.gemm_efficiency:
        raise SpecError(f"efficiency profile {profile.name} has no gemm_efficiency for "
                        f"{training.precision}; add it to the profile")
    if training.precision == "bf16" and options.memory.fp8_param_gather:
        raise SpecError("fp8 parameter gather needs --precision fp8 or fp4")
    capability = gpu.compute_capability
    if (training.precision == "fp8" and options.fp8_recipe == "mxfp8"
            and capability is not None and capability < 10):
        # MXFP8 block scaling is a Blackwell tensor-core format (Transformer Engine
        # MXFP8BlockScaling: compute capability 10.0 or newer).
        raise SpecError(f"fp8 recipe mxfp8 needs a Blackwell GPU (compute capability >= 10); "
                        f"{gpu.name} has {capability}: use tensorwise, delayed or "
                        "blockwise")
    if options.fp8_attention and training.precision == "bf16":
        # Transformer Engine runs FP8 attention only inside an FP8/FP4 autocast region
        # (recipe fp8_dpa), which BF16 training never opens.
        raise SpecError("fp8 attention needs --precision fp8 or fp4 (it runs inside the FP8 "
                        "autocast region); drop --fp8-attention or train in fp8")
    if options.fp8_attention and not options.flash_attention:
        # Transformer Engine recipe docstring: "FP8 DPA currently is only supported in the
        # FusedAttention backend".
        raise SpecError("fp8 attention runs only in the fused attention backend; drop "
                        "--fp8-attention or price fused attention")
    mxfp8 = (training.precision == "fp8"
             and resolve_fp8_recipe(options.fp8_recipe, capability) == "mxfp8")
    if options.fp8_output_proj and not mxfp8:
        # Megatron-Core is_mxfp8_output_proj_active: fp8=True and fp8_recipe='mxfp8' only.
        raise SpecError("fp8 output projection runs only with --precision fp8 and the mxfp8 "
                        "recipe (Megatron-Core fp8_output_proj); drop --fp8-output-proj or use "
                        "--fp8-recipe mxfp8 on a Blackwell GPU")
    if options.fused_expert_mlp and not (
            capability is not None and capability >= 10
            and (training.precision == "fp4" or mxfp8)):
        # Transformer Engine ForwardGroupedMLP_CuTeGEMMSwiGLU_*.is_supported: SM100+, and
        # only block-scaled (MXFP8 / NVFP4) grouped GEMMs.
        raise SpecError("the fused expert MLP (Transformer Engine op fuser) needs a Blackwell "
                        "GPU and block-scaled low precision (--precision fp8 with the mxfp8 "
                        "recipe, or fp4); drop --fused-expert-mlp")
    return check_graph_options(training, options)


def check_graph_options(training: TrainingSpec, options: CostOptions) -> CostOptions:
    """``options`` unchanged, or a :class:`SpecError` for pinned CUDA graphs Megatron refuses
    whatever the layout (Megatron-Core ``TransformerConfig.__post_init__`` at
    cd4afffa648426a959dc7cb1e24b5ce7d0c3ff54).  Searched graphs skip what a layout cannot run
    (:func:`parsearch.cost.feature_search.graphs_runnable`)."""
    if not options.cuda_graphs or options.cuda_graph_impl == "full_iteration":
        return options
    if training.activation_offload_layers:
        # "CUDA graphs not supported with CPU offloading."
        raise SpecError("per-layer CUDA graphs do not run with CPU activation offloading "
                        "(Megatron-Core refuses the pair): drop --cuda-graphs or the offload")
    conflict = graph_conflict(training.offload_modules, options.cuda_graph_impl,
                              options.cuda_graph_scope)
    if conflict is not None:
        raise SpecError(conflict)
    if "moe" in options.cuda_graph_scope and not (options.moe_capacity_factor is not None
                                                  and options.moe_pad_to_capacity):
        # "moe cuda graph is only supported with drop-padding MoE."
        raise SpecError("cuda graph scope moe needs padded expert inputs (--moe-capacity-factor "
                        "with --moe-pad-to-capacity): dropless MoE has data-dependent shapes; "
                        "capture attn,moe_router,moe_preprocess instead")
    if ("moe_router" in options.cuda_graph_scope and options.cuda_graph_impl == "transformer_engine"
            and training.recompute_modes == ("selective",) and "moe" in training.recompute_modules):
        # "moe recompute is not supported with moe_router CUDA graph with:
        # --cuda-graph-impl transformer_engine."
        raise SpecError("recompute module moe cannot run beside a moe_router CUDA graph "
                        "(Megatron-Core, transformer_engine graphs): drop one of them")
    return options
