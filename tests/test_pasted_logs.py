"""Training logs as users paste them (issue 33, item 5).

Each form below is written the way the code that prints it formats it
(parsearch.validation.user.log_lines cites the commits): colour codes around fields,
AMD Primus's ``elapsed time per iteration (ms): 13100.0/13240.9``, NeMo 2's
ProgressPrinter lines, an excerpt that starts at iteration 29, a run resumed
from a checkpoint, argument lines without their header, and a file with no
iteration line at all.
"""

from __future__ import annotations

import statistics
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from parsearch.validation.user.log_lines import iteration_line, loose_argument, plain
from parsearch.validation.user.measurements import Defaults, load_measurements
from parsearch.validation.user.megatron_logs import (
    WARMUP_ITERATIONS,
    parse_megatron_log,
    steady_states,
)

HINTS = Defaults(model="llama3-8b", cluster="dgx-h100", num_gpus=16, seq_len=8192,
                 layout="tp=2,pp=2,sp=true", precision="bf16")
GREEN, BOLD, RESET = "\x1b[32m", "\x1b[1m", "\x1b[0m"


def megatron_line(i: int, ms: float, batch: int = 128, total: int = 100,
                  colour: bool = False, second_ms: float | None = None) -> str:
    """Megatron-LM's training_log line; ``colour`` wraps each field as a coloured terminal
    shows it; ``second_ms`` gives Primus's ``first/second`` elapsed-time form."""
    def c(text: str) -> str:
        return f"{GREEN}{text}{RESET}" if colour else text
    elapsed = f"{ms:.1f}" if second_ms is None else f"{ms:.1f}/{second_ms:.1f}"
    tflops = "402.3" if second_ms is None else "402.3/399.1"
    return (f" [2025-03-02 11:04:{i % 60:02d}] {c('iteration')} {i:8d}/{total:8d} |"
            f" {c('consumed samples:')} {i * batch:12d} |"
            f" {c('elapsed time per iteration (ms):')} {BOLD if colour else ''}{elapsed}"
            f"{RESET if colour else ''} | throughput per GPU (TFLOP/s/GPU): {tflops} |"
            f" learning rate: 2.999999E-04 | {c('global batch size:')} {batch:5d} |"
            " lm loss: 6.812345E+00 | loss scale: 1.0 | grad norm: 0.612 |"
            " number of skipped iterations:   0 | number of nan iterations:   0 |")


def nemo_line(i: int, seconds: float, batch: int = 128, total: int = 100) -> str:
    """NeMo 2 ProgressPrinter: f-string prefix, then ' | {metric}: {val:.4}' (ints bare)."""
    return (f"Training epoch 0, iteration {i}/{total} | lr: 0.0003 | global_batch_size: {batch}"
            f" | global_step: {i} | reduced_train_loss: 6.812 | train_step_timing in s: "
            f"{seconds:.4} | consumed_samples: {(i + 1) * batch}")


def _write(tmp_path: Path, lines: list[str], name: str = "pasted.out") -> Path:
    path = tmp_path / name
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def _times(n: int, first: int = 1) -> list[float]:
    """Realistic per-iteration milliseconds: slow start-up, then 13.1 s +- 0.1 s."""
    return [40000.0 / (i - first + 1) + 13000.0 + 37.0 * ((i * 7) % 5) for i in
            range(first, first + n)]


def test_colour_codes_around_each_field_are_read(tmp_path) -> None:
    times = _times(20)
    path = _write(tmp_path, [megatron_line(i, ms, colour=True)
                             for i, ms in enumerate(times, start=1)])
    loaded = load_measurements([path], HINTS)
    assert loaded.problems == ()
    (m,) = loaded.measurements
    expected = statistics.median(round(ms, 1) / 1000 for ms in times[WARMUP_ITERATIONS:])
    assert abs(m.step_time_s - expected) < 1e-9


def test_colour_codes_whose_escape_byte_was_lost_in_the_paste_are_removed() -> None:
    line = megatron_line(30, 13100.0, colour=True).replace("\x1b", "")
    assert "[32m" in line
    parsed = iteration_line(plain(line), 1)
    assert parsed is not None and parsed.elapsed_ms == 13100.0 and parsed.global_batch == 128


def test_primus_two_number_elapsed_time_reads_the_first(tmp_path) -> None:
    """``13100.0/13240.9``: the time since the previous line, then a running mean; the
    first is Megatron-LM's number and the one the warm-up rule applies to."""
    times = _times(20)
    lines = [megatron_line(i, ms, second_ms=statistics.mean(times[:i]))
             for i, ms in enumerate(times, start=1)]
    assert "/" in lines[-1].split("elapsed time per iteration (ms): ")[1].split(" |")[0]
    (run,) = parse_megatron_log("\n".join(lines))
    assert [x.elapsed_ms for x in run.iterations] == [round(ms, 1) for ms in times]
    assert run.iterations[0].tflops_per_gpu == 402.3
    (m,) = load_measurements([_write(tmp_path, lines)], HINTS).measurements
    assert abs(m.step_time_s
               - statistics.median(round(ms, 1) / 1000 for ms in times[WARMUP_ITERATIONS:])) < 1e-9


def test_nemo2_progress_lines_are_read_with_their_batch_and_end(tmp_path) -> None:
    seconds = [t / 1000 for t in _times(30)]
    lines = ["[NeMo I 2025-03-02 11:00:00 nemo_logging:393] Experiments will be logged at /r"]
    lines += [nemo_line(i, s) for i, s in enumerate(seconds, start=1)]
    lines += ["`Trainer.fit` stopped: `max_steps=30` reached."]
    (run,) = parse_megatron_log("\n".join(lines))
    assert run.finished and not run.died and len(run.iterations) == 30
    assert run.iterations[0].global_batch == 128
    (m,) = load_measurements([_write(tmp_path, lines)], HINTS).measurements
    # Four significant digits, as the printer writes them.
    expected = statistics.median(float(f"{s:.4}") for s in seconds[WARMUP_ITERATIONS:])
    assert abs(m.step_time_s - expected) < 1e-9
    assert m.global_batch == 128
    assert abs(m.tokens_per_s_per_gpu - 128 * 8192 / (expected * 16)) < 1e-6


@settings(max_examples=30, deadline=None)
@given(first=st.integers(WARMUP_ITERATIONS + 1, 5000), n=st.integers(3, 25))
def test_an_excerpt_past_warm_up_uses_all_its_lines(first: int, n: int) -> None:
    """Warm-up is counted in the run's own iteration numbers, not from the excerpt's
    first line: an excerpt starting at iteration 29 is not all warm-up."""
    times = [13100.0 + 10.0 * (i % 3) for i in range(n)]
    text = "\n".join(megatron_line(first + k, ms, total=first + 1000)
                     for k, ms in enumerate(times))
    (run,) = parse_megatron_log(text)
    (reading,), notes = steady_states(run)
    assert reading.lines_used == n and reading.first_iteration == first
    assert abs(reading.step_time_s - statistics.median(times) / 1000) < 1e-9
    assert (first > WARMUP_ITERATIONS + 1) == any("past the run's" in note for note in notes)


def test_the_issue_excerpt_from_iteration_29_is_measured(tmp_path) -> None:
    path = _write(tmp_path, [megatron_line(i, 13100.0 + i) for i in range(29, 35)])
    loaded = load_measurements([path], HINTS)
    assert loaded.problems == ()
    (m,) = loaded.measurements
    expected = statistics.median((13100.0 + i) / 1000 for i in range(29, 35))
    assert abs(m.step_time_s - expected) < 1e-9


def test_a_resumed_run_drops_warm_up_after_its_checkpoint() -> None:
    lines = [" > loading checkpoint from /ckpt at iteration 500",
             "  successfully loaded checkpoint from /ckpt [ t 1/2, p 1/2 ] at iteration 500"]
    times = _times(16, first=501)
    lines += [megatron_line(i, ms, total=2000) for i, ms in enumerate(times, start=501)]
    (run,) = parse_megatron_log("\n".join(lines))
    assert run.start_iteration == 500
    (reading,), _ = steady_states(run)
    assert reading.first_iteration == 501 + WARMUP_ITERATIONS
    assert reading.lines_used == 16 - WARMUP_ITERATIONS


def test_a_restart_without_a_checkpoint_line_counts_warm_up_from_its_first_line() -> None:
    first = [megatron_line(i, 13100.0, total=1000) for i in range(1, 21)]
    again = [megatron_line(i, 13100.0 + 500.0 * (i < 16), total=1000) for i in range(6, 30)]
    runs = parse_megatron_log("\n".join(first + again))
    assert [r.start_iteration for r in runs] == [0, None]
    (reading,), _ = steady_states(runs[1])
    assert reading.first_iteration == 6 + WARMUP_ITERATIONS
    assert abs(reading.step_time_s - 13.1) < 1e-9


def test_refusing_for_warm_up_names_the_option_that_lifts_it(tmp_path) -> None:
    path = _write(tmp_path, [megatron_line(i, 13100.0, total=500) for i in range(1, 8)])
    loaded = load_measurements([path], HINTS)
    (problem,) = loaded.problems
    assert "warm-up" in problem and "--warmup-iterations 0" in problem
    assert any("--warmup-iterations 0" in note for note in loaded.notes)
    hinted = Defaults(**{**HINTS.__dict__, "warmup_iterations": 0})
    (m,) = load_measurements([path], hinted).measurements
    assert abs(m.step_time_s - 13.1) < 1e-9


def test_no_iteration_lines_says_the_csv_route_works(tmp_path) -> None:
    path = _write(tmp_path, ["Epoch 1 done", "loss went down"], "notes.log")
    (problem,) = load_measurements([path], HINTS).problems
    assert "no iteration lines" in problem and "CSV" in problem and "step_time_s" in problem
    assert "train_step_timing" in problem  # the NeMo form is named as read too


def _argument(name: str, value: str) -> str:
    """Megatron-LM _print_args: '  {} {} {}'.format(arg, '.' * (48 - len(arg)), value)."""
    return "  {} {} {}".format(name, "." * (48 - len(name)), value)


def test_argument_lines_pasted_without_their_header_are_read_and_said(tmp_path) -> None:
    arguments = [_argument("tensor_model_parallel_size", "4"),
                 _argument("pipeline_model_parallel_size", "1"),
                 _argument("sequence_parallel", "True"), _argument("world_size", "16"),
                 _argument("seq_length", "8192"), _argument("bf16", "True"),
                 _argument("micro_batch_size", "1"), _argument("global_batch_size", "128")]
    lines = ["INFO: loading checkpoint ... done", *arguments]
    lines += [megatron_line(i, ms) for i, ms in enumerate(_times(16), start=1)]
    (run,) = parse_megatron_log("\n".join(lines))
    assert run.arguments["tensor_model_parallel_size"] == "4"
    assert "loading" not in run.arguments and len(run.loose_arguments) == len(arguments)
    loaded = load_measurements([_write(tmp_path, lines)],
                               Defaults(model="llama3-8b", cluster="dgx-h100"))
    (m,) = loaded.measurements
    assert (m.layout.tp, m.layout.pp, m.layout.sp, m.layout.num_gpus) == (4, 1, True, 16)
    assert any("without the '--- arguments ---' header" in n for n in loaded.notes)


def test_a_second_runs_headerless_arguments_start_a_new_run() -> None:
    lines = [_argument("tensor_model_parallel_size", "2")]
    lines += [megatron_line(i, 13100.0) for i in range(1, 15)]
    lines += [_argument("tensor_model_parallel_size", "8")]
    lines += [megatron_line(i, 9000.0) for i in range(1, 15)]
    runs = parse_megatron_log("\n".join(lines))
    assert [r.arguments["tensor_model_parallel_size"] for r in runs] == ["2", "8"]


@given(st.from_regex(r"[a-z_]{1,40}", fullmatch=True), st.integers(1, 60),
       st.from_regex(r"[A-Za-z0-9.]{1,12}", fullmatch=True))
def test_only_megatrons_exact_argument_layout_is_read_loose(name: str, dots: int,
                                                             value: str) -> None:
    line = f"  {name} {'.' * dots} {value}"
    assert (loose_argument(line) is not None) == (dots == 48 - len(name))


_SGR = st.lists(st.integers(0, 107), min_size=0, max_size=3).map(
    lambda codes: "\x1b[" + ";".join(map(str, codes)) + "m")


@settings(max_examples=60, deadline=None)
@given(st.lists(_SGR, min_size=12, max_size=12), st.booleans(),
       st.floats(100.0, 90000.0), st.integers(1, 100000))
def test_colour_codes_anywhere_between_fields_never_change_the_reading(
        codes: list[str], lose_escape: bool, ms: float, i: int) -> None:
    clean = megatron_line(i, ms, total=i + 10)
    pieces = clean.split(" | ")
    pieces[0] = pieces[0].replace("] iteration", "] " + codes[-1] + "iteration")
    # A code before each field's label and a reset after the line, as terminals colour it.
    coloured = " | ".join(code + piece for code, piece in zip(codes, pieces, strict=False))
    coloured += codes[-2]
    if lose_escape:
        coloured = coloured.replace("\x1b", "")
    expected = iteration_line(clean, 1)
    assert expected is not None
    assert iteration_line(plain(coloured), 1) == expected
