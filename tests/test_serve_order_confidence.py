"""How sure a serving ranking is: the shipped order-confidence table, the tie band it
implies, and the ties ``parsearch serve`` marks with it."""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from parsearch.query import Query
from parsearch.serve.api import serve_layouts, ties_with_best
from parsearch.serve.confidence import (
    GapBin,
    OrderConfidence,
    band_from_bins,
    load_order_confidence,
    monotone_shares,
)
from parsearch.serve.spec import ServingWorkload
from tests.cli_helpers import error_reading, run_cli

_SHIPPED = load_order_confidence()


def test_shipped_band_follows_its_own_rule_and_data() -> None:
    # the band is the smallest edge from which every bin kept the order in min_right of
    # its pairs; the bins under it hold a bin that did not
    assert _SHIPPED.tie_band == band_from_bins(_SHIPPED.bins, _SHIPPED.min_right)
    above = [b for b in _SHIPPED.bins if b.gap >= _SHIPPED.tie_band and b.pairs]
    below = [b for b in _SHIPPED.bins if b.gap < _SHIPPED.tie_band and b.pairs]
    assert above and all(b.right >= _SHIPPED.min_right for b in above)
    assert below and below[-1].right < _SHIPPED.min_right
    assert _SHIPPED.measured[:4].isdigit() and "held-out" in _SHIPPED.source


_bins = st.lists(st.tuples(st.integers(0, 40), st.floats(0.0, 1.0)), min_size=1, max_size=8)


@given(_bins, st.floats(0.5, 1.0))
def test_band_from_bins_is_the_smallest_edge_above_every_miss(raw: list[tuple[int, float]],
                                                              min_right: float) -> None:
    bins = [GapBin(0.05 * i, n, round(n * r)) for i, (n, r) in enumerate(raw)]
    band = band_from_bins(bins, min_right)
    assert band in {b.gap for b in bins}
    misses = [b.gap for b in bins if b.pairs and b.right < min_right]
    if not misses:
        assert band == 0.0
    elif misses[-1] == bins[-1].gap:
        assert band == bins[-1].gap  # no bin kept the order from the last miss on
    else:
        assert band == min(b.gap for b in bins if b.gap > misses[-1])


_throughputs = st.lists(st.floats(1.0, 1e5, allow_nan=False), min_size=1, max_size=12)


@given(_throughputs)
def test_ties_are_exactly_the_layouts_inside_the_band(values: list[float]) -> None:
    ranked = [SimpleNamespace(tokens_per_s=v) for v in sorted(values, reverse=True)]
    tied, sure = ties_with_best(ranked, _SHIPPED)  # type: ignore[arg-type]
    best = ranked[0].tokens_per_s
    inside = [math.log(best / e.tokens_per_s) < _SHIPPED.tie_band for e in ranked]
    if sum(inside) > 1:
        assert tied == inside
    else:
        assert not any(tied)  # a best alone is not a tie
    assert sure[0] is None
    for e, share in zip(ranked[1:], sure[1:], strict=True):
        assert share == _SHIPPED.right_share(math.log(best / e.tokens_per_s))


def _close_question(top: int) -> object:
    w = ServingWorkload(isl=922, osl=922, precision="fp4", kv_precision="fp8", concurrency=4,
                        engine="sglang")
    return serve_layouts(Query("deepseek-v3", clusters="dgx-b200"), num_gpus=4, workload=w,
                         top=top)


@settings(max_examples=4, deadline=None)
@given(st.integers(1, 8))
def test_ties_and_order_do_not_depend_on_top(top: int) -> None:
    full, cut = _close_question(10), _close_question(top)
    head = [(e.estimate.layout, e.tied, e.order_confidence) for e in full.entries[:top]]
    assert [(e.estimate.layout, e.tied, e.order_confidence) for e in cut.entries] == head


def test_a_close_question_is_marked_and_a_rate_question_is_not() -> None:
    r = _close_question(8)
    best = r.entries[0].estimate.tokens_per_s
    assert r.entries[0].tied and r.tie_note.startswith("~ tie")
    for e in r.entries:
        assert e.tied == (math.log(best / e.estimate.tokens_per_s) < _SHIPPED.tie_band)
    rate = serve_layouts(Query("llama3-8b", clusters="dgx-h100"), num_gpus=8, top=5,
                         workload=ServingWorkload(isl=1000, osl=200, request_rate=5.0))
    assert not any(e.tied for e in rate.entries) and rate.tie_note == ""
    assert all(e.order_confidence is None for e in rate.entries)


def test_cli_table_marks_ties_and_json_carries_them() -> None:
    args = ("serve", "--model", "deepseek-v3", "--cluster", "dgx-b200", "--gpus", "4",
            "--isl", "922", "--osl", "922", "--precision", "fp4", "--concurrency", "4",
            "--engine", "sglang", "--top", "4")
    table = run_cli(*args)
    assert table.code == 0, table.err
    lines = table.out.splitlines()
    assert lines[2].startswith("1~") and any(line.startswith("~ tie") for line in lines)
    doc = json.loads(run_cli(*args, "--format", "json").out)
    assert doc["results"][0]["tied_with_best"] is True
    assert doc["results"][0]["order_confidence_vs_best"] is None
    assert 0.0 <= doc["results"][1]["order_confidence_vs_best"] <= 1.0
    assert doc["tie_note"].startswith("~ tie")


@pytest.mark.parametrize(("text", "field"), [
    ("tie_band: 0.1\n", "bins"),
    ("tie_band: 0.1\nbins:\n- {gap: 0.0, pairs: x, kept: 1}\n", "bins[0]"),
    ("tie_band: 0.1\nbins:\n- {gap: 0.0, pairs: 3, kept: 4}\n", "bins[0]"),
    ("tie_band: 0.1\nbins:\n- {gap: 0.1, pairs: 3, kept: 1}\n", "start at 0"),
    ("tie_band: 2\nbins:\n- {gap: 0.0, pairs: 3, kept: 1}\n", "tie_band"),
])
def test_a_broken_table_says_what_is_wrong(tmp_path: Path, text: str, field: str) -> None:
    path = tmp_path / "order_confidence.yaml"
    message = error_reading(path, text, load_order_confidence)
    assert field in message and str(path) in message and "\n" not in message


def test_right_share_reads_the_bin_of_the_gap() -> None:
    conf = OrderConfidence("2026-12-07", "held-out", 0.95, 0.1,
                           (GapBin(0.0, 5, 3), GapBin(0.1, 9, 9)))
    assert conf.right_share(0.05) == 0.6 and conf.right_share(0.1) == 1.0
    assert conf.pairs_below_band() == (5, 0.6) and conf.pairs_from_band() == (9, 1.0)


@given(st.lists(st.tuples(st.integers(0, 60), st.floats(0.0, 1.0)), min_size=1, max_size=10))
def test_confidence_never_falls_as_the_gap_widens(raw: list[tuple[int, float]]) -> None:
    bins = [GapBin(0.04 * i, n, round(n * r)) for i, (n, r) in enumerate(raw)]
    shares = monotone_shares(bins)
    assert all(a <= b + 1e-12 for a, b in itertools.pairwise(shares))
    # pooling keeps the pairs' total of kept orders
    assert sum(b.pairs * x for b, x in zip(bins, shares, strict=True)) == pytest.approx(
        sum(b.kept for b in bins))
    conf = OrderConfidence("2026-12-07", "held-out", 0.95, 0.1, tuple(bins))
    assert [conf.right_share(b.gap) for b in bins] == shares
