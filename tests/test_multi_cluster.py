"""Pareto fronts over several clusters: exhaustive oracle, optuna study, CLI and plots."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import optuna
import pytest

from parsearch.errors import SpecError
from parsearch.layout.rules import check_layout
from parsearch.layout.space import enumerate_layouts
from parsearch.model.specs import ModelSpec, TrainingSpec
from parsearch.search import pareto_front, pareto_mask
from parsearch.search.arguments import gpu_counts_by_cluster
from parsearch.search.optuna_search import run_study
from parsearch.search.plot import html_page
from parsearch.search.results import ParetoResult
from parsearch.topology.cluster import ClusterSpec, load_cluster
from parsearch.topology.hardware import load_gpu_profile
from tests.cli_helpers import assert_one_line_error, run_cli

TOY = ModelSpec("toy-1b", 16, 2048, 8192, 16, 8, 128, 32000)
SETUP = TrainingSpec(seq_len=4096, global_batch=64, micro_batch_sizes=(1, 2),
                     recompute_modes=("none", "full"))
H100 = load_cluster("dgx-h100")
# GB200 capped at 16 GPUs (a cluster with max_gpus): 4-GPU nodes, faster per GPU.
GB200_16 = replace(load_cluster("gb200-nvl72"), max_gpus=16)
CLI_COMMON = ("--model", "llama3-8b", "--global-batch", "64", "--seq-len", "4096",
              "--micro-batch-sizes", "1", "--recompute", "selective", "--no-progress")


@pytest.fixture(scope="module")
def exact() -> ParetoResult:
    return pareto_front(model=TOY, training=SETUP, cluster=[H100, GB200_16], max_gpus=32,
                        method="exhaustive")


def _triples(points: object) -> list[tuple[str | None, int, float]]:
    return [(p.cluster, p.num_gpus, p.tokens_per_s) for p in points]  # type: ignore[attr-defined]


def test_counts_respect_each_clusters_node_size_and_max_gpus() -> None:
    counts = gpu_counts_by_cluster(clusters=[H100, GB200_16], max_gpus=32)
    assert counts == {"dgx-h100": (8, 16, 24, 32), "gb200-nvl72": (4, 8, 12, 16)}
    with pytest.raises(SpecError, match="gb200-nvl72 supports at most 16"):
        gpu_counts_by_cluster(clusters=[H100, GB200_16], max_gpus=32, min_gpus=20)


def test_exhaustive_front_is_the_union_of_cluster_fronts(exact: ParetoResult) -> None:
    singles = {
        "dgx-h100": pareto_front(model=TOY, training=SETUP, cluster=H100, max_gpus=32,
                                 method="exhaustive"),
        "gb200-nvl72": pareto_front(model=TOY, training=SETUP, cluster=GB200_16, max_gpus=16,
                                    method="exhaustive"),
    }
    assert exact.clusters == ("dgx-h100", "gb200-nvl72") and exact.multi_cluster
    # each cluster's own front is the single-cluster exhaustive front
    for name, single in singles.items():
        part = exact.by_cluster[name]
        assert [(p.num_gpus, p.tokens_per_s) for p in part.front] == \
            [(p.num_gpus, p.tokens_per_s) for p in single.front]
        assert {p.cluster for p in part.points} == {name}
    # the overall front: the best points of all clusters reduced to the non-dominated ones
    union = [(name, p.num_gpus, p.tokens_per_s) for name, single in singles.items()
             for p in single.points]
    mask = pareto_mask(np.array([[n, t] for _, n, t in union]), minimize=(True, False))
    expected = sorted((u for u, keep in zip(union, mask, strict=True) if keep),
                      key=lambda u: u[1])
    assert _triples(exact.front) == expected
    assert exact.valid == sum(s.valid for s in singles.values())
    assert exact.gpu_counts == (4, 8, 12, 16, 24, 32)


def test_overall_front_answers_which_cluster_and_how_many_gpus() -> None:
    gb200_8 = replace(GB200_16, max_gpus=8)
    result = pareto_front(model=TOY, training=SETUP, cluster=[H100, gb200_8], max_gpus=32,
                          method="exhaustive")
    # GB200 is faster per GPU but stops at 8; beyond, only more H100s add throughput
    front = [(p.cluster, p.num_gpus) for p in result.front]
    assert front[:2] == [("gb200-nvl72", 4), ("gb200-nvl72", 8)]
    assert front[-1] == ("dgx-h100", 32)
    assert all(cluster == "dgx-h100" for cluster, gpus in front if gpus > 8)
    tokens = [p.tokens_per_s for p in result.front]
    assert tokens == sorted(tokens) and len(set(tokens)) == len(tokens)  # non-dominated
    assert result.front[0].speedup == 1.0
    assert result.front[-1].speedup == pytest.approx(
        result.front[-1].tokens_per_s / result.front[0].tokens_per_s)


def test_every_point_is_valid_and_fits_on_its_cluster(exact: ParetoResult) -> None:
    clusters: dict[str, ClusterSpec] = {"dgx-h100": H100, "gb200-nvl72": GB200_16}
    for p in exact.points:
        assert p.cluster is not None
        cluster = clusters[p.cluster]
        assert check_layout(TOY, SETUP, p.layout) == []
        assert p.num_gpus % cluster.gpus_per_node == 0
        assert cluster.max_gpus is None or p.num_gpus <= cluster.max_gpus
        assert p.estimate.fits
        assert p.estimate.memory_bytes["total"] <= load_gpu_profile(cluster.gpu).hbm_bytes
        assert p.launch.nodes * cluster.gpus_per_node == p.num_gpus


def test_optuna_reaches_the_exact_hypervolume(exact: ParetoResult) -> None:
    result = pareto_front(model=TOY, training=SETUP, cluster=[H100, GB200_16], max_gpus=32,
                          method="optuna", n_trials=600, seed=0)
    assert result.hypervolume_reference == exact.hypervolume_reference
    ratio = result.hypervolume / exact.hypervolume
    print(f"optuna/exact hypervolume over two clusters: {ratio:.4f}")
    assert ratio >= 0.95
    best = {(p.cluster, p.num_gpus): p.tokens_per_s for p in exact.points}
    for p in result.points:
        assert check_layout(TOY, SETUP, p.layout) == [] and p.estimate.fits
        assert p.tokens_per_s <= best[(p.cluster, p.num_gpus)] * (1 + 1e-9)
    assert result.study is not None and result.study["clusters"] == ["dgx-h100", "gb200-nvl72"]


def test_study_has_a_cluster_axis_and_refuses_another_cluster_list(tmp_path: Path) -> None:
    storage = f"journal:{tmp_path / 'study.log'}"
    counts = gpu_counts_by_cluster(clusters=[H100, GB200_16], max_gpus=32)
    outcome = run_study(model=TOY, training=SETUP, cluster=[H100, GB200_16],
                        gpu_counts=counts, n_trials=64, seed=0, storage=storage,
                        study_name="multi")
    assert outcome.enqueued > 0
    assert {r.cluster for r in outcome.records} == {"dgx-h100", "gb200-nvl72"}
    study = optuna.load_study(study_name="multi", storage=optuna.storages.JournalStorage(
        optuna.storages.journal.JournalFileBackend(str(tmp_path / "study.log"))))
    for trial in study.get_trials(states=(optuna.trial.TrialState.COMPLETE,)):
        allowed = trial.params["num_gpus"] in counts[trial.params["cluster"]]
        assert (trial.constraints["gpus"] == 0) == allowed
        assert trial.user_attrs["cache_key"].startswith(trial.params["cluster"] + "/")
        if not allowed:
            assert trial.values[0] == 0.0 and not trial.user_attrs["valid"]
    with pytest.raises(SpecError, match="created for another query"):
        run_study(model=TOY, training=SETUP, cluster=[GB200_16, H100], gpu_counts=counts,
                  n_trials=64, storage=storage, study_name="multi")


def test_auto_counts_the_layouts_of_every_cluster_and_count() -> None:
    counts = gpu_counts_by_cluster(clusters=[H100, GB200_16], max_gpus=16)
    total = sum(len(enumerate_layouts(TOY, SETUP, n)) for c in counts.values() for n in c)
    common = {"model": TOY, "training": SETUP, "cluster": [H100, GB200_16], "max_gpus": 16}
    assert pareto_front(**common, method="auto", exhaustive_limit=total).method == "exhaustive"
    assert pareto_front(**common, method="auto", exhaustive_limit=total - 1,
                        n_trials=20, seed=0).method == "optuna"


def test_cluster_argument_checks() -> None:
    with pytest.raises(SpecError, match="at least one cluster"):
        pareto_front(model=TOY, training=SETUP, cluster=[], max_gpus=16)
    with pytest.raises(SpecError, match="dgx-h100 twice"):
        pareto_front(model=TOY, training=SETUP, cluster=["dgx-h100", H100], max_gpus=16)
    with pytest.raises(SpecError, match="cluster must be"):
        pareto_front(model=TOY, training=SETUP, cluster=42, max_gpus=16)  # type: ignore[arg-type]
    one = pareto_front(model=TOY, training=SETUP, cluster=["dgx-h100"], max_gpus=16)
    assert not one.multi_cluster and all(p.cluster is None for p in one.points)


def test_cli_several_clusters_json_and_plots(tmp_path: Path) -> None:
    png, page = tmp_path / "front.png", tmp_path / "front.html"
    result = run_cli("pareto", *CLI_COMMON, "--cluster", "dgx-h100,gb200-nvl72",
                     "--max-gpus", "16", "--format", "json", "--plot", str(png))
    assert result.code == 0, result.err
    doc = json.loads(result.out)
    assert doc["query"]["clusters"] == ["dgx-h100", "gb200-nvl72"]
    assert doc["front"] and all(p["cluster"] in doc["query"]["clusters"] for p in doc["front"])
    assert all("cluster" in p for p in doc["points"])
    assert {p["cluster"] for p in doc["points"]} == {"dgx-h100", "gb200-nvl72"}
    assert list(doc["by_cluster"]) == ["dgx-h100", "gb200-nvl72"]
    assert doc["by_cluster"]["gb200-nvl72"]["gpu_counts"] == [4, 8, 12, 16]
    assert doc["by_cluster"]["dgx-h100"]["gpu_counts"] == [8, 16]
    for part in doc["by_cluster"].values():
        assert all(p["cluster"] == part["query"]["cluster"] for p in part["front"])
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    table = run_cli("pareto", *CLI_COMMON, "--cluster", "dgx-h100,gb200-nvl72",
                    "--max-gpus", "16", "--plot", str(page))
    assert table.code == 0, table.err
    assert table.out.splitlines()[0].split()[:2] == ["cluster", "gpus"]
    assert "front on dgx-h100:" in table.out and "front on gb200-nvl72:" in table.out
    text = page.read_text()
    assert "<svg" in text and "dgx-h100" in text and "gb200-nvl72" in text
    assert "stroke-dasharray" in text  # the overall front


def test_cli_several_clusters_errors() -> None:
    assert_one_line_error(run_cli("pareto", *CLI_COMMON, "--cluster", "dgx-h100,dgx-h999",
                                  "--max-gpus", "16"), "unknown cluster 'dgx-h999'")
    assert_one_line_error(run_cli("pareto", *CLI_COMMON, "--cluster", "dgx-h100,,dgx-a100",
                                  "--max-gpus", "16"), "empty name")
    assert_one_line_error(run_cli("pareto", *CLI_COMMON, "--cluster", "dgx-h100,dgx-h100",
                                  "--max-gpus", "16"), "dgx-h100 twice")


def test_single_cluster_json_has_no_cluster_keys() -> None:
    result = run_cli("pareto", *CLI_COMMON, "--cluster", "dgx-h100", "--max-gpus", "16",
                     "--format", "json")
    assert result.code == 0, result.err
    doc = json.loads(result.out)
    assert set(doc) == {"query", "method", "considered", "valid", "feasible", "evaluations",
                        "front", "points", "hypervolume", "hypervolume_reference",
                        "elapsed_s", "exact", "examined", "pruned"}
    assert doc["query"]["cluster"] == "dgx-h100" and "clusters" not in doc["query"]
    assert all("cluster" not in p for p in doc["front"] + doc["points"])


def test_html_page_of_one_cluster_keeps_its_single_series() -> None:
    single = pareto_front(model=TOY, training=SETUP, cluster=H100, max_gpus=16)
    text = html_page(single)
    assert "stroke-dasharray" not in text and "<th>cluster</th>" not in text
