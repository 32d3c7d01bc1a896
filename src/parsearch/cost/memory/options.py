"""Constants and options shared by the memory model's modules.

The memory model is split by job: :mod:`parsearch.cost.memory.states`
(weights, gradients, optimizer state), :mod:`parsearch.cost.memory.activations`
(activations per layer and per stage, recompute and offload) and
:mod:`parsearch.cost.memory` (the public entry: a stage's total, the peak
stage, scalar and vectorised fronts).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from parsearch.errors import SpecError

#: A float or an elementwise numpy array of floats.
Num = Any

ActivationModel = Literal["flash", "korthikanti"]

GIB = 2**30

#: Bytes per element of the low-precision copy of a GEMM operand (§7.7).  FP8: 1.
#: NVFP4: 4 bits + one FP8 scale per 16 elements = 0.5625 [assumption: the
#: recipe's high-precision exceptions (first/last layers, wgrad) are ignored].
LOW_PRECISION_BYTES: dict[str, float] = {"bf16": 2.0, "fp8": 1.0, "fp4": 0.5625}

ACTIVATION_BYTES = 2.0  # 16-bit activations (KOR22 §4)
FP32_BYTES = 4.0
#: Transformer Engine's rewritten CPU offload (TE 2.10 on: TransformerEngine c52576053,
#: 2025-11-14, "Activation offloading refactor") leaves in HBM only saved tensors of fewer
#: elements than this (``cpu_offload.py`` ``_check_if_offload``: ``numel() < 256 * 1024``),
#: parameters and tensors marked ``mark_not_offload``.
TE_OFFLOAD_MIN_ELEMENTS = 256 * 1024


@dataclass(frozen=True)
class MemoryOptions:
    """Knobs of the memory model that the :class:`TrainingSpec` does not carry.

    * ``activation_model``: ``"flash"`` (default; formulas.md §5.3 modern form)
      or ``"korthikanti"`` (KOR22 Table 2; GPT with MHA, GeLU 4h, dropout,
      no FlashAttention — MoE layers are then counted as dense layers).
    * ``framework_overhead_bytes``: CUDA context, NCCL buffers, allocator
      fragmentation.  **Not sourced**: no reference quantifies it
      (formulas.md §5.4 last bullet); 3 GiB is our guess.
    * ``fp8_param_gather``: FP8 primary weights (``--fp8-param-gather``)
      drop the BF16 weight copy of GEMM weights (§7.7).
    * ``moe_imbalance``: max/mean tokens per expert rank (§5.3 MoE, §7.5), fixed for every
      layout when not 1.
    * ``routing``, ``moe_capacity_factor``, ``moe_pad_to_capacity``: how the router loads
      the experts, as :class:`~parsearch.cost.options.CostOptions` prices it in time (which
      sets them here): under ``"trained"`` routing the busiest EP rank holds more tokens
      than the mean, so its expert activations are larger
      (:func:`~parsearch.cost.routing.routing_imbalance`, per layout).
    * ``fp32_logits``: an unfused cross-entropy keeps fp32 logits
      (``s·b·V·4/(t·c)`` bytes, §5.4) for the micro-batch in backward.
    * ``extra_in_flight``: chunk forwards an interleaved schedule adds to its warm-up (1
      under the merged forward-backward schedule of MoE all-to-all overlap:
      :func:`~parsearch.cost.memory.activations.chunk_in_flight`).
    * ``cuda_graph_layers``: (dense, MoE) per-layer CUDA graphs whose static buffers each
      layer holds per micro-batch in flight (:mod:`~parsearch.cost.memory.cuda_graph_memory`;
      ``(0, 0)``: no per-layer graphs), as :class:`~parsearch.cost.options.CostOptions`
      sets it from its CUDA-graph switches.
    * ``offload_moves_mlp_activation_input``: ``--cpu-offloading`` moves the dense MLP's
      SwiGLU input to host (Megatron-Core >= 0.13 marks it; earlier releases leave it in
      HBM: :func:`~parsearch.cost.memory.activations.offload_kept_bytes`); set from the
      software stack (:mod:`parsearch.cost.stacks`).
    * ``offload_moves_every_saved_tensor``: Transformer Engine's offload moves every saved
      tensor of at least :data:`TE_OFFLOAD_MIN_ELEMENTS` elements that is not a parameter
      (its rewritten offload, TE 2.10 on), where earlier releases move only the tensors
      marked for it; set from the software stack.
    """

    activation_model: ActivationModel = "flash"
    framework_overhead_bytes: float = 3.0 * GIB
    fp8_param_gather: bool = False
    moe_imbalance: float = 1.0
    fp32_logits: bool = True
    extra_in_flight: int = 0
    routing: str = "balanced"
    moe_capacity_factor: float | None = None
    moe_pad_to_capacity: bool = False
    cuda_graph_layers: tuple[int, int] = (0, 0)
    offload_moves_mlp_activation_input: bool = True
    offload_moves_every_saved_tensor: bool = True

    def __post_init__(self) -> None:
        if self.activation_model not in ("flash", "korthikanti"):
            raise SpecError(
                f"memory: activation_model must be flash or korthikanti, "
                f"got {self.activation_model!r}"
            )
        if self.framework_overhead_bytes < 0:
            raise SpecError(
                f"memory: framework_overhead_bytes must be >= 0, "
                f"got {self.framework_overhead_bytes!r}"
            )
        if self.moe_imbalance < 1.0:
            raise SpecError(f"memory: moe_imbalance must be >= 1, got {self.moe_imbalance!r}")
        if self.routing not in ("balanced", "trained"):
            raise SpecError(f"memory: routing must be balanced or trained, got "
                            f"{self.routing!r}")
        if (len(self.cuda_graph_layers) != 2
                or any(not isinstance(c, int) or c < 0 for c in self.cuda_graph_layers)):
            raise SpecError(f"memory: cuda_graph_layers must be two counts >= 0 (dense, MoE), "
                            f"got {self.cuda_graph_layers!r}")
        if self.extra_in_flight not in (0, 1):
            raise SpecError(f"memory: extra_in_flight must be 0 or 1, got "
                            f"{self.extra_in_flight!r}")


def gemm_input_bytes(precision: str) -> float:
    """Bytes per saved GEMM-input element: FP8/FP4 save linear inputs quantized (§7.7)."""
    return min(LOW_PRECISION_BYTES[precision], ACTIVATION_BYTES)


#: The default options (a module-level instance, usable as an argument default).
DEFAULT_MEMORY_OPTIONS = MemoryOptions()
