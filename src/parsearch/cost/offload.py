"""Exposed time of copying offloaded activations to host memory and back.

With ``--cpu-offloading`` (``TrainingSpec.activation_offload_layers``: the first K
layers of each model chunk) Megatron-Core copies a layer's saved activations to host
memory on a side stream during the next layer's forward and prefetches them back
during the next layer's backward, keeping one offloaded layer in flight
(``megatron/core/cpu_offload.py``; the memory model holds the same one layer in HBM).
A copy of ``B`` bytes over the GPU's host link takes ``B / host_link``; the part
longer than the layer beside it is exposed, forward and backward:

    exposed = max(0, B/host - t_fwd) + max(0, B/host - t_bwd),  t_bwd = 2 t_fwd

(backward = 2x forward FLOPs, NAR21 Appendix), for the share of a stage's layers that
are offloaded, ``min(K, l) / l`` with ``l`` layers per model chunk.
"""

from __future__ import annotations

import numpy as np

from parsearch.cost.memory import MemoryOptions
from parsearch.cost.memory.activations import ActDegrees, layer_bytes
from parsearch.model.specs import ModelSpec, TrainingSpec
from parsearch.topology.hardware import GpuProfile

#: Host link per GPU and direction when the GPU profile does not state one: PCIe
#: Gen5 x16, 32 GT/s x 16 lanes x 128/130 = 63 GB/s (PCI-SIG PCIe 5.0 base spec).
DEFAULT_HOST_LINK_BPS = 63e9


def offload_exposed(model: ModelSpec, training: TrainingSpec, gpu: GpuProfile,
                    memory: MemoryOptions, cols: dict[str, np.ndarray], is_moe: bool,
                    layer_time: np.ndarray) -> np.ndarray:
    """Seconds per micro-batch an average layer of this kind waits for offload copies.

    ``layer_time``: the layer's forward + backward (+ recompute) time on this GPU.
    Zero without activation offloading.
    """
    k = training.activation_offload_layers
    if k <= 0 or (is_moe and model.moe is None):
        return np.zeros_like(np.asarray(layer_time, dtype=np.float64))
    tp = cols["tp"].astype(np.float64)
    sp_div = np.where(cols["sp"].astype(bool), tp, 1.0)
    deg = ActDegrees(tp=tp, cp=cols["cp"].astype(np.float64), ep=cols["ep"].astype(np.float64),
                     etp=cols["etp"].astype(np.float64), mbs=cols["mbs"].astype(np.float64),
                     sp_div=sp_div)
    saved = layer_bytes(model, training, is_moe, deg, memory).of(cols["recompute"])
    host = gpu.host_link_Bps or DEFAULT_HOST_LINK_BPS
    copy = np.asarray(saved, dtype=np.float64) / host
    forward = np.asarray(layer_time, dtype=np.float64) / 3.0
    exposed = np.maximum(0.0, copy - forward) + np.maximum(0.0, copy - 2.0 * forward)
    per_chunk = model.num_layers / (cols["pp"].astype(np.float64)
                                    * cols["vpp"].astype(np.float64))
    share = np.minimum(float(k), per_chunk) / np.maximum(per_chunk, 1.0)
    return exposed * share
