"""``--moe-shared-expert-overlap``: the shared experts beside the same micro-batch's
dispatch and combine (Megatron-Core ``transformer/moe/shared_experts.py``)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from parsearch.cost.analytic import CostOptions, build_cost_model, score_columns
from parsearch.cost.ep_overlap import shared_expert_overlap_hidden
from parsearch.errors import SpecError
from parsearch.launch.megatron_lm import megatron_lm_args
from parsearch.launch.plan import launch_plan
from parsearch.layout import parse_layout_string
from parsearch.layout.space import enumerate_layouts
from parsearch.model.presets import get_preset
from parsearch.model.specs import TrainingSpec
from parsearch.topology.cluster import load_cluster
from parsearch.topology.fabric import build_fabric
from parsearch.validation.published.recipes import apply_setup, load_run_setups


def _hidden(ep: float, calls: float, shared: float, recomputed: float = 0.0,
            budget: float = 1e9, fc1: float = 2.0 / 3.0) -> float:
    return float(shared_expert_overlap_hidden(np.array([ep]), calls, np.array([shared]), fc1,
                                              recomputed, np.array([budget]))[0])


def test_each_call_hides_behind_its_own_partner_by_hand_count() -> None:
    # Four calls of 1 s; shared forward 3 s (FC1 2, FC2 1), backward 6 s (FC2 2, FC1 4):
    # dispatch|FC1 fwd 1, combine|FC2 fwd 1, combine grad|FC2 bwd 1, dispatch grad|FC1 bwd 1.
    assert _hidden(4.0, 4.0, 9.0) == pytest.approx(4.0)
    # Calls of 3 s: min(3, 2) + min(3, 1) + min(3, 2) + min(3, 4) = 8, not min(12, 9) = 9.
    assert _hidden(12.0, 4.0, 9.0) == pytest.approx(8.0)
    # Full recompute: six calls, the re-run forward pairs again (shared = (3 + 1) x 3).
    assert _hidden(18.0, 6.0, 12.0, recomputed=1.0) == pytest.approx(2 * (2 + 1) + 2 + 3)


@given(ep=st.floats(0.0, 50.0), shared=st.floats(0.0, 20.0), budget=st.floats(0.0, 30.0),
       recomputed=st.floats(0.0, 1.0), fc1=st.sampled_from([0.5, 2.0 / 3.0]))
def test_shared_overlap_hides_at_most_the_traffic_the_shared_gemms_and_the_budget(
        ep: float, shared: float, budget: float, recomputed: float, fc1: float) -> None:
    hidden = _hidden(ep, 4.0 + 2.0 * recomputed, shared, recomputed, budget, fc1)
    assert hidden >= 0.0
    assert hidden <= ep * (1 + 1e-12) + 1e-12
    assert hidden <= shared * (1 + 1e-12) + 1e-12
    assert hidden <= budget * (1 + 1e-12) + 1e-12


@pytest.fixture(scope="module")
def shared_space():  # type: ignore[no-untyped-def]
    model = get_preset("qwen2-57b-a14b")
    training = TrainingSpec(seq_len=4096, global_batch=64, micro_batch_sizes=(1,))
    fabric = build_fabric(load_cluster("dgx-h100"), 32)
    return model, training, fabric, enumerate_layouts(model, training, 32).columns


def _steps(model, training, fabric, cols, options: CostOptions) -> np.ndarray:  # type: ignore[no-untyped-def]
    return score_columns(build_cost_model(model, training, fabric, options=options), cols,
                         with_memory=False)["step_time_s"]


@settings(max_examples=6, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(dispatcher=st.sampled_from(["alltoall", "flex"]), tp_overlap=st.booleans(),
       grad_overlap=st.booleans())
def test_turning_the_shared_expert_overlap_off_never_makes_a_layout_faster(
        shared_space, dispatcher: str, tp_overlap: bool, grad_overlap: bool) -> None:
    model, training, fabric, cols = shared_space
    on = CostOptions(moe_dispatcher=dispatcher, tp_comm_overlap=tp_overlap,
                     overlap_grad_reduce=grad_overlap, moe_shared_expert_overlap=True)
    fast = _steps(model, training, fabric, cols, on)
    slow = _steps(model, training, fabric, cols, replace(on, moe_shared_expert_overlap=False))
    assert np.all(slow >= fast * (1 - 1e-12))
    assert np.any(slow > fast * (1 + 1e-6))  # with EP across ranks some layout gains


def test_models_without_shared_experts_ignore_it() -> None:
    model = get_preset("mixtral-8x7b")
    training = TrainingSpec(seq_len=4096, global_batch=64, micro_batch_sizes=(1,))
    fabric = build_fabric(load_cluster("dgx-h100"), 16)
    cols = enumerate_layouts(model, training, 16).columns
    np.testing.assert_allclose(
        _steps(model, training, fabric, cols, CostOptions(moe_shared_expert_overlap=True)),
        _steps(model, training, fabric, cols, CostOptions()), rtol=1e-12)


def test_megatron_refusals_are_refused_here_with_the_fix() -> None:
    with pytest.raises(SpecError, match="alltoall or flex"):
        CostOptions(moe_dispatcher="allgather", moe_shared_expert_overlap=True)
    with pytest.raises(SpecError, match="drop --moe-shared-expert-overlap"):
        CostOptions(moe_a2a_overlap=True, moe_shared_expert_overlap=True)


def test_the_launch_turns_on_exactly_what_was_priced() -> None:
    training = TrainingSpec(seq_len=4096, global_batch=64)
    layout = parse_layout_string("tp=2,pp=1,ep=4,mbs=1,sp=true", 32)
    on = CostOptions(moe_shared_expert_overlap=True)
    model = get_preset("qwen2-57b-a14b")
    command = megatron_lm_args(model, launch_plan(model, training, layout, on))
    assert "--moe-shared-expert-overlap" in command
    # with TP comm overlap Megatron drops userbuffers on the shared linears: said, not hidden
    assert any("userbuffers" in c for c in launch_plan(model, training, layout, on).conflicts)
    assert not any("userbuffers" in c for c in launch_plan(
        model, training, layout, replace(on, tp_comm_overlap=False)).conflicts)
    # Megatron refuses shared-expert recompute beside the overlap: said, not launched silently
    recomputed = replace(training, recompute_modes=("selective",),
                         recompute_modules=("shared_experts",))
    selective = replace(layout, recompute="selective")
    assert any("shared_experts" in c for c in launch_plan(model, recomputed, selective,
                                                          on).conflicts)
    # not launched without shared experts
    assert not launch_plan(get_preset("mixtral-8x7b"), training,
                           parse_layout_string("tp=2,pp=1,ep=4,mbs=1", 32),
                           on).moe_shared_expert_overlap


def test_published_rows_read_the_overlap_from_their_recipe() -> None:
    setups = load_run_setups()
    training = TrainingSpec(seq_len=4096, global_batch=256)
    for run_id, expected in (("r0345", True), ("r0280", False)):
        _, options = apply_setup(setups[run_id], training, CostOptions(), moe=True,
                                 precision="bf16")
        assert options.moe_shared_expert_overlap is expected
    # dense rows never carry it
    _, dense = apply_setup(setups["r0345"], training, CostOptions(), moe=False,
                           precision="bf16")
    assert dense.moe_shared_expert_overlap is False


def test_shared_gemms_hide_their_own_tp_traffic_or_the_dispatch_never_both(
        shared_space) -> None:  # type: ignore[no-untyped-def]
    """The shared experts' backward GEMMs already hide their block's asynchronous TP
    collectives; the dispatch can only use what is left: with the overlap on, the
    communication hidden never exceeds the compute beside it, layout by layout."""
    model, training, fabric, cols = shared_space
    on = CostOptions(tp_comm_overlap=False, moe_shared_expert_overlap=True)
    nothing = CostOptions(tp_comm_overlap=False, overlap_grad_reduce=False,
                          overlap_param_gather=False)
    with_overlap = score_columns(build_cost_model(model, training, fabric, options=on), cols,
                                 with_memory=False)
    without = score_columns(build_cost_model(model, training, fabric, options=nothing), cols,
                            with_memory=False)
    hidden = sum(without[f"time_{k}"] - with_overlap[f"time_{k}"]
                 for k in ("tp_comm", "ep_comm"))
    work = without["time_compute"] + without["time_memory_bound"]
    assert np.all(hidden <= work * (1 + 1e-9) + 1e-12)
    assert np.all(with_overlap["step_time_s"] >= without["time_compute"] * (1 - 1e-12))


def test_measurement_tables_carry_the_overlap(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from parsearch.validation.user.measurements import load_measurements

    path = tmp_path / "runs.csv"
    path.write_text(
        "model,cluster,num_gpus,global_batch,seq_len,precision,layout,tokens_per_s_per_gpu,"
        "moe_shared_expert_overlap\n"
        "qwen2-57b-a14b,dgx-h100,32,64,4096,bf16,\"tp=2,ep=4,sp=true\",4000,true\n"
        "qwen2-57b-a14b,dgx-h100,32,64,4096,bf16,\"tp=2,ep=4,sp=true\",4000,often\n",
        encoding="utf-8")
    loaded = load_measurements([path])
    assert [m.options for m in loaded.measurements] == [{"moe_shared_expert_overlap": True}]
    assert len(loaded.problems) == 1 and "moe_shared_expert_overlap='often'" in loaded.problems[0]
