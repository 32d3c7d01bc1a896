"""Fine-grained activation offloading (``--offload-modules``): rules, bytes, time, launch."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from parsearch.cost.analytic import (
    CostOptions,
    Estimate,
    build_cost_model,
    estimate,
    layout_columns,
)
from parsearch.cost.memory import MemoryOptions
from parsearch.cost.memory.activations import ActDegrees, LayerBytes, layer_bytes
from parsearch.cost.memory.options import gemm_input_bytes
from parsearch.cost.offload import offload_exposed
from parsearch.cost.option_checks import check_graph_options
from parsearch.cost.stacks import get_stack, stack_training
from parsearch.errors import SpecError
from parsearch.launch import launch_for_cluster
from parsearch.layout import Layout, parse_layout_string
from parsearch.layout.space import enumerate_layouts
from parsearch.model.offload_modules import MIN_OFFLOADED_ELEMENTS, OFFLOAD_MODULES
from parsearch.model.presets import get_preset
from parsearch.model.specs import RECOMPUTE_CODES, TrainingSpec
from parsearch.search.exhaustive import scan_table
from parsearch.topology.cluster import load_cluster
from parsearch.topology.fabric import build_fabric
from parsearch.topology.hardware import load_gpu_profile
from tests.cli_helpers import assert_one_line_error, run_cli

LLAMA = get_preset("llama3-8b")
ONE = ActDegrees(tp=1.0, cp=1.0, ep=1.0, etp=1.0, mbs=1.0, sp_div=1.0)
FULL, SELECTIVE = RECOMPUTE_CODES["full"], RECOMPUTE_CODES["selective"]


def _valid(modules: tuple[str, ...]) -> bool:
    return "attn_proj" not in modules or "core_attn" in modules


def _bytes(model_name: str, modules: tuple[str, ...], *, seq: int = 8192,
           deg: ActDegrees = ONE, is_moe: bool = False, precision: str = "bf16",
           recompute: tuple[str, ...] = ("core_attn",)) -> LayerBytes:
    training = TrainingSpec(seq_len=seq, global_batch=64, offload_modules=modules,
                            precision=precision, recompute_modules=recompute)
    return layer_bytes(get_preset(model_name), training, is_moe, deg, MemoryOptions())


# --- the rules -----------------------------------------------------------------------------

@pytest.mark.parametrize(("modules", "extra", "fragment"), [
    (("bogus",), {}, "unknown module(s) 'bogus'"),
    (("core_attn", "core_attn"), {}, "repeats"),
    (("attn_proj",), {}, "'attn_proj' needs 'core_attn'"),
    (("core_attn",), {"activation_offload_layers": 2}, "activation_offload_layers=2"),
    (("expert_fc1",), {"recompute_modules": ("moe",)}, "expert_fc1 with the 'moe'"),
    (("core_attn", "moe_act"), {"recompute_modules": ("core_attn", "moe")}, "moe_act"),
    ("core_attn", {}, "must be a tuple"),
], ids=["unknown", "repeat", "proj-alone", "cpu-offloading", "fc1-moe", "act-moe", "string"])
def test_rule_breaking_modules_are_refused(modules: object, extra: dict[str, object],
                                           fragment: str) -> None:
    with pytest.raises(SpecError) as caught:
        TrainingSpec(seq_len=4096, global_batch=64, offload_modules=modules,  # type: ignore[arg-type]
                     **extra)  # type: ignore[arg-type]
    assert "offload_modules" in str(caught.value) and fragment in str(caught.value)


def test_a_valid_list_becomes_a_tuple_and_expert_modules_run_beside_other_recompute() -> None:
    spec = TrainingSpec(seq_len=4096, global_batch=64,
                        offload_modules=["core_attn", "attn_proj"])  # type: ignore[arg-type]
    assert spec.offload_modules == ("core_attn", "attn_proj")
    assert TrainingSpec(seq_len=4096, global_batch=64).offload_modules == ()
    ok = TrainingSpec(seq_len=4096, global_batch=64, offload_modules=("expert_fc1", "moe_act"),
                      recompute_modules=("core_attn", "moe_act"))
    assert ok.offload_modules == ("expert_fc1", "moe_act")


# --- bytes per layer -----------------------------------------------------------------------

MODULE_SETS = st.lists(st.sampled_from(OFFLOAD_MODULES), unique=True).map(tuple)
RECOMPUTES = st.sampled_from([("core_attn",), ("core_attn", "layernorm"), ("moe_act",),
                              ("layernorm", "mlp"), ("moe", "core_attn"), ("mla_up_proj",)])


@settings(max_examples=120, deadline=None)
@given(name=st.sampled_from(["llama3-8b", "mixtral-8x7b", "deepseek-v3"]),
       modules=MODULE_SETS, extra=st.sampled_from(OFFLOAD_MODULES), recompute=RECOMPUTES,
       seq=st.sampled_from([512, 4096, 8192]), tp=st.sampled_from([1, 2, 8]),
       sp=st.booleans(), mbs=st.sampled_from([1, 2]), ep=st.sampled_from([1, 8]),
       moe_layer=st.booleans())
def test_offload_only_ever_lowers_held_bytes(name: str, modules: tuple[str, ...], extra: str,
                                             recompute: tuple[str, ...], seq: int, tp: int,
                                             sp: bool, mbs: int, ep: int,
                                             moe_layer: bool) -> None:
    is_moe = moe_layer and get_preset(name).moe is not None
    more = modules if extra in modules else (*modules, extra)
    expert = {"expert_fc1", "moe_act"}
    assume(_valid(modules) and _valid(more))
    assume("moe" not in recompute or not expert & set(more))
    deg = ActDegrees(tp=float(tp), cp=1.0, ep=float(ep), etp=1.0, mbs=float(mbs),
                     sp_div=float(tp) if sp else 1.0)
    kw = {"seq": seq, "deg": deg, "is_moe": is_moe, "recompute": recompute}
    plain, some, most = (_bytes(name, m, **kw) for m in ((), modules, more))  # type: ignore[arg-type]
    for b in (some, most):
        assert float(b.full) == float(plain.full)  # full recompute saves no module input
        assert float(b.moved_of(np.asarray(FULL))) == 0.0
        assert float(b.moved_none) >= 0.0 and float(b.moved_selective) >= 0.0
        assert float(plain.none - b.none) == pytest.approx(float(b.moved_none), rel=1e-12)
        assert float(plain.selective - b.selective) == pytest.approx(
            float(b.moved_selective), rel=1e-12, abs=1e-3)
        # what is moved was held: nothing moved twice, nothing held below zero
        assert float(b.none) > 0.0 and float(b.selective) > 0.0
    assert float(most.none) <= float(some.none) and float(most.selective) <= float(some.selective)


@pytest.mark.parametrize("precision", ["bf16", "fp8"])
def test_llama3_8b_moved_bytes_by_hand(precision: str) -> None:
    """llama3-8b, tp=1, one 8192-token sequence: 32 heads, 8 KV groups of 128."""
    h, a, g, d = (LLAMA.hidden_size, LLAMA.num_attention_heads, LLAMA.num_query_groups,
                  LLAMA.head_dim)
    assert (h, a, g, d) == (4096, 32, 8, 128)
    tokens, gemm_b = 8192, gemm_input_bytes(precision)
    q = o = tokens * a * d  # 33.5M elements each
    kv = tokens * g * d  # K and V: 8.4M elements each
    assert tokens * a < MIN_OFFLOADED_ELEMENTS  # the fp32 log-sum-exp (262,144) stays
    core = 2 * (q + 2 * kv)
    assert core == 100_663_296
    expected = {("core_attn",): core, ("core_attn", "attn_proj"): core + gemm_b * o,
                ("qkv_linear",): tokens * h * (2 + gemm_b),
                # dense, non-MLA: the norms are fused into TE linears, no experts
                ("attn_norm", "mlp_norm", "expert_fc1", "moe_act"): 0.0}
    plain = _bytes("llama3-8b", (), precision=precision)
    for modules, moved in expected.items():
        b = _bytes("llama3-8b", modules, precision=precision)
        assert float(b.moved_none) == moved and float(b.moved_selective) == moved
        assert float(plain.none - b.none) == moved


def test_the_log_sum_exp_moves_from_a_million_elements_unless_recomputed() -> None:
    tokens = 32768  # x 32 heads = exactly MIN_OFFLOADED_ELEMENTS fp32 values
    b = _bytes("llama3-8b", ("core_attn",), seq=tokens)
    assert tokens * LLAMA.num_attention_heads == MIN_OFFLOADED_ELEMENTS
    # core_attn recompute (the default selective module) drops the log-sum-exp
    assert float(b.moved_none - b.moved_selective) == 4.0 * MIN_OFFLOADED_ELEMENTS


@settings(max_examples=30, deadline=None)
@given(seq=st.integers(1, 255), modules=MODULE_SETS.filter(_valid))
def test_tensors_under_a_million_elements_stay(seq: int, modules: tuple[str, ...]) -> None:
    """Under 256 tokens every llama3-8b tensor (at most 4096 per token) is below the floor."""
    b = _bytes("llama3-8b", modules, seq=seq)
    assert float(b.moved_none) == 0.0 and float(b.moved_selective) == 0.0


def test_the_floor_is_inclusive() -> None:
    # 256 tokens: Q has exactly 2**20 elements and moves; K and V (2**18) stay
    assert float(_bytes("llama3-8b", ("core_attn",), seq=256).moved_none) == \
        2.0 * MIN_OFFLOADED_ELEMENTS
    assert float(_bytes("llama3-8b", ("core_attn",), seq=255).moved_none) == 0.0


# --- through the cost model ----------------------------------------------------------------

def _estimate(model: str, modules: tuple[str, ...], layout: str, gpus: int,
              **training: object) -> Estimate:
    spec = TrainingSpec(seq_len=8192, global_batch=64, offload_modules=modules,
                        **training)  # type: ignore[arg-type]
    cm = build_cost_model(get_preset(model), spec, build_fabric(load_cluster("dgx-h100"), gpus),
                          options=CostOptions())
    return estimate(cm, parse_layout_string(layout, gpus))


@pytest.mark.parametrize("layout", ["tp=1,pp=1,mbs=1,recompute=none",
                                    "tp=1,pp=2,mbs=1,recompute=none",
                                    "tp=1,pp=1,mbs=1,recompute=selective"])
def test_a_stage_keeps_one_layer_of_module_inputs(layout: str) -> None:
    """32 layer copies are held at the peak (32 layers x 1 micro-batch, or 16 x 2 in
    flight on the first of two stages); all but one move their module inputs."""
    modules = ("core_attn", "attn_proj")
    plain, off = (_estimate("llama3-8b", m, layout, 8) for m in ((), modules))
    b = _bytes("llama3-8b", modules)
    moved = float(b.moved_selective if "selective" in layout else b.moved_none)
    assert moved > 0
    saved = plain.memory_bytes["activations"] - off.memory_bytes["activations"]
    assert saved == pytest.approx(31 * moved, rel=1e-12)
    assert off.step_time_s >= plain.step_time_s
    assert sum(off.time_s.values()) == pytest.approx(off.step_time_s, rel=1e-12)


def test_full_recompute_moves_nothing() -> None:
    layout = "tp=1,pp=1,mbs=1,recompute=full"
    plain, off = (_estimate("llama3-8b", m, layout, 8) for m in ((), ("qkv_linear",)))
    assert off.memory_bytes == plain.memory_bytes and off.step_time_s == plain.step_time_s


def test_block_recompute_offloads_the_layers_it_keeps_whole() -> None:
    """With ``--recompute-method block`` the chunk's layers past the first N keep everything,
    so they offload their module inputs, pay the copies, and one stays on the GPU."""
    layout = "tp=1,pp=1,mbs=1,recompute=full"
    modules = ("core_attn", "attn_proj")
    plain, off = (_estimate("llama3-8b", m, layout, 8, recompute_num_layers=16)
                  for m in ((), modules))
    moved = float(_bytes("llama3-8b", modules).moved_none)
    saved = plain.memory_bytes["activations"] - off.memory_bytes["activations"]
    assert saved == pytest.approx(15 * moved, rel=1e-12)  # 16 kept whole, one held back
    moe = "tp=2,pp=2,ep=8,sp=true,mbs=1,recompute=full"
    experts = ("expert_fc1", "moe_act")
    blocked = _estimate("mixtral-8x7b", experts, moe, 64, recompute_num_layers=8)
    whole = _estimate("mixtral-8x7b", experts, moe.replace("full", "none"), 64)
    # 8 of 16 layers per stage keep everything: at most half the copies of recompute none
    # are exposed (the recomputing half lengthens the average layer the copies hide behind)
    assert 0.0 < blocked.time_s["offload"] <= whole.time_s["offload"] / 2


def test_offloaded_module_inputs_need_host_memory() -> None:
    """A cluster whose hosts cannot take what the modules move prices the layout as not
    fitting."""
    import dataclasses

    model, gpus = get_preset("mixtral-8x7b"), 64
    spec = TrainingSpec(seq_len=4096, global_batch=64, offload_modules=("expert_fc1",))
    layout = parse_layout_string("tp=2,pp=4,ep=8,sp=true,mbs=1,recompute=none", gpus)
    roomy = load_cluster("dgx-h100")
    small = dataclasses.replace(roomy, host_memory_bytes=8e9)  # 1 GB per GPU, 3.7 needed
    fits = [estimate(build_cost_model(model, spec, build_fabric(c, gpus),
                                      options=CostOptions()), layout).fits
            for c in (roomy, small)]
    assert fits == [True, False]


def test_a_slow_host_link_exposes_more_copy_time_for_more_modules() -> None:
    layout = "tp=2,pp=4,ep=8,sp=true,mbs=1,recompute=none"
    sets = [(), ("expert_fc1",), ("expert_fc1", "moe_act"),
            ("qkv_linear", "core_attn", "attn_proj", "mlp_norm", "expert_fc1", "moe_act")]
    ests = [_estimate("mixtral-8x7b", s, layout, 64) for s in sets]
    offload = [e.time_s["offload"] for e in ests]
    activations = [e.memory_bytes["activations"] for e in ests]
    assert offload[0] == 0.0 and offload[2] > 0.0 and offload[3] > offload[2]
    assert offload == sorted(offload)
    assert activations == sorted(activations, reverse=True) and activations[3] < activations[0]
    assert [e.step_time_s for e in ests] == sorted(e.step_time_s for e in ests)
    for e in ests:
        assert sum(e.time_s.values()) == pytest.approx(e.step_time_s, rel=1e-12)


def test_exposed_copy_time_by_hand() -> None:
    """Per layer per micro-batch: max(0, B/host - t_fwd) + max(0, B/host - t_bwd)."""
    training = TrainingSpec(seq_len=8192, global_batch=64,
                            offload_modules=("core_attn", "attn_proj"))
    gpu = load_gpu_profile("h100-sxm")
    cols = layout_columns([parse_layout_string("tp=1,pp=1,mbs=1,recompute=none", 8)])
    copy = float(_bytes("llama3-8b", ("core_attn", "attn_proj")).moved_none) / gpu.host_link_Bps

    def exposed(layer_time: float) -> float:
        return float(offload_exposed(LLAMA, training, gpu, MemoryOptions(), cols, False,
                                     np.array([layer_time]))[0])

    assert exposed(1e-9) == pytest.approx(2 * copy - 1e-9, rel=1e-9)
    assert exposed(1.5 * copy) == pytest.approx(0.5 * copy, rel=1e-9)  # fwd 0.5, bwd 1 copy
    assert exposed(3 * copy) == 0.0


def test_scanned_memory_equals_estimate_with_offloaded_modules() -> None:
    model = get_preset("qwen3-30b-a3b")
    modules = ("core_attn", "attn_proj", "mlp_norm", "expert_fc1", "moe_act")
    fabric = build_fabric(load_cluster("dgx-h100"), 16)
    spec = TrainingSpec(seq_len=4096, global_batch=64, offload_modules=modules)
    cm = build_cost_model(model, spec, fabric, options=CostOptions())
    plain = build_cost_model(model, TrainingSpec(seq_len=4096, global_batch=64), fabric,
                             options=CostOptions())
    table = enumerate_layouts(model, spec, 16)
    scan = scan_table(cm, table)
    assert scan.feasible > 0
    lower = 0
    for i in range(0, scan.feasible, max(1, scan.feasible // 12)):
        lay = table.layout(int(scan.feasible_rows[i]))
        total = estimate(cm, lay).memory_bytes["total"]
        assert scan.memory_bytes[i] == pytest.approx(total, rel=1e-9), lay
        lower += total < estimate(plain, lay).memory_bytes["total"]
    assert lower > 0  # the comparison saw the offload


# --- stacks, CUDA graphs, CLI, launch ------------------------------------------------------

def test_older_stacks_refuse_fine_grained_offloading() -> None:
    spec = TrainingSpec(seq_len=4096, global_batch=64, offload_modules=("core_attn",))
    with pytest.raises(SpecError, match="drop --offload-modules"):
        stack_training(get_stack("mcore-0.14"), spec)
    assert get_stack("mcore-current").fine_grained_offloading
    assert stack_training(get_stack("mcore-current"), spec).offload_modules == ("core_attn",)


@pytest.mark.parametrize("norm", ["attn_norm", "mlp_norm"])
def test_per_layer_cuda_graphs_refuse_offloaded_norms(norm: str) -> None:
    graphs = CostOptions(cuda_graphs=True)
    bad = TrainingSpec(seq_len=4096, global_batch=64, offload_modules=(norm, "core_attn"))
    with pytest.raises(SpecError, match=norm):
        check_graph_options(bad, graphs)
    ok = TrainingSpec(seq_len=4096, global_batch=64, offload_modules=("core_attn",))
    assert check_graph_options(ok, graphs) is graphs


CLI = ("--model", "llama3-8b", "--cluster", "dgx-h100", "--gpus", "8", "--global-batch", "64",
       "--seq-len", "8192")


@pytest.mark.parametrize("command", ["search", "explain"])
@pytest.mark.parametrize(("extra", "fragment"), [
    (("--offload-modules", "attn_proj"), "needs 'core_attn'"),
    (("--offload-modules", "core_attn", "--activation-offload-layers", "2"), "keep one"),
    (("--offload-modules", "core_attn", "--stack", "mcore-0.14"), "drop --offload-modules"),
])
def test_cli_refuses_bad_combinations_in_one_line(command: str, extra: tuple[str, ...],
                                                  fragment: str) -> None:
    layout = ("--layout", "tp=1,pp=1,mbs=1") if command == "explain" else ()
    assert_one_line_error(run_cli(command, *CLI, *layout, *extra), fragment)


def test_explain_says_it_priced_the_offload() -> None:
    result = run_cli("explain", *CLI, "--layout", "tp=1,pp=1,mbs=1",
                     "--offload-modules", "core_attn,attn_proj")
    assert result.code == 0, result.err
    priced = [line for line in result.out.splitlines() if "priced with" in line]
    assert len(priced) == 1
    assert "fine-grained activation offload (core_attn, attn_proj)" in priced[0]


@pytest.mark.parametrize("modules", [(), ("core_attn", "attn_proj")])
def test_launch_carries_the_offload(modules: tuple[str, ...]) -> None:
    spec = TrainingSpec(seq_len=4096, global_batch=64, offload_modules=modules)
    launch = launch_for_cluster(LLAMA, spec, Layout(num_gpus=16, tp=2, pp=2, sp=True),
                                load_cluster("dgx-h100"))
    args = list(launch.megatron_lm_args)
    assert ("--fine-grained-activation-offloading" in args) == bool(modules)
    assert (("NVTE_CPU_OFFLOAD_V1", "1") in launch.env) == bool(modules)
    assert launch.conflicts == ()
    if modules:
        at = args.index("--offload-modules")
        assert args[at + 1:at + 3] == list(modules)
    on = "true" if modules else "false"
    assert f"++model.fine_grained_activation_offloading={on}" in launch.bridge_overrides
    assert f"++model.offload_modules=[{','.join(modules)}]" in launch.bridge_overrides


def test_expert_modules_on_a_dense_model_are_refused() -> None:
    spec = TrainingSpec(seq_len=4096, global_batch=8, offload_modules=("core_attn", "moe_act"))
    with pytest.raises(SpecError, match="llama3-8b has no MoE layers"):
        build_cost_model(get_preset("llama3-8b"), spec, build_fabric(load_cluster("dgx-h100"), 8))


def test_a_measured_run_can_say_which_modules_it_offloaded() -> None:
    from parsearch.validation.user.measurements import Defaults, measurement_from_row

    row = {"num_gpus": "8", "layout": "tp=1", "global_batch": "8", "seq_len": "4096",
           "precision": "bf16", "tokens_per_s_per_gpu": "9000",
           "offload_modules": "core_attn attn_proj"}
    m = measurement_from_row(row, "row 2", Defaults(model="llama3-8b", cluster="dgx-h100"))
    assert m.training["offload_modules"] == ("core_attn", "attn_proj")
    with pytest.raises(SpecError, match=r"offload_modules has unknown module.*attn_out"):
        measurement_from_row({**row, "offload_modules": "attn_out"}, "row 2", Defaults())
