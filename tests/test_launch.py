"""Launch settings reproduce what was priced: every priced option shows in the output."""

from __future__ import annotations

import dataclasses
import json
import os
import stat
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from parsearch.cli import main
from parsearch.cost.analytic import build_cost_model, estimate
from parsearch.cost.memory import MemoryOptions
from parsearch.cost.options import CostOptions
from parsearch.errors import SpecError
from parsearch.launch import NodeGeometry, launch_for_cluster
from parsearch.layout import Layout
from parsearch.model.files import resolve_model
from parsearch.model.specs import TrainingSpec
from parsearch.topology.cluster import load_cluster
from parsearch.topology.fabric import build_fabric

DENSE = ("llama3-8b", "dgx-h100", Layout(num_gpus=32, tp=2, pp=2, sp=True, mbs=1),
         TrainingSpec(seq_len=4096, global_batch=256))
MOE = ("qwen3-30b-a3b", "dgx-h100", Layout(num_gpus=32, tp=2, pp=2, ep=4, sp=True, mbs=1),
       TrainingSpec(seq_len=4096, global_batch=256, precision="fp8"))

#: (what changes, training changes, option changes).  Every input of the cost model that
#: a user sets; none is left out (test_every_option_is_enumerated).
DELTAS: tuple[tuple[str, dict[str, Any], dict[str, Any]], ...] = (
    ("precision fp8", {"precision": "fp8"}, {}),
    ("distributed optimizer off", {"distributed_optimizer": False}, {}),
    ("fsdp", {"fsdp": True}, {}),
    ("fsdp zero-2", {"fsdp": True, "fsdp_strategy": "optim_grads"}, {}),
    ("weight bytes", {"weight_bytes": 4.0}, {}),
    ("grad bytes", {"grad_bytes": 2.0}, {}),
    ("optimizer bytes", {"optimizer_bytes": 8.0}, {}),
    ("odd optimizer bytes", {"optimizer_bytes": 10.0}, {}),
    ("bf16 moments", {}, {"bf16_moments": True}),
    ("recompute layers", {"recompute_num_layers": 2}, {}),
    ("recompute modules", {"recompute_modules": ("core_attn", "mlp")}, {}),
    ("offload", {"activation_offload_layers": 2}, {}),
    ("pipeline layout", {"pipeline_layout": "Et*15|t*17L"}, {}),
    ("dispatcher allgather", {}, {"moe_dispatcher": "allgather"}),
    ("dispatcher flex", {}, {"moe_dispatcher": "flex"}),
    ("flex backend", {}, {"moe_dispatcher": "flex", "moe_flex_backend": "hybridep",
                          "moe_a2a_overlap": True}),
    ("tp overlap off", {}, {"tp_comm_overlap": False}),
    ("a2a overlap", {}, {"moe_a2a_overlap": True}),
    ("shared expert overlap", {}, {"moe_shared_expert_overlap": True}),
    ("grad reduce overlap off", {}, {"overlap_grad_reduce": False}),
    ("param gather overlap off", {}, {"overlap_param_gather": False}),
    ("cuda graphs", {}, {"cuda_graphs": True}),
    ("cuda graph scope", {}, {"cuda_graphs": True, "cuda_graph_scope": ("attn",)}),
    ("cuda graph impl", {}, {"cuda_graphs": True, "cuda_graph_impl": "full_iteration"}),
    ("unfused attention", {}, {"flash_attention": False}),
    ("pp scatter gather", {}, {"pp_scatter_gather": True}),
    ("tp async grad comm off", {}, {"tp_async_grad_comm": False}),
    ("p2p overlap off", {}, {"pp_p2p_overlap": False}),
    ("offload modules", {"offload_modules": ("core_attn", "attn_proj")}, {}),
    ("moe imbalance", {}, {"moe_imbalance": 1.3}),
    ("routing balanced", {}, {"routing": "balanced"}),
    ("capacity factor", {}, {"moe_capacity_factor": 1.0}),
    ("pad to capacity", {}, {"moe_capacity_factor": 1.25, "moe_pad_to_capacity": True}),
    ("grad reduce bf16", {}, {"grad_reduce_bytes": 2.0}),
    ("ddp bucket size", {}, {"ddp_bucket_params": 10_000_000}),
    ("fp8 dispatch", {}, {"fp8_dispatch": True}),
    ("fp8 recipe", {"precision": "fp8"}, {"fp8_recipe": "delayed"}),
    ("fp8 attention", {"precision": "fp8"}, {"fp8_attention": True}),
    # MXFP8 only: priced on a B200 copy of the case below
    ("fp8 output proj", {"precision": "fp8"}, {"fp8_output_proj": True}),
    ("fused expert mlp", {"precision": "fp8"}, {"fused_expert_mlp": True}),
    ("fp8 param gather", {}, {"param_gather_bytes": 1.0,
                              "memory": MemoryOptions(fp8_param_gather=True)}),
)
#: Inputs that change what is priced but are not launch settings, with the reason.
NOT_LAUNCH_SETTINGS = {
    "memory_margin": "a safety margin on what counts as fitting; it does not change the run",
    "search_features": "which features the search chooses; the chosen ones are launched",
    "chosen_features": "which memory features the search turned on; priced_features says so",
    "causal": "a property of the model's attention mask, fixed by the model",
    "memory": "memory-accounting knobs (fp8_param_gather is enumerated above)",
    "micro_batch_sizes": "candidate set; the layout's mbs is launched",
    "recompute_modes": "candidate set; the layout's recompute is launched",
    "pipeline_split": "candidate mode; the layout's split is launched as a layout string, "
                      "or as Megatron-Core <= 0.12's first/last-stage or accounting flags",
    "min_interleaved_pp": "candidate constraint of a stack before 2024-05-31 (vpp > 1 only "
                          "with pp > 2); the layout's pp and vpp are launched",
    "sequence_parallel": "candidate mode; the layout's sp is launched",
    "max_vpp": "candidate cap; the layout's vpp is launched",
    "max_cp": "candidate cap (or a stack without CP); the layout's cp is launched",
    "experts_follow_tp": "candidate constraint of a stack before MoE parallel folding "
                         "(etp = tp); the layout's etp is launched",
    "moe_dispatchers_available": "what the software stack offers the search; the chosen "
                                 "dispatcher is launched",
    "seq_len": "always launched (--seq-length, dataset.seq_length)",
    "global_batch": "always launched (--global-batch-size, train.global_batch_size)",
    "optimizer": "launched as --optimizer when not adam",
    "apex_distributed_adam": "NeMo 1.0's Apex optimizer, read from published recipes to "
                             "price them; Megatron-LM and Bridge run Megatron-Core's DDP",
    "dualpipe": "DeepSeek's DualPipe schedule, read from the DeepSeek-V3 report to price "
                "it; Megatron-LM and Bridge run 1F1B or interleaved 1F1B",
}


def _priced(case: tuple[Any, ...], train: dict[str, Any], opts: dict[str, Any]
            ) -> tuple[Any, Any]:
    model_name, cluster_name, layout, training = case
    model, cluster = resolve_model(model_name), load_cluster(cluster_name)
    training = dataclasses.replace(training, **train)
    options = CostOptions(**opts)
    cm = build_cost_model(model, training, build_fabric(cluster, layout.num_gpus),
                          options=options)
    est = estimate(cm, layout)
    launch = launch_for_cluster(model, training, layout, cluster, options=cm.options)
    return est, launch


def _signature(est: Any) -> tuple[float, ...]:
    return (round(est.step_time_s, 9), round(est.memory_bytes["total"], 0))


def _output(launch: Any) -> tuple[Any, ...]:
    return (launch.megatron_lm_args, launch.bridge_overrides, launch.env, launch.conflicts)


@pytest.mark.parametrize("case", [DENSE, MOE], ids=["dense", "moe"])
@pytest.mark.parametrize("delta", DELTAS, ids=[d[0] for d in DELTAS])
def test_every_priced_option_changes_the_launch(case: tuple[Any, ...],
                                                delta: tuple[str, dict[str, Any],
                                                             dict[str, Any]]) -> None:
    name, train, opts = delta
    if name == "pipeline layout" and case is MOE:
        train = {"pipeline_layout": "Et*23|t*25L"}
    if name == "fp8 param gather" and case is DENSE:
        train = {"precision": "fp8"}
    if name == "recompute layers" or name == "recompute modules":
        layout = dataclasses.replace(case[2], recompute="full" if "layers" in name
                                     else "selective")
        case = (*case[:2], layout, case[3])
    if name in ("fp8 output proj", "fused expert mlp"):  # MXFP8-only features: Blackwell
        case = (case[0], "dgx-b200", *case[2:])
    if name == "p2p overlap off":  # waited sends differ from overlapped ones only with vpp > 1
        case = (*case[:2], dataclasses.replace(case[2], vpp=2), case[3])
    if name == "offload":
        case = (*case[:2], dataclasses.replace(case[2], pp=1, num_gpus=16), case[3])
    if name == "shared expert overlap" and case is MOE:  # a model with shared experts
        case = ("qwen2-57b-a14b", *case[1:])
    try:
        base_est, base_launch = _priced(case, {k: v for k, v in train.items()
                                               if k == "precision"}, {})
        est, launch = _priced(case, train, opts)
    except SpecError as error:  # the combination is refused before pricing: nothing to launch
        pytest.skip(f"{name}: {error}")
    if _signature(est) != _signature(base_est):
        assert _output(launch) != _output(base_launch), (
            f"{name} changes the priced time or memory but not the launch output")


def test_every_option_is_enumerated() -> None:
    training_fields = {f.name for f in dataclasses.fields(TrainingSpec)}
    option_fields = {f.name for f in dataclasses.fields(CostOptions)}
    covered = {k for _, t, o in DELTAS for k in (*t, *o)} | set(NOT_LAUNCH_SETTINGS)
    assert training_fields | option_fields <= covered, sorted(
        (training_fields | option_fields) - covered)


def test_bad_combinations_are_reported_not_launched() -> None:
    model, cluster = resolve_model("llama3-8b"), load_cluster("dgx-h100")
    training = TrainingSpec(seq_len=4096, global_batch=64, activation_offload_layers=2)
    launch = launch_for_cluster(model, training, Layout(num_gpus=16, tp=2, pp=2, sp=True),
                                cluster)
    assert any("pipeline parallelism" in c for c in launch.conflicts)
    assert "# cannot run as priced" in launch.shell_snippet()


@settings(max_examples=60, deadline=None)
@given(gpus=st.integers(1, 5000), per_node=st.sampled_from([1, 2, 4, 8, 72]))
def test_geometry_launches_exactly_the_layout_rank_count(gpus: int, per_node: int) -> None:
    g = NodeGeometry(gpus, per_node)
    assert sum(count * nproc for count, nproc in g.per_node_groups()) == gpus
    assert sum(count for count, _ in g.per_node_groups()) == g.nodes
    assert all(1 <= nproc <= per_node for _, nproc in g.per_node_groups())
    assert (g.nodes - 1) * per_node < gpus <= g.nodes * per_node


def test_partial_last_node_sets_processes_per_node() -> None:
    model, cluster = resolve_model("llama3-8b"), load_cluster("dgx-h100")
    launch = launch_for_cluster(model, TrainingSpec(seq_len=4096, global_batch=100),
                                Layout(num_gpus=100, tp=1, mbs=1), cluster)
    snippet = launch.shell_snippet()
    assert launch.nodes == 13
    assert "SLURM_NODEID" in snippet and "< 12 ? 8 : 4" in snippet
    assert '--nproc-per-node "$NPROC_PER_NODE"' in snippet


def test_search_export_writes_launch_files(tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "shortlist"
    code = main(["search", "--model", "llama3-8b", "--cluster", "dgx-h100", "--gpus", "16",
                 "--global-batch", "64", "--seq-len", "4096", "--top", "3", "--export",
                 str(out), "--format", "jsonl", "--recipe",
                 "llama3_8b_pretrain_8gpu_h100_bf16_config"])
    assert code == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 3 and all(json.loads(line)["launch"]["megatron_lm_args"]
                                   for line in lines)
    folders = sorted(p for p in out.iterdir() if p.is_dir())
    assert len(folders) == 3
    first = folders[0]
    launch_sh = first / "launch.sh"
    assert os.stat(launch_sh).st_mode & stat.S_IXUSR
    assert "--recipe llama3_8b_pretrain_8gpu_h100_bf16_config" in launch_sh.read_text()
    bridge = yaml.safe_load((first / "bridge_overrides.yaml").read_text())
    assert bridge["recipe"] == "llama3_8b_pretrain_8gpu_h100_bf16_config"
    assert bridge["config"]["dataset"]["seq_length"] == 4096
    assert bridge["config"]["mixed_precision"] is None
    estimate_doc = json.loads((first / "estimate.json").read_text())
    assert estimate_doc["rank"] == 1
    assert "MEGATRON_ARGS=(" in (first / "megatron_lm_args.sh").read_text()


def test_search_csv_has_one_row_per_layout(capsys: pytest.CaptureFixture[str]) -> None:
    import csv
    import io

    code = main(["search", "--model", "llama3-8b", "--cluster", "dgx-h100", "--gpus", "16",
                 "--global-batch", "64", "--seq-len", "4096", "--top", "4", "--format", "csv"])
    assert code == 0
    rows = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert [int(r["rank"]) for r in rows] == [1, 2, 3, 4]
    assert all(r["megatron_lm_args"].startswith("--num-layers 32") for r in rows)


def test_bad_export_and_recipe_fail_before_the_search(tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    base = ["search", "--model", "llama3-8b", "--cluster", "dgx-h100", "--gpus", "16",
            "--global-batch", "64", "--seq-len", "4096"]
    assert main([*base, "--export", str(blocker)]) == 2
    assert "is a file" in capsys.readouterr().err
    assert main([*base, "--recipe", "llama3_8b_pretrain"]) == 2
    err = capsys.readouterr().err
    assert "did you mean" in err and err.count("\n") == 1


def test_show_model_prints_what_was_parsed(capsys: pytest.CaptureFixture[str]) -> None:
    path = Path(__file__).parent / "fixtures" / "hf_configs" / "deepseek-v3.json"
    assert main(["show-model", str(path), "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    config = json.loads(path.read_text())
    assert doc["num_layers"] == config["num_hidden_layers"]
    assert doc["moe.num_experts"] == config["n_routed_experts"]
    assert doc["moe.first_k_dense"] == config["first_k_dense_replace"]
    assert doc["mla.kv_lora_rank"] == config["kv_lora_rank"]
    assert doc["moe.layers_with_experts"] == config["num_hidden_layers"] - config[
        "first_k_dense_replace"]
    assert 600 < doc["params.total_b"] < 700 and 30 < doc["params.active_b"] < 45
    assert main(["show-model", "no-such-model"]) == 2
    assert capsys.readouterr().err.count("\n") == 1


def test_pareto_launch_settings_carry_the_priced_options() -> None:
    from parsearch.search.api import pareto_front

    training = TrainingSpec(seq_len=4096, global_batch=256)
    options = CostOptions(moe_dispatcher="flex", cuda_graphs=True)
    result = pareto_front(model="qwen3-30b-a3b", training=training, cluster="dgx-h100",
                          max_gpus=32, min_gpus=16, gpu_step=16, options=options)
    for point in result.points:
        args = point.launch.megatron_lm_args
        assert args[args.index("--moe-token-dispatcher-type") + 1] == "flex"
        assert "--cuda-graph-impl" in args
        # the cost model prices the fused cross-entropy, so the launch turns it on
        assert "--cross-entropy-loss-fusion" in args
