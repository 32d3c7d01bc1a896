"""Step time of many layouts from their unit prices: stages, schedule, DP traffic, optimizer.

The arithmetic of :func:`parsearch.cost.analytic.score_columns` after the unit
prices: a pipeline stage's per-micro-batch time is the dot product of its unit
counts with the units' prices (:mod:`parsearch.cost.stages`), the schedule
(:mod:`parsearch.cost.schedule`) turns stage times into a step, and data
parallel traffic and the optimizer step are added at the stage where they are
largest.

For speed everything that is linear in a stage's unit counts is folded into one
coefficient per (price row, unit) before it meets the stages: a stage's DP
reduce-scatter time is ``bytes x (seconds per byte) + latency``
(:func:`linear_collective`, the same terms as
:func:`parsearch.cost.collectives.reduce_scatter_time`), so the per-stage work is
a handful of ``(rows x units) @ (units x stages)`` products.  The numbers equal
the term-by-term evaluation up to floating-point rounding (~1e-16 relative).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from parsearch.cost.collectives import LinkArrays, ring_latency, split_group, tree_latency

# Components of a stage's per-micro-batch time (summed over its units).
STAGE_PARTS: tuple[str, ...] = ("compute", "memory_bound", "overhead", "tp_comm", "cp_comm",
                                "ep_comm", "offload")
#: Parts that make a stage's work (what overlapped traffic can hide behind); the rest
#: is exposed waiting (communication, host copies of offloaded activations).
_WORK_PARTS = (0, 1, 2)
_WAIT_PARTS = (3, 4, 5, 6)
# Bytes the optimizer step reads and writes per (sharded) parameter: fp32 grad (4),
# master weight, Adam m and v read and written (3 x 4 x 2), bf16 weight written (2).
# Formulas.md §5.1 state sizes; the read/write count is ours.
OPTIMIZER_STEP_BYTES = 30.0


def linear_collective(link: LinkArrays) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(seconds per byte, ring latency, tree latency)`` of one DP collective over ``link``.

    The terms of :func:`parsearch.cost.collectives.reduce_scatter_time`
    (nccl-tests PERFORMANCE.md busbw factor, hierarchical across domains,
    formulas.md §7.1): ``(k-1)/k · S / B_nvlink + (M-1)/M · S/k / B_network``;
    a reduce-scatter or all-gather call pays the ring's latency
    (:func:`parsearch.cost.collectives.ring_latency`), an all-reduce call the tree's
    (:func:`parsearch.cost.collectives.tree_latency`); zero for a group of one.  A zero
    bandwidth prices its term at zero, as ``safe_div`` does.
    """
    k, m, n = split_group(link)
    nv = np.asarray(link.nvlink_bandwidth_Bps, dtype=np.float64)
    net = np.asarray(link.network_bandwidth_Bps, dtype=np.float64)
    intra = np.where(nv > 0, (k - 1.0) / k / np.where(nv > 0, nv, 1.0), 0.0)
    inter = np.where(net > 0, (m - 1.0) / m / k / np.where(net > 0, net, 1.0), 0.0)
    alone = n <= 1
    return (np.where(alone, 0.0, intra + inter), np.where(alone, 0.0, ring_latency(link)),
            np.where(alone, 0.0, tree_latency(link)))


def bucket_params(link: LinkArrays, fixed_bucket_params: float | None) -> np.ndarray:
    """Parameters per gradient bucket of a DP group: each bucket is one collective call.

    Megatron-Core's DDP sizes its buckets by the group, ``max(40e6, 1e6 x dp)``
    parameters, "to remain bandwidth-bound rather than latency-bound" (Megatron-LM
    core/distributed/distributed_data_parallel.py, ``bucket_size``); a fixed size
    (``--ddp-bucket-size``, or Apex's DistributedFusedAdam ``bucket_cap_mb``, NVIDIA/apex
    distributed_fused_adam.py: ``1024 * 1024 * bucket_cap_mb / dtype_size`` elements of the
    gradient-sync dtype) replaces it.
    """
    if fixed_bucket_params is not None:
        return np.broadcast_to(np.float64(fixed_bucket_params), np.shape(link.size))
    return np.maximum(40e6, 1e6 * np.asarray(link.size, dtype=np.float64))


@dataclass(frozen=True)
class StageCoefficients:
    """Per price row, what each unit a stage holds adds to its times (columns in blocks of
    ``len(UNITS)``): the stage parts (:data:`STAGE_PARTS`), work (compute +
    memory-bound + overhead), exposed waiting (TP + CP + EP communication and
    offload copies), DP gradient reduction, DP parameter gather, optimizer step; then
    the PP send, reduction and gather latencies."""

    table: np.ndarray  # (_BLOCKS * units + 3, price rows)
    units: int

    def mean_stage_parts(self, mean_feats: np.ndarray) -> np.ndarray:
        """``(parts, price rows)``: each stage part's time at the mean stage.

        A split's stages hold all units between them, so the mean stage is
        ``totals / pp`` for every split of one ``pp``: computed once per mean stage and
        gathered by the rows, instead of gathering all the part coefficients per split.
        """
        u = self.units
        return np.stack([mean_feats @ self.table[i * u:(i + 1) * u] for i in range(_P)])


# Block indices into StageCoefficients.table
_P = len(STAGE_PARTS)
_PARTS, _WORK, _COMM, _REDUCE, _GATHER, _OPT, _BUCKET = (0, _P, _P + 1, _P + 2, _P + 3, _P + 4,
                                                         _P + 5)
_BLOCKS = _P + 6


def stage_coefficients(
    prices: dict[str, dict[str, np.ndarray]],
    params: dict[str, tuple[object, object]],
    units: tuple[str, ...],
    pshape: tuple[int, ...],
    pp_send: np.ndarray,
    dp_link: LinkArrays,
    edp_link: LinkArrays,
    shards: tuple[np.ndarray, np.ndarray],
    *,
    grad_bytes: float,
    gather_bytes: float,
    distributed_optimizer: bool,
    fsdp: bool,
    hbm_Bps: float,
    optimizer_step_bytes: float = OPTIMIZER_STEP_BYTES,
    bucketed: bool = False,
    fixed_bucket_params: float | None = None,
) -> StageCoefficients:
    """Fold the unit prices and parameters of every price row into stage coefficients.

    DP traffic (formulas.md §7.6): the distributed optimizer reduce-scatters
    gradients and all-gathers parameters over DP*CP (dense) and EDP (experts);
    without it an all-reduce (twice a reduce-scatter, nccl-tests busbw) and no
    gather; FSDP prices per micro-batch the same reduce-scatter and gather.
    Optimizer: :data:`OPTIMIZER_STEP_BYTES` per sharded parameter at the HBM
    bandwidth.  ``shards``: (dense, expert) optimizer shard counts per price row.

    Latency: every gradient buffer issues at least one call per step; with overlapped
    reduction (``bucketed``) its parameters go in buckets (:func:`bucket_params`), one call
    each.  The ``_BUCKET`` block holds the latency per parameter of that bucketing
    (``latency / bucket``), which :func:`score_split` scales by the model chunks as the
    optimizer implementation buckets them (:class:`StageSettings`); the trailing rows
    hold one call's latency.  With a ring's latency growing with the domains, small fixed
    buckets on many nodes are what makes the reduction latency-bound.
    """

    n = pshape[0] if pshape else 1
    u = len(units)
    table = np.empty((_BLOCKS * u + 3, n))

    def block(index: int) -> np.ndarray:  # the (units, price rows) rows of one block
        return table[index * u:(index + 1) * u]

    for i, key in enumerate(STAGE_PARTS):
        for j, unit in enumerate(units):
            block(i)[j] = prices[unit][key]
    np.add(block(_WORK_PARTS[0]), block(_WORK_PARTS[1]), out=block(_WORK))
    for i in _WORK_PARTS[2:]:
        block(_WORK)[:] += block(i)
    np.add(block(_WAIT_PARTS[0]), block(_WAIT_PARTS[1]), out=block(_COMM))
    for i in _WAIT_PARTS[2:]:
        block(_COMM)[:] += block(i)
    dense = np.empty((u, n))
    expert = np.empty((u, n))
    for j, unit in enumerate(units):
        dense[j], expert[j] = params[unit][0], params[unit][1]
    a_dp, ring_dp, tree_dp = linear_collective(dp_link)
    a_edp, ring_edp, tree_edp = linear_collective(edp_link)
    sharded = fsdp or distributed_optimizer
    # a reduce-scatter / all-gather call pays the ring's latency, an all-reduce the tree's
    l_dp, l_edp = (ring_dp, ring_edp) if sharded else (tree_dp, tree_edp)
    # Megatron-Core builds its gradient buffers from the parameters of each group, the
    # expert-data-parallel ones only from expert parameters (core/distributed/
    # distributed_data_parallel.py, expert_parallel_buffers): a dense model issues no EDP
    # collective and pays none of its latency.
    has_experts = np.any(expert > 0.0, axis=0)
    fixed = np.broadcast_to(l_dp + np.where(has_experts, l_edp, 0.0), (n,))
    reduce_per_byte = dense * np.broadcast_to(a_dp, (n,)) + expert * np.broadcast_to(a_edp, (n,))
    if bucketed and not fsdp:
        # one bucket size for every buffer, set by the dense DP group (Megatron-Core DDP)
        bucket = bucket_params(dp_link, fixed_bucket_params)
        block(_BUCKET)[:] = (dense * np.broadcast_to(l_dp / bucket, (n,))
                             + expert * np.broadcast_to(l_edp / bucket, (n,)))
    else:
        block(_BUCKET)[:] = 0.0
    if sharded:
        block(_REDUCE)[:] = reduce_per_byte * grad_bytes
        block(_GATHER)[:] = reduce_per_byte * gather_bytes
        table[_BLOCKS * u + 1] = table[_BLOCKS * u + 2] = fixed
    else:  # all-reduce: the bytes of a reduce-scatter and an all-gather, the tree's latency
        block(_REDUCE)[:] = 2.0 * (reduce_per_byte * grad_bytes)
        block(_GATHER)[:] = 0.0
        table[_BLOCKS * u + 1] = fixed
        table[_BLOCKS * u + 2] = 0.0
    shards_dense, shards_expert = shards
    if not (distributed_optimizer or fsdp):
        shards_dense = shards_expert = np.ones(n)
    # bytes per parameter: OPTIMIZER_STEP_BYTES, 22 with BF16 Adam moments (memory_features.py)
    block(_OPT)[:] = ((dense / shards_dense + expert / shards_expert) * optimizer_step_bytes
                      / hbm_Bps)
    table[_BLOCKS * u] = pp_send
    return StageCoefficients(table, u)


@dataclass(frozen=True)
class StageSettings:
    """The scalar settings of the stage arithmetic."""

    overlap_grad_reduce: bool
    overlap_param_gather: bool
    fsdp: bool
    step_overhead_s: float
    #: share of SMs communication kernels hold while they run beside compute (the
    #: profile's ``comm_sm_share``); hidden pipeline sends cost that share of their time
    comm_sm_share: float = 0.0
    #: with ``fsdp``: the weights are sharded too (``optim_grads_params``, ZeRO-3), or
    #: only gradients and optimizer state (``optim_grads``, ZeRO-2)
    fsdp_weights_sharded: bool = True
    #: gradient buckets as Megatron-Core's DDP makes them: one buffer per model chunk, and
    #: only the first chunk of the first pipeline stage split into buckets
    #: (``disable_bucketing`` for later chunks, ``bucket_size = None`` for ``pp_rank > 0``:
    #: megatron/training/training.py get_model, core/distributed/
    #: distributed_data_parallel.py); False: Apex's DistributedFusedAdam, whose buckets
    #: cover every parameter of every stage (NeMo 1.0 ``distributed_fused_adam``)
    megatron_buckets: bool = True
    #: interleaved sends overlapped with the next chunk's compute (``--overlap-p2p-comm``);
    #: ``False``: each is waited on, as in 1F1B (CostOptions.pp_p2p_overlap)
    overlap_p2p: bool = True


def interleaved_ring_wait(pp: int, vpp: int, send_s: np.ndarray) -> np.ndarray:
    """Seconds per step the interleaved schedule's warm-up and cool-down wait for sends.

    Megatron-Core runs each model chunk for a group of ``pp`` micro-batches before the
    next (``microbatch_group_size_per_vp_stage``, default ``pipeline_model_parallel_size``:
    ``core/model_parallel_config.py``; the schedule table in
    ``core/pipeline_parallel/schedules.py``), and the first stage's warm-up runs
    ``(vpp - 1) * pp`` forward chunks before its first backward
    (``get_pp_rank_microbatches``).  In that all-forward phase the first micro-batch's
    next chunk on rank 0 needs its previous chunk from the last rank: a ring of ``pp``
    chunks and ``pp`` sends, while rank 0 has only ``pp`` chunks of its own to run,
    so each of the ``vpp - 1`` chunk rounds waits ``pp`` sends; the cool-down's
    backward ring mirrors it.  In the steady 1F1B phase a backward chunk runs between
    a send and its use, so ``--overlap-p2p-comm`` hides the send there (``score_split``).
    With one micro-batch group (``m == pp``) the whole step is warm-up and cool-down.

    >>> float(interleaved_ring_wait(4, 5, np.array([1e-3]))[0])   # 2 x 4 rounds x 4 sends
    0.032
    >>> float(interleaved_ring_wait(4, 1, np.array([1e-3]))[0])
    0.0
    """
    return 2.0 * max(vpp - 1, 0) * float(pp) * np.asarray(send_s, dtype=np.float64)


def distinct_stages(feats: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(rows, first, count)``: the distinct unit-count rows of a split's stages in order
    of first appearance, the first stage holding each, and how many stages do.

    Stages with the same units have the same times, so the per-stage arithmetic runs
    once per distinct row (a 16-stage split has 2-4); an argmax over the distinct rows
    in this order names the same stage as one over all stages.

    >>> rows, first, count = distinct_stages(np.array([[1, 0], [2, 0], [2, 0], [2, 1]]))
    >>> rows.tolist(), first.tolist(), count.tolist()
    ([[1, 0], [2, 0], [2, 1]], [0, 1, 3], [1.0, 2.0, 1.0])
    """
    seen: dict[bytes, int] = {}
    first: list[int] = []
    count: list[float] = []
    for i, row in enumerate(feats):
        key = row.tobytes()
        if key in seen:
            count[seen[key]] += 1.0
        else:
            seen[key] = len(first)
            first.append(i)
            count.append(1.0)
    index = np.asarray(first, dtype=np.int64)
    return feats[index], index, np.asarray(count)


def score_split(coef: StageCoefficients, pidx: np.ndarray, feats: np.ndarray, vpp: int,
                m: np.ndarray, settings: StageSettings,
                mean_parts: np.ndarray) -> dict[str, np.ndarray]:
    """Time breakdown of rows sharing one (pp, vpp) split (``feats``: unit counts per stage).

    Step = m x (slowest stage's micro-batch time) + fill/drain bubble + exposed DP
    traffic + optimizer.  The per-part times are reported at the mean stage, and
    ``stage_imbalance`` is what the slowest stage adds on top (m x (max - mean)),
    so the parts add up to the step and the bottleneck is named truthfully.
    ``pidx``: the rows' price rows; ``m``: their micro-batch counts (float);
    ``mean_parts``: :meth:`StageCoefficients.mean_stage_parts` of this split's mean stage.
    Per-stage arrays are (distinct stages, rows) (:func:`distinct_stages`); a stage's
    times are the dot product of its unit counts with the rows' coefficients.
    """
    stages = feats.shape[0]
    u = coef.units
    kinds, first, count = distinct_stages(feats)
    part_means = np.take(mean_parts, pidx, axis=1)
    rows = np.take(coef.table[_WORK * u:], pidx, axis=1)  # (per-stage coefficients, rows)
    r = len(pidx)
    work, comm, reduce, gather, optimizer, bucketing = (
        kinds @ rows[(b - _WORK) * u:(b - _WORK + 1) * u]
        for b in (_WORK, _COMM, _REDUCE, _GATHER, _OPT, _BUCKET))
    base = (_BLOCKS - _WORK) * u
    pp_send, reduce_fixed, gather_fixed = rows[base], rows[base + 1], rows[base + 2]
    # PP p2p (formulas.md §7.4): 2 sends per micro-batch and model chunk.  1F1B waits
    # for them; with interleaving Megatron overlaps them with the next chunk's compute
    # (--overlap-p2p-comm, on for interleaved schedules), up to that compute.  A hidden
    # send still runs NCCL kernels on the GPU beside the compute, which then runs slower by
    # the SM share they hold, as every other overlapped collective here
    # (communication.py's sm_slowdown): deep interleaving multiplies the sends by vpp.
    p2p_total = 2.0 * float(vpp) * pp_send
    ring_wait = 0.0
    if vpp > 1 and settings.overlap_p2p:
        p2p = (np.maximum(0.0, p2p_total - work)
               + settings.comm_sm_share * np.minimum(p2p_total, work))
        p2p_mean = (count @ p2p) / stages
        stage_time = work + comm + p2p
        ring_wait = interleaved_ring_wait(stages, vpp, pp_send)
    else:
        # Waited sends (1F1B; interleaving before --overlap-p2p-comm) sit on each stage's
        # own timeline, so the warm-up ring delivers no later than the stage needs it.
        p2p_mean = p2p_total
        stage_time = work + comm + p2p_total
    out = {f"time_{k}": m * part_means[i] for i, k in enumerate(STAGE_PARTS)}
    out["time_pp_p2p"] = m * p2p_mean + ring_wait
    worst = np.argmax(stage_time, axis=0)
    n = np.arange(r)
    slowest = stage_time[worst, n]
    total_stage = count @ stage_time
    # Pipeline bubble (parsearch.cost.schedule.pipeline_time; NAR21 §2.2.1/§2.2.2):
    # (sum_r t_r - max_r t_r) / v.
    out["time_pp_bubble"] = (total_stage - slowest) / float(vpp)
    out["time_stage_imbalance"] = m * (slowest - total_stage / stages)
    out["slowest_stage"] = first[worst]
    # DP traffic overlap is a bound (Megatron DDP): with --overlap-grad-reduce the
    # reduction runs beside the last micro-batch's backward (2/3 of its compute), with
    # --overlap-param-gather the gather beside the first forward (1/3); a switched-off
    # overlap leaves it exposed (formulas.md §6.3).
    # Collective calls (one latency each): Megatron-Core issues one per model chunk's
    # buffer and buckets only the first chunk (a 1/vpp share of the stage's parameters),
    # priced at the first stage, the one whose reduction ends the step; Apex buckets
    # all of them.  The bucketed chunk's ceil(P / bucket) calls are priced as
    # max(1, P / bucket): never fewer than the one call an unbucketed buffer makes.
    chunks = float(vpp) if settings.megatron_buckets and not settings.fsdp else 1.0

    def calls_latency(fixed: np.ndarray) -> np.ndarray:
        return fixed * (chunks - 1.0) + np.maximum(fixed, bucketing / chunks)

    reduce = reduce + calls_latency(reduce_fixed)
    # no gather without a sharded optimizer (the all-reduce carries it): no calls either
    gather = gather + np.where(gather_fixed > 0.0, calls_latency(gather_fixed), 0.0)
    backward = work * (2.0 / 3.0) if settings.overlap_grad_reduce else None
    forward = work / 3.0 if settings.overlap_param_gather else None
    if settings.fsdp and not settings.fsdp_weights_sharded:
        # ZeRO-2 / Megatron-FSDP optim_grads (ZeRO §5 P_os+g, §7: 2 Psi): every
        # micro-batch reduce-scatters its gradients as its backward runs (the gradient
        # buffer is sharded, so nothing accumulates unreduced); the whole weights are
        # all-gathered once per step after the optimizer, beside the first forward.
        budget = backward if backward is not None else 0.0
        exposed = m * np.maximum(0.0, reduce - budget)
        exposed = exposed + (np.maximum(0.0, gather - forward) if forward is not None
                             else gather)
    elif settings.fsdp:
        # ZeRO-3 / Megatron-FSDP (formulas.md §7.6; ZeRO §7: 3 Psi): every micro-batch
        # all-gathers the parameters for forward and again for backward and
        # reduce-scatters its gradients; prefetching hides them behind that
        # micro-batch's compute.
        half = backward / 2.0 if backward is not None else 0.0
        hidden = (forward if forward is not None else 0.0) + half
        exposed = m * (np.maximum(0.0, 2.0 * gather - hidden)
                       + np.maximum(0.0, reduce - half))
    else:
        exposed = np.maximum(0.0, reduce - backward) if backward is not None else reduce
        exposed = exposed + (np.maximum(0.0, gather - forward) if forward is not None
                             else gather)
    worst_dp = np.argmax(exposed + optimizer, axis=0)
    out["time_dp_comm"] = exposed[worst_dp, n]
    out["time_optimizer"] = optimizer[worst_dp, n] + settings.step_overhead_s
    return out
