"""ZeRO-2 data parallelism (Megatron-FSDP ``optim_grads``): weights whole, gradients and
optimizer state sharded; gradients reduce-scattered every micro-batch, weights gathered
once per step.  Its bytes and its exposed traffic sit between ZeRO-1 and ZeRO-3 as the
ZeRO paper's §5 arithmetic says, and it is how the Llama 3 paper's FSDP (§3.3.2: weights
not resharded after forward) is read."""

from __future__ import annotations

import warnings
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from parsearch.cost.analytic import CostOptions, build_cost_model, estimate
from parsearch.cost.memory import model_state_bytes
from parsearch.errors import SpecError
from parsearch.layout import Layout
from parsearch.model.specs import ModelSpec, TrainingSpec
from parsearch.topology.cluster import load_cluster
from parsearch.topology.fabric import build_fabric
from parsearch.validation.published.runs import validate_runs

DENSE = ModelSpec("dense-toy", 8, 1024, 4096, 16, 4, 64, 32000)


@settings(max_examples=60, deadline=None)
@given(params=st.floats(1e6, 1e10), shards=st.integers(1, 512),
       weight=st.sampled_from([2.0, 4.0]), grad=st.sampled_from([2.0, 4.0]))
def test_zero2_bytes_sit_between_zero1_and_zero3(params: float, shards: int, weight: float,
                                                 grad: float) -> None:
    kw = {"weight_bytes": weight, "grad_bytes": grad, "shard_degree": shards}
    zero1 = model_state_bytes(params, distributed_optimizer=True, **kw)
    zero2 = model_state_bytes(params, fully_sharded=True, weights_sharded=False, **kw)
    zero3 = model_state_bytes(params, fully_sharded=True, **kw)
    assert zero2.weights == zero1.weights >= zero3.weights
    assert zero2.gradients == pytest.approx(zero3.gradients)
    assert zero2.gradients <= zero1.gradients
    assert zero2.optimizer == zero1.optimizer == zero3.optimizer
    total = [s.weights + s.gradients + s.optimizer for s in (zero1, zero2, zero3)]
    assert total[2] <= total[1] * (1 + 1e-12) and total[1] <= total[0] * (1 + 1e-12)


def test_unknown_strategy_is_refused_with_the_choices() -> None:
    with pytest.raises(SpecError, match=r"fsdp_strategy.*optim_grads"):
        TrainingSpec(seq_len=4096, global_batch=64, fsdp=True, fsdp_strategy="zero2")


@settings(max_examples=25, deadline=None)
@given(tp=st.sampled_from([1, 2]), pp=st.sampled_from([1, 2]), mbs=st.sampled_from([1, 2]),
       overlap=st.booleans())
def test_zero2_exposes_no_more_traffic_than_zero3(tp: int, pp: int, mbs: int,
                                                  overlap: bool) -> None:
    """ZeRO-3 moves the same per-micro-batch gradient reduce-scatter plus two weight
    gathers per micro-batch; ZeRO-2 one gather per step: never more exposed traffic."""
    fabric = build_fabric(load_cluster("dgx-h100"), 32)
    layout = Layout(num_gpus=32, tp=tp, pp=pp, mbs=mbs, sp=tp > 1)
    options = CostOptions(overlap_grad_reduce=overlap, overlap_param_gather=overlap)
    times = {}
    for strategy in ("optim_grads", "optim_grads_params"):
        training = TrainingSpec(seq_len=4096, global_batch=256, micro_batch_sizes=(mbs,),
                                fsdp=True, fsdp_strategy=strategy)
        est = estimate(build_cost_model(DENSE, training, fabric, options=options), layout)
        times[strategy] = est.time_s["dp_comm"]
    assert times["optim_grads"] <= times["optim_grads_params"] + 1e-12


def _llama3_rows() -> dict[str, object]:
    from parsearch.validation.published.published_runs import load_independent_runs
    return {r.id: r for r in load_independent_runs() if r.source_tag == "LLAMA3"}


def test_llama3_pretraining_runs_are_read_as_zero2_and_match() -> None:
    """Llama 3 405B, TP8 PP16, 8,192 and 16,384 H100 (Llama 3 paper Table 4): 430 and 400
    TFLOP/s per GPU.  Read as ZeRO-1 the 16K run does not fit and ZeRO-3 made it 30% slow;
    read as the paper describes it, both are priced within 5% and the fall from 8K to 16K
    within a factor 1.5 of the measured 7%."""
    rows = _llama3_rows()
    runs = [rows["i0001"], rows["i0002"]]
    assert all(r.notes and "optim_grads" in r.notes for r in runs)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        scored = {row.id: row for row in validate_runs(runs).rows}
    for row in scored.values():
        assert row.ape < 0.05, (row.id, row.predicted_tokens_per_s_per_gpu)
    measured = 1 - (scored["i0002"].measured_tokens_per_s_per_gpu
                    / scored["i0001"].measured_tokens_per_s_per_gpu)
    predicted = 1 - (scored["i0002"].predicted_tokens_per_s_per_gpu
                     / scored["i0001"].predicted_tokens_per_s_per_gpu)
    assert 1 / 1.5 <= predicted / measured <= 1.5


def test_zero2_training_keeps_its_strategy_through_replace() -> None:
    training = TrainingSpec(seq_len=4096, global_batch=64, fsdp=True, fsdp_strategy="optim_grads")
    assert replace(training, global_batch=128).fsdp_strategy == "optim_grads"
