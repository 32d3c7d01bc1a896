"""Exposed time of copying offloaded activations to host memory and back.

Two mechanisms: whole layers (``--cpu-offloading``, below) and module inputs of every layer
(``--offload-modules``, fine-grained activation offloading: :func:`module_moved_bytes`, the
same copy-behind-the-layer exposure, and :func:`host_bytes_needed`).

With ``--cpu-offloading`` (``TrainingSpec.activation_offload_layers``: the first K
layers of each model chunk) Megatron-Core copies a layer's saved activations to host
memory on a side stream during the next layer's forward and prefetches them back
during the next layer's backward, keeping one offloaded layer in flight
(``megatron/core/cpu_offload.py``; the memory model holds the same one layer in HBM).
A copy of ``B`` bytes over the GPU's host link takes ``B / host_link``, ``B`` the layer's saved
activations less what Transformer Engine's offload leaves in HBM
(:func:`~parsearch.cost.memory.activations.offload_kept_bytes`); the part longer than the
layer beside it is exposed, forward and backward:

    exposed = max(0, B/host - t_fwd) + max(0, B/host - t_bwd),  t_bwd = 2 t_fwd

(backward = 2x forward FLOPs, NAR21 Appendix), for the share of a stage's layers that
are offloaded, ``min(K, l) / l`` with ``l`` layers per model chunk.

Searched K (issue 32; ``activation_offload_layers`` in ``CostOptions.search_features``, the
flag unset): only layouts Megatron runs it with take K > 0 (rule R11: ``pp = 1`` and no
recompute; Megatron-Core ``TransformerConfig.__post_init__`` at d98e8a64; per-layer CUDA graphs
are then off, "CUDA graphs not supported with CPU offloading").  On such a layout the exposed
time above grows with K (the share ``min(K, l)/l``) and the HBM the memory model holds
shrinks with K (:func:`offload_saving`), so the fastest K that fits is the fewest that
fits: K = 0 where the layout fits without offload, else :func:`fewest_fitting_layers`,
solved from the per-layer bytes (no scan over K).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from parsearch.cost.memory import MemoryOptions
from parsearch.cost.memory.activations import (
    ActDegrees,
    layer_bytes,
    offload_kept_bytes,
    stage_layer_bytes,
)
from parsearch.cost.memory.options import Num
from parsearch.model.specs import RECOMPUTE_CODES, ModelSpec, TrainingSpec
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
    if is_moe and model.moe is None:
        return np.zeros_like(np.asarray(layer_time, dtype=np.float64))
    if training.offload_modules:
        return _module_offload_exposed(model, training, gpu, memory, cols, is_moe, layer_time)
    if k <= 0:
        return np.zeros_like(np.asarray(layer_time, dtype=np.float64))
    deg = _degrees(cols)
    # what stays in HBM, on the rows Megatron offloads (no recompute: activation_terms.py)
    kept = np.where(cols["recompute"] == RECOMPUTE_CODES["none"],
                    offload_kept_bytes(model, training, is_moe, deg, memory), 0.0)
    saved = layer_bytes(model, training, is_moe, deg, memory).of(cols["recompute"]) - kept
    host = gpu.host_link_Bps or DEFAULT_HOST_LINK_BPS
    copy = np.asarray(saved, dtype=np.float64) / host
    forward = np.asarray(layer_time, dtype=np.float64) / 3.0
    exposed = np.maximum(0.0, copy - forward) + np.maximum(0.0, copy - 2.0 * forward)
    per_chunk = model.num_layers / (cols["pp"].astype(np.float64)
                                    * cols["vpp"].astype(np.float64))
    share = np.minimum(float(k), per_chunk) / np.maximum(per_chunk, 1.0)
    return exposed * share


def _module_offload_exposed(model: ModelSpec, training: TrainingSpec, gpu: GpuProfile,
                            memory: MemoryOptions, cols: dict[str, np.ndarray], is_moe: bool,
                            layer_time: np.ndarray) -> np.ndarray:
    """Seconds per micro-batch a layer waits for fine-grained offload copies.

    Every layer copies its offloaded module inputs (``TrainingSpec.offload_modules``,
    :mod:`parsearch.cost.memory.module_offload`) to host on Megatron's D2H stream during its
    forward and back on the H2D stream before its backward
    (``fine_grained_activation_offload.py``), so the copy hides behind the layer it
    belongs to, as the layer-level offload's above: exposed = max(0, B/host - t_fwd) +
    max(0, B/host - t_bwd), now for every layer.
    """
    moved, share = module_moved_bytes(model, training, memory, cols, is_moe)
    copy = np.asarray(moved, dtype=np.float64) / (gpu.host_link_Bps or DEFAULT_HOST_LINK_BPS)
    forward = np.asarray(layer_time, dtype=np.float64) / 3.0
    return share * (np.maximum(0.0, copy - forward) + np.maximum(0.0, copy - 2.0 * forward))


def module_moved_bytes(model: ModelSpec, training: TrainingSpec, memory: MemoryOptions,
                       cols: dict[str, np.ndarray], is_moe: bool) -> tuple[Num, Num]:
    """Per row, what one layer of this kind moves to host under fine-grained offloading,
    and the share of a chunk's layers that move it.

    Fully recomputed layers save no module input; with ``--recompute-method block``
    (``recompute_num_layers`` N) the chunk's layers past the first N keep everything and
    offload theirs (:mod:`parsearch.cost.memory.activation_terms`).
    """
    code = cols["recompute"]
    layer = layer_bytes(model, training, is_moe, _degrees(cols), memory)
    full = code == RECOMPUTE_CODES["full"]
    if training.recompute_num_layers is None:
        return layer.moved_of(code), np.where(full, 0.0, 1.0)
    per_chunk = model.num_layers / (cols["pp"].astype(np.float64) * cols["vpp"].astype(np.float64))
    kept = np.maximum(per_chunk - training.recompute_num_layers, 0.0) / np.maximum(per_chunk, 1.0)
    return layer.moved_of(code, block=True), np.where(full, kept, 1.0)


def _degrees(cols: dict[str, np.ndarray]) -> ActDegrees:
    tp = np.asarray(cols["tp"]).astype(np.float64)
    sp_div = np.where(np.asarray(cols["sp"]).astype(bool), tp, 1.0)
    return ActDegrees(tp=tp, cp=np.asarray(cols["cp"]).astype(np.float64),
                      ep=np.asarray(cols["ep"]).astype(np.float64),
                      etp=np.asarray(cols["etp"]).astype(np.float64),
                      mbs=np.asarray(cols["mbs"]).astype(np.float64), sp_div=sp_div)


def max_offload_layers(model: ModelSpec) -> int:
    """The most layers Megatron offloads: ``num_layers - 1`` (Megatron-Core
    ``TransformerConfig.__post_init__``: "CPU offloading can be done only for layers less
    than {num_layers}")."""
    return max(model.num_layers - 1, 0)


def offload_allowed(cols: dict[str, np.ndarray]) -> np.ndarray:
    """Which layouts Megatron runs whole-layer CPU offloading with (rule R11: ``pp = 1``,
    recompute none; ``layout/rules.py``)."""
    return (np.asarray(cols["pp"]) == 1) & (np.asarray(cols["recompute"])
                                             == RECOMPUTE_CODES["none"])


def offload_saving(model: ModelSpec, training: TrainingSpec, memory: MemoryOptions,
                   cols: dict[str, np.ndarray]) -> np.ndarray:
    """HBM bytes offloading the first K layers frees, per row (rows) and K = 0..L-1 (columns),
    on a ``pp = 1`` layout without recompute.

    As the memory model holds it (``cost/memory/activation_terms.py``
    ``stage_activations``): the offloaded layers leave HBM but the largest of them stays,
    in flight; one chunk, one micro-batch in flight (1F1B with ``p = 1``; NAR21 §2.2.1):

        saving(K) = n_dense(K) b_dense + n_moe(K) b_moe - max(b of the kinds among them)

    with ``n_kind(K)`` the layers of that kind among the first K and ``b`` what a layer
    moves to host: its saved activations without recompute (``activations.stage_layer_bytes``)
    less what stays (``activations.offload_kept_bytes``).
    """
    held, in_flight = _offloaded_bytes(model, training, memory, cols)
    return held - in_flight


def offload_host_bytes(model: ModelSpec, training: TrainingSpec, memory: MemoryOptions,
                       cols: dict[str, np.ndarray]) -> np.ndarray:
    """Host-memory bytes per GPU the first K offloaded layers take, per row (rows) and
    K = 0..L-1 (columns): every offloaded layer's saved activations of the one micro-batch
    in flight (``pp = 1``), ``n_dense(K) b_dense + n_moe(K) b_moe``."""
    return _offloaded_bytes(model, training, memory, cols)[0]


def _offloaded_bytes(model: ModelSpec, training: TrainingSpec, memory: MemoryOptions,
                     cols: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """(bytes the first K layers save, the largest of them that stays in HBM in flight)."""
    kinds = stage_layer_bytes(model, training, _degrees(cols), memory)
    kept = kept_bytes_per_layer(model, training, memory, cols)
    none = RECOMPUTE_CODES["none"]
    n = len(np.asarray(cols["tp"]))

    def moved(is_moe: bool) -> np.ndarray:  # what an offloaded layer sends to host
        return np.broadcast_to(np.asarray(kinds[is_moe].of(none), dtype=np.float64),
                               (n,)) - kept[is_moe]

    dense = moved(False)
    moe = moved(True) if True in kinds else np.zeros(n)
    top = max_offload_layers(model)
    is_moe = np.array([model.is_moe_layer(i) for i in range(top)], dtype=bool)
    n_moe = np.concatenate([[0], np.cumsum(is_moe)]).astype(np.float64)  # K = 0..L-1
    n_dense = np.arange(top + 1, dtype=np.float64) - n_moe
    held = (np.outer(dense, n_dense) + np.outer(moe, n_moe))
    in_flight = np.maximum(np.outer(dense, n_dense > 0), np.outer(moe, n_moe > 0))
    return held, in_flight


def fewest_fitting_layers(model: ModelSpec, training: TrainingSpec, memory: MemoryOptions,
                          cols: dict[str, np.ndarray], excess: np.ndarray,
                          peak: Callable[[int, np.ndarray], np.ndarray] | None = None,
                          ) -> np.ndarray:
    """Per row, the fewest offloaded layers that free ``excess`` bytes of HBM, ``num_layers``
    where none does (at most :func:`max_offload_layers`).

    Solved from :func:`offload_saving`; with ``peak(k, rows)`` (the memory model's peak minus
    what fits, at K = k, for those rows: > 0 does not fit) each answer is then checked
    against the memory model itself and moved up a layer while it does not fit, so the
    answer is the memory model's own.
    """
    n = len(excess)
    out = np.full(n, model.num_layers, dtype=np.int64)
    need = np.asarray(excess, dtype=np.float64)
    if not n or max_offload_layers(model) < 1:
        return out
    saving = offload_saving(model, training, memory, cols)
    enough = saving >= need[:, None]
    found = enough.any(axis=1)
    out[found] = np.argmax(enough[found], axis=1)
    if peak is None:
        return out
    pending = np.nonzero(found)[0]
    top = max_offload_layers(model)
    while len(pending):  # the memory model decides; move up while it does not fit
        misfit = np.zeros(len(pending), dtype=bool)
        for k in np.unique(out[pending]):
            at = np.nonzero(out[pending] == k)[0]
            misfit[at] = peak(int(k), pending[at]) > 0
        pending = pending[misfit]
        out[pending] += 1
        over = out[pending] > top
        out[pending[over]] = model.num_layers
        pending = pending[~over]
    return out


def host_bytes_needed(model: ModelSpec, training: TrainingSpec, memory: MemoryOptions,
                      cols: dict[str, np.ndarray]) -> np.ndarray:
    """Per row, the host memory per GPU the ``training.activation_offload_layers``
    offloaded layers take (:func:`offload_host_bytes` at that count); 0 on rows Megatron
    does not offload on (:func:`offload_allowed`) and without offload."""
    n = len(np.asarray(cols["tp"]))
    if training.offload_modules and n:
        return _module_host_bytes(model, training, memory, cols)
    k = training.activation_offload_layers
    if k <= 0 or not n:
        return np.zeros(n)
    held = offload_host_bytes(model, training, memory, cols)
    return np.where(offload_allowed(cols), held[:, min(k, held.shape[1] - 1)], 0.0)


def _module_host_bytes(model: ModelSpec, training: TrainingSpec, memory: MemoryOptions,
                       cols: dict[str, np.ndarray]) -> np.ndarray:
    """Per row, the host memory per GPU fine-grained offloading fills at most: the larger
    layer kind's moved bytes, times the stage's layers, times the micro-batches the first
    stage holds in flight, ``min(m, pp)``, ``(1 + (pp - 1) / (pp vpp))`` times more when
    interleaved (NAR21 §2.2.2)."""
    pp = cols["pp"].astype(np.float64)
    vpp = cols["vpp"].astype(np.float64)
    kinds = (False, True) if model.moe is not None else (False,)
    moved = np.maximum.reduce([np.broadcast_to(np.asarray(
        np.multiply(*module_moved_bytes(model, training, memory, cols, k)), dtype=np.float64),
        pp.shape) for k in kinds])
    m = training.global_batch / (cols["mbs"].astype(np.float64) * cols["dp"].astype(np.float64))
    in_flight = np.minimum(m, pp) * np.where(vpp > 1, 1.0 + (pp - 1.0) / (pp * vpp), 1.0)
    return moved * model.num_layers / pp * in_flight


def kept_bytes_per_layer(model: ModelSpec, training: TrainingSpec, memory: MemoryOptions,
                         cols: dict[str, np.ndarray]) -> dict[bool, np.ndarray]:
    """Per layer kind (``True``: MoE) and row, what one offloaded layer leaves in HBM
    (:func:`~parsearch.cost.memory.activations.offload_kept_bytes`)."""
    deg = _degrees(cols)
    kinds = (False, True) if model.moe is not None else (False,)
    n = len(np.asarray(cols["tp"]))
    return {is_moe: np.broadcast_to(np.asarray(
        offload_kept_bytes(model, training, is_moe, deg, memory), dtype=np.float64), (n,))
        for is_moe in kinds}


def host_memory_fits(model: ModelSpec, training: TrainingSpec, memory: MemoryOptions,
                     cols: dict[str, np.ndarray], host_bytes_per_gpu: float | None) -> np.ndarray:
    """Per row, whether the offloaded activations (:func:`host_bytes_needed`) fit the host
    memory one GPU has (``None``: not stated, every row fits)."""
    if host_bytes_per_gpu is None:
        return np.ones(len(np.asarray(cols["tp"])), dtype=bool)
    return host_bytes_needed(model, training, memory, cols) <= host_bytes_per_gpu
