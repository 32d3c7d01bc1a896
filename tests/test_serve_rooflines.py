"""Decode GEMMs on their own rooflines: the dense projections and the routed experts'
grouped GEMMs are separate kernels, so the compute of one does not hide the weight reads of
the other (:func:`parsearch.serve.cost.gemm_rooflines_s`)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from parsearch.model.presets import get_preset
from parsearch.serve.api import _context
from parsearch.serve.cost import (
    decode_bytes,
    decode_step,
    decode_weight_bytes,
    gemm_rooflines_s,
)
from parsearch.serve.spec import ServingLayout, ServingWorkload
from parsearch.topology.cluster import load_cluster

_BYTES = st.floats(0.0, 1e11)
_TIMES = st.floats(0.0, 1.0)


@settings(max_examples=200, deadline=None)
@given(dense_b=_BYTES, dense_s=_TIMES, routed_b=_BYTES, routed_s=_TIMES,
       hbm=st.floats(1e11, 1e13))
def test_split_rooflines_lie_between_the_joint_roofline_and_the_sum(
        dense_b: float, dense_s: float, routed_b: float, routed_s: float, hbm: float) -> None:
    split = gemm_rooflines_s(dense_b, dense_s, routed_b, routed_s, hbm)
    joint = max((dense_b + routed_b) / hbm, dense_s + routed_s)
    assert split >= joint * (1 - 1e-12)
    assert split <= (dense_b + routed_b) / hbm + dense_s + routed_s + 1e-15


@settings(max_examples=100, deadline=None)
@given(dense_b=_BYTES, dense_s=_TIMES, hbm=st.floats(1e11, 1e13))
def test_a_model_without_experts_keeps_its_one_roofline(
        dense_b: float, dense_s: float, hbm: float) -> None:
    assert gemm_rooflines_s(dense_b, dense_s, 0.0, 0.0, hbm) == max(dense_b / hbm, dense_s)


def _args(model_name: str, cluster: str, precision: str, layout: ServingLayout,
          **knobs: object):
    model = get_preset(model_name)
    w = ServingWorkload(isl=1000, osl=1000, precision=precision, kv_precision="fp8",
                        engine="vllm", **knobs)  # type: ignore[arg-type]
    ctx = _context(model, load_cluster(cluster), w, None, None)
    return (model, w, layout, ctx.counts, ctx.rates, ctx.links(layout), ctx.window)


@settings(max_examples=25, deadline=None)
@given(tp=st.sampled_from([1, 2, 4, 8]), batch=st.sampled_from([1, 4, 16, 64, 256]),
       name=st.sampled_from(["gpt-oss-120b", "llama3-70b"]))
def test_decode_kernels_are_no_faster_than_either_roofline(tp: int, batch: int,
                                                          name: str) -> None:
    precision = "fp4" if name == "gpt-oss-120b" else "fp8"
    layout = ServingLayout(tp=tp, pp=1, ep=1, attention_dp=1, batch=batch)
    step = decode_step(*_args(name, "dgx-b200", precision, layout))
    assert step.kernels_s is not None
    assert step.kernels_s >= max(step.memory_s, step.compute_s) * (1 - 1e-12)
    assert step.kernels_s <= step.memory_s + step.compute_s + 1e-12


def test_dense_gemm_fixed_time_no_longer_hides_the_expert_reads() -> None:
    # gpt-oss-120b on one B200 at batch 4: the BF16-rate fixed times of the dense GEMMs and
    # the MXFP4 experts' HBM reads are each about a millisecond; one joint roofline took the
    # larger of the totals, the split one adds the two kernel groups
    layout = ServingLayout(tp=1, pp=1, ep=1, attention_dp=1, batch=4)
    args = _args("gpt-oss-120b", "dgx-b200", "fp4", layout)
    step = decode_step(*args)
    dense_b, routed_b = decode_weight_bytes(*args[:4])
    assert routed_b > dense_b > 0
    assert step.kernels_s is not None
    assert step.kernels_s > 1.05 * max(step.memory_s, step.compute_s)


def test_a_dense_model_reads_only_dense_weights() -> None:
    layout = ServingLayout(tp=4, pp=1, ep=1, attention_dp=1, batch=16)
    args = _args("llama3-70b", "dgx-h100", "fp8", layout)
    dense_b, routed_b = decode_weight_bytes(*args[:4])
    assert routed_b == 0.0
    assert decode_bytes(*args[:4], args[6])[0] == dense_b
