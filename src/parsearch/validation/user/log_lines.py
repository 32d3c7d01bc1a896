"""One line of a training log, as users paste it: the forms :mod:`megatron_logs` reads.

* **Colour codes.**  Terminals and some launchers colour fields (ANSI SGR sequences,
  ``ESC [ 1 ; 32 m``); a copy from a terminal may keep the codes or lose only the
  ``ESC`` byte (``[32m`` left in the text).  :func:`plain` removes both from a line
  before anything is matched, so a colour code inside a field never hides it.
* **Megatron-LM's iteration line** (``megatron/training/training.py`` ``training_log``,
  NVIDIA/Megatron-LM ``d98e8a64ddf3``): ``iteration {:8d}/{:8d} | ... elapsed time per
  iteration (ms): {:.1f} | ...``, the mean per-iteration time since the previous line.
  AMD's Primus trainer (AMD-AGI/Primus ``0a342e856aed``,
  ``primus/modules/trainer/megatron/trainer.py``) prints two numbers,
  ``elapsed time per iteration (ms): 13100.0/13240.9``: the first is that same mean
  since the previous line, the second a running mean over the recent lines (reset
  every ``log_avg_reset_interval`` lines).  The **first** is read: it is the one
  Megatron-LM prints and the one whose warm-up :mod:`megatron_logs` can drop line by
  line; the throughput field's ``a/b`` form is read the same way.
* **NeMo 2's iteration line** (``ProgressPrinter.on_train_batch_end``,
  ``nemo/lightning/pytorch/callbacks/progress_printer.py``, NVIDIA/NeMo
  ``01f7dbc537d7``): ``Training epoch {E}, iteration {n}/{total} | lr: ... |
  global_batch_size: {B} | global_step: {S} | reduced_train_loss: ... |
  train_step_timing in s: {t} | consumed_samples: ...``, metrics averaged over the
  printer's ``log_interval`` and written with four significant digits.
* **NeMo 1's progress bar** (PyTorch Lightning's tqdm bar with NeMo's logged metrics as
  its postfix, as NeMo-Megatron launcher READMEs quote it): ``Epoch 0: : 100%|####| 50/50
  [23:22<00:00, reduced_train_loss=0.186, global_step=49.00, consumed_samples=51200.0,
  train_step_timing in s=24.00]``.  The bar redraws in place (carriage returns, cursor-up
  codes), so one pasted line may hold many draws; each draw is read on its own
  (:func:`progress_draws`).  The iteration is the bar's counter ``n`` (``global_step`` is
  ``n - 1`` and written with four significant digits, ``2e+3``); the step time is the
  latest ``train_step_timing in s``; the global batch is ``consumed_samples / n`` when
  both are written in full.  A bar without a total (``1it [00:04, ...]``) has ``n`` only.
* **Argument lines** of Megatron-LM's ``_print_args`` (``'  {} {} {}'.format(arg,
  '.' * (48 - len(arg)), value)``) pasted without their header: :func:`loose_argument`
  reads a line whose dotted leader has exactly that length (a sentence with an
  ellipsis does not).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

#: ANSI escape sequences (CSI ... final byte), and SGR colour codes whose ESC was lost.
_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b[@-Z\\-_]|\[(?:\d{1,3}(?:;\d{1,3})*)?m")
_NUMBER = r"([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)"
#: ``a`` or ``a/b`` (Primus): the first number is read.
_ONE_OR_TWO = _NUMBER + r"(?:\s*/\s*[0-9.eE+-]+)?"
_ITERATION = re.compile(r"\biteration\s+(\d+)\s*/\s*(\d+)\s*\|")
_FIELDS = {
    "elapsed_ms": re.compile(r"elapsed time per iteration \(ms\):\s*" + _ONE_OR_TWO + r"\s*\|"),
    "tflops": re.compile(r"throughput per GPU \(TFLOP/s/GPU\):\s*" + _ONE_OR_TWO + r"\s*\|"),
    "batch": re.compile(r"global batch size:\s*(\d+)\s*\|"),
    "skipped": re.compile(r"number of skipped iterations:\s*(\d+)\s*\|"),
    "nan": re.compile(r"number of nan iterations:\s*(\d+)\s*\|"),
}
_NEMO_ITERATION = re.compile(r"\bTraining epoch\s+\d+,\s*iteration\s+(\d+)\s*/\s*(\d+)")
_NEMO_FIELDS = {
    "step_s": re.compile(r"\|\s*train_step_timing in s:\s*" + _NUMBER + r"(?=\s*(?:\||$))"),
    "batch": re.compile(r"\|\s*global_batch_size:\s*(\d+)(?=\s*(?:\||$))"),
}
#: NeMo 1 / Lightning progress-bar draw: ``n/total [`` or ``n it [``, then the postfix.
_BAR_COUNT = re.compile(r"(?:\|\s*(\d+)\s*/\s*(\d+)|(?:^|[\s:])(\d+)it)\s*\[")
_BAR_FIELDS = {
    "step_s": re.compile(r"train_step_timing in s=" + _NUMBER + r"(?=\s*[,\]]|$)"),
    "consumed": re.compile(r"consumed_samples=([0-9]+(?:\.0*)?)(?=\s*[,\]]|$)"),
}
#: Megatron-LM's argument line: name, one space, ``48 - len(name)`` dots, one space, value.
_LOOSE_ARG = re.compile(r"^(?:.*?:\s)?\s*([A-Za-z_][A-Za-z0-9_]*) (\.+) (\S.*?)\s*$")
_ARGUMENT_WIDTH = 48


def plain(line: str) -> str:
    """``line`` without colour codes.

    >>> plain("\\x1b[32miteration\\x1b[0m 30/100 | [1;33melapsed[0m")
    'iteration 30/100 | elapsed'
    """
    return _ANSI.sub("", line)


@dataclass(frozen=True)
class IterationLine:
    """One per-iteration line of the log."""

    line_no: int
    iteration: int
    train_iters: int
    elapsed_ms: float
    global_batch: int | None
    tflops_per_gpu: float | None
    skipped: int
    nan: int


def looks_like_iteration(line: str) -> bool:
    """Whether ``line`` (colour codes removed) is meant as an iteration line of a known form."""
    return (("iteration" in line and "elapsed time per iteration" in line)
            or ("train_step_timing in s:" in line and _NEMO_ITERATION.search(line) is not None)
            or is_redraw(line))


def is_redraw(draw: str) -> bool:
    """Whether ``draw`` is a progress-bar draw, which may repeat its step (a redraw)."""
    return "train_step_timing in s=" in draw and _BAR_COUNT.search(draw) is not None


def progress_draws(line: str) -> list[str]:
    """The draws of a progress bar that redrew in place on one pasted line.

    A terminal capture keeps a bar's redraws on one line (carriage returns are usually
    gone by the time it is pasted, so the draws run together); each draw ends with its
    postfix's ``]``.

    >>> draws = progress_draws("Epoch 0: :  50%|#  | 1/2 [00:09<00:09, train_step_timing in "
    ...                        "s=9.10]Epoch 0: : 100%|## | 2/2 [00:18<00:00, train_step_"
    ...                        "timing in s=8.90]")
    >>> [iteration_line(d, 1).elapsed_ms for d in draws]
    [9100.0, 8900.0]
    """
    if "train_step_timing in s=" not in line:
        return [line]
    parts = re.split(r"(?<=\])(?=[^\]]*?(?:\d+\s*/\s*\d+|\d+it)\s*\[)", line)
    return [p for p in parts if p.strip()]


def _float(text: str | None) -> float | None:
    try:
        value = float(text) if text is not None else None
    except ValueError:
        return None
    if value is None or not (0.0 < value < float("inf")):
        return None
    return value


def _int(text: str | None) -> int | None:
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None


def iteration_line(text: str, line_no: int) -> IterationLine | None:
    """The iteration line's fields (Megatron-LM, Primus or NeMo 2 form), or ``None`` when a
    field the reading needs is missing or is not a positive finite number.

    >>> iteration_line("iteration 30/ 100 | elapsed time per iteration (ms): 13100.0/13240.9 |"
    ...                " global batch size: 256 |", 7).elapsed_ms
    13100.0
    >>> nemo = ("Training epoch 0, iteration 29/99 | lr: 1.5e-05 | global_batch_size: 128 |"
    ...         " global_step: 29 | reduced_train_loss: 7.1 | train_step_timing in s: 13.12")
    >>> line = iteration_line(nemo, 3)
    >>> line.iteration, line.train_iters, line.elapsed_ms, line.global_batch
    (29, 99, 13120.0, 128)
    """
    bar = _BAR_COUNT.search(text) if "train_step_timing in s=" in text else None
    if bar is not None:
        return _bar_line(text, bar, line_no)
    nemo = _NEMO_ITERATION.search(text)
    if nemo is not None and "train_step_timing in s:" in text:
        step = _NEMO_FIELDS["step_s"].search(text)
        seconds = _float(step.group(1)) if step else None
        if seconds is None:
            return None
        batch = _NEMO_FIELDS["batch"].search(text)
        return IterationLine(line_no, int(nemo.group(1)), int(nemo.group(2)),
                             seconds * 1000.0, _int(batch.group(1)) if batch else None,
                             None, 0, 0)
    head = _ITERATION.search(text)
    values = {k: rx.search(text) for k, rx in _FIELDS.items()}

    def number(key: str) -> str | None:
        match = values[key]
        return match.group(1) if match else None

    ms = _float(number("elapsed_ms"))
    if head is None or ms is None:
        return None
    return IterationLine(
        line_no=line_no, iteration=int(head.group(1)), train_iters=int(head.group(2)),
        elapsed_ms=ms, global_batch=_int(number("batch")), tflops_per_gpu=_float(number("tflops")),
        skipped=_int(number("skipped")) or 0, nan=_int(number("nan")) or 0)


def _bar_line(text: str, bar: re.Match[str], line_no: int) -> IterationLine | None:
    """A NeMo 1 progress-bar draw's fields (module docstring), or ``None`` without a step time.

    >>> draw = ("Epoch 0: : 100%|##########| 50/50 [23:22<00:00, reduced_train_loss=0.186, "
    ...         "global_step=49.00, consumed_samples=51200.0, train_step_timing in s=24.00]")
    >>> line = iteration_line(draw, 4)
    >>> line.iteration, line.train_iters, line.elapsed_ms, line.global_batch
    (50, 50, 24000.0, 1024)
    """
    step = _BAR_FIELDS["step_s"].search(text)
    seconds = _float(step.group(1)) if step else None
    if seconds is None:
        return None
    done = int(bar.group(1) or bar.group(3))
    total = int(bar.group(2)) if bar.group(2) else done
    consumed = _BAR_FIELDS["consumed"].search(text)
    batch = None
    if consumed is not None and done > 0:
        samples = float(consumed.group(1))
        if samples > 0 and samples == round(samples) and round(samples) % done == 0:
            batch = round(samples) // done
    return IterationLine(line_no, done, total, seconds * 1000.0, batch, None, 0, 0)


def loose_argument(line: str) -> tuple[str, str] | None:
    """``(name, value)`` of a Megatron-LM argument line found outside an arguments block.

    Only the exact layout ``_print_args`` writes counts (a dotted leader of ``48 -
    len(name)`` dots), so log text with an ellipsis is not read as an argument.

    >>> loose_argument("0:   tensor_model_parallel_size ...................... 2")
    ('tensor_model_parallel_size', '2')
    >>> loose_argument("loading checkpoint ... done") is None
    True
    """
    match = _LOOSE_ARG.match(line)
    if match is None or len(match.group(2)) != _ARGUMENT_WIDTH - len(match.group(1)):
        return None
    return match.group(1), match.group(3)
