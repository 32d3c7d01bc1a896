"""GEMM time under Transformer Engine's userbuffers TP overlap: the overlapped GEMMs run in chunks.

With ``--tp-comm-overlap`` a TP-sharded linear's all-gather or reduce-scatter is hidden by
splitting the GEMM it feeds into pieces that alternate with the pieces of the collective
(Transformer Engine ``pytorch/module/base.py`` ``initialize_ub``, default configuration):

* ``ring_exchange`` (QKV and FC1 forward, projection and FC2 data-gradient): one GEMM per
  TP rank's chunk, ``num_splits = tp_size``, each over ``1/tp`` of the rows;
* ``pipeline`` (projection and FC2 forward, reduce-scatter): ``num_splits = 4``;
* ``bulk`` (QKV and FC1 data- and weight-gradient): the whole GEMM beside the whole
  collective, not split.

A chunk is a smaller GEMM, so it runs further down the size curve
(:func:`parsearch.cost.compute.gemm_efficiency`, a fixed time per call): the overlap
that hides the traffic makes the GEMMs themselves slower, most at large TP and few
tokens.  Without the overlap every GEMM runs whole.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from parsearch.workload import ModelSpec

#: Chunks of a ``pipeline``-method overlap (TE ``initialize_ub`` default ``num_splits``).
PIPELINE_SPLITS = 4.0


def column_parallel_share(model: ModelSpec, mlp_width: float) -> float:
    """Share of a layer's TP-sharded GEMM FLOPs in its column-parallel linears (QKV, FC1).

    The rest is in the row-parallel ones (output projection, FC2).  ``mlp_width`` is the
    TP-sharded MLP's width (the dense FFN, an MoE layer's shared experts, or 0).  MLA's
    projections are split differently; they count half and half.

    >>> from parsearch.presets import get_preset
    >>> model = get_preset("llama3-70b")
    >>> round(column_parallel_share(model, model.ffn_hidden_size), 3)
    0.647
    """
    if model.mla is not None:
        return 0.5
    h = model.hidden_size
    q = model.num_attention_heads * model.head_dim
    kv = model.num_query_groups * model.head_dim
    qkv, proj = h * (q + 2 * kv), q * h
    fc1 = h * mlp_width * (2.0 if model.mlp_activation == "swiglu" else 1.0)
    fc2 = mlp_width * h
    return (qkv + fc1) / (qkv + proj + fc1 + fc2)


def userbuffers_gemm_passes(flops_forward: np.ndarray, per_call: np.ndarray, tp: np.ndarray,
                            column_share: float,
                            rate: Callable[[np.ndarray], np.ndarray]
                            ) -> tuple[np.ndarray, np.ndarray]:
    """(forward, data-gradient) seconds of a layer's TP-sharded GEMMs run in userbuffers chunks.

    ``flops_forward`` is the layer's forward FLOPs of those GEMMs on this GPU, ``per_call``
    one GEMM's (the size the whole-GEMM price uses), ``rate(f)`` the FLOP/s a GEMM of
    ``f`` FLOPs reaches.  Forward: the column-parallel share in ``tp`` ring chunks, the
    row-parallel share in :data:`PIPELINE_SPLITS` pipeline chunks.  Data gradient: the
    row-parallel share in ``tp`` ring chunks, the column-parallel share whole (bulk).
    The weight gradient is never split.
    """
    ring = per_call / np.maximum(tp, 1.0)
    column = column_share * flops_forward
    row = (1.0 - column_share) * flops_forward
    forward = column / rate(ring) + row / rate(per_call / PIPELINE_SPLITS)
    dgrad = row / rate(ring) + column / rate(per_call)
    return forward, dgrad
