"""A pinned ``--moe-a2a-overlap`` on layouts Megatron cannot run it on: the rest of the setup
is still searched (not reset to the alltoall dispatcher), and the output says so."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from parsearch.cost.analytic import build_cost_model, estimate
from parsearch.cost.ep_overlap import (
    a2a_schedulable,
    pinned_feature_flags,
)
from parsearch.cost.options import SEARCHABLE_FEATURES, CostOptions
from parsearch.layout import Layout
from parsearch.model.presets import get_preset
from parsearch.model.specs import RECOMPUTE_CODES, TrainingSpec
from parsearch.topology.cluster import load_cluster
from parsearch.topology.fabric import build_fabric
from tests.cli_helpers import run_cli

PINNED = CostOptions(moe_a2a_overlap=True,
                     search_features=tuple(f for f in SEARCHABLE_FEATURES
                                           if f != "moe_a2a_overlap"))


@settings(max_examples=60, deadline=None)
@given(ep=st.sampled_from([1, 2, 8]), pp=st.sampled_from([1, 2, 4]),
       vpp=st.sampled_from([1, 2]), recompute=st.sampled_from(["none", "selective", "full"]),
       pinned=st.booleans())
def test_the_note_names_exactly_the_layouts_megatron_refuses(ep: int, pp: int, vpp: int,
                                                             recompute: str,
                                                             pinned: bool) -> None:
    options = PINNED if pinned else replace(PINNED, moe_a2a_overlap=False)
    cols = {"ep": np.array([ep]), "pp": np.array([pp]), "vpp": np.array([vpp]),
            "recompute": np.array([RECOMPUTE_CODES[recompute]])}
    lay = Layout(num_gpus=64, tp=1, pp=pp, vpp=vpp, ep=ep, mbs=1, recompute=recompute)
    notes = pinned_feature_flags(get_preset("qwen3-30b-a3b"), options, lay)
    runs = bool(a2a_schedulable(cols)[0])
    assert bool(notes) == (pinned and not runs)
    assert all("--moe-a2a-overlap" in note for note in notes)


def _case() -> tuple[object, TrainingSpec, object]:
    model = get_preset("qwen3-30b-a3b")
    training = TrainingSpec(seq_len=4096, global_batch=256)
    return model, training, build_fabric(load_cluster("dgx-h100"), 32)


@pytest.mark.parametrize("vpp", [1, 2])
def test_pinning_the_overlap_changes_nothing_where_it_cannot_run(vpp: int) -> None:
    """pp 2 without interleaving: the pinned run is priced exactly as the unpinned search
    prices it (same dispatcher, same step), and says why; interleaved, it runs the overlap."""
    model, training, fabric = _case()
    lay = Layout(num_gpus=32, tp=1, pp=2, vpp=vpp, ep=8, mbs=1)
    searched = CostOptions(search_features=SEARCHABLE_FEATURES)
    pinned = estimate(build_cost_model(model, training, fabric, options=PINNED), lay)
    free = estimate(build_cost_model(model, training, fabric, options=searched), lay)
    assert pinned.options is not None
    notes = pinned_feature_flags(model, PINNED, lay)
    if vpp == 1:
        assert not pinned.options.moe_a2a_overlap
        assert pinned.step_time_s == pytest.approx(free.step_time_s, rel=1e-12)
        assert pinned.options.moe_dispatcher == free.options.moe_dispatcher  # type: ignore[union-attr]
        assert len(notes) == 1 and "vpp = 1" in notes[0]
    else:
        assert pinned.options.moe_a2a_overlap
        assert notes == []


def test_cli_says_which_listed_layouts_run_without_the_pinned_overlap() -> None:
    args = ("--model", "qwen3-30b-a3b", "--cluster", "dgx-h100", "--gpus", "32",
            "--global-batch", "256", "--seq-len", "4096", "--moe-a2a-overlap")
    explained = run_cli("explain", *args, "--layout", "pp=2,ep=8,mbs=1")
    assert explained.code == 0, explained.err
    assert "note: --moe-a2a-overlap is not run here" in explained.out
    assert "EP all-to-all overlap" not in explained.out.split("priced with:")[1].split("\n")[0]
    interleaved = run_cli("explain", *args, "--layout", "pp=2,vpp=2,ep=8,mbs=1")
    assert interleaved.code == 0, interleaved.err
    assert "--moe-a2a-overlap is not run here" not in interleaved.out
    found = run_cli("search", *args, "--top", "40", "--format", "json")
    assert found.code == 0, found.err
    import json

    seen = set()
    for entry in json.loads(found.out)["results"]:
        lay = entry["layout"]
        runs = lay["ep"] > 1 and lay["recompute"] != "full" and (lay["pp"] == 1 or lay["vpp"] > 1)
        dropped = any("--moe-a2a-overlap is not run here" in f for f in entry["flags"])
        assert dropped == (not runs)
        assert ("EP all-to-all overlap" in entry["priced_features"]) == runs
        seen.add(runs)
    assert seen == {True, False}, "the top 40 hold layouts of both kinds"
    launched = run_cli("search", *args, "--top", "40", "--launch")
    assert launched.code == 0, launched.err
    assert "# note: --moe-a2a-overlap is not run here" in launched.out


def test_pareto_names_the_front_points_that_run_without_the_pinned_overlap() -> None:
    import json

    args = ("pareto", "--model", "qwen3-30b-a3b", "--cluster", "dgx-h100", "--max-gpus", "128",
            "--global-batch", "512", "--seq-len", "4096", "--moe-a2a-overlap")
    found = run_cli(*args, "--format", "json")
    assert found.code == 0, found.err
    seen = set()
    for point in json.loads(found.out)["front"]:
        lay = point["layout"]
        runs = lay["ep"] > 1 and lay["recompute"] != "full" and (lay["pp"] == 1 or lay["vpp"] > 1)
        assert any("--moe-a2a-overlap is not run here" in f for f in point["flags"]) == (not runs)
        seen.add(runs)
    assert False in seen, "some front point cannot run the overlap"
    table = run_cli(*args)
    assert table.code == 0, table.err
    assert "GPUs): --moe-a2a-overlap is not run here" in table.out
