"""torchtitan's op-level selective checkpointing: what a block saves and what it runs again,
how torchtitan's published rows are read with it, and where it is refused."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from parsearch.cost.memory.activations import ActDegrees, layer_bytes
from parsearch.cost.memory.options import MemoryOptions
from parsearch.cost.recompute import recompute_shares
from parsearch.cost.titan_sac import recomputed_gemm_share, saved_elements
from parsearch.errors import SpecError
from parsearch.launch.plan import launch_plan
from parsearch.layout import Layout
from parsearch.model.presets import get_preset
from parsearch.model.specs import RECOMPUTE_CODES, TORCHTITAN_OP_SAC, TrainingSpec
from parsearch.validation.published.published_runs import (
    load_independent_runs,
    training_spec,
)
from parsearch.validation.published.runs import validate_runs

SAC = (TORCHTITAN_OP_SAC,)
DENSE = ("llama3-8b", "llama3-70b", "llama3.1-405b")


def _degrees(tp: int, sp: bool = True) -> ActDegrees:
    one = np.asarray(1.0)
    return ActDegrees(tp=np.asarray(float(tp)), cp=one, ep=one, etp=one, mbs=one,
                      sp_div=np.asarray(float(tp) if sp else 1.0))


def test_llama_block_saves_what_the_policy_keeps() -> None:
    # Llama 3 8B, TP 1, per token: the block input and SDPA's output (4,096 each) and its
    # fp32 log-sum-exp (32 heads = 64 16-bit elements); the outputs of wq (4,096), wv
    # (1,024), w1 (14,336) and w2 (4,096), the odd-numbered matmuls
    act, mm = saved_elements(get_preset("llama3-8b"), np.asarray(1.0), np.asarray(1.0))
    assert float(act) == 4096 + 4096 + 64 and float(mm) == 4096 + 1024 + 14336 + 4096
    # wk, wo, w3 of the 7 matmuls run again: (1,024 + 4,096 + 14,336) of 53,248 weights
    assert recomputed_gemm_share(get_preset("llama3-8b")) == pytest.approx(
        (1024 + 4096 + 14336) / (4096 + 1024 + 1024 + 4096 + 3 * 14336))


@settings(max_examples=25, deadline=None)
@given(name=st.sampled_from(DENSE), tp=st.sampled_from([1, 2, 4, 8]), sp=st.booleans())
def test_it_saves_more_than_full_and_less_than_megatron_without_tp(name: str, tp: int,
                                                                     sp: bool) -> None:
    model = get_preset(name)
    training = TrainingSpec(seq_len=8192, global_batch=64)
    titan = TrainingSpec(seq_len=8192, global_batch=64, recompute_modules=SAC)
    options = MemoryOptions()
    megatron = layer_bytes(model, training, False, _degrees(tp, sp), options)
    sac = layer_bytes(model, titan, False, _degrees(tp, sp), options)
    assert float(sac.full) < float(sac.selective)
    assert float(sac.none) == float(megatron.none)  # only the selective reading changes
    if tp == 1:
        # without TP it keeps far less than Megatron's core-attention recompute (or no
        # recompute); with TP the row-parallel w2's saved output is the full-width partial
        # sum before its reduce-scatter, which can outweigh both
        assert float(sac.selective) < 0.6 * float(megatron.selective) < float(sac.none)


@settings(max_examples=15, deadline=None)
@given(name=st.sampled_from(DENSE), tp=st.sampled_from([1, 2, 8]))
def test_its_time_shares_rerun_half_the_matmuls_and_every_elementwise_op(name: str,
                                                                          tp: int) -> None:
    model = get_preset(name)
    titan = TrainingSpec(seq_len=8192, global_batch=64, recompute_modules=SAC)
    shares = recompute_shares(model, titan, RECOMPUTE_CODES["selective"], tp=tp, sp=tp > 1)
    dense = shares.dense
    assert float(dense.gemm) == pytest.approx(recomputed_gemm_share(model))
    assert 0.3 < float(dense.gemm) < 0.5  # every second of 7 matmuls, by FLOPs
    assert float(dense.elementwise) == 1.0 and float(dense.core_attention) == 0.0
    assert float(dense.tp_comm) == 0.5  # the SP all-gathers; the reduce-scatters are saved


def test_it_stands_alone_and_is_refused_for_moe_and_launch() -> None:
    with pytest.raises(SpecError, match="stands alone"):
        TrainingSpec(seq_len=4096, global_batch=8, recompute_modules=(*SAC, "core_attn"))
    titan = TrainingSpec(seq_len=4096, global_batch=8, recompute_modules=SAC)
    with pytest.raises(SpecError, match="dense GQA blocks"):
        recompute_shares(get_preset("mixtral-8x7b"), titan, RECOMPUTE_CODES["selective"])
    lay = Layout(num_gpus=8, tp=1, pp=1, cp=1, ep=1, etp=1, vpp=1, mbs=1, sp=False,
                 recompute="selective")
    with pytest.raises(SpecError, match="no flag"):
        launch_plan(get_preset("llama3-8b"), titan, lay)


def test_torchtitan_op_sac_rows_read_with_it_and_now_fit() -> None:
    runs = {r.id: r for r in load_independent_runs()}
    # Table 1's compiled 8-GPU run (micro-batch 2, 8,192 tokens): it ran, so it fits
    assert training_spec(runs["i0021"]).recompute_modules == SAC
    assert training_spec(runs["i0046"]).recompute_modules == SAC  # "selective (op)"
    assert training_spec(runs["i0045"]).recompute_modules == ("core_attn",)  # per layer
    assert training_spec(runs["i0030"]).recompute_modules == ("core_attn",)  # full AC row
    row = {r.id: r for r in validate_runs([runs["i0021"]]).rows}["i0021"]
    assert row.fits and row.memory_gib < 94


def test_torchtitan_per_layer_checkpointing_recomputes_every_second_block() -> None:
    runs = {r.id: r for r in load_independent_runs()}
    layer, op = runs["i0045"], runs["i0046"]  # the same job, "selective (layer)" and "(op)"
    assert layer.layout.recompute == "full"
    assert training_spec(layer).recompute_num_layers == layer.model_spec.num_layers // 2
    assert training_spec(op).recompute_num_layers is None
    rows = {r.id: r for r in validate_runs([layer, op], deduplicate=False).rows}
    # measured 2,904 (layer) against 2,973 tokens/s (op): the order is priced too
    assert (rows["i0045"].predicted_tokens_per_s_per_gpu
            < rows["i0046"].predicted_tokens_per_s_per_gpu)
    assert (layer.measured_tokens_per_s_per_gpu or 0) < (op.measured_tokens_per_s_per_gpu or 0)
