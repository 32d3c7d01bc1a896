"""NeMo 1's Lightning progress bar as users paste it (issue 33: read the log forms users have).

The bar's postfix carries NeMo's metrics (``train_step_timing in s=24.00``, as the
NeMo-Megatron launcher READMEs quote it); the bar redraws in place, so a capture holds
several draws of one step, and draws of many steps run together on one pasted line.
"""

from __future__ import annotations

import statistics
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from parsearch.validation.user.log_lines import iteration_line, progress_draws
from parsearch.validation.user.measurements import Defaults, load_measurements
from parsearch.validation.user.megatron_logs import WARMUP_ITERATIONS, parse_megatron_log

HINTS = Defaults(model="llama3-8b", cluster="dgx-h100", num_gpus=16, seq_len=8192,
                 layout="tp=2,pp=2,sp=true", precision="bf16")


def bar_draw(n: int, seconds: float, batch: int = 256, total: int | None = 100) -> str:
    """One draw: tqdm's bar, Lightning's postfix with NeMo's metrics (4 significant digits)."""
    count = f"{int(100 * n / total):3d}%|####      | {n}/{total}" if total else f"{n}it"
    return (f"Epoch 0: : {count} [01:{n % 60:02d}<02:00, v_num=0, reduced_train_loss=6.52, "
            f"global_step={float(n - 1):.4g}, consumed_samples={float(n * batch)}, "
            f"train_step_timing in s={seconds:.4}]")


def test_the_launcher_readme_line_is_read() -> None:
    text = ("Epoch 0: : 100%|██████████| 50/50 [23:22<00:00, reduced_train_loss=0.186, "
            "global_step=49.00, consumed_samples=51200.0, train_step_timing in s=24.00]")
    line = iteration_line(text, 1)
    assert line is not None
    assert (line.iteration, line.train_iters, line.elapsed_ms, line.global_batch) == (
        50, 50, 24000.0, 1024)


def test_a_bar_without_total_and_a_trailing_log_message_is_read() -> None:
    text = ("[A\x1b[AEpoch 1: : 1it [00:04,  4.36s/it, v_num=d3c7, reduced_train_loss=0.674, "
            "global_step=1.000, consumed_samples=128.0, train_step_timing in s=3.370, "
            "batch_time=4.400][NeMo I 2024-06-17 08:36:41 nlp_overrides:480] Removing ckpt")
    (run,) = parse_megatron_log(text)
    (line,) = run.iterations
    assert (line.iteration, line.elapsed_ms, line.global_batch) == (1, 3370.0, 128)


def test_rounded_consumed_samples_leave_the_batch_unread() -> None:
    text = ("Epoch 0: :   0%|  | 2000/603000 [1:03:17<317:00:58, reduced_train_loss=2.600, "
            "global_step=2e+3, consumed_samples=1.28e+6, train_step_timing in s=1.900]")
    line = iteration_line(text, 1)
    assert line is not None and line.iteration == 2000 and line.global_batch is None


@settings(max_examples=40, deadline=None)
@given(n=st.integers(WARMUP_ITERATIONS + 3, 40), redraws=st.integers(1, 3),
       joined=st.booleans(), batch=st.sampled_from([64, 256, 1024]))
def test_redraws_and_joined_draws_give_one_line_per_step(n: int, redraws: int, joined: bool,
                                                         batch: int) -> None:
    seconds = [13.1 + 0.01 * (i % 7) for i in range(1, n + 1)]
    draws = [bar_draw(i, s, batch) for i, s in enumerate(seconds, start=1)
             for _ in range(redraws)]
    text = "".join(draws) if joined else "\r".join(draws)
    (run,) = parse_megatron_log(text)
    assert [x.iteration for x in run.iterations] == list(range(1, n + 1))
    assert all(x.global_batch == batch for x in run.iterations)
    assert not run.malformed_lines


def test_a_pasted_bar_log_is_measured(tmp_path: Path) -> None:
    seconds = [40.0 / i + 13.0 for i in range(1, 31)]
    path = tmp_path / "nemo1.out"
    path.write_text("\r".join(bar_draw(i, s, 256, 30) for i, s in enumerate(seconds, start=1))
                    + "\n", encoding="utf-8")
    (m,) = load_measurements([path], HINTS).measurements
    expected = statistics.median(float(f"{s:.4}") for s in seconds[WARMUP_ITERATIONS:])
    assert abs(m.step_time_s - expected) < 1e-9
    assert m.global_batch == 256


def test_draws_split_at_each_bar() -> None:
    line = bar_draw(1, 9.1, total=2) + bar_draw(2, 8.9, total=2)
    assert [iteration_line(d, 1).iteration for d in progress_draws(line)] == [1, 2]
