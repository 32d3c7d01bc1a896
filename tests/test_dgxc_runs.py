"""NVIDIA's DGX Cloud benchmarking rows (``independent_runs.csv`` i0242-i0301, tag DGXC).

The golden numbers below are typed from the tables of NVIDIA/dgxc-benchmarking@35a9aecc8d5b
``llama3.1/README_{8b,70b,405b}.md``, ``nemotron/README_{15b,340b}.md`` and
``grok1/README_314b.md`` (step time in
s, aggregate tokens/s as printed), not computed by the code; the layouts from the
recipes' yaml and ``configure.sh`` there.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from parsearch.cost.analytic import CostOptions
from parsearch.validation.published.published_runs import (
    PublishedRun,
    current_releases,
    load_independent_runs,
)
from parsearch.validation.published.run_conventions import (
    CONV_REPORTED,
    DGXC,
    MBRIDGE,
    MBRIDGE_HELDOUT,
    stack_of_source,
)
from parsearch.validation.published.runs import memory_saving_candidates, recipe_accounting

#: id -> (GPUs, global batch, step s, aggregate tokens/s), as the README tables print them.
PRINTED = {
    "i0242": (8, 128, 12.91, 81222), "i0246": (128, 2048, 13.10, 1280704),
    "i0247": (8, 128, 9.67, 108436), "i0251": (128, 2048, 9.82, 1708474),
    "i0252": (64, 128, 14.72, 71235), "i0257": (2048, 4096, 14.98, 2248957),
    "i0258": (64, 128, 11.01, 95239), "i0263": (2048, 4096, 11.39, 2945955),
    "i0264": (576, 252, 17.20, 120022), "i0266": (2304, 1008, 17.62, 468646),
    "i0267": (576, 252, 11.24, 183664), "i0269": (2304, 1008, 12.35, 668626),
    "i0270": (16, 64, 2.83, 92630), "i0285": (2048, 8192, 2.18, 15391941),
    "i0286": (128, 32, 4.61, 28432), "i0295": (2048, 512, 3.49, 600903),
    "i0296": (512, 1024, 20.83, 402718), "i0301": (2048, 4096, 17.04, 1969157),
}


@pytest.fixture(scope="module")
def dgxc() -> dict[str, PublishedRun]:
    return {run.id: run for run in load_independent_runs() if run.source_tag == DGXC}


def test_rows_and_their_layouts(dgxc: dict[str, PublishedRun]) -> None:
    assert sorted(dgxc) == [f"i{n:04d}" for n in range(242, 302)]
    shapes = {(run.model, run.layout.tp, run.layout.pp, run.layout.cp, run.layout.vpp)
              for run in dgxc.values()}
    assert shapes == {("Llama-3.1-8B", 1, 1, 2, 1), ("Llama-3.1-70B", 4, 4, 2, 5),
                      ("Llama-3.1-405B", 8, 9, 2, 7), ("Nemotron-4-15B", 4, 1, 1, 1),
                      ("Nemotron-4-340B", 8, 8, 1, 12), ("Grok-1", 4, 8, 2, 8)}
    # weak scaling: the gradient accumulation (micro-batches per replica) is the recipe's
    # at every size, the micro-batch 4 for Nemotron-4 15B and 1 otherwise
    per_replica = {"Llama-3.1-8B": (32, 8192), "Llama-3.1-70B": (64, 8192),
                   "Llama-3.1-405B": (63, 8192), "Nemotron-4-15B": (16, 4096),
                   "Nemotron-4-340B": (16, 4096), "Grok-1": (128, 8192)}
    for run in dgxc.values():
        dp = run.num_gpus // (run.layout.tp * run.layout.pp * run.layout.cp)
        assert (run.global_batch // dp, run.seq_len) == per_replica[run.model]


@pytest.mark.parametrize("run_id", sorted(PRINTED))
def test_throughput_is_the_printed_one(dgxc: dict[str, PublishedRun], run_id: str) -> None:
    gpus, gbs, step_s, tokens_per_s = PRINTED[run_id]
    run = dgxc[run_id]
    assert run.conversion == CONV_REPORTED and (run.num_gpus, run.global_batch) == (gpus, gbs)
    assert run.measured_tokens_per_s_per_gpu == pytest.approx(tokens_per_s / gpus, abs=0.06)
    # the printed step time agrees within its rounding (0.4% at 70B BF16 on 2,048 GPUs)
    assert run.measured_tokens_per_s_per_gpu == pytest.approx(
        gbs * run.seq_len / step_s / gpus, rel=5e-3)


def test_recipe_settings_reach_the_cost_options(dgxc: dict[str, PublishedRun]) -> None:
    def read(run_id: str):
        run = dgxc[run_id]
        readings = memory_saving_candidates(run)
        assert len(readings) == 1  # recompute and sharding stated: nothing is guessed
        return recipe_accounting(run, readings[0][0], CostOptions())

    training, options = read("i0258")  # 70B FP8: userbuffers TP overlap, delayed scaling
    assert options.tp_comm_overlap and options.fp8_recipe == "delayed"
    assert options.overlap_grad_reduce and options.overlap_param_gather
    assert options.grad_reduce_bytes == 2.0 and training.grad_bytes == 2.0
    # Apex distributed_fused_adam, bucket_cap_mb 75 of BF16 gradient-sync elements
    assert options.ddp_bucket_params == 75 * 1024 * 1024 // 2
    training, options = read("i0242")  # 8B BF16, TP1: nothing to overlap
    assert not options.tp_comm_overlap
    # Grok-1 runs Megatron-Core's distributed optimizer: its buckets grow with DP
    assert read("i0296")[1].ddp_bucket_params is None


def test_stack_is_the_nemo_24_09_one(dgxc: dict[str, PublishedRun]) -> None:
    assert {stack_of_source(run.source) for run in dgxc.values()} == {"mcore-0.9"}
    assert {run.release for run in dgxc.values()} == {(24, 9)}


@settings(max_examples=100, deadline=None)
@given(cells=st.lists(st.tuples(st.sampled_from((DGXC, MBRIDGE, MBRIDGE_HELDOUT)),
                                st.sampled_from(((24, 9), (25, 9), (26, 4), None))),
                      min_size=1, max_size=8))
def test_a_release_line_supersedes_only_its_own_source(
        dgxc: dict[str, PublishedRun], cells: list[tuple[str, tuple[int, ...] | None]]) -> None:
    """One model, GPU and precision measured by several sources: each source keeps its own
    newest line, whatever release another source published."""
    template = dgxc["i0267"]
    sample = [replace(template, id=f"x{i}", source_tag=tag, release=release)
              for i, (tag, release) in enumerate(cells)]
    kept = {run.id for run in current_releases(sample)}
    for run in sample:
        own = [other.release for other in sample
               if other.source_tag == run.source_tag and other.release is not None]
        newest = max(own, default=None)
        expected = run.release is None or run.release == newest
        assert (run.id in kept) == expected


def test_nemotron4_presets_match_the_published_sizes() -> None:
    """Nemotron-4 15B report (arXiv 2402.16819 §2): 3.2 billion embedding and 12.5 billion
    non-embedding parameters (input embedding and output layer untied); 340B report: 340B."""
    from parsearch.model.params import parameter_counts
    from parsearch.model.presets import get_preset

    small = parameter_counts(get_preset("nemotron4-15b"))
    embedding = small.embedding + small.output
    assert embedding / 1e9 == pytest.approx(3.2, abs=0.06)
    assert (small.total - embedding) / 1e9 == pytest.approx(12.5, abs=0.05)
    large = parameter_counts(get_preset("nemotron4-340b"))
    assert large.total / 1e9 == pytest.approx(340, rel=0.01)


def test_squared_relu_is_an_ungated_mlp_and_launches_as_such() -> None:
    from parsearch.launch.megatron_lm import model_args
    from parsearch.model.params import parameter_counts
    from parsearch.model.presets import get_preset

    model = get_preset("nemotron4-15b")
    # two matrices of h x f, not SwiGLU's three
    assert parameter_counts(model).dense_mlp_per_layer == 2 * 6144 * 24576
    args = model_args(model)
    assert "--squared-relu" in args and "--swiglu" not in args
    assert args[args.index("--normalization") + 1] == "LayerNorm"
    assert "--untie-embeddings-and-output-weights" in args


def test_nemotron4_340b_runs_at_its_published_settings_fit(dgxc: dict[str, PublishedRun]) -> None:
    """Issue 33: the Nemotron-4 340B recipe (TP8 PP8 VP12, MBS 1, selective recompute,
    Apex distributed fused Adam with ``dtype: bf16``) ran on 128 H100s; it must fit."""
    from parsearch.validation.published.runs import validate_runs

    runs = [run for run in dgxc.values() if run.model == "Nemotron-4-340B"]
    assert len(runs) == 10 and {run.model_source for run in runs} == {"preset:nemotron4-340b"}
    report = validate_runs(runs, deduplicate=False)
    assert {row.id for row in report.rows} == {run.id for run in runs}
    assert all(row.fits for row in report.rows)
    smallest = dgxc["i0286"]
    assert smallest.num_gpus == 128 and smallest.layout.recompute == "selective"
    readings = memory_saving_candidates(smallest)
    assert len(readings) == 1
    training, options = recipe_accounting(smallest, readings[0][0], CostOptions())
    assert options.bf16_moments and training.recompute_modules == ("core_attn",)


def test_grok1_experts_are_tensor_parallel_like_the_dense_layers(
        dgxc: dict[str, PublishedRun]) -> None:
    """NeMo 24.09's Megatron-Core predates expert_tensor_parallel_size (NVIDIA/Megatron-LM
    7f22e210cd, 2024-11-23, "MoE parallel folding"): its experts take the model's TP, so
    the Grok-1 rows read ETP 4 beside TP 4, EP 8; pad-to-capacity at factor 1.0."""
    grok = [run for run in dgxc.values() if run.model == "Grok-1"]
    assert len(grok) == 6 and {run.model_source for run in grok} == {"preset:grok-1"}
    assert {(run.layout.tp, run.layout.ep, run.layout.etp) for run in grok} == {(4, 8, 4)}
    readings = memory_saving_candidates(grok[0])
    _, options = recipe_accounting(grok[0], readings[0][0], CostOptions())
    assert options.moe_dispatcher == "alltoall" and not options.moe_a2a_overlap
    assert options.moe_capacity_factor == 1.0 and options.moe_pad_to_capacity
