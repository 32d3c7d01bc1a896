"""Activation-memory options: block recompute, recompute modules, host offload, R8 stages."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from parsearch.cost.memory import (
    estimate_memory,
    in_flight_microbatches,
    layer_activation_bytes,
    memory_arrays,
)
from parsearch.cost.memory.activations import in_flight_chunk_microbatches
from parsearch.cost.stages import stage_contents
from parsearch.errors import SpecError
from parsearch.layout import Layout
from parsearch.model.presets import get_preset
from parsearch.model.specs import (
    RECOMPUTE_CODES,
    RECOMPUTE_MODULES,
    ModelSpec,
    MoeSpec,
    TrainingSpec,
)
from tests.cli_helpers import assert_one_line_error, run_cli

TOY = ModelSpec("toy", 8, 256, 1024, 4, 4, 64, 1000)  # dense, 8 layers
BASE = TrainingSpec(seq_len=512, global_batch=64)


def _acts(training: TrainingSpec, layout: Layout, model: ModelSpec = TOY):
    est = estimate_memory(model, training, layout)
    return [b.activations for b in est.per_stage], [b.offloaded_bytes for b in est.per_stage]


def _layer(training: TrainingSpec, recompute: str, model: ModelSpec = TOY, **kw) -> float:
    return layer_activation_bytes(model, training, recompute=recompute, **kw)


# --- TrainingSpec validation -------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"recompute_num_layers": 0}, "recompute_num_layers"),
        ({"recompute_num_layers": True}, "recompute_num_layers"),
        ({"recompute_modules": ("core_attn", "nope")}, "'nope'"),
        ({"recompute_modules": "core_attn"}, "recompute_modules"),
        ({"recompute_modules": ("mlp", "mlp")}, "repeats"),
        ({"activation_offload_layers": -1}, "activation_offload_layers"),
        ({"activation_offload_layers": 1.5}, "activation_offload_layers"),
    ],
)
def test_training_options_validate(kwargs: dict, fragment: str) -> None:
    with pytest.raises(SpecError, match=fragment):
        TrainingSpec(seq_len=512, global_batch=8, **kwargs)


def test_recompute_modules_become_a_tuple() -> None:
    spec = TrainingSpec(seq_len=512, global_batch=8, recompute_modules=["mlp", "core_attn"])
    assert spec.recompute_modules == ("mlp", "core_attn")
    hash(spec)


# --- selective modules: hand counts -------------------------------------------------


def test_selective_modules_drop_what_megatron_discards() -> None:
    """Dense toy layer, tp=2 with SP, bf16: each module removes its own tensors."""
    h, f, a, s, t = 256, 1024, 4, 512, 2
    tokens = s / 1  # mbs=1, cp=1
    kw = {"tp": t, "sp": True}
    none = _layer(BASE, "none", **kw)

    def drop(*modules: str) -> float:
        return none - _layer(replace(BASE, recompute_modules=modules), "selective", **kw)

    assert math.isclose(drop("core_attn"), tokens * 4 * a / t)  # fp32 LSE per head
    # layernorm: norm-1 output (QKV input) and norm-2 output (FC1 input), h/t each, 2 bytes
    assert math.isclose(drop("layernorm"), tokens * 2 * (h / t) * 2)
    # mlp: FC1 output 2f/t (SwiGLU) and FC2 input f/t; the FC1 input stays as its input
    assert math.isclose(drop("mlp"), tokens * 2 * (2 * f / t + f / t))
    assert drop("moe", "moe_act", "shared_experts", "mla_up_proj") == 0.0  # dense, no MLA
    assert math.isclose(drop("core_attn", "mlp"), drop("core_attn") + drop("mlp"))
    # "full" keeps only the layer input
    assert _layer(BASE, "full", **kw) == tokens * h / t * 2
    assert _layer(BASE, "selective", **kw) == none - drop("core_attn")  # default core_attn


def test_moe_modules_hand_counts() -> None:
    model = ModelSpec("moe", 4, 256, 1024, 4, 4, 64, 1000,
                      moe=MoeSpec(num_experts=8, top_k=2, expert_ffn_hidden_size=128,
                                  shared_expert_ffn_hidden_size=256))
    h, k, fe, fsh, s = 256, 2, 128, 256, 512
    kw = {"is_moe": True, "model": model}
    none = _layer(BASE, "none", **kw)

    def sel(*modules: str) -> float:
        return _layer(replace(BASE, recompute_modules=modules), "selective", **kw)

    assert math.isclose(none - sel("moe_act"), s * k * fe * 2)  # FC2 input of the experts
    # shared experts: FC1 input h, FC2 input f_sh, FC1 output 2 f_sh
    assert math.isclose(none - sel("shared_experts"), s * (h + fsh + 2 * fsh) * 2)
    # moe: only the MoE input stays (the router's h); so the layer's attention part + h
    attn_only = sel("moe", "layernorm")  # layernorm drops that input too
    assert math.isclose(sel("moe") - attn_only, s * h * 2 + s * h * 2)  # + QKV-in of norm-1
    assert sel("moe") < sel("moe_act") < none


def test_mla_up_proj_drops_q_k_v() -> None:
    model = get_preset("deepseek-v3")
    t = replace(BASE, recompute_modules=("mla_up_proj",))
    none = _layer(BASE, "none", model=model, tp=8, sp=True, is_moe=True)
    sel = _layer(t, "selective", model=model, tp=8, sp=True, is_moe=True)
    mla = model.mla
    a = model.num_attention_heads
    qk = a * (mla.qk_nope_head_dim + mla.qk_rope_head_dim) / 8
    assert math.isclose(none - sel, 512 * 2 * (qk + qk + a * mla.v_head_dim / 8))


@given(modules=st.sets(st.sampled_from(RECOMPUTE_MODULES)),
       more=st.sampled_from(RECOMPUTE_MODULES), tp=st.sampled_from([1, 2, 4]),
       sp=st.booleans(), name=st.sampled_from(["deepseek-v3", "mixtral-8x7b", "llama3-8b"]))
@settings(max_examples=60, deadline=None)
def test_more_modules_never_keep_more(modules: set, more: str, tp: int, sp: bool,
                                      name: str) -> None:
    model = get_preset(name)
    sp = sp and tp > 1
    for is_moe in {False, model.is_moe}:
        a = _layer(replace(BASE, recompute_modules=tuple(modules)), "selective", model=model,
                   tp=tp, sp=sp, is_moe=is_moe)
        b = _layer(replace(BASE, recompute_modules=tuple(modules | {more})), "selective",
                   model=model, tp=tp, sp=sp, is_moe=is_moe)
        assert b <= a + 1e-6
        assert _layer(BASE, "full", model=model, tp=tp, sp=sp, is_moe=is_moe) <= b
        assert a <= _layer(BASE, "none", model=model, tp=tp, sp=sp, is_moe=is_moe) + 1e-6


# --- block recompute and offload: hand counts on one stage ------------------------------


def test_recompute_num_layers_per_chunk_hand_count() -> None:
    """pp=1, 8 layers, m=64 (one micro-batch in flight): N of 8 layers keep only input."""
    layout = Layout(1, recompute="full")
    full, none = _layer(BASE, "full"), _layer(BASE, "none")
    (all_full,), _ = _acts(BASE, layout)
    for n in (1, 3, 8, 20):
        (acts,), _ = _acts(replace(BASE, recompute_num_layers=n), layout)
        rec = min(n, 8)
        assert math.isclose(acts - all_full, (8 - rec) * (none - full))
    # recompute_num_layers does nothing without recompute=full
    sel = Layout(1, recompute="selective")
    assert _acts(replace(BASE, recompute_num_layers=2), sel) == _acts(BASE, sel)


def test_recompute_num_layers_counts_per_model_chunk() -> None:
    """pp=2, vpp=2: 4 chunks of 2 layers; N=1 recomputes 1 layer per chunk."""
    training = replace(BASE, recompute_num_layers=1)
    layout = Layout(2, pp=2, vpp=2, recompute="full")
    full, none = _layer(BASE, "full"), _layer(BASE, "none")
    acts, _ = _acts(training, layout)
    m = 64 // 2
    for rank in (0, 1):
        chunks = in_flight_chunk_microbatches(rank, 2, 2, m)
        expected = sum(float(c) * (full + none) for c in chunks)
        assert math.isclose(acts[rank] - (rank == 1) * _output_terms(), expected)


def _output_terms() -> float:
    tokens = 512
    return tokens * 2 * 256 * 2 + tokens * 1000 * 4  # final-norm/output inputs, fp32 logits


def test_offload_moves_layers_to_host_and_keeps_one_in_flight() -> None:
    layout = Layout(1)  # pp=1, one micro-batch in flight
    none = _layer(BASE, "none")
    (base,), (zero,) = _acts(BASE, layout)
    assert zero == 0
    for k in (1, 5, 8, 12):
        (acts,), (off,) = _acts(replace(BASE, activation_offload_layers=k), layout)
        moved = min(k, 8)
        assert math.isclose(off, moved * none)
        assert math.isclose(acts, base - moved * none + none)  # one layer in flight


def test_offload_of_recomputed_layers_moves_their_inputs() -> None:
    training = replace(BASE, activation_offload_layers=2, recompute_num_layers=1)
    (_,), (off,) = _acts(training, Layout(1, recompute="full"))
    assert math.isclose(off, _layer(BASE, "full") + _layer(BASE, "none"))


@given(n=st.one_of(st.none(), st.integers(1, 10)), k=st.integers(0, 10),
       pp=st.sampled_from([1, 2, 4]), vpp=st.sampled_from([1, 2]),
       code=st.sampled_from(["none", "selective", "full"]))
@settings(max_examples=60, deadline=None)
def test_options_only_lower_hbm_and_arrays_match_scalar(n, k, pp, vpp, code) -> None:
    if pp == 1:
        vpp = 1
    training = replace(BASE, recompute_num_layers=n, activation_offload_layers=k)
    layout = Layout(8, pp=pp, vpp=vpp, recompute=code)
    acts, offs = _acts(training, layout)
    base, _ = _acts(BASE, layout)
    for a, b, o in zip(acts, base, offs, strict=True):
        assert o >= 0
        if n is None and k == 0:
            assert a == b and o == 0
        if code != "full" and k == 0:
            assert a == b
    # more layers recomputed -> never more activation memory
    if n is not None:
        more, _ = _acts(replace(training, recompute_num_layers=n + 1), layout)
        assert all(x <= y + 1e-6 for x, y in zip(more, acts, strict=True))
    est = estimate_memory(TOY, training, layout)
    arr = memory_arrays(TOY, training, layout.tp, layout.cp, layout.pp, layout.ep, layout.etp,
                        layout.vpp, layout.mbs, layout.dp, layout.edp,
                        RECOMPUTE_CODES[layout.recompute], layout.sp)
    assert math.isclose(float(arr.total), est.peak.total)
    assert math.isclose(float(arr.offloaded_bytes), est.peak.offloaded_bytes)


def test_bf16_main_grads_halve_the_gradient_buffer() -> None:
    layout = Layout(8, tp=2)
    fp32 = estimate_memory(TOY, BASE, layout).peak.gradients
    bf16 = estimate_memory(TOY, replace(BASE, grad_bytes=2.0), layout).peak.gradients
    assert math.isclose(bf16 * 2, fp32)


# --- interleaving per chunk, and R8's empty chunks ------------------------------------


@given(p=st.integers(2, 8), v=st.integers(2, 6), r=st.integers(0, 7), k=st.integers(1, 8))
@settings(max_examples=100, deadline=None)
def test_chunk_in_flight_sums_to_the_equal_chunk_formula(p: int, v: int, r: int, k: int) -> None:
    r = r % p
    m = k * p
    chunks = [float(c) for c in in_flight_chunk_microbatches(r, p, v, m)]
    window = min(m * v, 2 * (p - r - 1) + (v - 1) * p + 1)
    assert sum(chunks) == window
    assert math.isclose(float(in_flight_microbatches(r, p, v, m)), window / v)
    assert chunks[0] >= max(chunks[1:])  # the first chunk is never held less


def test_405b_pp16_vpp8_memory_handles_empty_chunks() -> None:
    model = get_preset("llama3.1-405b")
    training = TrainingSpec(seq_len=8192, global_batch=128)
    layout = Layout(1024, tp=8, pp=16, vpp=8, sp=True, recompute="full")
    est = estimate_memory(model, training, layout)
    assert len(est.per_stage) == 16
    assert all(b.activations > 0 for b in est.per_stage)
    # rank 0's chunk 0 holds no layer: it has less activation memory than rank 1
    assert est.per_stage[0].activations < est.per_stage[1].activations
    contents = stage_contents(model, 16, 8)
    arr = memory_arrays(model, training, 8, 1, 16, 1, 1, 8, 1, 8, 8,
                        RECOMPUTE_CODES["full"], True)
    assert math.isclose(float(arr.total), est.peak.total)
    assert contents[0].chunk_layer_counts[0] == 0


def test_memory_arrays_vectorised_over_codes_with_options() -> None:
    model = get_preset("mixtral-8x7b")
    training = TrainingSpec(seq_len=4096, global_batch=256, recompute_num_layers=2,
                            recompute_modules=("core_attn", "moe_act"),
                            activation_offload_layers=1)
    codes = np.array([0, 1, 2, 2])
    pps = np.array([4, 4, 4, 8])
    vpps = np.array([2, 1, 2, 1])
    arr = memory_arrays(model, training, 2, 1, pps, 8, 1, vpps, 1, 8 // pps * 4, 64 // (8 * pps),
                        codes, True)
    for i in range(4):
        layout = Layout(64, tp=2, pp=int(pps[i]), vpp=int(vpps[i]), ep=8, sp=True,
                        recompute=("none", "selective", "full")[codes[i]])
        est = estimate_memory(model, training, layout)
        assert math.isclose(float(arr.total[i]), est.peak.total)
        assert math.isclose(float(arr.offloaded_bytes[i]), est.peak.offloaded_bytes)
        assert est.peak.offloaded_bytes > 0


# --- CLI ---------------------------------------------------------------------------------

_405B = ("--model", "llama3.1-405b", "--gpus", "1024", "--global-batch", "128",
         "--seq-len", "8192", "--layout", "tp=8,pp=16,vpp=8,sp=true,recompute=full")


def test_cli_check_accepts_405b_pp16_vpp8() -> None:
    result = run_cli("check", *_405B)
    assert result.code == 0, result
    assert "valid" in result.out
    bad = run_cli("check", *_405B[:-1], "tp=8,pp=16,vpp=9,sp=true")
    assert bad.code == 1
    assert "R8" in bad.out and "num_layers+2=126+2=128" in bad.out


def test_cli_explain_405b_pp16_vpp8_with_memory_options() -> None:
    import json

    plain = run_cli("explain", "--cluster", "dgx-h100", *_405B, "--format", "json")
    assert plain.code == 0, plain.err
    opts = run_cli("explain", "--cluster", "dgx-h100", *_405B, "--format", "json",
                   "--recompute-num-layers", "1", "--activation-offload-layers", "0",
                   "--recompute-modules", "core_attn,layernorm")
    assert opts.code == 0, opts.err
    a = json.loads(plain.out)["memory_gib_per_gpu"]["activations"]
    b = json.loads(opts.out)["memory_gib_per_gpu"]["activations"]
    assert a > 0 and b >= a  # every chunk holds <= 1 layer here: N=1 changes nothing


@pytest.mark.parametrize(
    ("flag", "value", "fragment"),
    [
        ("--recompute-num-layers", "0", "--recompute-num-layers"),
        ("--recompute-modules", "core_attn,attn", "--recompute-modules"),
        ("--activation-offload-layers", "-2", "--activation-offload-layers"),
        ("--activation-offload-layers", "x", "--activation-offload-layers"),
    ],
)
def test_cli_rejects_bad_memory_options(flag: str, value: str, fragment: str) -> None:
    result = run_cli("check", *_405B, f"{flag}={value}")
    assert_one_line_error(result, fragment)
