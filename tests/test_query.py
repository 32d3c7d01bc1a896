"""The query object: what search, pareto, serve and a sweep cell are asked, in one value."""

from __future__ import annotations

import dataclasses

import pytest

from parsearch.cost.efficiency import efficiency_for_gpu
from parsearch.cost.options import CostOptions
from parsearch.errors import SpecError
from parsearch.model.presets import get_preset
from parsearch.model.specs import TrainingSpec
from parsearch.query import Query
from parsearch.search.api import pareto_front, search_layouts
from parsearch.serve import ServingWorkload, serve_layouts
from parsearch.sweep.cells import CellSolver
from parsearch.sweep.grid import grid_from
from parsearch.topology.cluster import load_cluster

TRAINING = TrainingSpec(seq_len=2048, global_batch=64, micro_batch_sizes=(1, 2))


def test_query_is_a_frozen_value_with_clusters_as_a_tuple() -> None:
    q = Query("llama3-8b", TRAINING, "dgx-h100")
    assert q.clusters == ("dgx-h100",) and q.cluster == "dgx-h100"
    assert Query("llama3-8b", TRAINING, ["dgx-h100", "dgx-a100"]).clusters == (
        "dgx-h100", "dgx-a100")
    spec = load_cluster("dgx-h100")
    assert Query("llama3-8b", TRAINING, spec).clusters == (spec,)
    assert q == Query("llama3-8b", TRAINING, ("dgx-h100",))
    with pytest.raises(dataclasses.FrozenInstanceError):
        q.model = "llama3-70b"  # type: ignore[misc]
    with pytest.raises(SpecError, match="one cluster"):
        _ = Query("llama3-8b", TRAINING, ["dgx-h100", "dgx-a100"]).cluster
    with pytest.raises(SpecError, match="sequence"):
        Query("llama3-8b", TRAINING, 3)  # type: ignore[arg-type]
    with pytest.raises(SpecError, match="training setup"):
        Query("llama3-8b", None, "dgx-h100").require_training("search_layouts")


def test_of_builds_from_the_old_keywords_and_refuses_both_or_unknown() -> None:
    q = Query("llama3-8b", TRAINING, "dgx-h100")
    assert Query.of(q, {}, "f") is q
    assert Query.of(None, {"query": q}, "f") is q
    built = Query.of(None, {"model": "llama3-8b", "training": TRAINING,
                            "cluster": "dgx-h100"}, "f")
    assert built == q
    served = Query.of(None, {"model": "llama3-8b", "cluster": "dgx-h100",
                             "efficiency": "hopper"}, "f")
    assert served.profile is not None and served.profile.name == "hopper"
    with pytest.raises(TypeError, match="not both"):
        Query.of(q, {"model": "llama3-8b"}, "f")
    with pytest.raises(TypeError, match="unexpected keyword argument 'modle'"):
        Query.of(None, {"modle": "llama3-8b"}, "f")
    with pytest.raises(TypeError, match="needs a Query"):
        Query.of(None, {}, "f")
    with pytest.raises(TypeError, match="must be a Query"):
        Query.of("llama3-8b", {}, "f")  # type: ignore[arg-type]


def test_search_and_pareto_answer_the_same_with_a_query_or_keywords() -> None:
    options = CostOptions(memory_margin=0.2)
    profile = efficiency_for_gpu("h100-sxm")
    q = Query("llama3-8b", TRAINING, "dgx-h100", options=options, profile=profile)
    new = search_layouts(q, num_gpus=16, top=4)
    old = search_layouts(model="llama3-8b", training=TRAINING, cluster="dgx-h100",
                         options=options, profile=profile, num_gpus=16, top=4)
    assert new.entries and [e.layout for e in new.entries] == [e.layout for e in old.entries]
    assert [e.estimate.tokens_per_s for e in new.entries] == [
        e.estimate.tokens_per_s for e in old.entries]
    front = pareto_front(Query("llama3-8b", TRAINING, ["dgx-h100", "dgx-a100"]), max_gpus=16)
    before = pareto_front(model="llama3-8b", training=TRAINING,
                          cluster=["dgx-h100", "dgx-a100"], max_gpus=16)
    assert [(p.cluster, p.num_gpus, p.tokens_per_s) for p in front.points] == [
        (p.cluster, p.num_gpus, p.tokens_per_s) for p in before.points]
    with pytest.raises(SpecError, match="training setup"):
        search_layouts(Query("llama3-8b", None, "dgx-h100"), num_gpus=8)
    with pytest.raises(TypeError, match="not both"):
        search_layouts(q, num_gpus=8, model="llama3-8b")


def test_serve_takes_a_query_without_training() -> None:
    workload = ServingWorkload(isl=1000, osl=200, tpot_ms=50)
    model = get_preset("llama3-8b")
    new = serve_layouts(Query(model, clusters="dgx-h100"), num_gpus=8, workload=workload,
                        top=3)
    old = serve_layouts(model=model, cluster="dgx-h100", num_gpus=8, workload=workload, top=3)
    assert [e.estimate.layout for e in new.entries] == [e.estimate.layout for e in old.entries]
    by_name = serve_layouts(Query("llama3-8b", clusters="dgx-h100"), num_gpus=8,
                            workload=workload, top=3)
    assert [e.estimate.tokens_per_s for e in by_name.entries] == [
        e.estimate.tokens_per_s for e in new.entries]


def test_a_sweep_cell_is_asked_as_a_query() -> None:
    grid = grid_from({"models": ["llama3-8b"], "clusters": ["dgx-h100"], "gpus": [8],
                      "global_batch": [64], "seq_len": [2048]})
    solver = CellSolver(grid)
    cell = grid.cells()[0]
    query = solver.query(cell)
    assert query.cluster == solver.cluster("dgx-h100")
    assert query.training == solver.training(cell)
    assert query.options is not None and query.options.search_features
    answer = solver.solve(cell)
    best = search_layouts(query, num_gpus=8, top=grid.top).best
    assert answer["status"] == "ok" and best is not None
    assert answer["layout"] == best.layout.key()
