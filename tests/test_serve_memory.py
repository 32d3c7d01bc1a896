"""Serving memory as the engines allocate it: weights, KV pool by the engine's memory
fraction, activation workspace, context and CUDA graphs."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from parsearch.model.presets import get_preset
from parsearch.serve.api import _context
from parsearch.serve.evaluate import evaluate_aggregated
from parsearch.serve.memory import (
    CONTEXT_BYTES,
    CUDA_GRAPH_BYTES,
    GIB,
    gpu_memory,
    kv_pool_bytes,
    memory_fraction,
    sglang_default_fraction,
)
from parsearch.serve.spec import SERVING_ENGINES, ServingLayout, ServingWorkload
from parsearch.topology.cluster import load_cluster
from parsearch.topology.hardware import load_gpu_profile

#: Llama-2-70B: Llama 3 70B's shapes with a 32,000-token vocabulary (meta-llama/Llama-2-70b-hf
#: config.json).
LLAMA2_70B = replace(get_preset("llama3-70b"), name="llama2-70b", vocab_size=32_000)


@pytest.mark.parametrize(("isl", "osl", "batch"), [(128, 2048, 192), (2048, 2048, 96)])
def test_llama2_70b_fp8_runs_on_one_h200_as_tensorrt_llm_ran_it(isl, osl, batch) -> None:
    # TensorRT-LLM's H200 FP8 tables ran Llama-2-70B on one GPU at these batches; the
    # engine gives the KV cache 90% of the memory free after weights and activations.
    w = ServingWorkload(isl=isl, osl=osl, precision="fp8", kv_precision="fp8",
                        max_batch=batch, engine="trtllm")
    ctx = _context(LLAMA2_70B, load_cluster("dgx-h200"), w, None, None)
    est = evaluate_aggregated(ctx, ServingLayout(1, 1, 1, 1, batch, 1), 1)
    assert est.fits and est.max_batch_fit >= batch
    assert est.memory_gib_per_gpu <= 141


def test_engine_pools_hand_count() -> None:
    hbm, weights, work = 100 * GIB, 40 * GIB, 2 * GIB
    assert kv_pool_bytes("vllm", 0.9, hbm, weights, work) == pytest.approx(
        90 * GIB - 42 * GIB - CONTEXT_BYTES)
    assert kv_pool_bytes("trtllm", 0.9, hbm, weights, work) == pytest.approx(
        0.9 * (58 * GIB - CONTEXT_BYTES))
    assert kv_pool_bytes("sglang", 0.88, hbm, weights, work) == pytest.approx(48 * GIB)
    # A fraction of 1 cannot take the room the workspace, context and graphs need.
    assert kv_pool_bytes("sglang", 1.0, hbm, weights, work) == pytest.approx(
        58 * GIB - CONTEXT_BYTES - CUDA_GRAPH_BYTES)


def test_engine_default_fractions() -> None:
    one = ServingLayout(1, 1, 1, 1, 1)
    eight = ServingLayout(8, 1, 1, 1, 1)
    assert memory_fraction(ServingWorkload(isl=1, osl=1), one) == 0.9
    assert memory_fraction(ServingWorkload(isl=1, osl=1, engine="trtllm"), one) == 0.9
    sg = ServingWorkload(isl=1, osl=1, engine="sglang")
    assert (memory_fraction(sg, one), memory_fraction(sg, eight)) == (0.88, 0.81)
    assert [sglang_default_fraction(n) for n in (1, 2, 4, 8, 16, 72)] == [
        0.88, 0.87, 0.85, 0.81, 0.79, 0.79]
    assert memory_fraction(replace(sg, memory_fraction=0.5), eight) == 0.5


def test_memory_parts_add_up() -> None:
    w = ServingWorkload(isl=1000, osl=1000, precision="fp8", kv_precision="fp8")
    lay = ServingLayout(4, 1, 1, 1, 64)
    mem = gpu_memory(get_preset("llama3-70b"), lay, w, load_gpu_profile("h100-sxm"))
    assert mem.kv_capacity > 0 and mem.fraction == 0.9
    total = mem.weights + mem.workspace + mem.reserve + mem.graphs + mem.kv_capacity
    assert total <= mem.usable + 1.0


@settings(max_examples=30, deadline=None)
@given(engine=st.sampled_from(SERVING_ENGINES), low=st.floats(0.3, 0.95),
       step=st.floats(0.0, 0.5), name=st.sampled_from(("llama3-8b", "llama3-70b",
                                                        "qwen3-30b-a3b")),
       isl=st.integers(100, 8000), osl=st.integers(10, 2000))
def test_a_larger_memory_fraction_never_admits_fewer_layouts(engine, low, step, name, isl,
                                                             osl) -> None:
    high = min(1.0, low + step)
    model = get_preset(name)
    counts = {}
    for fraction in (low, high):
        w = ServingWorkload(isl=isl, osl=osl, precision="fp8", kv_precision="fp8",
                            engine=engine, memory_fraction=fraction, max_batch=256)
        ctx = _context(model, load_cluster("dgx-h100"), w, None, None)
        layouts = [ServingLayout(tp, 1, 1, 1, b) for tp in (1, 2, 4, 8) for b in (1, 16, 256)
                   if model.num_attention_heads % tp == 0]
        fits = [evaluate_aggregated(ctx, lay, 8) for lay in layouts]
        counts[fraction] = (sum(e.fits for e in fits), [e.max_batch_fit for e in fits])
    assert counts[high][0] >= counts[low][0]
    assert all(h >= lo for h, lo in zip(counts[high][1], counts[low][1], strict=True))
