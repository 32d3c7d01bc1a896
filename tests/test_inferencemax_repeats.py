"""The InferenceMAX rows read from their nightly repeats by one stated rule
(``benchmarks/inferencemax_repeats.py``): the latest repeat without a cold-start stall."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from tests.bench_modules import benchmark_module

imr = benchmark_module("inferencemax_repeats")

repeats = st.lists(
    st.builds(imr.Repeat, run=st.integers(1, 10**11).map(str), image=st.just("img"),
              output_tput_per_gpu=st.floats(1, 1e4), mean_ttft_ms=st.floats(1, 1e5),
              median_ttft_ms=st.floats(1, 1e4), p99_ttft_ms=st.floats(1, 1.5e5),
              mean_tpot_ms=st.floats(1, 1e3)),
    min_size=1, max_size=8, unique_by=lambda r: r.run)


@given(repeats)
def test_pick_is_the_latest_clean_repeat_else_the_latest(reps: list) -> None:
    pick, stalled = imr.pick_repeat(reps)
    clean = [r for r in reps if r.p99_ttft_ms < imr.STALL_P99_TTFT_MS]
    assert stalled == (not clean)
    pool = clean or reps
    assert pick in pool and int(pick.run) == max(int(r.run) for r in pool)


def test_every_row_reads_what_the_rule_gives() -> None:
    assert imr.check() == []


def test_stall_rows_are_the_sglang_b200_rows_every_repeat_of_which_stalled() -> None:
    rows = {r["id"]: r for r in _rows()}
    reps = imr.load_repeats()
    assert len(reps) == 277  # every InferenceMAX row (s0430-s0706) has its repeats
    marked = {k for k, r in rows.items() if r["stall"]}
    assert marked == {k for k, v in reps.items() if all(r.stalled for r in v)}
    assert marked and all(rows[k]["framework"] == "sglang" and rows[k]["gpu"] == "b200"
                          for k in marked)
    # Stalled repeats exist only where the source shows them: SGLang on B200.
    for k, v in reps.items():
        if any(r.stalled for r in v):
            assert rows[k]["framework"] == "sglang" and rows[k]["gpu"] == "b200", k


def test_a_stall_is_a_tail_not_a_slower_median() -> None:
    """The stall is in a tenth of the requests: a stalled repeat's median TTFT is within
    a factor 1.5 of the clean repeats' of the same row, its mean several times higher."""
    for row_id, v in imr.load_repeats().items():
        clean = [r for r in v if not r.stalled]
        for r in (r for r in v if r.stalled):
            assert r.mean_ttft_ms > 2 * r.median_ttft_ms, row_id
            for c in clean:
                assert c.median_ttft_ms / 1.5 < r.median_ttft_ms < c.median_ttft_ms * 1.5, row_id


def _rows() -> list[dict[str, str]]:
    import csv
    with imr.ROWS.open(newline="") as handle:
        return list(csv.DictReader(handle))
