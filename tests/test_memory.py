"""Memory model: golden numbers, KOR22 Table 2, properties, vectorised == scalar."""

from __future__ import annotations

import math
import random
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from parsearch.cost.memory import (
    GIB,
    MemoryOptions,
    estimate_memory,
    in_flight_microbatches,
    layer_activation_bytes,
    memory_arrays,
    model_state_bytes,
)
from parsearch.errors import SpecError
from parsearch.layout import Layout
from parsearch.model.presets import get_preset
from parsearch.model.specs import RECOMPUTE_CODES, MlaSpec, ModelSpec, MoeSpec, TrainingSpec

KOR = MemoryOptions(activation_model="korthikanti")


# --- model state ---------------------------------------------------------------


def test_golden_70b_tp4_pp4_dp4() -> None:
    """70e9 params, TP=4 PP=4 DP=4, 2-byte weights and grads, 4-byte Adam state, no
    distributed optimizer: 8.75 / 8.75 / 17.5 GB per GPU (GB = 1e9)."""
    tp, pp, dp = 4, 4, 4
    state = model_state_bytes(
        70e9 / (tp * pp),
        weight_bytes=2,
        grad_bytes=2,
        optimizer_bytes=4,
        distributed_optimizer=False,
        shard_degree=dp,
    )
    assert state.weights / 1e9 == 8.75
    assert state.gradients / 1e9 == 8.75
    assert state.optimizer / 1e9 == 17.5
    assert state.total / 1e9 == 35.0


@given(st.integers(1, 4096))
def test_megatron_bytes_per_parameter_table(d: int) -> None:
    """formulas.md §5.1 (MCORE dist_optimizer.md), bf16 / fp32 row: 18 and 6 + 12/D."""
    plain = model_state_bytes(1.0, distributed_optimizer=False, shard_degree=d)
    dist = model_state_bytes(1.0, distributed_optimizer=True, shard_degree=d)
    assert plain.total == 18
    assert math.isclose(dist.total, 6 + 12 / d, rel_tol=1e-15)
    fp16 = model_state_bytes(1.0, weight_bytes=2, grad_bytes=2, optimizer_bytes=16,
                             shard_degree=d)
    assert math.isclose(fp16.total, 4 + 16 / d, rel_tol=1e-15)


def test_model_state_shards_dense_over_dp_cp_and_experts_over_edp() -> None:
    model = get_preset("mixtral-8x7b")
    training = TrainingSpec(seq_len=4096, global_batch=64)
    base = Layout(num_gpus=16, tp=2, cp=1, pp=1, ep=8, etp=1)  # dp 8, edp 2
    with_cp = Layout(num_gpus=16, tp=2, cp=2, pp=1, ep=8, etp=1)  # dp 4, cp 2, edp 2
    a = estimate_memory(model, training, base).peak
    b = estimate_memory(model, training, with_cp).peak
    assert a.optimizer == b.optimizer  # DP·CP = 8 in both
    more_edp = estimate_memory(model, training, base.with_gpus(32)).peak  # edp 4
    assert more_edp.optimizer < a.optimizer
    assert more_edp.weights == a.weights


# --- activations: KOR22 Table 2 ---------------------------------------------------

S, B, H, A = 2048, 4, 6144, 64


def kor_model() -> ModelSpec:
    return get_preset("kor22-22b")  # h 6144, a 64, GeLU 4h, MHA


@pytest.mark.parametrize("t", [1, 2, 4, 8])
def test_kor22_table2_rows(t: int) -> None:
    model = kor_model()
    training = TrainingSpec(seq_len=S, global_batch=8)
    sbh = S * B * H

    def act(sp: bool, recompute: str) -> float:
        return layer_activation_bytes(model, training, tp=t, mbs=B, sp=sp and t > 1,
                                      recompute=recompute, options=KOR)

    sp = t > 1
    # TP + SP (no recompute): sbh·(34 + 5as/h)/t
    assert math.isclose(act(True, "none"), sbh * (34 + 5 * A * S / H) / t, rel_tol=1e-12)
    # TP only: sbh·(10 + 24/t + 5as/(h·t))
    assert math.isclose(act(False, "none"), sbh * (10 + 24 / t + 5 * A * S / (H * t)),
                        rel_tol=1e-12)
    # TP + SP + selective: 34·sbh/t
    assert math.isclose(act(True, "selective"), 34 * sbh / t, rel_tol=1e-12)
    # TP + selective: sbh·(10 + 24/t)
    assert math.isclose(act(False, "selective"), sbh * (10 + 24 / t), rel_tol=1e-12)
    # Full: 2·sbh (KOR22); with SP we keep the sharded input, 2·sbh/t (formulas.md §11.4).
    assert act(False, "full") == 2 * sbh
    assert act(True, "full") == 2 * sbh / (t if sp else 1)


def test_flash_form_reduces_to_32_sbh_for_gpt() -> None:
    """formulas.md §5.3 sanity check: MHA + GeLU 4h ⇒ β·16h = 32·sbh/t (+ fp32 LSE)."""
    model = kor_model()
    training = TrainingSpec(seq_len=S, global_batch=8)
    for t in (2, 4, 8):
        sel = layer_activation_bytes(model, training, tp=t, mbs=B, sp=True,
                                     recompute="selective")
        none = layer_activation_bytes(model, training, tp=t, mbs=B, sp=True)
        assert math.isclose(sel, 32 * S * B * H / t, rel_tol=1e-12)
        assert math.isclose(none - sel, 4 * B * A * S / t, rel_tol=1e-12)


def test_flash_form_llama_and_fp8() -> None:
    """The §5.3 modern formula for Llama3-8B, and FP8 saving GEMM inputs in one byte."""
    model = get_preset("llama3-8b")
    h, f, a, g, d = 4096, 14336, 32, 8, 128
    s, b, t, c = 8192, 1, 2, 2
    tokens = s * b / (t * c)
    bf16 = TrainingSpec(seq_len=s, global_batch=8)
    got = layer_activation_bytes(model, bf16, tp=t, cp=c, mbs=b, sp=True)
    expected = tokens * 2 * (4 * h + (a + 2 * g) * d + a * d + 3 * f) + 4 * b * a * s / (t * c)
    assert math.isclose(got, expected, rel_tol=1e-12)
    fp8 = replace(bf16, precision="fp8")
    got8 = layer_activation_bytes(model, fp8, tp=t, cp=c, mbs=b, sp=True)
    saved = tokens * (h + a * d + h + f)  # QKV-in, O, FC1-in, FC2-in at 1 byte instead of 2
    assert math.isclose(got - got8, saved, rel_tol=1e-12)


def test_moe_layer_activations() -> None:
    model = get_preset("mixtral-8x7b")
    training = TrainingSpec(seq_len=4096, global_batch=8)
    base = layer_activation_bytes(model, training, is_moe=True, tp=2, ep=8, etp=1, sp=True)
    etp2 = layer_activation_bytes(model, training, is_moe=True, tp=2, ep=4, etp=2, sp=True)
    # ETP all-gathers the dispatched FC1 input: + T·k·h·(etp−1)·2 bytes.
    assert math.isclose(etp2 - base, 4096 / 2 * 2 * 4096 * 2, rel_tol=1e-12)
    imbalanced = layer_activation_bytes(model, training, is_moe=True, tp=2, ep=8, sp=True,
                                        options=MemoryOptions(moe_imbalance=1.5))
    assert imbalanced > base
    with pytest.raises(SpecError):
        layer_activation_bytes(get_preset("llama3-8b"), training, is_moe=True)


def test_in_flight_microbatches() -> None:
    # 1F1B: min(m, p − r)
    assert [float(in_flight_microbatches(r, 4, 1, 8)) for r in range(4)] == [4, 3, 2, 1]
    assert float(in_flight_microbatches(0, 4, 1, 2)) == 2
    # Interleaved, first stage: p·(1 + (p−1)/(p·v)) micro-batches' worth (KOR22 §4.2.3)
    for p, v in ((4, 2), (8, 5), (2, 3)):
        assert math.isclose(float(in_flight_microbatches(0, p, v, 64)),
                            p * (1 + (p - 1) / (p * v)), rel_tol=1e-12)


# --- properties ----------------------------------------------------------------


@st.composite
def small_cases(draw: st.DrawFn) -> tuple[ModelSpec, TrainingSpec, Layout]:
    heads = draw(st.sampled_from([4, 8]))
    layers = draw(st.sampled_from([4, 6, 8, 12]))
    moe = draw(st.booleans())
    model = ModelSpec(
        name="t",
        num_layers=layers,
        hidden_size=heads * 16,
        ffn_hidden_size=draw(st.sampled_from([128, 256])),
        num_attention_heads=heads,
        num_query_groups=draw(st.sampled_from([1, 2, 4])),
        head_dim=16,
        vocab_size=draw(st.sampled_from([1000, 32000])),
        tied_embeddings=draw(st.booleans()),
        mlp_activation=draw(st.sampled_from(["swiglu", "gelu"])),
        moe=MoeSpec(8, draw(st.integers(1, 3)), 64, draw(st.sampled_from([0, 64])),
                    first_k_dense=draw(st.integers(0, 1))) if moe else None,
        mla=MlaSpec(32, 16, 8, 16, 24) if draw(st.booleans()) else None,
        mtp_layers=draw(st.integers(0, 1)),
    )
    training = TrainingSpec(
        seq_len=draw(st.sampled_from([256, 1024])),
        global_batch=draw(st.sampled_from([8, 32, 64])),
        precision=draw(st.sampled_from(["bf16", "fp8"])),
        pipeline_split=draw(st.sampled_from(["even", "uneven"])),
    )
    tp = draw(st.sampled_from([1, 2, 4]))
    cp = draw(st.sampled_from([1, 2]))
    pp = draw(st.sampled_from([p for p in (1, 2, 4) if layers % p == 0]))
    dp = draw(st.sampled_from([1, 2, 4]))
    ep = draw(st.sampled_from([1, 2, 4])) if moe else 1
    etp = draw(st.sampled_from([1, 2])) if moe else 1
    n = pp * math.lcm(tp * cp * dp, ep * etp)
    layout = Layout(num_gpus=n, tp=tp, cp=cp, pp=pp, ep=ep, etp=etp, vpp=1,
                    mbs=draw(st.sampled_from([1, 2])), sp=draw(st.booleans()) and tp > 1,
                    recompute=draw(st.sampled_from(["none", "selective", "full"])))
    return model, training, layout


def peak_total(model: ModelSpec, training: TrainingSpec, layout: Layout,
               options: MemoryOptions = MemoryOptions()) -> float:  # noqa: B008
    return estimate_memory(model, training, layout, options).peak.total


@given(small_cases(), st.sampled_from(["flash", "korthikanti"]))
@settings(max_examples=150, deadline=None)
def test_memory_never_grows_with_tp(case: tuple, act_model: str) -> None:
    """At fixed dp, cp, pp, ep, etp and micro-batch, doubling tp (on twice the GPUs, so
    edp doubles) never adds memory."""
    model, training, layout = case
    options = MemoryOptions(activation_model=act_model)
    tp2 = layout.tp * 2
    assume(model.num_attention_heads % tp2 == 0)
    bigger = replace(layout, tp=tp2, num_gpus=2 * layout.num_gpus)
    assert bigger.dp == layout.dp and bigger.edp == 2 * layout.edp
    assert peak_total(model, training, bigger, options) <= peak_total(
        model, training, layout, options) * (1 + 1e-12)


@given(small_cases(), st.sampled_from(["flash", "korthikanti"]))
@settings(max_examples=150, deadline=None)
def test_memory_never_grows_with_pp(case: tuple, act_model: str) -> None:
    """At fixed micro-batch, dp and edp, doubling pp (dividing L, no interleaving) never adds
    memory: stage 0 keeps min(m, p) micro-batches of L/p layers (KOR22 §4.2.3)."""
    model, training, layout = case
    options = MemoryOptions(activation_model=act_model)
    pp2 = layout.pp * 2
    assume(model.num_layers % pp2 == 0)
    # Only for a uniform layer stack: with a leading dense layer heavier than the MoE ones,
    # stage 0 at 2p keeps 2p micro-batches of that heavy layer alone, which can exceed p
    # micro-batches of (heavy + light) layers (a real effect, not a bug).
    assume(model.moe is None or (model.moe.first_k_dense == 0 and model.moe.layer_freq == 1))
    bigger = replace(layout, pp=pp2, num_gpus=layout.num_gpus * 2)
    assert bigger.dp == layout.dp and bigger.edp == layout.edp
    # KOR22 Table 2 footnote: the first stage also keeps the embedding's token inputs and
    # dropout mask for each of its p in-flight micro-batches, 8*s*b*p + s*b*h*p bytes
    # (/tp); that term alone grows with p, so it is allowed for the Korthikanti model.
    s, b, h = training.seq_len, layout.mbs, model.hidden_size
    slack = (8 * s * b + s * b * h) * (pp2 - layout.pp) if act_model == "korthikanti" else 0
    assert peak_total(model, training, bigger, options) <= peak_total(
        model, training, layout, options) * (1 + 1e-12) + slack


@given(small_cases(), st.sampled_from(["flash", "korthikanti"]))
@settings(max_examples=150, deadline=None)
def test_recompute_order_and_distributed_optimizer(case: tuple, act_model: str) -> None:
    model, training, layout = case
    options = MemoryOptions(activation_model=act_model)
    acts = {
        mode: estimate_memory(model, training, replace(layout, recompute=mode),
                              options).peak.activations
        for mode in ("none", "selective", "full")
    }
    assert acts["full"] <= acts["selective"] <= acts["none"]
    plain = replace(training, distributed_optimizer=False)
    for stage_dist, stage_plain in zip(
        estimate_memory(model, training, layout, options).per_stage,
        estimate_memory(model, plain, layout, options).per_stage,
        strict=True,
    ):
        assert stage_dist.optimizer <= stage_plain.optimizer
        assert stage_dist.total <= stage_plain.total


def test_peak_stage_is_the_largest() -> None:
    model = get_preset("deepseek-v3")
    training = TrainingSpec(seq_len=4096, global_batch=8192, precision="fp8")
    layout = Layout(num_gpus=1024, tp=2, pp=8, vpp=4, ep=64, mbs=1, sp=True)
    est = estimate_memory(model, training, layout)
    assert est.peak.total == max(s.total for s in est.per_stage)
    for s in est.per_stage:
        parts = s.weights + s.gradients + s.optimizer + s.activations + s.other
        assert math.isclose(s.total, parts, rel_tol=1e-15)
        assert s.other == 3 * GIB
    gib = est.peak.to_gib()
    assert set(gib) == {"weights", "gradients", "optimizer", "activations", "other", "total"}


def test_fp8_param_gather_drops_bf16_copy() -> None:
    model = get_preset("llama3-8b")
    layout = Layout(num_gpus=8, tp=1, pp=1)
    bf16 = TrainingSpec(seq_len=8192, global_batch=128)
    fp8 = replace(bf16, precision="fp8")
    w_bf16 = estimate_memory(model, bf16, layout).peak.weights
    w_fp8 = estimate_memory(model, fp8, layout).peak.weights
    w_fp8_primary = estimate_memory(
        model, fp8, layout, MemoryOptions(fp8_param_gather=True)).peak.weights
    assert w_fp8_primary < w_bf16 < w_fp8


def test_options_validate() -> None:
    with pytest.raises(SpecError, match="activation_model"):
        MemoryOptions(activation_model="exact")  # type: ignore[arg-type]
    with pytest.raises(SpecError, match="moe_imbalance"):
        MemoryOptions(moe_imbalance=0.5)


# --- vectorised == scalar --------------------------------------------------------


@pytest.mark.parametrize("name", ["deepseek-v3", "llama3-70b", "gpt3-175b"])
@pytest.mark.parametrize("split", ["uneven", "even"])
def test_memory_arrays_equal_scalar(name: str, split: str) -> None:
    model = get_preset(name)
    rng = random.Random(hash((name, split)) & 0xFFFF)
    training = TrainingSpec(seq_len=4096, global_batch=1024, precision="fp8",
                            pipeline_split=split)
    options = MemoryOptions(activation_model="korthikanti") if name == "gpt3-175b" \
        else MemoryOptions()
    layouts: list[Layout] = []
    while len(layouts) < 120:
        moe = model.is_moe
        layout = Layout(
            num_gpus=rng.choice([256, 512, 1024]),
            tp=rng.choice([1, 2, 4, 8]), cp=rng.choice([1, 2]),
            pp=rng.choice([1, 2, 4, 8, 16]), vpp=rng.choice([1, 2, 3]),
            ep=rng.choice([1, 8, 32]) if moe else 1, etp=rng.choice([1, 2]) if moe else 1,
            mbs=rng.choice([1, 2, 4]), sp=rng.choice([True, False]),
            recompute=rng.choice(["none", "selective", "full"]),
        )
        if layout.dp == 0 or layout.edp == 0:
            continue
        if layout.pp * layout.vpp > model.num_layers:
            continue
        if split == "even" and model.num_layers % (layout.pp * layout.vpp):
            continue
        layouts.append(layout)

    def col(attr: str) -> np.ndarray:
        return np.array([getattr(x, attr) for x in layouts])

    arr = memory_arrays(
        model, training, col("tp"), col("cp"), col("pp"), col("ep"), col("etp"), col("vpp"),
        col("mbs"), col("dp"), col("edp"),
        np.array([RECOMPUTE_CODES[x.recompute] for x in layouts]), col("sp"), options,
    )
    for i, layout in enumerate(layouts):
        est = estimate_memory(model, training, layout, options)
        assert arr.peak_stage[i] == est.peak_stage
        for part in ("weights", "gradients", "optimizer", "activations", "other", "total"):
            assert getattr(arr, part)[i] == getattr(est.peak, part), (layout, part)


def _interleaved_moe() -> ModelSpec:
    """Mixtral 8x7B with one dense layer, then MoE every other layer (MoE layer frequency)."""
    base = get_preset("mixtral-8x7b")
    assert base.moe is not None
    return replace(base, name="mixtral-interleaved",
                   moe=replace(base.moe, first_k_dense=1, layer_freq=2))


# Variants that reach every branch of a stage's assembly: block recompute, offload
# (the largest offloaded kind in HBM), several selective modules, interleaved dense/MoE
# layers, MTP, FSDP with FP8 copies, KOR22 with its embedding term, no fp32 logits, and a
# Megatron pipeline-layout string with embedding-only and loss-only virtual stages.
OPTION_CASES = [
    ("mixtral-8x7b", {"recompute_num_layers": 2, "activation_offload_layers": 1,
                      "recompute_modules": ("core_attn", "moe_act", "layernorm")},
     MemoryOptions()),
    ("interleaved", {"recompute_num_layers": 1, "activation_offload_layers": 2},
     MemoryOptions(moe_imbalance=1.25)),
    ("deepseek-v3", {"fsdp": True, "precision": "fp8", "activation_offload_layers": 1,
                     "recompute_modules": ("mla_up_proj", "moe", "shared_experts")},
     MemoryOptions(fp8_param_gather=True, fp32_logits=False)),
    ("llama3.1-405b", {"pipeline_layout": "E|(t|)*126L", "recompute_num_layers": 3},
     MemoryOptions()),
    ("gpt3-175b", {"activation_offload_layers": 2}, KOR),
]


@pytest.mark.parametrize(("name", "settings", "options"), OPTION_CASES,
                         ids=[case[0] for case in OPTION_CASES])
def test_memory_arrays_equal_scalar_with_options(name: str, settings: dict,
                                                 options: MemoryOptions,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """memory_arrays == estimate_memory on every row, exactly; also with rows grouped by
    all degrees but vpp (``degree_rows``) and in blocks far smaller than the splits."""
    from parsearch.cost.memory import rows as memory_rows

    monkeypatch.setattr(memory_rows, "BLOCK_ROWS", 7)
    model = _interleaved_moe() if name == "interleaved" else get_preset(name)
    training = TrainingSpec(seq_len=4096, global_batch=512, **settings)
    rng = random.Random(name)
    layouts: list[Layout] = []
    while len(layouts) < 90:
        moe = model.is_moe
        pp, vpp = rng.choice([(1, 1), (2, 1), (2, 3), (4, 2), (8, 1), (8, 4), (16, 8)])
        layout = Layout(
            num_gpus=rng.choice([256, 512]), tp=rng.choice([1, 2, 8]), cp=rng.choice([1, 2]),
            pp=pp, vpp=vpp, ep=rng.choice([1, 8]) if moe else 1,
            etp=rng.choice([1, 2]) if moe else 1, mbs=rng.choice([1, 2, 4]),
            sp=rng.choice([True, False]), recompute=rng.choice(["none", "selective", "full"]))
        if layout.dp and layout.edp and pp * vpp <= model.num_layers + 2:
            layouts.append(layout)
    # A second copy of each layout with another vpp shares all other degrees with it.
    layouts += [replace(x, vpp=1 if x.vpp > 1 else 2) for x in layouts if x.pp > 1]

    def col(attr: str) -> np.ndarray:
        return np.array([getattr(x, attr) for x in layouts])

    args = (model, training, col("tp"), col("cp"), col("pp"), col("ep"), col("etp"),
            col("vpp"), col("mbs"), col("dp"), col("edp"),
            np.array([RECOMPUTE_CODES[x.recompute] for x in layouts]), col("sp"), options)
    groups: dict[tuple, int] = {}
    position = np.array([groups.setdefault((replace(x, vpp=1).key(), x.num_gpus), len(groups))
                         for x in layouts])
    representatives = np.zeros(len(groups), dtype=np.int64)
    representatives[position] = np.arange(len(layouts))
    arr = memory_arrays(*args)
    grouped = memory_arrays(*args, degree_rows=(representatives, position))
    parts = ("weights", "gradients", "optimizer", "activations", "other", "total",
             "offloaded_bytes")
    for i, layout in enumerate(layouts):
        est = estimate_memory(model, training, layout, options)
        assert arr.peak_stage[i] == grouped.peak_stage[i] == est.peak_stage, layout
        for part in parts:
            expected = getattr(est.peak, part)
            assert getattr(arr, part)[i] == getattr(grouped, part)[i] == expected, (layout, part)
    if training.activation_offload_layers:
        assert arr.offloaded_bytes.min() > 0


# --- published runs ----------------------------------------------------------------

# Verified H100/A100 rows of shared/data/published_runs_dev.csv (copied with their ids):
# Megatron-Bridge performance summaries (NVIDIA-NeMo/Megatron-Bridge@067f987df0,
# docs/performance-summary*.md), MoE Parallel Folding (arXiv 2504.14960) Tables 1-5,
# KOR22 (arXiv 2205.05198) Table 3.  Recompute is blank for the NVIDIA/FOLD rows (none
# assumed); micro-batch is blank for the FOLD rows (1 assumed); SP assumed on when tp > 1.
# (id, preset, gpus, tp, pp, cp, ep, etp, vpp, mbs, gbs, seq, precision, recompute, sp)
PUBLISHED_ROWS = [
    ("r0070", "llama3-70b", 64, 4, 8, 1, 1, 1, 5, 1, 256, 8192, "fp8", "none", True),
    ("r0251", "llama3-70b", 64, 4, 8, 1, 1, 1, 5, 1, 128, 8192, "fp8", "none", True),
    ("r0280", "deepseek-v3", 1024, 2, 8, 1, 64, 1, 4, 1, 8192, 4096, "fp8", "none", True),
    ("r0050", "qwen3-30b-a3b", 16, 1, 1, 1, 16, 1, 1, 1, 1024, 4096, "fp8", "none", False),
    ("r0254", "qwen3-30b-a3b", 16, 1, 2, 1, 8, 1, 24, 2, 512, 4096, "fp8", "none", False),
    ("r0343", "mixtral-8x22b", 128, 2, 8, 1, 4, 2, 1, 1, 256, 4096, "bf16", "none", True),
    ("r0342", "mixtral-8x22b", 128, 4, 1, 1, 8, 4, 1, 1, 256, 4096, "bf16", "none", True),
    ("r0390", "mixtral-8x22b", 1024, 4, 8, 16, 8, 4, 1, 1, 128, 131072, "bf16", "none", True),
    ("r0345", "qwen2-57b-a14b", 64, 4, 1, 1, 4, 4, 1, 1, 256, 4096, "bf16", "none", True),
    ("r0347", "qwen2-57b-a14b", 64, 2, 4, 1, 4, 1, 1, 1, 256, 4096, "bf16", "none", True),
    ("r0331", "gpt3-175b", 64, 8, 8, 1, 1, 1, 3, 1, 64, 2048, "bf16", "selective", True),
    ("r0335", "gpt-1t", 512, 8, 64, 1, 1, 1, 1, 1, 512, 2048, "bf16", "selective", True),
]


def predicted_peak_gib(row: tuple, options: MemoryOptions = MemoryOptions()) -> float:  # noqa: B008
    """Predicted peak memory per GPU (GiB) of one published row, default options."""
    (_, preset, gpus, tp, pp, cp, ep, etp, vpp, mbs, gbs, seq, precision, recompute, sp) = row
    training = TrainingSpec(seq_len=seq, global_batch=gbs, precision=precision)
    layout = Layout(num_gpus=gpus, tp=tp, pp=pp, cp=cp, ep=ep, etp=etp, vpp=vpp, mbs=mbs,
                    sp=sp, recompute=recompute)
    return estimate_memory(get_preset(preset), training, layout, options).peak.total / GIB


@pytest.mark.parametrize("row", PUBLISHED_ROWS, ids=[r[0] for r in PUBLISHED_ROWS])
def test_published_runs_fit_in_80_gib(row: tuple) -> None:
    options = KOR if row[1].startswith("gpt") else MemoryOptions()
    assert predicted_peak_gib(row, options) < 80.0


def test_llama3_70b_h100_rows_fit() -> None:
    """The Llama3-70B H100 rows (r0070/r0117/r0161/r0197/r0251/r0278: TP4 PP8 VPP5 CP1,
    DP2, mbs 1, FP8, 8k): predicted < 80 GiB with default options."""
    row = PUBLISHED_ROWS[0]
    gib = predicted_peak_gib(row)
    assert 50.0 < gib < 80.0


def test_llama3_8b_h100_row_needs_megatron_bridge_accounting() -> None:
    """r0250 (Llama3-8B, 8 H100, TP1 PP1 DP8, FP8, 8k, mbs 1) does not fit with parsearch's
    default accounting (fp32 main grads, BF16 + FP8 weight copies) but does with the
    Megatron-Bridge recipe's (bf16 gradient reduction, FP8 primary weights), which is how
    `parsearch validate` reads Megatron-Bridge rows."""
    row = ("r0250", "llama3-8b", 8, 1, 1, 1, 1, 1, 1, 1, 128, 8192, "fp8", "none", False)
    assert predicted_peak_gib(row) > 80.0
    (_, preset, gpus, tp, pp, cp, ep, etp, vpp, mbs, gbs, seq, precision, recompute, sp) = row
    training = TrainingSpec(seq_len=seq, global_batch=gbs, precision=precision, grad_bytes=2.0)
    layout = Layout(num_gpus=gpus, tp=tp, pp=pp, cp=cp, ep=ep, etp=etp, vpp=vpp, mbs=mbs,
                    sp=sp, recompute=recompute)
    options = MemoryOptions(fp8_param_gather=True)
    peak = estimate_memory(get_preset(preset), training, layout, options).peak.total / GIB
    assert peak < 80.0
