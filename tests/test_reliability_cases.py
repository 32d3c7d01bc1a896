"""Regression cases of issue 35 (an independent campaign of generated inputs): each failing
command line kept as a test, with the invariant behind it as a property where there is one.

* ``search --export`` with a folder name longer than the file system allows (a traceback);
* ``plan-profiling`` with a single candidate (``max()`` of an empty sequence), and with
  K = 30 of 1,000 candidates (no answer within minutes): the plan's objective reads only
  what it needs, its evaluations are bounded, and beyond the bound it is refused up front;
* ``calibrate`` with a huge step time (``ZeroDivisionError``), with 10,000 rows (no answer
  within minutes: refused up front, the limit named), and with many bad rows (dozens of
  lines before the error: now the error first, the per-row detail after it).
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from parsearch.cli.left_out import SHOWN
from parsearch.errors import SpecError
from parsearch.validation.planning import plan_profiling as pp
from parsearch.validation.planning.plan_errors import (
    expected_misordered,
    fit_error_cov,
    fit_error_parts,
)
from parsearch.validation.user.measurements import (
    MAX_MEASUREMENTS,
    MAX_STEP_S,
    MIN_STEP_S,
    Defaults,
    load_measurements,
    measurement_from_row,
)
from tests.cli_helpers import assert_one_line_error, run_cli

HEADER = "model,cluster,num_gpus,global_batch,seq_len,precision,layout,tokens_per_s_per_gpu," \
    "step_time_s"
GOOD_ROW = 'llama3-8b,dgx-h100,16,128,8192,bf16,"tp=2,sp=true",9000,'


# --- search --export ------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["a" * 300, "/".join(["b" * 250] * 20)])
def test_export_folder_name_too_long_is_one_line(tmp_path: Path, name: str) -> None:
    result = run_cli("search", "--model", "gpt-1.7b", "--cluster", "dgx-h100", "--gpus", "8",
                     "--global-batch", "64", "--seq-len", "2048", "--top", "1",
                     "--export", str(tmp_path / name))
    assert_one_line_error(result, "--export", "longer than the file system allows")
    assert len(result.err) < 400  # the path is shortened, not printed whole


# --- plan-profiling -------------------------------------------------------------------------


def test_plan_profiling_with_one_candidate_answers() -> None:
    # the campaign's command line: 65,536 GPUs, one candidate, one pick
    result = run_cli("plan-profiling", "--model", "llama3-70b", "--cluster", "gb300-nvl72",
                     "--gpus", "65536", "--global-batch", "1", "--seq-len", "32768", "--k", "1",
                     "--candidates", "1", "--recompute", "full", "--format", "json")
    assert result.code in (0, 2), result
    assert "Traceback" not in result.err
    if result.code == 0:
        assert '"predicted_rank": 1' in result.out


def test_plan_profiling_refuses_more_work_than_its_bound_up_front() -> None:
    result = run_cli("plan-profiling", "--model", "mixtral-8x22b", "--cluster", "dgx-h100",
                     "--gpus", "512", "--global-batch", "1024", "--seq-len", "4096",
                     "--k", "200", "--candidates", "1000")
    assert_one_line_error(result, "--k 200", f"{pp.MAX_EVALUATIONS:,}", "lower --k")


@settings(max_examples=60, deadline=None, derandomize=True)
@given(n=st.integers(1, 400), k=st.integers(1, 60))
def test_fixed_evaluations_count_the_greedy_choice_and_the_ordering(n: int, k: int) -> None:
    fixed = pp._fixed_evaluations(k, n)
    picked = min(k, n)
    greedy = sum(n - i for i in range(picked))  # what _greedy evaluates
    assert fixed == greedy + picked * (picked + 1) // 2


def test_the_issue_size_fits_the_bound() -> None:
    assert pp._fixed_evaluations(30, 1000) <= pp.MAX_EVALUATIONS  # K = 30 of 1,000 answers
    assert pp._fixed_evaluations(200, 1000) > pp.MAX_EVALUATIONS  # refused up front


@settings(max_examples=40, deadline=None, derandomize=True)
@given(n=st.integers(2, 30), k=st.integers(1, 6), budget=st.integers(0, 300),
       seed=st.integers(0, 2**16))
def test_exchange_never_exceeds_its_budget(n: int, k: int, budget: int, seed: int) -> None:
    weights = np.random.default_rng(seed).normal(size=n)
    calls = [0]

    def objective(picked: list[int]) -> float:
        calls[0] += 1
        return float(weights[picked].sum())

    start = list(range(min(k, n)))
    chosen, complete = pp._exchange(objective, start, n, budget)
    assert calls[0] <= budget
    assert len(chosen) == len(start) and len(set(chosen)) == len(chosen)
    if complete:  # ran to its end: no single swap lowers the objective any more
        best = objective(chosen)
        for position in range(len(chosen)):
            for j in set(range(n)) - set(chosen):
                trial = [*chosen[:position], j, *chosen[position + 1:]]
                assert objective(trial) >= best - 1e-9


@settings(max_examples=60, deadline=None, derandomize=True)
@given(seed=st.integers(0, 2**16), factors=st.integers(1, 6), measured=st.integers(0, 8),
       targets=st.integers(2, 40))
def test_objective_parts_equal_the_whole_error_matrix(seed: int, factors: int, measured: int,
                                                      targets: int) -> None:
    rng = np.random.default_rng(seed)
    g_measured = rng.normal(0, 0.1, (measured, factors))
    g_target = rng.normal(0, 0.1, (targets, factors))
    own = [int(rng.integers(0, targets)) if rng.random() < 0.7 else None
           for _ in range(measured)]
    thresholds = np.full(factors, 1e-3)
    n_factors = int(rng.integers(0, factors + 1))
    block = rng.choice(targets, size=min(targets, 10), replace=False)
    whole = fit_error_cov(g_measured, own, g_target, n_factors, thresholds)
    diag, sub = fit_error_parts(g_measured, own, g_target, n_factors, thresholds, block)
    assert np.allclose(diag, np.diag(whole))
    assert np.allclose(sub, whole[np.ix_(block, block)])
    mu = rng.normal(size=targets)
    top = np.argsort(-mu)[:10]
    assert math.isclose(pp.misordered_pairs(mu[top], whole[np.ix_(top, top)]),
                        expected_misordered(mu, whole, 10), abs_tol=1e-9)


# --- calibrate: measurement rows -----------------------------------------------------------


def test_calibrate_with_huge_step_times_and_empty_batches_is_one_error(tmp_path: Path) -> None:
    path = tmp_path / "runs.csv"
    path.write_text("\n".join([
        HEADER,
        'llama3-8b,dgx-h100,8,1,1,bf16,"tp=8",,1e308',      # tokens underflowed to 0
        'llama3-8b,dgx-h100,8,,2048,bf16,"tp=8",,1e300',    # empty global batch
        'llama3-8b,dgx-h100,8,nan,2048,bf16,"tp=8",,5',     # NaN global batch
    ]) + "\n")
    result = run_cli("calibrate", "--measurements", str(path), "--out",
                     str(tmp_path / "p.yaml"))
    assert result.code == 2 and "Traceback" not in result.err
    first, *detail = result.err.strip().splitlines()
    assert "error: no usable measurement" in first and "all 3 input(s) left out" in first
    assert len(detail) == 3 and all(line.startswith("  ") for line in detail)
    assert "step_time_s='1e308'" in detail[0] and "missing global_batch" in detail[1]
    assert "global_batch='nan'" in detail[2]


FLOAT_TEXT = st.one_of(st.floats(allow_nan=True, allow_infinity=True).map(repr),
                       st.sampled_from(["", " ", "nan", "1e308", "1e-320", "5e-324", "0"]))


@settings(max_examples=200, deadline=None, derandomize=True)
@given(batch=st.one_of(st.integers(-2, 2**40).map(str), FLOAT_TEXT),
       seq=st.sampled_from(["1", "8192", "1048576"]), gpus=st.sampled_from(["1", "8", "65536"]),
       value=FLOAT_TEXT, step=st.booleans())
def test_a_row_gives_a_finite_measurement_or_a_spec_error(batch: str, seq: str, gpus: str,
                                                          value: str, step: bool) -> None:
    row = {"model": "llama3-8b", "cluster": "dgx-h100", "num_gpus": gpus,
           "global_batch": batch, "seq_len": seq, "precision": "bf16", "layout": "tp=1",
           "tokens_per_s_per_gpu": "" if step else value, "step_time_s": value if step else ""}
    try:
        m = measurement_from_row(row, "row 2", Defaults())
    except SpecError as error:
        assert "\n" not in str(error)
        return
    assert math.isfinite(m.tokens_per_s_per_gpu) and m.tokens_per_s_per_gpu > 0
    step_s = m.global_batch * m.seq_len / (m.tokens_per_s_per_gpu * int(gpus))
    assert MIN_STEP_S * (1 - 1e-9) <= step_s <= MAX_STEP_S * (1 + 1e-9)


def test_more_measurements_than_the_limit_are_refused_up_front(tmp_path: Path) -> None:
    path = tmp_path / "runs.csv"
    path.write_text("\n".join([HEADER, *[GOOD_ROW] * 10_000]) + "\n")
    with pytest.raises(SpecError, match=f"at most {MAX_MEASUREMENTS}"):
        load_measurements([path])
    result = run_cli("calibrate", "--measurements", str(path), "--out",
                     str(tmp_path / "p.yaml"))
    assert_one_line_error(result, "10,000 measurements", f"at most {MAX_MEASUREMENTS}")
    assert not (tmp_path / "p.yaml").exists()


def test_many_bad_rows_give_the_error_first_and_a_bounded_detail(tmp_path: Path) -> None:
    path = tmp_path / "runs.csv"
    path.write_text("\n".join([HEADER, *['llama3-8b,dgx-h100,16,128,8192,bf17,"tp=2",9000,']
                               * 45]) + "\n")
    result = run_cli("calibrate", "--measurements", str(path), "--out",
                     str(tmp_path / "p.yaml"))
    assert result.code == 2 and "Traceback" not in result.err
    first, *detail = result.err.strip().splitlines()
    assert first.startswith("parsearch calibrate: error: no usable measurement")
    assert "all 45 input(s) left out" in first
    assert len(detail) == SHOWN + 1 and all(line.startswith("  ") for line in detail)
    assert "precision='bf17'" in detail[0] and "25 more" in detail[-1]


# --- found by the widened campaign (benchmarks/fuzz_extremes.py) ----------------------------


def test_a_measurements_path_too_long_is_a_left_out_input(tmp_path: Path) -> None:
    long = str(tmp_path / ("p" * 300)) + ".csv"  # exists() raised ENAMETOOLONG
    result = run_cli("calibrate", "--measurements", long, "--out", str(tmp_path / "p.yaml"))
    assert result.code == 2 and "Traceback" not in result.err
    first, *detail = result.err.strip().splitlines()
    assert "no usable measurement" in first and len(first) < 300
    assert len(detail) == 1 and "no such file" in detail[0] and len(detail[0]) < 200


@pytest.mark.parametrize("share", ["1e308", "nan", "inf", "1e7"])
def test_serve_mix_share_beyond_the_bound_is_one_line(share: str) -> None:
    # 1e308: the weighted mean prompt length overflowed (OverflowError in ServeSpec.from_mix)
    result = run_cli("serve", "--model", "llama3-8b", "--cluster", "dgx-h100", "--gpus", "8",
                     "--mix", f"128:128:{share}", "--format", "json")
    assert_one_line_error(result, "--mix", "at most 1e+06")


@settings(max_examples=12, deadline=None, derandomize=True)
@given(option=st.sampled_from(["--export", "--launch-dir", "--out", "--measurements"]),
       length=st.sampled_from([255, 256, 300, 5000]), nested=st.booleans())
def test_long_paths_answer_or_refuse_in_one_line(tmp_path_factory: pytest.TempPathFactory,
                                                 option: str, length: int,
                                                 nested: bool) -> None:
    tmp = tmp_path_factory.mktemp("paths")
    runs = tmp / "runs.csv"
    runs.write_text("\n".join([HEADER, GOOD_ROW]) + "\n")
    name = "/".join(["q" * 250] * (length // 250)) if nested else "p" * length
    target = str(tmp / name)
    small = ["--model", "gpt-1.7b", "--cluster", "dgx-h100", "--gpus", "8", "--global-batch",
             "64", "--seq-len", "2048"]
    argv = {"--export": ["search", *small, "--top", "1", "--export", target],
            "--launch-dir": ["plan-profiling", *small, "--k", "1", "--candidates", "2",
                             "--launch-dir", target],
            "--out": ["calibrate", "--measurements", str(runs), "--out", target + ".yaml",
                      "--no-leave-one-out"],
            "--measurements": ["calibrate", "--measurements", target + ".csv", "--out",
                               str(tmp / "p.yaml")]}[option]
    result = run_cli(*argv)
    assert result.code in (0, 2), result
    assert "Traceback" not in result.err
    if result.code == 2:
        first, *detail = result.err.strip().splitlines()
        assert ": error:" in first and len(first) < 600
        assert all(line.startswith("  ") for line in detail)
