"""Non-dominated sorting, hypervolume, and the exhaustive front (the oracle)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from parsearch.errors import SpecError
from parsearch.model.specs import ModelSpec, MoeSpec, TrainingSpec
from parsearch.search import pareto_front, search_layouts
from parsearch.search.pareto import dominates, hypervolume, pareto_front_indices, pareto_mask

points_2d = st.lists(st.tuples(st.integers(1, 20), st.integers(0, 20)), min_size=1, max_size=25)

# A small model and setup that keep the search fast.
TOY = ModelSpec("toy-1b", 16, 2048, 8192, 16, 8, 128, 32000)
SETUP = TrainingSpec(seq_len=4096, global_batch=64, micro_batch_sizes=(1, 2),
                     recompute_modes=("none", "full"))
CLUSTER = "dgx-h100"


@settings(max_examples=60, deadline=None)
@given(points_2d)
def test_mask_matches_brute_force(points: list[tuple[int, int]]) -> None:
    values = np.array(points, dtype=float)
    mask = pareto_mask(values, minimize=(True, False))
    for i, p in enumerate(points):
        dominated = any(dominates(q, p, minimize=(True, False)) for q in points)
        duplicate_before = any(points[j] == p for j in range(i))
        assert mask[i] == (not dominated and not duplicate_before)


@settings(max_examples=40, deadline=None)
@given(points_2d)
def test_hypervolume_matches_unit_cell_count(points: list[tuple[int, int]]) -> None:
    values = np.array(points, dtype=float)
    ref = (21.0, 0.0)
    cells = sum(
        1 for x, y in itertools.product(range(1, 21), range(0, 20))
        if any(px <= x and py >= y + 1 for px, py in points)
    )
    assert hypervolume(values, reference=ref, minimize=(True, False)) == pytest.approx(cells)


def test_front_indices_sorted_and_errors() -> None:
    values = np.array([[16, 3.0], [8, 2.0], [16, 1.0]])
    assert pareto_front_indices(values, minimize=(True, False)).tolist() == [1, 0]
    with pytest.raises(SpecError, match=r"\(n, 2\)"):
        pareto_mask(np.zeros((3, 3)))
    assert hypervolume(np.array([[30.0, 1.0]]), reference=(20.0, 0.0),
                       minimize=(True, False)) == 0.0


@pytest.fixture(scope="module")
def exact():  # type: ignore[no-untyped-def]
    return pareto_front(model=TOY, training=SETUP, cluster=CLUSTER, max_gpus=48,
                        method="exhaustive")


def test_exhaustive_front_is_non_dominated(exact) -> None:  # type: ignore[no-untyped-def]
    front = exact.front
    assert front, "the toy model fits somewhere"
    assert [p.num_gpus for p in front] == sorted(p.num_gpus for p in front)
    for a, b in itertools.permutations(front, 2):
        assert not dominates((a.num_gpus, a.tokens_per_s), (b.num_gpus, b.tokens_per_s),
                             minimize=(True, False))
    # throughput strictly increases along the front
    tokens = [p.tokens_per_s for p in front]
    assert all(x < y for x, y in itertools.pairwise(tokens))
    # every point off the front is dominated by a front point
    for p in exact.points:
        if not p.on_front:
            assert any(dominates((f.num_gpus, f.tokens_per_s), (p.num_gpus, p.tokens_per_s),
                                 minimize=(True, False)) for f in front)


def test_exhaustive_front_has_best_layout_at_every_gpu_count(exact) -> None:  # type: ignore[no-untyped-def]
    assert exact.gpu_counts == (8, 16, 24, 32, 40, 48)
    by_count = {p.num_gpus: p for p in exact.points}
    for n in exact.gpu_counts:
        # the front holds the fastest layout: the fastest of search's whole list
        result = search_layouts(model=TOY, training=SETUP, cluster=CLUSTER, num_gpus=n,
                                top=100_000)
        if result.best is None:
            assert n not in by_count
            continue
        fastest = max(result.entries, key=lambda e: e.estimate.tokens_per_s)
        assert by_count[n].tokens_per_s == pytest.approx(fastest.estimate.tokens_per_s)
        assert by_count[n].layout in [e.layout for e in result.entries
                                      if e.estimate.tokens_per_s == fastest.estimate.tokens_per_s]


def test_scaling_efficiency_against_smallest_point(exact) -> None:  # type: ignore[no-untyped-def]
    base = exact.front[0]
    assert base.scaling_efficiency == pytest.approx(1.0)
    for p in exact.front:
        expected = (p.tokens_per_s / p.num_gpus) / (base.tokens_per_s / base.num_gpus)
        assert p.scaling_efficiency == pytest.approx(expected)
        assert p.speedup == pytest.approx(p.tokens_per_s / base.tokens_per_s)


def test_pareto_result_dict_and_argument_checks(exact) -> None:  # type: ignore[no-untyped-def]
    doc = exact.to_dict()
    assert doc["method"] == "exhaustive"
    assert [f["num_gpus"] for f in doc["front"]] == sorted(f["num_gpus"] for f in doc["front"])
    for entry in doc["front"]:
        assert {"num_gpus", "tokens_per_s", "layout", "scaling_efficiency"} <= entry.keys()
    assert doc["considered"] >= doc["valid"] >= doc["feasible"] > 0
    with pytest.raises(SpecError, match="--max-gpus 4 is below --min-gpus 8"):
        pareto_front(model=TOY, training=SETUP, cluster=CLUSTER, max_gpus=4)
    with pytest.raises(SpecError, match="--method must be one of"):
        pareto_front(model=TOY, training=SETUP, cluster=CLUSTER, max_gpus=8, method="grid")


def _oracle_front(model: ModelSpec, training: TrainingSpec, cluster: str,
                  counts: tuple[int, ...]) -> dict[int, float]:
    """Best tokens/s at every GPU count by scoring every valid layout (no bounds)."""
    from parsearch.cost.analytic import build_cost_model
    from parsearch.layout.space import enumerate_layouts
    from parsearch.search.exhaustive import scan_table
    from parsearch.topology.cluster import load_cluster
    from parsearch.topology.fabric import build_fabric

    best: dict[int, float] = {}
    for n in counts:
        table = enumerate_layouts(model, training, n)
        if not len(table):
            continue
        cm = build_cost_model(model, training, build_fabric(load_cluster(cluster), n))
        scan = scan_table(cm, table)
        if scan.feasible:
            best[n] = float(scan.tokens_per_s.max())
    return best


MOE_TOY = ModelSpec("toy-moe", 12, 1024, 4096, 16, 8, 64, 32000,
                    moe=MoeSpec(num_experts=8, top_k=2, expert_ffn_hidden_size=1024))


@pytest.mark.parametrize("model", [TOY, MOE_TOY], ids=["dense", "moe"])
def test_every_method_front_is_near_exact_and_undominated(model: ModelSpec) -> None:
    """Spaces small enough to scan: exact points equal the oracle's; every method's front
    reaches >= 99% of the exact hypervolume and holds no point another point dominates."""
    query = {"model": model, "training": SETUP, "cluster": CLUSTER, "max_gpus": 48}
    exact = pareto_front(**query, method="exhaustive")
    oracle = _oracle_front(model, SETUP, CLUSTER, exact.gpu_counts)
    assert {p.num_gpus: p.tokens_per_s for p in exact.points} == pytest.approx(oracle, rel=1e-12)
    assert exact.exact and exact.to_dict()["exact"] is True
    runs = {"exhaustive": exact, "auto": pareto_front(**query, method="auto"),
            "optuna": pareto_front(**query, method="optuna", n_trials=300, seed=0)}
    assert runs["auto"].method == "exhaustive" and runs["auto"].exact
    assert not runs["optuna"].exact and 0 < runs["optuna"].coverage <= 1
    for name, res in runs.items():
        assert res.hypervolume >= 0.99 * exact.hypervolume, name
        for f in res.front:  # no front point is dominated by another evaluated point
            assert not any(dominates((q.num_gpus, q.tokens_per_s), (f.num_gpus, f.tokens_per_s),
                                     minimize=(True, False)) for q in res.points), name
        for p in res.points:  # nothing beats the exact best of a GPU count
            assert p.tokens_per_s <= oracle[p.num_gpus] * (1 + 1e-12), name
    # the optuna front holds the exact answers where it was seeded
    seeded = runs["optuna"].study["seeded_exact"]
    assert seeded and all({p.num_gpus: p.tokens_per_s for p in runs["optuna"].points}[n]
                          == pytest.approx(oracle[n], rel=1e-12) for n in seeded)


def test_auto_says_when_it_is_not_exact() -> None:
    res = pareto_front(model=TOY, training=SETUP, cluster=CLUSTER, max_gpus=16, method="auto",
                       exhaustive_limit=1, n_trials=20, seed=0)
    doc = res.to_dict()
    assert doc["method"] == "optuna" and doc["exact"] is False
    assert "exhaustive-limit" in doc["note"] and 0 < doc["coverage"] <= 1
