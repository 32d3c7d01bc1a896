"""Memory pricing: bytes per GPU of model state, activations and overhead, per stage.

One subpackage of :mod:`parsearch.cost`, one job per module:

* :mod:`~parsearch.cost.memory.estimate` — the public entry (:func:`estimate_memory`,
  :func:`memory_arrays`), every pipeline stage evaluated, the most loaded one reported;
* :mod:`~parsearch.cost.memory.states` — weights, gradients and optimizer state;
* :mod:`~parsearch.cost.memory.activations` — activations per layer, micro-batches in
  flight, per-module recompute, the busiest EP rank's expert load;
* :mod:`~parsearch.cost.memory.activation_terms` — a stage's activations as terms;
* :mod:`~parsearch.cost.memory.peak` / :mod:`~parsearch.cost.memory.rows` — the peak
  stage of many layouts at once;
* :mod:`~parsearch.cost.memory.options` — constants and :class:`MemoryOptions`.
"""

from parsearch.cost.memory.activations import (
    in_flight_chunk_microbatches,
    in_flight_microbatches,
    layer_activation_bytes,
    num_microbatches,
)
from parsearch.cost.memory.estimate import (
    MemoryArrays,
    MemoryBreakdown,
    MemoryEstimate,
    estimate_memory,
    memory_arrays,
    stage_memory,
    stage_memory_core,
)
from parsearch.cost.memory.options import (
    ACTIVATION_BYTES,
    FP32_BYTES,
    GIB,
    LOW_PRECISION_BYTES,
    ActivationModel,
    MemoryOptions,
)
from parsearch.cost.memory.states import ModelStateBytes, model_state_bytes

__all__ = [
    "ACTIVATION_BYTES",
    "FP32_BYTES",
    "GIB",
    "LOW_PRECISION_BYTES",
    "ActivationModel",
    "MemoryArrays",
    "MemoryBreakdown",
    "MemoryEstimate",
    "MemoryOptions",
    "ModelStateBytes",
    "estimate_memory",
    "in_flight_chunk_microbatches",
    "in_flight_microbatches",
    "layer_activation_bytes",
    "memory_arrays",
    "model_state_bytes",
    "num_microbatches",
    "stage_memory",
    "stage_memory_core",
]
