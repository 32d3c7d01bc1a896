"""HBM that per-layer CUDA graphs hold beyond eager execution: their static buffers.

Mechanism (Megatron-LM ``megatron/core/transformer/cuda_graphs.py`` at
cd4afffa648426a959dc7cb1e24b5ce7d0c3ff54, ``TECudaGraphHelper`` and ``_CudaGraphRunner``;
Transformer Engine ``make_graphed_callables``):

* Each captured callable (a whole transformer layer, or with ``--cuda-graph-modules``
  one graph for ``attn`` and one for the MLP part: ``mlp``, ``moe`` or ``moe_router`` with
  ``moe_preprocess``) replays on *static* tensors: the hidden states it reads (its
  static input) and, in backward, the gradient it returns (its static grad input).
  Eager code frees a gradient as soon as the previous layer consumed it; a graph keeps
  its buffers allocated for as long as it exists.
* Without a pipeline one set of graphs serves every micro-batch
  (``TECudaGraphHelper._get_cuda_graph_input_data``: "If PP is not enabled, we only need
  to capture one microbatch"); with one, a graph is captured per layer *and* micro-batch
  (``_order`` from the schedule table), and a micro-batch's static buffers are reused by a
  later forward only once its backward has run (``_get_sample_arguments``,
  ``consumed_sample_queue``; Megatron-LM PR #2391 "Optimize TE cudagraph input memory"):
  the buffers alive are those of the micro-batches in flight, the same count the stage's
  activations are held for (:func:`~parsearch.cost.memory.activations.chunk_in_flight`).
* A graph's static output is the next graph's static input
  (``_reuse_graph_input_output_buffers``, Transformer Engine >= 2.7, which Megatron turns
  on; Transformer Engine PR #1234: without it "each cudagraph has its own input and output
  data buffer"), so per callable and micro-batch in flight two hidden-state tensors remain:
  the static input and the static grad input, ``2 x mbs x s/cp x h / (tp with SP) x 2 B``.
* Temporaries inside the graphs come from one private pool shared by every graph,
  captured in execution order (``create_cudagraphs`` docstring: "allows multiple cudagraphs
  to share a single memory pool, minimizing cudagraph memory usage"), so they reuse one
  another's blocks as eager temporaries do; they add no term here.

Magnitude check: a Llama layer under ``attn`` + ``mlp`` graphs holds 4 such tensors per
micro-batch (8 bytes per token and hidden element / (tp with SP)) beside about 40 of eager
activations, ~20% more activation memory; whole-layer graphs hold half that.  NeMo measured
"~20%" more activation memory (10-20 GB end to end) with the 2024 per-layer implementation,
whose graphs each kept their own temporaries (NVIDIA NeMo PR #10500,
``docs/source/performance/cudagraphs.md``); the shared pool has since removed that part, so
the count here stays at or below that figure.  ``--cuda-graph-impl full_iteration``
(``FullCudaGraphWrapper``) captures the whole forward-backward as one graph whose only
static buffers are the iteration's input batch: no per-layer term.
"""

from __future__ import annotations

import numpy as np

from parsearch.cost.memory.options import ACTIVATION_BYTES, Num

#: ``--cuda-graph-impl`` values that capture one graph per layer (or per scope of a layer).
PER_LAYER_IMPLS: tuple[str, ...] = ("transformer_engine", "local")
#: Static hidden-state buffers per captured callable and micro-batch in flight (see above).
STATIC_BUFFERS_PER_CALLABLE = 2.0


def graph_callables(scope: tuple[str, ...], *, moe_layer: bool) -> int:
    """Graphs captured per layer of one kind under ``scope`` (empty: the whole layer).

    ``attn`` is one graph; the MLP part is another when its scope names it (``mlp`` for a
    dense layer; ``moe`` or ``moe_router`` for a MoE layer, ``moe_preprocess`` going with
    the router's graph).

    >>> graph_callables((), moe_layer=True), graph_callables(("attn", "mlp"), moe_layer=False)
    (1, 2)
    >>> graph_callables(("attn", "moe_router", "moe_preprocess"), moe_layer=False)
    1
    """
    if not scope:
        return 1
    mlp_part = (("moe" in scope or "moe_router" in scope) if moe_layer else "mlp" in scope)
    return int("attn" in scope) + int(mlp_part)


def layer_graph_counts(cuda_graphs: bool, impl: str,
                       scope: tuple[str, ...]) -> tuple[int, int]:
    """(dense, MoE) graphs per layer that hold static buffers: none without per-layer graphs.

    >>> layer_graph_counts(True, "transformer_engine", ("attn", "moe_router"))
    (1, 2)
    >>> layer_graph_counts(True, "full_iteration", ()), layer_graph_counts(False, "local", ())
    ((0, 0), (0, 0))
    """
    if not cuda_graphs or impl not in PER_LAYER_IMPLS:
        return (0, 0)
    return (graph_callables(scope, moe_layer=False), graph_callables(scope, moe_layer=True))


def cuda_graph_layer_bytes(callables: int, tokens: Num, hidden: int, sp_div: Num) -> Num:
    """Static-buffer bytes one layer's graphs hold per micro-batch in flight (arrays over
    layouts): ``callables x 2 x tokens x h / sp_div x 2 B`` (module docstring).

    ``tokens``: ``mbs x s / cp``; ``sp_div``: ``tp`` with sequence parallelism, else 1.

    >>> float(cuda_graph_layer_bytes(2, 8192.0, 8192, 8.0)) / 2**20
    64.0
    """
    if callables <= 0:
        return np.zeros_like(np.asarray(tokens / sp_div, dtype=np.float64))
    return (callables * STATIC_BUFFERS_PER_CALLABLE * ACTIVATION_BYTES
            * np.asarray(tokens, dtype=np.float64) * hidden / sp_div)


__all__ = [
    "PER_LAYER_IMPLS",
    "STATIC_BUFFERS_PER_CALLABLE",
    "cuda_graph_layer_bytes",
    "graph_callables",
    "layer_graph_counts",
]
