"""Reading Megatron-LM / Megatron-Bridge training logs.

Fixtures in tests/fixtures/megatron_logs/ are written in the format Megatron
prints (arguments block of ``megatron/training/arguments.py`` ``_print_args``,
iteration lines of ``megatron/training/training.py`` ``training_log``; NVIDIA/
Megatron-LM d98e8a64ddf3, NVIDIA-NeMo/Megatron-Bridge 067f987df03b): a complete
run, one that died mid-run (NCCL timeout, truncated last line), one that died
in warm-up (OOM), a batch-size ramp-up, a Megatron-Bridge log with its config
dumped as YAML, an MoE FP8 run logged every fifth iteration, two runs in one file with ``srun
--label`` prefixes and microsecond timestamps, a log of garbage lines without
an arguments block, and a file that is no log at all.
"""

from __future__ import annotations

import re
import statistics
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from parsearch.validation.user.measurements import Defaults, load_measurements
from parsearch.validation.user.megatron_logs import (
    WARMUP_ITERATIONS,
    parse_megatron_log,
    read_megatron_log,
    steady_states,
)

LOGS = Path(__file__).parent / "fixtures" / "megatron_logs"
DEFAULTS = Defaults(model="llama3-8b", cluster="dgx-h100")
_ELAPSED = re.compile(r"iteration\s+(\d+)/.*elapsed time per iteration \(ms\): ([0-9.]+) \|")


def _times(path: Path, first: int, last: int) -> list[float]:
    """Per-iteration seconds of iterations first..last, read with a plain regex."""
    out = []
    for line in path.read_text().splitlines():
        match = _ELAPSED.search(line)
        if match and first <= int(match.group(1)) <= last:
            out.append(float(match.group(2)) / 1000.0)
    return out


def _load(name: str, defaults: Defaults = DEFAULTS):
    return load_measurements([LOGS / name], defaults)


def test_complete_run_reads_arguments_and_skips_warm_up() -> None:
    path = LOGS / "llama3_8b_tp2_pp2_complete.out"
    (run,) = read_megatron_log(path)
    assert run.finished and not run.died
    loaded = _load(path.name)
    assert loaded.problems == ()
    (m,) = loaded.measurements
    assert (m.layout.tp, m.layout.pp, m.layout.sp, m.layout.num_gpus) == (2, 2, True, 16)
    assert (m.global_batch, m.seq_len, m.precision) == (128, 8192, "bf16")
    assert m.options["overlap_grad_reduce"] is True and m.options["tp_comm_overlap"] is False
    steady = _times(path, WARMUP_ITERATIONS + 1, 10**9)
    assert abs(m.step_time_s - statistics.median(steady)) < 1e-9
    first = _times(path, 1, 1)[0]
    assert first > 2 * m.step_time_s  # start-up: the first iteration is far slower
    assert abs(m.tokens_per_s_per_gpu - 128 * 8192 / (m.step_time_s * 16)) < 1e-6


def test_run_that_died_is_flagged_and_its_truncated_line_ignored() -> None:
    path = LOGS / "llama3_8b_tp4_died.out"
    (run,) = read_megatron_log(path)
    assert run.died and not run.finished
    assert len(run.malformed_lines) == 1
    assert run.iterations[-1].iteration == 26
    loaded = _load(path.name)
    (m,) = loaded.measurements
    assert m.layout.tp == 4
    assert any("stopped at iteration 26 of 5000" in n for n in loaded.notes)
    assert any("truncated or malformed" in n for n in loaded.notes)


def test_run_that_died_in_warm_up_gives_one_clear_line() -> None:
    loaded = _load("llama3_8b_died_in_warmup.out")
    assert loaded.measurements == ()
    (problem,) = loaded.problems
    assert "\n" not in problem and "warm-up" in problem and "died_in_warmup" in problem


def test_changed_batch_size_gives_one_reading_per_batch() -> None:
    path = LOGS / "llama3_8b_batch_rampup.out"
    loaded = _load(path.name)
    by_batch = {m.global_batch: m for m in loaded.measurements}
    assert set(by_batch) == {64, 128}
    assert any("64 -> 128" in n for n in loaded.notes)
    # The 128 stretch starts at iteration 21: its first 10 iterations are warm-up again.
    assert abs(by_batch[128].step_time_s
               - statistics.median(_times(path, 21 + WARMUP_ITERATIONS, 10**9))) < 1e-9
    assert abs(by_batch[64].step_time_s
               - statistics.median(_times(path, 1 + WARMUP_ITERATIONS, 20))) < 1e-9


def test_several_runs_in_one_file_with_launcher_prefixes() -> None:
    runs = read_megatron_log(LOGS / "llama3_8b_two_runs.out")
    assert [r.index for r in runs] == [1, 2]
    assert all(r.finished for r in runs)
    loaded = _load("llama3_8b_two_runs.out")
    layouts = [(m.layout.tp, m.layout.pp, m.layout.vpp, m.layout.sp) for m in loaded.measurements]
    assert layouts == [(2, 2, 1, True), (1, 4, 2, False)]
    assert {m.model_facts["num_layers"] for m in loaded.measurements} == {32}


def test_garbage_lines_are_ignored_and_missing_facts_asked_for_in_one_line() -> None:
    loaded = _load("garbage_no_arguments.out")
    assert loaded.measurements == ()
    (problem,) = loaded.problems
    assert "--gpus" in problem and "\n" not in problem
    hinted = Defaults(model="llama3-8b", cluster="dgx-h100", num_gpus=16, seq_len=8192,
                      layout="tp=2,pp=2,sp=true", precision="bf16")
    loaded = _load("garbage_no_arguments.out", hinted)
    (m,) = loaded.measurements
    assert (m.layout.tp, m.layout.pp, m.layout.num_gpus) == (2, 2, 16)
    assert any("2 truncated or malformed" in n for n in loaded.notes)


def test_moe_fp8_run_logged_every_fifth_iteration() -> None:
    """Expert parallelism with Megatron's default expert TP (= TP), FP8, --log-interval 5."""
    path = LOGS / "mixtral_8x22b_ep8_fp8_interval5.out"
    loaded = _load(path.name, Defaults(model="mixtral-8x22b", cluster="dgx-h100"))
    (m,) = loaded.measurements
    lay = m.layout
    assert (lay.tp, lay.pp, lay.vpp, lay.ep, lay.etp, lay.num_gpus) == (2, 4, 7, 8, 2, 128)
    assert (m.precision, lay.recompute) == ("fp8", "selective")
    assert m.options["moe_dispatcher"] == "alltoall" and m.options["cuda_graphs"] is False
    # Lines 5 and 10 cover iterations 1-10 (warm-up); 15..50 are used.
    assert abs(m.step_time_s - statistics.median(_times(path, 15, 50))) < 1e-9


def test_megatron_bridge_log_with_its_config_dump() -> None:
    """Bridge prints no arguments block; its ConfigContainer YAML dump gives the layout."""
    name = "bridge_llama3_8b_config_dump.out"
    (problem,) = _load(name).problems
    assert "world_size" in problem and "--gpus" in problem and "\n" not in problem
    (m,) = _load(name, Defaults(model="llama3-8b", cluster="dgx-h100", num_gpus=16)).measurements
    assert (m.layout.tp, m.layout.cp, m.layout.sp, m.precision) == (4, 2, True, "bf16")
    assert m.options == {"moe_dispatcher": "alltoall"}


def test_files_that_are_no_log_give_one_line_each() -> None:
    loaded = load_measurements([LOGS / "not_a_log.txt", LOGS / "missing.log"], DEFAULTS)
    assert loaded.measurements == ()
    assert len(loaded.problems) == 2
    assert all("\n" not in p for p in loaded.problems)
    assert "no such file" in loaded.problems[1]


def _iteration_line(i: int, total: int, ms: float, batch: int) -> str:
    """The iteration line exactly as training_log formats it."""
    return (f" [2024-05-01 10:00:00] iteration {i:8d}/{total:8d} |"
            + f" consumed samples: {i * batch:12d} |"
            + f" elapsed time per iteration (ms): {ms:.1f} |"
            + f" throughput per GPU (TFLOP/s/GPU): {100.0:.1f} |"
            + f" learning rate: {1e-4:.6E} | global batch size: {batch:5d} |"
            + f" lm loss: {7.0:.6E} | loss scale: {1.0:.1f} | grad norm: {1.0:.3f} |"
            + f" number of skipped iterations: {0:3d} |"
            + f" number of nan iterations: {0:3d} |")


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(100.0, 90000.0), min_size=WARMUP_ITERATIONS + 3, max_size=40),
       st.integers(1, 4096))
def test_steady_state_is_the_median_after_warm_up(times: list[float], batch: int) -> None:
    text = "\n".join(_iteration_line(i + 1, 1000, ms, batch) for i, ms in enumerate(times))
    (run,) = parse_megatron_log(text)
    readings, _ = steady_states(run)
    (reading,) = readings
    expected = statistics.median(round(ms, 1) / 1000 for ms in times[WARMUP_ITERATIONS:])
    assert abs(reading.step_time_s - expected) < 1e-9
    assert reading.global_batch == batch


@settings(max_examples=100, deadline=None)
@given(st.text(max_size=400))
def test_any_text_parses_without_error(text: str) -> None:
    for run in parse_megatron_log(text):
        steady_states(run)


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.text(max_size=300), st.sampled_from([".csv", ".yaml", ".out"]))
def test_any_file_content_loads_without_error(tmp_path, text: str, suffix: str) -> None:
    """Whatever a file holds, the loader answers with measurements or one-line problems."""
    path = tmp_path / f"input{suffix}"
    path.write_text(text, encoding="utf-8", errors="replace")
    loaded = load_measurements([path], DEFAULTS)
    assert all("\n" not in p for p in loaded.problems)


def test_the_op_fuser_argument_prices_the_fused_expert_mlp(tmp_path: Path) -> None:
    """``--use-transformer-engine-op-fuser`` in the arguments block is the fused expert MLP
    the run ran (parsearch.cost.fused_mlp); without the line it stays unstated."""
    source = (LOGS / "mixtral_8x22b_ep8_fp8_interval5.out").read_text()
    marker = "  overlap_moe_expert_parallel_comm ................ False\n"
    assert marker in source
    defaults = Defaults(model="mixtral-8x22b", cluster="dgx-h100")
    (plain,) = load_measurements([LOGS / "mixtral_8x22b_ep8_fp8_interval5.out"],
                                 defaults).measurements
    assert "fused_expert_mlp" not in plain.options
    for value in ("True", "False"):
        log = tmp_path / f"fuser_{value}.out"
        log.write_text(source.replace(
            marker, marker + f"  use_transformer_engine_op_fuser ................. {value}\n"))
        (m,) = load_measurements([log], defaults).measurements
        assert m.options["fused_expert_mlp"] is (value == "True")
